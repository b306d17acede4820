//! Bodies the handlers still build in place (`json!`); these types exist for their schemas
//! only and are never built. `tests/it/openapi.rs` checks real answers against them. A
//! body with a protocol type (the devices' `DeviceRevoked`, `DeviceFiles`, …) is not here.
#![allow(dead_code)]

use cortex_protocol::api::HubEvent;
use utoipa::ToSchema;

/// `DELETE /api/sessions/{sid}`.
#[derive(ToSchema)]
pub struct SessionDeleted {
    id: String,
    deleted: bool,
}

/// `DELETE /api/waitpoints/{id}`.
#[derive(ToSchema)]
pub struct WaitpointCancelled {
    id: String,
    /// `cancelled`, or the state it had already ended in (`resolved`, `expired`).
    state: String,
    /// False when it had already ended.
    cancelled: bool,
}

/// `POST /api/sessions/{sid}/cancel`.
#[derive(ToSchema)]
pub struct CancelPosted {
    /// The cancel's seq in the session's log.
    seq: u64,
    turn_only: bool,
    /// A driver was running the session and was told at once.
    running: bool,
}

/// `POST /api/sessions/{sid}/compact`.
#[derive(ToSchema)]
pub struct CompactPosted {
    /// The ask's seq in the session's log; a `compaction` event after it answers it.
    seq: u64,
}

/// `GET /api/events`: a page of the hub's own events.
#[derive(ToSchema)]
pub struct HubEventsPage {
    events: Vec<HubEvent>,
}
