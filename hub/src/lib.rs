//! The cortex hub as a library: `main` and the tests start the same server.

pub mod engine;
pub mod secret;
pub mod store;
pub mod text;
pub mod time;
