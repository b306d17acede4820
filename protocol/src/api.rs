//! Bodies of the hub's HTTP API (`/api/...`). Times are milliseconds since the Unix epoch.

use serde::{Deserialize, Serialize};

use crate::signal::SignalStatus;

// ---------------------------------------------------------------- sessions

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

/// What waits on a person.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct PendingRequest {
    /// The request's id, which the answer names.
    pub id: String,
    /// `approval` or `question`.
    pub kind: String,
    /// The tool and call it holds up.
    pub tool: String,
    pub call_id: String,
    /// The call's arguments (parsed; the raw text when not JSON).
    pub args: serde_json::Value,
    /// Why a person is asked (for an approval: the policy that asked).
    pub reason: String,
    /// A question's questions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub questions: Vec<Question>,
    pub asked_at: u64,
    /// When an unanswered approval denies itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

/// One question of `ask_user`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Question {
    pub question: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multi: bool,
}

/// `allow` or `deny`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allow,
    Deny,
}

/// An answer as the inbox holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct AnswerItem {
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Allow this tool for the rest of the session.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub always: bool,
    /// The call's arguments as the person edited them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<serde_json::Value>,
    /// A question's answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// Who answered: `person`, or `timeout` for an approval that expired.
    pub by: String,
}

/// `POST /api/sessions/{sid}/answers`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PostAnswer {
    pub request_id: String,
    /// Required for an approval; a question's answer may leave it out (it is `allow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub always: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

/// `POST /api/sessions/{sid}/cancel`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PostCancel {
    #[serde(default)]
    pub turn_only: bool,
}

/// `GET /api/approvals`: what waits on a person, across sessions, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ApprovalList {
    pub approvals: Vec<PendingView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct PendingView {
    pub session: String,
    #[serde(flatten)]
    pub request: PendingRequest,
}

/// One inbox item a run took, as `run-start` names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RunInput {
    /// The inbox item's seq.
    pub seq: u64,
    /// `message`, `wake` or `timer`.
    pub kind: String,
    /// The text the model reads for it.
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum DeltaChannel {
    Text,
    Reasoning,
}

/// A tool call as the model made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ToolCallView {
    /// The call's id (the model's, or the hub's when the model gave none).
    pub id: String,
    pub name: String,
    /// The arguments, parsed; the raw text as a string when they are not JSON.
    pub args: serde_json::Value,
}

/// What a tool call came to, as the model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Observation {
    pub call_id: String,
    pub name: String,
    pub ok: bool,
    /// The tool's answer (on `ok`) or `{error}`.
    pub result: serde_json::Value,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RunResult {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Envelope>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
}

/// A run's answer: prose for a person (`response`), data for a program (`data`), and the
/// model's own short reason (`reasoning`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Envelope {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// Why a run failed: `code` is `model_call_failed`, `output_invalid`, `stopped` (with
/// `stop`: `steps`, `tokens`, `duration`, `output_retries`, `repeated_calls`), `aborted`
/// or `unknown`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RunError {
    pub code: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<String>,
    pub message: String,
}

/// What a run used and how it went, authored by the hub (never by the model).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunMeta {
    pub usage: Usage,
    /// The output transport that ran (`emit` for a chat session).
    pub strategy: String,
    pub steps: u32,
    pub output_retries: u32,
    pub elapsed_ms: u64,
    /// Why the run's last model call stopped, as the server said (`stop`, `tool_calls`,
    /// `length`: cut at `maxTokens`); absent when it said nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// Tokens, as the model server reported them (zero where it reported none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

/// `GET /api/sessions/{sid}/result`: the last run's result and meta.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SessionResult {
    pub run_id: String,
    pub result: RunResult,
    pub meta: RunMeta,
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

/// `GET /api/events`: a page of the hub's own events (streamed by the hub, read by clients).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct HubEventsPage {
    pub events: Vec<HubEvent>,
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

// ---------------------------------------------------------------- waitpoints

/// `quorum`: a number, or `"all"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum Quorum {
    Count(u32),
    All(AllMarker),
}

/// The literal string `"all"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum AllMarker {
    All,
}

