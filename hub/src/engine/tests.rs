use super::*;
use cortex_protocol::api::AllMarker;
use serde::Serialize;

const T0: u64 = 1_000_000_000;

fn settings() -> Settings {
    Settings::default()
}

fn params(label: &str) -> CreateParams {
    CreateParams {
        label: label.into(),
        intent: "do the next thing".into(),
        ..Default::default()
    }
}

fn wp(p: CreateParams) -> Waitpoint {
    Waitpoint::create("wp_1".into(), "ses_1".into(), [0; 32], p, &settings(), T0).expect("create")
}

fn members(names: &[&str]) -> Option<Vec<String>> {
    Some(names.iter().map(|s| s.to_string()).collect())
}

fn sig(status: SignalStatus, member: Option<&str>) -> SignalMeta<'_> {
    SignalMeta { status, member }
}

const OK: SignalStatus = SignalStatus::Ok;
const FAIL: SignalStatus = SignalStatus::Fail;
const PROGRESS: SignalStatus = SignalStatus::Progress;

fn wakes(effects: &[Effect]) -> Vec<(WakeReason, u64, u64)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Wake(w) => Some((w.reason, w.from_seq, w.to_seq)),
            Effect::Purge => None,
        })
        .collect()
}

#[test]
fn create_defaults() {
    let w = wp(params("nightly"));
    assert_eq!(w.quorum, 1);
    assert!(w.fail_fast);
    assert_eq!(w.max_signals, 1);
    assert_eq!(w.expires_at, T0 + 168 * HOUR_MS);
    assert_eq!(w.state, State::Armed);

    let w = wp(CreateParams {
        members: members(&["a", "b", "c"]),
        ..params("x")
    });
    assert_eq!(w.quorum, 3, "quorum defaults to all with members");

    let w = wp(CreateParams {
        expires_in_hours: Some(0.5),
        ..params("x")
    });
    assert_eq!(w.expires_at, T0 + HOUR_MS / 2, "fractional hours");
    let w = wp(CreateParams {
        expires_in_hours: Some(720.0),
        ..params("x")
    });
    assert_eq!(
        w.expires_at,
        T0 + 720 * HOUR_MS,
        "the ceiling itself is allowed"
    );
}

#[test]
fn create_refusals() {
    let s = settings();
    let cases: Vec<(CreateParams, CreateError)> = vec![
        (params("  "), CreateError::EmptyLabel),
        (
            CreateParams {
                intent: "".into(),
                ..params("x")
            },
            CreateError::EmptyIntent,
        ),
        (
            CreateParams {
                members: Some(vec![]),
                ..params("x")
            },
            CreateError::NoMembers,
        ),
        (
            CreateParams {
                members: members(&["a", "a"]),
                ..params("x")
            },
            CreateError::DuplicateMember("a".into()),
        ),
        (
            CreateParams {
                members: members(&["a b"]),
                ..params("x")
            },
            CreateError::BadMember("a b".into()),
        ),
        (
            CreateParams {
                quorum: Some(Quorum::All(AllMarker::All)),
                ..params("x")
            },
            CreateError::AllWithoutMembers,
        ),
        (
            CreateParams {
                quorum: Some(Quorum::Count(0)),
                ..params("x")
            },
            CreateError::ZeroQuorum,
        ),
        (
            CreateParams {
                members: members(&["a", "b"]),
                quorum: Some(Quorum::Count(3)),
                ..params("x")
            },
            CreateError::QuorumOverMembers {
                quorum: 3,
                members: 2,
            },
        ),
        (
            CreateParams {
                max_signals: Some(0),
                ..params("x")
            },
            CreateError::BadMaxSignals,
        ),
        (
            CreateParams {
                expires_in_hours: Some(720.5),
                ..params("x")
            },
            CreateError::BadExpiry {
                got: 720.5,
                max_hours: 720.0,
            },
        ),
        (
            CreateParams {
                expires_in_hours: Some(0.0),
                ..params("x")
            },
            CreateError::BadExpiry {
                got: 0.0,
                max_hours: 720.0,
            },
        ),
        (
            CreateParams {
                expires_in_hours: Some(-1.0),
                ..params("x")
            },
            CreateError::BadExpiry {
                got: -1.0,
                max_hours: 720.0,
            },
        ),
    ];
    for (p, want) in cases {
        let got = Waitpoint::create("wp".into(), "s".into(), [0; 32], p.clone(), &s, T0);
        assert_eq!(got, Err(want.clone()), "{p:?}");
        assert!(!want.to_string().is_empty());
    }
}

