//! A real HAProxy (Debian's `haproxy` package) in front of hubs for the whole-system tests:
//! a config written to a temp dir, two frontends on loopback ports chosen at run time (the
//! hubs' HTTP and their device mesh, the latter ending TLS when asked), each hub's
//! `/healthz` checked every [`CHECK_INTERVAL`], and `haproxy -f CFG -db` run as a child
//! that is killed when the [`Haproxy`] is dropped. Its state (which server is up) is read from its stats socket,
//! so a test waits on what HAProxy decided, not on a guess of how long it takes.
//!
//! [`config`] is the configuration docs/operating.md shows, with the test's addresses.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{Hub, dead_port, wait_until};

/// How often HAProxy checks each hub (`inter`); two failures in a row mark it down.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(300);
/// How long HAProxy may take to accept connections once started.
const START_LIMIT: Duration = Duration::from_secs(20);

/// One hub as HAProxy sees it: its HTTP address and its mesh's (`HOST:PORT` each).
#[derive(Debug, Clone)]
pub struct Backend {
    /// The server's name in HAProxy's config and stats (`hub1`, …).
    pub name: String,
    pub http: String,
    /// `None` for a hub started with `--mesh-listen off`.
    pub mesh: Option<String>,
}

impl Backend {
    /// `hub`'s listeners, named `name`.
    pub fn of(name: &str, hub: &Hub) -> Backend {
        let mesh = hub
            .mesh_url
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .map(str::to_string);
        Backend {
            name: name.to_string(),
            http: hub.addr.clone(),
            mesh,
        }
    }
}

/// The HAProxy configuration for `backends` behind an API frontend on `api` and a mesh
/// frontend on `mesh` (`HOST:PORT` each), its stats socket at `socket`; with `mesh_tls`
/// (a PEM file: the certificate chain, then its key) the mesh frontend ends TLS (`wss://`)
/// and passes plain WebSocket to the hubs' loopback meshes.
///
/// The rules it holds: a hub is in rotation only while `GET /healthz` answers 200 (its
/// mesh is checked on its HTTP port, since the mesh listener speaks only WebSocket); a
/// connection a dead hub refused is sent to another (`retries`, `option redispatch`);
/// `timeout server` outlasts the hub's longest long poll (120 s) and SSE keepalive;
/// `timeout tunnel` holds an upgraded WebSocket (the agent pings every 20 s).
pub fn config(
    api: &str,
    mesh: &str,
    socket: &Path,
    backends: &[Backend],
    mesh_tls: Option<&Path>,
) -> String {
    let mesh_bind = match mesh_tls {
        Some(pem) => format!("{mesh} ssl crt {}", pem.display()),
        None => mesh.to_string(),
    };
    let check = format!(
        "    option httpchk\n    http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host localhost\n    http-check expect status 200\n    default-server inter {}ms fall 2 rise 1\n",
        CHECK_INTERVAL.as_millis()
    );
    let mut cfg = format!(
        "global
    stats socket {socket} mode 600 level admin
    log stderr format raw local0

defaults
    mode http
    log global
    option httplog
    option dontlognull
    timeout connect 2s
    timeout client 150s
    timeout server 150s
    timeout tunnel 1h
    timeout http-keep-alive 10s
    timeout check 2s
    retries 3
    option redispatch 1

frontend api
    bind {api}
    default_backend hubs

frontend mesh
    bind {mesh_bind}
    default_backend meshes

backend hubs
    balance roundrobin
{check}",
        socket = socket.display(),
    );
    for b in backends {
        cfg.push_str(&format!("    server {} {} check\n", b.name, b.http));
    }
    cfg.push_str(&format!(
        "\nbackend meshes\n    balance roundrobin\n{check}"
    ));
    for b in backends {
        if let Some(m) = &b.mesh {
            let port = b.http.rsplit(':').next().unwrap_or_default();
            cfg.push_str(&format!("    server {} {m} check port {port}\n", b.name));
        }
    }
    cfg
}

/// `haproxy` on `PATH` or in `/usr/sbin` (Debian's place, off a non-root `PATH`).
pub fn program() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("haproxy"))
        .find(|p| p.is_file())
}

/// HAProxy in front of `backends` for test `what`, or `None` (printing why) where it is not
/// installed. With `CI=true` its absence fails the test: `.ci/run` installs it.
pub fn haproxy_or_skip(what: &str, backends: &[Backend]) -> Option<Haproxy> {
    haproxy_or_skip_tls(what, backends, None)
}

/// [`haproxy_or_skip`], its mesh frontend ending TLS with `mesh_tls` when given (see
/// [`config`]).
pub fn haproxy_or_skip_tls(
    what: &str,
    backends: &[Backend],
    mesh_tls: Option<&Path>,
) -> Option<Haproxy> {
    match program() {
        Some(p) => Some(Haproxy::start(&p, backends, mesh_tls)),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{what}: haproxy is not installed; CI must have it (apt-get install haproxy)")
        }
        None => {
            println!("{what}: skipped: haproxy is not installed (apt-get install haproxy)");
            None
        }
    }
}

