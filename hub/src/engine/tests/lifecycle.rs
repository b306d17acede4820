//! A waitpoint's life: signals, barriers, wakes, the cap, expiry, cancel, purge, its state.

use super::*;

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
