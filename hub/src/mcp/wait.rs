//! Waiting on a waitpoint for an MCP client: what its wake is, once there is one, read
//! from its session's log. The same rule answers a blocking `wait_for` and a task's
//! `tasks/get`: a waitpoint that ended answers with its last wake; an armed monitor with
//! the first wake after the caller's cursor; anything else is still waiting (a device's
//! loss report leaves its wait armed, so it is not the answer).

use std::time::Duration;

use cortex_protocol::api::{Event, EventBody, WaitpointView};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::state::AppState;
use crate::store::StoreError;
use crate::time::now_ms;

/// Log events read per look.
const PAGE: usize = 512;

/// Where a wait stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing {
    /// Its wake: the waitpoint's state, the wake event (as the log holds it) and its seq.
    Woke {
        state: String,
        wake: Value,
        seq: u64,
    },
    /// Ended without a wake (cancelled).
    Ended { state: String },
    /// Still waiting.
    Waiting { state: String, label: String },
    /// No waitpoint of this session by that id.
    Unknown,
}

impl Standing {
    pub fn is_final(&self) -> bool {
        !matches!(self, Standing::Waiting { .. })
    }

    /// What the client reads: the wake's text first (its payload framed as data), then
    /// the same as JSON.
    pub fn answer(&self, id: &str) -> (String, Value) {
        match self {
            Standing::Woke { state, wake, seq } => (
                wake["text"].as_str().unwrap_or("").to_string(),
                json!({"id": id, "state": state, "seq": seq, "wake": wake}),
            ),
            Standing::Ended { state } => (
                format!("waitpoint {id} ended ({state}) without a wake"),
                json!({"id": id, "state": state}),
            ),
            Standing::Waiting { state, label } => (
                format!(
                    "still waiting on {id} \"{label}\" ({state}); call wait_for again with this id to keep waiting"
                ),
                json!({"id": id, "state": state, "waiting": true,
                       "note": "still waiting; call wait_for again with this id"}),
            ),
            Standing::Unknown => (
                format!(
                    "this session has no waitpoint {id:?}; call wait_check without id to list them"
                ),
                json!({"error": format!("this session has no waitpoint {id:?}")}),
            ),
        }
    }
}

/// Where waitpoint `id` of session `sid` stands for a caller whose cursor is `after`
/// (`None`: the log's end now, for a monitor; the whole log for one that ended).
pub async fn standing(
    state: &AppState,
    sid: &str,
    id: &str,
    after: Option<u64>,
) -> Result<(Standing, u64), StoreError> {
    let (s, w) = (sid.to_string(), id.to_string());
    state
        .store
        .read(move |r| {
            let settings = r.settings().clone();
            let last = r.get_session(&s)?.map_or(0, |x| x.last_seq);
            let Some(view) = r.waitpoint(&w, now_ms(), &settings)? else {
                return Ok((Standing::Unknown, last));
            };
            if view.head.session != s {
                return Ok((Standing::Unknown, last));
            }
            let armed = view.head.state == "armed";
            let monitor = view.head.max_signals > 1;
            let from = match after {
                Some(a) => a,
                None if armed => last,
                None => 0,
            };
            // An armed monitor: the first wake after the cursor; one that ended: its last.
            let mut found: Option<(u64, Value)> = None;
            let mut cursor = from;
            if !armed || monitor {
                'pages: loop {
                    let Some(page) = r.events_after(&s, cursor, PAGE)? else {
                        break;
                    };
                    let n = page.len();
                    for raw in page {
                        let Ok(ev) = serde_json::from_slice::<Event>(&raw) else {
                            continue;
                        };
                        cursor = ev.seq;
                        if let EventBody::Wake(wake) = &ev.body
                            && wake.waitpoint.id == w
                        {
                            let v = serde_json::from_slice::<Value>(&raw).unwrap_or(Value::Null);
                            found = Some((ev.seq, v));
                            if armed {
                                break 'pages;
                            }
                        }
                    }
                    if n < PAGE {
                        break;
                    }
                }
            }
            Ok((decide(&view, found), last))
        })
        .await
}

fn decide(view: &WaitpointView, found: Option<(u64, Value)>) -> Standing {
    let state = view.head.state.clone();
    match found {
        Some((seq, wake)) => Standing::Woke { state, wake, seq },
        None if state == "armed" => Standing::Waiting {
            state,
            label: view.head.label.clone(),
        },
        // Ended, its last wake still on its way to the log.
        None if view.wakes.iter().any(|w| !w.delivered) => Standing::Waiting {
            state,
            label: view.head.label.clone(),
        },
        None => Standing::Ended { state },
    }
}

/// One page of a session's log after a cursor, for those that follow it.
pub struct Page {
    /// The events, parsed (one that does not parse is passed over).
    pub events: Vec<Event>,
    /// The seq of the page's last event (the cursor to go on from), or the cursor.
    pub last: u64,
    /// The page was full: more may follow at once.
    pub full: bool,
    /// Subscribed before the read: an event after the page changes it.
    pub watch: watch::Receiver<u64>,
}

/// The events of `sid` after `cursor`, at most `limit`; `None` when the session is gone.
pub async fn page_after(
    state: &AppState,
    sid: &str,
    cursor: u64,
    limit: usize,
) -> Result<Option<Page>, StoreError> {
    let watch = state.store.notifier.subscribe(sid, cursor);
    let s = sid.to_string();
    let Some(raw) = state
        .store
        .read(move |r| r.events_after(&s, cursor, limit))
        .await?
    else {
        return Ok(None);
    };
    let full = raw.len() == limit;
    let mut last = cursor;
    let mut events = Vec::with_capacity(raw.len());
    for r in raw {
        match serde_json::from_slice::<Event>(&r) {
            Ok(ev) => {
                last = ev.seq;
                events.push(ev);
            }
            // Passed over, but the cursor still moves past it.
            Err(_) => {
                if let Some(seq) = serde_json::from_slice::<Value>(&r)
                    .ok()
                    .and_then(|v| v["seq"].as_u64())
                {
                    last = seq;
                }
            }
        }
    }
    Ok(Some(Page {
        events,
        last,
        full,
        watch,
    }))
}

/// Waits until waitpoint `id` of `sid` answers or `until`, calling `tick` every
/// `every` meanwhile (progress for the client). Wakes on the session's log changing.
pub async fn until_final(
    state: &AppState,
    sid: &str,
    id: &str,
    after: Option<u64>,
    until: Instant,
    every: Duration,
    mut tick: impl FnMut(u64),
) -> Result<Standing, StoreError> {
    let started = Instant::now();
    // The cursor is fixed by the first look: a monitor's next wake is after it.
    let mut after = after;
    loop {
        let current = state
            .store
            .read({
                let s = sid.to_string();
                move |r| Ok(r.get_session(&s)?.map_or(0, |x| x.last_seq))
            })
            .await?;
        // Subscribed before the look: a wake after it changes the watch.
        let mut rx = state.store.notifier.subscribe(sid, current);
        let (now, last) = standing(state, sid, id, after).await?;
        after.get_or_insert(last.min(current));
        if now.is_final() || Instant::now() >= until {
            return Ok(now);
        }
        let next_tick = Instant::now() + every;
        tokio::select! {
            _ = rx.changed() => {}
            _ = tokio::time::sleep_until(until.min(next_tick)) => {
                tick(started.elapsed().as_secs());
            }
        }
    }
}
