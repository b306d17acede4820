//! The throwaway PostgreSQL the store's second backend is tested on
//! (`cortex_tests::postgres`): a real cluster, durable settings, a database per test, and
//! nothing left running once it is dropped; and what is particular to a hub whose store
//! is on it (its state in the database, the schema's versions, its URL's errors).

use cortex_tests::postgres::Postgres;
use std::time::Duration;

use cortex_tests::{Hub, body, wait_until};
use serde_json::json;

#[test]
fn a_throwaway_cluster_is_durable_keeps_databases_apart_and_stops_when_dropped() {
    let pg = Postgres::start();
    // Durable as a deployment runs it: a commit is on disk before it is answered.
    assert_eq!(pg.query("postgres", "SHOW fsync"), "on");
    assert_eq!(pg.query("postgres", "SHOW synchronous_commit"), "on");
    // Listening on loopback only, at the port it says.
    assert_eq!(pg.query("postgres", "SHOW listen_addresses"), "127.0.0.1");
    assert_eq!(pg.query("postgres", "SHOW port"), pg.port().to_string());
    // A database per test: what one writes, another does not see.
    pg.create_database("test_a");
    pg.create_database("test_b");
    pg.query(
        "test_a",
        "CREATE TABLE t (k text PRIMARY KEY); INSERT INTO t VALUES ('x')",
    );
    assert_eq!(pg.query("test_a", "SELECT k FROM t"), "x");
    let other = pg.psql("test_b", "SELECT k FROM t");
    assert!(!other.status.success(), "test_b sees test_a's table");
    // A unique constraint refuses a second row with the key (what dedupe will stand on).
    let again = pg.psql("test_a", "INSERT INTO t VALUES ('x')");
    assert!(!again.status.success(), "a duplicate key was accepted");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("duplicate key"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // Reachable over TCP at its URL's address too.
    assert!(std::net::TcpStream::connect(("127.0.0.1", pg.port())).is_ok());
    let (pid, port, dir) = (pg.pid(), pg.port(), pg.socket_dir().to_path_buf());
    drop(pg);
    // Stopped: the postmaster is gone, the port refuses, the directory is removed.
    let alive = rustix::process::test_kill_process(
        rustix::process::Pid::from_raw(pid as i32).expect("a pid"),
    )
    .is_ok();
    assert!(!alive, "postgres {pid} still runs");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn the_binarys_shared_cluster_serves_every_test_and_a_server_that_dies_is_not_waited_on() {
    // One cluster for the binary: the same one each time, a database per test.
    let pg = Postgres::shared();
    assert_eq!(Postgres::shared().port(), pg.port());
    let db = pg.database();
    assert_eq!(pg.query(&db, "SELECT current_database()"), db);
    // A server killed under its keeper: the keeper cleans up and exits by itself, so the
    // drop does not wait out its bound.
    let own = Postgres::start();
    let (pid, dir) = (own.pid(), own.socket_dir().to_path_buf());
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).expect("a pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill the postmaster");
    let start = std::time::Instant::now();
    while dir.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the keeper left {} behind",
            dir.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(own);
}

/// `cortex-hub` on a fresh home with `args`, run until it exits by itself (a start it
/// refuses): its exit code and what it said.
fn refused_start(args: &[&str]) -> (i32, String) {
    let home = tempfile::tempdir().expect("home");
    let mut cmd = cortex_tests::command(
        "cortex-hub",
        &[
            &["--home", &home.path().display().to_string()],
            &["--listen", "127.0.0.1:0", "--mesh-listen", "off"][..],
            args,
        ]
        .concat(),
        &[],
    );
    let out = cmd.output().expect("run cortex-hub");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_hub_on_postgres_keeps_its_state_in_the_database_not_its_home() {
    let pg = Postgres::shared();
    let db = pg.database();
    let url = pg.url(&db);
    let mut hub = Hub::start_with_args(&[], &["--store", &url]);
    assert!(
        hub.log().contains("the store is on PostgreSQL"),
        "{}",
        hub.log()
    );
    let sid = hub.session();
    let wp = hub.waitpoint(&sid, json!({"label": "on pg", "intent": "one signal"}));
    let id = wp["id"].as_str().expect("id").to_string();
    let (code, _) = hub.signal(&body(&wp, json!({"message": "done", "key": "k1"})));
    assert_eq!(code, 202);
    // Answered after COMMIT: the signal's dedupe key is a row another connection sees.
    assert_eq!(
        pg.query(&db, "SELECT count(*) FROM cortex.signal_keys"),
        "1"
    );
    // The same key again is recorded once (the key is the table's primary key).
    let (code, again) = hub.signal(&body(&wp, json!({"message": "done", "key": "k1"})));
    assert!(code == 200 || code == 202 || code == 410, "{code} {again}");
    assert_eq!(
        pg.query(&db, "SELECT count(*) FROM cortex.signal_keys"),
        "1"
    );
    // Nothing of the store is under the home: a hub on another home and the same
    // database finds the waitpoint and its signal.
    hub.kill();
    assert!(!hub.home.join("hub/hub.redb").exists());
    // Hubs on one database answer to one operator token: one with another is refused
    // (once the killed hub's connection, and its writer lock, are gone).
    let (code, said) = wait_until(Duration::from_secs(30), "the token refusal", || {
        let (code, said) = refused_start(&["--store", &url]);
        (!said.contains("another cortex-hub writes")).then_some((code, said))
    });
    assert_ne!(code, 0, "{said}");
    assert!(said.contains("share one operator token"), "{said}");
    assert!(!said.contains(&hub.token), "{said}");
    let other = Hub::start_with_args(&[("CORTEX_WEBHOOK_TOKEN", &hub.token)], &["--store", &url]);
    let seen = other.get_waitpoint(&id);
    assert_eq!(seen["id"], id.as_str(), "{seen}");
    assert_ne!(seen["state"], "armed", "{seen}");
    assert_eq!(
        pg.query(&db, "SELECT count(*) FROM cortex.schema_version"),
        "7",
        "the schema was applied once"
    );
}

#[test]
fn a_schema_newer_than_the_hub_is_refused_and_a_bad_url_is_explained_without_its_password() {
    let pg = Postgres::shared();
    let db = pg.database();
    let url = pg.url(&db);
    // A hub applies versions 1 and 2, and the next start finds them applied.
    let mut hub = Hub::start_with_args(&[], &["--store", &url]);
    hub.stop();
    pg.query(
        &db,
        "INSERT INTO cortex.schema_version (version, what) VALUES (99, 'a later hub')",
    );
    let (code, said) = refused_start(&["--store", &url]);
    assert_ne!(code, 0, "{said}");
    assert!(
        said.contains("version 99, newer than this hub knows (version 7)"),
        "{said}"
    );
    // Not a PostgreSQL URL: said, and the value (it may hold a password) not repeated.
    let (code, said) = refused_start(&["--store", "mysql://u:hunter2@db/x"]);
    assert_ne!(code, 0, "{said}");
    assert!(
        said.contains("postgres://USER@HOST:PORT/DATABASE"),
        "{said}"
    );
    assert!(!said.contains("hunter2"), "{said}");
    // A database nobody listens for: said with where it was looked for, no password.
    let dead = cortex_tests::dead_port();
    let (code, said) = refused_start(&[
        "--store",
        &format!("postgres://u:hunter2@127.0.0.1:{dead}/x"),
    ]);
    assert_ne!(code, 0, "{said}");
    assert!(
        said.contains(&format!(
            "cannot connect to PostgreSQL at postgres://u@127.0.0.1:{dead}/x"
        )),
        "{said}"
    );
    assert!(!said.contains("hunter2"), "{said}");
}

#[test]
fn connections_postgres_ends_are_made_again_and_nothing_is_lost() {
    let pg = Postgres::shared();
    let db = pg.database();
    let hub = Hub::start_with_args(&[], &["--store", &pg.url(&db)]);
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "cut", "intent": "three signals", "members": ["a", "b", "c"]}),
    );
    assert_eq!(hub.signal(&body(&wp, json!({"member": "a"}))).0, 202);
    // Every connection of the hub's ended by the server (an administrator, a restart, a
    // proxy's timeout): the writer's, the bus's, and the pooled readers'.
    let ended = pg.query(
        &db,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
    assert_ne!(ended, "0", "the hub holds connections");
    // The next write and read find their connections gone, connect again and succeed.
    assert_eq!(hub.signal(&body(&wp, json!({"member": "b"}))).0, 202);
    let seen = hub.get_waitpoint(wp["id"].as_str().expect("id"));
    assert_eq!(seen["signals"].as_array().map(Vec::len), Some(2), "{seen}");
    assert!(
        hub.log()
            .contains("the store connected to PostgreSQL again"),
        "{}",
        hub.log()
    );
    assert_eq!(hub.signal(&body(&wp, json!({"member": "c"}))).0, 202);
}