#[test]
fn one_ok_fires_at_once_and_resolves() {
    let s = settings();
    let mut w = wp(params("x"));
    let fx = w.signal(sig(OK, None), &s, T0 + 5).expect("accepted");
    assert_eq!(wakes(&fx), vec![(WakeReason::Fired, 0, 1)]);
    assert_eq!(w.state, State::Resolved);
    let Effect::Wake(plan) = &fx[0] else {
        panic!("wake")
    };
    assert_eq!(plan.waited_ms, 5);
    assert_eq!(
        w.signal(sig(OK, None), &s, T0 + 6),
        Err(Refusal::Gone {
            id: "wp_1".into(),
            state: "resolved"
        })
    );
}

#[test]
fn progress_never_wakes() {
    let s = settings();
    let mut w = wp(params("x"));
    for i in 0..50 {
        assert!(
            w.signal(sig(PROGRESS, None), &s, T0 + i)
                .expect("ok")
                .is_empty()
        );
    }
    assert_eq!(w.state, State::Armed);
    assert_eq!(w.progress_count, 50);
    // The wake that does come carries the heartbeats before it.
    let fx = w.signal(sig(OK, None), &s, T0 + 100).expect("ok");
    assert_eq!(wakes(&fx), vec![(WakeReason::Fired, 0, 51)]);
}

#[test]
fn three_member_barrier_wakes_once_three_seconds_after_completing() {
    let s = settings();
    let mut w = wp(CreateParams {
        members: members(&["arm2", "arm6", "arm8"]),
        ..params("x")
    });
    assert!(
        w.signal(sig(OK, Some("arm2")), &s, T0 + 10)
            .expect("ok")
            .is_empty()
    );
    // A member reporting twice does not complete the set.
    assert!(
        w.signal(sig(OK, Some("arm2")), &s, T0 + 11)
            .expect("ok")
            .is_empty()
    );
    assert!(
        w.signal(sig(OK, Some("arm6")), &s, T0 + 12)
            .expect("ok")
            .is_empty()
    );
    assert!(
        w.signal(sig(OK, Some("arm8")), &s, T0 + 20)
            .expect("ok")
            .is_empty()
    );
    assert_eq!(w.timer(), Some(T0 + 20 + 3_000));
    assert!(w.tick(&s, T0 + 3_019).is_empty());
    // Recorded in the window: carried by the wake.
    assert!(
        w.signal(sig(PROGRESS, Some("arm6")), &s, T0 + 1_000)
            .expect("ok")
            .is_empty()
    );
    let fx = w.tick(&s, T0 + 3_020);
    assert_eq!(wakes(&fx), vec![(WakeReason::Fired, 0, 5)]);
    assert_eq!(w.state, State::Resolved);
    assert!(matches!(
        w.signal(sig(OK, Some("arm8")), &s, T0 + 4_000),
        Err(Refusal::Gone { .. })
    ));
}

#[test]
fn quorum_two_of_three() {
    let s = settings();
    let mut w = wp(CreateParams {
        members: members(&["a", "b", "c"]),
        quorum: Some(Quorum::Count(2)),
        ..params("x")
    });
    assert!(w.signal(sig(OK, Some("c")), &s, T0).expect("ok").is_empty());
    assert!(
        w.signal(sig(OK, Some("a")), &s, T0 + 1)
            .expect("ok")
            .is_empty()
    );
    assert_eq!(
        wakes(&w.tick(&s, T0 + 3_001)),
        vec![(WakeReason::Fired, 0, 2)]
    );
}

#[test]
fn members_are_checked() {
    let s = settings();
    let mut w = wp(CreateParams {
        members: members(&["a", "b"]),
        ..params("x")
    });
    assert_eq!(
        w.signal(sig(OK, None), &s, T0),
        Err(Refusal::MemberMissing {
            members: vec!["a".into(), "b".into()]
        })
    );
    assert_eq!(
        w.signal(sig(OK, Some("z")), &s, T0),
        Err(Refusal::MemberUnlisted {
            member: "z".into(),
            members: vec!["a".into(), "b".into()]
        })
    );
    assert_eq!(w.signal_count, 0, "a refused signal is not recorded");
}

#[test]
fn fail_fast_wakes_on_the_first_failure() {
    let s = settings();
    let mut w = wp(CreateParams {
        members: members(&["a", "b", "c"]),
        ..params("x")
    });
    assert!(w.signal(sig(OK, Some("a")), &s, T0).expect("ok").is_empty());
    let fx = w.signal(sig(FAIL, Some("b")), &s, T0 + 1).expect("ok");
    assert_eq!(
        wakes(&fx),
        vec![(WakeReason::Failed, 0, 2)],
        "no barrier delay for a failure"
    );
    assert_eq!(w.state, State::Resolved);
}

