//! Sessions: creating one, its events, its runs and results, people's answers.

use serde::{Deserialize, Serialize};

use super::{
    AnswerItem, DeltaChannel, Observation, PendingRequest, RunInput, RunMeta, RunResult,
    SignalView, ToolCallView, Usage,
};

/// A session's `title`, at most (characters).
pub const MAX_TITLE_CHARS: usize = 200;
/// A message's `text`, at most (bytes of UTF-8).
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// A message's `dedupe_key`, at most (characters).
pub const MAX_DEDUPE_KEY_CHARS: usize = 200;

/// A session's `instructions`, at most (bytes of UTF-8).
pub const MAX_INSTRUCTIONS_BYTES: usize = 64 * 1024;
/// A session's `examples`, at most (messages).
pub const MAX_EXAMPLES: usize = 32;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the model is told first (the system message of the prefix); the hub's
    /// default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// A worked example: OpenAI chat messages placed in the prefix after the instructions
    /// (small models call tools only once the conversation holds an example of a call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examples: Option<Vec<serde_json::Value>>,
    /// The most tokens one model call may generate.
    #[serde(default, rename = "maxTokens", skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// When a run stops on its own (each absent bound: the hub's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopConfig>,
    /// Which tool calls run, which are refused and which wait for a person (each absent
    /// list: the hub's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Policy>,
    /// Nobody is there to answer: a turn that reaches an approval or a question ends with
    /// `needs_human` instead of waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unattended: Option<bool>,
    /// A typed answer: every run ends in an envelope whose `data` the schema checks.
    /// Without it the session is a chat agent (its answer is `response`, text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputConfig>,
    /// Whether a model runs turns for the session. `true`: an agent session (the hub's
    /// defaults fill what is not given); `false`: a mailbox, whose messages and wakes are
    /// recorded for a script to read and no turn ever runs (it takes none of the agent
    /// settings above). Absent: an agent session when any agent setting above is given
    /// (`instructions`, `examples`, `maxTokens`, `stop`, `policy`, `unattended`,
    /// `output`), else a mailbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<bool>,
}

impl CreateSession {
    /// The agent settings given, by their field names (what makes a session without
    /// `runs` an agent session).
    pub fn agent_settings(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let given = [
            (
                "instructions",
                self.instructions
                    .as_ref()
                    .is_some_and(|i| !i.trim().is_empty()),
            ),
            ("examples", self.examples.is_some()),
            ("maxTokens", self.max_tokens.is_some()),
            ("stop", self.stop.is_some()),
            ("policy", self.policy.is_some()),
            ("unattended", self.unattended.is_some()),
            ("output", self.output.is_some()),
        ];
        for (name, is) in given {
            if is {
                out.push(name);
            }
        }
        out
    }

    /// Whether the session asked for runs turns: `runs` when given, else whether any
    /// agent setting is.
    pub fn wants_runs(&self) -> bool {
        self.runs
            .unwrap_or_else(|| !self.agent_settings().is_empty())
    }
}

/// A session's output settings (`POST /api/sessions` `output`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OutputConfig {
    /// The JSON Schema of the envelope's `data`.
    pub schema: serde_json::Value,
    #[serde(default)]
    pub strategy: OutputStrategy,
    /// Every turn must be a tool call (`tool_choice: "required"`), so `respond` is the
    /// only exit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force_tool: bool,
    /// The schema documentation in the prompt: `"off"` for none, any other text to
    /// replace the one rendered from the schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc: Option<String>,
}

/// How the envelope travels from the model (`output.strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum OutputStrategy {
    /// The transport that enforces the most on the model server.
    #[default]
    Auto,
    /// The completion is the envelope, as raw JSON.
    Emit,
    /// The arguments of a `respond` tool (or an emitted envelope).
    Respond,
    /// The completion under the server's grammar (`response_format: json_schema`).
    Native,
}

