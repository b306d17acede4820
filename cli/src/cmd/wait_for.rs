//! `cortex wait for WP_ID`: blocks until that waitpoint's next wake, under the contract
//! every `cortex wait` keeps: one line on stderr when armed, silence while waiting, the wake as one JSON
//! object on stdout; exit 0 fired, 1 timed out (or expired), 2 broke, and 3 fired with the
//! job's failure (the wake's reason `failed`: a `fail` signal resolved it).
//!
//! It reads the session's event log by long polls from a cursor taken before the waitpoint's
//! state, so no wake can fall between the two. By default the cursor is now (the next
//! wake); `--after SEQ` starts after a seq the caller kept (the printed wake's `seq`), and
//! `--consumer NAME` after the position the hub keeps for that name, which it moves to
//! each wake once printed: a loop of `cortex wait for WP --consumer NAME` sees every wake,
//! reports sent before it started included, across restarts of the loop and of the hub.
//! Every fire ends with one stderr line naming the seq to resume after.
//!
//! A `silent` wake (the waitpoint's `silence_after` passed with no signal) exits 4: the job
//! went quiet, which is neither its success nor the wait's end. A hub never reached is
//! said at once and exits 2; a hub lost after it answered is retried until the bound.
//!
//! A remote wait's waitpoint (`cortex wait pid|file|flock --device`) is ended by a signal
//! with `source: "device-wait"` whose data says how: `fired`, `timed_out` or `broke`. That
//! outcome decides the exit status (0, 1, 2) rather than the wake's reason, so a remote
//! wait that timed out exits 1 like a local one, here and in `cortex wait for`. The hub's
//! own `report` wake on such a waitpoint (its device offline past the grace; the wait
//! stays armed) is not the outcome: it is passed over in silence and the wait goes on.
//! A fired remote pid wait on a job the device started (`device_exec`) carries the job's
//! exit: a non-zero code or a signal is the job's failure, 3.

use std::cell::Cell;
use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use cortex_protocol::api::{ConsumerAdvance, ConsumerPosition, SessionView, WaitpointView};
use cortex_protocol::mesh::WaitEnd;
use serde_json::Value;

use super::sessions::events_of;
use super::wait_exit::{BROKE, FAILED, FIRED, SILENT, TIMED_OUT};
use crate::hub::{Hub, HubError, segment};
use crate::timefmt::{self, human, utc};

/// Where `cortex wait for` starts reading the waitpoint's wakes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum From {
    /// Its next wake (or, when it has ended, its last one).
    Now,
    /// The first wake after this session event seq.
    After(u64),
    /// The first wake after the position the hub keeps for this consumer, which is moved
    /// to each wake once it is printed.
    Consumer(String),
}

/// Longest single long poll.
const POLL_SECS: u64 = 30;
/// Past the waitpoint's expiry, how long to wait for its expiry notice; also how long to
/// wait for a first answer from the hub when there is neither --timeout nor an expiry yet.
const GRACE: Duration = Duration::from_secs(120);
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Waits, prints, and returns the exit status.
pub fn run(
    hub: &Hub,
    wp: &str,
    timeout: Option<Duration>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    run_from(hub, wp, timeout, From::Now, out, err)
}

/// [`run`], reading from `from`.
pub fn run_from(
    hub: &Hub,
    wp: &str,
    timeout: Option<Duration>,
    from: From,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let how = How {
        announce: true,
        payload: false,
    };
    wait_with(hub, wp, timeout, how, from, out, err)
}

/// How [`run_with`] waits.
#[derive(Debug, Clone, Copy)]
pub struct How {
    /// `false` is for a caller that has just armed the waitpoint and printed its own
    /// armed line: it leaves out the "waiting for" line, and the "already resolved" one
    /// when the wake came before the first look (the outcome, however fast).
    pub announce: bool,
    /// A remote wait (`cortex wait … --device`): print what the same wait on this machine
    /// prints, the condition's payload (with `device` and `waitpoint` added), and nothing
    /// on stdout when it did not fire; not the whole wake.
    pub payload: bool,
}

/// [`run`], as `how` says.
pub fn run_with(
    hub: &Hub,
    wp: &str,
    timeout: Option<Duration>,
    how: How,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    wait_with(hub, wp, timeout, how, From::Now, out, err)
}

