//! Sessions and their events: create, append, post, cancel a session's waitpoints, delete.

use cortex_protocol::api::{Event, EventBody, MessagePosted, SessionView, SpawnedFrom, When};

use crate::secret;
use crate::store::kernel::error::StoreError;
use crate::store::tables::{MESSAGE_KEYS, SESSION_WPS, SESSIONS, SessionRecord, Tx, encode};

use super::{CancelOutcome, seconds_of};

impl Tx<'_> {
    pub fn create_session(
        &mut self,
        title: Option<String>,
        now: u64,
    ) -> Result<SessionView, StoreError> {
        self.create_session_from(title, None, now)
    }

    /// [`Tx::create_session`], noting the monitor's wake that started it (`spawn`).
    pub(super) fn create_session_from(
        &mut self,
        title: Option<String>,
        spawned_from: Option<SpawnedFrom>,
        now: u64,
    ) -> Result<SessionView, StoreError> {
        let mut id = secret::new_id("ses");
        while self.table(&SESSIONS).get(id.as_str())?.is_some() {
            id = secret::new_id("ses");
        }
        let rec = SessionRecord {
            id: id.clone(),
            title,
            created_at: now,
            last_seq: 0,
            spawned_from,
        };
        self.table_mut(&SESSIONS)
            .insert(id.as_str(), encode(&rec)?.as_slice())?;
        Ok(SessionView {
            id,
            title: rec.title,
            created_at: now,
            last_seq: 0,
            armed_waitpoints: 0,
            spawned_from: rec.spawned_from,
            runs: false,
            state: Default::default(),
            config: None,
        })
    }

    /// Appends an event to a session's log; `None` if the session does not exist.
    pub fn append_event(
        &mut self,
        sid: &str,
        body: EventBody,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        let Some(mut rec) = self.get_session(sid)? else {
            return Ok(None);
        };
        let inbox_item = matches!(
            body,
            EventBody::Message { .. }
                | EventBody::Wake(_)
                | EventBody::Answer(_)
                | EventBody::Cancel { .. }
                | EventBody::Timer { .. }
                | EventBody::Compact { .. }
                | EventBody::Compaction(_)
        );
        rec.last_seq += 1;
        let ev = Event {
            seq: rec.last_seq,
            ts: now,
            body,
        };
        let json = serde_json::to_vec(&ev).map_err(|e| StoreError::Decode(e.to_string()))?;
        self.events().insert((sid, rec.last_seq), json.as_slice())?;
        // What asks a person or went wrong is told outside too, once: queued with the event.
        // An expiry is told unless it ends a monitor that heard its job (read from the
        // stored waitpoint: an expiry changes neither its kind nor its signals).
        let unanswered = |wp: &str| {
            self.get_wp(wp)
                .ok()
                .flatten()
                .is_none_or(|w| !w.is_monitor() || w.signal_count == 0)
        };
        if let Some(n) =
            crate::notify::from_event(sid, rec.title.as_deref(), &ev.body, unanswered, now)
        {
            self.queue_notice(&format!("event:{sid}:{}", rec.last_seq), n, now)?;
        }
        self.table_mut(&SESSIONS)
            .insert(sid, encode(&rec)?.as_slice())?;
        self.notify(crate::store::tables::TOPIC_SESSION, sid, rec.last_seq);
        if inbox_item {
            self.inbox_arrived(sid)?;
        }
        Ok(Some(rec.last_seq))
    }

    pub fn post_message(
        &mut self,
        sid: &str,
        text: String,
        when: When,
        dedupe_key: Option<String>,
        now: u64,
    ) -> Result<Option<MessagePosted>, StoreError> {
        let body = EventBody::Message {
            text,
            when,
            dedupe_key: dedupe_key.clone(),
        };
        self.post_inbox(sid, body, dedupe_key, now)
    }

    /// Posts an inbox item (a message, an answer, a cancel, a timer's firing) to `sid`;
    /// with `dedupe_key`, a key posted before returns that post's seq and does nothing.
    /// `None` if the session does not exist.
    pub fn post_inbox(
        &mut self,
        sid: &str,
        body: EventBody,
        dedupe_key: Option<String>,
        now: u64,
    ) -> Result<Option<MessagePosted>, StoreError> {
        if let Some(k) = &dedupe_key
            && let Some(seq) = self.msg_keys().get((sid, k.as_str()))?
        {
            return Ok(Some(MessagePosted {
                seq: seq.value(),
                duplicate: true,
                runs: false,
                mailbox: false,
            }));
        }
        let Some(seq) = self.append_event(sid, body, now)? else {
            return Ok(None);
        };
        if let Some(k) = &dedupe_key {
            self.msg_keys().insert((sid, k.as_str()), seq)?;
        }
        Ok(Some(MessagePosted {
            seq,
            duplicate: false,
            runs: false,
            mailbox: false,
        }))
    }

    /// Cancels every armed waitpoint of `sid` (a cancelled session); returns how many.
    pub fn cancel_session_waitpoints(
        &mut self,
        sid: &str,
        by: &str,
        now: u64,
    ) -> Result<usize, StoreError> {
        let ids = seconds_of(&self.table(&SESSION_WPS), sid)?;
        let mut n = 0;
        for id in ids {
            if self.cancel_waitpoint(&id, Some(sid), by, now)? == CancelOutcome::Cancelled {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Deletes a session and its log; its armed waitpoints are cancelled, so a late
    /// signal is answered "already resolved" and cannot bring the session back.
    pub fn delete_session(&mut self, sid: &str, now: u64) -> Result<bool, StoreError> {
        if self.get_session(sid)?.is_none() {
            return Ok(false);
        }
        let ids = seconds_of(&self.table(&SESSION_WPS), sid)?;
        for id in ids {
            if let Some(mut wp) = self.get_wp(&id)? {
                let before = (wp.deadline(self.settings()), wp.next_due());
                if wp.cancel(now) {
                    self.put_wp(&wp, Some(before))?;
                }
            }
        }
        let seqs: Vec<u64> = {
            let mut v = Vec::new();
            for r in self.events().range((sid, 0)..=(sid, u64::MAX))? {
                v.push(r?.0.value().1);
            }
            v
        };
        for s in seqs {
            self.events().remove((sid, s))?;
        }
        let keys = seconds_of(&self.table(&MESSAGE_KEYS), sid)?;
        for k in keys {
            self.msg_keys().remove((sid, k.as_str()))?;
        }
        self.delete_agent(sid)?;
        self.table_mut(&SESSIONS).remove(sid)?;
        self.notify(crate::store::tables::TOPIC_SESSION, sid, u64::MAX);
        self.notify(crate::store::tables::TOPIC_STOP, sid, u64::MAX);
        Ok(true)
    }
}
