//! The runner's writes: each runs inside one store write, so a step boundary (inbox
//! taken, answers and cancels applied, open tool calls gated and run, run started or
//! ended, next step begun) and a step's result (the model's reply, its calls opened) each
//! land whole or not at all. A crash between them leaves the session `running` in the
//! ready queue (or parked on a person, out of it), and the restarted runner goes on from
//! the transcript: a model call cut off is simply made again.
//!
//! A reply's tool calls are answered strictly in the model's order: each announced
//! (`tool-start`), gated (`super::gate`), then run. The first that waits on a person
//! parks the session (the calls after it are neither run nor refused until it is
//! answered); one that needs preparing outside the store, or has work outside the hub,
//! hands control back to the driver, which comes back with it ([`calls_ready`],
//! [`external_done`]).
//!
//! `run.rs`: what the writes share (what each is given and hands back, a step's address,
//! a run's end); `boundary.rs`: the step boundary and the inbox; `calls.rs`: a reply's
//! tool calls, in order; `results.rs`: a step's result as the driver brings it.

mod boundary;
mod calls;
mod results;
mod run;

pub use boundary::boundary;
pub use results::{
    INTERRUPTED_MARKER, Reply, RetryNote, calls_ready, external_done, step_again, step_done,
    step_failed, step_interrupted, step_stopped,
};
pub use run::{Env, Next, StepAt, Unredacted};
