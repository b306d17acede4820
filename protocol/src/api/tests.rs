use super::devices::CONDITION_FIELDS;
use super::*;

#[test]
fn quorum_is_number_or_all() {
    let q: Quorum = serde_json::from_str("2").expect("number");
    assert_eq!(q, Quorum::Count(2));
    let q: Quorum = serde_json::from_str("\"all\"").expect("all");
    assert_eq!(q, Quorum::ALL);
    assert!(serde_json::from_str::<Quorum>("\"most\"").is_err());
    assert_eq!(serde_json::to_string(&Quorum::ALL).expect("ser"), "\"all\"");
}

#[test]
fn event_kind_is_flat() {
    let e = Event {
        seq: 3,
        ts: 10,
        body: EventBody::Message {
            text: "hi".into(),
            when: When::NextTurn,
            dedupe_key: None,
        },
    };
    let v = serde_json::to_value(&e).expect("ser");
    assert_eq!(v["kind"], "message");
    assert_eq!(v["seq"], 3);
    let back: Event = serde_json::from_value(v).expect("de");
    assert_eq!(back, e);
}

#[test]
fn a_device_wait_is_its_condition_beside_its_own_fields() {
    let v = serde_json::json!({
        "kind": "log", "path": "/r/t.log", "match": "nan", "silence": "20m",
        "timeout_s": 60.5, "session": "s1", "label": "train", "intent": "why",
    });
    let b: CreateDeviceWait = serde_json::from_value(v.clone()).expect("a body");
    assert_eq!(b.condition.kind, "log");
    assert_eq!(b.condition.pattern.as_deref(), Some("nan"));
    assert_eq!(b.timeout_s, Some(60.5));
    assert_eq!(b.session.as_deref(), Some("s1"));
    assert_eq!(serde_json::to_value(&b).expect("ser"), v);
    // Null is absent, as with every other optional field.
    let b: CreateDeviceWait =
        serde_json::from_value(serde_json::json!({"kind": "pid", "pid": 4, "label": null}))
            .expect("null label");
    assert_eq!((b.condition.pid, b.label), (Some(4), None));
    // An unknown field is refused by name, listing every field the body takes.
    let e = serde_json::from_value::<CreateDeviceWait>(
        serde_json::json!({"kind": "pid", "pid": 4, "timeout": 5}),
    )
    .expect_err("unknown");
    let e = e.to_string();
    assert!(e.contains("unknown field `timeout`"), "{e}");
    assert!(e.contains("`timeout_s`") && e.contains("`match`"), "{e}");
    let e = serde_json::from_value::<CreateDeviceWait>(
        serde_json::json!({"kind": "pid", "timeout_s": "soon"}),
    )
    .expect_err("a string bound");
    assert!(e.to_string().starts_with("timeout_s: "), "{e}");
}

#[test]
fn the_condition_fields_are_the_conditions_own() {
    let full = crate::waits::WaitCondition {
        kind: "any".into(),
        pid: Some(1),
        start_time: Some(2),
        must_exist: true,
        path: Some("/p".into()),
        pattern: Some("x".into()),
        silence: Some(crate::waits::DurationValue::Seconds(1.0)),
        conditions: Some(vec![]),
    };
    let v = serde_json::to_value(&full).expect("ser");
    let mut keys: Vec<&str> = v
        .as_object()
        .expect("object")
        .keys()
        .map(|k| k.as_str())
        .collect();
    let mut named = CONDITION_FIELDS.to_vec();
    keys.sort_unstable();
    named.sort_unstable();
    assert_eq!(keys, named);
}
