//! The `cortex-signal` and `cortex` command lines, as a library so their logic is testable.
//!
//! Layout: [`http`] is the tiny blocking HTTP client both binaries use; [`signal`] is all of
//! `cortex-signal` (flags, caps, sending) and [`spool`] writes the file it falls back to;
//! [`home`] knows where cortex's files are. The `cortex` side will follow in its own modules.
//! Wire types come from `cortex_protocol` and are never redefined here.

pub mod home;
pub mod http;
pub mod random;
pub mod signal;
pub mod spool;

#[cfg(test)]
mod testserver;
