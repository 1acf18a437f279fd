//! `GET /metrics` of `picket serve`: the exposition parses with a Prometheus text-format parser,
//! and the named metrics move as a client drives grants, handoffs, keepalives, an expiry with
//! a lock-delay, and refusals. A real server on a free loopback port.

use picket_testkit::http::{self, Reply};
use picket_testkit::{ServerProcess, wait_until};
use prometheus_parse::{LineInfo, Sample, Scrape, Value};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

const PICKET: &str = env!("CARGO_BIN_EXE_picket");

/// Scrapes `addr` and parses every line: each must be a comment or a well-formed sample.
fn scrape(addr: &str) -> Scrape {
    let reply = http::get(addr, "/metrics");
    assert_eq!(reply.status, 200, "{}", reply.text);
    parse(&reply.text)
}

fn parse(text: &str) -> Scrape {
    for line in text.lines() {
        match LineInfo::parse(line) {
            LineInfo::Sample { metric_name, value, .. } => {
                let parsed = value.parse::<f64>();
                assert!(parsed.is_ok(), "{metric_name}: value {value:?} is not a number");
            }
            LineInfo::Doc { .. } | LineInfo::Type { .. } | LineInfo::Empty => {}
            LineInfo::Ignored => {
                assert!(
                    line == "# EOF" || line.starts_with("# UNIT "),
                    "not Prometheus text: {line:?}"
                );
            }
        }
    }
    Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).expect("the exposition parses")
}

/// The value of the sample named `metric` whose labels include `labels` (0 when absent: a
/// counter that never moved is not listed).
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let matching: Vec<&Sample> = scrape
        .samples
        .iter()
        .filter(|sample| sample.metric == metric)
        .filter(|sample| labels.iter().all(|(key, value)| sample.labels.get(key) == Some(value)))
        .collect();
    matching
        .iter()
        .map(|sample| match &sample.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(buckets) => buckets.last().map_or(0.0, |bucket| bucket.count),
            Value::Summary(_) => panic!("{metric} is a summary"),
        })
        .sum()
}

fn open_session(addr: &str, ttl_ms: u64, lock_delay_ms: u64) -> u64 {
    let body = json!({ "ttl_ms": ttl_ms, "lock_delay_ms": lock_delay_ms });
    let reply = http::post(addr, "/v1/sessions", &body);
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.body["session_id"].as_u64().expect("a session id")
}

fn acquire(addr: &str, session: u64, name: &str, wait_ms: u64) -> Reply {
    http::post(
        addr,
        "/v1/locks/acquire",
        &json!({ "name": name, "session_id": session, "wait_ms": wait_ms }),
    )
}

fn release(addr: &str, session: u64, name: &str, token: u64) -> Reply {
    http::post(
        addr,
        "/v1/locks/release",
        &json!({ "name": name, "session_id": session, "token": token }),
    )
}

