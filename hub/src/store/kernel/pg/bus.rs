//! The notices of the other hubs on the database: a thread with a connection of its own
//! that `LISTEN`s on the batches log's channel and reads the log's new rows, raising the
//! notices of every batch another process wrote in this hub's [`Notifier`] (its own are
//! raised by its writer; a notification of its own next batch is not read back). A notification is only a hint: they are lost while the
//! connection is down, so the log is read again at least every [`POLL`] whatever came,
//! and at once after a reconnect. Rows read past a gap (the log pruned while this hub was
//! away, or a number left unused) wake every watcher once: each reads the store again.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::conn::{ALIVE_LOCKS, Conn, Pg, qualified};
use super::writer::{BATCHES, CHANNEL};
use crate::store::kernel::error::StoreError;
use crate::store::kernel::notice::{Notices, Notifier};

/// The longest a batch of another hub waits to be heard of when its notification was lost.
pub const POLL: Duration = Duration::from_secs(1);
/// Rows read per query of the log.
const PAGE: i64 = 1024;

/// What the bus is built from.
pub(crate) struct BusParts {
    pub pg: Arc<Pg>,
    pub notifier: Weak<Notifier>,
    /// The notice kinds the hub knows: a row's kinds are matched against them.
    pub kinds: &'static [&'static str],
    /// The newest batch already reflected in what the hub read at start.
    pub from: i64,
}

/// Starts the bus on a thread of its own; it ends once the notifier is dropped.
pub(crate) fn start(p: BusParts) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("store-bus".into())
        .spawn(move || run(p))
}

