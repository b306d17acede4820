//! The body of `POST /webhook/signal` and of a spool file, and its caps (the
//! body's bytes, the message's and the data's characters, the names' characters).

use serde::{Deserialize, Serialize};

/// A request body or spool file larger than this is refused (413 / parked).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// `message` longer than this many characters is refused.
pub const MAX_MESSAGE_CHARS: usize = 2_000;
/// `data` longer than this many characters is refused.
pub const MAX_DATA_CHARS: usize = 16_000;
/// `key`, `member` and `id` longer than this are refused.
pub const MAX_NAME_CHARS: usize = 200;

/// What a signal says about the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum SignalStatus {
    /// Terminal success.
    #[default]
    Ok,
    /// Terminal failure.
    Fail,
    /// A heartbeat: recorded, never wakes, never resolves.
    Progress,
}

impl SignalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SignalStatus::Ok => "ok",
            SignalStatus::Fail => "fail",
            SignalStatus::Progress => "progress",
        }
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, SignalStatus::Progress)
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ok" => Some(SignalStatus::Ok),
            "fail" => Some(SignalStatus::Fail),
            "progress" => Some(SignalStatus::Progress),
            _ => None,
        }
    }
}

/// `{id, secret, status?, message?, member?, data?, key?}`: the signal route's body and
/// the content of a spool file. Unknown fields are refused so a typo is loud.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    pub id: String,
    pub secret: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SignalStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Optional identity: a second signal to the same waitpoint with the same key is a
    /// duplicate, answered 202 and counted once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Why a signal body is not acceptable before any waitpoint is looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShapeError {
    /// Not JSON of the right shape.
    Malformed(String),
    /// A field is longer than its cap.
    TooLong {
        field: &'static str,
        chars: usize,
        max: usize,
    },
}

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShapeError::Malformed(e) => write!(
                f,
                "body is not a signal: {e}; send JSON {{\"id\":\"wp_…\",\"secret\":\"…\",\"status\":\"ok|fail|progress\",\"message\":\"…\"}}"
            ),
            ShapeError::TooLong { field, chars, max } => write!(
                f,
                "{field} is {chars} characters, over the cap of {max}; shorten it (put long output in data, at most {MAX_DATA_CHARS} characters)"
            ),
        }
    }
}

impl SignalRequest {
    /// Parses and checks a body against the caps (not against any waitpoint).
    pub fn parse(bytes: &[u8]) -> Result<Self, ShapeError> {
        let req: SignalRequest =
            serde_json::from_slice(bytes).map_err(|e| ShapeError::Malformed(e.to_string()))?;
        req.check_caps()?;
        Ok(req)
    }

    pub fn check_caps(&self) -> Result<(), ShapeError> {
        fn cap(field: &'static str, v: Option<&str>, max: usize) -> Result<(), ShapeError> {
            if let Some(v) = v {
                // Byte length bounds char count from above: only count when it could matter.
                if v.len() > max {
                    let chars = v.chars().count();
                    if chars > max {
                        return Err(ShapeError::TooLong { field, chars, max });
                    }
                }
            }
            Ok(())
        }
        cap("id", Some(&self.id), MAX_NAME_CHARS)?;
        cap("secret", Some(&self.secret), MAX_NAME_CHARS)?;
        cap("member", self.member.as_deref(), MAX_NAME_CHARS)?;
        cap("key", self.key.as_deref(), MAX_NAME_CHARS)?;
        cap("message", self.message.as_deref(), MAX_MESSAGE_CHARS)?;
        cap("data", self.data.as_deref(), MAX_DATA_CHARS)?;
        Ok(())
    }

    pub fn status(&self) -> SignalStatus {
        self.status.unwrap_or_default()
    }
}

/// The `result` of a 202 answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum SignalResult {
    Accepted,
    Duplicate,
}

/// Body of a 202 answer from the signal route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SignalAccepted {
    pub result: SignalResult,
    pub waitpoint: String,
    /// The waitpoint's state after this signal.
    pub state: String,
}

/// Body of every error answer (signal route and API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// Stable machine-readable code, e.g. `unknown_waitpoint`.
    pub error: String,
    /// What went wrong and what to do next, for a person.
    pub message: String,
    /// For a missing or unlisted member: the expected members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_minimal_signal() {
        let r = SignalRequest::parse(br#"{"id":"wp_1","secret":"s"}"#).expect("parse");
        assert_eq!(r.status(), SignalStatus::Ok);
        assert_eq!(r.message, None);
    }

    #[test]
    fn refuses_unknown_fields_and_bad_status() {
        assert!(matches!(
            SignalRequest::parse(br#"{"id":"wp_1","secret":"s","stauts":"ok"}"#),
            Err(ShapeError::Malformed(_))
        ));
        assert!(matches!(
            SignalRequest::parse(br#"{"id":"wp_1","secret":"s","status":"done"}"#),
            Err(ShapeError::Malformed(_))
        ));
    }

    #[test]
    fn caps_count_characters_not_bytes() {
        let msg = "é".repeat(MAX_MESSAGE_CHARS);
        let body = serde_json::json!({"id":"wp_1","secret":"s","message":msg}).to_string();
        assert!(SignalRequest::parse(body.as_bytes()).is_ok());
        let msg = "é".repeat(MAX_MESSAGE_CHARS + 1);
        let body = serde_json::json!({"id":"wp_1","secret":"s","message":msg}).to_string();
        assert!(matches!(
            SignalRequest::parse(body.as_bytes()),
            Err(ShapeError::TooLong {
                field: "message",
                ..
            })
        ));
    }
}
