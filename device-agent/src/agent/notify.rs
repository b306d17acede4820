//! The agent's `STATUS=` line; the notify socket itself is `cortex_daemon::notify`.

pub use cortex_daemon::notify::SystemdNotifier;

/// `STATUS=` text: what `systemctl status` shows under the unit.
pub fn status_line(link: &str, pending: usize, bad: usize) -> String {
    format!("{link}; {pending} pending, {bad} bad")
}
