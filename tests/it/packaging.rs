//! The shipped systemd units pass `systemd-analyze verify`, and the device agent's install
//! script lays out what its unit reads.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging")
}

/// Points a unit's `ExecStart=` at the freshly built binaries (the unit names the installed
/// path: the package's /usr/bin, install-agent.sh's /usr/local/bin, a user's ~/.local/bin,
/// none of which a test machine has).
fn with_built_binaries(text: &str) -> String {
    let bin_dir = cortex_tests::target_dir();
    text.replace("%h/.local/bin/", &format!("{}/", bin_dir.display()))
        .replace("/usr/local/bin/", &format!("{}/", bin_dir.display()))
        .replace(
            "ExecStart=/usr/bin/cortex-",
            &format!("ExecStart={}/cortex-", bin_dir.display()),
        )
}

/// The man pages `cargo xtask man` writes (what the packages install), as a `MANPATH`
/// root, so `systemd-analyze verify` checks the units' `Documentation=man:…` pages exist.
fn man_path() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tmp");
        let out = Command::new(cortex_tests::bin("xtask"))
            .args(["man", "--out"])
            .arg(dir.path().join("man1"))
            .output()
            .expect("xtask");
        assert!(
            out.status.success(),
            "xtask man: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
    .path()
}

/// What `systemd-analyze verify` says about the unit file `dir/name` (and any drop-ins in
/// `dir/name.d/`): its exit status and the stderr lines about our units. `systemd-analyze`
/// exits 0 on many problems (unknown keys, bad values are "ignoring" warnings), so the
/// lines are what count.
fn analyze(dir: &Path, name: &str, user: bool) -> (bool, Vec<String>) {
    analyze_with_man(dir, name, user, man_path())
}

/// [`analyze`], with the man pages under `man` (`Documentation=man:…` is checked by
/// running man(1), which looks in `MANPATH`).
fn analyze_with_man(dir: &Path, name: &str, user: bool, man: &Path) -> (bool, Vec<String>) {
    let mut cmd = Command::new("systemd-analyze");
    cmd.env("MANPATH", man);
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
    verify(&packaging().join("systemd/user/cortex-hub.service"), true);
}

/// The operator's hub: a system unit like the agent's (`Type=notify` with a watchdog, its
/// settings in an EnvironmentFile, the TLS key as a credential), hardened.
#[test]
fn the_hub_system_unit_verifies_and_is_hardened() {
    let unit = packaging().join("systemd/cortex-hub.service");
    verify(&unit, false);
    let text = std::fs::read_to_string(&unit).expect("unit");
    for line in [
        "Type=notify",
        "WatchdogSec=",
        "EnvironmentFile=-/etc/cortex/hub.env",
        "LoadCredential=tls-key:/etc/cortex/hub.key",
        "Environment=CORTEX_TLS_KEY=%d/tls-key",
        "DynamicUser=yes",
        "StateDirectory=cortex-hub",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "the unit lacks {line}"
        );
    }
    let score = exposure(&unit, "cortex-hub.service");
    assert!(
        score < 3.0,
        "systemd-analyze security: {score} (want below 3.0)"
    );
}

/// `systemd-analyze security --offline`'s overall exposure of a unit file (0 safest, 10
/// unsafe): a fixed function of the file, not a measurement.
fn exposure(unit: &Path, as_name: &str) -> f64 {
    let dir = tempfile::tempdir().expect("tmp");
    let text = std::fs::read_to_string(unit).expect("unit");
    let path = dir.path().join(as_name);
    std::fs::write(&path, with_built_binaries(&text)).expect("write");
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&path)
        .output()
        .expect("systemd-analyze is needed (apt-get install systemd; .ci/run does)");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no exposure line: {text}"));
    line.split(": ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unreadable: {line}"))
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
    // These would hide the pids agents wait on, or the paths jobs write (/tmp/…) from
    // remote file, log and lock waits: a private /tmp is not the job's /tmp.
    for absent in [
        "ProtectProc=",
        "ProcSubset=",
        "PrivatePIDs=",
        "PrivateTmp=",
        "TemporaryFileSystem=",
        "InaccessiblePaths=",
        "DynamicUser=",
    ] {
        assert!(
            !text.lines().any(|l| l.starts_with(absent)),
            "the unit must not set {absent}"
        );
    }
    // The token never on the command line or in the environment.
    assert!(!text.contains("CORTEX_DEVICE_TOKEN"));
    let score = exposure(&unit, "cortex-device-agent@alice.service");
    assert!(
        score < 3.0,
        "systemd-analyze security: {score} (want below 3.0)"
    );
}