fn wait_with(
    hub: &Hub,
    wp: &str,
    timeout: Option<Duration>,
    how: How,
    from: From,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let mut waiter = Waiter {
        hub,
        wp,
        timeout,
        announce: how.announce,
        payload: how.payload,
        deadline: after(timeout.unwrap_or(GRACE)),
        device_bound: false,
        from,
        reached: Cell::new(false),
        lost: Cell::new(false),
    };
    match waiter.wait(out, err) {
        Ok(code) => code,
        Err(Broke(why)) => {
            let _ = writeln!(err, "cortex: {why}");
            BROKE
        }
    }
}

/// Why the wait cannot go on (exit 2).
struct Broke(String);

struct Waiter<'a> {
    hub: &'a Hub,
    wp: &'a str,
    timeout: Option<Duration>,
    announce: bool,
    payload: bool,
    deadline: Instant,
    /// A remote wait's waitpoint: its `report` wakes are the hub's loss reports.
    device_bound: bool,
    from: From,
    /// The hub has answered once: losing it now is waited out, not a broken wait.
    reached: Cell<bool>,
    /// Said already that the hub was lost (once per outage).
    lost: Cell<bool>,
}

impl Waiter<'_> {
    fn wait(&mut self, out: &mut dyn Write, err: &mut dyn Write) -> Result<u8, Broke> {
        let wp = self.wp;
        let view = self.waitpoint()?;
        self.device_bound = view.head.device.is_some();
        if self.timeout.is_none() {
            self.deadline = instant_at(
                view.head
                    .expires_at
                    .saturating_add(GRACE.as_millis() as u64),
            );
        }
        if view.head.state == "cancelled" && self.from == From::Now {
            return Err(cancelled(wp, None));
        }
        let sid = view.head.session.clone();
        // The cursor first, then the state: a wake after this cursor is in the log we poll.
        let session: SessionView = self
            .ask(&format!("/api/sessions/{}", segment(&sid)), None)
            .and_then(|r| r.json("GET /api/sessions/{sid}"))
            .map_err(|e| {
                self.broke(
                    e,
                    &format!("session {sid} of {wp} is gone; nothing will wake this wait"),
                )
            })?;
        let view = self.waitpoint()?;
        let mut cursor = session.last_seq;
        if let Some(start) = self.start()? {
            // The state first, then the log from the cursor: a wake after what the scan
            // read is in the polls that follow.
            let (found, end) = self.first_after(&sid, start)?;
            if let Some(ev) = found {
                if ev["kind"] == "wake" {
                    return self.take(&ev, out, err);
                }
                return Err(cancelled(wp, ev["by"].as_str()));
            }
            match view.head.state.as_str() {
                "armed" => {}
                "cancelled" => return Err(cancelled(wp, None)),
                state if view.wakes.iter().all(|w| w.delivered) => {
                    return Err(Broke(format!(
                        "{wp} is {state} and has no wake after seq {start}; nothing more will wake it"
                    )));
                }
                // Ended, with its last wake still on its way to the log.
                _ => {}
            }
            cursor = end.max(start);
        } else {
            match view.head.state.as_str() {
                "armed" => {}
                "cancelled" => return Err(cancelled(wp, None)),
                state => {
                    // Resolved or expired: its wake is in the log, or still on its way. Said
                    // only to someone who named an existing waitpoint: for a caller that just
                    // armed it (and said so), this wake is simply the outcome, however fast.
                    if let Some(wake) = self.last_wake(&sid)? {
                        if self.announce {
                            let _ = writeln!(err, "cortex: {wp} is {state}; its last wake:");
                        }
                        return self.take(&wake, out, err);
                    }
                    if !view.wakes.is_empty() && view.wakes.iter().all(|w| w.delivered) {
                        return Err(Broke(format!(
                            "{wp} is {state} but its wake is not in session {sid}'s events; look with: cortex wait check {wp}"
                        )));
                    }
                }
            }
        }
        let bound = match self.timeout {
            Some(t) => format!("at most {}", human(t)),
            None => format!(
                "its expiry {} plus {}",
                utc(view.head.expires_at),
                human(GRACE)
            ),
        };
        if self.announce {
            let _ = writeln!(
                err,
                "cortex: waiting for {wp} \"{}\" ({}) in session {sid}; {bound}",
                view.head.label, view.head.state
            );
        }

        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let _ = writeln!(
                    err,
                    "cortex: timed out: {wp} did not wake within {bound}; run cortex wait for {wp} again to keep waiting"
                );
                return Ok(TIMED_OUT);
            }
            let wait = left.as_secs_f64().ceil().clamp(1.0, POLL_SECS as f64) as u64;
            let path = format!(
                "/api/sessions/{}/events?after={cursor}&wait={wait}",
                segment(&sid)
            );
            let page: Value = self
                .ask(&path, Some(Duration::from_secs(wait + 15)))
                .and_then(|r| r.json("GET /api/sessions/{sid}/events"))
                .map_err(|e| {
                    self.broke(
                        e,
                        &format!("session {sid} of {wp} is gone; nothing will wake this wait"),
                    )
                })?;
            let events = events_of(&page).map_err(|e| Broke(e.to_string()))?;
            for ev in events {
                cursor = cursor.max(ev["seq"].as_u64().unwrap_or(cursor));
                if is_for(ev, "wake", wp) && !self.is_loss_report(ev) {
                    return self.take(ev, out, err);
                }
                if is_for(ev, "waitpoint-cancelled", wp) {
                    return Err(cancelled(wp, ev["by"].as_str()));
                }
            }
        }
    }

    /// The seq to read after, for a cursor: `--after`'s, or the consumer's position as the
    /// hub keeps it; `None` for the next wake.
    fn start(&self) -> Result<Option<u64>, Broke> {
        match &self.from {
            From::Now => Ok(None),
            From::After(seq) => Ok(Some(*seq)),
            From::Consumer(name) => {
                let pos: ConsumerPosition = self
                    .ask(&self.consumer_path(name), None)
                    .and_then(|r| r.json("GET /api/waitpoints/{id}/consumers/{name}"))
                    .map_err(|e| self.broke(e, &format!("unknown waitpoint {}", self.wp)))?;
                Ok(Some(pos.after))
            }
        }
    }

    fn consumer_path(&self, name: &str) -> String {
        format!(
            "/api/waitpoints/{}/consumers/{}",
            segment(self.wp),
            segment(name)
        )
    }

    /// Walks the session's log from after `start`, page by page, handing each event to
    /// `see` until it says stop (`true`) or the log ends; returns the newest seq read and
    /// whether `see` stopped it.
    fn walk(
        &self,
        sid: &str,
        start: u64,
        mut see: impl FnMut(&Value) -> bool,
    ) -> Result<(u64, bool), Broke> {
        let mut cursor = start;
        loop {
            let path = format!("/api/sessions/{}/events?after={cursor}", segment(sid));
            let page: Value = self
                .ask(&path, None)
                .and_then(|r| r.json("GET /api/sessions/{sid}/events"))
                .map_err(|e| self.broke(e, &format!("session {sid} of {} is gone", self.wp)))?;
            let events = events_of(&page).map_err(|e| Broke(e.to_string()))?;
            let before = cursor;
            for ev in events {
                cursor = cursor.max(ev["seq"].as_u64().unwrap_or(cursor));
                if see(ev) {
                    return Ok((cursor, true));
                }
            }
            if events.is_empty() || cursor == before {
                return Ok((cursor, false));
            }
        }
    }

    /// The first wake (or cancellation) of this waitpoint after `start` in the session's
    /// log, and the newest seq read.
    fn first_after(&self, sid: &str, start: u64) -> Result<(Option<Value>, u64), Broke> {
        let mut found = None;
        let (cursor, _) = self.walk(sid, start, |ev| {
            let hit = (is_for(ev, "wake", self.wp) && !self.is_loss_report(ev))
                || is_for(ev, "waitpoint-cancelled", self.wp);
            if hit {
                found = Some(ev.clone());
            }
            hit
        })?;
        Ok((found, cursor))
    }

    /// The wake, printed ([`fire`]); then a consumer's position moved to it, and
    /// the seq to resume after said on stderr.
    fn take(&self, wake: &Value, out: &mut dyn Write, err: &mut dyn Write) -> Result<u8, Broke> {
        let code = fire(wake, self.payload, out, err);
        let Some(seq) = wake["seq"].as_u64() else {
            return Ok(code);
        };
        let wp = self.wp;
        match &self.from {
            From::Consumer(name) => {
                let moved = self
                    .hub
                    .put(&self.consumer_path(name), &ConsumerAdvance { after: seq })
                    .and_then(|r| {
                        r.json::<ConsumerPosition>("PUT /api/waitpoints/{id}/consumers/{name}")
                    });
                match moved {
                    Ok(_) => {
                        let _ = writeln!(
                            err,
                            "cortex: consumer {name} took seq {seq}; its next: cortex wait for {wp} --consumer {name}"
                        );
                    }
                    Err(e) => {
                        let _ = writeln!(
                            err,
                            "cortex: the wake at seq {seq} was printed, but consumer {name}'s position could not be saved ({e}); its next wait may print it again"
                        );
                    }
                }
            }
            // A remote wait (`cortex wait pid --device`) keeps to its one armed line.
            _ if !self.announce => {}
            _ => {
                let _ = writeln!(
                    err,
                    "cortex: seq {seq}; resume after it: cortex wait for {wp} --after {seq}"
                );
            }
        }
        Ok(code)
    }

    fn waitpoint(&self) -> Result<WaitpointView, Broke> {
        let wp = self.wp;
        self.ask(&format!("/api/waitpoints/{}", segment(wp)), None)
            .and_then(|r| r.json("GET /api/waitpoints/{id}"))
            .map_err(|e| {
                self.broke(
                    e,
                    &format!(
                        "unknown waitpoint {wp}; check the id (cortex wait check --session SID lists a session's waitpoints)"
                    ),
                )
            })
    }

    /// The newest wake of this waitpoint already in the session's log.
    fn last_wake(&self, sid: &str) -> Result<Option<Value>, Broke> {
        let mut found = None;
        self.walk(sid, 0, |ev| {
            if is_for(ev, "wake", self.wp) && !self.is_loss_report(ev) {
                found = Some(ev.clone());
            }
            false
        })?;
        Ok(found)
    }

    /// The hub's report that a remote wait's device has been offline past the grace: the
    /// wait stays armed and its outcome comes later, so this is not the wake waited for.
    fn is_loss_report(&self, wake: &Value) -> bool {
        self.device_bound && wake["reason"] == "report" && device_wait_outcome(wake).is_none()
    }

    /// One GET; while the hub is unreachable (or failing on its side), again with a capped
    /// backoff until the deadline.
    fn ask(&self, path: &str, timeout: Option<Duration>) -> Result<crate::hub::Reply, HubError> {
        let mut backoff = BACKOFF_START;
        loop {
            let asked = match timeout {
                Some(t) => self.hub.get_slow(path, t),
                None => self.hub.get(path),
            };
            match asked {
                // Never reached: said at once, and nothing was waited for.
                Err(e @ HubError::Unreachable { .. }) if !self.reached.get() => return Err(e),
                Err(e) if e.is_transient() => {
                    self.reached.set(true);
                    let left = self.deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(e);
                    }
                    if !self.lost.replace(true) {
                        eprintln!(
                            "cortex: {e}; still waiting for {}, asking again until {}",
                            self.wp,
                            utc(timefmt::now_ms().saturating_add(left.as_millis() as u64))
                        );
                    }
                    thread::sleep(backoff.min(left));
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
                other => {
                    self.reached.set(true);
                    self.lost.set(false);
                    return other;
                }
            }
        }
    }

    /// Why a failed request ends the wait; `gone` is the message for a 404.
    fn broke(&self, e: HubError, gone: &str) -> Broke {
        if e.status() == Some(404) {
            return Broke(gone.to_string());
        }
        if !self.reached.get() {
            return Broke(format!("{e}; nothing was waited for"));
        }
        if e.is_transient() {
            let bound = match self.timeout {
                Some(t) => format!("the --timeout of {}", human(t)),
                None => "the bound".to_string(),
            };
            return Broke(format!(
                "{e}; it was not back within {bound}, so this wait can no longer tell"
            ));
        }
        Broke(e.to_string())
    }
}

