//! The schema's versions: each [`Migration`] is applied once, in order, in one transaction
//! that holds an advisory lock, so of several hubs starting at once one applies it and the
//! others find it applied. A database whose schema is newer than this hub knows is refused:
//! an older hub must not write rows it does not understand.

use super::conn::{Conn, SCHEMA, qualified};
use crate::store::kernel::error::StoreError;
use crate::store::kernel::table::AnyTable;

/// One step of a migration.
pub enum Step {
    /// Tables of the kernel's shape (key, raw key, value), by name.
    Tables(&'static [&'static str]),
    /// Any statement.
    Sql(&'static str),
}

/// One version of the schema.
pub struct Migration {
    pub version: i32,
    pub what: &'static str,
    pub steps: &'static [Step],
}

/// The advisory lock's key: the migrations of every hub on the database take it.
const LOCK: i64 = 0x636f_7274_6578; // "cortex"

/// What [`migrate`] found and did.
#[derive(Debug, PartialEq, Eq)]
pub struct Migrated {
    /// The version the database was at.
    pub from: i32,
    /// The version it is at now.
    pub to: i32,
}

/// Brings the database to the newest of `migrations` (in version order, from 1), then
/// checks that every table of `registry` exists.
pub fn migrate(
    c: &mut Conn,
    migrations: &[Migration],
    registry: &[&'static dyn AnyTable],
) -> Result<Migrated, StoreError> {
    let known = migrations.last().map_or(0, |m| m.version);
    c.simple("BEGIN")?;
    let r = apply(c, migrations, known, registry);
    match r {
        Ok(m) => {
            c.simple("COMMIT")?;
            Ok(m)
        }
        Err(e) => {
            let _ = c.simple("ROLLBACK");
            Err(e)
        }
    }
}

fn apply(
    c: &mut Conn,
    migrations: &[Migration],
    known: i32,
    registry: &[&'static dyn AnyTable],
) -> Result<Migrated, StoreError> {
    let versions = qualified("schema_version");
    c.simple(&format!(
        "SELECT pg_advisory_xact_lock({LOCK});
         CREATE SCHEMA IF NOT EXISTS \"{SCHEMA}\";
         CREATE TABLE IF NOT EXISTS {versions} (
             version integer PRIMARY KEY,
             what text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    ))?;
    let max = format!("SELECT coalesce(max(version), 0) FROM {versions}");
    let from: i32 = c.run(|cl| cl.query_one(&max, &[]))?.get(0);
    if from > known {
        return Err(StoreError::Config(format!(
            "the database's schema is version {from}, newer than this hub knows (version {known}): a newer hub wrote it; run that version (or newer) of cortex-hub"
        )));
    }
    for m in migrations.iter().filter(|m| m.version > from) {
        for step in m.steps {
            match step {
                Step::Tables(names) => {
                    for n in *names {
                        c.simple(&format!(
                            "CREATE TABLE {} (k bytea PRIMARY KEY, raw bytea NOT NULL, v bytea NOT NULL)",
                            qualified(n)
                        ))?;
                    }
                }
                Step::Sql(sql) => c.simple(sql)?,
            }
        }
        let insert = format!("INSERT INTO {versions} (version, what) VALUES ($1, $2)");
        c.run(|cl| cl.execute(&insert, &[&m.version, &m.what]))?;
        tracing::info!(
            version = m.version,
            what = m.what,
            "applied a migration of the store's schema"
        );
    }
    for t in registry {
        let name = format!("{SCHEMA}.{}", t.name());
        let found: bool = c
            .run(|cl| cl.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]))?
            .get(0);
        if !found {
            return Err(StoreError::Config(format!(
                "the table {name} is registered but no migration creates it (a build without its migration)"
            )));
        }
    }
    Ok(Migrated { from, to: known })
}