impl Quorum {
    pub const ALL: Quorum = Quorum::All(AllMarker::All);
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateWaitpoint {
    pub label: String,
    pub intent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<Quorum>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_fast: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_signals: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_hours: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Wake the session (reason `silent`) when no signal, progress included, arrived for
    /// this long (seconds, or like `"20m"`); once per quiet spell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence_after: Option<crate::waits::DurationValue>,
    /// A monitor's window: reports arriving within it of the first become one wake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce: Option<crate::waits::DurationValue>,
    /// A monitor that starts a fresh session for each wake instead of waking this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawn: Option<SpawnConfig>,
}

/// A monitor's `spawn`: each wake creates a new session with these instructions (the
/// spawning session's runner settings otherwise) and the wake's text as its first message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SpawnConfig {
    pub instructions: String,
    /// The new sessions' title [default: the waitpoint's label and the wake's number].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// Ready-to-paste lines for signalling a waitpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct HowToSignal {
    pub env: String,
    pub cli: String,
    pub curl: String,
    pub shell: String,
    pub attach_to_pid: String,
    /// `"shell"` when the waitpoint names a device, otherwise `"cli"`.
    pub recommended: String,
}

/// What every answer about one waitpoint starts with: what it was armed with and its
/// state (`WaitpointCreated`, `WaitpointView`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WaitpointHead {
    pub id: String,
    pub session: String,
    pub label: String,
    pub intent: String,
    /// `armed`, `resolved`, `expired` or `cancelled`.
    pub state: String,
    pub created_at: u64,
    pub expires_at: u64,
    pub members: Vec<String>,
    pub quorum: u32,
    pub fail_fast: bool,
    pub max_signals: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// `silence_after`, in ms, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence_after_ms: Option<u64>,
    /// `coalesce`, in ms, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce_ms: Option<u64>,
    /// Each wake starts a new session (`spawn`); a view's `wakes` names them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spawn: bool,
}

/// Answer to `POST /api/sessions/{sid}/waitpoints`: the only time the secret is shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WaitpointCreated {
    #[serde(flatten)]
    pub head: WaitpointHead,
    pub secret: String,
    pub how_to_signal: HowToSignal,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SignalView {
    pub status: SignalStatus,
    pub message: Option<String>,
    pub member: Option<String>,
    pub data: Option<String>,
    /// `http`, `spool`, `device:<name>` or `device-wait`.
    pub source: String,
    pub key: Option<String>,
    pub at: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WakeView {
    pub reason: WakeReason,
    /// When it was delivered, or when it is due if not yet delivered.
    pub at: u64,
    pub delivered: bool,
    /// The session this wake started (a `spawn` monitor's), instead of waking this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Badges {
    /// The hourly cap is holding a wake back.
    pub wake_limit_reached: bool,
    /// Failed attempts at delivering a due wake (0 when none is failing). Delivery into the
    /// session's log commits with the decision, so only a failing store makes this rise.
    pub delivery_attempts: u32,
    pub wakes_this_hour: u32,
    pub max_wakes_per_hour: u32,
}

/// The longest name a waitpoint's consumer takes (`cortex wait for --consumer NAME`).
pub const MAX_CONSUMER_CHARS: usize = 64;

/// Whether `name` can name a consumer: 1 to [`MAX_CONSUMER_CHARS`] characters of letters,
/// digits, `.`, `_` and `-`. The error says what to write instead.
pub fn check_consumer_name(name: &str) -> Result<(), String> {
    let n = name.chars().count();
    if n == 0 || n > MAX_CONSUMER_CHARS {
        return Err(format!(
            "a consumer's name is 1 to {MAX_CONSUMER_CHARS} characters (this one has {n})"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "a consumer's name takes letters, digits, '.', '_' and '-', not {c:?}"
        ));
    }
    Ok(())
}

/// `GET|PUT /api/waitpoints/{id}/consumers/{name}`: where a named consumer stands in the
/// waitpoint's wakes. `after` is the session event seq of the last wake it took (0: none
/// yet); its next wake is the first after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ConsumerPosition {
    pub waitpoint: String,
    pub consumer: String,
    pub after: u64,
}

/// `PUT /api/waitpoints/{id}/consumers/{name}`: the consumer took the wake at `after`. A
/// position only moves forward: an older `after` leaves it where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ConsumerAdvance {
    pub after: u64,
}

/// `DELETE /api/waitpoints/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WaitpointCancelled {
    pub id: String,
    /// `cancelled`, or the state it had already ended in (`resolved`, `expired`).
    pub state: String,
    /// False when it had already ended.
    pub cancelled: bool,
}

