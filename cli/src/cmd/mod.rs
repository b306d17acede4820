//! The `cortex` command line: its flags and subcommands, and the dispatch to each command's
//! module. The binary only parses the command line and calls [`run`]; the environment comes
//! in as a [`CortexEnv`] and output goes to the writers it is given.

pub mod chat;
pub mod devices;
pub mod follow;
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
use std::time::Duration;

use anyhow::Context;
use clap::{ArgAction, Args, Parser, Subcommand};
use cortex_protocol::api::Quorum;

use crate::home::{self, HomeError};
use crate::hub::{self, Hub, Reply};
use crate::timefmt;

const AFTER_HELP: &str = "\
Examples:
  sid=$(cortex session new --title nightly)
  cortex wait create --session $sid --label train --intent \"compare the loss\"
  cortex wait for wp_1a2b3c4d5e6f --timeout 8h
  cortex wait pid 4242 --device gpu1

The hub's address: --hub URL, else $CORTEX_HUB, else http://127.0.0.1:$WEBHOOK_PORT, else the
address a running hub wrote to $CORTEX_HOME/hub/url, else http://127.0.0.1:3001.
The operator token: $CORTEX_WEBHOOK_TOKEN, else the file $CORTEX_HOME/hub/token (CORTEX_HOME
defaults to ~/.cortex).

Exit status: 0 done; 1 failed; 2 the hub could not be reached (every command). Every
`cortex wait …` exits 2 when it fails, and the waits follow the wait contract: 0 fired,
1 timed out (or the waitpoint expired), 2 broke (cancelled, unknown, the hub or device lost,
a bad argument); `cortex wait for` and waits with --device exit 3 when the waitpoint fired
and the job reported failure. `cortex wait pid|file|flock|log|any` wait on this machine and
need no hub; with --device NAME they wait on that device, through the hub and its agent.
`cortex session say --follow` exits with its run's outcome: 0 ok, 1 failed, 2 nothing
answers (see its --help). A closed pipe on stdout (`cortex sessions | head -3`) ends a
command quietly: 0, or a wait's own outcome.";

const SAY_AFTER_HELP: &str = "\
Examples:
  cortex session say ses_8a1e2f3b4c5d \"the run finished; compare the loss\"
  cortex session say ses_8a1e2f3b4c5d \"what is left to do?\" --follow

With --follow, the exit status is the run's: 0 when the run that took the message ended ok,
1 when it ended with an error (its code and message on stderr), 2 when nothing will answer
(the hub runs no model: it has no CORTEX_LLM_BASE_URL), the session is gone, or the stream
was lost and could not be resumed. With --json too, stdout is the hub's answer to the post and
then every event of that run (live pieces included), one JSON object a line.";

const FOR_AFTER_HELP: &str = "\
Examples:
  cortex wait for wp_1a2b3c4d5e6f --timeout 8h
  cortex wait for wp_1a2b3c4d5e6f > wake.json; echo $?
  while cortex wait for wp_1a2b3c4d5e6f --consumer deploy; do ./on-report.sh; done
  cortex wait for wp_1a2b3c4d5e6f --after 41     # the first wake after seq 41

Every wake, however early it came, is seen by a loop that names a --consumer (the hub
keeps its position) or passes --after the `seq` of the wake it last printed; without
either, the next wake. The last stderr line names the seq to resume after.

