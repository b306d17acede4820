//! The storage layer's one error type. A caller sees it as 503/500.

/// Errors of the storage layer. A caller sees them as 503/500.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Db(#[from] redb::Error),
    #[error("stored record is unreadable: {0}")]
    Decode(String),
    #[error("the store is shutting down")]
    Closed,
    #[error("the acknowledgement journal {path}: {source}")]
    Journal {
        path: String,
        source: std::io::Error,
    },
    /// One write's changes are more than a journal record may hold: refused whole,
    /// nothing of it stored, and the same write would be refused again.
    #[error(
        "a write of {bytes} bytes is more than one record of the store's journal may hold ({limit} bytes); it was refused and nothing of it was stored"
    )]
    TooLarge { bytes: usize, limit: usize },
    #[error("{0}; writes resume once a checkpoint succeeds")]
    Full(String),
    #[error("the store's files are damaged: {0}")]
    Damaged(String),
    #[error(
        "the store stopped taking writes after a failure it could not recover from ({0}); restart the hub, which replays its journal"
    )]
    Broken(String),
    #[error("opening {path}: {source}")]
    Open {
        path: String,
        source: redb::DatabaseError,
    },
    /// A statement PostgreSQL refused or could not answer.
    #[error("PostgreSQL: {0}")]
    Pg(String),
    /// PostgreSQL cannot be reached (down, restarting, a wrong host).
    #[error("{0}")]
    Unreachable(String),
    /// A write for a session this hub no longer holds (its claim was taken, released, or
    /// its lease ran out): refused, nothing of it stored.
    #[error("{0}")]
    Fenced(String),
    /// The store's configuration or schema cannot be used as it is.
    #[error("{0}")]
    Config(String),
}

impl StoreError {
    /// A PostgreSQL client's error, with the server's message when it sent one.
    pub fn pg(e: postgres::Error) -> StoreError {
        if e.is_closed() {
            return StoreError::Unreachable(format!("the connection to PostgreSQL is lost: {e}"));
        }
        match e.as_db_error() {
            Some(db) => StoreError::Pg(format!("{} ({})", db.message(), db.code().code())),
            None => StoreError::Pg(e.to_string()),
        }
    }

    /// Whether the same write would be refused again, however long one waited: a caller
    /// must not make it again as it is.
    pub fn is_deterministic(&self) -> bool {
        matches!(self, StoreError::TooLarge { .. })
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self { StoreError::Db(e.into()) }
        }
    )*};
}
from_redb!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::DatabaseError
);
