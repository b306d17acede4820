//! The runner's decisions, as pure functions: when a run stops on its own, and how a run's
//! repeated tool calls are counted. No I/O, no clock (time is passed in).

use cortex_protocol::api::StopConfig;

use crate::store::agent::Turn;

/// A run's steps when neither the session nor the hub says (`stepCount(20)`).
pub const DEFAULT_STEPS: u32 = 20;
/// The same call with the same answer this many times in a row ends a run
/// (`repeatedCalls(3)`).
pub const DEFAULT_REPEATED_CALLS: u32 = 3;
/// Answers the output schema refused that go back to the model for another try, per run
/// (`outputRetries(3)`); the next refusal ends the run `output_invalid`.
pub const DEFAULT_OUTPUT_RETRIES: u32 = 3;

/// Why a run stops before its next step: the `stop` word of its `run-end` and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    pub stop: &'static str,
    pub message: String,
}

/// The session's bounds over the hub's: each bound the session sets wins.
pub fn merged(session: StopConfig, hub: StopConfig) -> StopConfig {
    StopConfig {
        steps: session.steps.or(hub.steps),
        tokens: session.tokens.or(hub.tokens),
        duration_ms: session.duration_ms.or(hub.duration_ms),
        repeated_calls: session.repeated_calls.or(hub.repeated_calls),
        output_retries: session.output_retries.or(hub.output_retries),
    }
}

/// After an answer the output schema refused, `used` refusals already sent back this run:
/// whether this one goes back too (`false`: the run ends `output_invalid`).
pub fn may_retry_output(used: u32, bounds: &StopConfig) -> bool {
    used < bounds.output_retries.unwrap_or(DEFAULT_OUTPUT_RETRIES)
}

/// Whether `turn` must stop before making another model call at `now`.
pub fn stop_before_step(turn: &Turn, bounds: &StopConfig, now: u64) -> Option<Stop> {
    let steps = bounds.steps.unwrap_or(DEFAULT_STEPS);
    if turn.steps >= steps {
        return Some(Stop {
            stop: "steps",
            message: format!("the run made {steps} model calls, its limit (stop.steps)"),
        });
    }
    if let Some(max) = bounds.tokens
        && turn.usage.total_tokens >= max
    {
        return Some(Stop {
            stop: "tokens",
            message: format!(
                "the run used {} tokens, its limit is {max} (stop.tokens)",
                turn.usage.total_tokens
            ),
        });
    }
    if let Some(max) = bounds.duration_ms
        && now.saturating_sub(turn.started_at) >= max
    {
        return Some(Stop {
            stop: "duration",
            message: format!("the run took more than {max} ms (stop.durationMs)"),
        });
    }
    let repeated = bounds.repeated_calls.unwrap_or(DEFAULT_REPEATED_CALLS);
    if let Some((_, n)) = &turn.repeat
        && *n >= repeated
    {
        return Some(Stop {
            stop: "repeated_calls",
            message: format!(
                "the model made the same tool call with the same answer {n} times in a row (stop.repeatedCalls)"
            ),
        });
    }
    None
}

/// A run's bounds that hold while a model call streams: when the run's time is up
/// (`stop.durationMs` from its start, ms since the epoch) and its tokens (`stop.tokens`:
/// the most, and those counted before this call).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct During {
    pub ends_at: Option<u64>,
    pub duration_ms: u64,
    pub tokens: Option<(u64, u64)>,
}

/// The bounds of `turn` that a model call must keep while it streams.
pub fn during(turn: &Turn, bounds: &StopConfig) -> During {
    During {
        ends_at: bounds
            .duration_ms
            .map(|ms| turn.started_at.saturating_add(ms)),
        duration_ms: bounds.duration_ms.unwrap_or(0),
        tokens: bounds.tokens.map(|max| (max, turn.usage.total_tokens)),
    }
}

/// Whether a model call must stop mid-stream, `streamed` tokens into its reply (counted
/// from the usage the server reported, else estimated from the reply's bytes) at `now`:
/// the same stop the next boundary would give, made at once.
pub fn stop_during(d: &During, streamed: u64, now: u64) -> Option<Stop> {
    if let Some((max, before)) = d.tokens {
        let used = before.saturating_add(streamed);
        if used > max {
            return Some(Stop {
                stop: "tokens",
                message: format!(
                    "the run used {used} tokens (this reply's counted as it streamed), its limit is {max} (stop.tokens)"
                ),
            });
        }
    }
    if d.ends_at.is_some_and(|at| now >= at) {
        return Some(Stop {
            stop: "duration",
            message: format!(
                "the run took more than {} ms (stop.durationMs); its model call was stopped mid-stream",
                d.duration_ms
            ),
        });
    }
    None
}