#[test]
fn a_failure_during_the_barrier_window_wakes_at_once() {
    let s = settings();
    let mut w = wp(CreateParams {
        members: members(&["a", "b", "c"]),
        quorum: Some(Quorum::Count(2)),
        ..params("x")
    });
    w.signal(sig(OK, Some("a")), &s, T0).expect("ok");
    w.signal(sig(OK, Some("b")), &s, T0).expect("ok");
    let fx = w.signal(sig(FAIL, Some("c")), &s, T0 + 10).expect("ok");
    assert_eq!(wakes(&fx), vec![(WakeReason::Failed, 0, 3)]);
}

#[test]
fn without_fail_fast_a_failure_waits_for_the_set() {
    let s = settings();
    let mut w = wp(CreateParams {
        members: members(&["a", "b"]),
        fail_fast: Some(false),
        ..params("x")
    });
    assert!(
        w.signal(sig(FAIL, Some("a")), &s, T0)
            .expect("ok")
            .is_empty()
    );
    assert!(
        w.signal(sig(OK, Some("b")), &s, T0 + 1)
            .expect("ok")
            .is_empty()
    );
    assert_eq!(
        wakes(&w.tick(&s, T0 + 3_001)),
        vec![(WakeReason::Failed, 0, 2)]
    );
}

#[test]
fn a_monitor_of_three_wakes_three_times_then_resolves() {
    let s = settings();
    let mut w = wp(CreateParams {
        max_signals: Some(3),
        ..params("x")
    });
    for i in 0..3u64 {
        w.signal(sig(PROGRESS, None), &s, T0 + i * 10).expect("ok");
        let fx = w.signal(sig(OK, None), &s, T0 + i * 10 + 1).expect("ok");
        assert_eq!(wakes(&fx), vec![(WakeReason::Report, i * 2, i * 2 + 2)]);
    }
    assert_eq!(w.state, State::Resolved);
    assert!(matches!(
        w.signal(sig(OK, None), &s, T0 + 100),
        Err(Refusal::Gone { .. })
    ));
}

#[test]
fn the_hourly_cap_holds_wakes_and_folds_them_into_one() {
    let s = Settings {
        max_wakes_per_hour: 2,
        ..settings()
    };
    let mut w = wp(CreateParams {
        max_signals: Some(10),
        ..params("x")
    });
    assert_eq!(
        wakes(&w.signal(sig(OK, None), &s, T0).expect("ok")).len(),
        1
    );
    assert_eq!(
        wakes(&w.signal(sig(OK, None), &s, T0 + 60_000).expect("ok")).len(),
        1
    );
    // Third report inside the hour: held.
    assert!(
        w.signal(sig(OK, None), &s, T0 + 120_000)
            .expect("ok")
            .is_empty()
    );
    assert_eq!(w.wake_pending().map(|p| p.held_by_cap), Some(true));
    assert_eq!(w.timer(), Some(T0 + HOUR_MS));
    assert_eq!(w.wakes_in_hour(T0 + 120_000, &s), 2);
    // More reports fold into the held wake.
    assert!(
        w.signal(sig(FAIL, None), &s, T0 + 130_000)
            .expect("ok")
            .is_empty()
    );
    assert!(
        w.signal(sig(OK, None), &s, T0 + 140_000)
            .expect("ok")
            .is_empty()
    );
    assert!(w.tick(&s, T0 + HOUR_MS - 1).is_empty());
    let fx = w.tick(&s, T0 + HOUR_MS);
    assert_eq!(
        wakes(&fx),
        vec![(WakeReason::Failed, 2, 5)],
        "one late wake carrying three"
    );
    assert_eq!(w.wakes.len(), 3);
    assert_eq!(w.state, State::Armed, "a monitor stays open");
}