fn cancelled(wp: &str, by: Option<&str>) -> Broke {
    let by = by.map(|b| format!(" by {b}")).unwrap_or_default();
    Broke(format!("{wp} was cancelled{by}; nothing will wake it"))
}

/// Is `ev` of `kind` and about waitpoint `wp`?
fn is_for(ev: &Value, kind: &str, wp: &str) -> bool {
    ev["kind"] == kind && ev["waitpoint"]["id"] == wp
}

/// Prints the wake as one JSON line; a remote wait's outcome, else the wake's reason,
/// decides the exit status. A remote wait that did not fire says why on `err`.
fn fire(wake: &Value, payload: bool, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let shown = if payload {
        printed_payload(wake)
    } else {
        Some(wake.clone())
    };
    let printed = match shown {
        Some(v) => serde_json::to_string(&v)
            .map_err(std::io::Error::other)
            .and_then(|line| writeln!(out, "{line}"))
            .and_then(|()| out.flush()),
        None => Ok(()),
    };
    match printed {
        // The reader closed the pipe: it wants no more, and the status still says how
        // the wait ended.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            let _ = writeln!(err, "cortex: writing the wake: {e}");
            return BROKE;
        }
        _ => {}
    }
    exit_status(wake, err)
}

/// What a remote wait prints: a fired outcome's payload as the device's wait produced it
/// (the object the same wait on this machine prints), with `device` and `waitpoint`
/// added; `None` (nothing on stdout) for an outcome that did not fire. A wake without an
/// outcome is printed whole.
pub fn printed_payload(wake: &Value) -> Option<Value> {
    let Some(data) = device_wait_data(wake) else {
        return Some(wake.clone());
    };
    if data["outcome"] != "fired" {
        return None;
    }
    let mut p = data.get("payload").cloned().unwrap_or(Value::Null);
    if !p.is_object() {
        p = serde_json::json!({ "payload": p });
    }
    if let Some(obj) = p.as_object_mut() {
        obj.entry("device")
            .or_insert_with(|| data["device"].clone());
        obj.entry("waitpoint")
            .or_insert_with(|| wake["waitpoint"]["id"].clone());
    }
    Some(p)
}

