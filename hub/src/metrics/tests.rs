//! The exposition's names and shape, and the Grafana dashboard against them: every metric
//! the dashboard queries is one the hub exports.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use super::*;

/// The families a fresh set exports (from its `# TYPE` lines), with their types.
fn families(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let mut it = l.split(' ');
            (
                it.next().unwrap().to_string(),
                it.next().unwrap().to_string(),
            )
        })
        .collect()
}

/// The value of the sample `name{labels}` exactly as written.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A set with one sample in every family (a family with no series yet, such as the
/// signals before the first one, is left out of the exposition).
fn full() -> Metrics {
    let m = Metrics::new();
    m.signal("http", "accepted");
    m.wake("fired");
    m.remote_wait_armed("pid");
    m.notice("approval", "sent");
    m
}

#[test]
fn every_family_is_named_with_the_prefix_and_its_unit() {
    let text = full().encode(Fleet::default()).unwrap();
    let got = families(&text);
    let want = [
        ("cortex_devices", "gauge"),
        ("cortex_mesh_links", "gauge"),
        ("cortex_session_watchers", "gauge"),
        ("cortex_mesh_links_opened_total", "counter"),
        ("cortex_mesh_reconnects_total", "counter"),
        ("cortex_signals_total", "counter"),
        ("cortex_wakes_total", "counter"),
        ("cortex_waitpoints", "gauge"),
        ("cortex_remote_waits_armed_total", "counter"),
        ("cortex_notices_total", "counter"),
        ("cortex_store_commit_seconds", "histogram"),
        ("cortex_store_fsync_seconds", "histogram"),
        ("cortex_store_batches_logged_total", "counter"),
        ("cortex_bus_notifications_total", "counter"),
        ("cortex_bus_polled_batches_total", "counter"),
        ("cortex_claims_held", "gauge"),
        ("cortex_claim_renewals_total", "counter"),
        ("cortex_claims_lost_total", "counter"),
        ("cortex_exec_relayed_total", "counter"),
        ("cortex_exec_served_total", "counter"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    assert_eq!(got, want, "{text}");
    // Every state from the start, 0 included.
    let text = Metrics::new().encode(Fleet::default()).unwrap();
    for s in WAITPOINT_STATES {
        assert_eq!(
            sample(&text, &format!("cortex_waitpoints{{state=\"{s}\"}}")),
            Some(0.0),
            "{text}"
        );
    }
}

#[test]
fn what_is_recorded_is_what_is_shown() {
    let m = Metrics::new();
    m.signal("http", "accepted");
    m.signal("http", "accepted");
    m.signal("device:gpu1", "duplicate");
    m.wake("fired");
    m.waitpoint_moved(None, Some("armed"));
    m.waitpoint_moved(None, Some("armed"));
    m.waitpoint_moved(Some("armed"), Some("resolved"));
    m.waitpoint_moved(Some("resolved"), None);
    m.link_opened(false);
    m.link_opened(true);
    m.remote_wait_armed("pid");
    m.commit(0.0003);
    m.fsync(0.000_25);
    let text = m
        .encode(Fleet {
            online: 2,
            offline: 1,
            links: 2,
            session_watchers: 3,
        })
        .unwrap();
    let at = |s: &str| sample(&text, s).unwrap_or_else(|| panic!("no {s} in\n{text}"));
    assert_eq!(
        at(r#"cortex_signals_total{source="http",result="accepted"}"#),
        2.0
    );
    assert_eq!(
        at(r#"cortex_signals_total{source="device:gpu1",result="duplicate"}"#),
        1.0
    );
    assert_eq!(at(r#"cortex_wakes_total{reason="fired"}"#), 1.0);
    assert_eq!(at(r#"cortex_waitpoints{state="armed"}"#), 1.0);
    assert_eq!(at(r#"cortex_waitpoints{state="resolved"}"#), 0.0);
    assert_eq!(at("cortex_session_watchers"), 3.0);
    assert_eq!(at("cortex_mesh_links_opened_total"), 2.0);
    assert_eq!(at("cortex_mesh_reconnects_total"), 1.0);
    assert_eq!(at(r#"cortex_remote_waits_armed_total{kind="pid"}"#), 1.0);
    assert_eq!(at(r#"cortex_devices{state="online"}"#), 2.0);
    assert_eq!(at(r#"cortex_devices{state="offline"}"#), 1.0);
    assert_eq!(at("cortex_mesh_links"), 2.0);
    assert_eq!(at("cortex_store_commit_seconds_count"), 1.0);
    assert_eq!(at(r#"cortex_store_fsync_seconds_bucket{le="+Inf"}"#), 1.0);
    // 0.25 ms falls in the bucket up to 0.4 ms (50 µs doubling), not in the one below.
    assert_eq!(at(r#"cortex_store_fsync_seconds_bucket{le="0.0002"}"#), 0.0);
    assert_eq!(at(r#"cortex_store_fsync_seconds_bucket{le="0.0004"}"#), 1.0);
}

#[test]
fn the_grafana_dashboard_queries_only_exported_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/grafana/cortex-dashboard.json"
    );
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36);
    let vars = dash["templating"]["list"].as_array().unwrap();
    assert!(
        vars.iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "a Prometheus data source variable"
    );
    let exported: BTreeSet<String> = families(&full().encode(Fleet::default()).unwrap())
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for v in vars {
        if let Some(q) = v["definition"].as_str() {
            exprs.push(q.to_string());
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut queried = BTreeSet::new();
    for e in &exprs {
        let b = e.as_bytes();
        let mut i = 0;
        while let Some(at) = e[i..].find("cortex_") {
            let start = i + at;
            let mut end = start;
            while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
                end += 1;
            }
            queried.insert(e[start..end].to_string());
            i = end;
        }
    }
    for name in &queried {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| exported.contains(*f))
            .unwrap_or(name);
        assert!(
            exported.contains(family),
            "the dashboard queries {name}, which the hub does not export ({exported:?})"
        );
    }
    // And it shows every family the hub exports.
    for f in &exported {
        assert!(
            queried.iter().any(|q| q.starts_with(f.as_str())),
            "the dashboard shows nothing of {f}"
        );
    }
}
