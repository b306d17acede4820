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
