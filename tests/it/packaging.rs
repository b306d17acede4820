//! The shipped systemd units pass `systemd-analyze verify`, and the device agent's install
//! script lays out what its unit reads.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging")
}

/// Points a unit's `ExecStart=` at the freshly built binaries (the unit names the installed
/// path, or a bare name systemd looks up in /usr/local/bin and /usr/bin, which a test
/// machine does not have).
fn with_built_binaries(text: &str) -> String {
    let bin_dir = cortex_tests::target_dir();
    text.replace("%h/.local/bin/", &format!("{}/", bin_dir.display()))
        .replace("/usr/local/bin/", &format!("{}/", bin_dir.display()))
        .replace(
            "ExecStart=cortex-device-agent",
            &format!("ExecStart={}/cortex-device-agent", bin_dir.display()),
        )
}

/// What `systemd-analyze verify` says about the unit file `dir/name` (and any drop-ins in
/// `dir/name.d/`): its exit status and the stderr lines about our units. `systemd-analyze`
/// exits 0 on many problems (unknown keys, bad values are "ignoring" warnings), so the
/// lines are what count.
fn analyze(dir: &Path, name: &str, user: bool) -> (bool, Vec<String>) {
    let mut cmd = Command::new("systemd-analyze");
    if user {
        // A user manager needs a runtime directory; a test machine has no login session.
        cmd.arg("--user").env("XDG_RUNTIME_DIR", dir);
    }
    let out = cmd
        .arg("verify")
        .arg(dir.join(name))
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => panic!("systemd-analyze is needed (apt-get install systemd; .ci/run does): {e}"),
    };
    let err = String::from_utf8_lossy(&out.stderr);
    // Lines about other units on this machine (not ours) are not our concern. A template
    // is verified as instance `i`, so match on the name up to the `@`.
    let ours = name.split('@').next().unwrap_or(name);
    let lines = err
        .lines()
        .filter(|l| l.contains(ours))
        .map(str::to_owned)
        .collect();
    (out.status.success(), lines)
}

/// Verifies a unit with its `ExecStart=` binary pointed at the freshly built one, as
/// `as_name` (an instance name for a template).
fn verify_as(unit: &Path, as_name: &str, user: bool) {
    let dir = tempfile::tempdir().expect("tmp");
    let text = std::fs::read_to_string(unit).expect("unit");
    std::fs::write(dir.path().join(as_name), with_built_binaries(&text)).expect("write");
    let (ok, lines) = analyze(dir.path(), as_name, user);
    assert!(ok && lines.is_empty(), "{}: {lines:#?}", unit.display());
}

fn verify(unit: &Path, user: bool) {
    let name = unit
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    verify_as(unit, &name, user);
}

#[test]
fn the_hub_user_unit_verifies() {
    verify(&packaging().join("systemd/cortex-hub.service"), true);
}

#[test]
fn the_device_agent_unit_verifies_as_a_template_and_as_an_instance() {
    let unit = packaging().join("systemd/cortex-device-agent@.service");
    verify(&unit, false);
    verify_as(&unit, "cortex-device-agent@alice.service", false);

    let text = std::fs::read_to_string(&unit).expect("unit");
    for line in [
        "Type=notify",
        "User=%i",
        "Restart=always",
        "WatchdogSec=",
        "EnvironmentFile=/etc/cortex/device-agent.env",
        "LoadCredential=token:/etc/cortex/device-agent.token",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "ReadWritePaths=/home/%i/.cortex",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "the unit lacks {line}"
        );
    }
    // These would hide the pids agents wait on.
    for absent in ["ProtectProc=", "ProcSubset=", "PrivatePIDs="] {
        assert!(
            !text.lines().any(|l| l.starts_with(absent)),
            "the unit must not set {absent}"
        );
    }
    // The token never on the command line or in the environment.
    assert!(!text.contains("CORTEX_DEVICE_TOKEN"));
}

/// The check above is only as good as `analyze`'s eye: a broken copy must be caught.
#[test]
fn a_broken_unit_is_caught() {
    let dir = tempfile::tempdir().expect("tmp");
    let text = std::fs::read_to_string(packaging().join("systemd/cortex-device-agent@.service"))
        .expect("unit");
    let broken = with_built_binaries(&text).replace("Restart=always", "Restart=alwayz");
    std::fs::write(dir.path().join("cortex-device-agent@bob.service"), broken).expect("write");
    let (_, lines) = analyze(dir.path(), "cortex-device-agent@bob.service", false);
    assert!(
        lines.iter().any(|l| l.contains("alwayz")),
        "systemd-analyze said nothing about Restart=alwayz: {lines:#?}"
    );
}

#[test]
fn the_install_script_writes_what_the_unit_reads() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().expect("tmp");
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "root".into());
    let mut child = Command::new("sh")
        .arg(packaging().join("install-agent.sh"))
        .args(["--root".as_ref(), root.path().as_os_str()])
        .args(["--hub", "wss://hub.example:3002/mesh/v1", "--name", "gpu1"])
        .args(["--user", &user])
        .arg("--binary")
        .arg(cortex_tests::bin("cortex-device-agent"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"tok_from_stdin\n")
        .expect("token");
    let out = child.wait_with_output().expect("install-agent.sh");
    assert!(
        out.status.success(),
        "install-agent.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let r = root.path();
    let mode = |p: &str| {
        std::fs::metadata(r.join(p))
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("usr/local/bin/cortex-device-agent"), 0o755);
    assert_eq!(
        mode("etc/systemd/system/cortex-device-agent@.service"),
        0o644
    );
    assert_eq!(mode("etc/cortex/device-agent.token"), 0o600);
    assert_eq!(
        std::fs::read_to_string(r.join("etc/cortex/device-agent.token")).expect("token"),
        "tok_from_stdin\n"
    );
    let env = std::fs::read_to_string(r.join("etc/cortex/device-agent.env")).expect("env");
    assert!(
        env.contains("CORTEX_HUB_URL=wss://hub.example:3002/mesh/v1\n"),
        "{env}"
    );
    assert!(env.contains("CORTEX_DEVICE_NAME=gpu1\n"), "{env}");
    assert!(
        !env.contains("tok_from_stdin"),
        "the token stays out of the environment"
    );

    // The spool exists, private to the user, under their real home.
    let home = String::from_utf8(
        Command::new("sh")
            .args(["-c", &format!("getent passwd {user} | cut -d: -f6")])
            .output()
            .expect("getent")
            .stdout,
    )
    .expect("utf-8");
    let home = home.trim().trim_start_matches('/');
    assert_eq!(mode(&format!("{home}/.cortex/tmp/signals")), 0o700);

    // The installed unit, with the drop-in a home outside /home gets, still verifies.
    let units = r.join("etc/systemd/system");
    let instance = format!("cortex-device-agent@{user}.service");
    let text = std::fs::read_to_string(units.join("cortex-device-agent@.service")).expect("unit");
    std::fs::write(units.join(&instance), with_built_binaries(&text)).expect("instance");
    let dropin = units.join(format!("{instance}.d/home.conf"));
    if format!("/{home}") != format!("/home/{user}") {
        let conf = std::fs::read_to_string(&dropin).expect("drop-in for a home outside /home");
        assert!(
            conf.contains(&format!("ReadWritePaths=/{home}/.cortex")),
            "{conf}"
        );
    } else {
        assert!(!dropin.exists());
    }
    let (ok, lines) = analyze(&units, &instance, false);
    assert!(ok && lines.is_empty(), "{lines:#?}");
}
