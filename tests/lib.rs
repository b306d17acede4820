//! Support for the whole-system tests: start the real `cortex-hub` on a loopback port
//! chosen at run time with a temp home, talk to it over HTTP, run the real CLIs, and wait
//! for conditions with a bound (never a bare sleep).
//!
//! The binaries must be built first (`cargo xtask test` builds them, then runs the tests).

#![allow(clippy::unwrap_used)]

pub mod agent;
pub mod cut_proxy;
pub mod haproxy;
pub mod hostile_model;
pub mod mcp_client;
pub mod postgres;
pub mod scripted_model;
pub mod sim;
pub mod webdriver;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use cortex_cli::http::{Method, Request};
use serde_json::{Value, json};

/// `target/<profile>/`, found from the test executable (`target/<profile>/deps/it-…`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// A workspace binary, built by `cargo build --workspace`.
pub fn bin(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build the binaries first (`cargo xtask test` does, or `cargo build --workspace`)",
        p.display()
    );
    p
}

/// Raises this process's soft descriptor limit to its hard one: room for a test's own
/// sockets when it floods a hub with connections.
pub fn raise_nofile() {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        },
    );
}

/// Polls `f` until it returns `Some`, at most `limit`; panics with `what` otherwise.
pub fn wait_until<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Whether the hubs of this test binary run their store on PostgreSQL
/// (`CORTEX_TEST_STORE=postgres`, a second pass of `cargo xtask test`) rather than on redb
/// under their home.
pub fn on_postgres() -> bool {
    std::env::var("CORTEX_TEST_STORE").is_ok_and(|v| v == "postgres")
}

/// Whether to skip a test that is about redb's own files (its journal on a full disk, its
/// file's permissions): true on PostgreSQL, where the hub keeps no store under its home,
/// and the test says so on its output.
pub fn redb_only(what: &str) -> bool {
    let skip = on_postgres();
    if skip {
        println!("skipped on PostgreSQL: {what}");
    }
    skip
}

/// On PostgreSQL, the database of the hubs on `home`: one per home, so a hub started
/// again (or anew) on the same home finds what it stored, as it would in its redb file.
pub fn store_url(home: &Path) -> Option<String> {
    if !on_postgres() {
        return None;
    }
    static DBS: std::sync::Mutex<Vec<(PathBuf, String)>> = std::sync::Mutex::new(Vec::new());
    let mut dbs = DBS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, url)) = dbs.iter().find(|(h, _)| h == home) {
        return Some(url.clone());
    }
    let pg = postgres::Postgres::shared();
    let url = pg.url(&pg.database());
    dbs.push((home.to_path_buf(), url.clone()));
    Some(url)
}

/// A running hub with its own temp home.
pub struct Hub {
    pub home: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    log_file: PathBuf,
    child: Option<Child>,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The device mesh's URL from the start line (`ws://127.0.0.1:PORT/mesh/v1`), empty
    /// with `--mesh-listen off`.
    pub mesh_url: String,
    pub token: String,
    env: Vec<(String, String)>,
    args: Vec<String>,
    starts: usize,
    /// `RLIMIT_NOFILE` (soft and hard) the hub starts under, when set.
    nofile: Option<u64>,
    /// The addresses the next start listens on (HTTP, mesh): port 0 when `None`.
    listen_at: Option<(String, String)>,
}

impl Hub {
    pub fn start() -> Hub {
        Hub::start_with(&[])
    }

    /// Starts a hub with extra environment (e.g. `CORTEX_WAITPOINT_SWEEP_MS`).
    pub fn start_with(env: &[(&str, &str)]) -> Hub {
        Hub::start_with_args(env, &[])
    }

    /// Starts a hub with extra environment and flags (a `--mesh-listen` given here
    /// replaces the default `127.0.0.1:0`).
    pub fn start_with_args(env: &[(&str, &str)], args: &[&str]) -> Hub {
        let mut hub = Hub::unstarted(env, args);
        hub.spawn();
        hub
    }

    fn unstarted(env: &[(&str, &str)], args: &[&str]) -> Hub {
        let tmp = tempfile::tempdir().expect("tempdir");
        let home = tmp.path().to_path_buf();
        let mut hub = Hub::at(&home, &home.join("hub.log"), env, args);
        hub._tmp = Some(tmp);
        hub
    }

