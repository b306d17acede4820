//! The hub's operations on the store: each runs inside one group commit ([`Tx`]) or one
//! read snapshot ([`ReadTx`]). The rules come from the engine; this module only loads,
//! applies effects and saves, keeping the indexes true.

use cortex_protocol::api::{
    Badges, Event, EventBody, MessagePosted, SessionView, SignalView, SpawnedFrom, WaitpointRef,
    WaitpointView, Wake, WakeView, When,
};
use serde::{Deserialize, Serialize};

use super::agent::{AgentConfig, AgentRecord};
use super::kernel::error::StoreError;
use super::tables::{
    DEADLINES, EVENTS, MESSAGE_KEYS, SESSION_WPS, SESSIONS, SIGNAL_KEYS, SPAWN_SETUP, STATE,
    SessionRecord, TIMER_WAKE, Tx, WAITPOINTS, decode, encode,
};
use crate::engine::{CreateError, CreateParams, Effect, SignalMeta, State, Waitpoint, WakePlan};
use crate::model::ChatMessage;
use crate::secret;
use crate::text;

/// How many due waitpoints one timer or sweep pass takes.
pub const PASS_LIMIT: usize = 512;
/// How many signals a waitpoint view lists.
pub const VIEW_SIGNALS: usize = 1_000;

/// A signal and what recording it did: the intake's types (it builds the one for every
/// way in and maps the other back).
pub use crate::intake::{SignalIn, SignalOutcome};

#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    Created(Box<Waitpoint>),
    NoSession,
    /// `device` names no device the hub knows (a typo, or one revoked).
    NoDevice(String),
    Invalid(CreateError),
}

/// A `spawn` monitor's sessions, decided when it is armed (by the caller, which knows the
/// hub's defaults and the model server): the configuration each new session is fixed
/// with and its prefix. Kept beside the waitpoint's state, read only when a wake spawns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpawnSetup {
    pub config: AgentConfig,
    pub prefix: Vec<ChatMessage>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    Cancelled,
    AlreadyEnded(State),
    NotFound,
}

