//! What an output schema may cost. The validator compiles each `$ref` target once, but
//! checking a value walks every path through the `$ref`s: a value that fails an `anyOf`
//! is tried against each branch. So a schema whose definitions refer to each other along
//! many paths — `anyOf` over two `$ref`s of the definition before, forty deep, a 2 KB
//! document — has 2⁴⁰ paths, and the first check of a value (the probe its compile makes
//! to decide the unwrap rung, then every answer) never ends: 1.25 s at depth 24 in a
//! release build, doubling with each level. Three bounds keep that off the hub:
//!
//! - [`precheck`](super::precheck::precheck): before anything compiles, the subschemas a check may walk (every
//!   `$ref` followed, recursion counted once) and their depth are counted, cheaply (each
//!   node once, memoized), and a schema over [`MAX_EXPANDED`](super::precheck::MAX_EXPANDED) or [`MAX_DEPTH`](super::precheck::MAX_DEPTH) is
//!   refused. This also bounds what checking one answer costs.
//! - [`compile_within`]: the compile runs on a blocking thread, never a runtime worker,
//!   and a caller waits at most `limits.schemaCompileMs` for it; past it the schema is
//!   refused. A thread cannot be stopped: one that ran past its budget burns on until the
//!   validator returns, so only one compile runs at a time in the whole hub ([`GATE`]):
//!   a compile that passed the precheck takes milliseconds, so waiting in line costs
//!   nothing, and however a schema slips past the precheck it holds at most one thread
//!   (the next callers are told the hub is busy compiling).
//! - A compiled schema is kept ([`cached`](super::cached), keyed by the SHA-256 of its settings), so a
//!   session's schema is compiled once per process, not on every drive.

use std::time::Duration;

use tokio::sync::Semaphore;

use super::{ConfigError, Output, OutputConfig, cached};

/// One compile at a time in the hub (see the module's comment).
static GATE: Semaphore = Semaphore::const_new(1);

/// [`super::compile`] on a blocking thread, answered within `budget` (the wait for the
/// one compile slot included): [`ConfigError::TooSlow`] past it, [`ConfigError::Busy`]
/// when another compile still holds the slot.
pub async fn compile_within(
    config: &OutputConfig,
    budget: Duration,
) -> Result<Output, ConfigError> {
    if let Some(out) = cached(config) {
        return Ok(out);
    }
    // The cheap checks here, so a refused shape never waits for the slot.
    super::check_cheap(config)?;
    let ms = u64::try_from(budget.as_millis()).unwrap_or(u64::MAX);
    let deadline = tokio::time::Instant::now() + budget;
    let permit = match tokio::time::timeout_at(deadline, GATE.acquire()).await {
        Ok(Ok(p)) => p,
        // The gate is never closed; `Err` is only the wait running out.
        _ => return Err(ConfigError::Busy(ms)),
    };
    let c = config.clone();
    let task = tokio::task::spawn_blocking(move || {
        let out = super::compile(&c);
        // Held until the validator returns, however long after the caller gave up.
        drop(permit);
        out
    });
    match tokio::time::timeout_at(deadline, task).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => Err(ConfigError::Schema(format!(
            "the validator failed on it ({e})"
        ))),
        Err(_) => Err(ConfigError::TooSlow(ms)),
    }
}

/// A stored session's output for its runs (none without a schema): compiled within
/// `budget_ms`, or, should it not compile now (a newer validator, a bound it passed
/// before the bounds existed, a busy or slow compile), the checks that refuse every
/// answer. Never an error: a drive is not held up by its session's schema.
pub async fn for_run(config: Option<&OutputConfig>, budget_ms: u64) -> Option<Output> {
    let config = config?;
    let budget = Duration::from_millis(budget_ms);
    Some(compile_within(config, budget).await.unwrap_or_else(|e| {
        tracing::error!(error = %e, "a session's output schema does not compile now; its answers are refused");
        Output::refusing(config.clone())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::output::precheck::chained_any_of;
    use serde_json::{Value, json};

    fn config(schema: Value) -> OutputConfig {
        serde_json::from_value(json!({"schema": schema})).expect("config")
    }

    #[tokio::test]
    async fn a_compile_past_its_budget_is_refused_and_one_within_it_is_kept() {
        // Refused before anything compiles, with no budget to speak of.
        let e = compile_within(&config(chained_any_of(40)), Duration::ZERO)
            .await
            .expect_err("refused");
        assert!(matches!(e, ConfigError::TooLarge(_)), "{e:?}");
        assert!(e.to_string().contains("more than 20000 subschemas"), "{e}");
        // A schema the precheck lets through, its compile (16k paths for the probe)
        // taking longer than no time at all.
        let slow = config(json!({"description": "budget test", "allOf": [chained_any_of(12)]}));
        let e = compile_within(&slow, Duration::ZERO)
            .await
            .expect_err("past the budget");
        assert!(matches!(e, ConfigError::TooSlow(0)), "{e:?}");
        assert!(e.to_string().contains("schemaCompileMs (0 ms)"), "{e}");
        assert!(cached(&slow).is_none(), "a refused compile is not kept");
        // Within a budget it compiles; then it is kept, and asked again it is at once.
        let fine = config(json!({"description": "kept", "type": "object"}));
        compile_within(&fine, Duration::from_secs(60))
            .await
            .expect("compiles");
        assert!(cached(&fine).is_some());
        compile_within(&fine, Duration::ZERO)
            .await
            .expect("kept: no compile");
    }

    #[tokio::test]
    async fn a_stored_schema_that_does_not_compile_refuses_every_answer() {
        let stored = config(chained_any_of(40));
        let out = for_run(Some(&stored), 1_000).await.expect("an output");
        assert_eq!(out.schema(), Some(&stored.schema), "its settings kept");
        let v = out.judge(&json!({"data": "anything"}));
        assert!(matches!(v, super::super::Verdict::Refused { .. }), "{v:?}");
        assert!(
            for_run(None, 1_000).await.is_none(),
            "a chat agent has none"
        );
    }
}
