//! Lists of hub addresses: `cortex --hub` / `CORTEX_HUB` and `cortex-signal --url` take one
//! URL or several, comma-separated, tried in that order. This module only reads the list;
//! when a caller moves on to the next URL is the caller's rule (`hub.rs`, `signal.rs`).

use crate::http::{HttpError, Url};

#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// `a,,b`, a leading or a trailing comma.
    #[error(
        "{list:?}: URL number {n} is empty; separate URLs with single commas, e.g. http://hub-a:3001,http://hub-b:3001"
    )]
    Empty { list: String, n: usize },
    /// An element that is not an `http://` or `https://` URL with a host (the error names it).
    #[error("{0}")]
    Url(HttpError),
}

/// The URLs of a comma-separated list, in order, each trimmed of the spaces around it. Every
/// element must be an `http://` or `https://` URL: an empty one (`a,,b`, a trailing comma)
/// or any other is an error that names it. A comma inside a URL is written `%2C`.
pub fn parse(list: &str) -> Result<Vec<String>, ListError> {
    list.split(',')
        .enumerate()
        .map(|(i, part)| {
            let url = part.trim();
            if url.is_empty() {
                return Err(ListError::Empty {
                    list: list.trim().to_string(),
                    n: i + 1,
                });
            }
            Url::parse(url).map_err(ListError::Url)?;
            Ok(url.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests;
