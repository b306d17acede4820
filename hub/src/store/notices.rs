//! The outbox of outgoing notices (`crate::notify`): a notice is queued in the same write
//! as the event it tells of (an `approval-required` event, a failed or expired wake, a
//! device's loss report), so it is durable exactly when the event is, once. The server's
//! task (`server/notices.rs`) is its only other writer: it takes the due notices (held
//! for its hub while it sends them, so hubs sharing the store send each once), fans a
//! notice out to the targets that want it, records each attempt, and marks the notice
//! done once every target answered 2xx or was given up. Done notices are kept a day (their key too, so
//! an event told twice, such as a device's loss seen by a second wait in the same
//! outage, is queued once), then purged.
//!
//! Only the events some target wants are queued: the running hub keeps that mask in
//! [`META`] at each start ([`Tx::set_notice_events`]).

use serde::{Deserialize, Serialize};

use super::kernel::Table;
use super::kernel::error::StoreError;
use super::tables::{META, NOTICE_KEYS, NOTICES, Tx, decode, encode};
use crate::notify::{self, Notice, Target, Verdict};

/// The notice topic: raised with the newest seq when a notice is queued.
pub const TOPIC_NOTICE: &str = "notice";

const SEQ_KEY: &str = "notice_seq";
const EVENTS_KEY: &str = "notice_events";

/// How long a done notice (and its key) is kept.
pub const DONE_KEPT_MS: u64 = 24 * 3600 * 1000;

/// A queued notice and where its deliveries stand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoticeRecord {
    pub seq: u64,
    pub key: String,
    pub notice: Notice,
    pub queued_at: u64,
    /// One per target that wants it, fixed on the first pass after it was queued
    /// (`None` until then).
    #[serde(default)]
    pub deliveries: Option<Vec<Delivery>>,
    /// When every delivery ended (sent or given up).
    #[serde(default)]
    pub done_at: Option<u64>,
    /// The hub sending it now, and until when no other hub may ([`Tx::take_notices`]):
    /// hubs on one store share the outbox, and each notice goes out from one of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken: Option<Taken>,
}

/// A hub's hold on a notice while it sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Taken {
    pub hub: String,
    pub until: u64,
}

/// What a pass of the delivery task may send, and when it should look again.
#[derive(Debug, Default)]
pub struct TakenNotices {
    /// Due now, and held by this hub until the hold given to [`Tx::take_notices`] ends.
    pub due: Vec<NoticeRecord>,
    /// When the next of the others falls due, or another hub's hold on one ends.
    pub next: Option<u64>,
    /// More than the page was pending.
    pub full: bool,
}

/// One target's delivery of a notice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// The target's id (`notify::Target::id`).
    pub target: String,
    pub attempts: u32,
    /// When the next attempt is due (while pending).
    pub next_at: u64,
    pub state: DeliveryState,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryState {
    Pending,
    /// Answered 2xx at `at`.
    Sent {
        at: u64,
    },
    /// Given up at `at`: refused, out of attempts, or the target left the settings.
    Failed {
        at: u64,
        why: String,
    },
}

/// What one attempt (or giving up) counts as (`cortex_notices_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Delivered (2xx).
    Sent,
    /// Not delivered; tried again at `next_at`.
    Retry,
    /// Given up: refused, out of attempts, or the target is gone.
    GaveUp,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Sent => "sent",
            Outcome::Retry => "retry",
            Outcome::GaveUp => "failed",
        }
    }
}

impl Delivery {
    /// A delivery to `target`, due at `now`.
    pub fn new(target: &str, now: u64) -> Delivery {
        Delivery {
            target: target.to_string(),
            attempts: 0,
            next_at: now,
            state: DeliveryState::Pending,
        }
    }

    /// Pending, and its next attempt is due at `now`.
    pub fn due(&self, now: u64) -> bool {
        self.state == DeliveryState::Pending && self.next_at <= now
    }

