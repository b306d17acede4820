//! Devices: enrolling one, its spool files, its remote waits, the hub's own events.

use serde::{Deserialize, Serialize};

use super::WaitpointCreated;

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
    /// While online: the hub that holds its link (`$CORTEX_HOME/hub/hub-name` of that hub).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<String>,
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
pub(super) const CONDITION_FIELDS: [&str; 8] = [
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

/// `GET /api/events`: a page of the hub's own events (streamed by the hub, read by clients).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct HubEventsPage {
    pub events: Vec<HubEvent>,
}
