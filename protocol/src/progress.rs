//! How far a waitpoint got: one rule ([`progress`]) for every view of it (the API's waitpoint
//! view, `cortex wait check`, the page), so no two of them can count differently. A barrier
//! counts each member once however often it reported; a monitor counts its wakes against
//! `max_signals`, not its reports against the quorum.

pub use crate::api::Progress;
use crate::api::{WaitpointView, WakeReason};
use crate::signal::SignalStatus;

/// What [`progress`] is computed from: the hub fills it from the engine's state, and a
/// view without `progress` (an older hub) from its listed signals ([`Facts::of_view`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    pub quorum: u32,
    pub max_signals: u32,
    /// What counts toward the quorum now, before the cap at `quorum`: distinct members
    /// with a terminal signal (with members) or terminal signals (without); a monitor's
    /// in its current round.
    pub counted: u64,
    pub reports: u64,
    pub failed: u64,
    pub heartbeats: u64,
    pub wakes: u32,
}

/// The one rule: the counts, capped, and the line people read.
pub fn progress(f: Facts) -> Progress {
    let quorum = f.quorum.max(1);
    let received = u32::try_from(f.counted.min(u64::from(quorum))).unwrap_or(quorum);
    let mut summary = if f.max_signals > 1 {
        let plural = if f.reports == 1 { "" } else { "s" };
        format!(
            "{}/{} wakes, {} report{plural}",
            f.wakes, f.max_signals, f.reports
        )
    } else {
        format!("{received}/{quorum}")
    };
    if f.failed > 0 {
        summary.push_str(&format!(" ({} failed)", f.failed));
    }
    if f.heartbeats > 0 {
        summary.push_str(&format!(" +{} progress", f.heartbeats));
    }
    Progress {
        received,
        quorum,
        reports: f.reports,
        failed: f.failed,
        heartbeats: f.heartbeats,
        wakes: f.wakes,
        max_signals: f.max_signals,
        summary,
    }
}

/// Whether a wake counts toward `max_signals`.
pub fn counts(reason: WakeReason) -> bool {
    !matches!(reason, WakeReason::Expired | WakeReason::Silent)
}

impl Facts {
    /// The facts a view's listed signals and wakes give (its latest signals only: the hub's
    /// own `progress`, from all of them, is preferred when it sent one).
    pub fn of_view(v: &WaitpointView) -> Facts {
        let terminal: Vec<_> = v
            .signals
            .iter()
            .filter(|s| s.status.is_terminal())
            .collect();
        let reports = terminal.len() as u64;
        let failed = terminal
            .iter()
            .filter(|s| s.status == SignalStatus::Fail)
            .count() as u64;
        let heartbeats = v.signal_count.max(v.signals.len() as u64) - reports;
        let delivered: Vec<_> = v
            .wakes
            .iter()
            .filter(|w| w.delivered && counts(w.reason))
            .collect();
        // A monitor's round began at its last counting wake; a one-shot has one round.
        let since = match (v.head.max_signals > 1, delivered.last()) {
            (true, Some(w)) => w.at,
            _ => 0,
        };
        let round: Vec<_> = terminal
            .iter()
            .filter(|s| s.at > since || since == 0)
            .collect();
        let counted = if v.head.members.is_empty() {
            round.len() as u64
        } else {
            let mut seen: Vec<&str> = Vec::new();
            for m in round.iter().filter_map(|s| s.member.as_deref()) {
                if !seen.contains(&m) {
                    seen.push(m);
                }
            }
            seen.len() as u64
        };
        Facts {
            quorum: v.head.quorum,
            max_signals: v.head.max_signals,
            counted,
            reports,
            failed,
            heartbeats,
            wakes: delivered.len() as u32,
        }
    }
}

impl WaitpointView {
    /// The hub's progress, else the same rule over the listed signals.
    pub fn progress(&self) -> Progress {
        self.progress
            .clone()
            .unwrap_or_else(|| progress(Facts::of_view(self)))
    }
}

#[cfg(test)]
mod tests;
