//! Creating a waitpoint: the defaults, and what is refused.

use super::*;
use cortex_protocol::api::AllMarker;

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