/// `GET /api/waitpoints/{id}` and each entry of wait_check; never the secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WaitpointView {
    #[serde(flatten)]
    pub head: WaitpointHead,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<u64>,
    /// When the next `silent` wake is due (armed, and no silent wake since the last
    /// signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence_due_at: Option<u64>,
    /// Every signal recorded; `signals` lists at most the latest 1,000 of them.
    pub signal_count: u64,
    pub signals: Vec<SignalView>,
    pub wakes: Vec<WakeView>,
    pub badges: Badges,
    /// How far it got, counted by the one rule every view uses
    /// (`cortex_protocol::progress`); absent from hubs older than it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
}

/// A waitpoint's progress, as every view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Progress {
    /// Toward the quorum, at most `quorum`: members with a terminal signal (each once) when
    /// it names members, else terminal signals. A monitor counts its current round.
    pub received: u32,
    pub quorum: u32,
    /// Terminal signals (`ok` or `fail`), all told.
    pub reports: u64,
    /// Of those, the `fail` ones.
    pub failed: u64,
    /// `progress` signals (heartbeats): recorded, never counted toward the quorum.
    pub heartbeats: u64,
    /// Wakes that counted toward `max_signals` (neither expiry nor silence does).
    pub wakes: u32,
    pub max_signals: u32,
    /// One line for people: `1/3`, `1/3 (1 failed) +2 progress`; a monitor's
    /// `2/5 wakes, 3 reports (1 failed)`.
    pub summary: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WaitpointList {
    pub waitpoints: Vec<WaitpointView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_is_number_or_all() {
        let q: Quorum = serde_json::from_str("2").expect("number");
        assert_eq!(q, Quorum::Count(2));
        let q: Quorum = serde_json::from_str("\"all\"").expect("all");
        assert_eq!(q, Quorum::ALL);
        assert!(serde_json::from_str::<Quorum>("\"most\"").is_err());
        assert_eq!(serde_json::to_string(&Quorum::ALL).expect("ser"), "\"all\"");
    }

    #[test]
    fn event_kind_is_flat() {
        let e = Event {
            seq: 3,
            ts: 10,
            body: EventBody::Message {
                text: "hi".into(),
                when: When::NextTurn,
                dedupe_key: None,
            },
        };
        let v = serde_json::to_value(&e).expect("ser");
        assert_eq!(v["kind"], "message");
        assert_eq!(v["seq"], 3);
        let back: Event = serde_json::from_value(v).expect("de");
        assert_eq!(back, e);
    }

    #[test]
    fn a_device_wait_is_its_condition_beside_its_own_fields() {
        let v = serde_json::json!({
            "kind": "log", "path": "/r/t.log", "match": "nan", "silence": "20m",
            "timeout_s": 60.5, "session": "s1", "label": "train", "intent": "why",
        });
        let b: CreateDeviceWait = serde_json::from_value(v.clone()).expect("a body");
        assert_eq!(b.condition.kind, "log");
        assert_eq!(b.condition.pattern.as_deref(), Some("nan"));
        assert_eq!(b.timeout_s, Some(60.5));
        assert_eq!(b.session.as_deref(), Some("s1"));
        assert_eq!(serde_json::to_value(&b).expect("ser"), v);
        // Null is absent, as with every other optional field.
        let b: CreateDeviceWait =
            serde_json::from_value(serde_json::json!({"kind": "pid", "pid": 4, "label": null}))
                .expect("null label");
        assert_eq!((b.condition.pid, b.label), (Some(4), None));
        // An unknown field is refused by name, listing every field the body takes.
        let e = serde_json::from_value::<CreateDeviceWait>(
            serde_json::json!({"kind": "pid", "pid": 4, "timeout": 5}),
        )
        .expect_err("unknown");
        let e = e.to_string();
        assert!(e.contains("unknown field `timeout`"), "{e}");
        assert!(e.contains("`timeout_s`") && e.contains("`match`"), "{e}");
        let e = serde_json::from_value::<CreateDeviceWait>(
            serde_json::json!({"kind": "pid", "timeout_s": "soon"}),
        )
        .expect_err("a string bound");
        assert!(e.to_string().starts_with("timeout_s: "), "{e}");
    }

    #[test]
    fn the_condition_fields_are_the_conditions_own() {
        let full = crate::waits::WaitCondition {
            kind: "any".into(),
            pid: Some(1),
            start_time: Some(2),
            must_exist: true,
            path: Some("/p".into()),
            pattern: Some("x".into()),
            silence: Some(crate::waits::DurationValue::Seconds(1.0)),
            conditions: Some(vec![]),
        };
        let v = serde_json::to_value(&full).expect("ser");
        let mut keys: Vec<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(|k| k.as_str())
            .collect();
        let mut named = CONDITION_FIELDS.to_vec();
        keys.sort_unstable();
        named.sort_unstable();
        assert_eq!(keys, named);
    }
}