#[test]
fn expiry_notices_say_what_arrived() {
    let s = settings();
    let exp = T0 + 168 * HOUR_MS;
    let notice = |fx: Vec<Effect>| match fx.as_slice() {
        [
            Effect::Wake(WakePlan {
                reason: WakeReason::Expired,
                notice: Some(n),
                ..
            }),
        ] => n.clone(),
        other => panic!("expected one expiry wake, got {other:?}"),
    };

    let mut w = wp(params("x"));
    assert!(w.tick(&s, exp - 1).is_empty());
    assert_eq!(notice(w.tick(&s, exp)), ExpiryNotice::NobodyReported);
    assert_eq!(w.state, State::Expired);
    assert!(matches!(
        w.signal(sig(OK, None), &s, exp + 1),
        Err(Refusal::Gone { .. })
    ));

    let mut w = wp(params("x"));
    w.signal(sig(PROGRESS, None), &s, T0).expect("ok");
    w.signal(sig(PROGRESS, None), &s, T0 + 1).expect("ok");
    assert_eq!(
        notice(w.tick(&s, exp)),
        ExpiryNotice::OnlyHeartbeats { count: 2 }
    );

    let mut w = wp(CreateParams {
        members: members(&["a", "b", "c"]),
        ..params("x")
    });
    w.signal(sig(OK, Some("b")), &s, T0).expect("ok");
    assert_eq!(
        notice(w.tick(&s, exp)),
        ExpiryNotice::SomeMembers {
            reported: vec!["b".into()],
            missing: vec!["a".into(), "c".into()],
            quorum: 3
        }
    );

    let mut w = wp(CreateParams {
        quorum: Some(Quorum::Count(3)),
        ..params("x")
    });
    w.signal(sig(OK, None), &s, T0).expect("ok");
    assert_eq!(
        notice(w.tick(&s, exp)),
        ExpiryNotice::SomeSignals { got: 1, quorum: 3 }
    );
}

#[test]
fn a_monitor_deadline_carries_unheard_reports() {
    let s = Settings {
        max_wakes_per_hour: 1,
        ..settings()
    };
    let mut w = wp(CreateParams {
        max_signals: Some(5),
        expires_in_hours: Some(0.5),
        ..params("x")
    });
    assert_eq!(
        wakes(&w.signal(sig(OK, None), &s, T0).expect("ok")).len(),
        1
    );
    assert!(
        w.signal(sig(OK, None), &s, T0 + 1_000)
            .expect("ok")
            .is_empty(),
        "held by the cap"
    );
    let fx = w.tick(&s, T0 + HOUR_MS / 2);
    assert_eq!(wakes(&fx), vec![(WakeReason::Expired, 1, 2)]);
    let Effect::Wake(plan) = &fx[0] else {
        panic!("wake")
    };
    assert_eq!(
        plan.notice,
        Some(ExpiryNotice::MonitorDeadline {
            wakes: 1,
            max_signals: 5
        })
    );
}

#[test]
fn a_completed_barrier_at_the_deadline_still_fires() {
    let s = settings();
    let mut w = wp(CreateParams {
        members: members(&["a", "b"]),
        expires_in_hours: Some(1.0),
        ..params("x")
    });
    w.signal(sig(OK, Some("a")), &s, T0 + HOUR_MS - 2_000)
        .expect("ok");
    w.signal(sig(OK, Some("b")), &s, T0 + HOUR_MS - 1_000)
        .expect("ok");
    let fx = w.tick(&s, T0 + HOUR_MS);
    assert_eq!(wakes(&fx), vec![(WakeReason::Fired, 0, 2)]);
    assert_eq!(w.state, State::Resolved);
}

#[test]
fn ended_waitpoints_are_kept_three_days_then_purged() {
    let s = settings();
    let mut w = wp(params("x"));
    w.signal(sig(OK, None), &s, T0).expect("ok");
    assert_eq!(w.deadline(&s), T0 + 3 * DAY_MS);
    assert!(w.tick(&s, T0 + 3 * DAY_MS - 1).is_empty());
    assert_eq!(w.tick(&s, T0 + 3 * DAY_MS), vec![Effect::Purge]);
}

#[test]
fn cancel_disarms() {
    let s = settings();
    let mut w = wp(CreateParams {
        members: members(&["a", "b"]),
        ..params("x")
    });
    w.signal(sig(OK, Some("a")), &s, T0).expect("ok");
    w.signal(sig(OK, Some("b")), &s, T0).expect("ok");
    assert!(w.cancel(T0 + 1));
    assert!(!w.cancel(T0 + 2), "cancelling twice is a no-op");
    assert_eq!(w.timer(), None, "the pending wake is dropped");
    assert!(w.tick(&s, T0 + 10_000).is_empty());
    assert!(matches!(
        w.signal(sig(OK, Some("a")), &s, T0 + 3),
        Err(Refusal::Gone {
            state: "cancelled",
            ..
        })
    ));
}

#[test]
fn state_round_trips_through_messagepack() {
    let s = settings();
    let mut w = wp(CreateParams {
        members: members(&["a", "b"]),
        ..params("x")
    });
    w.signal(sig(OK, Some("a")), &s, T0).expect("ok");
    let bytes = rmp_serde::to_vec(&w).expect("encode");
    let back: Waitpoint = rmp_serde::from_slice(&bytes).expect("decode");
    assert_eq!(back, w);
}

// ------------------------------------------------------------ silence_after

fn secs(s: f64) -> Option<DurationValue> {
    Some(DurationValue::Seconds(s))
}

