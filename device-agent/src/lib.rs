//! The device agent's library, and the host-side pieces the hub and the CLI share with it.
//!
//! - [`spool`]: the signal spool (`$CORTEX_HOME/tmp/signals/`): opening it safely, reading the
//!   files jobs drop into it without following links or blocking, parking refused ones under
//!   `bad/`, and an inotify watcher that says when to look. The hub reads its local spool with
//!   the same code.
//! - [`wait`]: seed 004's waits on this machine (a pid exiting, a file written, a lock
//!   free), with its exit-code contract; `cortex wait pid|file|flock` and the agent's remote
//!   waits run it.
//! - [`agent`]: the `cortex-device-agent` daemon: its link to the hub (WebSocket, backoff,
//!   keepalive, a window of unacknowledged files) and the forwarding of spool files over it.
//! - [`daemon`]: the logging and error exit both daemons' `main` share.
//! - [`timing`]: the benchmarks' timing records (JSON lines), off unless asked for.
//!
//! The spool module touches only the filesystem and inotify: forwarding a file and deciding
//! when it was acknowledged belong to the caller.

pub mod agent;
pub mod daemon;
pub mod spool;
pub mod timing;
pub mod wait;
