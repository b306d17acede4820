//! What waits on a person (approvals, questions) and the answers and cancels people post.

use serde::{Deserialize, Serialize};

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
