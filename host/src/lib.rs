//! What cortex's programs share on one machine: the hub, the CLI and the device agent
//! each link this crate, and none of them links another. What only the two daemons share
//! (their logging setup, systemd's notify socket, the mesh's WebSocket connection) is
//! `cortex-daemon`'s, so the CLI builds none of it.
//!
//! - [`spool`]: the signal spool (`$CORTEX_HOME/tmp/signals/`): opening it safely, reading
//!   the files jobs drop into it without following links or blocking, parking refused ones
//!   under `bad/` with a reason, and an inotify watcher that says when to look. The hub's
//!   local spool and the device agent's run the same code.
//! - [`wait`]: the waits on this machine (a pid exiting, a file written, a lock
//!   free), with its exit-code contract; `cortex wait pid|file|flock` and the agent's remote
//!   waits run it.
//! - [`shutdown_signal`]: the one wait for SIGTERM/SIGINT (the daemons stop on it,
//!   `cortex wait` breaks on it).
//! - [`hostname`]: this machine's name (uname), for the spool's lock line and the hub's
//!   mesh URL.
//! - [`timing`]: the benchmarks' timing records (`CORTEX_TIMING_FILE`), off and free
//!   without the variable.
//! - [`atomic`]: replacing a file atomically and durably (temp file, fsync, rename, fsync
//!   of the directory), the one way cortex writes a file others read.
//!
//! - [`sse`]: reading a server-sent event stream split anywhere (the CLI follows the hub's
//!   session events with it, the hub reads a model server's answer).
//!
//! The spool module touches only the filesystem and inotify: forwarding a file and deciding
//! when it was acknowledged belong to the caller.

pub mod atomic;
pub mod spool;
pub mod sse;
pub mod timing;
pub mod wait;

mod shutdown;
pub use shutdown::shutdown_signal;

/// This machine's host name as the kernel has it (uname(2), not /proc/sys, which the hub's
/// sandbox hides); `None` when empty.
pub fn hostname() -> Option<String> {
    let uts = rustix::system::uname();
    let name = uts.nodename().to_string_lossy().trim().to_string();
    (!name.is_empty()).then_some(name)
}