    /// A hub on a given home, its log in `log` (off the home: the power-cut tests put the
    /// home on a filesystem that loses un-synced writes); not started.
    pub fn at(home: &Path, log: &Path, env: &[(&str, &str)], args: &[&str]) -> Hub {
        Hub {
            home: home.to_path_buf(),
            _tmp: None,
            log_file: log.to_path_buf(),
            child: None,
            addr: String::new(),
            mesh_url: String::new(),
            token: String::new(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            args: args.iter().map(|a| a.to_string()).collect(),
            starts: 0,
            nofile: None,
            listen_at: None,
        }
    }

    /// Starts a hub whose descriptor limit (soft and hard) is `limit`, through `sh`'s
    /// `ulimit`, which `exec`s the hub (its pid is the child's).
    pub fn start_with_nofile(limit: u64) -> Hub {
        let mut hub = Hub::unstarted(&[], &[]);
        hub.nofile = Some(limit);
        hub.spawn();
        hub
    }

    fn log_path(&self) -> PathBuf {
        self.log_file.clone()
    }

    /// Starts the hub process (again) on the same home and a new port.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "the hub is already running");
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log");
        let mut cmd = match self.nofile {
            Some(n) => {
                let mut c = Command::new("sh");
                c.args(["-c", "ulimit -n \"$0\" && exec \"$@\"", &n.to_string()])
                    .arg(bin("cortex-hub"));
                c
            }
            None => Command::new(bin("cortex-hub")),
        };
        cmd.arg("--home")
            .arg(&self.home)
            .arg("--listen")
            .arg(
                self.listen_at
                    .as_ref()
                    .map_or("127.0.0.1:0", |l| l.0.as_str()),
            )
            .args(&self.args)
            .env_remove("CORTEX_WEBHOOK_TOKEN")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if !self.args.iter().any(|a| a == "--mesh-listen") {
            cmd.arg("--mesh-listen").arg(
                self.listen_at
                    .as_ref()
                    .map_or("127.0.0.1:0", |l| l.1.as_str()),
            );
        }
        if !self.args.iter().any(|a| a == "--store")
            && let Some(url) = store_url(&self.home)
        {
            cmd.arg("--store").arg(url);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn cortex-hub"));
        self.starts += 1;
        let want = self.starts;
        let line = wait_until(Duration::from_secs(30), "the hub's listen line", || {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("cortex-hub exited with {st} at start:\n{}", self.log());
            }
            let log = std::fs::read_to_string(self.log_path()).ok()?;
            // Only whole lines: the hub may be writing this one right now.
            let log = &log[..log.rfind('\n')? + 1];
            let line = log
                .lines()
                .filter(|l| l.starts_with("cortex-hub listening on http://"))
                .nth(want - 1)?;
            Some(line.to_string())
        });
        let rest = line
            .strip_prefix("cortex-hub listening on http://")
            .expect("prefix");
        self.addr = rest.split_whitespace().next().expect("addr").to_string();
        // `…, mesh ws://127.0.0.1:PORT/mesh/v1, home DIR` (or `mesh off`).
        self.mesh_url = line
            .split(", mesh ")
            .nth(1)
            .and_then(|m| m.split(',').next())
            .filter(|m| *m != "off")
            .unwrap_or_default()
            .to_string();
        // The operator token: the one given to the hub, else the file it made.
        self.token = match self.env.iter().find(|(k, _)| k == "CORTEX_WEBHOOK_TOKEN") {
            Some((_, t)) => t.trim().to_string(),
            None => std::fs::read_to_string(self.home.join("hub/token"))
                .expect("token")
                .trim()
                .to_string(),
        };
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits (bounded) for the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        let pid = rustix::process::Pid::from_raw(c.id() as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        wait_until(
            Duration::from_secs(20),
            "the hub to exit after SIGTERM",
            || c.try_wait().ok().flatten(),
        )
    }

    /// The exit status, once the hub exited by itself (`None` while it runs).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let st = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(st)
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGKILLs the hub and starts it again on the same addresses (its HTTP listener and
    /// mesh), so clients and devices holding its URLs find it there.
    pub fn restart_in_place(&mut self) {
        self.kill();
        let mesh = self
            .mesh_url
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .unwrap_or("127.0.0.1:0")
            .to_string();
        self.listen_at = Some((self.addr.clone(), mesh));
        self.spawn();
    }

    /// Runs `cortex --hub <this hub> ARGS` with the operator token: (exit code, stdout,
    /// stderr).
    pub fn cortex(&self, args: &[&str]) -> (i32, String, String) {
        let url = self.url("");
        let mut full = vec!["--hub", url.as_str()];
        full.extend_from_slice(args);
        run(
            "cortex",
            &full,
            &[("CORTEX_WEBHOOK_TOKEN", self.token.as_str())],
        )
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// One API call with the operator token; returns (status, JSON body).
    pub fn api(&self, method: Method, path: &str, body: Option<&Value>) -> (u16, Value) {
        let url = self.url(path);
        let bearer = format!("Bearer {}", self.token);
        let bytes = body.map(|b| serde_json::to_vec(b).expect("json"));
        let mut req = Request::new(method, &url)
            .header("authorization", &bearer)
            .timeout(Duration::from_secs(150));
        if let Some(b) = &bytes {
            req = req.json(b);
        }
        let resp = req
            .send()
            .unwrap_or_else(|e| panic!("{method:?} {path}: {e}\nhub log:\n{}", self.log()));
        let v = serde_json::from_slice(&resp.body).unwrap_or_else(|_| json!({"raw": resp.text()}));
        (resp.status, v)
    }

    /// POST /webhook/signal with raw bytes; returns (status, JSON body).
    pub fn post_signal_raw(&self, body: &[u8]) -> (u16, Value) {
        let url = self.url("/webhook/signal");
        let resp = Request::new(Method::Post, &url)
            .json(body)
            .send()
            .expect("signal");
        let v = serde_json::from_slice(&resp.body).unwrap_or_else(|_| json!({"raw": resp.text()}));
        (resp.status, v)
    }

    /// POST /webhook/signal; `Err` (the reason) when no answer came: the hub is gone, or
    /// it went away with the request in flight (which it may or may not have recorded).
    pub fn try_signal(&self, body: &Value) -> Result<(u16, Value), String> {
        let url = self.url("/webhook/signal");
        let bytes = serde_json::to_vec(body).expect("json");
        let resp = Request::new(Method::Post, &url)
            .json(&bytes)
            .timeout(Duration::from_secs(60))
            .send()
            .map_err(|e| e.to_string())?;
        let v = serde_json::from_slice(&resp.body).unwrap_or_else(|_| json!({"raw": resp.text()}));
        Ok((resp.status, v))
    }

    pub fn signal(&self, body: &Value) -> (u16, Value) {
        self.post_signal_raw(&serde_json::to_vec(body).expect("json"))
    }

    pub fn session(&self) -> String {
        let (st, v) = self.api(
            Method::Post,
            "/api/sessions",
            Some(&json!({"title": "test"})),
        );
        assert_eq!(st, 201, "{v}");
        v["id"].as_str().expect("id").to_string()
    }

    /// Arms a waitpoint; returns the creation reply (id, secret, how_to_signal, …).
    pub fn waitpoint(&self, sid: &str, body: Value) -> Value {
        let (st, v) = self.api(
            Method::Post,
            &format!("/api/sessions/{sid}/waitpoints"),
            Some(&body),
        );
        assert_eq!(st, 201, "{v}");
        v
    }

    pub fn get_waitpoint(&self, id: &str) -> Value {
        let (st, v) = self.api(Method::Get, &format!("/api/waitpoints/{id}"), None);
        assert_eq!(st, 200, "{v}");
        v
    }

    /// A session's event stream (`Accept: text/event-stream`, from the start), read as it
    /// arrives: the stored events and the `live` pieces (the model's text so far).
    pub fn follow(&self, sid: &str) -> Follow {
        let url = self.url(&format!("/api/sessions/{sid}/events?after=0"));
        let bearer = format!("Bearer {}", self.token);
        let s = Request::new(Method::Get, &url)
            .header("authorization", &bearer)
            .timeout(Duration::from_secs(30))
            .open("text/event-stream")
            .unwrap_or_else(|e| panic!("follow {sid}: {e}"));
        assert_eq!(s.status, 200, "follow {sid}");
        Follow {
            body: s.body,
            parser: cortex_cli::sse::Parser::new(1 << 20),
            ready: std::collections::VecDeque::new(),
        }
    }

    pub fn events(&self, sid: &str, after: u64) -> Vec<Value> {
        let (st, v) = self.api(
            Method::Get,
            &format!("/api/sessions/{sid}/events?after={after}"),
            None,
        );
        assert_eq!(st, 200, "{v}");
        v["events"].as_array().cloned().unwrap_or_default()
    }

    pub fn wakes(&self, sid: &str) -> Vec<Value> {
        self.events(sid, 0)
            .into_iter()
            .filter(|e| e["kind"] == "wake")
            .collect()
    }

    /// Long-polls the session's log until `pred` holds for an event; returns that event.
    pub fn wait_event(&self, sid: &str, limit: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        let mut after = 0;
        loop {
            let left = limit.saturating_sub(start.elapsed());
            assert!(
                !left.is_zero(),
                "timed out waiting for an event in {sid}; log:\n{:#?}",
                self.events(sid, 0)
            );
            let wait = left.as_secs().clamp(1, 30);
            let (st, v) = self.api(
                Method::Get,
                &format!("/api/sessions/{sid}/events?after={after}&wait={wait}"),
                None,
            );
            assert_eq!(st, 200, "{v}");
            for e in v["events"].as_array().cloned().unwrap_or_default() {
                after = after.max(e["seq"].as_u64().unwrap_or(0));
                if pred(&e) {
                    return e;
                }
            }
        }
    }

    /// Waits for the n-th wake (1-based) of waitpoint `wp`.
    pub fn wait_wake(&self, sid: &str, wp: &str, n: usize, limit: Duration) -> Value {
        let seen = std::cell::Cell::new(0usize);
        self.wait_event(sid, limit, |e| {
            if e["kind"] == "wake" && e["waitpoint"]["id"] == wp {
                seen.set(seen.get() + 1);
                seen.get() == n
            } else {
                false
            }
        })
    }

    /// `GET /api/devices/{name}`.
    pub fn device(&self, name: &str) -> Value {
        let (st, v) = self.api(Method::Get, &format!("/api/devices/{name}"), None);
        assert_eq!(st, 200, "{v}");
        v
    }

    /// Waits (30 s at most) until device `name` is online.
    pub fn wait_online(&self, name: &str) {
        wait_until(Duration::from_secs(30), "the device online", || {
            (self.device(name)["state"] == "online").then_some(())
        });
    }

    /// The state of remote wait `wp` in device `name`'s `wait_list` (`None` once it ended).
    pub fn device_wait_state(&self, name: &str, wp: &str) -> Option<String> {
        self.device(name)["wait_list"]
            .as_array()
            .and_then(|l| l.iter().find(|w| w["id"] == wp))
            .and_then(|w| w["state"].as_str())
            .map(str::to_string)
    }

    /// Enrols device `name` (`POST /api/devices`); returns its token.
    pub fn add_device(&self, name: &str) -> String {
        let (st, v) = self.api(Method::Post, "/api/devices", Some(&json!({"name": name})));
        assert_eq!(st, 201, "{v}");
        v["token"].as_str().expect("token").to_string()
    }

    /// The local spool directory.
    pub fn spool(&self) -> PathBuf {
        self.home.join("tmp/signals")
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A signal body for a waitpoint creation reply.
pub fn body(wp: &Value, extra: Value) -> Value {
    let mut b = json!({"id": wp["id"], "secret": wp["secret"]});
    if let (Some(m), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            m.insert(k.clone(), v.clone());
        }
    }
    b
}

/// A CLI binary with none of the signal's, the hub's or the session's variables from this
/// process (nor `CORTEX_HOME` or `WEBHOOK_PORT`, which name a hub too), only `env`.
pub fn command(bin_name: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(bin(bin_name));
    cmd.args(args).stdin(Stdio::null());
    for k in [
        "CORTEX_SIGNAL_ID",
        "CORTEX_SIGNAL_SECRET",
        "CORTEX_HUB",
        "CORTEX_WEBHOOK_TOKEN",
        "CORTEX_SESSION",
        "CORTEX_HOME",
        "WEBHOOK_PORT",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs a CLI binary with the given env ([`command`]); returns (exit code, stdout, stderr).
pub fn run(bin_name: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = command(bin_name, args, env).output().expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// A loopback port nothing listens on (bound, then released).
pub fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Waits (up to `limit`) until `bad/` holds `n` parked files, each with its `.reason`
/// beside it (`park` moves the file first and writes the reason after).
pub fn wait_parked(bad: &std::path::Path, n: usize, limit: Duration) {
    wait_until(
        limit,
        &format!("{n} parked files with their reasons"),
        || {
            let names: Vec<String> = std::fs::read_dir(bad)
                .ok()?
                .flatten()
                .map(|f| f.file_name().to_string_lossy().into_owned())
                .collect();
            let reasons = names.iter().filter(|n| n.ends_with(".reason")).count();
            (names.len() - reasons == n && reasons == n).then_some(())
        },
    );
}

/// A session's event stream ([`Hub::follow`]).
pub struct Follow {
    body: Box<dyn std::io::Read + Send>,
    parser: cortex_cli::sse::Parser,
    ready: std::collections::VecDeque<cortex_cli::sse::Message>,
}

impl Follow {
    /// Reads on to the first message `pred` takes (its `event:` name, `live` or `event`,
    /// and its data as JSON) and returns that data; panics with `what` if the stream ends
    /// or stays silent for 30 s first.
    pub fn until(&mut self, what: &str, pred: impl Fn(&str, &Value) -> bool) -> Value {
        loop {
            while let Some(m) = self.ready.pop_front() {
                let Ok(v) = serde_json::from_str::<Value>(&m.data) else {
                    continue;
                };
                if pred(&m.event, &v) {
                    return v;
                }
            }
            let mut buf = [0u8; 8192];
            let n = std::io::Read::read(&mut self.body, &mut buf)
                .unwrap_or_else(|e| panic!("waiting for {what}: {e}"));
            assert!(n > 0, "the stream ended before {what}");
            let got = self.parser.feed(&buf[..n]).expect("an event stream");
            self.ready.extend(got);
        }
    }
}
