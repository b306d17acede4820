//! Target `signal`: the body of `POST /webhook/signal` as the route takes it (over 64 KB:
//! refused before parsing; else `SignalRequest::parse`). Properties: no panic; a body is
//! accepted only when it is a JSON object of the known fields within the caps, and a
//! refusal is a typed `ShapeError` whose numbers are true; an accepted request serializes
//! and parses back to itself.

use cortex_protocol::SignalRequest;
use cortex_protocol::signal::{
    MAX_BODY_BYTES, MAX_DATA_CHARS, MAX_MESSAGE_CHARS, MAX_NAME_CHARS, ShapeError,
};
use proptest::prelude::*;
use serde_json::Value;

use crate::driver::{self, Budget, Outcome, Target};

pub const TARGET: Target = Target {
    name: "signal",
    check,
    fuzz,
    seeds,
};

/// The fields a signal may have, with their caps in characters (`status` has none).
const FIELDS: [(&str, usize); 7] = [
    ("id", MAX_NAME_CHARS),
    ("secret", MAX_NAME_CHARS),
    ("status", usize::MAX),
    ("message", MAX_MESSAGE_CHARS),
    ("member", MAX_NAME_CHARS),
    ("data", MAX_DATA_CHARS),
    ("key", MAX_NAME_CHARS),
];

/// Every property of one body.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    // The route answers 413 without parsing a longer body; the parser must hold anyway.
    match SignalRequest::parse(bytes) {
        Ok(req) => accepted(bytes, &req),
        Err(e) => {
            let _ = e.to_string();
            refused(bytes, &e)
        }
    }
}

fn accepted(bytes: &[u8], req: &SignalRequest) -> Result<(), String> {
    // What serde_json's own model says of the same bytes must agree.
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("accepted a body that is not JSON ({e})"))?;
    let obj = v
        .as_object()
        .ok_or("accepted a body that is not a JSON object")?;
    for (k, val) in obj {
        let Some((_, max)) = FIELDS.iter().find(|(f, _)| f == k) else {
            return Err(format!("accepted an unknown field {k:?}"));
        };
        match val {
            Value::Null if k != "id" && k != "secret" => {}
            Value::String(s) => {
                let chars = s.chars().count();
                if chars > *max {
                    return Err(format!("accepted {k} of {chars} characters (cap {max})"));
                }
                if k == "status" && !["ok", "fail", "progress"].contains(&s.as_str()) {
                    return Err(format!("accepted status {s:?}"));
                }
            }
            other => return Err(format!("accepted {k} = {other}")),
        }
    }
    let text = |k: &str| obj.get(k).and_then(Value::as_str).map(str::to_owned);
    let same = Some(req.id.clone()) == text("id")
        && Some(req.secret.clone()) == text("secret")
        && req.message == text("message")
        && req.member == text("member")
        && req.data == text("data")
        && req.key == text("key")
        && req.status.map(|s| s.as_str().to_owned()) == text("status");
    if !same {
        return Err(format!("parsed {req:?}, but the JSON says {v}"));
    }
    // Round trip: what we would send is read back exactly.
    let again = serde_json::to_vec(req).map_err(|e| format!("cannot serialize {req:?}: {e}"))?;
    match SignalRequest::parse(&again) {
        Ok(back) if back == *req => Ok(()),
        Ok(back) => Err(format!("round trip changed {req:?} into {back:?}")),
        Err(e) => Err(format!("round trip of {req:?} refused: {e}")),
    }
}

fn refused(bytes: &[u8], e: &ShapeError) -> Result<(), String> {
    match e {
        ShapeError::Malformed(_) => Ok(()),
        ShapeError::TooLong { field, chars, max } => {
            let v: Value = serde_json::from_slice(bytes)
                .map_err(|j| format!("TooLong for a body that is not JSON ({j})"))?;
            let s = v
                .get(field)
                .and_then(Value::as_str)
                .ok_or_else(|| format!("TooLong names {field}, which the body lacks"))?;
            let real = s.chars().count();
            let cap = FIELDS
                .iter()
                .find(|(f, _)| f == field)
                .map(|(_, m)| *m)
                .ok_or_else(|| format!("TooLong names an unknown field {field}"))?;
            if real != *chars || *max != cap || real <= cap {
                return Err(format!(
                    "TooLong says {field} has {chars} of {max}, but it has {real} (cap {cap})"
                ));
            }
            Ok(())
        }
    }
}

/// Characters that differ between bytes and characters, or that JSON escapes.
fn tricky_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => Just('a'),
        1 => Just('é'),
        1 => Just('€'),
        1 => Just('😀'),
        1 => Just('\0'),
        1 => Just('"'),
        1 => Just('\\'),
        1 => Just('\n'),
        1 => Just('\u{2028}'),
        1 => Just('\u{feff}'),
        2 => any::<char>(),
    ]
}