Exit status (the wait contract): 0 fired (the job reported ok, or a monitor's report),
1 timed out (its --timeout passed, or the waitpoint expired), 2 broke (cancelled, unknown,
the hub never reached, or lost and not back within the bound; with a cursor, an ended
waitpoint with no wake after it), 3 fired and the job reported failure (the wake's reason
is `failed`), 4 the job went silent (the waitpoint's silence_after passed with no signal;
it stays armed).";

/// The cortex command line: sessions and waitpoints on a cortex hub
#[derive(Debug, Parser)]
#[command(name = "cortex", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// The hub's address [default: http://127.0.0.1:$WEBHOOK_PORT]
    #[arg(long, global = true, env = "CORTEX_HUB", value_name = "URL")]
    pub hub: Option<String>,

    /// Print the hub's JSON instead of a table
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the sessions, newest first: id, title, state (running, idle, waiting on a
    /// machine, waiting on you, failed, cancelled), kind (agent or mailbox), armed
    /// waitpoints, created
    #[command(
        after_help = "Examples:\n  cortex sessions\n  cortex sessions --json | jq -r '.[] | select(.state == \"waiting_on_you\") | .id'"
    )]
    Sessions,
    /// List the armed waitpoints of every session, oldest first: what the hub still
    /// waits on
    #[command(after_help = "Examples:\n  cortex waits\n  cortex waits --json | jq -r '.[].id'")]
    Waits,
    /// Create a session, post a message to one, read its events, delete one
    #[command(
        subcommand,
        after_help = "Examples:\n  cortex session new --title nightly\n  cortex session events ses_8a1e2f3b4c5d --follow"
    )]
    Session(SessionCommand),
    /// Waitpoints (arm, check, cancel, block until one wakes), and waits for a pid, a file
    /// or a lock, on this machine or on a device
    #[command(
        subcommand,
        after_help = "Examples:\n  cortex wait create --session ses_8a1e2f3b4c5d --label train --intent \"compare the loss\"\n  cortex wait for wp_1a2b3c4d5e6f\n  cortex wait pid 4242 --device gpu1\n\nExit status: 0 fired, 1 timed out (or expired), 2 broke (or the hub could not be reached),\n3 fired and the job reported failure (`wait for` and waits with --device)."
    )]
    Wait(WaitCommand),
    /// List the devices: state (revoked ones too), host (hostname, CPUs, kernel), GPUs,
    /// since, last seen, agent version, spool counts, waits
    #[command(
        after_help = "Examples:\n  cortex devices\n  cortex devices --json | jq '.[] | {name, host}'"
    )]
    Devices,
    /// Enrol a device (prints its token once), revoke one, or remove a revoked one from
    /// the list
    #[command(
        subcommand,
        after_help = "Examples:\n  cortex device add gpu1\n  cortex device revoke gpu1\n  cortex device remove gpu1"
    )]
    Device(DeviceCommand),
    /// What waits on a person across sessions (approvals and questions), and how to
    /// answer each
    #[command(after_help = "Examples:\n  cortex approvals\n  cortex approvals --json")]
    Approvals,
    /// Answer an approval (allow or deny, optionally for the rest of the session, or with
    /// edited arguments) or a question (allow --data JSON)
    #[command(
        after_help = "Examples:\n  cortex answer ses_8a1e2f3b4c5d req_1f2e3d allow --always\n  cortex answer ses_8a1e2f3b4c5d req_1f2e3d deny\n  cortex answer ses_8a1e2f3b4c5d req_9a8b7c allow --data '{\"answers\": [\"yes\"]}'"
    )]
    Answer {
        /// The session (ses_…)
        #[arg(value_name = "SID")]
        sid: String,
        /// The request (req_…), as `cortex approvals` lists it
        #[arg(value_name = "REQUEST_ID")]
        request_id: String,
        /// allow or deny
        #[arg(value_name = "allow|deny", value_parser = ["allow", "deny"])]
        decision: String,
        /// Allow this tool for the rest of the session
        #[arg(long)]
        always: bool,
        /// Run the call with these arguments instead (a JSON object)
        #[arg(long, value_name = "JSON")]
        args: Option<String>,
        /// A question's answers (JSON, e.g. '{"answers": ["yes"]}')
        #[arg(long, value_name = "JSON")]
        data: Option<String>,
    },
    /// Talk with the model a session runs: each line you type is a message; its answers,
    /// tool calls and wakes print as they happen. Ctrl-D or Ctrl-C ends it.
    #[command(
        after_help = "Examples:\n  cortex chat ses_8a1e2f3b4c5d\n  cortex chat ses_8a1e2f3b4c5d --reasoning"
    )]
    Chat {
        /// The session (ses_…); make one with `cortex session new --instructions …`
        #[arg(value_name = "SID")]
        sid: String,
        /// Show the model's reasoning too (dimmed on a terminal)
        #[arg(long)]
        reasoning: bool,
    },
    /// Run a command and wake a session when it ends: arms a waitpoint, runs CMD with
    /// CORTEX_SIGNAL_ID, CORTEX_SIGNAL_SECRET and CORTEX_HUB set, and signals its exit
    /// status (spooled if the hub is away). Exits with the command's status.
    #[command(after_help = RUN_AFTER_HELP)]
    Run(RunArgs),
    /// Print shell completions for cortex (bash, zsh, fish, elvish, powershell)
    #[command(
        after_help = "Examples:\n  cortex completion bash > ~/.local/share/bash-completion/completions/cortex\n  cortex completion zsh > \"${fpath[1]}/_cortex\"\n  cortex completion fish > ~/.config/fish/completions/cortex.fish"
    )]
    Completion {
        /// The shell
        #[arg(value_name = "SHELL", value_enum)]
        shell: clap_complete::Shell,
    },
}

