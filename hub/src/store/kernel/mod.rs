//! The persistence kernel: tables, the writer thread, group commit, the journal,
//! checkpoints and replay. It knows no domain: a domain registers its tables
//! ([`table::TableSpec`]), runs operations against a [`Tx`], and announces what changed
//! through topic-keyed notices ([`Notices`]).
//!
//! How a change becomes durable, and why an answer never waits for redb:
//! - every operation runs on the one writer thread, against the tables' layers: the last
//!   checkpoint (a redb read snapshot) under the changes made since, kept in memory;
//! - a batch of operations (group commit) is one journal record: the keys it changed and
//!   their new values. It is appended and `fdatasync`ed, and only then are the batch's
//!   callers answered and its notices published;
//! - once no batch came for a moment (or the journal grew large, or the oldest change got
//!   old) the writer freezes the changes and hands them to the checkpoint thread, which
//!   writes them into redb in one commit and stores the journal number they reach. The
//!   writer goes on answering meanwhile, from memory, with a fresh layer on top; the
//!   journal switches to its other file. redb's file paces the commit's writeback
//!   ([`paced`]), so the journal's syncs never queue behind all of it;
//! - at start, the journal records newer than the last checkpoint are applied again (they
//!   are the changes themselves, so a replay is exact) and checkpointed.

pub mod checkpoint;
pub mod delta;
pub mod error;
pub mod journal;
pub mod notice;
pub mod ordered;
pub mod paced;
pub mod pg;
pub mod table;
pub mod timers;
pub mod tx;
mod writer;

pub use notice::{Notices, Notifier, Topic};
pub use table::{AnyTable, Guard, Table, TableRef, TableSpec};
pub use tx::Tx;
pub(crate) use writer::{Completion, Job, Writer, WriterParts, recover as writer_recover};