fn silent(effects: &[Effect]) -> Vec<&Silence> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Wake(WakePlan {
                reason: WakeReason::Silent,
                silence: Some(s),
                ..
            }) => Some(s),
            _ => None,
        })
        .collect()
}

#[test]
fn silence_is_due_from_creation_then_from_the_last_signal() {
    let s = settings();
    let mut w = wp(CreateParams {
        silence_after: secs(60.0),
        ..params("x")
    });
    assert_eq!(w.silence_after_ms, Some(60_000));
    assert_eq!(w.timer(), Some(T0 + 60_000), "the timer ticks it precisely");
    assert!(w.tick(&s, T0 + 59_999).is_empty());
    let fx = w.tick(&s, T0 + 60_000);
    assert_eq!(
        silent(&fx),
        vec![&Silence {
            quiet_ms: 60_000,
            last: None
        }],
        "nothing since creation"
    );
    assert_eq!(w.state, State::Armed, "a silent wake leaves it armed");
    assert_eq!(w.timer(), None, "once per quiet spell");
    assert!(w.tick(&s, T0 + 500_000).is_empty(), "no second one");

    // A heartbeat starts the next spell.
    w.signal(sig(PROGRESS, None), &s, T0 + 600_000).expect("ok");
    assert_eq!(w.timer(), Some(T0 + 660_000));
    w.signal(sig(PROGRESS, None), &s, T0 + 610_000).expect("ok");
    assert_eq!(
        w.timer(),
        Some(T0 + 670_000),
        "counted from the last signal"
    );
    let fx = w.tick(&s, T0 + 670_000);
    assert_eq!(
        silent(&fx),
        vec![&Silence {
            quiet_ms: 60_000,
            last: Some((1, T0 + 610_000))
        }]
    );
    let Effect::Wake(plan) = &fx[0] else {
        panic!("wake")
    };
    assert_eq!((plan.from_seq, plan.to_seq), (2, 2), "it carries no signal");
    assert_eq!(
        w.delivered_through, 0,
        "the heartbeats still ride on the report"
    );
    // The report's wake still carries both heartbeats.
    let fx = w.signal(sig(OK, None), &s, T0 + 700_000).expect("ok");
    assert_eq!(wakes(&fx), vec![(WakeReason::Fired, 0, 3)]);
    assert_eq!(w.state, State::Resolved, "the silent wakes did not count");
    assert_eq!(w.timer(), None);
}

#[test]
fn silent_wakes_count_toward_neither_max_signals_nor_the_cap() {
    let s = Settings {
        max_wakes_per_hour: 2,
        ..settings()
    };
    let mut w = wp(CreateParams {
        max_signals: Some(2),
        silence_after: secs(1.0),
        ..params("x")
    });
    let mut t = T0;
    for _ in 0..5 {
        t += 1_000;
        assert_eq!(silent(&w.tick(&s, t)).len(), 1, "silent, whatever the cap");
        w.signal(sig(PROGRESS, None), &s, t).expect("ok");
    }
    assert_eq!(w.wakes.len(), 5);
    assert_eq!(w.wakes_in_hour(t, &s), 0);
    assert_eq!(w.reports_delivered(), 0);
    assert_eq!(
        wakes(&w.signal(sig(OK, None), &s, t + 1).expect("ok")),
        vec![(WakeReason::Report, 0, 6)]
    );
    assert_eq!(
        wakes(&w.signal(sig(OK, None), &s, t + 2).expect("ok")),
        vec![(WakeReason::Report, 6, 7)]
    );
    assert_eq!(w.state, State::Resolved, "two reports, then done");
}

#[test]
fn silence_at_the_deadline_is_the_expiry_notice() {
    let s = settings();
    let mut w = wp(CreateParams {
        expires_in_hours: Some(1.0),
        silence_after: Some(DurationValue::Text("1h".into())),
        ..params("x")
    });
    let fx = w.tick(&s, T0 + HOUR_MS);
    assert_eq!(wakes(&fx), vec![(WakeReason::Expired, 0, 0)]);
    assert_eq!(w.timer(), None);
}

#[test]
fn a_cancelled_waitpoint_is_never_silent() {
    let s = settings();
    let mut w = wp(CreateParams {
        silence_after: secs(5.0),
        ..params("x")
    });
    assert!(w.cancel(T0 + 1));
    assert_eq!(w.timer(), None);
    assert!(w.tick(&s, T0 + 10_000).is_empty());
}

// ------------------------------------------------------------ coalesce

