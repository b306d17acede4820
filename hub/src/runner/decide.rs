//! What a step boundary does next, decided from what it sees: pure functions of the
//! session's state, table-tested here; `turn/` reads the state and applies each
//! decision inside the boundary's write.

use crate::caps::RunGate;

use super::gate::Gate;
use super::rules::Stop;

/// What a boundary sees of a session after taking its inbox (and again after each thing
/// it did since).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seen {
    /// A cancel ended the session.
    pub cancelled: bool,
    /// A run is in progress.
    pub turn: bool,
    /// A call waits on a person.
    pub parked: bool,
    /// Calls of the last reply are still unanswered.
    pub open_calls: bool,
    /// A person asked for a compaction.
    pub compact_asked: bool,
    /// Input waits for a run.
    pub input: bool,
    /// Timers came due during the turn.
    pub timers_due: bool,
}

/// What the boundary does with what it sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// Ended by a cancel: a turn still going stops, the session is handed back.
    Cancelled,
    /// Hand back for a compaction (nothing is open, nobody is asked).
    Compact,
    /// Fire the timers due, then take the inbox again (their items are in it).
    FireTimers,
    /// Nothing to do: handed back idle.
    Idle,
    /// The hour's runs are spent: the input waits until `until`, handed back idle.
    Defer { count: usize, until: u64 },
    /// Start a run on the input (`counted` against the hour's runs), then look again.
    Start { counted: bool },
    /// Still waiting on a person: handed back without a task.
    Parked,
    /// Answer the open calls, then begin the next step.
    Calls,
}

/// The boundary's decision; `gate` is whether a run on the waiting input may start.
pub fn settle(s: &Seen, gate: RunGate) -> Settle {
    if s.cancelled {
        return Settle::Cancelled;
    }
    if s.compact_asked && !s.open_calls && !s.parked {
        return Settle::Compact;
    }
    if !s.turn {
        if !s.input {
            return match s.timers_due {
                true => Settle::FireTimers,
                false => Settle::Idle,
            };
        }
        return match gate {
            RunGate::Start { counted } => Settle::Start { counted },
            RunGate::Defer { count, until } => Settle::Defer { count, until },
        };
    }
    if s.parked {
        return Settle::Parked;
    }
    Settle::Calls
}

/// What follows once the open calls are answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Then {
    /// No run is going any more: take the inbox again.
    Look,
    /// The run's bounds are spent: it ends `stopped`, then the inbox is taken again.
    End(Stop),
    /// Begin the next step; `again`: the step begun and never answered is made again.
    Step { again: bool },
}

/// `turn`: whether a run is going; `again`: the step in progress is one to make again
/// (it was let through its bounds when it began); `stop`: the run's bounds as checked
/// before a new step.
pub fn then(turn: bool, again: bool, stop: impl FnOnce() -> Option<Stop>) -> Then {
    if !turn {
        return Then::Look;
    }
    if again {
        return Then::Step { again: true };
    }
    match stop() {
        Some(s) => Then::End(s),
        None => Then::Step { again: false },
    }
}

/// What is done with the first open call before it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Past the reply's cap: answered with the reason (with the refused calls after it).
    Refused,
    /// Refused by the policy: answered with the reason.
    Deny(String),
    /// A person must approve and the session is unattended: the run ends `needs_human`.
    NeedsHuman(String),
    /// A person must approve: the session parks on an approval.
    Park(String),
    /// Let through; `by` is recorded when it was let through now.
    Run { by: Option<&'static str> },
}

/// `refused`: past the reply's cap; `allowed`: let through before; `gate`: the policy's
/// word on the tool (asked only when needed); `always`: a person allowed the tool always.
pub fn admit(
    refused: bool,
    allowed: bool,
    unattended: bool,
    always: bool,
    gate: impl FnOnce() -> Gate,
) -> Admit {
    if refused {
        return Admit::Refused;
    }
    if allowed {
        return Admit::Run { by: None };
    }
    match gate() {
        Gate::Deny(reason) => Admit::Deny(reason),
        Gate::Ask(reason) if unattended => Admit::NeedsHuman(reason),
        Gate::Ask(reason) => Admit::Park(reason),
        Gate::Allow => Admit::Run {
            by: Some(match always {
                true => "person (always)",
                false => "policy",
            }),
        },
    }
}