/// The channel the envelope travels on, as `meta.strategy` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputTransport {
    /// The completion is the envelope, as raw JSON on the content channel.
    Emit,
    /// The arguments of a synthetic `respond` tool (or an emitted envelope).
    Respond,
    /// The content channel under the server's grammar (`response_format: json_schema`).
    Native,
}

impl OutputTransport {
    /// The word `meta.strategy` reports.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputTransport::Emit => "emit",
            OutputTransport::Respond => "respond",
            OutputTransport::Native => "native",
        }
    }
}

/// The gate before every tool call, as lists of tool names (`"*"`: every tool). A call
/// named in `deny` is refused; else one named in `requireApproval` waits for a person;
/// else, when `allow` is given, one not named there is refused; else it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Policy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_approval: Option<Vec<String>>,
    /// An approval not answered within this long denies the call (the model is told and
    /// goes on); none: it waits as long as it takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout_ms: Option<u64>,
}

/// A run's bounds; `steps` defaults to 20, `repeatedCalls` and `outputRetries` to 3, the
/// others to none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StopConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeated_calls: Option<u32>,
    /// Answers refused by the output schema that are sent back for another try (3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_retries: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SessionView {
    pub id: String,
    pub title: Option<String>,
    pub created_at: u64,
    /// Seq of the newest event (0 when there is none).
    pub last_seq: u64,
    /// How many of its waitpoints are armed.
    pub armed_waitpoints: u32,
    /// The wake that started this session (a `spawn` monitor's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned_from: Option<SpawnedFrom>,
    /// A model runs turns for it (an agent session); false: a mailbox, whose messages
    /// and wakes are only recorded. Absent (a hub from before mailboxes, which ran every
    /// session): true.
    #[serde(default = "yes")]
    pub runs: bool,
    /// What it is doing now, for people (`cortex sessions`, the page).
    #[serde(default)]
    pub state: SessionState,
    /// How a model runs it (`GET /api/sessions/{sid}` only; none for a mailbox). Never a
    /// secret: the hub's model key is not part of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<SessionConfig>,
}

fn yes() -> bool {
    true
}

/// What a session is doing now, most pressing first: `cancelled` (it takes no more
/// messages), `waiting_on_you` (an approval or a question waits for a person), `running`
/// (a turn is under way or queued, on a hub that runs a model), `failed` (its last run
/// ended with an error), `waiting_on_machine` (waitpoints are armed: a job or a device
/// will wake it), `idle` (nothing pending).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    Running,
    #[default]
    Idle,
    WaitingOnMachine,
    WaitingOnYou,
    Failed,
    Cancelled,
}

impl SessionState {
    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Running => "running",
            SessionState::Idle => "idle",
            SessionState::WaitingOnMachine => "waiting_on_machine",
            SessionState::WaitingOnYou => "waiting_on_you",
            SessionState::Failed => "failed",
            SessionState::Cancelled => "cancelled",
        }
    }

    /// As people read it.
    pub fn words(self) -> &'static str {
        match self {
            SessionState::Running => "running",
            SessionState::Idle => "idle",
            SessionState::WaitingOnMachine => "waiting on a machine",
            SessionState::WaitingOnYou => "waiting on you",
            SessionState::Failed => "failed",
            SessionState::Cancelled => "cancelled",
        }
    }
}

/// An agent session's configuration as fixed when it was made (the hub's defaults
/// filled in): `GET /api/sessions/{sid}` `config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionConfig {
    pub instructions: String,
    /// The model the hub's runner calls for it (none on a hub that runs no model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The worked example's chat messages.
    #[serde(default)]
    pub examples: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    pub stop: StopConfig,
    pub policy: Policy,
    /// The tools the model is shown (the policy applied to the built-in tools).
    #[serde(default)]
    pub tools: Vec<String>,
    pub unattended: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputConfig>,
    /// The transport chosen for `output` (`emit`, `respond` or `native`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
}