const RUN_AFTER_HELP: &str = "\
Examples:
  cortex run -- python train.py --epochs 3
  cortex run --label nightly --session ses_8a1e2f3b4c5d -- make -j8 test

The command runs even when no waitpoint can be armed (said on stderr). SIGTERM, SIGHUP and
SIGQUIT are passed to the command; Ctrl-C reaches it from the terminal.

Exit status: the command's (128+N when signal N ended it; 127 not found, 126 not runnable).";

/// `cortex run`'s flags and the command.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The session the wake goes to [default: this user's `cortex waits (USER)` session]
    #[arg(long, env = "CORTEX_SESSION", value_name = "SID")]
    pub session: Option<String>,
    /// Short name shown on the wake [default: the program's name]
    #[arg(long, value_name = "L")]
    pub label: Option<String>,
    /// What the session does when it wakes [default: the command line]
    #[arg(long, value_name = "I")]
    pub intent: Option<String>,
    /// The waitpoint's deadline (90s, 45m, 6h, 2d) [default: 7d, at most 30d]
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub expires_in: Option<Duration>,
    /// The command and its arguments, after `--`
    #[arg(value_name = "CMD", required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Subcommand)]
pub enum DeviceCommand {
    /// Enrol a device: print its token (shown this once) and the line that starts its agent
    #[command(
        after_help = "Examples:\n  cortex device add gpu1\n  cortex device add gpu1 --json   # {name, token, install}"
    )]
    Add {
        /// The device's name: letters, digits, `-` and `_` (the agent's --name)
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// Revoke a device's token and drop its link at once
    #[command(
        after_help = "Examples:\n  cortex device revoke gpu1\n  cortex device revoke gpu1 --remove   # and drop it from the list\n\nExit status: 0 revoked; 1 already revoked (nothing changed) or no such device."
    )]
    Revoke {
        /// The device, as `cortex devices` lists it
        #[arg(value_name = "NAME")]
        name: String,
        /// Also remove it from the list (as `cortex device remove`); a device already
        /// revoked is then only removed
        #[arg(long)]
        remove: bool,
    },
    /// Remove a revoked device from the list (`cortex devices` shows revoked ones until
    /// then); an enrolled device is refused: revoke it first
    #[command(
        after_help = "Examples:\n  cortex device remove gpu1\n\nExit status: 0 removed; 1 not revoked, or no such revoked device."
    )]
    Remove {
        /// The revoked device, as `cortex devices` lists it
        #[arg(value_name = "NAME")]
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Create a session and print its id: an agent session (a model answers its messages
    /// and wakes) with any agent flag or --runs, else a mailbox (recorded, never answered)
    #[command(
        after_help = "Examples:\n  cortex session new --title nightly              # a mailbox, for scripts and waits\n  cortex session new --instructions @prompt.md --schema @answer.schema.json\n  cortex session new --runs --allow ''             # a model on the defaults, shown no tools"
    )]
    New(NewArgs),
    /// Post a message to a session (read at its next turn, or now); with --follow, print
    /// the answer of the model the hub runs as it streams
    #[command(after_help = SAY_AFTER_HELP)]
    Say {
        /// The session (ses_…)
        #[arg(value_name = "SID")]
        sid: String,
        /// The message
        #[arg(value_name = "TEXT")]
        text: String,
        /// Deliver it now rather than at the next turn
        #[arg(long)]
        now: bool,
        /// Post at most once per key (a retry with the same key is a duplicate)
        #[arg(long, value_name = "K")]
        dedupe_key: Option<String>,
        /// Print the answer as it streams (tool calls and notes on stderr), until the run
        /// that takes this message ends
        #[arg(long)]
        follow: bool,
        /// With --follow: show the model's reasoning too
        #[arg(long, requires = "follow")]
        reasoning: bool,
    },
    /// Stop a session: its turn at once (what the model said so far is kept), or with
    /// --turn only that turn; without --turn the session ends (its waitpoints and timers
    /// are cancelled and it takes no more messages)
    #[command(
        after_help = "Examples:\n  cortex session cancel ses_8a1e2f3b4c5d --turn\n  cortex session cancel ses_8a1e2f3b4c5d"
    )]
    Cancel {
        /// The session (ses_…)
        #[arg(value_name = "SID")]
        sid: String,
        /// Stop only the running turn; the next message starts a new one
        #[arg(long)]
        turn: bool,
    },
    /// Compact a session's transcript now: its older part is summarized by the model (the
    /// prefix and the newest messages kept) and the requests from then on carry the
    /// summary; waits for the runner's answer and prints what it saved
    #[command(after_help = "Examples:\n  cortex session compact ses_8a1e2f3b4c5d")]
    Compact {
        /// The session (ses_…)
        #[arg(value_name = "SID")]
        sid: String,
    },
    /// Delete a session: its events and waitpoints go (armed ones are cancelled first, so
    /// a late signal is told "already resolved")
    #[command(after_help = "Examples:\n  cortex session delete ses_8a1e2f3b4c5d")]
    Delete {
        /// The session (ses_…)
        #[arg(value_name = "SID")]
        sid: String,
    },
    /// Print the answer of the session's last run (--json: the whole result and its meta)
    #[command(
        after_help = "Examples:\n  cortex session result ses_8a1e2f3b4c5d\n  cortex session result ses_8a1e2f3b4c5d --json | jq .result.output.data\n\nExit status: 0 the run ended ok, 1 it failed (its error on stderr)."
    )]
    Result {
        /// The session (ses_…)
        #[arg(value_name = "SID")]
        sid: String,
    },
    /// Print a session's events, one a line
    #[command(
        after_help = "Examples:\n  cortex session events ses_8a1e2f3b4c5d\n  cortex session events ses_8a1e2f3b4c5d --after 40 --follow\n  cortex --json session events ses_8a1e2f3b4c5d | jq -c 'select(.kind == \"wake\")'"
    )]
    Events {
        /// The session (ses_…)
        #[arg(value_name = "SID")]
        sid: String,
        /// Only events after this seq
        #[arg(long, value_name = "N", default_value_t = 0)]
        after: u64,
        /// Keep printing new events as they come (long polls)
        #[arg(long)]
        follow: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum WaitCommand {
    /// Arm a waitpoint; print its id, its secret (shown this once) and how to signal it
    #[command(
        after_help = "Examples:\n  cortex wait create --session ses_8a1e2f3b4c5d --label train --intent \"compare the loss\"\n  cortex wait create --label sweep --intent \"pick the best arm\" --members arm1,arm2,arm3 --quorum all\n  cortex wait create --label gpu1-job --intent \"read its log\" --device gpu1 --silence-after 20m\n\nA --device the hub does not know is refused in one line (exit 2) before anything is armed."
    )]
    Create(CreateArgs),
    /// Show one waitpoint (with its signals, wakes and badges), or every waitpoint of a
    /// session
    #[command(
        after_help = "Examples:\n  cortex wait check wp_1a2b3c4d5e6f\n  cortex wait check --session ses_8a1e2f3b4c5d\n  cortex --json wait check wp_1a2b3c4d5e6f"
    )]
    Check {
        /// The session whose waitpoints to list
        #[arg(long, env = "CORTEX_SESSION", value_name = "SID")]
        session: Option<String>,
        /// One waitpoint (then --session is not needed)
        #[arg(value_name = "WP_ID")]
        wp: Option<String>,
    },
    /// Disarm a waitpoint (the job it waits on keeps running)
    #[command(after_help = "Examples:\n  cortex wait cancel wp_1a2b3c4d5e6f")]
    Cancel {
        /// The waitpoint (wp_…), as `cortex wait check` lists it
        #[arg(value_name = "WP_ID")]
        wp: String,
    },
    /// Block until the waitpoint's next wake (or the first after a cursor) and print it as
    /// one JSON line (exit 0 fired, 1 timed out or expired, 2 broke, 3 fired with the job's
    /// failure, 4 silent)
    #[command(after_help = FOR_AFTER_HELP)]
    For {
        /// The waitpoint (wp_…), as `cortex wait create` printed it
        #[arg(value_name = "WP_ID")]
        wp: String,
        /// Give up after this long (30s, 10m, 2h, 1.5h, or seconds)
        /// [default: until the waitpoint's expiry plus 2 minutes]
        #[arg(long, value_name = "DUR", value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// Print the first wake after this session event seq (a printed wake's `seq`),
        /// even one that came before this command started
        #[arg(long, value_name = "SEQ", conflicts_with = "consumer")]
        after: Option<u64>,
        /// Read as this named consumer: from the position the hub keeps for it (its first
        /// use: the waitpoint's first wake), moved to each wake once printed, so a loop
        /// sees every wake once
        #[arg(long, value_name = "NAME")]
        consumer: Option<String>,
    },
    #[command(flatten)]
    Local(wait_local::LocalWait),
}

