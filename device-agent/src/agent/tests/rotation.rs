//! The hub rotation's rule (`rotation.rs`): the next URL at once, the backoff per round.

use crate::agent::rotation::{Rotation, Step};

const WAIT: Step = Step::Backoff { at_cap: false };

#[test]
fn one_url_waits_for_the_backoff_after_every_failure_as_a_single_hub_did() {
    let mut r = Rotation::new(1);
    for _ in 0..3 {
        assert_eq!(r.failed(false), WAIT);
        assert_eq!(r.current(), 0);
    }
    assert_eq!(r.failed(true), Step::Backoff { at_cap: true });
}

#[test]
fn a_failure_moves_to_the_next_url_at_once_and_the_round_ends_with_the_backoff() {
    let mut r = Rotation::new(3);
    assert_eq!(r.current(), 0);
    assert_eq!(r.failed(false), Step::Now);
    assert_eq!(r.current(), 1);
    assert_eq!(r.failed(false), Step::Now);
    assert_eq!(r.current(), 2);
    assert_eq!(r.failed(false), WAIT);
    assert_eq!(r.current(), 0, "wraps to the first");
    assert_eq!(r.failed(false), Step::Now, "a new round");
}

#[test]
fn links_that_come_up_and_die_still_cost_one_backoff_per_round() {
    // Nothing but `failed` between: a link that was up but never stable does not
    // start a new round.
    let mut r = Rotation::new(2);
    assert_eq!(r.failed(false), Step::Now);
    assert_eq!(r.failed(false), WAIT);
    assert_eq!(r.failed(false), Step::Now);
    assert_eq!(r.failed(false), WAIT);
}

#[test]
fn a_stable_link_starts_a_new_round_on_the_url_it_is_on() {
    let mut r = Rotation::new(2);
    assert_eq!(r.failed(false), Step::Now);
    assert_eq!(r.current(), 1);
    r.new_round();
    assert_eq!(r.current(), 1);
    assert_eq!(r.failed(false), Step::Now, "the other hub is tried at once");
    assert_eq!(r.current(), 0);
    assert_eq!(r.failed(false), WAIT);
}

#[test]
fn the_wait_is_at_the_cap_only_when_every_hub_of_the_round_needs_an_operator() {
    let mut r = Rotation::new(2);
    assert_eq!(
        r.failed(true),
        Step::Now,
        "a refusal moves on to the next hub"
    );
    assert_eq!(r.failed(false), WAIT, "the other was only unreachable");
    assert_eq!(r.failed(true), Step::Now);
    assert_eq!(r.failed(true), Step::Backoff { at_cap: true });
    assert_eq!(r.failed(false), Step::Now);
    assert_eq!(r.failed(true), WAIT);
}
