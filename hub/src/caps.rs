//! The caps on what a model may make the hub do (settings.json `limits`): tool calls per
//! reply, armed waitpoints per session, spawn depth and spawns per root per hour, a
//! timer's shortest delay, and runs from wakes and timers per session per hour. Here are
//! the decisions, from counts and times to allow, refuse or defer, and the words of each
//! refusal: they name the limit, the count and what to do, since a model reads them.
//! The runner and the store apply them (`runner::turn`, `runner::tools`, `store::ops`).
//!
//! The hourly budgets count over a rolling window: the engine's `waitpointWakeWindowMs`
//! (an hour; shorter only for tests), the window of the waitpoints' own wake cap.

use crate::config::Limits;

/// How many of `times` lie in the window of `window` ms that ends at `now`.
pub fn in_window(times: &[u64], now: u64, window: u64) -> usize {
    times
        .iter()
        .filter(|&&t| t.saturating_add(window) > now)
        .count()
}

/// Keeps of `times` those in the window ending at `now`, oldest first.
pub fn trim(times: &mut Vec<u64>, now: u64, window: u64) {
    times.retain(|&t| t.saturating_add(window) > now);
    times.sort_unstable();
}

/// Whether one more fits a rolling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Room,
    /// `count` in the window, at least the most; one more fits from `until` on.
    Full {
        count: usize,
        until: u64,
    },
}

/// Whether one more fits the window of `window` ms ending at `now`, which may hold at
/// most `max` of `times`.
pub fn window(times: &[u64], max: u32, now: u64, window: u64) -> Window {
    let mut live: Vec<u64> = times
        .iter()
        .copied()
        .filter(|&t| t.saturating_add(window) > now)
        .collect();
    let max = max.max(1) as usize;
    if live.len() < max {
        return Window::Room;
    }
    live.sort_unstable();
    // Once all but max - 1 have left, one more fits.
    let until = live[live.len() - max].saturating_add(window);
    Window::Full {
        count: live.len(),
        until,
    }
}

/// Whether the input a session took may start a run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunGate {
    /// Start it; `counted`: against the runs of wakes and timers (no person's message in it).
    Start { counted: bool },
    /// The hour's runs from wakes and timers are spent: the input waits until `until`.
    Defer { count: usize, until: u64 },
}

/// Whether a run on input with a person's message in it (`from_person`) or of wakes and
/// timers alone may start, given the runs wakes and timers started (`starts`).
pub fn run_gate(from_person: bool, starts: &[u64], limits: &Limits, now: u64, win: u64) -> RunGate {
    if from_person {
        return RunGate::Start { counted: false };
    }
    match window(starts, limits.runs_per_hour, now, win) {
        Window::Room => RunGate::Start { counted: true },
        Window::Full { count, until } => RunGate::Defer { count, until },
    }
}

/// Whether a session may arm, or a wake start, one more spawned session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnGate {
    Allow,
    /// The new session would be `depth` deep (a root is 0).
    TooDeep {
        depth: u32,
    },
    /// The root and what it spawned spawned `count` in the window; room from `until`.
    TooMany {
        count: usize,
        until: u64,
    },
}

impl SpawnGate {
    /// The key of the limit that refuses, if one does.
    pub fn limit(self) -> Option<&'static str> {
        match self {
            SpawnGate::Allow => None,
            SpawnGate::TooDeep { .. } => Some("spawnDepth"),
            SpawnGate::TooMany { .. } => Some("spawnsPerHour"),
        }
    }
}

/// Whether a session `depth` deep whose root spawned at `spawns` may spawn one more.
pub fn spawn_gate(depth: u32, spawns: &[u64], limits: &Limits, now: u64, win: u64) -> SpawnGate {
    let child = depth.saturating_add(1);
    if child > limits.spawn_depth {
        return SpawnGate::TooDeep { depth: child };
    }
    match window(spawns, limits.spawns_per_hour, now, win) {
        Window::Room => SpawnGate::Allow,
        Window::Full { count, until } => SpawnGate::TooMany { count, until },
    }
}

