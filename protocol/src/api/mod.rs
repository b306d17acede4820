//! Bodies of the hub's HTTP API (`/api/...`). Times are milliseconds since the Unix epoch.
//! One file per area: `sessions.rs` (sessions and their events), `runs.rs` (a run's
//! input, calls and result), `people.rs` (what waits on a person, and the answers),
//! `waitpoints.rs`, `devices.rs` (devices, remote waits, the hub's own events), `mcp.rs`
//! (MCP tokens).

mod devices;
mod mcp;
mod people;
mod runs;
mod sessions;
mod waitpoints;

pub use devices::*;
pub use mcp::*;
pub use people::*;
pub use runs::*;
pub use sessions::*;
pub use waitpoints::*;

#[cfg(test)]
mod tests;
