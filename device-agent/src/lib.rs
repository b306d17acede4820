//! The `cortex-device-agent` daemon as a library (its `main.rs` is the flags around
//! [`agent::run`]): the link to the hub (WebSocket, backoff, keepalive, a window of
//! unacknowledged files), the forwarding of spool files over it, and the remote waits. The
//! spool and the waits it runs on are `cortex_host`'s, the daemon setup and the mesh's
//! connection `cortex_daemon`'s. [`cli`] is its flags and help.

pub mod agent;
pub mod cli;
