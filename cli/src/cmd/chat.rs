//! `cortex chat SID`: a conversation with the model a session runs. Each line read from
//! stdin is posted as a message; a follower prints everything the session does as it
//! happens (the model's text, tool calls, wakes, retries, a failed run). One thread
//! writes the output: the lines read, the followed stream and Ctrl-C all arrive on one
//! channel, so nothing interleaves mid-line.

use std::collections::{BTreeSet, HashSet};
use std::io::{BufRead, Write};
use std::sync::mpsc::{Sender, channel};
use std::thread;

use anyhow::Context;
use cortex_protocol::api::{Event, EventBody, MessagePosted};

use super::Term;
use super::follow::{Follow, FollowError, Item, Screen};
use super::render::{self, Options, Render, Scope};
use super::sessions::{MAILBOX, NO_MODEL, Post};
use crate::hub::Hub;

const PROMPT: &str = "› ";

enum Input {
    Line(String),
    Eof,
    Interrupt,
    Stream(Result<Item, FollowError>),
}

/// What the conversation waits on: messages posted that no run took yet, runs going on.
#[derive(Default)]
struct Waiting {
    posted: BTreeSet<u64>,
    /// Message seqs some run took (the stream may show it before the post answers).
    taken: HashSet<u64>,
    runs: HashSet<String>,
}

impl Waiting {
    fn idle(&self) -> bool {
        self.posted.is_empty() && self.runs.is_empty()
    }
}

