//! The shipped systemd units pass `systemd-analyze verify`.

use std::path::Path;
use std::process::Command;

/// Verifies a unit with its `ExecStart=` binary pointed at the freshly built one (the
/// unit names the installed path, which a test machine does not have).
fn verify(unit: &Path, user: bool) {
    let dir = tempfile::tempdir().expect("tmp");
    let text = std::fs::read_to_string(unit).expect("unit");
    let bin_dir = cortex_tests::target_dir();
    let text = text
        .replace("%h/.local/bin/", &format!("{}/", bin_dir.display()))
        .replace("/usr/local/bin/", &format!("{}/", bin_dir.display()));
    let name = unit.file_name().expect("name");
    let copy = dir.path().join(name);
    std::fs::write(&copy, text).expect("write");
    let mut cmd = Command::new("systemd-analyze");
    if user {
        // A user manager needs a runtime directory; a test machine has no login session.
        cmd.arg("--user").env("XDG_RUNTIME_DIR", dir.path());
    }
    let out = cmd
        .arg("verify")
        .arg(&copy)
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => panic!("systemd-analyze is needed (apt-get install systemd; .ci/run does): {e}"),
    };
    let err = String::from_utf8_lossy(&out.stderr);
    // Lines about other units on this machine (not ours) are not our concern.
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(&*name.to_string_lossy()))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "{}: {err}",
        unit.display()
    );
}

#[test]
fn the_hub_user_unit_verifies() {
    let root =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd/cortex-hub.service");
    verify(&root, true);
}