#[test]
fn coalesce_folds_a_burst_into_one_wake_fixed_from_the_first() {
    let s = settings();
    let mut w = wp(CreateParams {
        max_signals: Some(5),
        coalesce: secs(10.0),
        ..params("x")
    });
    assert!(
        w.signal(sig(OK, None), &s, T0).expect("ok").is_empty(),
        "the first report opens the window"
    );
    assert_eq!(w.timer(), Some(T0 + 10_000));
    for i in 1..10u64 {
        assert!(
            w.signal(sig(OK, None), &s, T0 + i * 1_000 - 1)
                .expect("ok")
                .is_empty()
        );
        assert_eq!(w.timer(), Some(T0 + 10_000), "not sliding");
    }
    let fx = w.tick(&s, T0 + 10_000);
    assert_eq!(
        wakes(&fx),
        vec![(WakeReason::Report, 0, 10)],
        "one wake, all ten"
    );
    assert_eq!(w.reports_delivered(), 1, "one toward max_signals");
    assert_eq!(w.wakes_in_hour(T0 + 10_000, &s), 1, "one toward the cap");
    // A report after the window opens the next one.
    assert!(
        w.signal(sig(OK, None), &s, T0 + 10_001)
            .expect("ok")
            .is_empty()
    );
    assert_eq!(w.timer(), Some(T0 + 20_001));
    assert_eq!(
        wakes(&w.tick(&s, T0 + 20_001)),
        vec![(WakeReason::Report, 10, 11)]
    );
}

#[test]
fn coalesce_and_fail_fast() {
    let s = settings();
    // A failure first wakes at once, as a monitor's does without coalesce.
    let mut w = wp(CreateParams {
        max_signals: Some(5),
        coalesce: secs(10.0),
        ..params("x")
    });
    assert_eq!(
        wakes(&w.signal(sig(FAIL, None), &s, T0).expect("ok")),
        vec![(WakeReason::Failed, 0, 1)]
    );
    // A failure inside an open window ends it at once, carrying the window so far.
    w.signal(sig(OK, None), &s, T0 + 100).expect("ok");
    w.signal(sig(OK, None), &s, T0 + 200).expect("ok");
    assert_eq!(
        wakes(&w.signal(sig(FAIL, None), &s, T0 + 300).expect("ok")),
        vec![(WakeReason::Failed, 1, 4)]
    );
    // Without fail_fast the failure waits out the window; the wake says failed.
    let mut w = wp(CreateParams {
        max_signals: Some(5),
        coalesce: secs(10.0),
        fail_fast: Some(false),
        ..params("x")
    });
    assert!(w.signal(sig(FAIL, None), &s, T0).expect("ok").is_empty());
    assert!(w.signal(sig(OK, None), &s, T0 + 1).expect("ok").is_empty());
    assert_eq!(
        wakes(&w.tick(&s, T0 + 10_000)),
        vec![(WakeReason::Failed, 0, 2)]
    );
}

#[test]
fn coalesced_wakes_are_held_by_the_cap_and_fold_further() {
    let s = Settings {
        max_wakes_per_hour: 1,
        ..settings()
    };
    let mut w = wp(CreateParams {
        max_signals: Some(5),
        coalesce: secs(10.0),
        ..params("x")
    });
    w.signal(sig(OK, None), &s, T0).expect("ok");
    assert_eq!(wakes(&w.tick(&s, T0 + 10_000)).len(), 1);
    w.signal(sig(OK, None), &s, T0 + 20_000).expect("ok");
    assert!(
        w.tick(&s, T0 + 30_000).is_empty(),
        "the window ended inside a full hour"
    );
    assert_eq!(w.wake_pending().map(|p| p.held_by_cap), Some(true));
    assert_eq!(w.timer(), Some(T0 + 10_000 + HOUR_MS));
    w.signal(sig(OK, None), &s, T0 + 40_000).expect("ok");
    assert_eq!(
        wakes(&w.tick(&s, T0 + 10_000 + HOUR_MS)),
        vec![(WakeReason::Report, 1, 3)]
    );
}

#[test]
fn coalesce_with_members_waits_for_the_later_of_window_and_barrier() {
    let s = settings();
    let mut w = wp(CreateParams {
        members: members(&["a", "b"]),
        max_signals: Some(3),
        coalesce: secs(10.0),
        ..params("x")
    });
    w.signal(sig(OK, Some("a")), &s, T0).expect("ok");
    w.signal(sig(OK, Some("b")), &s, T0 + 1_000).expect("ok");
    assert_eq!(w.timer(), Some(T0 + 10_000), "the window outlasts the 3 s");
    let mut w = wp(CreateParams {
        members: members(&["a", "b"]),
        max_signals: Some(3),
        coalesce: secs(1.0),
        ..params("x")
    });
    w.signal(sig(OK, Some("a")), &s, T0).expect("ok");
    w.signal(sig(OK, Some("b")), &s, T0 + 5_000).expect("ok");
    assert_eq!(
        w.timer(),
        Some(T0 + 8_000),
        "the barrier's delay outlasts the window"
    );
}

