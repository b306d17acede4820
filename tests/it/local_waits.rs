//! `cortex wait pid|file|flock` on this machine, no hub: the wait contract from the outside
//! (one line on stderr when armed, silence, one JSON object on stdout; exit 0 fired, 1 timed
//! out, 2 broke), with real processes, files and util-linux `flock` holders.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use cortex_tests::{bin, run, wait_until};
use serde_json::Value;

const BOUND: Duration = Duration::from_secs(30);

/// A `cortex wait …` running in the background, its stderr read line by line.
pub(crate) struct Waiting {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Vec<String>,
}

impl Waiting {
    pub(crate) fn start(args: &[&str]) -> Waiting {
        let mut child = Command::new(bin("cortex"))
            .args(args)
            .env_remove("CORTEX_HUB")
            .env_remove("CORTEX_WEBHOOK_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cortex");
        let err = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Waiting {
            child,
            lines,
            stderr: Vec::new(),
        }
    }

    /// The armed line; the wait is in place once it is printed.
    pub(crate) fn armed(&mut self) -> String {
        let line = self
            .lines
            .recv_timeout(BOUND)
            .expect("the armed line on stderr");
        self.stderr.push(line.clone());
        line
    }

    pub(crate) fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Waits (bounded) for the exit; returns (code, stdout, every stderr line).
    pub(crate) fn finish(mut self) -> (i32, String, Vec<String>) {
        let status = wait_until(BOUND, "cortex wait to exit", || {
            self.child.try_wait().expect("try_wait")
        });
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut out)
            .expect("read stdout");
        while let Ok(line) = self.lines.recv_timeout(BOUND) {
            self.stderr.push(line);
        }
        (
            status.code().unwrap_or(-1),
            out,
            std::mem::take(&mut self.stderr),
        )
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The payload: exactly one line, one JSON object.
pub(crate) fn payload(out: &str) -> Value {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stdout: {out:?}");
    let v: Value = serde_json::from_str(lines[0]).expect("JSON payload");
    assert!(v.is_object(), "{v}");
    v
}

struct Sleeper(Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(
            Command::new("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn sleep"),
        )
    }

    fn pid(&self) -> String {
        self.0.id().to_string()
    }

    fn end(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.end();
    }
}

#[test]
fn wait_pid_exits_0_when_the_process_exits() {
    let mut sleeper = Sleeper::start();
    let pid = sleeper.pid();
    let mut w = Waiting::start(&["wait", "pid", &pid, "--timeout", "60s"]);
    let armed = w.armed();
    assert!(
        armed.starts_with(&format!("cortex: waiting for pid {pid} (sleep, started "))
            && armed.ends_with("to exit; at most 1m"),
        "{armed}"
    );
    sleeper.end();
    let (code, out, err) = w.finish();
    assert_eq!(code, 0, "{err:?}");
    let p = payload(&out);
    assert_eq!(p["kind"], "pid");
    assert_eq!(p["pid"].to_string(), pid);
    assert_eq!(
        (p["exited"].as_bool(), p["already_gone"].as_bool()),
        (Some(true), Some(false))
    );
    assert!(p["start_time"].is_u64(), "{p}");
    assert_eq!(err.len(), 1, "one line on stderr, then silence: {err:?}");
}

