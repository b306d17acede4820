//! All of `cortex-signal`: its flags (docs/waitpoints.md lists them), the signal body within the caps,
//! sending it, falling back to the spool, and the exit status. The binary only parses the
//! command line and calls [`run`]; the environment comes in as a [`SignalEnv`].
//!
//! It never prints the secret, and never loses a signal it could have spooled.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{CommandFactory, Parser, ValueEnum};
use cortex_protocol::signal::{
    ErrorBody, MAX_BODY_BYTES, MAX_DATA_CHARS, MAX_MESSAGE_CHARS, SignalRequest, SignalStatus,
};

use crate::home::{self, HomeError};
use crate::http::{HttpError, Method, Request, Response};
use crate::urls;

/// How long to wait for the hub's TCP connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the whole request may take: a hub frozen mid-request counts as unreachable.
pub const TIMEOUT: Duration = Duration::from_secs(10);

const AFTER_HELP: &str = "\
Examples:
  export CORTEX_SIGNAL_ID=wp_… CORTEX_SIGNAL_SECRET=…
  python train.py; cortex-signal --exit-code $?
  cortex-signal --exit-code $? --member arm2 --data @train.log
  cortex-signal --status progress --message \"still alive at step 12000\"

--url (and CORTEX_HUB) may name several hubs, comma-separated: when one cannot be
reached (or answers 5xx, or TLS fails), the next is tried. If none takes it, the signal
is written to $CORTEX_HOME/tmp/signals/ (CORTEX_HOME defaults to ~/.cortex) and the hub
delivers it when it drains the spool; each signal carries a fresh key, sent on every
attempt and kept in the spool, so it counts once.

Exit status: 0 accepted, already resolved (or expired or cancelled: said on stderr), or
spooled; 1 refused by the hub, or not delivered (hub unreachable with --no-spool, or the
spool not writable); 2 usage error or missing id or secret. Run with no arguments, it prints this help, sends nothing and exits 2.";

/// Signal a cortex waitpoint: the one line you append to a job
#[derive(Debug, Clone, Parser)]
#[command(name = "cortex-signal", version, after_help = AFTER_HELP)]
pub struct SignalArgs {
    /// The waitpoint [default: $CORTEX_SIGNAL_ID]
    #[arg(long, value_name = "wp_…")]
    pub id: Option<String>,

    /// The waitpoint's secret [default: $CORTEX_SIGNAL_SECRET]
    #[arg(long, value_name = "hex")]
    pub secret: Option<String>,

    /// Status from an exit code (0 → ok, else fail), and `exit=<n>` as the message unless
    /// --message is given
    #[arg(long, value_name = "n", allow_negative_numbers = true)]
    pub exit_code: Option<i64>,

    /// Overrides the status --exit-code derives [default: ok]
    #[arg(long, value_enum, value_name = "s")]
    pub status: Option<StatusArg>,

    /// One-line summary shown in the wake (at most 2,000 characters are sent)
    #[arg(long, value_name = "text")]
    pub message: Option<String>,

    /// Which member this is; required when the waitpoint names members
    #[arg(long, value_name = "name")]
    pub member: Option<String>,

    /// Extra payload: @file, - for stdin, or the literal text; delivered as data, never as
    /// instructions (the last 16,000 characters are sent)
    #[arg(long, value_name = "@file|-|text")]
    pub data: Option<String>,

    /// Signal endpoint, or several comma-separated, tried in order [default:
    /// $CORTEX_HUB/webhook/signal (each of its URLs), else
    /// http://127.0.0.1:$WEBHOOK_PORT/webhook/signal, else the address a hub on this machine
    /// wrote to $CORTEX_HOME/hub/url, else port 3001]
    #[arg(long, value_name = "url[,url…]")]
    pub url: Option<String>,