/// A running HAProxy; see the module docs.
pub struct Haproxy {
    dir: tempfile::TempDir,
    child: Child,
    /// The API frontend, `127.0.0.1:PORT`.
    pub addr: String,
    /// The mesh frontend, `127.0.0.1:PORT`.
    pub mesh_addr: String,
    /// Whether the mesh frontend ends TLS.
    mesh_tls: bool,
}

impl Haproxy {
    /// Starts `program` in front of `backends` (with `mesh_tls`, see [`config`]); panics
    /// with its log when it does not start (a port taken between choosing and binding it
    /// is tried again with new ones).
    pub fn start(program: &Path, backends: &[Backend], mesh_tls: Option<&Path>) -> Haproxy {
        let mut dir = tempfile::Builder::new()
            .prefix("cortex-haproxy-")
            .tempdir()
            .expect("a temp dir for haproxy");
        let mut tries = 0;
        loop {
            tries += 1;
            let addr = format!("127.0.0.1:{}", dead_port());
            let mesh_addr = format!("127.0.0.1:{}", dead_port());
            let cfg = dir.path().join("haproxy.cfg");
            let socket = dir.path().join("admin.sock");
            let _ = std::fs::remove_file(&socket);
            std::fs::write(&cfg, config(&addr, &mesh_addr, &socket, backends, mesh_tls))
                .expect("write haproxy.cfg");
            let log = File::create(dir.path().join("haproxy.log")).expect("haproxy.log");
            let child = Command::new(program)
                .arg("-f")
                .arg(&cfg)
                .arg("-db")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("the log again"))
                .stderr(log)
                .spawn()
                .expect("spawn haproxy");
            let mut h = Haproxy {
                dir,
                child,
                addr,
                mesh_addr,
                mesh_tls: mesh_tls.is_some(),
            };
            match h.wait_ready() {
                Ok(()) => return h,
                Err(log) if tries < 3 && log.contains("cannot bind") => {
                    let _ = h.child.wait();
                    dir = tempfile::Builder::new()
                        .prefix("cortex-haproxy-")
                        .tempdir()
                        .expect("a temp dir for haproxy");
                    continue;
                }
                Err(log) => panic!("haproxy did not start:\n{log}"),
            }
        }
    }

    /// Until both frontends accept and the stats socket answers; `Err(log)` when HAProxy
    /// exited first.
    fn wait_ready(&mut self) -> Result<(), String> {
        let exited = std::cell::Cell::new(false);
        wait_until(START_LIMIT, "haproxy to accept connections", || {
            if let Ok(Some(_)) = self.child.try_wait() {
                exited.set(true);
                return Some(());
            }
            let up = [&self.addr, &self.mesh_addr]
                .iter()
                .all(|a| std::net::TcpStream::connect(a.as_str()).is_ok());
            (up && self.command("show info").is_some()).then_some(())
        });
        if exited.get() {
            Err(self.log())
        } else {
            Ok(())
        }
    }

    /// Its log (the config's warnings and one line per request).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("haproxy.log")).unwrap_or_default()
    }

    /// `http://127.0.0.1:PORT{path}` on the API frontend.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `ws://127.0.0.1:PORT/mesh/v1` on the mesh frontend (`wss://` when it ends TLS): an
    /// agent's `--hub`.
    pub fn mesh_url(&self) -> String {
        let scheme = if self.mesh_tls { "wss" } else { "ws" };
        format!("{scheme}://{}/mesh/v1", self.mesh_addr)
    }

    /// One command on the stats socket; its whole answer, `None` when it did not answer.
    pub fn command(&self, cmd: &str) -> Option<String> {
        let mut s = UnixStream::connect(self.dir.path().join("admin.sock")).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(format!("{cmd}\n").as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    /// Column `column` of server `server` in `backend` (`hubs` or `meshes`) from `show
    /// stat`: `status` (`UP`, `DOWN`, `UP 1/2` while going down, …), `check_status`
    /// (`L7OK`, `L4CON`, …), `scur` (connections open through it now), ….
    pub fn stat(&self, backend: &str, server: &str, column: &str) -> Option<String> {
        let csv = self.command("show stat")?;
        let mut lines = csv.lines();
        let head = lines.next()?.trim_start_matches("# ");
        let col = head.split(',').position(|h| h == column)?;
        lines.find_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            if f.first() != Some(&backend) || f.get(1) != Some(&server) {
                return None;
            }
            f.get(col).map(|v| v.to_string())
        })
    }

    /// Waits (30 s at most) until HAProxy's checks put `server` of `backend` in state
    /// `want` (`UP` or `DOWN`), by a check's result rather than its state at start.
    pub fn wait_server(&self, backend: &str, server: &str, want: &str) {
        wait_until(
            Duration::from_secs(30),
            &format!("haproxy to see {backend}/{server} {want}"),
            || {
                let status = self.stat(backend, server, "status")?;
                let check = self.stat(backend, server, "check_status")?;
                let checked = if want == "UP" {
                    check == "L7OK"
                } else {
                    !check.is_empty() && check != "L7OK"
                };
                (status == want && checked).then_some(())
            },
        );
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