#[test]
fn metrics_parse_and_move_with_grants_handoffs_expiries_and_refusals() {
    let (_dir, server) = ServerProcess::start_ready(Path::new(PICKET), &[]);
    let addr = server.addr.clone();
    let before = scrape(&addr);
    assert_eq!(value(&before, "picket_raft_role", &[("role", "leader")]), 1.0);
    assert!(value(&before, "picket_raft_term", &[]) >= 1.0);
    assert!(value(&before, "picket_wal_syncs_total", &[]) >= 1.0, "starting writes the log");

    // A grant, a waiter queued behind it, and a handoff on release.
    let a = open_session(&addr, 30_000, 0);
    let b = open_session(&addr, 30_000, 0);
    let granted = acquire(&addr, a, "jobs/report", 0);
    assert_eq!(granted.status, 200, "{}", granted.text);
    let token = granted.body["token"].as_u64().expect("a token");
    let waiter = {
        let addr = addr.clone();
        std::thread::spawn(move || acquire(&addr, b, "jobs/report", 30_000))
    };
    wait_until("b to wait", Duration::from_secs(10), || {
        let queued = value(&scrape(&addr), "picket_lock_queue_depth", &[("lock", "jobs/report")]);
        (queued == 1.0).then_some(())
    });
    assert_eq!(value(&scrape(&addr), "picket_lock_waiters", &[]), 1.0);
    assert_eq!(release(&addr, a, "jobs/report", token).status, 200);
    let handed = waiter.join().expect("the waiter does not panic");
    assert_eq!(handed.status, 200, "{}", handed.text);

    // A refusal at the node (a stale token) and a keepalive written by a tick.
    let stale = release(&addr, b, "jobs/report", token);
    assert_eq!(stale.status, 409, "{}", stale.text);
    let refused_code = stale.body["code"].as_str().expect("a code").to_owned();
    assert_eq!(http::post(&addr, &format!("/v1/sessions/{a}/keepalive"), &json!({})).status, 200);

    // A session that holds a lock with a lock-delay and is not kept alive.
    // A lock-delay long enough to be in force when scraped, on a slow machine too.
    let quiet = open_session(&addr, 1_000, 30_000);
    assert_eq!(acquire(&addr, quiet, "batch/nightly", 0).status, 200);
    wait_until("the quiet session to expire", Duration::from_secs(10), || {
        let scraped = scrape(&addr);
        (value(&scraped, "picket_sessions_ended_total", &[("cause", "expired")]) >= 1.0)
            .then_some(scraped)
    });

    let after = scrape(&addr);
    let moved = |metric: &str, labels: &[(&str, &str)]| {
        value(&after, metric, labels) - value(&before, metric, labels)
    };
    assert_eq!(moved("picket_sessions_opened_total", &[]), 3.0);
    assert_eq!(moved("picket_grants_total", &[("prefix", "jobs")]), 2.0);
    assert_eq!(moved("picket_grants_total", &[("prefix", "batch")]), 1.0);
    assert_eq!(moved("picket_releases_total", &[("prefix", "jobs"), ("cause", "released")]), 1.0);
    assert_eq!(
        moved("picket_releases_total", &[("prefix", "batch"), ("cause", "session_expired")]),
        1.0
    );
    assert_eq!(moved("picket_lock_delays_total", &[("prefix", "batch")]), 1.0);
    assert_eq!(moved("picket_handoff_seconds_count", &[]), 1.0, "one release handed over");
    assert_eq!(moved("picket_acquire_wait_seconds_count", &[]), 1.0, "one acquire waited");
    assert!(moved("picket_refusals_total", &[("code", &refused_code)]) >= 1.0);
    assert!(moved("picket_keepalives_per_tick_count", &[]) >= 1.0);
    assert!(moved("picket_wal_syncs_total", &[]) >= 6.0);
    assert!(moved("picket_wal_written_bytes_total", &[]) > 0.0);
    assert!(moved("picket_wal_sync_seconds_count", &[]) >= 6.0);
    assert!(moved("picket_raft_commit_index", &[]) >= 6.0);
    assert_eq!(value(&after, "picket_sessions", &[]), 2.0, "a and b live on");
    // The queue gauges come from a walk of every lock made at most every 5 s.
    wait_until("the queue gauges to catch up", Duration::from_secs(15), || {
        let now = scrape(&addr);
        let gauges = ["picket_locks_held", "picket_lock_waiters", "picket_locks_delayed"]
            .map(|gauge| value(&now, gauge, &[]));
        // b holds jobs/report; nobody waits; batch/nightly is in its lock-delay.
        (gauges == [1.0, 0.0, 1.0]).then_some(())
    });
}

#[test]
fn configured_prefixes_label_lock_metrics_and_the_rest_count_as_other() {
    let (_dir, server) = ServerProcess::start_ready(
        Path::new(PICKET),
        &["--metrics-prefix", "tenant-a/,tenant-a/jobs/"],
    );
    let addr = server.addr.clone();
    let session = open_session(&addr, 30_000, 0);
    for name in ["tenant-a/jobs/x", "tenant-a/y", "tenant-b/z"] {
        assert_eq!(acquire(&addr, session, name, 0).status, 200);
    }
    let scraped = scrape(&addr);
    assert_eq!(value(&scraped, "picket_grants_total", &[("prefix", "tenant-a/jobs/")]), 1.0);
    assert_eq!(value(&scraped, "picket_grants_total", &[("prefix", "tenant-a/")]), 1.0);
    assert_eq!(value(&scraped, "picket_grants_total", &[("prefix", "other")]), 1.0);
}