    /// Fail (exit 1) instead of writing to the spool when the hub cannot be reached
    #[arg(long)]
    pub no_spool: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusArg {
    Ok,
    Fail,
    Progress,
}

impl From<StatusArg> for SignalStatus {
    fn from(s: StatusArg) -> Self {
        match s {
            StatusArg::Ok => SignalStatus::Ok,
            StatusArg::Fail => SignalStatus::Fail,
            StatusArg::Progress => SignalStatus::Progress,
        }
    }
}

/// The help text, as printed when `cortex-signal` runs with no arguments.
pub fn help() -> String {
    SignalArgs::command().render_help().to_string()
}

/// What `cortex-signal` reads from its environment.
#[derive(Debug, Clone)]
pub struct SignalEnv {
    /// `CORTEX_SIGNAL_ID`
    pub id: Option<String>,
    /// `CORTEX_SIGNAL_SECRET`
    pub secret: Option<String>,
    /// `CORTEX_HUB`: the hub's base URL (or several, comma-separated), as `cortex` takes it.
    pub hub: Option<String>,
    /// `WEBHOOK_PORT`
    pub webhook_port: Option<String>,
    /// `$CORTEX_HOME`, default `~/.cortex`: where the spool is, and the hub's `hub/url`.
    pub cortex_home: Result<PathBuf, HomeError>,
}

impl SignalEnv {
    pub fn from_process() -> Self {
        let var = |name| std::env::var(name).ok();
        SignalEnv {
            id: var("CORTEX_SIGNAL_ID"),
            secret: var("CORTEX_SIGNAL_SECRET"),
            hub: var("CORTEX_HUB"),
            webhook_port: var("WEBHOOK_PORT"),
            cortex_home: home::cortex_home(),
        }
    }
}

/// How a run ended; [`Outcome::exit_code`] is the process's exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 202 (accepted or duplicate), or another 2xx.
    Accepted,
    /// 410: the waitpoint had already resolved.
    AlreadyResolved,
    /// The hub could not take it; it waits in the spool.
    Spooled(PathBuf),
    /// The hub refused it (a 4xx, or an answer that is not a signal route's).
    Refused(u16),
    /// Neither delivered nor spooled (--no-spool, or the spool is not writable).
    NotDelivered,
    /// A usage error, or no id or secret: nothing was sent.
    Usage,
}

impl Outcome {
    pub fn exit_code(&self) -> u8 {
        match self {
            Outcome::Accepted | Outcome::AlreadyResolved | Outcome::Spooled(_) => 0,
            Outcome::Refused(_) | Outcome::NotDelivered => 1,
            Outcome::Usage => 2,
        }
    }
}

/// Why nothing was sent: the flags or the environment are wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    #[error(
        "no waitpoint id: pass --id wp_… or set CORTEX_SIGNAL_ID (the env line that wait_create returned sets it)"
    )]
    NoId,
    #[error(
        "no secret: pass --secret … or set CORTEX_SIGNAL_SECRET (the env line that wait_create returned sets it)"
    )]
    NoSecret,
    #[error(
        "WEBHOOK_PORT={0:?} is not a port number; set it to the hub's port (default 3001) or pass --url"
    )]
    BadPort(String),
    /// A bad `--url` or `CORTEX_HUB`; the text names which, and the URL.
    #[error("{0}")]
    BadUrl(String),
}

/// The signal route's URLs, tried in order: `--url` (one URL or several, comma-separated),
/// else each of `$CORTEX_HUB`'s with `/webhook/signal`, else loopback on `WEBHOOK_PORT`,
/// else the address the hub on this machine wrote to `$CORTEX_HOME/hub/url`, else loopback
/// on port 3001: the order `cortex` finds the hub in. Every URL is checked ([`urls::parse`]).
pub fn signal_urls(flag: Option<&str>, env: &SignalEnv) -> Result<Vec<String>, UsageError> {
    let set = |v: Option<&str>| v.map(str::trim).filter(|s| !s.is_empty()).map(String::from);
    let list = |from: &str, text: &str| {
        urls::parse(text).map_err(|e| UsageError::BadUrl(format!("{from}: {e}")))
    };
    if let Some(u) = set(flag) {
        return list("--url", &u);
    }
    let route = |base: &str| format!("{}/webhook/signal", base.trim_end_matches('/'));
    if let Some(bases) = set(env.hub.as_deref()) {
        return Ok(list("CORTEX_HUB", &bases)?
            .iter()
            .map(|b| route(b))
            .collect());
    }
    let port = match set(env.webhook_port.as_deref()) {
        None => {
            let from_file = env
                .cortex_home
                .as_ref()
                .ok()
                .and_then(|h| home::hub_url_from_file(h));
            if let Some(base) = from_file {
                return list("$CORTEX_HOME/hub/url", &route(&base));
            }
            cortex_protocol::DEFAULT_WEBHOOK_PORT
        }
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err(UsageError::BadPort(p)),
        },
    };
    Ok(vec![format!("http://127.0.0.1:{port}/webhook/signal")])
}