/// The data of the `device-wait` signal a remote wait's wake carries (the last one).
fn device_wait_data(wake: &Value) -> Option<Value> {
    device_wait_signal(wake).map(|(_, data)| data)
}

/// The last `device-wait` signal of a wake, with its data parsed.
fn device_wait_signal(wake: &Value) -> Option<(&Value, Value)> {
    wake["signals"].as_array()?.iter().rev().find_map(|s| {
        if s["source"] != "device-wait" {
            return None;
        }
        Some((s, serde_json::from_str(s["data"].as_str()?).ok()?))
    })
}

/// The exit status a wake stands for: a remote wait's outcome, else the wake's reason.
pub fn exit_status(wake: &Value, err: &mut dyn Write) -> u8 {
    if let Some((outcome, message)) = device_wait_outcome(wake) {
        if outcome != WaitEnd::Fired && !message.is_empty() {
            let _ = writeln!(err, "cortex: {message}");
        }
        if outcome == WaitEnd::Fired && job_failed(wake) {
            return FAILED;
        }
        return outcome.exit_code();
    }
    match wake["reason"].as_str() {
        Some("expired") => TIMED_OUT,
        Some("failed") => FAILED,
        Some("silent") => SILENT,
        _ => FIRED,
    }
}

/// Whether a fired remote wait's payload says its job failed: a pid wait on a job the
/// device started knows its exit (`exit_code` not 0, or a `signal`).
fn job_failed(wake: &Value) -> bool {
    let Some(signals) = wake["signals"].as_array() else {
        return false;
    };
    signals.iter().rev().any(|s| {
        s["source"] == "device-wait"
            && s["data"]
                .as_str()
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
                .is_some_and(|d| {
                    let p = &d["payload"];
                    p["exit_code"].as_i64().is_some_and(|c| c != 0) || !p["signal"].is_null()
                })
    })
}

/// The outcome and message of the remote wait a wake carries, if it carries one: its
/// `device-wait` signal's data says `{"outcome": "fired"|"timed_out"|"broke", …}`.
pub fn device_wait_outcome(wake: &Value) -> Option<(WaitEnd, String)> {
    let (s, data) = device_wait_signal(wake)?;
    let outcome = WaitEnd::parse(data["outcome"].as_str()?)?;
    Some((
        outcome,
        s["message"].as_str().unwrap_or_default().to_string(),
    ))
}

/// The monotonic instant at which the wall clock reads `ms` (now, if that is past).
fn instant_at(ms: u64) -> Instant {
    after(Duration::from_millis(ms.saturating_sub(timefmt::now_ms())))
}

/// Now plus `d`, or a century from now for a bound too far to represent.
fn after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests;
