//! The heartbeat file.

use super::*;

#[tokio::test]
async fn the_heartbeat_file_is_touched_while_waiting() {
    let dir = tmp();
    let beat = dir.path().join("wait.beat");
    let mut p = Proc::sleep();
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let o = WaitOptions {
        heartbeat: Some(beat.clone()),
        heartbeat_every: Duration::from_millis(20),
        ..opts(BOUND)
    };
    let task = tokio::spawn(async move { armed.wait(&o).await });
    eventually("the heartbeat file", || beat.exists()).await;
    let mtime = |p: &Path| fs::metadata(p).map(|m| (m.mtime(), m.mtime_nsec())).ok();
    let first = mtime(&beat);
    eventually("a second touch", || mtime(&beat) > first).await;
    p.kill();
    fired(task.await.expect("join"));
}

#[tokio::test]
async fn a_heartbeat_that_cannot_be_written_breaks_the_wait() {
    let dir = tmp();
    let p = Proc::sleep();
    let armed = Waits::new()
        .arm(&WaitSpec::Pid {
            pid: p.pid(),
            start_time: None,
            must_exist: false,
        })
        .expect("arm");
    let o = WaitOptions {
        heartbeat: Some(dir.path().join("no/such/dir/beat")),
        ..opts(BOUND)
    };
    let out = armed.wait(&o).await;
    assert!(
        matches!(out, WaitOutcome::Broke(WaitError::Heartbeat { .. })),
        "{out:?}"
    );
}
