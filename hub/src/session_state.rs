//! What a session is and what it is doing, as pure rules (no I/O): whether a model runs
//! turns for it (an agent session) or it is a mailbox, and its state for people
//! ([`SessionState`]: `cortex sessions`, the page, `GET /api/sessions`). The store reads
//! the facts and the callers show the answer; the rules live only here.

use cortex_protocol::api::SessionState;

/// The instructions of a session whose creator and hub give none.
pub const DEFAULT_INSTRUCTIONS: &str = "You are an agent working inside cortex. Answer the person plainly. When work takes long (a training run, a build, a process on another machine), do not wait in a loop: arm a waitpoint or a device wait, hand the job its signal line, and end your turn. You will be woken with the result and can act on it then.";

/// [`DEFAULT_INSTRUCTIONS`] for a session shown no tool that waits (no `wait_create`, no
/// `device_wait_*`): they do not speak of waits it cannot arm.
pub const DEFAULT_INSTRUCTIONS_WITHOUT_WAITS: &str =
    "You are an agent working inside cortex. Answer the person plainly.";

/// What a session stored before sessions said whether they run holds, for
/// [`legacy_runs`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Stored<'a> {
    /// Its configuration's instructions (none: it never had a configuration).
    pub instructions: Option<&'a str>,
    pub examples: bool,
    pub output: bool,
    /// The hub's own default instructions (settings.json `agent.instructions`), which a
    /// session made without any was given: not instructions of its own either.
    pub hub_default: Option<&'a str>,
}

/// Whether a session stored before sessions said so runs turns, from what it holds:
/// one with instructions of its own, a worked example or an output schema was made for a
/// model; one with none of these runs only if a model has answered in it before
/// (`model_replied`, asked only then). A session with no configuration (one made before
/// the hub had a runner) and one that only ever held default instructions (the built-in
/// ones or the hub's) and wakes, as the default session of remote waits, is a mailbox.
pub fn legacy_runs(stored: Stored<'_>, model_replied: impl FnOnce() -> bool) -> bool {
    let Some(instructions) = stored.instructions.map(str::trim) else {
        return false;
    };
    let default = instructions == DEFAULT_INSTRUCTIONS
        || instructions == DEFAULT_INSTRUCTIONS_WITHOUT_WAITS
        || stored.hub_default.is_some_and(|d| d.trim() == instructions);
    if !default || stored.examples || stored.output {
        return true;
    }
    model_replied()
}

/// The facts a session's state is computed from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    /// The session was cancelled (it takes no more messages).
    pub cancelled: bool,
    /// An approval or a question waits for a person.
    pub asks_a_person: bool,
    /// A turn is under way or queued (the runner's row is ready or running).
    pub turn_queued: bool,
    /// A model runs turns for it: an agent session on a hub with a model.
    pub model_runs: bool,
    /// Its last run ended with an error.
    pub last_run_failed: bool,
    /// Waitpoints of it that are armed.
    pub armed_waitpoints: u32,
}

/// A session's state, most pressing first: cancelled; waiting on you; running (only
/// when a model will run the queued turn); failed; waiting on a machine; idle.
pub fn state(f: Facts) -> SessionState {
    if f.cancelled {
        SessionState::Cancelled
    } else if f.asks_a_person {
        SessionState::WaitingOnYou
    } else if f.turn_queued && f.model_runs {
        SessionState::Running
    } else if f.last_run_failed {
        SessionState::Failed
    } else if f.armed_waitpoints > 0 {
        SessionState::WaitingOnMachine
    } else {
        SessionState::Idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SessionState::*;

    #[test]
    fn the_state_is_the_most_pressing_fact() {
        let none = Facts::default();
        let armed = Facts {
            armed_waitpoints: 2,
            ..none
        };
        let queued = Facts {
            turn_queued: true,
            model_runs: true,
            ..none
        };
        let cases: &[(Facts, SessionState)] = &[
            (none, Idle),
            (armed, WaitingOnMachine),
            (queued, Running),
            // Queued on a hub without a model (or a mailbox): nothing runs it.
            (
                Facts {
                    model_runs: false,
                    ..queued
                },
                Idle,
            ),
            (
                Facts {
                    model_runs: false,
                    ..Facts {
                        armed_waitpoints: 1,
                        ..queued
                    }
                },
                WaitingOnMachine,
            ),
            (
                Facts {
                    last_run_failed: true,
                    ..armed
                },
                Failed,
            ),
            (
                Facts {
                    last_run_failed: true,
                    ..queued
                },
                Running,
            ),
            (
                Facts {
                    asks_a_person: true,
                    ..queued
                },
                WaitingOnYou,
            ),
            (
                Facts {
                    asks_a_person: true,
                    last_run_failed: true,
                    armed_waitpoints: 1,
                    ..none
                },
                WaitingOnYou,
            ),
            (
                Facts {
                    cancelled: true,
                    asks_a_person: true,
                    ..queued
                },
                Cancelled,
            ),
        ];
        for (facts, want) in cases {
            assert_eq!(state(*facts), *want, "{facts:?}");
        }
    }

    #[test]
    fn a_stored_session_runs_when_it_was_made_for_a_model() {
        let never = || -> bool { panic!("not asked when the configuration decides") };
        let default = Stored {
            instructions: Some(DEFAULT_INSTRUCTIONS),
            ..Stored::default()
        };
        // (stored, a model replied before, runs)
        assert!(!legacy_runs(Stored::default(), never), "no configuration");
        assert!(legacy_runs(
            Stored {
                instructions: Some("Watch the runs."),
                ..Stored::default()
            },
            never
        ));
        assert!(legacy_runs(
            Stored {
                examples: true,
                ..default
            },
            never
        ));
        assert!(legacy_runs(
            Stored {
                output: true,
                ..default
            },
            never
        ));
        assert!(!legacy_runs(default, || false), "only wakes: a mailbox");
        let without_waits = Stored {
            instructions: Some(DEFAULT_INSTRUCTIONS_WITHOUT_WAITS),
            ..Stored::default()
        };
        assert!(
            !legacy_runs(without_waits, || false),
            "the other built-in text"
        );
        assert!(legacy_runs(default, || true), "a chat on the defaults");
        // The hub's own default instructions are no session's own.
        let hubs = Stored {
            instructions: Some("You watch this lab's jobs."),
            ..Stored::default()
        };
        assert!(legacy_runs(hubs, never), "instructions of its own");
        let hub_default = Stored {
            hub_default: Some("You watch this lab's jobs.\n"),
            ..hubs
        };
        assert!(
            !legacy_runs(hub_default, || false),
            "the hub's default: a mailbox"
        );
        assert!(legacy_runs(hub_default, || true));
    }
}