#[test]
fn wait_pid_exits_1_on_its_timeout_and_2_on_a_bad_pid() {
    let sleeper = Sleeper::start();
    let (code, out, err) = run(
        "cortex",
        &["wait", "pid", &sleeper.pid(), "--timeout", "200ms"],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "nothing on stdout when it times out: {out}");
    assert!(err.contains("timed out after 200ms"), "{err}");
    for bad in ["0", "-3", "abc"] {
        let (code, out, err) = run("cortex", &["wait", "pid", bad], &[]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(out.is_empty());
    }
}

#[test]
fn a_pid_already_gone_fires_at_once_and_a_reused_one_is_not_mistaken() {
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id().to_string();
    child.wait().expect("reap");
    let (code, out, err) = run("cortex", &["wait", "pid", &pid, "--timeout", "60s"], &[]);
    assert_eq!(code, 0, "{err}");
    let p = payload(&out);
    assert_eq!(p["already_gone"], true);
    assert!(err.contains("already gone"), "{err}");

    // The pid held by a process with another start time than the one asked for.
    let sleeper = Sleeper::start();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", sleeper.pid())).expect("stat");
    let start: u64 = stat[stat.rfind(')').expect(")") + 1..]
        .split_whitespace()
        .nth(19)
        .expect("field 22")
        .parse()
        .expect("number");
    let other = (start + 1).to_string();
    let (code, out, err) = run(
        "cortex",
        &[
            "wait",
            "pid",
            &sleeper.pid(),
            "--start-time",
            &other,
            "--timeout",
            "60s",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let p = payload(&out);
    assert_eq!(
        (p["already_gone"].as_bool(), p["reused"].as_bool()),
        (Some(true), Some(true))
    );
    assert!(err.contains("now belongs to another process"), "{err}");
}

#[test]
fn wait_file_fires_on_close_write_and_not_on_a_read() {
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("train.log");
    std::fs::write(&f, "epoch 1\n").expect("write");
    let path = f.to_str().expect("utf-8");
    let mut w = Waiting::start(&["wait", "file", path, "--timeout", "60s"]);
    let armed = w.armed();
    assert!(
        armed.contains(&format!("waiting for a write to {path} (8 bytes")),
        "{armed}"
    );
    // Opened for reading and closed: IN_CLOSE_NOWRITE, not a write.
    assert_eq!(std::fs::read_to_string(&f).expect("read"), "epoch 1\n");
    // Not a wait for a condition: a chance for a wrong fire on the read to show itself
    // before the write; a correct wait passes whatever the pause.
    std::thread::sleep(Duration::from_millis(200));
    assert!(w.running(), "fired on a read");
    std::fs::write(&f, "epoch 1\nepoch 2\n").expect("write");
    let (code, out, err) = w.finish();
    assert_eq!(code, 0, "{err:?}");
    let p = payload(&out);
    assert_eq!(p["event"], "close_write");
    assert_eq!(p["path"], path);
    // The position is the write's, not the read's.
    assert_eq!(p["cursor"]["size"], 16);
    assert_eq!(err.len(), 1, "{err:?}");
}

#[test]
fn wait_file_for_a_file_not_there_yet_and_a_cursor_across_re_arms() {
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("result.json");
    let path = f.to_str().expect("utf-8");
    let cursor = dir.path().join("result.cursor");
    let cursor = cursor.to_str().expect("utf-8");
    let mut w = Waiting::start(&["wait", "file", path, "--cursor", cursor, "--timeout", "60s"]);
    let armed = w.armed();
    assert!(armed.contains("does not exist yet"), "{armed}");
    // Written in place: fires on the close after writing, not on the bare creation.
    std::fs::write(&f, "{\"ok\":true}").expect("write");
    let (code, out, err) = w.finish();
    assert_eq!(code, 0, "{err:?}");
    let p = payload(&out);
    assert_eq!(p["event"], "close_write");
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(cursor).expect("cursor file")).expect("json");
    assert_eq!(
        saved["cursor"], p["cursor"],
        "the fired position is on disk"
    );

    // Re-armed from that cursor: the write already reported is not reported again.
    let (code, out, err) = run(
        "cortex",
        &[
            "wait",
            "file",
            path,
            "--cursor",
            cursor,
            "--timeout",
            "200ms",
        ],
        &[],
    );
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    // A write while no wait is armed is not missed: the next arm fires at once.
    std::fs::write(&f, "{\"ok\":false}").expect("write");
    let (code, out, err) = run(
        "cortex",
        &["wait", "file", path, "--cursor", cursor, "--timeout", "60s"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let p = payload(&out);
    assert_eq!(p["event"], "changed");
    assert_eq!(p["cursor"]["size"], 12);
    let (code, _, err) = run(
        "cortex",
        &[
            "wait",
            "file",
            path,
            "--cursor",
            cursor,
            "--timeout",
            "200ms",
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    // A path problem is a broken wait.
    let missing = dir.path().join("no/such/dir/f");
    let (code, _, err) = run(
        "cortex",
        &["wait", "file", missing.to_str().expect("utf-8")],
        &[],
    );
    assert_eq!(code, 2, "{err}");
}

fn held_in_proc_locks(path: &Path) -> bool {
    let m = std::fs::metadata(path).expect("stat");
    let id = format!(
        "{:02x}:{:02x}:{}",
        rustix::fs::major(m.dev()),
        rustix::fs::minor(m.dev()),
        m.ino()
    );
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .any(|l| {
            l.contains(" FLOCK ") && !l.contains("->") && l.split_whitespace().any(|f| f == id)
        })
}

#[test]
fn wait_flock_fires_when_a_held_flock_is_released() {
    let dir = tempfile::tempdir().expect("tmp");
    let lock = dir.path().join("job.lock");
    std::fs::write(&lock, "").expect("create");
    let path = lock.to_str().expect("utf-8");
    // `flock FILE sleep`: both flock(1) and its child hold the lock's descriptor, so the
    // whole process group is killed, as a job's end would.
    let mut holder = Command::new("flock")
        .args([path, "sleep", "300"])
        .process_group(0)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn flock");
    wait_until(BOUND, "flock(1) to hold the lock", || {
        held_in_proc_locks(&lock).then_some(())
    });
    let (code, _, err) = run(
        "cortex",
        &["wait", "flock", path, "--timeout", "200ms"],
        &[],
    );
    assert_eq!(code, 1, "held, so it times out: {err}");

    let mut w = Waiting::start(&["wait", "flock", path, "--timeout", "60s"]);
    let armed = w.armed();
    assert!(armed.contains("(held now)"), "{armed}");
    let pgid = rustix::process::Pid::from_raw(holder.id() as i32).expect("pid");
    rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL).expect("kill");
    holder.wait().expect("reap flock");
    let (code, out, err) = w.finish();
    assert_eq!(code, 0, "{err:?}");
    let p = payload(&out);
    assert_eq!(
        (p["kind"].as_str(), p["already_free"].as_bool()),
        (Some("flock"), Some(false))
    );
    assert_eq!(err.len(), 1, "{err:?}");
    // Nothing left held: util-linux's own non-blocking attempt succeeds.
    let ok = Command::new("flock")
        .args(["-n", path, "true"])
        .status()
        .expect("flock -n");
    assert!(ok.success());

    // Free: fires at once; and a missing lock file is a broken wait, not a free lock.
    let (code, out, _) = run("cortex", &["wait", "flock", path], &[]);
    assert_eq!(code, 0);
    assert_eq!(payload(&out)["already_free"], true);
    let (code, _, err) = run("cortex", &["wait", "flock", &format!("{path}.nope")], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        !Path::new(&format!("{path}.nope")).exists(),
        "created nothing"
    );
}

#[test]
fn heartbeat_touches_its_file_and_a_signal_breaks_the_wait() {
    let dir = tempfile::tempdir().expect("tmp");
    let hb = dir.path().join("wait.alive");
    let sleeper = Sleeper::start();
    let pid = sleeper.pid();
    let hb_arg = hb.to_str().expect("utf-8");
    let mut w = Waiting::start(&[
        "wait",
        "pid",
        &pid,
        "--heartbeat",
        hb_arg,
        "--heartbeat-every",
        "50ms",
        "--timeout",
        "60s",
    ]);
    let armed = w.armed();
    assert!(armed.contains("heartbeat"), "{armed}");
    let mtime = || {
        std::fs::metadata(&hb)
            .ok()
            .map(|m| (m.mtime(), m.mtime_nsec()))
    };
    let first = wait_until(BOUND, "the heartbeat file", mtime);
    wait_until(BOUND, "a later touch", || {
        (mtime() > Some(first)).then_some(())
    });
    // SIGTERM: it stopped looking, which is "broke", and it says so.
    let cpid = rustix::process::Pid::from_raw(w.child.id() as i32).expect("pid");
    rustix::process::kill_process(cpid, rustix::process::Signal::TERM).expect("SIGTERM");
    let (code, out, err) = w.finish();
    assert_eq!(code, 2, "{err:?}");
    assert!(out.is_empty());
    assert!(
        err.iter().any(|l| l.contains("cancelled by SIGTERM")),
        "{err:?}"
    );
    drop(sleeper);
}