// ---------------------------------------------------------------- devices

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateDevice {
    pub name: String,
}

/// Answer to `POST /api/devices`: the only time the token is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DeviceCreated {
    pub name: String,
    pub token: String,
    /// The line that starts the agent on the device with this token.
    pub install: String,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Health {
    pub ok: bool,
}

/// `DELETE /api/devices/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DeviceRevoked {
    pub name: String,
    pub revoked: bool,
    /// A live link was ended.
    pub dropped_link: bool,
}

/// `DELETE /api/devices/{name}/revoked`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DeviceRemoved {
    pub name: String,
    pub removed: bool,
}

/// `GET /api/devices/{name}/files`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DeviceFiles {
    pub files: Vec<FileNote>,
}

/// One spool file of a device and what the hub answered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct FileNote {
    /// When the hub answered.
    pub at: u64,
    /// The file's name in the device's spool.
    pub name: String,
    pub outcome: FileAnswer,
    /// Why it was refused or is to be sent again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

// The API's flat form of `mesh::FileOutcome`: a refusal's or a retry's reason is
// `FileNote::reason`. Named `FileOutcome` in the OpenAPI document.
/// What the hub answered a device's spool file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "schema", schema(as = FileOutcome))]
pub enum FileAnswer {
    /// Recorded.
    Accepted,
    /// Recorded before (the same device and file name).
    Duplicate,
    /// The waitpoint no longer counts signals.
    Resolved,
    /// Parked under `bad/` on the device, with `reason`.
    Refused,
    /// Kept on the device and sent again later.
    Retry,
}

/// One device in `GET /api/devices` (and `cortex devices`), or `GET /api/devices/{name}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DeviceView {
    pub name: String,
    /// `online`, `offline` or `revoked` (its token no longer admitted; listed until the
    /// name is added again).
    pub state: String,
    /// When it went online, offline, or was revoked.
    pub since: Option<u64>,
    pub last_seen: Option<u64>,
    pub agent_version: Option<String>,
    pub host: Option<crate::mesh::HostFacts>,
    pub spool: crate::mesh::SpoolCounts,
    /// Remote waits on the device that have not ended: armed there, or waiting to be sent
    /// (the device is offline, or has not answered yet).
    pub waits: u32,
    /// Why it last went offline (`ping timed out`, `revoked`, `closed by the agent`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offline_reason: Option<String>,
    /// Those waits one by one, in `GET /api/devices/{name}` only (the list leaves it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_list: Option<Vec<DeviceWaitView>>,
}

/// `POST /api/devices/{name}/waits`: a remote wait (a pid exiting, a file written, a
/// lock coming free) on that device, answered
/// with a waitpoint bound to it that the device's agent signals. The condition's fields
/// (`kind`, `pid`, `path`, `match`…) sit at the top level beside the wait's own.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CreateDeviceWait {
    /// What is waited on (the one vocabulary: `crate::waits`).
    #[serde(flatten)]
    pub condition: crate::waits::WaitCondition,
    /// The bound, in seconds (fractions allowed) [default: the waitpoint lifetime, 7 days].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// The session the wake goes to; without it a session is created for this wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<String>,
}

/// The wait's own fields, beside its condition's.
const DEVICE_WAIT_FIELDS: [&str; 4] = ["timeout_s", "session", "label", "intent"];

// serde cannot refuse unknown fields next to a flattened struct, so the body is read as an
// object, the wait's own fields taken out, and the rest read as the condition (which
// refuses what it does not know, naming every field this body takes).
impl<'de> Deserialize<'de> for CreateDeviceWait {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut map = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        fn take<T: serde::de::DeserializeOwned, E: Error>(
            map: &mut serde_json::Map<String, serde_json::Value>,
            field: &str,
        ) -> Result<Option<T>, E> {
            match map.remove(field) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => serde_json::from_value(v)
                    .map(Some)
                    .map_err(|e| E::custom(format!("{field}: {e}"))),
            }
        }
        let timeout_s = take(&mut map, "timeout_s")?;
        let session = take(&mut map, "session")?;
        let label = take(&mut map, "label")?;
        let intent = take(&mut map, "intent")?;
        if let Some(unknown) = map.keys().find(|k| !CONDITION_FIELDS.contains(&k.as_str())) {
            let known: Vec<String> = CONDITION_FIELDS
                .iter()
                .chain(DEVICE_WAIT_FIELDS.iter())
                .map(|f| format!("`{f}`"))
                .collect();
            return Err(D::Error::custom(format!(
                "unknown field `{unknown}`, expected one of {}",
                known.join(", ")
            )));
        }
        let condition =
            serde_json::from_value(serde_json::Value::Object(map)).map_err(D::Error::custom)?;
        Ok(CreateDeviceWait {
            condition,
            timeout_s,
            session,
            label,
            intent,
        })
    }
}

