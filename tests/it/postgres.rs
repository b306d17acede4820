//! The throwaway PostgreSQL the store's second backend is tested on
//! (`cortex_tests::postgres`): a real cluster, durable settings, a database per test, and
//! nothing left running once it is dropped.

use cortex_tests::postgres::Postgres;

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
