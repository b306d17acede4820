//! The `cortex` command line: the dispatch of its subcommands (`args.rs`: the flags) to
//! each command's module. The binary only parses the command line and calls [`run`]; the environment comes
//! in as a [`CortexEnv`] and output goes to the writers it is given.

mod args;
pub mod chat;
pub mod devices;
pub mod follow;
pub mod mcp;
pub mod mcp_tokens;
pub mod people;
pub mod render;
pub mod run;
pub mod sessions;
pub mod wait;
pub mod wait_exit;
pub mod wait_for;
pub mod wait_local;
pub mod wait_remote;

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;

use crate::home::{self, HomeError};
use crate::hub::{self, Hub, Reply};

pub(crate) use args::parse_duration;
pub use args::{
    Cli, Command, CreateArgs, DeviceCommand, McpTokenCommand, NewArgs, RunArgs, SessionCommand,
    WaitCommand,
};

/// What `cortex` reads from its environment besides its flags.
#[derive(Debug, Clone)]
pub struct CortexEnv {
    /// `WEBHOOK_PORT`
    pub webhook_port: Option<String>,
    /// `CORTEX_WEBHOOK_TOKEN`
    pub token: Option<String>,
    /// `$CORTEX_HOME`, default `~/.cortex`
    pub cortex_home: Result<PathBuf, HomeError>,
    /// `$USER` (else `$LOGNAME`): names the default session of remote waits.
    pub user: Option<String>,
    pub term: Term,
}

/// What `cortex` knows of the terminal it runs in.
#[derive(Debug, Clone, Copy, Default)]
pub struct Term {
    pub stdin_tty: bool,
    pub stdout_tty: bool,
    /// Columns: the terminal's (stdout's), else `$COLUMNS`, when known.
    pub width: Option<usize>,
    /// Catch Ctrl-C in `cortex chat` to end it with status 0 (off in unit tests, which
    /// share one process).
    pub catch_interrupt: bool,
}

impl Term {
    pub fn from_process() -> Term {
        use std::io::IsTerminal;
        let stdout = std::io::stdout();
        let width = rustix::termios::tcgetwinsize(&stdout)
            .ok()
            .map(|w| usize::from(w.ws_col))
            .filter(|w| *w > 0)
            .or_else(|| {
                std::env::var("COLUMNS")
                    .ok()
                    .and_then(|c| c.trim().parse().ok())
            });
        Term {
            stdin_tty: std::io::stdin().is_terminal(),
            stdout_tty: stdout.is_terminal(),
            width,
            catch_interrupt: true,
        }
    }

    /// The width notes are cut to.
    pub fn columns(&self) -> usize {
        self.width.unwrap_or(100).max(20)
    }
}

impl CortexEnv {
    pub fn from_process() -> Self {
        CortexEnv {
            webhook_port: std::env::var("WEBHOOK_PORT").ok(),
            token: std::env::var("CORTEX_WEBHOOK_TOKEN").ok(),
            cortex_home: home::cortex_home(),
            user: std::env::var("USER")
                .or_else(|_| std::env::var("LOGNAME"))
                .ok(),
            term: Term::from_process(),
        }
    }
}

/// Every command's exit status when the hub cannot be reached: the wait contract's "broke"
/// (the hub lost), so one code means "no hub" whatever the command.
pub const UNREACHABLE: u8 = 2;

/// Runs one command and returns the process's exit status; errors are printed on `err`.
pub fn run(cli: &Cli, env: &CortexEnv, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    // Inside `cortex wait …`, 1 means "timed out"; any failure there is 2 ("broke").
    let failed = match cli.command {
        Command::Wait(_) => wait_exit::BROKE,
        _ => 1,
    };
    match execute(cli, env, out, err) {
        Ok(code) => code,
        // The reader went away (`cortex sessions | head -3`): what it wanted it got, so
        // stop quietly, as other Unix tools do.
        Err(e) if closed_pipe(&e) => 0,
        Err(e) => {
            let _ = writeln!(err, "cortex: {e:#}");
            if unreachable(&e) { UNREACHABLE } else { failed }
        }
    }
}

/// Did writing the output fail because its reader closed the pipe?
pub fn closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Did the command fail because the hub could not be reached?
fn unreachable(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<hub::HubError>(),
            Some(hub::HubError::Unreachable { .. })
        )
    })
}