/// A string of about `cap` characters (one less, equal, one more, a few more) or short.
fn text_near(cap: usize) -> BoxedStrategy<String> {
    let near = if cap == usize::MAX {
        Just(0usize).boxed()
    } else {
        (cap.saturating_sub(2)..=cap + 2).boxed()
    };
    prop_oneof![
        2 => proptest::collection::vec(tricky_char(), 0..24).prop_map(String::from_iter),
        1 => (near, tricky_char(), tricky_char()).prop_map(|(n, a, b)| {
            // Mostly one character repeated, the other at the end: cheap near the cap.
            let mut s: String = std::iter::repeat_n(a, n.saturating_sub(1)).collect();
            if n > 0 {
                s.push(b);
            }
            s
        }),
        1 => prop_oneof![Just("ok"), Just("fail"), Just("progress"), Just("OK"), Just("")]
            .prop_map(str::to_owned),
    ]
    .boxed()
}

/// One JSON value as text: mostly a string, sometimes any other type.
fn json_value(cap: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        6 => text_near(cap).prop_map(|s| Value::String(s).to_string()),
        1 => Just("null".to_owned()),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_map(|f| format!("{f:e}")),
        1 => any::<bool>().prop_map(|b| b.to_string()),
        1 => Just("[\"a\",1,null]".to_owned()),
        1 => Just("{\"a\":{}}".to_owned()),
        // Escapes serde must decode or refuse: a pair, a lone surrogate, a bad escape.
        1 => prop_oneof![
            Just("\"\\ud83d\\ude00\""),
            Just("\"\\udc00\""),
            Just("\"\\ud800x\""),
            Just("\"\\u0000\""),
            Just("\"\\x41\""),
            Just("\"abc"),
        ]
        .prop_map(str::to_owned),
    ]
}

/// A JSON object of signal-like fields (known ones near their caps, unknown ones,
/// duplicates), written by hand so every shape can be produced.
pub fn structured_body() -> impl Strategy<Value = Vec<u8>> {
    let field = prop_oneof![
        12 => proptest::sample::select(FIELDS.to_vec()).prop_flat_map(|(k, cap)| {
            json_value(cap).prop_map(move |v| (k.to_owned(), v))
        }),
        1 => ("[a-zA-Z_]{0,8}", json_value(8)),
        1 => (text_near(4), json_value(8)),
    ];
    (
        Just(("id".to_owned(), "\"wp_1\"".to_owned())),
        Just(("secret".to_owned(), "\"s\"".to_owned())),
        proptest::collection::vec(field, 0..8),
        any::<bool>(),
        0..3usize,
    )
        .prop_map(|(id, secret, rest, keep_required, ws)| {
            let mut fields = rest;
            if keep_required {
                fields.insert(0, id);
                fields.insert(1, secret);
            }
            let sep = [",", " , ", ",\n"][ws];
            let body: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
                .collect();
            format!("{{{}}}", body.join(sep)).into_bytes()
        })
}

/// Valid bodies, the seeds when the corpus is empty.
pub fn seeds() -> Vec<Vec<u8>> {
    vec![
        br#"{"id":"wp_1","secret":"s3cret"}"#.to_vec(),
        br#"{"id":"wp_1","secret":"s3cret","status":"fail","message":"exit 1","member":"m1","data":"tail of the log","key":"k-1"}"#.to_vec(),
        br#"{"id":"wp_1","secret":"s3cret","status":"progress","message":"50%","data":null}"#.to_vec(),
    ]
}

pub fn strategy() -> impl Strategy<Value = Vec<u8>> {
    bodies(TARGET.name, 64)
}

/// Signal bodies for a target named `target`: structured ones, its corpus mutated, raw
/// bytes, and valid bodies padded with spaces (JSON allows them) to within `around` bytes
/// of the body cap, either side.
pub fn bodies(target: &'static str, around: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => structured_body(),
        3 => driver::mutated(driver::corpus_inputs(target), seeds()),
        2 => proptest::collection::vec(any::<u8>(), 0..256),
        1 => (MAX_BODY_BYTES - around..MAX_BODY_BYTES + around).prop_map(|n| {
            let mut b = br#"{"id":"wp_1","secret":"s"}"#.to_vec();
            b.resize(n, b' ');
            b
        }),
    ]
}

fn fuzz(budget: Budget, known: Vec<String>) -> Outcome {
    driver::fuzz(
        TARGET.name,
        strategy(),
        |b| check(b),
        Clone::clone,
        budget,
        known,
    )
}
