//! The hub under a hostile local user or a careless operator: its files are private
//! whatever the umask, every refusal is the one JSON error shape (framework errors
//! included), every stored field has a cap, and idle or slowloris connections neither
//! stay open nor crowd out a well-behaved signal.

use std::os::unix::fs::PermissionsExt;

use cortex_tests::Hub;

#[test]
fn the_hubs_directory_and_files_are_private_whatever_the_umask() {
    // A wide umask, as a login shell has: the hub must not inherit it.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    let mut hub = Hub::start();
    // A session, so the store has written; then a clean stop, so every file exists.
    hub.session();
    assert!(hub.stop().success());
    let mode = |rel: &str| {
        let p = hub.home.join(rel);
        let m = std::fs::metadata(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode();
        m & 0o777
    };
    assert_eq!(mode("hub"), 0o700, "hub/");
    for f in [
        "hub/hub.redb",
        "hub/hub.journal",
        "hub/hub.journal2",
        "hub/token",
    ] {
        assert_eq!(mode(f), 0o600, "{f}");
    }
}