fn execute(
    cli: &Cli,
    env: &CortexEnv,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<u8> {
    if let Command::Completion { shell } = &cli.command {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        clap_complete::generate(*shell, &mut cmd, "cortex", out);
        return Ok(0);
    }
    // The command runs whether or not a hub is there to hear of it.
    if let Command::Run(args) = &cli.command {
        let hub = connect(cli.hub.as_deref(), env);
        return Ok(run::run(
            hub,
            args,
            env.user.as_deref(),
            &env.cortex_home,
            err,
        ));
    }
    // Local waits need no hub: no address, no token.
    if let Command::Wait(WaitCommand::Local(w)) = &cli.command
        && w.device().is_none()
    {
        return Ok(wait_local::run(w, out, err));
    }
    let hub = connect(cli.hub.as_deref(), env)?;
    if let Command::Mcp { session } = &cli.command {
        let input = std::io::BufReader::new(std::io::stdin());
        return Ok(mcp::run(
            hub,
            session.clone(),
            input,
            Box::new(std::io::stdout()),
            err,
        ));
    }
    let json = cli.json;
    match &cli.command {
        Command::Sessions => sessions::list(&hub, json, out)?,
        Command::Waits => wait::armed(&hub, json, out)?,
        Command::Session(SessionCommand::New(args)) => {
            let body = sessions::create_body(args, &mut || {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map(|_| s)
            })?;
            sessions::new(&hub, &body, json, out)?
        }
        Command::Session(SessionCommand::Say {
            sid,
            text,
            now,
            dedupe_key,
            follow,
            reasoning,
        }) => {
            let post = sessions::Post {
                sid,
                text,
                now: *now,
                dedupe_key: dedupe_key.clone(),
            };
            if *follow {
                return sessions::say_follow(&hub, &post, *reasoning, json, &env.term, out, err);
            }
            sessions::say(&hub, &post, json, out, err)?
        }
        Command::Session(SessionCommand::Delete { sid }) => sessions::delete(&hub, sid, json, out)?,
        Command::Session(SessionCommand::Compact { sid }) => {
            sessions::compact(&hub, sid, json, out)?
        }
        Command::Session(SessionCommand::Cancel { sid, turn }) => {
            people::cancel(&hub, sid, *turn, json, out)?
        }
        Command::Approvals => people::list(&hub, json, out)?,
        Command::Answer {
            sid,
            request_id,
            decision,
            always,
            args,
            data,
        } => {
            let body = people::answer_body(
                request_id,
                decision,
                *always,
                args.as_deref(),
                data.as_deref(),
            )?;
            people::answer(&hub, sid, &body, json, out)?
        }
        Command::Session(SessionCommand::Result { sid }) => {
            return sessions::result(&hub, sid, json, out, err);
        }
        Command::Chat { sid, reasoning } => {
            let input = Box::new(std::io::BufReader::new(std::io::stdin()));
            return chat::run(&hub, sid, *reasoning, &env.term, input, out, err);
        }
        Command::Session(SessionCommand::Events { sid, after, follow }) => {
            sessions::events(&hub, sid, *after, *follow, json, out, err)?
        }
        Command::Devices => devices::list(&hub, json, out)?,
        Command::Device(DeviceCommand::Add { name }) => devices::add(&hub, name, json, out)?,
        Command::McpToken(McpTokenCommand::Add { name }) => mcp_tokens::add(&hub, name, json, out)?,
        Command::McpToken(McpTokenCommand::List) => mcp_tokens::list(&hub, json, out)?,
        Command::McpToken(McpTokenCommand::Revoke { name }) => {
            mcp_tokens::revoke(&hub, name, json, out)?
        }
        Command::Device(DeviceCommand::Revoke { name, remove }) => {
            devices::revoke(&hub, name, *remove, json, out)?
        }
        Command::Device(DeviceCommand::Remove { name }) => devices::remove(&hub, name, json, out)?,
        Command::Wait(WaitCommand::Create(args)) => wait::create(&hub, args, json, out)?,
        Command::Wait(WaitCommand::Check { session, wp }) => {
            wait::check(&hub, session.as_deref(), wp.as_deref(), json, out)?
        }
        Command::Wait(WaitCommand::Cancel { wp }) => wait::cancel(&hub, wp, json, out)?,
        Command::Wait(WaitCommand::For {
            wp,
            timeout,
            after,
            consumer,
        }) => {
            let from = match (after, consumer) {
                (Some(seq), _) => wait_for::From::After(*seq),
                (None, Some(name)) => {
                    if let Err(why) = cortex_protocol::api::check_consumer_name(name) {
                        let _ = writeln!(err, "cortex: --consumer: {why}");
                        return Ok(wait_exit::BROKE);
                    }
                    wait_for::From::Consumer(name.clone())
                }
                (None, None) => wait_for::From::Now,
            };
            return Ok(wait_for::run_from(&hub, wp, *timeout, from, out, err));
        }
        Command::Wait(WaitCommand::Local(w)) => {
            return Ok(wait_remote::run(&hub, w, env.user.as_deref(), out, err));
        }
        Command::Run(_) | Command::Completion { .. } | Command::Mcp { .. } => {}
    }
    Ok(0)
}

/// The hub's base URL: the flag (or `CORTEX_HUB`, either one URL or several separated by
/// commas, tried in order: [`Hub::new`]), else loopback on `WEBHOOK_PORT`, else the address
/// the running hub wrote to `$CORTEX_HOME/hub/url` (`from_file`), else loopback on port 3001.
pub fn hub_url(
    flag: Option<&str>,
    webhook_port: Option<&str>,
    from_file: Option<&str>,
) -> anyhow::Result<String> {
    if let Some(url) = flag.map(str::trim).filter(|u| !u.is_empty()) {
        return Ok(url.to_string());
    }
    let port = match webhook_port.map(str::trim).filter(|p| !p.is_empty()) {
        None => match from_file.map(str::trim).filter(|u| !u.is_empty()) {
            Some(url) => return Ok(url.to_string()),
            None => cortex_protocol::DEFAULT_WEBHOOK_PORT,
        },
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => anyhow::bail!(
                "WEBHOOK_PORT={p:?} is not a port number; set it to the hub's port (default 3001) or pass --hub URL"
            ),
        },
    };
    Ok(format!("http://127.0.0.1:{port}"))
}