/// Runs the conversation; the exit status is 0 when it ends by EOF or Ctrl-C, 2 when the
/// session is gone or its stream is lost. With stdin not a terminal, EOF waits until the
/// runs that took the messages posted have ended, so `echo hi | cortex chat SID` prints
/// the answer.
pub fn run(
    hub: &Hub,
    sid: &str,
    reasoning: bool,
    term: &Term,
    input: Box<dyn BufRead + Send>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<u8> {
    let Some(view) = super::sessions::session_view(hub, sid, err)? else {
        return Ok(2);
    };
    let past = history(hub, sid, view.last_seq)?;
    // Opened before the first line is posted, so the answer's first pieces are seen live.
    let follow = match Follow::open(hub, sid, view.last_seq) {
        Ok(f) => f,
        Err(e) => {
            writeln!(err, "cortex: {e}")?;
            return Ok(2);
        }
    };
    let (tx, rx) = channel::<Input>();
    spawn_follower(follow, tx.clone())?;
    spawn_reader(input, tx.clone())?;
    if term.catch_interrupt {
        catch_interrupt(tx.clone()).context("catching Ctrl-C")?;
    }
    drop(tx);

    let interactive = term.stdin_tty;
    if interactive {
        let title = view.title.as_deref().unwrap_or("untitled");
        writeln!(
            err,
            "chat with session {sid} ({title}); each line is a message; Ctrl-D or Ctrl-C ends it"
        )?;
    }
    let opts = Options {
        reasoning,
        width: term.columns(),
    };
    let mut render = Render::new(Scope::All, opts);
    let mut waiting = Waiting::default();
    // The recent past first: the last messages and wakes, and what came of them.
    if !past.is_empty() {
        if interactive {
            writeln!(
                err,
                "the last {} of this session (messages, wakes, answers):",
                plural(inputs(&past), "message or wake", "messages and wakes")
            )?;
        }
        for ev in &past {
            track(&mut waiting, &ev.body);
            let outs = render.event(ev, false);
            let mut screen = Screen {
                text: &mut *out,
                notes: None,
                dim: term.stdout_tty,
            };
            screen.put(&outs).context("writing to stdout")?;
        }
    }
    let mut eof = false;
    // A mailbox says so at once: no line typed here will be answered.
    let mut told_no_model = !view.runs;
    if told_no_model {
        writeln!(err, "cortex: {MAILBOX}")?;
    }
    // The seqs of the messages this chat posted.
    let mut mine = HashSet::new();
    let mut prompt = Prompt {
        on: interactive,
        shown: false,
        erase: term.stdout_tty,
    };
    prompt.show(out)?;
    // Every sender gone (the stream ended for good and stdin is closed): nothing is left.
    while let Ok(next) = rx.recv() {
        match next {
            Input::Line(line) => {
                prompt.shown = false;
                let text = line.trim_end_matches(['\n', '\r']);
                if !text.trim().is_empty() {
                    let post = Post {
                        sid,
                        text,
                        now: false,
                        dedupe_key: None,
                    };
                    let posted = post.send(hub).and_then(|r| {
                        Ok(r.json::<MessagePosted>("POST /api/sessions/{sid}/messages")?)
                    });
                    if let Ok(p) = &posted {
                        mine.insert(p.seq);
                    }
                    match posted {
                        Ok(p) if p.runs => {
                            if !waiting.taken.contains(&p.seq) {
                                waiting.posted.insert(p.seq);
                            }
                        }
                        Ok(p) if !told_no_model => {
                            told_no_model = true;
                            let why = if p.mailbox { MAILBOX } else { NO_MODEL };
                            writeln!(err, "cortex: {why}")?;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            writeln!(err, "cortex: {e:#}")?;
                            if is_gone(&e) {
                                return Ok(2);
                            }
                        }
                    }
                }
                if waiting.idle() {
                    prompt.show(out)?;
                }
            }
            Input::Eof => {
                eof = true;
                if interactive || waiting.idle() {
                    prompt.end(out)?;
                    return Ok(0);
                }
            }
            Input::Interrupt => {
                prompt.end(out)?;
                writeln!(out)?;
                return Ok(0);
            }
            Input::Stream(Ok(Item::Message(m))) => {
                let Some(ev) = render::parse(&m) else {
                    continue;
                };
                // The lines typed here are on the screen already; others' are shown.
                if matches!(ev.body, EventBody::Message { .. }) && mine.contains(&ev.seq) {
                    continue;
                }
                let ended = track(&mut waiting, &ev.body);
                let outs = render.event(&ev, m.event == "live");
                if !outs.is_empty() {
                    prompt.clear(out)?;
                    let mut screen = Screen {
                        text: &mut *out,
                        notes: None,
                        dim: term.stdout_tty,
                    };
                    screen.put(&outs).context("writing to stdout")?;
                }
                if ended && waiting.idle() {
                    if eof {
                        return Ok(0);
                    }
                    prompt.show(out)?;
                }
            }
            Input::Stream(Ok(Item::Dropped { reason })) => {
                prompt.clear(out)?;
                writeln!(
                    err,
                    "cortex: the event stream dropped ({reason}); reconnecting"
                )?;
            }
            Input::Stream(Ok(Item::Back)) => {
                writeln!(err, "cortex: reconnected")?;
                if waiting.idle() {
                    prompt.show(out)?;
                }
            }
            Input::Stream(Err(e)) => {
                prompt.end(out)?;
                writeln!(err, "cortex: {e}")?;
                return Ok(2);
            }
        }
    }
    Ok(0)
}

/// Messages and wakes `cortex chat` shows of the past on open, at most, each with what
/// came of it (the runs that took it).
pub const HISTORY_INPUTS: usize = 10;
/// How many of the newest events it looks through for them.
const HISTORY_WINDOW: u64 = 2_000;

/// Whether an event is an input shown in the history (a message or a wake).
fn is_input(body: &EventBody) -> bool {
    matches!(body, EventBody::Message { .. } | EventBody::Wake(_))
}

fn inputs(events: &[Event]) -> usize {
    events.iter().filter(|e| is_input(&e.body)).count()
}

fn plural(n: usize, one: &str, many: &str) -> String {
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

/// The events of `sid` up to `last_seq` from its [`HISTORY_INPUTS`]-th newest input on
/// (none when the session holds no input in its newest [`HISTORY_WINDOW`] events).
fn history(hub: &Hub, sid: &str, last_seq: u64) -> anyhow::Result<Vec<Event>> {
    let mut cursor = last_seq.saturating_sub(HISTORY_WINDOW);
    let mut events: Vec<Event> = Vec::new();
    while cursor < last_seq {
        let path = format!(
            "/api/sessions/{}/events?after={cursor}",
            crate::hub::segment(sid)
        );
        let page: serde_json::Value = hub
            .get(&path)
            .with_context(|| format!("reading the recent events of session {sid}"))?
            .json("GET /api/sessions/{sid}/events")?;
        let list = super::sessions::events_of(&page)?;
        let before = cursor;
        for v in list {
            cursor = cursor.max(v["seq"].as_u64().unwrap_or(cursor));
            // A kind this version does not know (a newer hub's) is skipped.
            if let Ok(ev) = serde_json::from_value::<Event>(v.clone())
                && ev.seq <= last_seq
            {
                events.push(ev);
            }
        }
        if list.is_empty() || cursor == before {
            break;
        }
    }
    let starts: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| is_input(&e.body))
        .map(|(i, _)| i)
        .collect();
    let Some(&first) = starts.get(starts.len().saturating_sub(HISTORY_INPUTS)) else {
        return Ok(Vec::new());
    };
    Ok(events.split_off(first))
}

/// Notes which posted messages a run took and which runs are going on; true at a run's end.
fn track(waiting: &mut Waiting, body: &EventBody) -> bool {
    match body {
        EventBody::RunStart { run_id, input } => {
            for i in input {
                waiting.posted.remove(&i.seq);
                waiting.taken.insert(i.seq);
            }
            waiting.runs.insert(run_id.clone());
            false
        }
        EventBody::RunEnd { run_id, .. } => {
            waiting.runs.remove(run_id);
            true
        }
        _ => false,
    }
}

fn is_gone(e: &anyhow::Error) -> bool {
    e.downcast_ref::<crate::hub::HubError>()
        .and_then(|h| h.status())
        == Some(404)
}

/// The prompt, shown on a terminal while nothing is answering.
struct Prompt {
    on: bool,
    shown: bool,
    /// Output is a terminal: a shown prompt is erased before output, not left behind.
    erase: bool,
}

impl Prompt {
    fn show(&mut self, out: &mut dyn Write) -> std::io::Result<()> {
        if self.on && !self.shown {
            out.write_all(PROMPT.as_bytes())?;
            out.flush()?;
            self.shown = true;
        }
        Ok(())
    }

    fn clear(&mut self, out: &mut dyn Write) -> std::io::Result<()> {
        if self.shown {
            match self.erase {
                true => out.write_all(b"\r\x1b[K")?,
                false => out.write_all(b"\n")?,
            }
            self.shown = false;
        }
        Ok(())
    }

    fn end(&mut self, out: &mut dyn Write) -> std::io::Result<()> {
        if self.shown {
            out.write_all(b"\n")?;
            self.shown = false;
        }
        out.flush()
    }
}

fn spawn_follower(mut follow: Follow, tx: Sender<Input>) -> anyhow::Result<()> {
    thread::Builder::new()
        .name("cortex-follow".into())
        .spawn(move || {
            loop {
                let next = follow.next_item();
                let last = next.is_err();
                if tx.send(Input::Stream(next)).is_err() || last {
                    return;
                }
            }
        })
        .context("starting the follower thread")?;
    Ok(())
}

fn spawn_reader(mut input: Box<dyn BufRead + Send>, tx: Sender<Input>) -> anyhow::Result<()> {
    thread::Builder::new()
        .name("cortex-stdin".into())
        .spawn(move || {
            loop {
                let mut line = String::new();
                match input.read_line(&mut line) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Input::Eof);
                        return;
                    }
                    Ok(_) => {
                        if tx.send(Input::Line(line)).is_err() {
                            return;
                        }
                    }
                }
            }
        })
        .context("starting the stdin thread")?;
    Ok(())
}

/// SIGINT becomes [`Input::Interrupt`] (so Ctrl-C ends the chat with status 0): tokio's
/// signal handling, on a thread of its own; registered before this returns.
fn catch_interrupt(tx: Sender<Input>) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut sigint = {
        let _guard = rt.enter();
        signal(SignalKind::interrupt())?
    };
    thread::Builder::new()
        .name("cortex-sigint".into())
        .spawn(move || {
            if rt.block_on(sigint.recv()).is_some() {
                let _ = tx.send(Input::Interrupt);
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests;