/// `at` is sooner than a timer's shortest delay from `now`.
pub fn timer_too_soon(at: u64, now: u64, limits: &Limits) -> bool {
    at < now.saturating_add(limits.timer_min_delay_ms)
}

fn seconds(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}", ms / 1000)
    } else {
        format!("{:.3}", ms as f64 / 1000.0)
    }
}

/// The answer of each call of a reply past `limits.toolCallsPerReply`.
pub fn tool_calls_refused(made: usize, limits: &Limits) -> String {
    let cap = limits.tool_calls_per_reply;
    format!(
        "not run: this reply made {made} tool calls and only the first {cap} run \
         (limits.toolCallsPerReply = {cap}); make the calls still needed in your next reply, \
         at most {cap} at a time"
    )
}

/// The answer of a call that would arm one more waitpoint than the session may hold.
pub fn armed_refused(armed: usize, limits: &Limits) -> String {
    let cap = limits.armed_waitpoints_per_session;
    format!(
        "not armed: this session holds {armed} armed waitpoints, the most it may \
         (limits.armedWaitpointsPerSession = {cap}); cancel one you no longer need \
         (wait_cancel) or end your turn and arm it after one resolves"
    )
}

/// Why a spawn was refused: to the model when it arms (`arming`), or in the monitor's
/// session's log when a wake came.
pub fn spawn_refused(gate: SpawnGate, limits: &Limits, arming: bool) -> String {
    let what = if arming {
        "not armed"
    } else {
        "no session spawned for this wake"
    };
    match gate {
        SpawnGate::Allow => String::new(),
        SpawnGate::TooDeep { depth } => format!(
            "{what}: a spawned session would be {depth} deep, and sessions spawn at most \
             {max} deep (limits.spawnDepth = {max}; a session made by a person is 0 deep); \
             do the work in this session, or arm the wait without spawn",
            max = limits.spawn_depth
        ),
        SpawnGate::TooMany { count, until } => format!(
            "{what}: this session's root and the sessions it spawned spawned {count} sessions \
             in the last hour, the most they may (limits.spawnsPerHour = {max}); the next may \
             spawn from {at}; until then arm the wait without spawn",
            max = limits.spawns_per_hour,
            at = crate::time::rfc3339(until)
        ),
    }
}

/// The answer of a `schedule_wakeup` due sooner than a timer may be.
pub fn timer_refused(delay_ms: u64, limits: &Limits) -> String {
    let min = limits.timer_min_delay_ms;
    format!(
        "not set: this timer would fire in {} s, sooner than a timer may \
         (limits.timerMinDelayMs = {min}); give in_s of at least {} (or an at that far ahead)",
        seconds(delay_ms),
        seconds(min)
    )
}