/// A signal ready to send: the body, the URLs, and what to warn about.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Tried in order; never empty.
    pub urls: Vec<String>,
    pub request: SignalRequest,
    /// The JSON body, sent as is and, if need be, spooled as is (same key).
    pub body: Vec<u8>,
    pub warnings: Vec<String>,
}

/// Turns flags and environment into the request, within the caps.
pub fn prepare(
    args: &SignalArgs,
    env: &SignalEnv,
    stdin: &mut dyn Read,
) -> Result<Prepared, UsageError> {
    let present = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
    let id = present(&args.id)
        .or_else(|| present(&env.id))
        .ok_or(UsageError::NoId)?;
    let secret = present(&args.secret)
        .or_else(|| present(&env.secret))
        .ok_or(UsageError::NoSecret)?;
    let urls = signal_urls(args.url.as_deref(), env)?;

    let mut warnings = Vec::new();
    let status = match (args.status, args.exit_code) {
        (Some(s), _) => s.into(),
        (None, Some(0)) | (None, None) => SignalStatus::Ok,
        (None, Some(_)) => SignalStatus::Fail,
    };
    let message = match (&args.message, args.exit_code) {
        (Some(m), _) => Some(cap_message(m, &mut warnings)),
        (None, Some(code)) => Some(format!("exit={code}")),
        (None, None) => None,
    };
    let tail = args
        .data
        .as_deref()
        .map(|arg| read_data(arg, stdin, &mut warnings));
    let request = SignalRequest {
        id,
        secret,
        status: Some(status),
        message,
        member: args.member.clone(),
        data: None,
        key: Some(crate::random::key()),
    };
    let (request, body) = fit(request, tail.as_ref(), &mut warnings);
    Ok(Prepared {
        urls,
        request,
        body,
        warnings,
    })
}

/// The first [`MAX_MESSAGE_CHARS`] characters of a message.
fn cap_message(m: &str, warnings: &mut Vec<String>) -> String {
    match m.char_indices().nth(MAX_MESSAGE_CHARS) {
        None => m.to_string(),
        Some((cut, _)) => {
            warnings.push(format!(
                "--message is {} characters, over the cap of {MAX_MESSAGE_CHARS}; sending its first {MAX_MESSAGE_CHARS} (put long output in --data)",
                m.chars().count()
            ));
            m[..cut].to_string()
        }
    }
}

/// The end of the `--data` text: enough of its last bytes for any cap, and the length of
/// the whole. A log can be far larger than what is sent, so only the tail is kept in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tail {
    pub text: String,
    pub total_chars: usize,
}

/// Bytes of the tail kept while reading: 16,000 characters of up to 4 bytes each fit.
const TAIL_BYTES: usize = MAX_BODY_BYTES;

pub fn read_tail(r: &mut dyn Read) -> io::Result<Tail> {
    let mut kept: Vec<u8> = Vec::new();
    let mut total_chars = 0usize;
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // A character starts at every byte that is not a UTF-8 continuation byte.
        total_chars += chunk[..n].iter().filter(|&&b| b & 0xC0 != 0x80).count();
        kept.extend_from_slice(&chunk[..n]);
        if kept.len() > 2 * TAIL_BYTES {
            kept.drain(..kept.len() - TAIL_BYTES);
        }
    }
    let mut start = kept.len().saturating_sub(TAIL_BYTES);
    // Never begin in the middle of a character.
    while kept.get(start).is_some_and(|b| b & 0xC0 == 0x80) {
        start += 1;
    }
    let text = String::from_utf8_lossy(&kept[start..]).into_owned();
    Ok(Tail { text, total_chars })
}