// ------------------------------------------------------------ spawn

fn spawn_cfg() -> Option<SpawnConfig> {
    Some(SpawnConfig {
        instructions: "Look at the report and file a ticket.".into(),
        title: None,
    })
}

#[test]
fn every_wake_of_a_spawning_monitor_spawns() {
    let s = settings();
    let mut w = wp(CreateParams {
        max_signals: Some(2),
        silence_after: secs(30.0),
        spawn: spawn_cfg(),
        expires_in_hours: Some(1.0),
        ..params("x")
    });
    let spawns = |fx: &[Effect]| -> Vec<(WakeReason, bool)> {
        fx.iter()
            .filter_map(|e| match e {
                Effect::Wake(p) => Some((p.reason, p.spawn)),
                Effect::Purge => None,
            })
            .collect()
    };
    assert_eq!(
        spawns(&w.signal(sig(OK, None), &s, T0).expect("ok")),
        vec![(WakeReason::Report, true)]
    );
    assert_eq!(
        spawns(&w.tick(&s, T0 + 30_000)),
        vec![(WakeReason::Silent, true)]
    );
    assert_eq!(
        spawns(&w.tick(&s, T0 + HOUR_MS)),
        vec![(WakeReason::Expired, true)]
    );
    // A plain monitor does not.
    let mut w = wp(CreateParams {
        max_signals: Some(2),
        ..params("x")
    });
    assert_eq!(
        spawns(&w.signal(sig(OK, None), &s, T0).expect("ok")),
        vec![(WakeReason::Report, false)]
    );
}

#[test]
fn the_spawned_session_is_recorded_on_its_wake() {
    let s = settings();
    let mut w = wp(CreateParams {
        max_signals: Some(3),
        spawn: spawn_cfg(),
        ..params("x")
    });
    let fx = w.signal(sig(OK, None), &s, T0).expect("ok");
    let Effect::Wake(plan) = &fx[0] else {
        panic!("wake")
    };
    w.delivered(plan.index, 1, Some("ses_new".into()));
    assert_eq!(w.wakes[0].spawned.as_deref(), Some("ses_new"));
    let bytes = rmp_serde::to_vec_named(&w).expect("encode");
    let back: Waitpoint = rmp_serde::from_slice(&bytes).expect("decode");
    assert_eq!(back, w);
}

#[test]
fn the_new_rules_are_refused_where_they_do_not_fit() {
    let s = settings();
    let cases: Vec<(CreateParams, CreateError)> = vec![
        (
            CreateParams {
                silence_after: secs(0.5),
                ..params("x")
            },
            CreateError::BadSilence {
                got: "500ms".into(),
                max: "7d".into(),
            },
        ),
        (
            CreateParams {
                silence_after: secs(7_200.0),
                expires_in_hours: Some(1.0),
                ..params("x")
            },
            CreateError::BadSilence {
                got: "2h".into(),
                max: "1h".into(),
            },
        ),
        (
            CreateParams {
                coalesce: secs(10.0),
                ..params("x")
            },
            CreateError::MonitorsOnly("coalesce"),
        ),
        (
            CreateParams {
                coalesce: secs(0.0),
                max_signals: Some(3),
                ..params("x")
            },
            CreateError::BadCoalesce {
                got: "0ms".into(),
                max: "7d".into(),
            },
        ),
        (
            CreateParams {
                spawn: spawn_cfg(),
                ..params("x")
            },
            CreateError::MonitorsOnly("spawn"),
        ),
        (
            CreateParams {
                spawn: Some(SpawnConfig {
                    instructions: "  ".into(),
                    title: None,
                }),
                max_signals: Some(3),
                ..params("x")
            },
            CreateError::EmptySpawnInstructions,
        ),
    ];
    for (p, want) in cases {
        let got = Waitpoint::create("wp".into(), "s".into(), [0; 32], p.clone(), &s, T0);
        assert_eq!(got, Err(want.clone()), "{p:?}");
        assert!(!want.to_string().is_empty());
    }
    let bad = Waitpoint::create(
        "wp".into(),
        "s".into(),
        [0; 32],
        CreateParams {
            silence_after: Some(DurationValue::Text("soon".into())),
            ..params("x")
        },
        &s,
        T0,
    );
    assert!(
        matches!(&bad, Err(CreateError::BadDuration(m)) if m.contains("silence_after")),
        "{bad:?}"
    );
}