    /// Records an attempt answered at `at` with `verdict` (`why`: what the answer was, for
    /// a give-up's record): sent; or, while attempts remain, due again after
    /// `notify::retry_delay` (`unit` its jitter); else given up.
    pub fn attempted(&mut self, verdict: Verdict, why: &str, at: u64, unit: f64) -> Outcome {
        self.attempts = self.attempts.saturating_add(1);
        match verdict {
            Verdict::Sent => {
                self.state = DeliveryState::Sent { at };
                Outcome::Sent
            }
            Verdict::Retry if self.attempts < notify::MAX_ATTEMPTS => {
                let delay = notify::retry_delay(self.attempts, unit);
                self.next_at = at.saturating_add(delay.as_millis() as u64);
                Outcome::Retry
            }
            Verdict::Retry => {
                self.give_up(at, format!("{} attempts, the last: {why}", self.attempts))
            }
            Verdict::Refused => self.give_up(at, format!("refused: {why}")),
        }
    }

    /// Ends it unsent at `at`.
    pub fn give_up(&mut self, at: u64, why: String) -> Outcome {
        self.state = DeliveryState::Failed { at, why };
        Outcome::GaveUp
    }
}

impl NoticeRecord {
    /// The outbox id a receiver sees (`X-Cortex-Notice`, the webhook's `id`).
    pub fn id(&self) -> String {
        format!("n{}", self.seq)
    }

    /// On its first pass: one delivery per target that wants its event, due at `now`.
    /// Later passes keep the deliveries it has (a target added since is not told).
    pub fn fan_out(&mut self, targets: &[Target], now: u64) {
        if self.deliveries.is_none() {
            self.deliveries = Some(
                targets
                    .iter()
                    .filter(|t| t.wants(self.notice.event))
                    .map(|t| Delivery::new(&t.id, now))
                    .collect(),
            );
        }
    }

    /// Every delivery ended (sent or given up); also a notice no target wants.
    pub fn is_done(&self) -> bool {
        self.deliveries
            .as_ref()
            .is_some_and(|ds| ds.iter().all(|d| d.state != DeliveryState::Pending))
    }

    /// When its next attempt is due (`None`: none pending).
    pub fn next_due(&self) -> Option<u64> {
        match &self.deliveries {
            None => Some(self.queued_at),
            Some(ds) => ds
                .iter()
                .filter(|d| d.state == DeliveryState::Pending)
                .map(|d| d.next_at)
                .min(),
        }
    }
}