fn read_data(arg: &str, stdin: &mut dyn Read, warnings: &mut Vec<String>) -> Tail {
    let (what, result) = if arg == "-" {
        ("stdin".to_string(), read_tail(stdin))
    } else if let Some(path) = arg.strip_prefix('@') {
        (
            path.to_string(),
            std::fs::File::open(Path::new(path)).and_then(|mut f| read_tail(&mut f)),
        )
    } else {
        return Tail {
            text: arg.to_string(),
            total_chars: arg.chars().count(),
        };
    };
    match result {
        Ok(tail) => tail,
        // The job's result matters more than its log: send the signal with a note instead.
        Err(e) => {
            warnings.push(format!(
                "cannot read --data from {what}: {e}; sending the signal with a note instead"
            ));
            let text = format!("[cortex-signal could not read {what}: {e}]");
            Tail {
                total_chars: text.chars().count(),
                text,
            }
        }
    }
}

fn cut_marker(cut: usize) -> String {
    format!("[… {cut} characters cut]\n")
}

/// `data` keeping the last `keep` characters of the tail, after a cut marker if anything is
/// left out. The marker counts within the cap: callers pass `keep` with room for it.
fn render_data(tail: &Tail, keep: usize) -> String {
    let chars = tail.text.chars().count();
    let keep = keep.min(chars);
    if keep == chars && chars >= tail.total_chars {
        return tail.text.clone();
    }
    let start = tail
        .text
        .char_indices()
        .nth(chars - keep)
        .map_or(tail.text.len(), |(i, _)| i);
    let cut = tail.total_chars.saturating_sub(keep);
    format!("{}{}", cut_marker(cut), &tail.text[start..])
}

/// Bytes a character takes inside a JSON string as serde_json writes it.
fn json_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Sets `data` from the tail within [`MAX_DATA_CHARS`] and the whole body within
/// [`MAX_BODY_BYTES`], cutting from the front of the data (a log's tail is what matters).
fn fit(
    mut req: SignalRequest,
    tail: Option<&Tail>,
    warnings: &mut Vec<String>,
) -> (SignalRequest, Vec<u8>) {
    let Some(tail) = tail else {
        let body = to_body(&req);
        return (req, body);
    };
    let chars = tail.text.chars().count();
    let mut keep = if tail.total_chars <= MAX_DATA_CHARS && chars >= tail.total_chars {
        chars
    } else {
        // The marker's own length with the largest cut it could show bounds the real one.
        let keep = MAX_DATA_CHARS.saturating_sub(cut_marker(tail.total_chars).chars().count());
        warnings.push(format!(
            "--data is {} characters, over the cap of {MAX_DATA_CHARS}; sending its last {keep} after a cut marker",
            tail.total_chars
        ));
        keep
    };
    let mut shrunk = false;
    loop {
        req.data = Some(render_data(tail, keep));
        let body = to_body(&req);
        if body.len() <= MAX_BODY_BYTES || keep == 0 {
            if shrunk {
                warnings.push(format!(
                    "the signal would be over {} KB; sending only the last {keep} characters of --data",
                    MAX_BODY_BYTES / 1024
                ));
            }
            return (req, body);
        }
        // Drop characters from the front of what is kept until the excess is covered, with
        // room for the marker to grow by a few digits.
        let excess = body.len() - MAX_BODY_BYTES + 32;
        let kept = &tail.text[tail.text.len() - kept_bytes(&tail.text, keep)..];
        let mut freed = 0;
        let mut dropped = 0;
        for c in kept.chars() {
            if freed >= excess {
                break;
            }
            freed += json_len(c);
            dropped += 1;
        }
        keep -= dropped.min(keep);
        shrunk = true;
    }
}

/// Bytes of the last `keep` characters of `s`.
fn kept_bytes(s: &str, keep: usize) -> usize {
    s.chars().rev().take(keep).map(char::len_utf8).sum()
}