#[derive(Debug, Clone, Args)]
pub struct NewArgs {
    /// A title shown in listings
    #[arg(long, value_name = "T")]
    pub title: Option<String>,
    /// What the model is told first (its system message): the text itself, or @FILE to
    /// read a file, @- to read stdin (@@… for text that starts with @) [default: the hub's]
    #[arg(long, value_name = "TEXT|@FILE")]
    pub instructions: Option<String>,
    /// A worked example for the model: @FILE (or @-) holding a JSON array of OpenAI chat
    /// messages, placed after the instructions
    #[arg(long, value_name = "@FILE")]
    pub examples: Option<String>,
    /// The most tokens one model call may generate [default: the hub's]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,
    /// Tools that wait for a person's approval (comma-separated; * for all)
    /// [default: the hub's, else device_exec]
    #[arg(long, value_name = "TOOLS", value_delimiter = ',')]
    pub require_approval: Option<Vec<String>>,
    /// Tools refused outright (comma-separated)
    #[arg(long, value_name = "TOOLS", value_delimiter = ',')]
    pub deny: Option<Vec<String>>,
    /// Only these tools are shown to the model and run (comma-separated); the others are
    /// refused. --allow '' shows it no tools at all
    #[arg(long, value_name = "TOOLS", value_delimiter = ',')]
    pub allow: Option<Vec<String>>,
    /// An approval not answered within this long denies the call (30s, 10m, 2h)
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub approval_timeout: Option<Duration>,
    /// Nobody answers: a turn that needs a person ends with needs_human
    #[arg(long)]
    pub unattended: bool,
    /// A typed answer: @FILE (or @-) holding the JSON Schema of the answer's data; every
    /// run then ends in {response?, data, reasoning?} checked against it
    #[arg(long, value_name = "@FILE")]
    pub schema: Option<String>,
    /// How the typed answer travels from the model [default: auto, what the model server
    /// enforces best]
    #[arg(long, value_name = "auto|emit|respond|native", requires = "schema", value_parser = parse_strategy)]
    pub strategy: Option<cortex_protocol::api::OutputStrategy>,
    /// A model runs turns for it on the hub's defaults, with no other agent flag (any of
    /// --instructions, --examples, --max-tokens, --allow, --deny, --require-approval,
    /// --approval-timeout, --unattended, --schema implies it). Without any, the session
    /// is a mailbox: its messages and wakes are recorded and no turn runs
    #[arg(long)]
    pub runs: bool,
}

