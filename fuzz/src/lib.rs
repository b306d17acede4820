//! Fuzzing on stable Rust: proptest generates, mutates and shrinks the inputs a hostile
//! user controls (a signal body, a mesh frame, a spool file, the hub's journal file) and
//! each target checks that the code reading them never panics or hangs, answers with a
//! value or a typed error, and round-trips exactly where an encoding exists.
//!
//! `cargo test -p cortex-fuzz` replays each target's corpus (`corpus/<target>/`) and runs
//! a few seconds of generated cases; `cargo xtask fuzz` runs each for minutes.

pub mod driver;
pub mod frames;
pub mod journal;
pub mod signal;
pub mod spool;

#[cfg(test)]
mod tests;

pub use driver::{Budget, Outcome, Target};

/// Every target, in the order runs report them.
pub const TARGETS: [Target; 4] = [
    signal::TARGET,
    frames::TARGET,
    spool::TARGET,
    journal::TARGET,
];
