//! The engine's tests, by what they hold (below); here the helpers they share.

use super::*;

mod coalesce;
mod create;
mod lifecycle;
mod silence;
mod spawn;

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

fn secs(s: f64) -> Option<DurationValue> {
    Some(DurationValue::Seconds(s))
}
