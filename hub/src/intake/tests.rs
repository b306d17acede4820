use cortex_protocol::SignalStatus;

use super::*;

fn req(key: Option<&str>) -> SignalRequest {
    SignalRequest {
        id: "wp_1".into(),
        secret: "s".into(),
        status: None,
        message: None,
        member: None,
        data: None,
        key: key.map(String::from),
    }
}

fn keys(src: SignalSource) -> (String, Option<String>) {
    let input = src.signal_in(req(None));
    (input.source, input.dedupe)
}

#[test]
fn sources_and_keys_are_the_stored_ones() {
    // These strings are on disk in every hub: any change makes a file sent again count twice.
    assert_eq!(keys(SignalSource::Http), ("http".into(), None));
    assert_eq!(
        keys(SignalSource::Spool { file: "a.json" }),
        ("spool".into(), Some("file:local:a.json".into()))
    );
    assert_eq!(
        keys(SignalSource::DeviceFile {
            device: "gpu1",
            file: "a.json"
        }),
        ("device:gpu1".into(), Some("file:gpu1:a.json".into()))
    );
    assert_eq!(
        keys(SignalSource::DeviceWait { wait: "wp_1" }),
        ("device-wait".into(), Some("device-wait:wp_1".into()))
    );
}

fn outcome<'a>(end: WaitEnd, payload: &'a str, message: &'a str) -> WaitOutcome<'a> {
    WaitOutcome {
        wait: "wp_1",
        device: "gpu1",
        kind: "pid",
        end,
        payload,
        message,
    }
}

