//! The hub's metrics, served by `GET /metrics` in the Prometheus text format (0.0.4):
//! what the hub counts as it happens (signals, wakes, waitpoint states, links opened,
//! remote waits armed, notices sent or failed, the store's commit and fsync times) and what is read when scraped
//! (the fleet, from the device registry).
//!
//! One set per process ([`metrics`]), as there is one store per process: the store's
//! writer thread, the device links and the routes reach it without a handle passed
//! through every layer. Recording is an atomic add (a family's series is found under a
//! read lock, created once); no lock is held across an await.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The `Content-Type` of `GET /metrics`.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The waitpoint states, as the store names them (`engine::State::as_str`).
pub const WAITPOINT_STATES: [&str; 4] = ["armed", "resolved", "expired", "cancelled"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    source: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NoticeLabels {
    event: &'static str,
    result: &'static str,
}

/// What is read at scrape time rather than counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fleet {
    /// Enrolled devices with a live link.
    pub online: i64,
    /// Enrolled devices without one.
    pub offline: i64,
    /// The mesh's open links (past the hello).
    pub links: i64,
    /// Open long polls and SSE streams on sessions' event logs.
    pub session_watchers: i64,
}

/// Everything the hub counts.
pub struct Metrics {
    signals: Family<SignalLabels, Counter>,
    wakes: Family<ReasonLabels, Counter>,
    waitpoints: Family<StateLabels, Gauge>,
    links_opened: Counter,
    reconnects: Counter,
    remote_waits: Family<KindLabels, Counter>,
    notices: Family<NoticeLabels, Counter>,
    commit: Histogram,
    fsync: Histogram,
    cluster: Cluster,
}

/// What a hub sharing its store with others counts: its side of the bus and its claims.
#[derive(Default)]
struct Cluster {
    logged: Counter,
    heard: Counter,
    polled: Counter,
    claims: Gauge,
    renewed: Counter,
    lost: Counter,
    relayed: Counter,
    served: Counter,
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static M: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &M
}