/// Where a spawned session came from: the monitor, its session and which of its wakes
/// (counted from 1, as the monitor's `wakes` lists them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SpawnedFrom {
    pub waitpoint: String,
    pub session: String,
    pub wake: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum When {
    #[default]
    NextTurn,
    Now,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PostMessage {
    pub text: String,
    #[serde(default)]
    pub when: When,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe_key: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct MessagePosted {
    pub seq: u64,
    /// True when `dedupe_key` matched an earlier post; `seq` is then that post's.
    pub duplicate: bool,
    /// True when a turn will take the message: the hub runs a model and the session is
    /// an agent session; false when nothing in the hub answers it (no model configured,
    /// or the session is a mailbox).
    #[serde(default)]
    pub runs: bool,
    /// The session is a mailbox (made without agent settings): no turn ever runs for it,
    /// whatever model the hub runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mailbox: bool,
}

/// One entry of a session's event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Event {
    pub seq: u64,
    pub ts: u64,
    #[serde(flatten)]
    pub body: EventBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum EventBody {
    /// A message for the agent (`POST /api/sessions/{sid}/messages`).
    Message {
        text: String,
        when: When,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dedupe_key: Option<String>,
    },
    /// A waitpoint woke the session.
    Wake(Box<Wake>),
    /// A waitpoint was armed in this session.
    WaitpointArmed { waitpoint: WaitpointRef },
    /// A waitpoint of this session was cancelled (`by`: "agent", "operator", "session-deleted").
    WaitpointCancelled { waitpoint: WaitpointRef, by: String },
    /// The runner took the session's inbox items up to `through` (inbox seq).
    InputTaken { through: u64 },
    /// A run (one turn) began, with what started it.
    RunStart {
        run_id: String,
        input: Vec<RunInput>,
    },
    /// A step of a run began: one model call, then its tool calls.
    StepStart { run_id: String, step: u32 },
    /// Text from the model. Live (`live: true`, only on a stream, never stored) as it
    /// arrives; stored once per step with the whole text, which a follower that saw the
    /// live pieces skips.
    ModelDelta {
        run_id: String,
        step: u32,
        text: String,
        channel: DeltaChannel,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        live: bool,
    },
    /// A tool call is about to run.
    ToolStart {
        run_id: String,
        step: u32,
        call: ToolCallView,
    },
    /// A tool call ended: its result or its error, as the model sees it.
    ToolEnd {
        run_id: String,
        step: u32,
        observation: Observation,
    },
    /// A model call is made again after `delay_ms`; consumers reset what they built from
    /// the attempt's deltas. `cause`: `provider` (the model server failed), `output` (the
    /// answer was refused by the output schema; `attempt` counts against
    /// `outputRetries`), `termination` (the turn ended in prose with no envelope; not
    /// counted).
    Retry {
        run_id: String,
        step: u32,
        cause: String,
        attempt: u32,
        issues: String,
        delay_ms: u64,
    },
    /// A piece of the answer's envelope as it streams (live only, never stored): the
    /// completion's text, or a `respond` call's arguments.
    OutputDelta {
        run_id: String,
        step: u32,
        text: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        live: bool,
    },
    /// The envelope as far as it has streamed, parsed (live only, never stored): each
    /// one replaces the last; a `retry` voids them.
    OutputPartial {
        run_id: String,
        step: u32,
        partial: serde_json::Value,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        live: bool,
    },
    /// A run ended.
    RunEnd {
        run_id: String,
        result: RunResult,
        meta: RunMeta,
    },
    /// A tool call waits for a person: an approval (the gate asked) or a question
    /// (`ask_user`). The session holds no task until it is answered
    /// (`POST /api/sessions/{sid}/answers` with `approval.id`).
    ApprovalRequired {
        run_id: String,
        step: u32,
        approval: PendingRequest,
    },
    /// An answer to a pending approval or question (an inbox item).
    Answer(Box<AnswerItem>),
    /// A stop (an inbox item): the session ends, or with `turn_only` only its turn.
    Cancel {
        #[serde(default)]
        turn_only: bool,
    },
    /// A timer the model set (`schedule_wakeup`) fired (an inbox item); its text is the
    /// next turn's message.
    Timer {
        name: String,
        text: String,
        dedupe_key: String,
    },
    /// A person asked for the session's transcript to be compacted now (an inbox item,
    /// `POST /api/sessions/{sid}/compact`); a `compaction` with `cause: forced` answers it.
    Compact {},
    /// A summary of the transcript's older part, computed beside the session's steps and
    /// posted back (an inbox item). The runner takes it only if it still matches what it
    /// was computed from; from then on a request carries the prefix, the summary and the
    /// messages from `through` on.
    Compaction(Box<Compaction>),
    /// A bound of settings.json `limits` held: a spawn refused when its wake came (in the
    /// log of the monitor's session), or a session's runs from wakes and timers put off
    /// (its inputs wait, unread by any model, until `until`). Not an inbox item.
    LimitReached {
        /// The setting's key, e.g. `spawnsPerHour`, `runsPerHour`.
        limit: String,
        /// What was refused or put off, the count against the bound, and what to do.
        message: String,
        /// When what was put off goes ahead (ms since the epoch); none for a refusal.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<u64>,
        /// The waitpoint whose wake it was (a refused spawn).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waitpoint: Option<WaitpointRef>,
    },
}

/// A `compaction` event: transcript positions `from..through` (and the summary before
/// them, if any) summarized into `summary`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Compaction {
    /// `threshold` (the next request neared the model's context), `refused` (the server
    /// refused a request for its size; the step is made again once) or `forced`.
    pub cause: String,
    /// The first transcript position summarized (after the prefix, or where the last
    /// summary ended).
    pub from: u64,
    /// The first position kept as it is.
    pub through: u64,
    /// A digest of the messages and the earlier summary it was computed from.
    pub digest: String,
    pub summary: String,
    /// The next request's estimated tokens without and with the summary.
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// The model's context, in tokens, the compaction was sized for.
    pub context_tokens: u64,
    /// The summary's model call: how long it took and what it used.
    pub elapsed_ms: u64,
    pub usage: Usage,
    /// Why there is no summary (nothing to compact, the model call failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WaitpointRef {
    pub id: String,
    pub label: String,
    pub intent: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum WakeReason {
    /// The waitpoint resolved (quorum met, all ok).
    Fired,
    /// The waitpoint resolved with a failure (fail_fast, or a fail in the set).
    Failed,
    /// The deadline passed before it resolved.
    Expired,
    /// A monitor's report (max_signals > 1), a coalesced burst of them, or the hub's own
    /// report on a waitpoint (the device running its remote wait has been offline past the
    /// grace; the wait stays armed).
    Report,
    /// No signal, progress included, arrived for the waitpoint's `silence_after`; the
    /// waitpoint stays armed.
    Silent,
}

impl WakeReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WakeReason::Fired => "fired",
            WakeReason::Failed => "failed",
            WakeReason::Expired => "expired",
            WakeReason::Report => "report",
            WakeReason::Silent => "silent",
        }
    }
}

/// The `wake` event: what the agent reads when a waitpoint wakes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Wake {
    pub waitpoint: WaitpointRef,
    pub reason: WakeReason,
    pub waited_ms: u64,
    pub signals: Vec<SignalView>,
    /// Signals carried by this wake but not listed (older heartbeats first).
    #[serde(default)]
    pub omitted: u64,
    /// The message exactly as the agent reads it; the payload framed as data.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct EventsPage {
    pub events: Vec<Event>,
}

/// `DELETE /api/sessions/{sid}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SessionDeleted {
    pub id: String,
    pub deleted: bool,
}

/// `POST /api/sessions/{sid}/cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct CancelPosted {
    /// The cancel's seq in the session's log.
    pub seq: u64,
    pub turn_only: bool,
    /// A driver was running the session and was told at once.
    pub running: bool,
}

/// `POST /api/sessions/{sid}/compact`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct CompactPosted {
    /// The ask's seq in the session's log; a `compaction` event after it answers it.
    pub seq: u64,
}