/// The shipped system units run the binaries where their packages install them, and their
/// `Documentation=` names what the packages install: a man page `cargo xtask man` writes
/// and a file among the package's assets (no placeholder URL).
#[test]
fn the_units_name_the_packaged_binaries_and_documentation() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (unit, package, manifest) in [
        ("systemd/cortex-hub.service", "cortex-hub", "hub/Cargo.toml"),
        (
            "systemd/cortex-device-agent@.service",
            "cortex-device-agent",
            "device-agent/Cargo.toml",
        ),
        (
            "systemd/user/cortex-hub.service",
            "cortex-hub",
            "hub/Cargo.toml",
        ),
    ] {
        let text = std::fs::read_to_string(packaging().join(unit)).expect("unit");
        let assets = std::fs::read_to_string(workspace.join(manifest)).expect("manifest");
        let exec = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{unit}: no ExecStart="));
        let program = exec.split_whitespace().next().unwrap_or_default();
        if unit.contains("/user/") {
            assert_eq!(program, format!("%h/.local/bin/{package}"), "{unit}");
        } else {
            assert_eq!(program, format!("/usr/bin/{package}"), "{unit}");
            assert!(
                assets.contains(&format!("[\"target/release/{package}\", \"usr/bin/\"")),
                "{manifest} does not install {package} in /usr/bin"
            );
        }
        let docs: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("Documentation="))
            .flat_map(str::split_whitespace)
            .collect();
        assert!(!docs.is_empty(), "{unit}: no Documentation=");
        for doc in docs {
            if let Some(page) = doc.strip_prefix("man:") {
                let name = page.trim_end_matches("(1)");
                assert!(
                    man_path().join("man1").join(format!("{name}.1")).is_file(),
                    "{unit}: {doc} is not a page xtask man writes"
                );
            } else if let Some(path) = doc.strip_prefix("file:///") {
                let (dir, file) = path.rsplit_once('/').expect("a file path");
                assert!(
                    assets.contains(&format!("/{file}\", \"{dir}/\"")),
                    "{unit}: {doc} is not installed by {manifest}"
                );
            } else {
                panic!("{unit}: {doc} is neither a man page nor an installed file");
            }
        }
    }
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
    // The unit it installs runs the binary where it put it.
    let installed =
        std::fs::read_to_string(r.join("etc/systemd/system/cortex-device-agent@.service"))
            .expect("installed unit");
    assert!(
        installed
            .lines()
            .any(|l| l == "ExecStart=/usr/local/bin/cortex-device-agent"),
        "{installed}"
    );
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