#[test]
fn state_from_before_the_new_rules_still_decodes() {
    #[derive(Serialize)]
    struct Old<'a> {
        id: &'a str,
        session: &'a str,
        label: &'a str,
        intent: &'a str,
        secret_hash: [u8; 32],
        members: Vec<String>,
        quorum: u32,
        fail_fast: bool,
        max_signals: u32,
        device: Option<String>,
        created_at: u64,
        expires_at: u64,
        state: State,
        ended_at: Option<u64>,
        signal_count: u64,
        delivered_through: u64,
        progress_count: u64,
        ever_reported: Vec<String>,
        terminal_count: u64,
        round: Round,
        wakes: Vec<WakeRecord>,
        pending: Option<Pending>,
    }
    let old = Old {
        id: "wp_1",
        session: "ses_1",
        label: "x",
        intent: "y",
        secret_hash: [0; 32],
        members: vec![],
        quorum: 1,
        fail_fast: true,
        max_signals: 3,
        device: None,
        created_at: T0,
        expires_at: T0 + HOUR_MS,
        state: State::Armed,
        ended_at: None,
        signal_count: 0,
        delivered_through: 0,
        progress_count: 0,
        ever_reported: vec![],
        terminal_count: 0,
        round: Round::default(),
        wakes: vec![],
        pending: None,
    };
    let bytes = rmp_serde::to_vec_named(&old).expect("encode");
    let w: Waitpoint = rmp_serde::from_slice(&bytes).expect("decode");
    assert_eq!(
        (w.silence_after_ms, w.coalesce_ms, w.spawn),
        (None, None, None)
    );
}

#[test]
fn expiry_is_a_timer_like_the_others() {
    let s = settings();
    // 7 s: the store runs the rules at the deadline itself, not at the next sweep.
    let mut w = wp(CreateParams {
        expires_in_hours: Some(7.0 / 3600.0),
        ..params("short")
    });
    let deadline = w.expires_at;
    assert_eq!(w.timer(), None, "no wake decided, no silence");
    assert_eq!(w.next_due(), Some(deadline), "the expiry alone");
    assert!(w.tick(&s, deadline - 1).is_empty());
    let fx = w.tick(&s, deadline);
    assert_eq!(wakes(&fx), vec![(WakeReason::Expired, 0, 0)]);
    assert_eq!(w.next_due(), None, "ended: nothing more is due");

    // The earlier of a timer and the expiry.
    let mut w = wp(CreateParams {
        silence_after: secs(60.0),
        expires_in_hours: Some(0.5),
        ..params("quiet")
    });
    assert_eq!(w.next_due(), Some(T0 + 60_000), "the silence first");
    w.tick(&s, T0 + 60_000);
    assert_eq!(w.next_due(), Some(w.expires_at), "then the expiry");
    assert!(w.cancel(T0 + 61_000));
    assert_eq!(w.next_due(), None, "cancelled");
}

/// Progress, as every view shows it: a member is counted once however often it
/// reports, a one-shot keeps its count once it fired, a monitor counts its wakes.
#[test]
fn progress_counts_each_member_once_and_a_monitors_wakes() {
    let s = settings();
    let mut w = wp(CreateParams {
        members: members(&["a", "b", "c"]),
        fail_fast: Some(false),
        ..params("sweep")
    });
    for _ in 0..3 {
        w.signal(sig(OK, Some("a")), &s, T0).expect("a");
    }
    w.signal(sig(PROGRESS, Some("b")), &s, T0).expect("b");
    let p = cortex_protocol::progress::progress(w.progress_facts());
    assert_eq!((p.received, p.quorum, p.reports), (1, 3, 3));
    assert_eq!(p.summary, "1/3 +1 progress");
    w.signal(sig(FAIL, Some("b")), &s, T0).expect("b");
    w.signal(sig(OK, Some("c")), &s, T0).expect("c");
    w.tick(&s, T0 + s.barrier_delay_ms);
    assert_eq!(w.state, State::Resolved);
    let p = cortex_protocol::progress::progress(w.progress_facts());
    assert_eq!(p.summary, "3/3 (1 failed) +1 progress", "{p:?}");

    let mut m = wp(CreateParams {
        max_signals: Some(5),
        ..params("mon")
    });
    for (i, st) in [OK, FAIL, OK].into_iter().enumerate() {
        m.signal(sig(st, None), &s, T0 + i as u64 * 1000)
            .expect("report");
    }
    let p = cortex_protocol::progress::progress(m.progress_facts());
    assert_eq!((p.wakes, p.max_signals, p.reports, p.failed), (3, 5, 3, 1));
    assert_eq!(p.summary, "3/5 wakes, 3 reports (1 failed)");
}