fn connect(flag: Option<&str>, env: &CortexEnv) -> anyhow::Result<Hub> {
    let from_file = env
        .cortex_home
        .as_ref()
        .ok()
        .and_then(|h| home::hub_url_from_file(h));
    let url = hub_url(flag, env.webhook_port.as_deref(), from_file.as_deref())?;
    let token = hub::load_token(env.token.as_deref(), &env.cortex_home)?;
    Hub::new(&url, &token).context("--hub / CORTEX_HUB")
}

/// The hub's words about a request's fields, told in the flags the user typed: `set
/// max_signals above 1` becomes `set --max-signals above 1`. A field with `_` or `.` is
/// replaced wherever it stands as a word; a plain one (`coalesce`, `label`) only where it
/// opens the message, since elsewhere it is likely just a word.
pub fn in_flags(message: &str, fields: &[(&str, &str)]) -> String {
    let mut s = message.to_string();
    for (field, flag) in fields {
        if field.contains(['_', '.']) {
            s = replace_word(&s, field, flag);
        } else if let Some(rest) = s.strip_prefix(field)
            && rest.starts_with([' ', ':', ','])
        {
            s = format!("{flag}{rest}");
        }
    }
    s
}

/// `text` with each whole-word `word` (not inside a longer name) replaced by `by`.
fn replace_word(text: &str, word: &str, by: &str) -> String {
    let inside = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(word) {
        let before = if i > 0 {
            rest[..i].chars().last()
        } else {
            out.chars().last()
        };
        let after = rest[i + word.len()..].chars().next();
        out.push_str(&rest[..i]);
        out.push_str(if inside(before) || inside(after) {
            word
        } else {
            by
        });
        rest = &rest[i + word.len()..];
    }
    out.push_str(rest);
    out
}

/// A refusal from the hub (4xx) with its message told in flags; other errors as they are.
pub fn refusal_in_flags(e: hub::HubError, fields: &[(&str, &str)]) -> anyhow::Error {
    match e {
        hub::HubError::Api {
            status,
            error,
            message,
        } if (400..500).contains(&status) && status != 401 => hub::HubError::Api {
            status,
            error,
            message: in_flags(&message, fields),
        }
        .into(),
        other => other.into(),
    }
}

/// `--json`: the hub's answer exactly as it came, on one line of its own.
fn print_raw(out: &mut dyn Write, reply: &Reply) -> anyhow::Result<()> {
    writeln!(out, "{}", reply.text()).context("writing the output")
}

/// `--json` for a listing: every listing prints a JSON array, whatever object the route
/// wraps it in (`{"approvals": [...]}`, `{"waitpoints": [...]}`); the items as they came.
fn print_list(out: &mut dyn Write, reply: &Reply, field: &str, what: &str) -> anyhow::Result<()> {
    let v: serde_json::Value = reply.json(what)?;
    let items = match v {
        serde_json::Value::Array(_) => v,
        mut obj => obj
            .get_mut(field)
            .map(serde_json::Value::take)
            .filter(serde_json::Value::is_array)
            .with_context(|| format!("the hub's answer to {what} has no {field} list"))?,
    };
    writeln!(out, "{items}").context("writing the output")
}

/// Left-aligned columns, two spaces apart; the last column is not padded.
fn table(out: &mut dyn Write, header: &[&str], rows: &[Vec<String>]) -> anyhow::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        s
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for row in rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

/// Cuts `s` to `max` characters on its first line, marking the cut.
fn short(s: &str, max: usize) -> String {
    let first = s.lines().next().unwrap_or_default();
    let more = first.len() < s.trim_end().len();
    match first.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &first[..i]),
        None if more => format!("{first} …"),
        None => first.to_string(),
    }
}

#[cfg(test)]
mod tests;
