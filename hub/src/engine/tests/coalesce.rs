//! `coalesce`: a burst of signals folded into one wake.

use super::*;

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
