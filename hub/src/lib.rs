//! The cortex hub as a library: `main` and the tests start the same server
//! ([`server::run`]).
//!
//! - [`engine`]: the waitpoint rules, pure (no I/O, no clock).
//! - [`store`]: redb, behind one writer thread with group commit; the only module that
//!   knows the storage engine.
//! - [`state`]: what the running hub shares (`AppState`, `Config`, `Shutdown`).
//! - [`registry`]: the allowed devices and their live links.
//! - [`intake`]: what every way a signal comes in shares.
//! - [`admission`]: the listeners' connection caps (descriptor budget, eviction).
//! - [`server`]: axum routes, the wake timer, the sweep, the local spool intake.
//! - [`mesh`]: the device mesh's listener and links (WebSocket, rustls).
//! - [`text`]: what agents and people read (wake text, how_to_signal).
//! - [`cli`]: `cortex-hub`'s flags and help (its `main.rs` parses them).
//! - [`metrics`]: what `GET /metrics` shows (Prometheus text format).
//! - [`session_state`]: whether a session runs turns or is a mailbox, and its state for
//!   people, as pure rules.
//! - [`notify`]: outgoing notices (targets, shapes, retries), pure.
//! - [`caps`]: the caps on what a model may make the hub do (settings.json `limits`), pure.

pub mod admission;
pub mod caps;
pub mod claims;
pub mod cli;
pub mod config;
pub mod engine;
pub mod home_lock;
pub mod hosts;
pub mod intake;
pub mod live;
pub mod mcp;
pub mod mesh;
pub mod metrics;
pub mod model;
pub mod notify;
pub mod registry;
pub mod remote_wait;
pub mod runner;
pub mod secret;
pub mod server;
pub mod session_state;
pub mod state;
pub mod stops;
pub mod store;
pub mod text;
pub mod time;