impl Tx<'_> {
    // ------------------------------------------------------------ sessions and events

    pub fn create_session(
        &mut self,
        title: Option<String>,
        now: u64,
    ) -> Result<SessionView, StoreError> {
        self.create_session_from(title, None, now)
    }

    /// [`Tx::create_session`], noting the monitor's wake that started it (`spawn`).
    fn create_session_from(
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
        self.notify(super::tables::TOPIC_SESSION, sid, rec.last_seq);
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
        self.notify(super::tables::TOPIC_SESSION, sid, u64::MAX);
        Ok(true)
    }

    // ------------------------------------------------------------ waitpoints

    pub fn create_waitpoint(
        &mut self,
        sid: &str,
        params: CreateParams,
        secret_hash: [u8; 32],
        now: u64,
    ) -> Result<CreateOutcome, StoreError> {
        self.create_inner(sid, None, params, secret_hash, None, now)
    }

    /// [`Tx::create_waitpoint`] for a body that may ask for `spawn`: `setup` is its
    /// sessions' configuration, which the caller prepared (required with `spawn`).
    pub fn create_waitpoint_spawning(
        &mut self,
        sid: &str,
        params: CreateParams,
        secret_hash: [u8; 32],
        setup: Option<SpawnSetup>,
        now: u64,
    ) -> Result<CreateOutcome, StoreError> {
        self.create_inner(sid, None, params, secret_hash, setup, now)
    }

    /// [`Tx::create_waitpoint`] under a chosen id (one a job was already told); an id in
    /// use is refused as invalid.
    pub fn create_waitpoint_as(
        &mut self,
        sid: &str,
        chosen: Option<String>,
        params: CreateParams,
        secret_hash: [u8; 32],
        now: u64,
    ) -> Result<CreateOutcome, StoreError> {
        self.create_inner(sid, chosen, params, secret_hash, None, now)
    }

    fn create_inner(
        &mut self,
        sid: &str,
        chosen: Option<String>,
        params: CreateParams,
        secret_hash: [u8; 32],
        setup: Option<SpawnSetup>,
        now: u64,
    ) -> Result<CreateOutcome, StoreError> {
        if params.spawn.is_some() && setup.is_none() {
            return Ok(CreateOutcome::Invalid(CreateError::SpawnUnprepared));
        }
        if self.get_session(sid)?.is_none() {
            return Ok(CreateOutcome::NoSession);
        }
        if let Some(d) = &params.device
            && self.get_device(d)?.is_none()
        {
            return Ok(CreateOutcome::NoDevice(d.clone()));
        }
        let id = match chosen {
            Some(id) => {
                if self.wps().get((id.as_str(), STATE))?.is_some() {
                    return Ok(CreateOutcome::Invalid(CreateError::Taken(id)));
                }
                id
            }
            None => {
                let mut id = secret::new_id("wp");
                while self.wps().get((id.as_str(), STATE))?.is_some() {
                    id = secret::new_id("wp");
                }
                id
            }
        };
        let wp = match Waitpoint::create(
            id,
            sid.to_string(),
            secret_hash,
            params,
            self.settings(),
            now,
        ) {
            Ok(wp) => wp,
            Err(e) => return Ok(CreateOutcome::Invalid(e)),
        };
        self.put_wp(&wp, None)?;
        if let (Some(setup), Some(_)) = (setup, &wp.spawn) {
            self.wps()
                .insert((wp.id.as_str(), SPAWN_SETUP), encode(&setup)?.as_slice())?;
        }
        self.session_wps().insert((sid, wp.id.as_str()), ())?;
        self.append_event(
            sid,
            EventBody::WaitpointArmed {
                waitpoint: wp_ref(&wp),
            },
            now,
        )?;
        Ok(CreateOutcome::Created(Box::new(wp)))
    }

    /// wait_cancel. With `scope`, only a waitpoint of that session is seen.
    pub fn cancel_waitpoint(
        &mut self,
        id: &str,
        scope: Option<&str>,
        by: &str,
        now: u64,
    ) -> Result<CancelOutcome, StoreError> {
        let Some(mut wp) = self.get_wp(id)? else {
            return Ok(CancelOutcome::NotFound);
        };
        if scope.is_some_and(|s| s != wp.session) {
            return Ok(CancelOutcome::NotFound);
        }
        let before = (wp.deadline(self.settings()), wp.next_due());
        if !wp.cancel(now) {
            return Ok(CancelOutcome::AlreadyEnded(wp.state));
        }
        self.put_wp(&wp, Some(before))?;
        let session = wp.session.clone();
        self.append_event(
            &session,
            EventBody::WaitpointCancelled {
                waitpoint: wp_ref(&wp),
                by: by.to_string(),
            },
            now,
        )?;
        Ok(CancelOutcome::Cancelled)
    }

    /// A signal from any route: checked, de-duplicated, recorded, and any wake it
    /// completes delivered into the session's log, all in this transaction.
    pub fn signal(&mut self, s: &SignalIn, now: u64) -> Result<SignalOutcome, StoreError> {
        let Some(wp) = self.get_wp(&s.req.id)? else {
            let mark = self.durable_mark();
            return Ok(self.signal_answered(s, None, SignalOutcome::Unknown, mark));
        };
        if !secret::matches(&s.req.secret, &wp.secret_hash) {
            let session = wp.session.clone();
            let mark = self.durable_mark();
            return Ok(self.signal_answered(s, Some(session), SignalOutcome::WrongSecret, mark));
        }
        let session = wp.session.clone();
        let mark = self.durable_mark();
        let out = self.record_signal(wp, s, now)?;
        Ok(self.signal_answered(s, Some(session), out, mark))
    }

    /// A signal the hub itself vouches for (a device wait's outcome, from the link of the
    /// device it is bound to): the rules as for any signal, without the secret.
    pub fn signal_trusted(&mut self, s: &SignalIn, now: u64) -> Result<SignalOutcome, StoreError> {
        let Some(wp) = self.get_wp(&s.req.id)? else {
            let mark = self.durable_mark();
            return Ok(self.signal_answered(s, None, SignalOutcome::Unknown, mark));
        };
        let session = wp.session.clone();
        let mark = self.durable_mark();
        let out = self.record_signal(wp, s, now)?;
        Ok(self.signal_answered(s, Some(session), out, mark))
    }

    /// A signal's lifecycle line and count, once its answer is durable: `info` for one
    /// taken (accepted, duplicate), `debug` for a refusal (the way in warns about the
    /// ones its sender must fix, within its budget). Before the lines of what it caused
    /// (deferred since `mark`: its wake, its waitpoint ended).
    fn signal_answered(
        &mut self,
        s: &SignalIn,
        session: Option<String>,
        out: SignalOutcome,
        mark: usize,
    ) -> SignalOutcome {
        let (id, source, result) = (s.req.id.clone(), s.source.clone(), out.as_str());
        let state = match &out {
            SignalOutcome::Accepted { state } | SignalOutcome::Duplicate { state } => {
                state.as_str()
            }
            _ => "-",
        };
        self.on_durable_at(mark, move || {
            crate::metrics::metrics().signal(&source, result);
            let session = session.as_deref().unwrap_or("-");
            if matches!(result, "accepted" | "duplicate") {
                tracing::info!(waitpoint = %id, session = %session, source = %source, result = %result, state = %state, "signal answered");
            } else {
                tracing::debug!(waitpoint = %id, session = %session, source = %source, result = %result, "signal answered");
            }
        });
        out
    }

    /// A waitpoint's state changed from `from` (`None`: it was just created): counted, and
    /// its lifecycle line (armed, or ended: resolved, expired, cancelled), once durable.
    pub(crate) fn state_moved(&mut self, wp: &Waitpoint, from: Option<State>) {
        let to = wp.state;
        if from == Some(to) {
            return;
        }
        let (id, session, device) = (wp.id.clone(), wp.session.clone(), wp.device.clone());
        self.on_durable(move || {
            crate::metrics::metrics().waitpoint_moved(from.map(State::as_str), Some(to.as_str()));
            match (from, device) {
                (None, Some(device)) => {
                    tracing::info!(waitpoint = %id, session = %session, device = %device, "waitpoint armed");
                }
                (None, None) => {
                    tracing::info!(waitpoint = %id, session = %session, "waitpoint armed");
                }
                (Some(_), _) => {
                    tracing::info!(waitpoint = %id, session = %session, state = %to.as_str(), "waitpoint ended");
                }
            }
        });
    }

    fn record_signal(
        &mut self,
        mut wp: Waitpoint,
        s: &SignalIn,
        now: u64,
    ) -> Result<SignalOutcome, StoreError> {
        let id = s.req.id.as_str();
        if let Some(k) = &s.dedupe
            && self.keys().get((id, k.as_str()))?.is_some()
        {
            return Ok(SignalOutcome::Duplicate { state: wp.state });
        }
        let before = (wp.deadline(self.settings()), wp.next_due());
        let settings = self.settings().clone();
        let mut effects = wp.tick(&settings, now);
        let meta = SignalMeta {
            status: s.req.status(),
            member: s.req.member.as_deref(),
        };
        match wp.signal(meta, &settings, now) {
            Err(refusal) => {
                if !effects.is_empty() {
                    self.apply(&mut wp, &effects, now)?;
                    self.save_or_purge(&wp, before, &effects)?;
                }
                Ok(SignalOutcome::Refused(refusal))
            }
            Ok(more) => {
                let seq = wp.signal_count - 1;
                let view = SignalView {
                    status: s.req.status(),
                    message: s.req.message.clone(),
                    member: s.req.member.clone(),
                    data: s.req.data.clone(),
                    source: s.source.clone(),
                    key: s.dedupe.clone(),
                    at: now,
                };
                self.wps().insert((id, seq), encode(&view)?.as_slice())?;
                if let Some(k) = &s.dedupe {
                    self.keys().insert((id, k.as_str()), seq)?;
                }
                effects.extend(more);
                self.apply(&mut wp, &effects, now)?;
                self.save_or_purge(&wp, before, &effects)?;
                Ok(SignalOutcome::Accepted { state: wp.state })
            }
        }
    }

    /// Delivers every decided wake that is due. Returns how many waitpoints it looked at.
    pub fn fire_timers(&mut self, now: u64) -> Result<usize, StoreError> {
        let due = self.due_timers(now, Some(TIMER_WAKE), PASS_LIMIT)?;
        for d in &due {
            self.wake_due(&d.id, d.at, now)?;
        }
        Ok(due.len())
    }

    /// A decided wake's timer fell due: the waitpoint's rules run at `now` (its timer
    /// moves or goes with it); a timer whose waitpoint is gone is dropped.
    pub(crate) fn wake_due(&mut self, id: &str, at: u64, now: u64) -> Result<(), StoreError> {
        if self.get_wp(id)?.is_none() {
            return self.reschedule(TIMER_WAKE, id, Some(at), None);
        }
        // The entry that fell due is the one the rules move (or keep).
        self.tick_one(id, now, Some(Some(at)))
    }

    /// The sweep: expires waitpoints past their deadline and forgets ended ones past
    /// their retention. Reads the deadline index only up to `now`.
    pub fn sweep(&mut self, now: u64) -> Result<usize, StoreError> {
        let due: Vec<String> = {
            let mut v = Vec::new();
            for r in self.deadlines().range(..(now.saturating_add(1), ""))? {
                v.push(r?.0.value().1.to_string());
                if v.len() >= PASS_LIMIT {
                    break;
                }
            }
            v
        };
        for id in &due {
            self.tick_one(id, now, None)?;
        }
        Ok(due.len())
    }

    /// Runs the rules of one waitpoint at `now`. `timer` is where its timer entry stands
    /// when the caller knows better than the stored state (the entry that fell due).
    fn tick_one(
        &mut self,
        id: &str,
        now: u64,
        timer: Option<Option<u64>>,
    ) -> Result<(), StoreError> {
        let Some(mut wp) = self.get_wp(id)? else {
            return Ok(());
        };
        let before = (wp.deadline(self.settings()), timer.unwrap_or(wp.next_due()));
        let settings = self.settings().clone();
        let effects = wp.tick(&settings, now);
        self.apply(&mut wp, &effects, now)?;
        self.save_or_purge(&wp, before, &effects)
    }

    fn save_or_purge(
        &mut self,
        wp: &Waitpoint,
        before: (u64, Option<u64>),
        effects: &[Effect],
    ) -> Result<(), StoreError> {
        if effects.iter().any(|e| matches!(e, Effect::Purge)) {
            self.purge(wp, before)
        } else {
            self.put_wp(wp, Some(before))
        }
    }

    fn apply(
        &mut self,
        wp: &mut Waitpoint,
        effects: &[Effect],
        now: u64,
    ) -> Result<(), StoreError> {
        for e in effects {
            if let Effect::Wake(plan) = e {
                self.deliver(wp, plan, now)?;
            }
        }
        Ok(())
    }

    fn deliver(&mut self, wp: &mut Waitpoint, plan: &WakePlan, now: u64) -> Result<(), StoreError> {
        let (listed, omitted, text) = match &plan.silence {
            Some(silence) => {
                let last = match silence.last {
                    Some((seq, _)) => match self.wps().get((wp.id.as_str(), seq))? {
                        Some(v) => Some(decode::<SignalView>(v.value())?),
                        None => None,
                    },
                    None => None,
                };
                let text = text::silent_text(wp, silence, last.as_ref(), now);
                (Vec::new(), 0, text)
            }
            None => {
                let mut carried: Vec<SignalView> = Vec::new();
                for r in self
                    .wps()
                    .range((wp.id.as_str(), plan.from_seq)..(wp.id.as_str(), plan.to_seq))?
                {
                    carried.push(decode(r?.1.value())?);
                    if carried.len() >= 8 * text::MAX_LISTED {
                        // Keep memory bounded for a monitor that folded a flood of heartbeats.
                        let (kept, _) = text::select_listed(std::mem::take(&mut carried));
                        carried = kept;
                    }
                }
                let (listed, _) = text::select_listed(carried);
                let omitted = (plan.to_seq - plan.from_seq).saturating_sub(listed.len() as u64);
                let text = text::wake_text(wp, plan, &listed, omitted);
                (listed, omitted, text)
            }
        };
        let wake = Wake {
            waitpoint: wp_ref(wp),
            reason: plan.reason,
            waited_ms: plan.waited_ms,
            signals: listed,
            omitted,
            text,
        };
        if plan.spawn {
            return self.spawn(wp, plan, wake, now);
        }
        let session = wp.session.clone();
        if let Some(seq) = self.append_event(&session, EventBody::Wake(Box::new(wake)), now)? {
            wp.delivered(plan.index, seq, None);
            self.wake_delivered(wp, &session, plan, seq);
        }
        Ok(())
    }

    /// A wake's lifecycle line and count, once durable.
    fn wake_delivered(&mut self, wp: &Waitpoint, session: &str, plan: &WakePlan, seq: u64) {
        let (id, session, reason) = (wp.id.clone(), session.to_string(), plan.reason.as_str());
        self.on_durable(move || {
            crate::metrics::metrics().wake(reason);
            tracing::info!(waitpoint = %id, session = %session, reason = %reason, seq, "wake delivered");
        });
    }

    /// A `spawn` monitor's wake: a new session, fixed with the monitor's setup, whose
    /// first inbox item is the wake (so the runner runs one turn on it). In the write that
    /// decided the wake: a crash leaves both or neither.
    fn spawn(
        &mut self,
        wp: &mut Waitpoint,
        plan: &WakePlan,
        wake: Wake,
        now: u64,
    ) -> Result<(), StoreError> {
        let setup: SpawnSetup = match self.wps().get((wp.id.as_str(), SPAWN_SETUP))? {
            Some(v) => decode(v.value())?,
            None => {
                return Err(StoreError::Decode(format!(
                    "waitpoint {} spawns sessions but its setup is missing",
                    wp.id
                )));
            }
        };
        // The caps: past the spawn depth or the root's hour, the wake is recorded in the
        // monitor's session as refused (its signals stay on the waitpoint).
        let (gate, holder) = self.spawn_gate(&wp.session, now)?;
        if let Some(limit) = gate.limit() {
            let message = crate::caps::spawn_refused(gate, self.limits(), false);
            let session = wp.session.clone();
            let body = EventBody::LimitReached {
                limit: limit.into(),
                message,
                until: None,
                waitpoint: Some(wp_ref(wp)),
            };
            if let Some(seq) = self.append_event(&session, body, now)? {
                wp.delivered(plan.index, seq, None);
                let id = wp.id.clone();
                self.on_durable(move || {
                    tracing::info!(waitpoint = %id, session = %session, limit, seq, "a spawn was refused by a limit");
                });
            }
            return Ok(());
        }
        self.count_spawn(&holder, now)?;
        let number = plan.index as u32 + 1;
        let title = match wp.spawn.as_ref().and_then(|s| s.title.clone()) {
            Some(t) => format!("{t} #{number}"),
            None => format!("{} #{number}", wp.label),
        };
        let from = SpawnedFrom {
            waitpoint: wp.id.clone(),
            session: wp.session.clone(),
            wake: number,
        };
        let view = self.create_session_from(Some(title), Some(from), now)?;
        let mut rec = AgentRecord::new(None);
        self.fix_agent(&view.id, &mut rec, setup.config, &setup.prefix)?;
        self.put_agent(&view.id, &rec)?;
        if let Some(seq) = self.append_event(&view.id, EventBody::Wake(Box::new(wake)), now)? {
            self.wake_delivered(wp, &view.id, plan, seq);
            wp.delivered(plan.index, seq, Some(view.id));
        }
        Ok(())
    }

    fn purge(&mut self, wp: &Waitpoint, before: (u64, Option<u64>)) -> Result<(), StoreError> {
        let id = wp.id.as_str();
        self.deadlines().remove((before.0, id))?;
        self.reschedule(TIMER_WAKE, id, before.1, None)?;
        for seq in 0..wp.signal_count {
            self.wps().remove((id, seq))?;
        }
        self.wps().remove((id, SPAWN_SETUP))?;
        let keys = seconds_of(&self.table(&SIGNAL_KEYS), id)?;
        for k in keys {
            self.keys().remove((id, k.as_str()))?;
        }
        self.session_wps().remove((wp.session.as_str(), id))?;
        self.forget_consumers(id)?;
        let held = self.wps().remove((id, STATE))?;
        if let Some(from) = held.and_then(|h| super::tables::state_of(h.value())) {
            self.on_durable(move || {
                crate::metrics::metrics().waitpoint_moved(Some(from.as_str()), None);
            });
        }
        Ok(())
    }
}

