//! Spawn, and the newer rules (silence, coalesce, spawn): where they are refused, and state
//! from before them.

use super::*;
use serde::Serialize;

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
