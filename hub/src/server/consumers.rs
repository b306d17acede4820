//! `GET|PUT /api/waitpoints/{id}/consumers/{name}`: a named consumer's position in a
//! waitpoint's wakes, kept by the store (`store/consumers.rs`), for `cortex wait for
//! --consumer`.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use cortex_protocol::api::{ConsumerAdvance, ConsumerPosition, check_consumer_name};

use super::error::{ApiError, parse_json};
use crate::state::AppState;

pub async fn get(
    State(state): State<AppState>,
    Path((id, name)): Path<(String, String)>,
) -> Result<Json<ConsumerPosition>, ApiError> {
    check_consumer_name(&name).map_err(ApiError::bad_request)?;
    let (i, n) = (id.clone(), name.clone());
    let at = state
        .store
        .read(move |r| r.consumer_position(&i, &n))
        .await
        .map_err(ApiError::store)?;
    answer(id, name, at)
}

pub async fn put(
    State(state): State<AppState>,
    Path((id, name)): Path<(String, String)>,
    body: Bytes,
) -> Result<Json<ConsumerPosition>, ApiError> {
    check_consumer_name(&name).map_err(ApiError::bad_request)?;
    let ConsumerAdvance { after } = parse_json(&body)?;
    let (i, n) = (id.clone(), name.clone());
    let at = state
        .store
        .exec(move |t| t.advance_consumer(&i, &n, after))
        .await
        .map_err(ApiError::store)?;
    answer(id, name, at)
}

fn answer(id: String, name: String, at: Option<u64>) -> Result<Json<ConsumerPosition>, ApiError> {
    match at {
        Some(after) => Ok(Json(ConsumerPosition {
            waitpoint: id,
            consumer: name,
            after,
        })),
        None => Err(ApiError::not_found("waitpoint", &id)),
    }
}