fn to_body(req: &SignalRequest) -> Vec<u8> {
    // A struct of strings always serializes; the fallback keeps this free of panics.
    serde_json::to_vec(req).unwrap_or_default()
}

/// Runs `cortex-signal` with parsed flags: prepares, sends, spools if need be, and says on
/// stderr what happened when there is something to say.
pub fn run(
    args: &SignalArgs,
    env: &SignalEnv,
    stdin: &mut dyn Read,
    stderr: &mut dyn Write,
) -> Outcome {
    let prepared = match prepare(args, env, stdin) {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(stderr, "cortex-signal: {e}");
            return Outcome::Usage;
        }
    };
    for w in &prepared.warnings {
        let _ = writeln!(stderr, "cortex-signal: warning: {w}");
    }
    // The same body, and so the same key, at every URL: a hub that recorded the signal
    // but whose answer was lost tells the next one (on the same store) it is a duplicate.
    let mut missed_at = Vec::new();
    for (i, url) in prepared.urls.iter().enumerate() {
        let sent = Request::new(Method::Post, url)
            .json(&prepared.body)
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(TIMEOUT)
            .send();
        if i + 1 == prepared.urls.len() || !worth_spooling(&sent) {
            return conclude(
                sent,
                url,
                &missed_at,
                &prepared,
                args.no_spool,
                &env.cortex_home,
                stderr,
            );
        }
        missed_at.push(missed(&sent, url, &prepared.request.secret));
    }
    // `urls` is never empty, so the loop always returns.
    Outcome::Usage
}

/// The hub did not take the signal, though it might have: the next URL is tried, and after
/// the last the signal is spooled (a TLS failure too: the signal is safer on disk than lost
/// to a certificate problem).
fn worth_spooling(sent: &Result<Response, HttpError>) -> bool {
    match sent {
        Ok(r) => r.status >= 500,
        Err(e) => matches!(
            e,
            HttpError::Unreachable { .. } | HttpError::Tls { .. } | HttpError::Protocol { .. }
        ),
    }
}

/// Why the hub did not take the signal, though it might have: worth spooling.
fn missed(sent: &Result<Response, HttpError>, url: &str, secret: &str) -> String {
    match sent {
        Err(HttpError::Unreachable { reason, .. }) => {
            format!("hub unreachable at {url} ({reason})")
        }
        Err(HttpError::Protocol { reason, .. }) => {
            format!("hub at {url} gave an unreadable answer ({reason})")
        }
        Err(HttpError::Tls { reason, .. }) => {
            format!("TLS with the hub at {url} failed ({reason})")
        }
        Err(e) => format!("hub at {url} not asked ({e})"),
        Ok(r) => match serde_json::from_slice::<ErrorBody>(&r.body) {
            Ok(b) => format!(
                "hub at {url} failed with HTTP {} ({})",
                r.status,
                redact(&b.message, secret)
            ),
            Err(_) => format!("hub at {url} failed with HTTP {}", r.status),
        },
    }
}

