//! The short run inside the normal suite: every corpus file of a target through its
//! properties (seeds and every failure found so far), then a few seconds of generated
//! cases. A failure names the input saved in the corpus.

use std::time::Duration;

use crate::driver::{self, Budget, Target};

/// Per target: short enough for the suite on two cores, long enough for a few thousand
/// parser cases (the journal's, a store open each, get far fewer).
const SHORT: Budget = Budget {
    time: Duration::from_secs(4),
    max_cases: 20_000,
};

fn short_run(t: &Target) {
    let failed = driver::replay(t);
    let known = failed
        .iter()
        .map(|(_, why)| driver::signature(why))
        .collect();
    let out = (t.fuzz)(SHORT, known);
    eprintln!(
        "{}: {} generated cases, {} failing like a corpus file",
        t.name, out.cases, out.known
    );
    assert!(
        failed.is_empty(),
        "{}: corpus inputs fail (a bug found earlier and not fixed yet): {failed:#?}",
        t.name
    );
    assert!(out.cases > 0, "{}: no case ran", t.name);
    assert!(
        out.failures.is_empty(),
        "{}: new failures, saved in the corpus: {:#?}",
        t.name,
        out.failures
    );
}

#[test]
fn signal() {
    short_run(&crate::signal::TARGET);
}

#[test]
fn frames() {
    short_run(&crate::frames::TARGET);
}

#[test]
fn spool() {
    short_run(&crate::spool::TARGET);
}

#[test]
fn journal() {
    short_run(&crate::journal::TARGET);
}

#[test]
fn crc32c_check_value() {
    // The standard check value of CRC-32C over "123456789".
    assert_eq!(crate::journal::crc32c(&[b"1234", b"56789"]), 0xE306_9283);
}

#[test]
fn failures_of_one_kind_share_a_signature() {
    let a = driver::signature(
        "panicked: called `Result::unwrap()` on an `Err` value: Utf8Error { valid_up_to: 0 } at /x/redb/src/types.rs:803",
    );
    let b = driver::signature(
        "panicked: called `Result::unwrap()` on an `Err` value: Utf8Error { valid_up_to: 3 } at /x/redb/src/types.rs:803",
    );
    assert_eq!(a, b);
    assert_eq!(
        a,
        driver::signature("panicked: slice index at /x/redb/src/types.rs:998")
    );
    assert_ne!(
        a,
        driver::signature("panicked: index out of bounds at /x/y.rs:1")
    );
    assert_eq!(
        driver::signature("accepted message of 2001 characters (cap 2000)"),
        driver::signature("accepted message of 2005 characters (cap 2000)")
    );
}

#[test]
fn mutations_stay_in_bounds() {
    use driver::Mutation::*;
    let muts = [
        Flip(99, 1),
        Remove(5, 100),
        Truncate(3),
        Splice(1, 0, 50),
        Insert(7, vec![9]),
    ];
    assert_eq!(driver::mutate(b"", &muts), vec![9]);
    assert_eq!(driver::mutate(b"abcd", &[Splice(0, 2, 9)]), b"ababcd");
    assert_eq!(driver::mutate(b"abcd", &[Remove(1, 2)]), b"ad");
    assert_eq!(driver::mutate(b"abc", &[Truncate(1)]), b"ab");
    assert_eq!(driver::mutate(b"abc", &[Flip(4, 1)]), b"acc");
}