/// The `limit-reached` event's message when a session's input waits for the hour.
pub fn runs_deferred(count: usize, inputs: usize, until: u64, limits: &Limits) -> String {
    format!(
        "wakes and timers started {count} runs of this session in the last hour, the most they \
         may (limits.runsPerHour = {max}); its {inputs} waiting input(s) start a run at {at}, \
         or with the next message a person sends",
        max = limits.runs_per_hour,
        at = crate::time::rfc3339(until)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3_600_000;

    fn limits(runs: u32, depth: u32, spawns: u32, min_ms: u64) -> Limits {
        Limits {
            runs_per_hour: runs,
            spawn_depth: depth,
            spawns_per_hour: spawns,
            timer_min_delay_ms: min_ms,
            ..Limits::default()
        }
    }

    /// (times, max, now, expected)
    #[test]
    fn a_rolling_window_has_room_until_full_and_says_when_it_has_again() {
        let cases: &[(&[u64], u32, u64, Window)] = &[
            (&[], 1, 0, Window::Room),
            (&[10, 20], 3, 30, Window::Room),
            (
                &[10, 20, 30],
                3,
                40,
                Window::Full {
                    count: 3,
                    until: 10 + H,
                },
            ),
            // Unordered: the oldest leaves first.
            (
                &[30, 10, 20],
                3,
                40,
                Window::Full {
                    count: 3,
                    until: 10 + H,
                },
            ),
            // The oldest left the window exactly at its end.
            (&[10, 20, 30], 3, 10 + H, Window::Room),
            (
                &[10, 20, 30],
                3,
                10 + H - 1,
                Window::Full {
                    count: 3,
                    until: 10 + H,
                },
            ),
            // More than the most (the limit was lowered): enough must leave.
            (
                &[10, 20, 30, 40, 50],
                3,
                60,
                Window::Full {
                    count: 5,
                    until: 30 + H,
                },
            ),
            // Out of the window does not count.
            (&[1, 2, 3], 3, 2 * H, Window::Room),
        ];
        for (times, max, now, want) in cases {
            assert_eq!(window(times, *max, *now, H), *want, "{times:?} {max} {now}");
        }
        let mut t = vec![30, 1, 2 * H];
        trim(&mut t, H + 5, H);
        assert_eq!(t, [30, 2 * H]);
        assert_eq!(in_window(&[1, 30, 2 * H], H + 5, H), 2);
    }

    /// (from a person, starts, now, expected) with runsPerHour = 2.
    #[test]
    fn runs_from_wakes_and_timers_are_deferred_and_a_person_is_never() {
        let l = limits(2, 3, 60, 5_000);
        let cases: &[(bool, &[u64], u64, RunGate)] = &[
            (false, &[], 0, RunGate::Start { counted: true }),
            (false, &[100], 200, RunGate::Start { counted: true }),
            (
                false,
                &[100, 200],
                300,
                RunGate::Defer {
                    count: 2,
                    until: 100 + H,
                },
            ),
            (true, &[100, 200], 300, RunGate::Start { counted: false }),
            (
                false,
                &[100, 200],
                100 + H,
                RunGate::Start { counted: true },
            ),
        ];
        for (person, starts, now, want) in cases {
            assert_eq!(
                run_gate(*person, starts, &l, *now, H),
                *want,
                "{starts:?} {now}"
            );
        }
    }

    /// (depth of the spawning session, spawns of its root, expected) with spawnDepth = 2,
    /// spawnsPerHour = 3, at now = 1000.
    #[test]
    fn a_spawn_is_refused_too_deep_or_past_the_roots_hour() {
        let l = limits(120, 2, 3, 5_000);
        let cases: &[(u32, &[u64], SpawnGate)] = &[
            (0, &[], SpawnGate::Allow),
            (1, &[10, 20], SpawnGate::Allow),
            (2, &[], SpawnGate::TooDeep { depth: 3 }),
            (u32::MAX, &[], SpawnGate::TooDeep { depth: u32::MAX }),
            (
                0,
                &[10, 20, 30],
                SpawnGate::TooMany {
                    count: 3,
                    until: 10 + H,
                },
            ),
        ];
        for (depth, spawns, want) in cases {
            assert_eq!(
                spawn_gate(*depth, spawns, &l, 1_000, H),
                *want,
                "{depth} {spawns:?}"
            );
        }
    }

    #[test]
    fn each_refusal_names_its_limit_the_count_and_what_to_do() {
        let l = limits(2, 2, 3, 5_000);
        let t = tool_calls_refused(10_000, &Limits::default());
        assert!(
            t.contains("10000 tool calls") && t.contains("toolCallsPerReply = 32"),
            "{t}"
        );
        let a = armed_refused(64, &Limits::default());
        assert!(a.contains("holds 64") && a.contains("wait_cancel"), "{a}");
        let d = spawn_refused(SpawnGate::TooDeep { depth: 3 }, &l, true);
        assert!(
            d.starts_with("not armed") && d.contains("spawnDepth = 2"),
            "{d}"
        );
        let m = spawn_refused(SpawnGate::TooMany { count: 3, until: H }, &l, false);
        assert!(
            m.starts_with("no session spawned") && m.contains("1970-01-01T01:00:00Z"),
            "{m}"
        );
        let s = timer_refused(0, &l);
        assert!(s.contains("in 0 s") && s.contains("at least 5"), "{s}");
        let r = runs_deferred(2, 1, H, &l);
        assert!(
            r.contains("runsPerHour = 2") && r.contains("01:00:00Z"),
            "{r}"
        );
        assert!(timer_too_soon(4_999, 0, &l) && !timer_too_soon(5_000, 0, &l));
    }
}
