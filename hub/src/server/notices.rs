//! The delivery task of outgoing notices: it takes the due notices of the store's outbox
//! (`store/notices.rs`; held for this hub while it sends them, so hubs on one store send
//! each once), sends each notice to every target that wants it (`crate::notify`:
//! the shape's request, one `POST` per target, those of one notice at once, each bounded
//! by `ATTEMPT_TIMEOUT`), and records the attempts' outcomes (`Delivery::attempted`: sent,
//! due again after a backoff, or given up) in the store before it counts them. It wakes
//! when a notice is queued (the store's `notice` topic, raised once the write is durable),
//! when a retry falls due, or at the hub's stop; a restart finds what was pending in the
//! outbox and goes on from there.
//!
//! At the hub's stop no new attempt starts; one under way is finished and recorded.
//! Delivery is at least once only where the process dies between a 2xx and its record
//! (SIGKILL, a power cut), or a hub is frozen past its hold: that notice is sent again
//! (after the hold, by any hub) with the same `X-Cortex-Notice` id, so a receiver can drop
//! the repeat. Logs name a target by its id
//! and `scheme://host/…`, never its whole URL.

use std::sync::Arc;
use std::time::Duration;

use crate::notify::{self, Target};
use crate::state::AppState;
use crate::store::notices::{DONE_KEPT_MS, NoticeRecord, Outcome, TOPIC_NOTICE};
use crate::time::now_ms;

/// Notices read per pass.
const PAGE: usize = 64;
/// How long a failing store is left before the next pass.
const STORE_RETRY: Duration = Duration::from_secs(1);
/// How often notices done a day ago are forgotten, and how many per write.
const PURGE_EVERY_MS: u64 = 3600 * 1000;
const PURGE_BATCH: usize = 1000;

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
        if state.shutdown.is_cancelled() {
            return;
        }
        let now = now_ms();
        if now.saturating_sub(last_purge) >= PURGE_EVERY_MS {
            last_purge = now;
            purge(&state, now.saturating_sub(DONE_KEPT_MS)).await;
        }
        let sleep = next.map(|at| Duration::from_millis(at.saturating_sub(now_ms())));
        tokio::select! {
            () = async { match sleep { Some(d) => tokio::time::sleep(d).await, None => std::future::pending().await } } => {}
            r = queued.changed() => if r.is_err() { return },
            () = state.shutdown.cancelled() => return,
        }
    }
}

/// Forgets the notices done before `before`, a batch per write.
async fn purge(state: &AppState, before: u64) {
    loop {
        match state
            .store
            .exec(move |t| t.purge_notices(before, PURGE_BATCH))
            .await
        {
            Ok(n) if n >= PURGE_BATCH => continue,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot forget the notices done a day ago");
                return;
            }
        }
    }
}

/// How long a pass holds the notices it took: every attempt of a notice runs at once,
/// each bounded by `ATTEMPT_TIMEOUT`, and its record follows; a hub that died sending
/// lets another take them once this passed.
const HOLD: Duration = Duration::from_secs(3 * notify::ATTEMPT_TIMEOUT.as_secs());

/// One pass: the due notices this hub took, their due attempts. Returns when the next one
/// is due (`None`: nothing pending), or `Err` when the store failed.
async fn pass(
    state: &AppState,
    client: &reqwest::Client,
    targets: &[Target],
) -> Result<Option<u64>, ()> {
    let me = state.claims.hub.clone();
    let hold = HOLD.as_millis() as u64;
    let taken = state
        .store
        .exec(move |t| t.take_notices(&me, now_ms(), hold, PAGE))
        .await
        .map_err(|e| tracing::error!(error = %e, "cannot read the notices' outbox"))?;
    let mut next = taken.next;
    for mut rec in taken.due {
        if state.shutdown.is_cancelled() {
            return Ok(None);
        }
        let counted = deliver(client, targets, &mut rec).await;
        let (seq, now) = (rec.seq, now_ms());
        let deliveries = rec.deliveries.clone().unwrap_or_default();
        if let Err(e) = state
            .store
            .exec(move |t| t.notice_progress(seq, deliveries, now))
            .await
        {
            tracing::error!(error = %e, notice = seq, "cannot record a notice's delivery; it is tried again");
            return Err(());
        }
        // Counted once the outcome is durable.
        for outcome in counted {
            crate::metrics::metrics().notice(rec.notice.event.as_str(), outcome.as_str());
        }
        if let Some(due) = rec.next_due() {
            next = Some(next.map_or(due, |n| n.min(due)));
        }
    }
    if taken.full {
        // More than a page pending: the next pass at once.
        return Ok(Some(now_ms()));
    }
    Ok(next)
}

/// This pass's attempts on `rec` (fanned out to the targets that want it on its first
/// pass): the due ones at once, each recorded in `rec`. Returns what each counts as.
async fn deliver(
    client: &reqwest::Client,
    targets: &[Target],
    rec: &mut NoticeRecord,
) -> Vec<Outcome> {
    let now = now_ms();
    rec.fan_out(targets, now);
    let id = rec.id();
    let event = rec.notice.event.as_str();
    let mut counted = Vec::new();
    let mut attempts = tokio::task::JoinSet::new();
    let Some(deliveries) = rec.deliveries.as_mut() else {
        return counted;
    };
    for (i, d) in deliveries.iter_mut().enumerate() {
        if !d.due(now) {
            continue;
        }
        let Some(target) = targets.iter().find(|t| t.id == d.target) else {
            tracing::warn!(notice = %id, target_id = %d.target, "a notice's target is no longer in settings.json notify; given up");
            counted.push(d.give_up(now, "the target left settings.json notify".into()));
            continue;
        };
        let req = target.request(&id, &rec.notice);
        let (client, target) = (client.clone(), target.clone());
        attempts.spawn(async move {
            let (status, why) = attempt(&client, &target, req).await;
            (i, target, status, why)
        });
    }
    while let Some(joined) = attempts.join_next().await {
        let Ok((i, target, status, why)) = joined else {
            continue;
        };
        let Some(d) = deliveries.get_mut(i) else {
            continue;
        };
        let outcome = d.attempted(notify::verdict(status), &why, now_ms(), notify::unit_draw());
        match outcome {
            Outcome::Sent => {
                tracing::info!(notice = %id, event, target_id = %target.id, attempts = d.attempts, "notice sent");
            }
            Outcome::Retry => {
                tracing::warn!(notice = %id, event, target_id = %target.id, url = %target.shown_url(), attempts = d.attempts, error = %why, retry_in_ms = d.next_at.saturating_sub(now_ms()), "a notice was not delivered; it is tried again");
            }
            Outcome::GaveUp => {
                tracing::error!(notice = %id, event, target_id = %target.id, url = %target.shown_url(), attempts = d.attempts, error = %why, "a notice was given up");
            }
        }
        counted.push(outcome);
    }
    counted
}

/// One `POST`: the status it was answered (`None`: no answer), and what to log of it.
async fn attempt(
    client: &reqwest::Client,
    target: &Target,
    req: notify::Request,
) -> (Option<u16>, String) {
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
