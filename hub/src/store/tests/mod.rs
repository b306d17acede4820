//! The store's tests, by what they hold (below); here the helpers they share.

use super::*;
use crate::engine::CreateParams;
use crate::store::ops::CreateOutcome;
use cortex_protocol::SignalRequest;
use cortex_protocol::api::{Event, EventBody, WakeReason};

mod agent;
mod damage;
mod device_events;
mod journal;
mod waitpoints;

pub(super) const T0: u64 = 1_796_000_000_000;

/// A store in `dir`, with the default settings (the device-wait tests share it).
pub(crate) fn open(dir: &std::path::Path) -> (Store, WriterGuard) {
    Store::open(&dir.join("hub.redb"), Settings::default()).expect("open")
}

pub(super) async fn session(store: &Store) -> String {
    store
        .exec(|t| t.create_session(Some("t".into()), T0))
        .await
        .expect("session")
        .id
}

pub(super) async fn waitpoint(store: &Store, sid: &str, p: CreateParams) -> (String, String) {
    let secret = crate::secret::new_secret();
    let hash = crate::secret::hash(&secret);
    let sid = sid.to_string();
    match store
        .exec(move |t| t.create_waitpoint(&sid, p, hash, T0))
        .await
        .expect("create")
    {
        CreateOutcome::Created(wp) => (wp.id, secret),
        other => panic!("{other:?}"),
    }
}

pub(super) fn params() -> CreateParams {
    CreateParams {
        label: "job".into(),
        intent: "look at it".into(),
        ..Default::default()
    }
}

/// The writer stops as if the process died (nothing after its last commit is in redb),
/// and every handle is gone: the store at its path can be opened again.
pub(super) async fn crash(store: Store, guard: WriterGuard) {
    store.crash().await;
    drop(store);
    guard.join();
}

/// A monitor taking up to `max` signals: its id and secret.
pub(super) async fn monitor(store: &Store, sid: &str, max: u32) -> (String, String) {
    let p = CreateParams {
        max_signals: Some(max),
        ..params()
    };
    waitpoint(store, sid, p).await
}

pub(super) fn sig(id: &str, secret: &str, key: Option<&str>) -> SignalIn {
    SignalIn {
        req: SignalRequest {
            id: id.into(),
            secret: secret.into(),
            status: None,
            message: Some("done".into()),
            member: None,
            data: None,
            key: key.map(Into::into),
        },
        source: "http".into(),
        dedupe: key.map(Into::into),
    }
}

pub(super) async fn send(store: &Store, s: SignalIn, now: u64) -> SignalOutcome {
    store
        .exec(move |t| t.signal(&s, now))
        .await
        .expect("signal")
}

/// The earliest decided wake the store announces.
pub(super) fn next_timer(store: &Store) -> Option<u64> {
    Some(*store.next_timer.borrow()).filter(|t| *t != u64::MAX)
}

pub(super) async fn events(store: &Store, sid: &str) -> Vec<Event> {
    store
        .read({
            let sid = sid.to_string();
            move |r| r.events_after(&sid, 0, 1000)
        })
        .await
        .expect("read")
        .expect("session")
        .iter()
        .map(|b| serde_json::from_slice(b).expect("event json"))
        .collect()
}

pub(super) async fn wakes(store: &Store, sid: &str) -> Vec<WakeReason> {
    events(store, sid)
        .await
        .into_iter()
        .filter_map(|e| match e.body {
            EventBody::Wake(w) => Some(w.reason),
            _ => None,
        })
        .collect()
}

fn progress(id: &str, secret: &str, key: &str) -> SignalIn {
    let mut s = sig(id, secret, Some(key));
    s.req.status = Some(cortex_protocol::SignalStatus::Progress);
    s
}

pub(super) async fn signal_count(store: &Store, id: &str) -> usize {
    let id = id.to_string();
    store
        .read(move |r| r.waitpoint(&id, T0, &Settings::default()))
        .await
        .expect("read")
        .expect("wp")
        .signals
        .len()
}
