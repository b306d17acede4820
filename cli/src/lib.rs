//! The `cortex-signal` and `cortex` command lines, as a library so their logic is testable.
//!
//! Layout: [`http`] is the blocking HTTP client both binaries use (ureq, rustls); [`signal`] is all of
//! `cortex-signal` (flags, caps, sending) and [`spool`] writes the file it falls back to;
//! [`home`] knows where cortex's files are, [`urls`] reads a list of hub URLs. [`cmd`] is all of `cortex` (one module per
//! command family) over [`hub`], the operator API client; [`timefmt`] turns times into text.
//! Wire types come from `cortex_protocol` and are never redefined here.

pub mod cmd;
pub mod home;
pub mod http;
pub mod hub;
pub mod random;
pub mod signal;
pub mod spool;
pub use cortex_host::sse;
pub mod timefmt;
pub mod urls;

#[cfg(test)]
mod testserver;
