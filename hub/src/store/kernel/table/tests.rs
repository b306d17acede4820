//! The layers read as one table: the current layer over the frozen one over the
//! snapshot, in redb's key order, removed keys skipped, and undo restoring exactly.

use super::*;
use redb::ReadableDatabase;

const T: TableSpec<(&str, u64), &str> = TableSpec::new(0, "t");
static REG: [&dyn AnyTable; 1] = [&T];

/// A database whose snapshot holds `snap`, and a frozen layer holding `frozen`.
fn setup(snap: &[((&str, u64), &str)]) -> (tempfile::TempDir, redb::Database) {
    let dir = tempfile::tempdir().expect("tmp");
    let db = redb::Database::create(dir.path().join("t.redb")).expect("db");
    let wtx = db.begin_write().expect("w");
    {
        let mut t = wtx.open_table(T.def).expect("t");
        for (k, v) in snap {
            t.insert(*k, *v).expect("insert");
        }
    }
    wtx.commit().expect("commit");
    (dir, db)
}

fn layer(entries: &[((&str, u64), Option<&str>)]) -> Overlay {
    let mut o = Overlay::new(1);
    for (k, v) in entries {
        let kb = key_bytes::<(&str, u64)>(k);
        o.tables[0].insert(
            RawKey::new(kb, <(&str, u64)>::compare),
            v.map(|v| v.as_bytes().to_vec()),
        );
    }
    o
}

fn all(t: &TableRef<'_, (&'static str, u64), &'static str>) -> Vec<(String, u64, String)> {
    t.iter()
        .expect("iter")
        .map(|e| {
            let (k, v) = e.expect("entry");
            let (a, b) = k.value();
            (a.to_string(), b, v.value().to_string())
        })
        .collect()
}

fn view<'t>(
    snap: &'t Snapshot,
    frozen: Option<&'t Overlay>,
    cur: &'t Overlay,
) -> TableRef<'t, (&'static str, u64), &'static str> {
    TableRef::new(Layers {
        snap: snap.tables[0].as_ref(),
        frozen: frozen.map(|f| &f.tables[0]),
        cur: &cur.tables[0],
        cmp: <(&str, u64)>::compare,
    })
}

#[test]
fn the_newest_layer_wins_and_removed_keys_are_gone() {
    // u64 keys are stored little-endian: 256 sorts after 2 only under redb's compare.
    let (_d, db) = setup(&[(("a", 1), "s1"), (("a", 256), "s256"), (("b", 0), "sb")]);
    let snap = Snapshot::open(&db.begin_read().expect("r"), &REG).expect("snap");
    let frozen = layer(&[
        (("a", 2), Some("f2")),
        (("a", 256), None),
        (("b", 0), Some("fb")),
    ]);
    let cur = layer(&[(("a", 2), Some("c2")), (("a", 3), Some("c3"))]);
    let t = view(&snap, Some(&frozen), &cur);
    assert_eq!(
        all(&t),
        vec![
            ("a".into(), 1, "s1".into()),
            ("a".into(), 2, "c2".into()),
            ("a".into(), 3, "c3".into()),
            ("b".into(), 0, "fb".into()),
        ]
    );
    assert_eq!(
        t.get(("a", 256))
            .expect("get")
            .map(|g| g.value().to_string()),
        None
    );
    assert_eq!(
        t.get(("a", 1)).expect("get").map(|g| g.value().to_string()),
        Some("s1".into())
    );
    assert_eq!(t.count().expect("count"), 4);
    let last = t.last().expect("last").expect("some");
    assert_eq!(last.0.value(), ("b", 0));
    let first = t.first().expect("first").expect("some");
    assert_eq!(first.0.value(), ("a", 1));
}