/// `--hub` twice: the env file the unit reads gets `CORTEX_HUB_URL` comma-separated, in
/// order (the agent's own form for several hubs); a URL that is not ws:// or wss:// is
/// refused by name before anything is written.
#[test]
fn the_install_script_takes_several_hubs() {
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "root".into());
    let install = |hubs: &[&str]| {
        let root = tempfile::tempdir().expect("tmp");
        let token = root.path().join("token-in");
        std::fs::write(&token, "tok\n").expect("token");
        let mut cmd = Command::new("sh");
        cmd.arg(packaging().join("install-agent.sh"))
            .args(["--root".as_ref(), root.path().as_os_str()]);
        for h in hubs {
            cmd.args(["--hub", h]);
        }
        let out = cmd
            .args(["--name", "gpu1", "--user", &user])
            .arg("--token-file")
            .arg(&token)
            .arg("--binary")
            .arg(cortex_tests::bin("cortex-device-agent"))
            .stdin(Stdio::null())
            .output()
            .expect("install-agent.sh");
        let env = std::fs::read_to_string(root.path().join("etc/cortex/device-agent.env"));
        (out, env.ok())
    };
    let (out, env) = install(&["wss://a.example/mesh/v1", "wss://b.example/mesh/v1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = env.expect("env file");
    assert!(
        env.contains("CORTEX_HUB_URL=wss://a.example/mesh/v1,wss://b.example/mesh/v1\n"),
        "{env}"
    );
    let (out, env) = install(&["wss://a.example/mesh/v1", "https://b.example/mesh/v1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("https://b.example/mesh/v1"), "{err}");
    assert!(env.is_none(), "nothing written: {env:?}");
}

/// The hub's `Type=notify` unit: `READY=1` (with a status line) once it serves,
/// `WATCHDOG=1` while its store commits, `STOPPING=1` on SIGTERM, through a real notify
/// socket as systemd passes it.
#[test]
fn the_hub_tells_systemd_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("notify");
    let sock = std::os::unix::net::UnixDatagram::bind(&path).expect("bind");
    sock.set_read_timeout(Some(std::time::Duration::from_secs(15)))
        .expect("timeout");
    let mut hub = cortex_tests::Hub::start_with(&[
        ("NOTIFY_SOCKET", path.to_str().expect("utf-8")),
        ("WATCHDOG_USEC", "400000"),
    ]);
    let mut seen: Vec<String> = Vec::new();
    let next = |seen: &mut Vec<String>, want: &str| {
        let mut buf = [0u8; 4096];
        loop {
            let n = sock
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("no {want} from the hub ({e}); got {seen:?}"));
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            seen.push(msg.clone());
            if msg.starts_with(want) {
                return msg;
            }
        }
    };
    next(&mut seen, "READY=1");
    assert!(
        seen.iter()
            .any(|m| m.starts_with("STATUS=serving the API on http://")),
        "{seen:?}"
    );
    // Fed at half the interval, after a write through the store came back.
    next(&mut seen, "WATCHDOG=1");
    next(&mut seen, "WATCHDOG=1");
    assert!(hub.stop().success());
    next(&mut seen, "STOPPING=1");
}

/// The packages `cargo xtask deb` ships, as they come out of cargo-deb: their files.
const PACKAGES: [(&str, &[&str]); 3] = [
    (
        "cortex-hub",
        &[
            "./usr/bin/cortex-hub",
            "./lib/systemd/system/cortex-hub.service",
            "./usr/share/man/man1/cortex-hub.1",
            "./usr/share/bash-completion/completions/cortex-hub",
        ],
    ),
    (
        "cortex-cli",
        &[
            "./usr/bin/cortex",
            "./usr/bin/cortex-signal",
            "./usr/share/man/man1/cortex.1",
            "./usr/share/man/man1/cortex-wait-for.1",
            "./usr/share/man/man1/cortex-signal.1",
            "./usr/share/bash-completion/completions/cortex",
            "./usr/share/zsh/vendor-completions/_cortex-signal",
            "./usr/share/fish/vendor_completions.d/cortex.fish",
        ],
    ),
    (
        "cortex-device-agent",
        &[
            "./usr/bin/cortex-device-agent",
            "./lib/systemd/system/cortex-device-agent@.service",
            "./usr/share/cortex-device-agent/install-agent.sh",
            "./usr/share/man/man1/cortex-device-agent.1",
        ],
    ),
];

/// Removes the packages again, however the test ends.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = Command::new("dpkg")
            .arg("--purge")
            .args(PACKAGES.map(|(p, _)| p))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The three Debian packages build (cargo-deb, from the binaries the suite built), hold
/// their binaries and units, install with `dpkg -i`, and the installed units pass
/// `systemd-analyze verify` (the units as shipped name a bare `cortex-…` that only the
/// install puts on systemd's path). Not root: the packages are unpacked instead and the
/// units verified against the unpacked binaries.
#[test]
fn the_debian_packages_install_and_their_units_verify() {
    // The packages' files and units, built and installed: nothing of them is the store's.
    if cortex_tests::redb_only("the packages' build, the same on both stores") {
        return;
    }
    let out = tempfile::tempdir().expect("tmp");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // The man pages and completions the packages take (what `cargo xtask deb` writes
    // first), from the xtask the suite built.
    let dist = Command::new(cortex_tests::bin("xtask"))
        .arg("dist")
        .output()
        .expect("xtask");
    assert!(
        dist.status.success(),
        "xtask dist: {}",
        String::from_utf8_lossy(&dist.stderr)
    );
    let mut debs = Vec::new();
    for (package, files) in PACKAGES {
        // The suite's own (dev) binaries, stripped into the package: a release build here
        // would double the suite's time. `cargo xtask deb` ships release ones.
        let built = Command::new(&cargo)
            .current_dir(&workspace)
            .args(["deb", "-p", package, "--no-build", "--profile", "dev"])
            .args(["--strip", "--fast", "-o"])
            .arg(out.path())
            .output()
            .expect("cargo");
        let err = String::from_utf8_lossy(&built.stderr);
        assert!(
            built.status.success(),
            "cargo deb -p {package} failed (cargo-deb is needed: cargo install cargo-deb --locked; .ci/run does): {err}"
        );
        let deb = String::from_utf8_lossy(&built.stdout)
            .lines()
            .rev()
            .find(|l| l.ends_with(".deb"))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("cargo deb named no .deb: {err}"));
        let listing = Command::new("dpkg-deb")
            .arg("-c")
            .arg(&deb)
            .output()
            .expect("dpkg-deb");
        let listing = String::from_utf8_lossy(&listing.stdout);
        for f in files {
            assert!(
                // cargo-deb gzips man pages, as Debian's policy asks.
                listing
                    .lines()
                    .any(|l| l.ends_with(f) || l.ends_with(&format!("{f}.gz"))),
                "{package} lacks {f}: {listing}"
            );
        }
        debs.push(deb);
    }

    let root = rustix::process::geteuid().is_root();
    let unpacked = tempfile::tempdir().expect("tmp");
    let _purge = root.then_some(Purge);
    let base = if root {
        let st = Command::new("dpkg")
            .arg("-i")
            .args(&debs)
            .output()
            .expect("dpkg");
        assert!(
            st.status.success(),
            "dpkg -i: {}",
            String::from_utf8_lossy(&st.stderr)
        );
        PathBuf::from("/")
    } else {
        for deb in &debs {
            let st = Command::new("dpkg-deb")
                .arg("-x")
                .arg(deb)
                .arg(unpacked.path())
                .status()
                .expect("dpkg-deb");
            assert!(st.success());
        }
        unpacked.path().to_path_buf()
    };
    // The installed binaries run.
    for bin in [
        "cortex-hub",
        "cortex",
        "cortex-signal",
        "cortex-device-agent",
    ] {
        let v = Command::new(base.join("usr/bin").join(bin))
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("{bin}: {e}"));
        assert!(v.status.success(), "{bin} --version");
    }
    assert!(
        base.join("usr/share/man/man1/cortex-wait-for.1.gz")
            .is_file()
    );
    // The installed units, as installed: `ExecStart=/usr/bin/cortex-…` and the man pages
    // their `Documentation=` names are the package's own; unpacked, both are pointed at
    // the unpacked files.
    let units = base.join("lib/systemd/system");
    for (unit, as_name) in [
        ("cortex-hub.service", "cortex-hub.service"),
        (
            "cortex-device-agent@.service",
            "cortex-device-agent@.service",
        ),
        (
            "cortex-device-agent@.service",
            "cortex-device-agent@alice.service",
        ),
    ] {
        let dir = tempfile::tempdir().expect("tmp");
        let mut text = std::fs::read_to_string(units.join(unit)).expect("installed unit");
        if !root {
            text = text.replace(
                "ExecStart=/usr/bin/cortex-",
                &format!("ExecStart={}/usr/bin/cortex-", base.display()),
            );
        }
        std::fs::write(dir.path().join(as_name), text).expect("write");
        let (ok, lines) = analyze_with_man(dir.path(), as_name, false, &base.join("usr/share/man"));
        assert!(
            ok && lines.is_empty(),
            "installed {unit} as {as_name}: {lines:#?}"
        );
    }
    let score = exposure(&units.join("cortex-hub.service"), "cortex-hub.service");
    assert!(score < 3.0, "the installed hub unit: {score}");
}
