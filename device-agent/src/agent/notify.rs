//! systemd's notify protocol without libsystemd: datagrams of `KEY=VALUE` lines to the
//! socket named by `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace).
//! `READY=1` once the spool is watched, `STATUS=` lines for `systemctl status`,
//! `WATCHDOG=1` from the daemon loop (so a wedged loop stops feeding it), `STOPPING=1`.
//!
//! Outside systemd (`$NOTIFY_SOCKET` unset) every call does nothing. A failed send is logged
//! at debug level and otherwise ignored: status reporting must never stop the agent.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// The systemd notify socket, when there is one.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    watchdog: Option<Duration>,
    last_status: String,
}

impl Notifier {
    /// From `$NOTIFY_SOCKET`, `$WATCHDOG_USEC` and `$WATCHDOG_PID`.
    pub fn from_env() -> Notifier {
        let socket = std::env::var_os("NOTIFY_SOCKET");
        let usec = std::env::var("WATCHDOG_USEC").ok();
        let pid = std::env::var("WATCHDOG_PID").ok();
        Notifier::new(
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
    ) -> Notifier {
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
        Notifier {
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

/// `STATUS=` text: what `systemctl status` shows under the unit.
pub fn status_line(link: &str, pending: usize, bad: usize) -> String {
    format!("{link}; {pending} pending, {bad} bad")
}