#[test]
fn ranges_merge_within_their_bounds_and_empty_ranges_are_empty() {
    let (_d, db) = setup(&[(("a", 1), "s1"), (("a", 5), "s5"), (("a", 9), "s9")]);
    let snap = Snapshot::open(&db.begin_read().expect("r"), &REG).expect("snap");
    let cur = layer(&[
        (("a", 4), Some("c4")),
        (("a", 5), None),
        (("a", 7), Some("c7")),
    ]);
    let t = view(&snap, None, &cur);
    let got: Vec<u64> = t
        .range(("a", 2)..("a", 9))
        .expect("range")
        .map(|e| e.expect("e").0.value().1)
        .collect();
    assert_eq!(got, vec![4, 7]);
    let got: Vec<u64> = t
        .range(("a", 4)..=("a", 9))
        .expect("range")
        .map(|e| e.expect("e").0.value().1)
        .collect();
    assert_eq!(got, vec![4, 7, 9]);
    assert_eq!(t.range(("a", 7)..("a", 7)).expect("range").count(), 0);
    assert_eq!(t.range(("a", 8)..("a", 2)).expect("range").count(), 0);
}

#[test]
fn undo_restores_the_current_layer_exactly() {
    let (_d, db) = setup(&[(("a", 1), "s1")]);
    let snap = Snapshot::open(&db.begin_read().expect("r"), &REG).expect("snap");
    let mut cur = layer(&[(("a", 2), Some("c2"))]);
    let mut undo = Vec::new();
    {
        let mut t: Table<'_, (&str, u64), &str> =
            Table::new(0, snap.tables[0].as_ref(), None, &mut cur, &mut undo);
        assert_eq!(
            t.replace(("a", 3), "new")
                .expect("ins")
                .map(|g| g.value().to_string()),
            None
        );
        assert_eq!(
            t.remove(("a", 1))
                .expect("rm")
                .map(|g| g.value().to_string()),
            Some("s1".into())
        );
        assert_eq!(
            t.replace(("a", 2), "again")
                .expect("ins")
                .map(|g| g.value().to_string()),
            Some("c2".into())
        );
        assert!(t.remove(("zz", 0)).expect("rm").is_none());
    }
    assert_eq!(undo.len(), 3, "removing a missing key records nothing");
    rollback(&mut cur, &mut undo, 0);
    let t = view(&snap, None, &cur);
    assert_eq!(
        all(&t),
        vec![("a".into(), 1, "s1".into()), ("a".into(), 2, "c2".into())]
    );
}

#[test]
fn a_change_record_round_trips_and_refuses_damage() {
    let mut cur = Overlay::new(1);
    let mut undo = Vec::new();
    let (_d, db) = setup(&[]);
    let snap = Snapshot::open(&db.begin_read().expect("r"), &REG).expect("snap");
    {
        let mut t: Table<'_, (&str, u64), &str> =
            Table::new(0, snap.tables[0].as_ref(), None, &mut cur, &mut undo);
        t.insert(("a", 1), "x").expect("ins");
        t.insert(("a", 2), "y").expect("ins");
        t.remove(("a", 2)).expect("rm");
    }
    let rec = super::super::delta::encode(&REG, &cur, &undo);
    let changes = super::super::delta::decode(&REG, &rec).expect("decode");
    assert_eq!(changes.len(), 2);
    let mut replayed = Overlay::new(1);
    super::super::delta::apply(&REG, &mut replayed, changes);
    assert_eq!(
        all(&view(&snap, None, &replayed)),
        all(&view(&snap, None, &cur))
    );
    for cut in 1..rec.len() {
        assert!(
            super::super::delta::decode(&REG, &rec[..cut]).is_err(),
            "cut at {cut}"
        );
    }
}

#[test]
fn a_change_record_with_ill_formed_bytes_for_its_table_is_refused() {
    // A record whose checksum holds but whose key is too short for `(&str, u64)`: redb's
    // decoder would panic on it; the record is refused instead.
    let mut rec = vec![super::super::delta::TAG];
    rec.extend_from_slice(&1u32.to_le_bytes());
    rec.extend_from_slice(&1u16.to_le_bytes());
    rec.extend_from_slice(b"t");
    rec.extend_from_slice(&2u32.to_le_bytes());
    rec.extend_from_slice(&[9, 9]);
    rec.push(0);
    assert!(super::super::delta::decode(&REG, &rec).is_err());
}
