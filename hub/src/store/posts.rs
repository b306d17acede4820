//! What people post to a session that a model runs: an answer to what it waits on, a
//! cancel, a compaction's ask; each lands in its inbox (the session's event log) under a
//! key, so a repeat returns the first post; and a cancelled session's end.

use cortex_protocol::api::{AnswerItem, Decision, EventBody, MessagePosted, PostAnswer};

use super::agent::AgentRecord;
use super::kernel::error::StoreError;
use super::tables::{EVENTS, MESSAGE_KEYS, Tx};

/// What became of an answer posted to a session.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerOutcome {
    Posted(MessagePosted),
    NoSession,
    /// Nothing of the session waits under that id (never asked, answered, withdrawn).
    NotPending,
    /// The answer does not fit what is asked; the text says why.
    Invalid(String),
    /// An earlier answer stands, and this one decides otherwise: the first answer wins.
    Conflict {
        /// The standing answer's decision (`None`: a question's data).
        decision: Option<Decision>,
        /// Who gave it: `person`, or `timeout`.
        by: String,
        /// Its event's seq.
        seq: u64,
    },
}

/// What became of a cancel (or a compaction's ask) posted to a session.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelPosted {
    Posted(MessagePosted),
    NoSession,
    /// The session was cancelled before.
    Ended,
    /// No model runs turns for the session (a mailbox): it has no transcript to compact.
    Mailbox,
}

impl Tx<'_> {
    /// `POST /api/sessions/{sid}/answers`: an answer for what `sid` waits on, posted to
    /// its inbox under the key `answer:REQUEST` (a repeat returns the first post).
    pub fn post_answer(
        &mut self,
        sid: &str,
        a: PostAnswer,
        now: u64,
    ) -> Result<AnswerOutcome, StoreError> {
        if self.get_session(sid)?.is_none() {
            return Ok(AnswerOutcome::NoSession);
        }
        let key = format!("answer:{}", a.request_id);
        if let Some(seq) = self.table(&MESSAGE_KEYS).get((sid, key.as_str()))? {
            let seq = seq.value();
            // The same answer again is a retry; a different one is told what stands.
            if let Some(first) = self.answer_at(sid, seq)?
                && (first.decision != a.decision || (a.data.is_some() && first.data != a.data))
            {
                return Ok(AnswerOutcome::Conflict {
                    decision: first.decision,
                    by: first.by,
                    seq,
                });
            }
            return Ok(AnswerOutcome::Posted(MessagePosted {
                seq,
                duplicate: true,
                runs: false,
                mailbox: false,
            }));
        }
        let Some(p) = self
            .agent(sid)?
            .and_then(|r| r.parked)
            .filter(|p| p.id == a.request_id)
        else {
            return Ok(AnswerOutcome::NotPending);
        };
        if p.kind == "approval" && a.decision.is_none() {
            return Ok(AnswerOutcome::Invalid(
                "an approval needs a decision: \"allow\" or \"deny\"".into(),
            ));
        }
        if p.kind == "question" && a.decision != Some(Decision::Deny) && a.data.is_none() {
            return Ok(AnswerOutcome::Invalid(
                "a question's answer goes in data (e.g. {\"answers\": [\"yes\"]}), or decide \"deny\" to decline".into(),
            ));
        }
        if let Some(args) = &a.args {
            if p.kind != "approval" || a.decision != Some(Decision::Allow) {
                return Ok(AnswerOutcome::Invalid(
                    "args (edited arguments) go only with an approval's \"allow\"".into(),
                ));
            }
            if !args.is_object() {
                return Ok(AnswerOutcome::Invalid(
                    "args must be a JSON object: the call's arguments as they should run".into(),
                ));
            }
        }
        let body = EventBody::Answer(Box::new(AnswerItem {
            request_id: a.request_id,
            decision: a.decision,
            always: a.always,
            args: a.args,
            data: a.data,
            by: "person".into(),
        }));
        Ok(match self.post_inbox(sid, body, Some(key), now)? {
            Some(p) => AnswerOutcome::Posted(p),
            None => AnswerOutcome::NoSession,
        })
    }

    /// The answer recorded as event `seq` of `sid`, if that event is one.
    fn answer_at(&self, sid: &str, seq: u64) -> Result<Option<AnswerItem>, StoreError> {
        let Some(raw) = self.table(&EVENTS).get((sid, seq))? else {
            return Ok(None);
        };
        let ev: cortex_protocol::api::Event = serde_json::from_slice(raw.value())
            .map_err(|e| StoreError::Decode(format!("event {sid}/{seq}: {e}")))?;
        Ok(match ev.body {
            EventBody::Answer(a) => Some(*a),
            _ => None,
        })
    }

    /// `POST /api/sessions/{sid}/cancel`: posted to its inbox, where the runner takes it
    /// (stopping the turn). A whole-session cancel also ends the session here and now:
    /// its waitpoints and timers are cancelled, and it takes no more messages.
    pub fn post_cancel(
        &mut self,
        sid: &str,
        turn_only: bool,
        now: u64,
    ) -> Result<CancelPosted, StoreError> {
        if self.get_session(sid)?.is_none() {
            return Ok(CancelPosted::NoSession);
        }
        let mut rec = self.agent(sid)?.unwrap_or_else(|| AgentRecord::new(None));
        if rec.cancelled {
            return Ok(CancelPosted::Ended);
        }
        if !turn_only {
            self.end_agent_session(sid, &mut rec, now)?;
            self.put_agent(sid, &rec)?;
        }
        Ok(
            match self.post_inbox(sid, EventBody::Cancel { turn_only }, None, now)? {
                Some(p) => {
                    // Heard by the driver on whichever hub, after the item is durable.
                    self.notify(super::tables::TOPIC_STOP, sid, p.seq);
                    CancelPosted::Posted(p)
                }
                None => CancelPosted::NoSession,
            },
        )
    }

    /// `POST /api/sessions/{sid}/compact`: asks for the session's transcript to be
    /// compacted at its next boundary (an inbox item; a `compaction` answers it).
    pub fn post_compact(&mut self, sid: &str, now: u64) -> Result<CancelPosted, StoreError> {
        if self.get_session(sid)?.is_none() {
            return Ok(CancelPosted::NoSession);
        }
        let rec = self.agent(sid)?;
        if rec.as_ref().is_some_and(|r| r.cancelled) {
            return Ok(CancelPosted::Ended);
        }
        if !self.session_runs(sid, rec.as_ref())? {
            return Ok(CancelPosted::Mailbox);
        }
        Ok(
            match self.post_inbox(sid, EventBody::Compact {}, None, now)? {
                Some(p) => CancelPosted::Posted(p),
                None => CancelPosted::NoSession,
            },
        )
    }

    /// The session ends: it runs no more turns, its waitpoints and timers are cancelled,
    /// its unread input dropped (the caller saves `rec`; a turn in progress is the
    /// runner's to stop).
    pub fn end_agent_session(
        &mut self,
        sid: &str,
        rec: &mut AgentRecord,
        now: u64,
    ) -> Result<(), StoreError> {
        rec.cancelled = true;
        rec.deferred.clear();
        rec.joining.clear();
        self.clear_timers(sid, rec)?;
        self.cancel_session_waitpoints(sid, "session-cancelled", now)?;
        Ok(())
    }

    /// Whether `sid` was cancelled (it takes no more messages).
    pub fn agent_cancelled(&self, sid: &str) -> Result<bool, StoreError> {
        Ok(self.agent(sid)?.is_some_and(|r| r.cancelled))
    }
}