/// The second halves of the keys `(first, _)` of a table keyed by string pairs: a session's
/// waitpoints, a waitpoint's signal keys, a session's message keys.
pub(super) fn seconds_of<V: redb::Value + 'static>(
    t: &super::kernel::TableRef<'_, (&'static str, &'static str), V>,
    first: &str,
) -> Result<Vec<String>, StoreError> {
    let mut v = Vec::new();
    for r in t.range((first, "")..)? {
        let (k, _) = r?;
        let (f, second) = k.value();
        if f != first {
            break;
        }
        v.push(second.to_string());
    }
    Ok(v)
}

fn wp_ref(wp: &Waitpoint) -> WaitpointRef {
    WaitpointRef {
        id: wp.id.clone(),
        label: wp.label.clone(),
        intent: wp.intent.clone(),
    }
}

impl Tx<'_> {
    /// The session `sid`, its state as on a hub that runs a model.
    pub fn session(&self, sid: &str) -> Result<Option<SessionView>, StoreError> {
        self.session_seen(sid, true)
    }

    /// The session `sid`, its state as on a hub that runs a model (`model`) or not.
    pub fn session_seen(&self, sid: &str, model: bool) -> Result<Option<SessionView>, StoreError> {
        let t = self.table(&SESSIONS);
        let Some(v) = t.get(sid)? else {
            return Ok(None);
        };
        let rec: SessionRecord = decode(v.value())?;
        Ok(Some(self.session_view(rec, model)?))
    }

    fn session_view(&self, rec: SessionRecord, model: bool) -> Result<SessionView, StoreError> {
        let mut armed = 0;
        for wp in self.session_waitpoints_raw(&rec.id)? {
            if wp.state == State::Armed {
                armed += 1;
            }
        }
        let agent = self.agent(&rec.id)?;
        let runs = self.session_runs(&rec.id, agent.as_ref())?;
        let facts = crate::session_state::Facts {
            cancelled: agent.as_ref().is_some_and(|a| a.cancelled),
            asks_a_person: agent.as_ref().is_some_and(|a| a.parked.is_some()),
            turn_queued: agent
                .as_ref()
                .is_some_and(|a| a.status != super::agent::RunStatus::Idle),
            model_runs: model && runs,
            last_run_failed: agent
                .as_ref()
                .and_then(|a| a.last_run.as_ref())
                .is_some_and(|r| !r.result.ok),
            armed_waitpoints: armed,
        };
        Ok(SessionView {
            id: rec.id,
            title: rec.title,
            created_at: rec.created_at,
            last_seq: rec.last_seq,
            armed_waitpoints: armed,
            spawned_from: rec.spawned_from,
            runs,
            state: crate::session_state::state(facts),
            config: None,
        })
    }

    /// Every session, oldest first, their state as on a hub that runs a model.
    pub fn sessions(&self) -> Result<Vec<SessionView>, StoreError> {
        self.sessions_seen(true)
    }

    /// Every session, oldest first, their state as on a hub that runs a model (`model`)
    /// or not.
    pub fn sessions_seen(&self, model: bool) -> Result<Vec<SessionView>, StoreError> {
        let t = self.table(&SESSIONS);
        let mut out = Vec::new();
        for r in t.iter()? {
            let rec: SessionRecord = decode(r?.1.value())?;
            out.push(self.session_view(rec, model)?);
        }
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// Every armed waitpoint of every session, oldest first.
    pub fn armed_waitpoints(
        &self,
        now: u64,
        settings: &crate::engine::Settings,
    ) -> Result<Vec<WaitpointView>, StoreError> {
        let mut sids = Vec::new();
        for r in self.table(&SESSIONS).iter()? {
            sids.push(r?.0.value().to_string());
        }
        let mut out = Vec::new();
        for sid in sids {
            for wp in self.session_waitpoints_raw(&sid)? {
                if wp.state == State::Armed {
                    out.push(self.view(&wp, now, settings)?);
                }
            }
        }
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// Raw JSON of the events after `after`, at most `limit`; `None` if no such session.
    pub fn events_after(
        &self,
        sid: &str,
        after: u64,
        limit: usize,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        if self.table(&SESSIONS).get(sid)?.is_none() {
            return Ok(None);
        }
        let t = self.table(&EVENTS);
        let mut out = Vec::new();
        for r in t.range((sid, after.saturating_add(1))..=(sid, u64::MAX))? {
            out.push(r?.1.value().to_vec());
            if out.len() >= limit {
                break;
            }
        }
        Ok(Some(out))
    }

    fn session_waitpoints_raw(&self, sid: &str) -> Result<Vec<Waitpoint>, StoreError> {
        let idx = self.table(&SESSION_WPS);
        let wps = self.table(&WAITPOINTS);
        let mut out = Vec::new();
        for id in seconds_of(&idx, sid)? {
            if let Some(v) = wps.get((id.as_str(), STATE))? {
                out.push(decode::<Waitpoint>(v.value())?);
            }
        }
        Ok(out)
    }

    /// wait_check: the session's waitpoints, or `None` if the session does not exist.
    pub fn session_waitpoints(
        &self,
        sid: &str,
        now: u64,
        settings: &crate::engine::Settings,
    ) -> Result<Option<Vec<WaitpointView>>, StoreError> {
        if self.table(&SESSIONS).get(sid)?.is_none() {
            return Ok(None);
        }
        let mut out = Vec::new();
        for wp in self.session_waitpoints_raw(sid)? {
            out.push(self.view(&wp, now, settings)?);
        }
        out.sort_by_key(|a| a.created_at);
        Ok(Some(out))
    }

    pub fn waitpoint(
        &self,
        id: &str,
        now: u64,
        settings: &crate::engine::Settings,
    ) -> Result<Option<WaitpointView>, StoreError> {
        let t = self.table(&WAITPOINTS);
        let Some(v) = t.get((id, STATE))? else {
            return Ok(None);
        };
        let wp: Waitpoint = decode(v.value())?;
        Ok(Some(self.view(&wp, now, settings)?))
    }

    /// The raw engine state, for callers that act on it.
    pub fn waitpoint_state(&self, id: &str) -> Result<Option<Waitpoint>, StoreError> {
        let t = self.table(&WAITPOINTS);
        match t.get((id, STATE))? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    fn view(
        &self,
        wp: &Waitpoint,
        now: u64,
        settings: &crate::engine::Settings,
    ) -> Result<WaitpointView, StoreError> {
        let t = self.table(&WAITPOINTS);
        let from = wp.signal_count.saturating_sub(VIEW_SIGNALS as u64);
        let mut signals = Vec::new();
        for r in t.range((wp.id.as_str(), from)..(wp.id.as_str(), wp.signal_count))? {
            signals.push(decode::<SignalView>(r?.1.value())?);
        }
        let mut wakes: Vec<WakeView> = wp
            .wakes
            .iter()
            .map(|w| WakeView {
                reason: w.reason,
                at: w.at,
                delivered: true,
                spawned: w.spawned.clone(),
            })
            .collect();
        let pending = wp.wake_pending();
        if let Some(p) = pending {
            let reason = if wp.round.failed {
                cortex_protocol::api::WakeReason::Failed
            } else if wp.is_monitor() {
                cortex_protocol::api::WakeReason::Report
            } else {
                cortex_protocol::api::WakeReason::Fired
            };
            wakes.push(WakeView {
                reason,
                at: p.due_at,
                delivered: false,
                spawned: None,
            });
        }
        let mut facts = wp.progress_facts();
        // A state written before fails were counted: the listed signals say at least this.
        let listed_fails = signals
            .iter()
            .filter(|s| s.status == cortex_protocol::SignalStatus::Fail)
            .count() as u64;
        facts.failed = facts.failed.max(listed_fails);
        Ok(WaitpointView {
            id: wp.id.clone(),
            session: wp.session.clone(),
            label: wp.label.clone(),
            intent: wp.intent.clone(),
            state: wp.state.as_str().to_string(),
            created_at: wp.created_at,
            expires_at: wp.expires_at,
            resolved_at: wp.ended_at,
            members: wp.members.clone(),
            quorum: wp.quorum,
            fail_fast: wp.fail_fast,
            max_signals: wp.max_signals,
            device: wp.device.clone(),
            silence_after_ms: wp.silence_after_ms,
            silence_due_at: wp.silence_due_at(),
            coalesce_ms: wp.coalesce_ms,
            spawn: wp.spawn.is_some(),
            signal_count: wp.signal_count,
            signals,
            wakes,
            badges: Badges {
                wake_limit_reached: pending.is_some_and(|p| p.held_by_cap),
                delivery_attempts: 0,
                wakes_this_hour: wp.wakes_in_hour(now, settings),
                max_wakes_per_hour: settings.max_wakes_per_hour,
            },
            progress: Some(cortex_protocol::progress::progress(facts)),
        })
    }

    /// How many entries the deadline index holds (for tests and status).
    pub fn deadline_count(&self) -> Result<u64, StoreError> {
        self.table(&DEADLINES).count()
    }

    /// How many waitpoints the store holds in each state (the metrics' gauge at start):
    /// every waitpoint has one entry in the deadline index.
    pub fn waitpoint_counts(&self) -> Result<Vec<(&'static str, i64)>, StoreError> {
        let mut counts = [0i64; 4];
        let states = [
            State::Armed,
            State::Resolved,
            State::Expired,
            State::Cancelled,
        ];
        let wps = self.table(&WAITPOINTS);
        for r in self.table(&DEADLINES).iter()? {
            let (k, _) = r?;
            let (_, id) = k.value();
            if let Some(v) = wps.get((id, STATE))?
                && let Some(st) = super::tables::state_of(v.value())
                && let Some(i) = states.iter().position(|s| *s == st)
            {
                counts[i] += 1;
            }
        }
        Ok(states
            .iter()
            .zip(counts)
            .map(|(s, n)| (s.as_str(), n))
            .collect())
    }
}
