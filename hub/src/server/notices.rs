//! The delivery task of outgoing notices: it reads the store's outbox
//! (`store/notices.rs`), sends each notice to every target that wants it (`crate::notify`:
//! the shape's request, one `POST`, bounded by `ATTEMPT_TIMEOUT`), and records each
//! attempt's outcome in the store before it counts it. It wakes when a notice is queued
//! (the store's `notice` topic, raised once the write is durable), when a retry falls due,
//! or at the hub's stop; a restart finds what was pending in the outbox and goes on.
//!
//! Delivery is at least once: an attempt answered 2xx whose record did not reach the
//! store (the hub killed in between) is sent again after the restart, with the same
//! `X-Cortex-Notice` id, so a receiver can drop the repeat. Logs name a target by its id
//! and `scheme://host/…`, never its whole URL.

use std::sync::Arc;
use std::time::Duration;

use crate::notify::{self, Target, Verdict};
use crate::state::AppState;
use crate::store::notices::{DONE_KEPT_MS, Delivery, DeliveryState, NoticeRecord, TOPIC_NOTICE};
use crate::time::now_ms;

/// Notices read per pass.
const PAGE: usize = 64;
/// How long a failing store is left before the next pass.
const STORE_RETRY: Duration = Duration::from_secs(1);

/// Runs until the hub stops.
pub(super) async fn run(state: AppState, targets: Arc<Vec<Target>>) {
    let client = match reqwest::Client::builder()
        .connect_timeout(notify::ATTEMPT_TIMEOUT)
        .timeout(notify::ATTEMPT_TIMEOUT)
        .user_agent(concat!("cortex-hub/", env!("CARGO_PKG_VERSION")))
        // A redirect is an answer, not followed: the body stays with the host it was set for.
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e.without_url(), "cannot build the notices' HTTP client; no notice is sent");
            return;
        }
    };
    for t in targets.iter() {
        tracing::info!(target_id = %t.id, shape = ?t.shape, url = %t.shown_url(), "notices go to this target");
    }
    let mut queued = state.store.notifier.watch(TOPIC_NOTICE, "", 0);
    let mut last_purge = 0u64;
    loop {
        queued.borrow_and_update();
        let next = match pass(&state, &client, &targets).await {
            Ok(next) => next,
            Err(()) => Some(now_ms() + STORE_RETRY.as_millis() as u64),
        };
        let now = now_ms();
        if now.saturating_sub(last_purge) > 3600_000 {
            last_purge = now;
            let before = now.saturating_sub(DONE_KEPT_MS);
            if let Err(e) = state
                .store
                .exec(move |t| t.purge_notices(before, 1000))
                .await
            {
                tracing::warn!(error = %e, "cannot purge the notices done a day ago");
            }
        }
        let sleep = next.map(|at| Duration::from_millis(at.saturating_sub(now_ms())));
        tokio::select! {
            () = async { match sleep { Some(d) => tokio::time::sleep(d).await, None => std::future::pending().await } } => {}
            r = queued.changed() => if r.is_err() { return },
            () = state.shutdown.cancelled() => return,
        }
    }
}

/// One pass: every pending notice's due attempts. Returns when the next one is due
/// (`None`: nothing pending), or `Err` when the store failed.
async fn pass(
    state: &AppState,
    client: &reqwest::Client,
    targets: &[Target],
) -> Result<Option<u64>, ()> {
    let pending = state
        .store
        .read(|r| r.notices_pending(PAGE))
        .await
        .map_err(|e| tracing::error!(error = %e, "cannot read the notices' outbox"))?;
    let full = pending.len() >= PAGE;
    let mut next: Option<u64> = None;
    for rec in pending {
        let (deliveries, counted) = deliver(client, targets, &rec).await;
        let seq = rec.seq;
        let keep = deliveries.clone();
        let now = now_ms();
        if let Err(e) = state
            .store
            .exec(move |t| t.notice_progress(seq, keep, now))
            .await
        {
            tracing::error!(error = %e, notice = seq, "cannot record a notice's delivery; it is tried again");
            return Err(());
        }
        // Counted once the outcome is durable.
        for result in counted {
            crate::metrics::metrics().notice(rec.notice.event.as_str(), result);
        }
        for d in &deliveries {
            if d.state == DeliveryState::Pending {
                next = Some(next.map_or(d.next_at, |n| n.min(d.next_at)));
            }
        }
    }
    if full {
        // More than a page pending: the next pass at once.
        return Ok(Some(now_ms()));
    }
    Ok(next)
}

