//! `GET /api/openapi.json`: the hub's HTTP API as an OpenAPI 3.1 document, for people who
//! generate a client. The bodies' schemas are derived from `cortex_protocol`'s types
//! (utoipa's `ToSchema`, which reads their serde attributes); the routes, parameters,
//! codes and examples are listed here, one operation per route the router serves.
//! `doc.rs` builds the document, `examples.rs` holds the examples, one file per area holds
//! its operations (`sessions.rs`, `waitpoints.rs`, `people.rs`, `devices.rs`, `signal.rs`,
//! `page.rs`); `tests.rs` holds the list against the router's source and every example
//! against its schema.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::OpenApi;

mod devices;
mod doc;
mod examples;
mod mcp;
mod page;
mod people;
mod sessions;
mod signal;
mod waitpoints;

use doc::Doc;
pub use doc::{COOKIE_SCHEME, TOKEN_SCHEME};

/// The document, serialized once: it depends on nothing but the code.
static DOCUMENT: LazyLock<Vec<u8>> = LazyLock::new(|| match document().to_json() {
    Ok(s) => s.into_bytes(),
    Err(e) => {
        tracing::error!(error = %e, "the OpenAPI document does not serialize");
        b"{}".to_vec()
    }
});

/// `GET /api/openapi.json` (behind the operator token, like the rest of `/api`).
pub async fn serve() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_slice(),
    )
        .into_response()
}

/// The whole document.
pub fn document() -> OpenApi {
    let mut d = Doc::default();
    sessions::sessions(&mut d);
    sessions::messages_and_events(&mut d);
    waitpoints::waitpoints(&mut d);
    people::people(&mut d);
    devices::devices(&mut d);
    mcp::tokens(&mut d);
    signal::signal(&mut d);
    signal::operators(&mut d);
    page::page(&mut d);
    d.finish()
}

#[cfg(test)]
mod tests;
