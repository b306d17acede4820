//! Which of the configured hubs the next dial goes to, and whether it waits for the
//! backoff first. Pure: no clock, no I/O, no random source; the daemon loop asks it after
//! each failed dial or lost link and draws the delay from [`super::backoff`] itself.
//!
//! The rule: every failure (a dial that gave no link, or an established link that died)
//! moves on to the next URL in order, wrapping. The backoff applies once per *round*: after
//! as many failures in a row as there are URLs, counted since the last stable link. So a
//! dead first hub costs no wait before the second is tried, and hubs that all accept and
//! then drop still get one backoff per round, never a tight loop. With one URL every
//! failure ends a round: the agent behaves exactly as with a single `--hub`.

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Dial the next URL at once: the round is not over.
    Now,
    /// The round is over: wait for the backoff before dialing. `at_cap` when every failure
    /// of the round was one only an operator fixes (a refused token, another protocol
    /// version): then the wait is near the backoff's cap, as for a single hub that refuses.
    Backoff { at_cap: bool },
}

/// The rotation over `len` hub URLs.
#[derive(Debug, Clone)]
pub struct Rotation {
    len: usize,
    current: usize,
    /// Failures in the round so far.
    tries: usize,
    /// Every failure of the round so far needed an operator.
    all_operator: bool,
}

impl Rotation {
    /// Starts at the first URL. `len` 0 is taken as 1.
    pub fn new(len: usize) -> Rotation {
        Rotation {
            len: len.max(1),
            current: 0,
            tries: 0,
            all_operator: true,
        }
    }

    /// The index of the URL the next dial goes to.
    pub fn current(&self) -> usize {
        self.current
    }

    /// The attempt on the current URL failed (`needs_operator`: only a person fixes what
    /// it met): move to the next URL, and say whether to wait first.
    pub fn failed(&mut self, needs_operator: bool) -> Step {
        self.tries += 1;
        self.all_operator &= needs_operator;
        self.current = (self.current + 1) % self.len;
        if self.tries < self.len {
            return Step::Now;
        }
        let at_cap = self.all_operator;
        self.new_round();
        Step::Backoff { at_cap }
    }

    /// The link proved stable (the same moment the backoff resets), or a new token is to be
    /// tried: the next failure starts a new round. The current URL stays.
    pub fn new_round(&mut self) {
        self.tries = 0;
        self.all_operator = true;
    }
}