fn run(p: BusParts) {
    let mut last = p.from;
    let mut backoff = Duration::from_millis(100);
    while p.notifier.strong_count() > 0 {
        let r = listen(&p, &mut last);
        if p.notifier.strong_count() == 0 {
            return;
        }
        if let Err(e) = r {
            tracing::warn!(error = %e, "the store's notices from other hubs are interrupted; connecting again");
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One connection's life: `LISTEN`, then read the log whenever told or [`POLL`] passed.
fn listen(p: &BusParts, last: &mut i64) -> Result<(), StoreError> {
    let mut c = p.pg.conn()?;
    c.simple(&format!("LISTEN {CHANNEL}"))?;
    // What came while no connection listened.
    read_log(p, &mut c, last)?;
    tracing::debug!("listening for the other hubs' batches");
    let mut alive = false;
    loop {
        // The hub's session lock, held while this connection lives: the others read its
        // death from its absence. (Taken again here after a reconnect; tried again each
        // poll while another connection of a previous run still holds it.)
        if !alive && let Some(key) = p.pg.alive_key() {
            alive = hold_alive(&mut c, key)?;
        }
        let heard = c.notifications(POLL)?;
        if p.notifier.strong_count() == 0 {
            return Ok(());
        }
        let m = crate::metrics::metrics();
        if !heard.is_empty() {
            m.bus_heard(heard.len());
        }
        // This hub's own batches, right after the last one read: nothing to raise, and no
        // need to read the log for them.
        if let Some(n) = own_run(&heard, *last, p.pg.me) {
            *last = n;
            continue;
        }
        let found = read_log(p, &mut c, last)?;
        if heard.is_empty() && found > 0 {
            m.bus_polled(found);
        }
    }
}

/// When the notifications `heard` are all of batches `me` wrote, numbered one after
/// another from `last + 1` (payloads `N:WRITER`, see the writer), the newest of them.
fn own_run(heard: &[String], last: i64, me: i64) -> Option<i64> {
    if heard.is_empty() || last <= 0 {
        return None;
    }
    let mut next = last + 1;
    for h in heard {
        let (n, w) = h.split_once(':')?;
        if n.parse::<i64>().ok()? != next || w.parse::<i64>().ok()? != me {
            return None;
        }
        next += 1;
    }
    Some(next - 1)
}

/// Takes this hub's session lock on `c`; whether it holds it now.
fn hold_alive(c: &mut Conn, key: u32) -> Result<bool, StoreError> {
    let rows = c.simple_rows(&format!(
        "SELECT pg_try_advisory_lock({ALIVE_LOCKS}, {})::text",
        key as i32
    ))?;
    Ok(rows
        .first()
        .and_then(|r| r.first())
        .is_some_and(|v| v.as_deref() == Some("true")))
}

/// Reads the log past `last`, raising the notices of the batches other processes wrote;
/// how many such batches there were.
fn read_log(p: &BusParts, c: &mut Conn, last: &mut i64) -> Result<usize, StoreError> {
    let sql = format!(
        "SELECT n, writer, notices FROM {} WHERE n > $1 ORDER BY n LIMIT {PAGE}",
        qualified(BATCHES)
    );
    let mut found = 0;
    loop {
        let st = c.stmt(&sql)?;
        let from = *last;
        let rows = c.run(|cl| cl.query(&st, &[&from]))?;
        let Some(notifier) = p.notifier.upgrade() else {
            return Ok(found);
        };
        let mut notices = Notices::new();
        // Numbers are taken in commit order, so rows past `last` are all there unless the
        // log was pruned past it (or a transaction that took a number failed: rare, and a
        // wake too many harms nothing).
        let gap = rows.first().is_some_and(|r| r.get::<_, i64>(0) > *last + 1) && *last > 0;
        for r in &rows {
            let (n, writer, raw): (i64, i64, Vec<u8>) = (r.get(0), r.get(1), r.get(2));
            *last = n;
            if writer == p.pg.me {
                continue;
            }
            found += 1;
            merge(&mut notices, &raw, p.kinds);
        }
        if gap {
            tracing::warn!(
                "the store's notices from other hubs have a gap; every watcher reads again"
            );
            notifier.wake_all();
        }
        notifier.publish(notices);
        if (rows.len() as i64) < PAGE {
            return Ok(found);
        }
    }
}

/// A row's notices (`[[kind, key, value], …]`) into `into`, the newest value per topic;
/// kinds this hub does not know are skipped.
fn merge(into: &mut Notices, raw: &[u8], kinds: &'static [&'static str]) {
    let Ok(list) = serde_json::from_slice::<Vec<(String, String, u64)>>(raw) else {
        tracing::warn!("a batch in the store's log has notices this hub cannot read; skipped");
        return;
    };
    for (kind, key, v) in list {
        if let Some(k) = kinds.iter().find(|k| **k == kind) {
            into.insert((k, key), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_run_of_this_hubs_own_batches_right_after_the_last_skips_the_log() {
        let h = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for (heard, last, want) in [
            (h(&["8:7", "9:7"]), 7, Some(9)),
            (h(&["8:7"]), 7, Some(8)),
            (h(&[]), 7, None),             // the poll: read the log
            (h(&["9:7"]), 7, None),        // 8 was not heard: another hub's, or lost
            (h(&["8:7", "9:5"]), 7, None), // another hub's batch
            (h(&["8"]), 7, None),          // a hub that sends the number alone
            (h(&["8:7"]), 0, None),        // nothing read yet
            (h(&["8:x"]), 7, None),
        ] {
            assert_eq!(own_run(&heard, last, 7), want, "{heard:?} after {last}");
        }
    }

    #[test]
    fn notices_of_a_row_keep_known_kinds_and_the_newest_value() {
        static KINDS: &[&str] = &["session", "timers"];
        let mut into = Notices::new();
        merge(
            &mut into,
            br#"[["session","a",3],["other","x",1],["timers","",9]]"#,
            KINDS,
        );
        merge(&mut into, br#"[["session","a",5]]"#, KINDS);
        merge(&mut into, b"not json", KINDS);
        let mut got: Vec<_> = into.into_iter().collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (("session", "a".to_string()), 5),
                (("timers", String::new()), 9)
            ]
        );
    }
}