fn parse_strategy(v: &str) -> Result<cortex_protocol::api::OutputStrategy, String> {
    serde_json::from_value(serde_json::Value::String(v.trim().to_ascii_lowercase()))
        .map_err(|_| format!("{v:?} is not a strategy; give auto, emit, respond or native"))
}

#[derive(Debug, Clone, Args)]
pub struct CreateArgs {
    /// The session the wake goes to
    #[arg(long, env = "CORTEX_SESSION", value_name = "SID")]
    pub session: Option<String>,
    /// Short name shown on the wake
    #[arg(long, value_name = "L")]
    pub label: String,
    /// What you are waiting for and what to do next; repeated back on the wake
    #[arg(long, value_name = "I")]
    pub intent: String,
    /// A job that will report (repeatable); every signal must then name one
    #[arg(long = "member", value_name = "NAME", action = ArgAction::Append)]
    pub member: Vec<String>,
    /// Members as one comma-separated list
    #[arg(long, value_name = "A,B,C", value_delimiter = ',')]
    pub members: Vec<String>,
    /// How many terminal signals resolve it: a number or `all`
    /// [default: all with members, otherwise 1]
    #[arg(long, value_name = "N|all", value_parser = parse_quorum)]
    pub quorum: Option<Quorum>,
    /// Wake on the first fail even if the quorum is not met [default: true]
    #[arg(long, value_name = "true|false", action = ArgAction::Set)]
    pub fail_fast: Option<bool>,
    /// How many times it may wake you; above 1 it stays open as a monitor [default: 1]
    #[arg(long, value_name = "N")]
    pub max_signals: Option<u32>,
    /// Deadline in hours, fractional allowed [default: 168, at most 720]
    #[arg(long, value_name = "H", value_parser = parse_hours, conflicts_with = "expires_in")]
    pub expires_in_hours: Option<f64>,
    /// Deadline as a duration (90s, 45m, 6h, 2d) [default: 7d, at most 30d]; it expires at
    /// that moment, to the second
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub expires_in: Option<Duration>,
    /// The connected device the job runs on (its signal files are collected there)
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// Wake with reason `silent` when nothing, progress included, arrived for this long
    /// (once per quiet spell; at least 1s): like 20m, 1.5h or seconds
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub silence_after: Option<Duration>,
    /// A monitor's reports within this long of the first become one wake: like 30s
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub coalesce: Option<Duration>,
    /// A monitor that starts a new session for each wake, with these instructions (the
    /// text, @FILE, or @- for stdin; @@… for text that starts with @), instead of waking
    /// this one
    #[arg(long, value_name = "TEXT|@FILE")]
    pub spawn_instructions: Option<String>,
    /// The spawned sessions' title (each gets the wake's number) [default: the label]
    #[arg(long, value_name = "T", requires = "spawn_instructions")]
    pub spawn_title: Option<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    timefmt::parse_duration(s).map_err(|e| e.to_string())
}

fn parse_quorum(s: &str) -> Result<Quorum, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(Quorum::ALL);
    }
    match s.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(Quorum::Count(n)),
        _ => Err(format!(
            "{s:?} is not a quorum; give a number of signals (1 or more) or `all`"
        )),
    }
}

fn parse_hours(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(h) if h.is_finite() && h > 0.0 => Ok(h),
        _ => Err(format!(
            "{s:?} is not a number of hours above 0 (fractions like 0.5 are fine)"
        )),
    }
}

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
        Command::Run(_) | Command::Completion { .. } => {}
    }
    Ok(0)
}

/// The hub's base URL: the flag (or `CORTEX_HUB`), else loopback on `WEBHOOK_PORT`, else
/// the address the running hub wrote to `$CORTEX_HOME/hub/url` (`from_file`), else
/// loopback on port 3001.
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