// The schema is the condition's object with the wait's own fields added: one flat object
// that refuses what it does not name, as the body does (a derived flatten would be an
// `allOf` whose parts each refuse the other's fields).
#[cfg(feature = "schema")]
impl utoipa::PartialSchema for CreateDeviceWait {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::RefOr;
        use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
        let mut schema = <crate::waits::WaitCondition as utoipa::PartialSchema>::schema();
        if let RefOr::T(Schema::Object(o)) = &mut schema {
            let own = [
                (
                    "timeout_s",
                    Type::Number,
                    "The bound, in seconds (fractions allowed) [default: the waitpoint lifetime, 7 days].",
                ),
                (
                    "session",
                    Type::String,
                    "The session the wake goes to; without it a session is created for this wait.",
                ),
                ("label", Type::String, "The waitpoint's label."),
                (
                    "intent",
                    Type::String,
                    "Why the session waits, shown with the wake.",
                ),
            ];
            for (name, ty, doc) in own {
                let field = ObjectBuilder::new()
                    .schema_type(SchemaType::from_iter([ty, Type::Null]))
                    .description(Some(doc));
                o.properties.insert(name.to_string(), field.into());
            }
            o.description = Some(
                "A remote wait on a device: a condition's fields beside the wait's own.".into(),
            );
        }
        schema
    }
}

#[cfg(feature = "schema")]
impl utoipa::ToSchema for CreateDeviceWait {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use crate::waits::WaitCondition;
        // An `any`'s conditions refer to the condition by name.
        schemas.push((
            <WaitCondition as utoipa::ToSchema>::name().into_owned(),
            <WaitCondition as utoipa::PartialSchema>::schema(),
        ));
        <WaitCondition as utoipa::ToSchema>::schemas(schemas);
    }
}

/// A condition's fields as the API spells them (`crate::waits::WaitCondition`).
const CONDITION_FIELDS: [&str; 8] = [
    "kind",
    "pid",
    "start_time",
    "must_exist",
    "path",
    "match",
    "silence",
    "conditions",
];

/// One remote wait, as the devices API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DeviceWaitView {
    /// The waitpoint's id, which is also the wait's identity on the device.
    pub id: String,
    pub device: String,
    /// `pid`, `file`, `flock`, `log` or `any`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A log wait's pattern.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// A file or log wait's silence, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence_ms: Option<u64>,
    /// An any wait's conditions, as `cortex wait any` writes them (`pid:4123`, `log:/x~nan`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<String>>,
    /// `pending` (not yet armed on the device: offline, or no answer yet), `armed`, or how
    /// it ended: `fired`, `timed_out`, `broke`, `cancelled`.
    pub state: String,
    pub created_at: u64,
    /// When the bound passes (ms since the epoch, the hub's clock).
    pub deadline: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub armed_at: Option<u64>,
    /// What the agent found when it armed the wait (a pid's command and start time, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured: Option<serde_json::Value>,
}

/// Answer to `POST /api/devices/{name}/waits`: the waitpoint (as its creation answers,
/// secret included this once) and the wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DeviceWaitCreated {
    #[serde(flatten)]
    pub waitpoint: WaitpointCreated,
    pub wait: DeviceWaitView,
}

/// An event of the hub itself (`GET /api/events`): devices going online and offline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct HubEvent {
    pub seq: u64,
    pub ts: u64,
    #[serde(flatten)]
    pub body: HubEventBody,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum HubEventBody {
    DeviceOnline {
        device: String,
        agent_version: String,
    },
    DeviceOffline {
        device: String,
        reason: String,
    },
    DeviceAdded {
        device: String,
    },
    DeviceRevoked {
        device: String,
    },
    /// A session's model started (or tried to start) a command on a device.
    DeviceExec {
        device: String,
        session: String,
        call_id: String,
        argv: Vec<String>,
        /// Who let it run: `person`, `person (always)` or `policy`.
        approved_by: String,
        /// The run's identity on the device (what a second ask under the same id reaches).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exec_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<i32>,
        /// Why there is no pid: nothing was started, or (starting `state unknown`) the
        /// command may have started and its fate is not known yet.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}