/// Maps what happened to the last request (the one to `url`) onto an outcome, spooling
/// when the hub did not take it; `missed_at` says why each URL before it did not.
pub fn conclude(
    sent: Result<Response, HttpError>,
    url: &str,
    missed_at: &[String],
    prepared: &Prepared,
    no_spool: bool,
    cortex_home: &Result<PathBuf, HomeError>,
    stderr: &mut dyn Write,
) -> Outcome {
    match &sent {
        Ok(r) if r.is_success() => return Outcome::Accepted,
        Ok(r) if r.status == 410 => {
            // A late signal (the waitpoint expired) or one for a cancelled waitpoint is
            // told so in the hub's words; still exit 0: the job has nothing to retry.
            let late = serde_json::from_slice::<ErrorBody>(&r.body)
                .ok()
                .filter(|b| b.error == "expired" || b.error == "cancelled");
            let _ = match late {
                Some(b) => writeln!(
                    stderr,
                    "cortex-signal: {}",
                    redact(&b.message, &prepared.request.secret)
                ),
                None => writeln!(
                    stderr,
                    "cortex-signal: waitpoint {} already resolved; nothing to do",
                    prepared.request.id
                ),
            };
            return Outcome::AlreadyResolved;
        }
        Ok(r) if r.status < 500 => return refused(r, url, prepared, stderr),
        // The URL was checked in `prepare`; an error not worth spooling is a usage error.
        Err(e) if !worth_spooling(&sent) => {
            let _ = writeln!(stderr, "cortex-signal: {e}");
            return Outcome::Usage;
        }
        // Not taken, though it might have been (a 5xx, unreachable, TLS): kept in the spool.
        _ => {}
    }
    let mut all = missed_at.to_vec();
    all.push(missed(&sent, url, &prepared.request.secret));
    let what = all.join(", ");
    if no_spool {
        let _ = writeln!(
            stderr,
            "cortex-signal: {what}; not spooled because of --no-spool; start the hub (cortex-hub) or fix --url / WEBHOOK_PORT, then signal again"
        );
        return Outcome::NotDelivered;
    }
    let spooled = match cortex_home {
        Ok(home) => {
            crate::spool::write(&home::spool_dir(home), &prepared.body).map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    match spooled {
        Ok(path) => {
            let _ = writeln!(
                stderr,
                "cortex-signal: {what}; spooled the signal to {}; the hub will deliver it when it drains the spool",
                path.display()
            );
            Outcome::Spooled(path)
        }
        Err(e) => {
            let _ = writeln!(
                stderr,
                "cortex-signal: {what}, and spooling failed: {e}; the signal was NOT delivered: start the hub or fix the spool directory, then signal again"
            );
            Outcome::NotDelivered
        }
    }
}

fn refused(r: &Response, url: &str, prepared: &Prepared, stderr: &mut dyn Write) -> Outcome {
    let id = &prepared.request.id;
    let redact = |s: &str| redact(s, &prepared.request.secret);
    if !(400..500).contains(&r.status) {
        let _ = writeln!(
            stderr,
            "cortex-signal: unexpected answer HTTP {} from {}; check --url (it should end in /webhook/signal)",
            r.status, url
        );
        return Outcome::Refused(r.status);
    }
    let body: Option<ErrorBody> = serde_json::from_slice(&r.body).ok();
    let hint = match r.status {
        400 => "the hub could not read the signal; check the flags".to_string(),
        401 => format!("wrong secret for {id}; check --secret / CORTEX_SIGNAL_SECRET against what wait_create returned"),
        404 => format!(
            "unknown waitpoint {id}; check --id / CORTEX_SIGNAL_ID (a waitpoint is forgotten 3 days after it resolves or expires)"
        ),
        413 => "the signal is over 64 KB; send less with --data".to_string(),
        422 => "this waitpoint names its members; pass one with --member NAME".to_string(),
        429 => "too many unknown ids or wrong secrets in the last minute; fix the id and secret, then retry in a minute"
            .to_string(),
        _ => format!("check --url ({url}) and the flags"),
    };
    let (code, message) = match &body {
        Some(b) => (format!(" {}", b.error), redact(&b.message)),
        None if r.body.is_empty() => (String::new(), hint),
        None => {
            let text: String = r.text().chars().take(300).collect();
            (String::new(), format!("{}; {hint}", redact(text.trim())))
        }
    };
    let _ = writeln!(
        stderr,
        "cortex-signal: refused (HTTP {}{code}): {message}",
        r.status
    );
    if let Some(members) = body.as_ref().and_then(|b| b.members.as_ref()) {
        let _ = writeln!(
            stderr,
            "cortex-signal: expected members: {}; pass one with --member NAME",
            members.join(", ")
        );
    }
    Outcome::Refused(r.status)
}

/// Hides the secret in text that came from the hub. Only secrets long enough to be real
/// ones are searched for: a one-letter test secret would mangle every word.
fn redact(s: &str, secret: &str) -> String {
    if secret.len() < 6 {
        s.to_string()
    } else {
        s.replace(secret, "[secret]")
    }
}

#[cfg(test)]
mod tests;
