//! Waitpoints: create, cancel, signal, fire timers and sweep, deliver a wake, spawn, purge.

use cortex_protocol::api::{EventBody, SignalView, SpawnedFrom, Wake};

use crate::engine::{CreateError, CreateParams, Effect, SignalMeta, State, Waitpoint, WakePlan};
use crate::secret;
use crate::store::agent::AgentRecord;
use crate::store::kernel::error::StoreError;
use crate::store::tables::{SIGNAL_KEYS, SPAWN_SETUP, STATE, TIMER_WAKE, Tx, decode, encode};
use crate::text;

use super::{
    CancelOutcome, CreateOutcome, PASS_LIMIT, SignalIn, SignalOutcome, SpawnSetup, seconds_of,
    wp_ref,
};

impl Tx<'_> {
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
        if let Some(from) = held.and_then(|h| crate::store::tables::state_of(h.value())) {
            self.on_durable(move || {
                crate::metrics::metrics().waitpoint_moved(Some(from.as_str()), None);
            });
        }
        Ok(())
    }
}
