//! systemd's notify protocol without libsystemd: datagrams of `KEY=VALUE` lines to the
//! socket named by `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace).
//! Both daemons (`Type=notify` units) send `READY=1` once they serve, `STATUS=` lines for
//! `systemctl status`, `WATCHDOG=1` from a loop that proves they still work (so a wedged
//! daemon stops feeding it and is restarted), and `STOPPING=1`.
//!
//! Outside systemd (`$NOTIFY_SOCKET` unset) every call does nothing. A failed send is logged
//! at debug level and otherwise ignored: status reporting must never stop a daemon.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// The systemd notify socket, when there is one.
#[derive(Debug)]
pub struct SystemdNotifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    watchdog: Option<Duration>,
    last_status: String,
}

impl SystemdNotifier {
    /// From `$NOTIFY_SOCKET`, `$WATCHDOG_USEC` and `$WATCHDOG_PID`.
    pub fn from_env() -> SystemdNotifier {
        let socket = std::env::var_os("NOTIFY_SOCKET");
        let usec = std::env::var("WATCHDOG_USEC").ok();
        let pid = std::env::var("WATCHDOG_PID").ok();
        SystemdNotifier::new(
            socket.as_deref().and_then(|s| s.to_str()),
            usec.as_deref(),
            pid.as_deref(),
            std::process::id(),
        )
    }

    /// `socket`: the `$NOTIFY_SOCKET` value; `watchdog_usec` / `watchdog_pid`: the watchdog's
    /// variables; the watchdog is ours only if `WATCHDOG_PID` is unset or names `own_pid`.
    pub fn new(
        socket: Option<&str>,
        watchdog_usec: Option<&str>,
        watchdog_pid: Option<&str>,
        own_pid: u32,
    ) -> SystemdNotifier {
        let target = socket.and_then(|s| match open(s) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(socket = s, error = %e, "cannot use $NOTIFY_SOCKET; systemd will not hear READY or STATUS");
                None
            }
        });
        let ours = watchdog_pid.is_none_or(|p| p.trim().parse::<u32>().ok() == Some(own_pid));
        let watchdog = watchdog_usec
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|&u| u > 0 && ours)
            .map(Duration::from_micros);
        SystemdNotifier {
            target,
            watchdog,
            last_status: String::new(),
        }
    }

    /// How often to send `WATCHDOG=1`: half the unit's `WatchdogSec=`, as sd_notify(3)
    /// recommends; `None` when no watchdog is set for us.
    pub fn watchdog_every(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }

    pub fn ready(&mut self) {
        self.send("READY=1");
    }

    pub fn watchdog(&mut self) {
        self.send("WATCHDOG=1");
    }

    pub fn stopping(&mut self) {
        self.send("STOPPING=1");
    }

    /// A `STATUS=` line, sent only when it changed.
    pub fn status(&mut self, line: &str) {
        // One line: a newline would start a new KEY=VALUE assignment.
        let line = line.replace('\n', " ");
        if line == self.last_status {
            return;
        }
        self.send(&format!("STATUS={line}"));
        self.last_status = line;
    }

    fn send(&self, msg: &str) {
        if let Some((sock, addr)) = &self.target
            && let Err(e) = sock.send_to_addr(msg.as_bytes(), addr)
        {
            tracing::debug!(error = %e, "systemd notify failed");
        }
    }
}

fn open(socket: &str) -> io::Result<(UnixDatagram, SocketAddr)> {
    let addr = if let Some(name) = socket.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        SocketAddr::from_abstract_name(name.as_bytes())?
    } else if socket.starts_with('/') {
        SocketAddr::from_pathname(socket)?
    } else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "neither an absolute path nor an @abstract name",
        ));
    };
    Ok((UnixDatagram::unbound()?, addr))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::SystemdNotifier;

    fn recv_all(sock: &std::os::unix::net::UnixDatagram) -> Vec<String> {
        sock.set_nonblocking(true).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = sock.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        out
    }

    #[test]
    fn notify_messages_reach_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let mut n = SystemdNotifier::new(path.to_str(), Some("60000000"), None, 1);
        assert_eq!(n.watchdog_every(), Some(Duration::from_secs(30)));
        n.ready();
        n.status("connected to ws://127.0.0.1:3002/mesh/v1; 3 pending, 1 bad");
        // The same status twice is sent once.
        n.status("connected to ws://127.0.0.1:3002/mesh/v1; 3 pending, 1 bad");
        n.status("two\nlines");
        n.watchdog();
        n.stopping();
        assert_eq!(
            recv_all(&sock),
            [
                "READY=1",
                "STATUS=connected to ws://127.0.0.1:3002/mesh/v1; 3 pending, 1 bad",
                "STATUS=two lines",
                "WATCHDOG=1",
                "STOPPING=1",
            ]
        );
    }

    #[test]
    fn notify_messages_reach_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("cortex-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = std::os::unix::net::UnixDatagram::bind_addr(&addr).unwrap();
        let mut n = SystemdNotifier::new(Some(&format!("@{name}")), None, None, 1);
        assert_eq!(n.watchdog_every(), None);
        n.ready();
        assert_eq!(recv_all(&sock), ["READY=1"]);
    }

    #[test]
    fn the_watchdog_is_ours_only_for_our_pid() {
        let n = SystemdNotifier::new(None, Some("10000000"), Some("42"), 42);
        assert_eq!(n.watchdog_every(), Some(Duration::from_secs(5)));
        let n = SystemdNotifier::new(None, Some("10000000"), Some("41"), 42);
        assert_eq!(n.watchdog_every(), None);
        let n = SystemdNotifier::new(None, Some("0"), None, 42);
        assert_eq!(n.watchdog_every(), None);
        // No socket: every call is a no-op.
        let mut n = SystemdNotifier::new(None, None, None, 42);
        n.ready();
    }
}