impl Tx<'_> {
    fn notices(&mut self) -> Table<'_, u64, &'static [u8]> {
        self.table_mut(&NOTICES)
    }

    /// At start: the events the running hub's targets want (`notify::wanted`); written
    /// only when it changed (a hub without targets writes nothing).
    pub fn set_notice_events(&mut self, mask: u64) -> Result<(), StoreError> {
        if self.table(&META).get(EVENTS_KEY)?.map_or(0, |v| v.value()) != mask {
            self.table_mut(&META).insert(EVENTS_KEY, mask)?;
        }
        Ok(())
    }

    /// Queues `notice` under `key` (the event's identity), unless no target wants its
    /// event or that key was queued already. Returns its seq when queued.
    pub(crate) fn queue_notice(
        &mut self,
        key: &str,
        notice: Notice,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        let mask = self.table(&META).get(EVENTS_KEY)?.map_or(0, |v| v.value());
        if mask & notice.event.bit() == 0 {
            return Ok(None);
        }
        if self.table(&NOTICE_KEYS).get(key)?.is_some() {
            return Ok(None);
        }
        let seq = self.table(&META).get(SEQ_KEY)?.map_or(0, |v| v.value()) + 1;
        self.table_mut(&META).insert(SEQ_KEY, seq)?;
        self.table_mut(&NOTICE_KEYS).insert(key, seq)?;
        let rec = NoticeRecord {
            seq,
            key: key.to_string(),
            notice,
            queued_at: now,
            deliveries: None,
            done_at: None,
            taken: None,
        };
        self.notices().insert(seq, encode(&rec)?.as_slice())?;
        self.notify(TOPIC_NOTICE, "", seq);
        Ok(Some(seq))
    }

    /// The notices not done yet, oldest first, at most `limit`.
    pub fn notices_pending(&self, limit: usize) -> Result<Vec<NoticeRecord>, StoreError> {
        let mut out = Vec::new();
        for r in self.table(&NOTICES).iter()? {
            let rec: NoticeRecord = decode(r?.1.value())?;
            if rec.done_at.is_none() {
                out.push(rec);
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// For `hub`'s delivery task at `now`: the pending notices due now that no other hub
    /// holds (at most `limit` looked at), each held for `hub` until `now + hold_ms` in this
    /// write, so two hubs on one store never send one notice at once. A hold ends with
    /// the pass's [`Tx::notice_progress`], or by itself when its hub died sending.
    pub fn take_notices(
        &mut self,
        hub: &str,
        now: u64,
        hold_ms: u64,
        limit: usize,
    ) -> Result<TakenNotices, StoreError> {
        let pending = self.notices_pending(limit)?;
        let mut out = TakenNotices {
            full: pending.len() >= limit,
            ..TakenNotices::default()
        };
        let mut soonest = |at: u64| out.next = Some(out.next.map_or(at, |n: u64| n.min(at)));
        let mut due = Vec::new();
        for mut rec in pending {
            if let Some(t) = &rec.taken
                && t.hub != hub
                && t.until > now
            {
                soonest(t.until);
                continue;
            }
            match rec.next_due() {
                Some(at) if at <= now => {
                    rec.taken = Some(Taken {
                        hub: hub.to_string(),
                        until: now.saturating_add(hold_ms),
                    });
                    self.notices().insert(rec.seq, encode(&rec)?.as_slice())?;
                    due.push(rec);
                }
                Some(at) => soonest(at),
                None => {}
            }
        }
        out.due = due;
        Ok(out)
    }

    /// Every notice the outbox holds, done ones included (oldest first).
    pub fn notices_all(&self) -> Result<Vec<NoticeRecord>, StoreError> {
        let mut out = Vec::new();
        for r in self.table(&NOTICES).iter()? {
            out.push(decode(r?.1.value())?);
        }
        Ok(out)
    }

    /// The delivery task's record of a pass over notice `seq`: its deliveries as they
    /// stand, and done (at `now`) when none is pending; the pass's hold on it ends. False
    /// when it is gone.
    pub fn notice_progress(
        &mut self,
        seq: u64,
        deliveries: Vec<Delivery>,
        now: u64,
    ) -> Result<bool, StoreError> {
        let Some(mut rec) = self
            .table(&NOTICES)
            .get(seq)?
            .map(|v| decode::<NoticeRecord>(v.value()))
            .transpose()?
        else {
            return Ok(false);
        };
        rec.deliveries = Some(deliveries);
        rec.done_at = rec.is_done().then_some(now);
        rec.taken = None;
        self.notices().insert(seq, encode(&rec)?.as_slice())?;
        Ok(true)
    }

    /// Forgets notices done before `before`, and their keys; at most `limit`. Returns
    /// how many.
    pub fn purge_notices(&mut self, before: u64, limit: usize) -> Result<usize, StoreError> {
        let mut gone = Vec::new();
        for r in self.table(&NOTICES).iter()? {
            let rec: NoticeRecord = decode(r?.1.value())?;
            if rec.done_at.is_some_and(|d| d < before) {
                gone.push((rec.seq, rec.key));
                if gone.len() >= limit {
                    break;
                }
            }
        }
        for (seq, key) in &gone {
            self.notices().remove(*seq)?;
            self.table_mut(&NOTICE_KEYS).remove(key.as_str())?;
        }
        Ok(gone.len())
    }
}

#[cfg(test)]
mod tests;
