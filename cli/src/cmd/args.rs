//! The `cortex` command line: its flags, subcommands and help texts (clap), and the
//! parsers of the values they take.

use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};
use cortex_protocol::api::Quorum;

const AFTER_HELP: &str = "\
Examples:
  sid=$(cortex session new --title nightly)
  cortex wait create --session $sid --label train --intent \"compare the loss\"
  cortex wait for wp_1a2b3c4d5e6f --timeout 8h
  cortex wait pid 4242 --device gpu1

The hub's address: --hub URL, else $CORTEX_HUB, else http://127.0.0.1:$WEBHOOK_PORT, else the
address a running hub wrote to $CORTEX_HOME/hub/url, else http://127.0.0.1:3001. --hub and
$CORTEX_HUB may list several hubs, comma-separated (--hub http://a:3001,http://b:3001): a
request goes to the next when nothing reaches one (or it answers 503 store_unavailable),
and stays with the one that answered.
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
    /// The hub's address, or several comma-separated, tried in order [default:
    /// http://127.0.0.1:$WEBHOOK_PORT]
    #[arg(long, global = true, env = "CORTEX_HUB", value_name = "URL[,URL…]")]
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
    /// Serve MCP on stdin and stdout as the hub's /mcp: the line an MCP client (Claude
    /// Code, Codex, Cursor) starts to wait on cortex
    #[command(
        after_help = "Examples:\n  claude mcp add cortex -- cortex mcp\n  cortex mcp --session train-7   # every connection naming train-7 shares one session"
    )]
    Mcp {
        /// Name the session this client's waits are in: connections naming the same name
        /// share it, across restarts [default: one session per connection]
        #[arg(long, value_name = "NAME")]
        session: Option<String>,
    },
    /// Tokens that reach only the hub's /mcp, one per agent or client: make one (shown
    /// once), list them, revoke one
    #[command(
        name = "mcp-token",
        subcommand,
        after_help = "Examples:\n  cortex mcp-token add claude-laptop\n  cortex mcp-token list\n  cortex mcp-token revoke claude-laptop"
    )]
    McpToken(McpTokenCommand),
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
pub enum McpTokenCommand {
    /// Make a token (printed this once; the hub keeps only its hash)
    #[command(
        after_help = "Examples:\n  cortex mcp-token add claude-laptop\n  cortex mcp-token add ci --json   # {name, token}"
    )]
    Add {
        /// A name for whoever holds it
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// List the tokens' names
    #[command(after_help = "Examples:\n  cortex mcp-token list\n  cortex mcp-token list --json")]
    List,
    /// Revoke a token: it reaches nothing from now on
    #[command(after_help = "Examples:\n  cortex mcp-token revoke claude-laptop")]
    Revoke {
        /// The token's name, as `cortex mcp-token list` shows it
        #[arg(value_name = "NAME")]
        name: String,
    },
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
    Local(super::wait_local::LocalWait),
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

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::timefmt::parse_duration(s).map_err(|e| e.to_string())
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