/// How an admitted call, as it was prepared, is run; what was prepared is carried to
/// the [`Run`] that uses it (`Q`: the questions for the person, `S`: the call to run in
/// the store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prep<Q, S> {
    /// Not prepared yet.
    Missing,
    /// A question for the person (`ask_user`).
    Ask(Q),
    /// Work outside the hub (`device_exec`).
    External,
    /// Run in the store.
    Store(S),
}

/// What the boundary does with an admitted call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run<Q, S> {
    /// Hand the open calls to the driver to prepare.
    Prepare,
    /// The question needs a person and nobody is there: the run ends `needs_human`.
    NeedsHuman,
    /// Park on the person's answers.
    AskPerson(Q),
    /// Refused by the session's caps before it starts: answered with the reason.
    Capped(String),
    /// Hand it to the driver; `again`: it was handed out before.
    External { again: bool },
    /// Run it in the store and answer it.
    Store(S),
}

/// `started`: handed out before; `capped`: the cap's refusal of a new job (asked only for
/// work outside the hub not begun).
pub fn run<Q, S, E>(
    prep: Prep<Q, S>,
    unattended: bool,
    started: bool,
    capped: impl FnOnce() -> Result<Option<String>, E>,
) -> Result<Run<Q, S>, E> {
    Ok(match prep {
        Prep::Missing => Run::Prepare,
        Prep::Ask(_) if unattended => Run::NeedsHuman,
        Prep::Ask(q) => Run::AskPerson(q),
        Prep::External if !started => match capped()? {
            Some(why) => Run::Capped(why),
            None => Run::External { again: false },
        },
        Prep::External => Run::External { again: true },
        Prep::Store(s) => Run::Store(s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GO: RunGate = RunGate::Start { counted: true };
    const PERSON: RunGate = RunGate::Start { counted: false };
    const SPENT: RunGate = RunGate::Defer {
        count: 120,
        until: 9,
    };

    fn seen(flags: &str) -> Seen {
        let mut s = Seen::default();
        for f in flags.split_whitespace() {
            match f {
                "cancelled" => s.cancelled = true,
                "turn" => s.turn = true,
                "parked" => s.parked = true,
                "open" => s.open_calls = true,
                "compact" => s.compact_asked = true,
                "input" => s.input = true,
                "timers" => s.timers_due = true,
                other => panic!("unknown flag {other}"),
            }
        }
        s
    }

    #[test]
    fn a_boundary_settles_by_what_it_sees() {
        use Settle::*;
        let cases: &[(&str, RunGate, Settle, &str)] = &[
            ("", GO, Idle, "nothing waits"),
            (
                "timers",
                GO,
                FireTimers,
                "due timers fire when nothing else waits",
            ),
            (
                "input timers",
                GO,
                Start { counted: true },
                "input starts a run before timers fire",
            ),
            (
                "input",
                PERSON,
                Start { counted: false },
                "a person's message is not counted",
            ),
            (
                "input",
                SPENT,
                Defer {
                    count: 120,
                    until: 9,
                },
                "the hour's runs are spent",
            ),
            ("turn", SPENT, Calls, "a run going is not gated again"),
            ("turn open", GO, Calls, "open calls are answered"),
            (
                "turn parked open",
                GO,
                Parked,
                "waiting on a person hands back",
            ),
            (
                "parked open input",
                GO,
                Start { counted: true },
                "input starts a run even while parked",
            ),
            (
                "cancelled turn parked open compact input timers",
                GO,
                Cancelled,
                "a cancel wins over all",
            ),
            (
                "compact",
                GO,
                Compact,
                "a compaction asked with nothing open",
            ),
            ("compact turn", GO, Compact, "a compaction between steps"),
            (
                "compact turn open",
                GO,
                Calls,
                "a compaction waits for the open calls",
            ),
            ("compact turn parked open", GO, Parked, "and for a person"),
            (
                "compact input",
                SPENT,
                Compact,
                "a compaction comes before a run",
            ),
            ("turn timers", GO, Calls, "timers wait for the turn to end"),
        ];
        for (flags, gate, want, why) in cases {
            assert_eq!(&settle(&seen(flags), *gate), want, "{flags}: {why}");
        }
    }

    fn stop() -> Stop {
        Stop {
            stop: "steps",
            message: "spent".into(),
        }
    }

    #[test]
    fn after_the_calls_a_step_begins_unless_the_bounds_are_spent() {
        let cases: &[(bool, bool, Option<Stop>, Then)] = &[
            (false, false, Some(stop()), Then::Look),
            (false, true, None, Then::Look),
            (true, false, None, Then::Step { again: false }),
            (true, false, Some(stop()), Then::End(stop())),
            (true, true, Some(stop()), Then::Step { again: true }),
        ];
        for (turn, again, bound, want) in cases {
            let asked = std::cell::Cell::new(false);
            let got = then(*turn, *again, || {
                asked.set(true);
                bound.clone()
            });
            assert_eq!(&got, want, "turn {turn} again {again} bound {bound:?}");
            assert_eq!(
                asked.get(),
                *turn && !*again,
                "bounds asked only for a new step"
            );
        }
    }

    #[test]
    fn a_call_is_admitted_by_its_cap_its_gate_and_who_is_there() {
        let allow = || Gate::Allow;
        let deny = || Gate::Deny("no".into());
        let ask = || Gate::Ask("why".into());
        type G = fn() -> Gate;
        let cases: &[(bool, bool, bool, bool, G, Admit)] = &[
            (true, true, false, false, allow, Admit::Refused),
            (false, true, true, false, deny, Admit::Run { by: None }),
            (
                false,
                false,
                false,
                false,
                allow,
                Admit::Run { by: Some("policy") },
            ),
            (
                false,
                false,
                false,
                true,
                allow,
                Admit::Run {
                    by: Some("person (always)"),
                },
            ),
            (false, false, false, false, deny, Admit::Deny("no".into())),
            (false, false, true, false, deny, Admit::Deny("no".into())),
            (false, false, false, false, ask, Admit::Park("why".into())),
            (
                false,
                false,
                true,
                false,
                ask,
                Admit::NeedsHuman("why".into()),
            ),
        ];
        for (refused, allowed, unattended, always, gate, want) in cases {
            let got = admit(*refused, *allowed, *unattended, *always, gate);
            assert_eq!(
                &got, want,
                "refused {refused} allowed {allowed} unattended {unattended}"
            );
        }
    }

    #[test]
    fn an_admitted_call_runs_as_it_was_prepared() {
        let cap = || Ok(Some("cap".to_string()));
        let free = || Ok(None);
        type C = fn() -> Result<Option<String>, ()>;
        // Nothing prepared rides along here: the payloads are `()`.
        type P = Prep<(), ()>;
        type R = Run<(), ()>;
        let cases: &[(P, bool, bool, C, R)] = &[
            (Prep::Missing, false, false, free, Run::Prepare),
            (Prep::Ask(()), false, false, free, Run::AskPerson(())),
            (Prep::Ask(()), true, false, free, Run::NeedsHuman),
            (
                Prep::External,
                false,
                false,
                free,
                Run::External { again: false },
            ),
            (Prep::External, false, false, cap, Run::Capped("cap".into())),
            (
                Prep::External,
                false,
                true,
                cap,
                Run::External { again: true },
            ),
            (Prep::Store(()), true, false, cap, Run::Store(())),
        ];
        for (prep, unattended, started, capped, want) in cases {
            let got = run(*prep, *unattended, *started, capped).expect("no store here");
            assert_eq!(
                &got, want,
                "{prep:?} unattended {unattended} started {started}"
            );
        }
    }
}