/// Counts a tool call into the run's repeat streak: `signature` names the call, its
/// arguments and its answer; the same one again extends the streak, another starts anew.
pub fn count_repeat(prev: Option<(String, u32)>, signature: String) -> (String, u32) {
    match prev {
        Some((s, n)) if s == signature => (s, n + 1),
        _ => (signature, 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cortex_protocol::api::Usage;

    #[test]
    fn a_call_stops_mid_stream_with_the_runs_own_bounds() {
        let t = turn(1, 4, 1_000, None);
        let none = during(&t, &StopConfig::default());
        assert_eq!(stop_during(&none, u64::MAX, u64::MAX), None, "no bounds");
        let d = during(
            &t,
            &StopConfig {
                tokens: Some(10),
                duration_ms: Some(2_000),
                ..StopConfig::default()
            },
        );
        assert_eq!(d.ends_at, Some(3_000));
        assert_eq!(d.tokens, Some((10, 4)));
        // (streamed tokens, now) -> the stop word
        let table = [
            (0, 1_000, None),
            (6, 2_999, None),
            (7, 2_999, Some("tokens")),
            (0, 3_000, Some("duration")),
            (7, 3_000, Some("tokens")),
        ];
        for (streamed, now, want) in table {
            let got = stop_during(&d, streamed, now);
            assert_eq!(
                got.as_ref().map(|s| s.stop),
                want,
                "{streamed} {now}: {got:?}"
            );
            if let Some(s) = got {
                assert!(s.message.contains("stop."), "{}", s.message);
            }
        }
    }

    fn turn(steps: u32, tokens: u64, started_at: u64, repeat: Option<(&str, u32)>) -> Turn {
        Turn {
            run_id: "run_x".into(),
            started_at,
            steps,
            usage: Usage {
                prompt_tokens: 0,
                completion_tokens: 0,
                total_tokens: tokens,
            },
            repeat: repeat.map(|(s, n)| (s.to_string(), n)),
            ..Turn::default()
        }
    }

    #[test]
    fn stops_before_a_step() {
        let none = StopConfig::default();
        let all = StopConfig {
            steps: Some(5),
            tokens: Some(1_000),
            duration_ms: Some(60_000),
            repeated_calls: Some(2),
            output_retries: Some(1),
        };
        // (turn, bounds, now, expected stop word)
        let cases: Vec<(Turn, StopConfig, u64, Option<&str>)> = vec![
            (turn(0, 0, 0, None), none, 0, None),
            (turn(19, 0, 0, None), none, 0, None),
            (turn(20, 0, 0, None), none, 0, Some("steps")),
            (turn(4, 999, 0, None), all, 59_999, None),
            (turn(5, 0, 0, None), all, 0, Some("steps")),
            (turn(1, 1_000, 0, None), all, 0, Some("tokens")),
            (turn(1, 0, 1_000, None), all, 61_000, Some("duration")),
            (turn(1, 0, 0, Some(("a", 1))), all, 0, None),
            (
                turn(1, 0, 0, Some(("a", 2))),
                all,
                0,
                Some("repeated_calls"),
            ),
            (turn(1, 0, 0, Some(("a", 2))), none, 0, None),
            (
                turn(1, 0, 0, Some(("a", 3))),
                none,
                0,
                Some("repeated_calls"),
            ),
            // No token or time bound unless one is set.
            (turn(1, u64::MAX, 0, None), none, u64::MAX, None),
        ];
        for (t, b, now, want) in cases {
            let got = stop_before_step(&t, &b, now).map(|s| s.stop);
            assert_eq!(got, want, "turn {t:?} bounds {b:?} at {now}");
        }
    }

    #[test]
    fn refused_answers_go_back_up_to_the_bound() {
        let none = StopConfig::default();
        let zero = StopConfig {
            output_retries: Some(0),
            ..StopConfig::default()
        };
        // (used, bounds, another try)
        let cases = [
            (0, none, true),
            (2, none, true),
            (3, none, false),
            (0, zero, false),
        ];
        for (used, b, want) in cases {
            assert_eq!(may_retry_output(used, &b), want, "{used} {b:?}");
        }
    }

    #[test]
    fn repeats_count_only_the_same_call_and_answer() {
        let a = count_repeat(None, "a".into());
        assert_eq!(a, ("a".to_string(), 1));
        let a2 = count_repeat(Some(a), "a".into());
        assert_eq!(a2.1, 2);
        let b = count_repeat(Some(a2), "b".into());
        assert_eq!(b, ("b".to_string(), 1));
    }

    #[test]
    fn the_session_bound_wins() {
        let s = StopConfig {
            steps: Some(3),
            ..StopConfig::default()
        };
        let h = StopConfig {
            steps: Some(10),
            tokens: Some(5),
            ..StopConfig::default()
        };
        let m = merged(s, h);
        assert_eq!(m.steps, Some(3));
        assert_eq!(m.tokens, Some(5));
    }
}
