//! The kernel on PostgreSQL: the same tables, the same [`super::Tx`], the same writer's
//! phases, with PostgreSQL as the durable store in place of the journal and redb.
//!
//! - each registered table is a table of the `cortex` schema: `k bytea PRIMARY KEY` (the
//!   key in [`super::ordered`]'s encoding, so PostgreSQL's byte order is redb's), `raw`
//!   (the key as redb encodes it, what a read hands back) and `v` (the value);
//! - a batch of jobs is one PostgreSQL transaction: the jobs read through to the database
//!   ([`snap`]) under the batch's changes kept in memory, the changes are written in one
//!   statement per table and kind, and the callers are answered only once `COMMIT`
//!   returned (`synchronous_commit` is whatever the server says; on by default);
//! - a read outside the writer is one `REPEATABLE READ READ ONLY` transaction on a pooled
//!   connection: a consistent view holding every acknowledged change;
//! - the schema is versioned ([`migrate`]): applied at start under an advisory lock, so
//!   one hub of several applies it, and a hub refuses a schema newer than it knows;
//! - several hubs may write to one database: each batch takes a lock held until its
//!   transaction ends, so batches are made one at a time across the hubs, and adds a row
//!   to the batches log ([`writer`]); what a writer keeps of its reads ([`snap`]) holds
//!   while the log's newest row is its own;
//! - the other hubs' notices come from that log ([`bus`]): `LISTEN` for the hint, a read
//!   of the log at least every second for what a lost notification would have said.

pub mod bus;
pub mod conn;
pub mod migrate;
pub mod read;
pub mod snap;
pub mod writer;

pub use conn::Pg;
