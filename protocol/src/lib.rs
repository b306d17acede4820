//! The wire of cortex: every type that crosses a process boundary.
//!
//! The signal route's body, the HTTP API's bodies and (later) the hub⇄device frames live
//! here and nowhere else; other crates convert at their edge. This crate does no I/O and
//! depends on no other workspace crate.

pub mod api;
pub mod duration;
pub mod mesh;
pub mod progress;
pub mod signal;
pub mod waits;

pub use signal::{SignalRequest, SignalStatus};

/// Default TCP port of the hub's HTTP listener (`WEBHOOK_PORT`).
pub const DEFAULT_WEBHOOK_PORT: u16 = 3001;
/// Default address of the device mesh listener.
pub const DEFAULT_MESH_LISTEN: &str = "127.0.0.1:3002";