/// The deliveries of `rec` after this pass's attempts (fanned out to the targets that
/// want it on its first pass), and what each attempt counts as.
async fn deliver(
    client: &reqwest::Client,
    targets: &[Target],
    rec: &NoticeRecord,
) -> (Vec<Delivery>, Vec<&'static str>) {
    let now = now_ms();
    let mut deliveries = rec.deliveries.clone().unwrap_or_else(|| {
        targets
            .iter()
            .filter(|t| t.wants(rec.notice.event))
            .map(|t| Delivery {
                target: t.id.clone(),
                attempts: 0,
                next_at: now,
                state: DeliveryState::Pending,
            })
            .collect()
    });
    let mut counted = Vec::new();
    let id = rec.id();
    for d in deliveries.iter_mut() {
        if d.state != DeliveryState::Pending || d.next_at > now {
            continue;
        }
        let Some(target) = targets.iter().find(|t| t.id == d.target) else {
            tracing::warn!(notice = %id, target_id = %d.target, "a notice's target is no longer in settings.json notify; given up");
            d.state = DeliveryState::Failed {
                at: now,
                why: "the target left the settings".into(),
            };
            counted.push("failed");
            continue;
        };
        d.attempts += 1;
        let (status, why) = attempt(client, target, &id, rec).await;
        let at = now_ms();
        match notify::verdict(status) {
            Verdict::Sent => {
                tracing::info!(notice = %id, event = rec.notice.event.as_str(), target_id = %target.id, attempts = d.attempts, "notice sent");
                d.state = DeliveryState::Sent { at };
                counted.push("sent");
            }
            Verdict::Retry if d.attempts < notify::MAX_ATTEMPTS => {
                let delay = notify::retry_delay(d.attempts, notify::unit_draw());
                tracing::warn!(notice = %id, target_id = %target.id, url = %target.shown_url(), attempts = d.attempts, error = %why, retry_in_ms = delay.as_millis() as u64, "a notice was not delivered; it is tried again");
                d.next_at = at + delay.as_millis() as u64;
                counted.push("retry");
            }
            verdict => {
                let why = if verdict == Verdict::Refused {
                    format!("refused: {why}")
                } else {
                    format!("{} attempts: {why}", d.attempts)
                };
                tracing::error!(notice = %id, target_id = %target.id, url = %target.shown_url(), error = %why, "a notice was given up");
                d.state = DeliveryState::Failed { at, why };
                counted.push("failed");
            }
        }
    }
    (deliveries, counted)
}

/// One `POST`: the status it was answered (`None`: no answer), and what to log of it.
async fn attempt(
    client: &reqwest::Client,
    target: &Target,
    id: &str,
    rec: &NoticeRecord,
) -> (Option<u16>, String) {
    let req = target.request(id, &rec.notice);
    let mut b = client
        .post(target.url())
        .header(reqwest::header::CONTENT_TYPE, req.content_type)
        .body(req.body);
    for (k, v) in req.headers {
        b = b.header(k, v);
    }
    match b.send().await {
        Ok(resp) => {
            let s = resp.status().as_u16();
            (Some(s), format!("HTTP {s}"))
        }
        // Without the URL: reqwest's error names it.
        Err(e) => (None, e.without_url().to_string()),
    }
}
