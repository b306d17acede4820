use super::*;
use crate::api::{Badges, SignalView, WaitpointHead, WakeView};

fn facts(quorum: u32, max_signals: u32, counted: u64, reports: u64, failed: u64) -> Facts {
    Facts {
        quorum,
        max_signals,
        counted,
        reports,
        failed,
        ..Facts::default()
    }
}

#[test]
fn the_rule_caps_at_the_quorum_and_says_a_monitors_wakes() {
    // (facts, summary)
    let cases = [
        (facts(3, 1, 0, 0, 0), "0/3"),
        (facts(3, 1, 1, 3, 0), "1/3"),
        (facts(3, 1, 3, 3, 1), "3/3 (1 failed)"),
        (facts(2, 1, 3, 3, 0), "2/2"),
        (
            Facts {
                heartbeats: 2,
                ..facts(1, 1, 0, 0, 0)
            },
            "0/1 +2 progress",
        ),
        (
            Facts {
                wakes: 1,
                ..facts(1, 5, 0, 3, 1)
            },
            "1/5 wakes, 3 reports (1 failed)",
        ),
        (
            Facts {
                wakes: 1,
                ..facts(1, 5, 1, 1, 0)
            },
            "1/5 wakes, 1 report",
        ),
        (facts(0, 1, 0, 0, 0), "0/1"),
    ];
    for (f, want) in cases {
        let p = progress(f);
        assert_eq!(p.summary, want, "{f:?}");
        assert!(p.received <= p.quorum, "{p:?}");
    }
}

fn signal(status: SignalStatus, member: Option<&str>, at: u64) -> SignalView {
    SignalView {
        status,
        message: None,
        member: member.map(str::to_string),
        data: None,
        source: "http".into(),
        key: None,
        at,
    }
}

fn view(
    members: &[&str],
    quorum: u32,
    max_signals: u32,
    signals: Vec<SignalView>,
) -> WaitpointView {
    WaitpointView {
        head: WaitpointHead {
            id: "wp_1".into(),
            session: "ses_1".into(),
            label: "l".into(),
            intent: "i".into(),
            state: "armed".into(),
            created_at: 0,
            expires_at: 10,
            members: members.iter().map(|m| m.to_string()).collect(),
            quorum,
            fail_fast: true,
            max_signals,
            device: None,
            silence_after_ms: None,
            coalesce_ms: None,
            spawn: false,
        },
        resolved_at: None,
        silence_due_at: None,
        signal_count: signals.len() as u64,
        signals,
        wakes: Vec::new(),
        badges: Badges {
            wake_limit_reached: false,
            delivery_attempts: 0,
            wakes_this_hour: 0,
            max_wakes_per_hour: 12,
        },
        progress: None,
    }
}

#[test]
fn a_member_reporting_three_times_counts_once() {
    let ok = SignalStatus::Ok;
    let v = view(
        &["a", "b", "c"],
        3,
        1,
        vec![
            signal(ok, Some("a"), 1),
            signal(ok, Some("a"), 2),
            signal(ok, Some("a"), 3),
        ],
    );
    let p = v.progress();
    assert_eq!((p.received, p.quorum, p.reports), (1, 3, 3));
    assert_eq!(p.summary, "1/3");
}

#[test]
fn a_monitor_counts_its_wakes_and_its_round_since_the_last() {
    let mut v = view(
        &[],
        1,
        4,
        vec![
            signal(SignalStatus::Ok, None, 1),
            signal(SignalStatus::Fail, None, 2),
            signal(SignalStatus::Progress, None, 3),
            signal(SignalStatus::Ok, None, 5),
        ],
    );
    v.wakes = vec![
        WakeView {
            reason: WakeReason::Report,
            at: 4,
            delivered: true,
            spawned: None,
        },
        WakeView {
            reason: WakeReason::Silent,
            at: 4,
            delivered: true,
            spawned: None,
        },
    ];
    let p = v.progress();
    assert_eq!((p.wakes, p.max_signals, p.received), (1, 4, 1));
    assert_eq!(p.summary, "1/4 wakes, 3 reports (1 failed) +1 progress");
    // The hub's own count, when it sent one, is what every view shows.
    v.progress = Some(progress(facts(1, 4, 0, 9, 0)));
    assert_eq!(v.progress().summary, "0/4 wakes, 9 reports");
}