#[test]
fn a_remote_waits_outcome_is_its_sources_signal() {
    let s = wait_outcome_signal(&outcome(WaitEnd::Fired, r#"{"exited":true}"#, "exited"));
    // The same source and key as the way in, and the body's key shows the stored key.
    assert_eq!(
        (s.source.as_str(), s.dedupe.as_deref()),
        ("device-wait", Some("device-wait:wp_1"))
    );
    assert_eq!(s.req.key.as_deref(), Some("device-wait:wp_1"));
    assert_eq!(s.req.id, "wp_1");
    assert_eq!(s.req.message.as_deref(), Some("exited"));
    let data: serde_json::Value =
        serde_json::from_str(s.req.data.as_deref().expect("data")).expect("json");
    assert_eq!(
        data,
        serde_json::json!({"outcome": "fired", "device": "gpu1", "kind": "pid", "payload": {"exited": true}})
    );
    // Only a fired wait is `ok`; a payload that is not JSON is kept as a string.
    for (end, status) in [
        (WaitEnd::Fired, SignalStatus::Ok),
        (WaitEnd::TimedOut, SignalStatus::Fail),
        (WaitEnd::Broke, SignalStatus::Fail),
    ] {
        let s = wait_outcome_signal(&outcome(end, "not json", ""));
        assert_eq!(s.req.status, Some(status), "{end:?}");
        let data: serde_json::Value =
            serde_json::from_str(s.req.data.as_deref().expect("data")).expect("json");
        assert_eq!(data["outcome"], end.as_str());
        assert_eq!(data["payload"], "not json");
    }
}

#[test]
fn an_outcome_too_big_for_data_leaves_its_payload_out() {
    let big = serde_json::json!({"x": "y".repeat(20_000)}).to_string();
    let message = "m".repeat(3_000);
    let s = wait_outcome_signal(&WaitOutcome {
        kind: "flock",
        ..outcome(WaitEnd::Fired, &big, &message)
    });
    let data: serde_json::Value =
        serde_json::from_str(s.req.data.as_deref().expect("data")).expect("json");
    assert_eq!(data["payload_omitted"], true);
    assert_eq!(
        s.req.message.as_deref().map(|m| m.chars().count()),
        Some(2_000)
    );
    assert_eq!(s.req.status, Some(SignalStatus::Ok));
    assert!(s.req.check_caps().is_ok());
}

#[test]
fn the_body_key_wins_except_for_a_remote_wait() {
    let keyed = req(Some("k1"));
    for src in [
        SignalSource::Http,
        SignalSource::Spool { file: "a" },
        SignalSource::DeviceFile {
            device: "gpu1",
            file: "a",
        },
        SignalSource::DeviceFile {
            device: "local",
            file: "a",
        },
    ] {
        assert_eq!(src.dedupe(&keyed).as_deref(), Some("k1"), "{src:?}");
    }
    assert_eq!(
        SignalSource::DeviceWait { wait: "wp_1" }
            .dedupe(&keyed)
            .as_deref(),
        Some("device-wait:wp_1")
    );
}

#[test]
fn a_device_named_local_never_shares_the_hubs_spool_keys() {
    let hub = SignalSource::Spool { file: "a.json" }.dedupe(&req(None));
    let dev = SignalSource::DeviceFile {
        device: LOCAL,
        file: "a.json",
    }
    .dedupe(&req(None));
    assert_ne!(hub, dev);
    assert_eq!(dev.as_deref(), Some("device-file:local:a.json"));
    // Nor another device's, whatever its files are called (a device name has no ':').
    let other = SignalSource::DeviceFile {
        device: "device-file",
        file: "local:a.json",
    }
    .dedupe(&req(None));
    assert_eq!(other.as_deref(), Some("file:device-file:local:a.json"));
    assert_ne!(other, dev);
}

fn gone() -> SignalOutcome {
    SignalOutcome::Refused(Refusal::Gone {
        id: "wp_1".into(),
        state: "resolved",
    })
}

fn ok(o: SignalOutcome) -> Out {
    Ok(o)
}

fn unlisted() -> SignalOutcome {
    SignalOutcome::Refused(Refusal::MemberUnlisted {
        member: "x".into(),
        members: vec!["a".into(), "b".into()],
    })
}

type Out = Result<SignalOutcome, &'static str>;

#[test]
fn http_codes() {
    let misses = MissBudget::default();
    let code = |o: Out| match SignalSource::Http.http_answer(&req(None), o, &misses) {
        HttpAnswer::Accepted(a) => (202, a.state),
        HttpAnswer::Error(s, b) => (s.as_u16(), b.error),
    };
    let armed = SignalOutcome::Accepted {
        state: State::Armed,
    };
    assert_eq!(code(Ok(armed)), (202, "armed".into()));
    assert_eq!(
        code(Ok(SignalOutcome::Duplicate {
            state: State::Resolved
        })),
        (202, "resolved".into())
    );
    assert_eq!(code(ok(gone())), (410, "already_resolved".into()));
    // A late signal is told so, not "already resolved".
    for state in ["expired", "cancelled"] {
        let late = SignalOutcome::Refused(Refusal::Gone {
            id: "wp_1".into(),
            state,
        });
        assert_eq!(code(ok(late)), (410, state.to_string()));
    }
    assert_eq!(code(ok(unlisted())), (422, "bad_member".into()));
    assert_eq!(code(Err("disk")), (503, "store_unavailable".into()));
    assert_eq!(
        code(ok(SignalOutcome::Unknown)),
        (404, "unknown_waitpoint".into())
    );
    assert_eq!(
        code(Ok(SignalOutcome::WrongSecret)),
        (401, "wrong_secret".into())
    );
    for _ in 2..MISS_BUDGET {
        code(ok(SignalOutcome::Unknown));
    }
    assert_eq!(
        code(Ok(SignalOutcome::WrongSecret)),
        (429, "miss_budget_spent".into())
    );
}

#[test]
fn device_acks_and_spool_actions() {
    let dev = SignalSource::DeviceFile {
        device: "gpu1",
        file: "a.json",
    };
    let spool = SignalSource::Spool { file: "a.json" };
    let r = req(None);
    let m = DeviceMisses::default();
    let accepted = || -> Out {
        Ok(SignalOutcome::Accepted {
            state: State::Armed,
        })
    };
    assert_eq!(dev.file_ack(&r, accepted(), &m), FileOutcome::Accepted);
    assert_eq!(spool.spool_action(&r, accepted()), SpoolAction::Delete);
    let dup = || -> Out {
        Ok(SignalOutcome::Duplicate {
            state: State::Armed,
        })
    };
    assert_eq!(dev.file_ack(&r, dup(), &m), FileOutcome::Duplicate);
    assert_eq!(spool.spool_action(&r, dup()), SpoolAction::Delete);
    assert_eq!(dev.file_ack(&r, ok(gone()), &m), FileOutcome::Resolved);
    assert_eq!(spool.spool_action(&r, ok(gone())), SpoolAction::Delete);
    assert!(matches!(
        dev.file_ack(&r, Err("disk"), &m),
        FileOutcome::Retry { .. }
    ));
    assert_eq!(spool.spool_action(&r, Err("disk")), SpoolAction::Keep);
    let why = "no waitpoint \"wp_1\": check the id; a resolved waitpoint is forgotten after 3 days";
    assert_eq!(
        dev.file_ack(&r, ok(SignalOutcome::Unknown), &m),
        FileOutcome::Refused { reason: why.into() }
    );
    assert_eq!(
        spool.spool_action(&r, ok(SignalOutcome::Unknown)),
        SpoolAction::Park(why.into())
    );
    let SpoolAction::Park(why) = spool.spool_action(&r, ok(unlisted())) else {
        panic!("parked");
    };
    assert!(
        why.ends_with("; add \"member\":\"NAME\" with one of: a, b"),
        "{why}"
    );
}

#[test]
fn a_devices_misses_past_its_budget_are_held_back_and_logged_once_a_minute() {
    let m = DeviceMisses::default();
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    // The first refusal is a line; the rest of the minute is quiet.
    let v = m.verdict("gpu1", true, at(0));
    assert_eq!(
        v,
        Verdict {
            within_budget: true,
            log: LogLine::This
        }
    );
    for i in 1..MISS_BUDGET as u64 {
        let v = m.verdict("gpu1", true, at(i));
        assert_eq!(
            v,
            Verdict {
                within_budget: true,
                log: LogLine::Quiet
            },
            "miss {i}"
        );
    }
    // Past the budget: held back (Retry), still quiet; a refusal that is not a miss (a
    // bad member) is never held back.
    for i in 0..5_000u64 {
        assert!(!m.verdict("gpu1", true, at(100 + i / 100)).within_budget);
    }
    assert!(m.verdict("gpu1", false, at(200)).within_budget);
    // Another device has its own budget and its own line.
    let v = m.verdict("gpu2", true, at(300));
    assert_eq!(
        v,
        Verdict {
            within_budget: true,
            log: LogLine::This
        }
    );
    // A minute after the first line: the budget is back, and the line counts the quiet ones.
    let v = m.verdict("gpu1", true, at(60_000));
    assert_eq!(
        v,
        Verdict {
            within_budget: true,
            log: LogLine::Summary {
                quiet: 5_060,
                held: 5_000
            }
        }
    );
}

#[test]
fn a_miss_past_the_devices_budget_is_a_retry_not_a_refusal() {
    let m = DeviceMisses::default();
    let dev = SignalSource::DeviceFile {
        device: "gpu1",
        file: "a.json",
    };
    let r = req(None);
    for _ in 0..MISS_BUDGET {
        assert!(matches!(
            dev.file_ack(&r, ok(SignalOutcome::WrongSecret), &m),
            FileOutcome::Refused { .. }
        ));
    }
    let FileOutcome::Retry { reason } = dev.file_ack(&r, ok(SignalOutcome::WrongSecret), &m) else {
        panic!("held back");
    };
    assert!(reason.contains("60"), "{reason}");
    // A file with the right secret is never held back.
    assert_eq!(
        dev.file_ack(
            &r,
            ok(SignalOutcome::Accepted {
                state: State::Armed
            }),
            &m
        ),
        FileOutcome::Accepted
    );
}

#[test]
fn an_outcomes_name_is_the_routes_word_for_it() {
    // Dashboards and alerts select on these (the `result` label and log field).
    let members = vec!["a".to_string()];
    let named = [
        (
            SignalOutcome::Accepted {
                state: State::Armed,
            },
            "accepted",
        ),
        (
            SignalOutcome::Duplicate {
                state: State::Resolved,
            },
            "duplicate",
        ),
        (SignalOutcome::Unknown, "unknown_waitpoint"),
        (SignalOutcome::WrongSecret, "wrong_secret"),
        (
            SignalOutcome::Refused(Refusal::Gone {
                id: "wp_1".into(),
                state: "resolved",
            }),
            "already_resolved",
        ),
        (
            SignalOutcome::Refused(Refusal::MemberMissing {
                members: members.clone(),
            }),
            "bad_member",
        ),
        (
            SignalOutcome::Refused(Refusal::MemberUnlisted {
                member: "b".into(),
                members,
            }),
            "bad_member",
        ),
    ];
    for (o, name) in named {
        assert_eq!(o.as_str(), name, "{o:?}");
    }
}
