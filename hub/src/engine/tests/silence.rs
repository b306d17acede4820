//! `silence_after`: a wake when the signals stop.

use super::*;

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