/// Latency buckets from 50 µs to about 1.6 s (doubling): an fdatasync on an SSD is tens
/// of microseconds to a few milliseconds, a group commit under load tens of them.
fn latency_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let m = Metrics {
            signals: Family::default(),
            wakes: Family::default(),
            waitpoints: Family::default(),
            links_opened: Counter::default(),
            reconnects: Counter::default(),
            remote_waits: Family::default(),
            notices: Family::default(),
            commit: latency_buckets(),
            fsync: latency_buckets(),
            cluster: Cluster::default(),
        };
        // Every state is shown from the start, 0 included.
        for state in WAITPOINT_STATES {
            m.waitpoints.get_or_create(&StateLabels { state }).set(0);
        }
        m
    }

    /// A signal the store answered: `source` as stored (`http`, `spool`, `device:NAME`,
    /// `device-wait`), `result` as [`crate::intake::SignalOutcome::as_str`] says.
    pub fn signal(&self, source: &str, result: &'static str) {
        self.signals
            .get_or_create(&SignalLabels {
                source: source.to_owned(),
                result,
            })
            .inc();
    }

    /// A wake delivered into a session's log, by its reason (`fired`, `failed`, …).
    pub fn wake(&self, reason: &'static str) {
        self.wakes.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// A waitpoint moved from `from` (`None`: created) to `to` (`None`: forgotten).
    pub fn waitpoint_moved(&self, from: Option<&'static str>, to: Option<&'static str>) {
        if from == to {
            return;
        }
        if let Some(state) = from {
            self.waitpoints.get_or_create(&StateLabels { state }).dec();
        }
        if let Some(state) = to {
            self.waitpoints.get_or_create(&StateLabels { state }).inc();
        }
    }

    /// The waitpoints by state as the store holds them at start.
    pub fn set_waitpoints(&self, counts: &[(&'static str, i64)]) {
        for &(state, n) in counts {
            self.waitpoints.get_or_create(&StateLabels { state }).set(n);
        }
    }

    /// A device's link passed its hello; `again`: that device had one before since the
    /// hub started (a reconnect).
    pub fn link_opened(&self, again: bool) {
        self.links_opened.inc();
        if again {
            self.reconnects.inc();
        }
    }

    /// A remote wait was created (durably), by kind (`pid`, `file`, …).
    pub fn remote_wait_armed(&self, kind: &'static str) {
        self.remote_waits.get_or_create(&KindLabels { kind }).inc();
    }

    /// One delivery attempt of an outgoing notice whose outcome is durable, by event
    /// (`approval`, `failed`, …) and result: `sent` (2xx), `retry` (it is tried again
    /// later), `failed` (given up).
    pub fn notice(&self, event: &'static str, result: &'static str) {
        self.notices
            .get_or_create(&NoticeLabels { event, result })
            .inc();
    }

    /// One group commit: from its first job run to its callers answered.
    pub fn commit(&self, seconds: f64) {
        self.commit.observe(seconds);
    }

    /// One fdatasync of the store's journal.
    pub fn fsync(&self, seconds: f64) {
        self.fsync.observe(seconds);
    }

    /// A batch of the store written to the batches log, its number sent as a `NOTIFY`.
    pub fn batch_logged(&self) {
        self.cluster.logged.inc();
    }

    /// Notifications of other hubs' batches heard.
    pub fn bus_heard(&self, n: usize) {
        self.cluster.heard.inc_by(n as u64);
    }

    /// Other hubs' batches found by the bus's poll, with no notification heard.
    pub fn bus_polled(&self, n: usize) {
        self.cluster.polled.inc_by(n as u64);
    }

    /// The sessions this hub holds a claim on now.
    pub fn claims_held(&self, n: usize) {
        self.cluster.claims.set(n as i64);
    }

    /// Claims renewed, and claims found lost (taken by another hub once they ran out).
    pub fn claims_renewed(&self, renewed: usize, lost: usize) {
        self.cluster.renewed.inc_by(renewed as u64);
        self.cluster.lost.inc_by(lost as u64);
    }

    /// A `device_exec` asked of another hub (it holds the device's link).
    pub fn exec_relayed(&self) {
        self.cluster.relayed.inc();
    }

    /// A `device_exec` another hub asked, started over this hub's link.
    pub fn exec_served(&self) {
        self.cluster.served.inc();
    }

    /// The exposition: the counters as they stand and `fleet` as read now.
    pub fn encode(&self, fleet: Fleet) -> Result<String, std::fmt::Error> {
        let mut reg = Registry::default();
        let devices = Family::<StateLabels, Gauge>::default();
        devices
            .get_or_create(&StateLabels { state: "online" })
            .set(fleet.online);
        devices
            .get_or_create(&StateLabels { state: "offline" })
            .set(fleet.offline);
        reg.register("cortex_devices", "Enrolled devices, by state", devices);
        let links = Gauge::<i64>::default();
        links.set(fleet.links);
        reg.register("cortex_mesh_links", "Open device links", links);
        let watchers = Gauge::<i64>::default();
        watchers.set(fleet.session_watchers);
        reg.register(
            "cortex_session_watchers",
            "Open long polls and SSE streams on sessions' event logs",
            watchers,
        );
        reg.register(
            "cortex_mesh_links_opened",
            "Device links opened (past the hello) since the hub started",
            self.links_opened.clone(),
        );
        reg.register(
            "cortex_mesh_reconnects",
            "Links opened by a device that had one before since the hub started",
            self.reconnects.clone(),
        );
        reg.register(
            "cortex_signals",
            "Signals answered, by source (http, spool, device:NAME, device-wait) and result",
            self.signals.clone(),
        );
        reg.register(
            "cortex_wakes",
            "Wakes delivered into a session's log, by reason",
            self.wakes.clone(),
        );
        reg.register(
            "cortex_waitpoints",
            "Waitpoints the store holds, by state (ended ones until they are forgotten)",
            self.waitpoints.clone(),
        );
        reg.register(
            "cortex_remote_waits_armed",
            "Remote waits created, by kind",
            self.remote_waits.clone(),
        );
        reg.register(
            "cortex_notices",
            "Outgoing notices' delivery attempts, by event and result (sent, retry, failed)",
            self.notices.clone(),
        );
        reg.register_with_unit(
            "cortex_store_commit",
            "One group commit of the store: its jobs run, journaled, fdatasynced, answered",
            Unit::Seconds,
            self.commit.clone(),
        );
        reg.register_with_unit(
            "cortex_store_fsync",
            "One fdatasync of the store's journal",
            Unit::Seconds,
            self.fsync.clone(),
        );
        let c = &self.cluster;
        reg.register(
            "cortex_store_batches_logged",
            "Batches written to the shared store's batches log, each sent as one NOTIFY",
            c.logged.clone(),
        );
        reg.register(
            "cortex_bus_notifications",
            "Notifications of other hubs' batches heard",
            c.heard.clone(),
        );
        reg.register(
            "cortex_bus_polled_batches",
            "Other hubs' batches found by the bus's poll with no notification heard",
            c.polled.clone(),
        );
        reg.register(
            "cortex_claims_held",
            "Sessions this hub holds a claim on",
            c.claims.clone(),
        );
        reg.register(
            "cortex_claim_renewals",
            "Claims on sessions renewed",
            c.renewed.clone(),
        );
        reg.register(
            "cortex_claims_lost",
            "Claims on sessions found taken by another hub",
            c.lost.clone(),
        );
        reg.register(
            "cortex_exec_relayed",
            "device_exec asks sent to the hub holding the device's link",
            c.relayed.clone(),
        );
        reg.register(
            "cortex_exec_served",
            "device_exec asks of other hubs started over this hub's links",
            c.served.clone(),
        );
        let mut out = String::new();
        prometheus_text::encode(&mut out, &reg)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
