//! A rolling upgrade: while one voter runs an older build (here this build told to act as one
//! that knows fewer apply rules, `--test-apply-rules`, test builds only), the leader keeps writing the rules that voter
//! knows, so it applies every entry instead of stopping; once it runs the new build, the
//! leader writes the new rules. The same holds for a command only newer rules know: the
//! leader writes the limits of its flags (`SetLimits`, apply rules 4), and names the cluster
//! (`NameCluster`, apply rules 7), only once every voter
//! can read that entry.

use picket_testkit::cluster::{Cluster, send};
use picket_testkit::{ServerProcess, wait_until};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_picket"))
}

const TIMING: [&str; 6] =
    ["--heartbeat-ms", "50", "--election-timeout-ms", "300", "--max-sessions", "3"];

/// Opens a session, takes and releases a lock: entries the leader writes under its rules.
fn write_some(addrs: &[String], name: &str) {
    let session = send(
        addrs,
        "POST",
        "/v1/sessions",
        Some(&json!({ "ttl_ms": 30_000 })),
        Duration::from_secs(20),
    )
    .expect("the cluster answers");
    assert_eq!(session.status, 200, "{}", session.text);
    let session_id = session.body["session_id"].as_u64().expect("a session id");
    let body = json!({ "name": name, "session_id": session_id, "wait_ms": 0 });
    let granted = send(addrs, "POST", "/v1/locks/acquire", Some(&body), Duration::from_secs(20))
        .expect("the cluster answers");
    assert_eq!(granted.status, 200, "{}", granted.text);
    let token = granted.body["token"].as_u64().expect("a token");
    let body = json!({ "name": name, "session_id": session_id, "token": token });
    let released = send(addrs, "POST", "/v1/locks/release", Some(&body), Duration::from_secs(20))
        .expect("the cluster answers");
    assert_eq!(released.status, 200, "{}", released.text);
}

/// `picket_apply_rules_held_back` in `addr`'s metrics.
fn held_back(addr: &str) -> Option<u64> {
    let reply = picket_testkit::http::get(addr, "/metrics");
    reply
        .text
        .lines()
        .find_map(|line| line.strip_prefix("picket_apply_rules_held_back "))
        .and_then(|value| value.trim().parse().ok())
}

/// Regression (issue 21, "rolling upgrades"): the leader wrote every entry under its own
/// build's apply rules, so a voter still running an older build stopped at the first entry
/// (it refuses rules it does not know) and a cluster could only be upgraded all at once.
#[test]
fn a_cluster_writes_only_the_apply_rules_every_voter_knows_until_the_last_one_is_upgraded() {
    let timing: Vec<String> = TIMING.iter().map(|arg| (*arg).to_owned()).collect();
    let mut cluster = Cluster::start_each(binary(), 3, |id| {
        let mut args = timing.clone();
        if id == 3 {
            args.extend(["--test-apply-rules".to_owned(), "0".to_owned()]);
        }
        args
    });
    let addrs = cluster.addrs();
    // The old voter must follow. The node started last forms the cluster first (it finds every
    // peer up at once), so it often leads: stopped, it leaves the others to elect one of them.
    if cluster.leader(Duration::from_secs(20)) == 2 {
        cluster.nodes[2].kill();
        wait_until("a leader among the others", Duration::from_secs(20), || {
            cluster.agreed_leader()
        });
        cluster.nodes[2].restart();
    }
    assert_ne!(cluster.leader(Duration::from_secs(20)), 2, "the old voter follows");
    write_some(&addrs, "upgrade/before");
    cluster.wait_converged(Duration::from_secs(20));
    let leader_view = cluster.view(cluster.leader(Duration::from_secs(20)));
    assert_eq!(leader_view["apply_rules"], 0, "the old voter knows version 0 only: {leader_view}");
    let leader = cluster.leader(Duration::from_secs(20));
    assert_eq!(held_back(&addrs[leader]), Some(1), "the leader says it is held back");
    let old = cluster.view(2);
    assert_eq!(old["newest_applied_rules"], 0, "{old}");
    let default_sessions = picket_core::Limits::default().max_sessions;
    assert_eq!(leader_view["limits"]["max_sessions"], default_sessions, "no SetLimits yet");
    assert!(leader_view["cluster_id"].is_null(), "no NameCluster yet either: {leader_view}");
    // It converged with the others above: it applied every entry instead of stopping.
    assert!(old["applied_log_index"].as_u64().is_some_and(|index| index > 0), "{old}");

    // Node 3 is upgraded: the same data directory and address, the new build.
    let peers: Vec<String> =
        addrs.iter().enumerate().map(|(index, addr)| format!("{}={addr}", index + 1)).collect();
    let data_dir = cluster.data_dir(2);
    cluster.nodes[2].kill();
    let mut args =
        vec!["--node-id".to_owned(), "3".to_owned(), "--peers".to_owned(), peers.join(",")];
    args.extend(timing.clone());
    cluster.nodes[2] =
        ServerProcess::start(binary(), &data_dir, addrs[2].parse().expect("an address"), &args);
    wait_until("the leader to write the new rules", Duration::from_secs(20), || {
        let leader = cluster.agreed_leader()?;
        let rules = cluster.view(leader)["apply_rules"].as_u64()?;
        (rules == u64::from(picket_core::APPLY_RULES)).then_some(())
    });
    let leader = cluster.leader(Duration::from_secs(20));
    assert_eq!(held_back(&addrs[leader]), Some(0), "no longer held back");
    write_some(&addrs, "upgrade/after");
    cluster.wait_converged(Duration::from_secs(20));
    for index in 0..3 {
        let view = cluster.view(index);
        assert_eq!(
            view["newest_applied_rules"],
            picket_core::APPLY_RULES,
            "every node applied entries under the new rules: {view}"
        );
        wait_until("the flags' limits on every node", Duration::from_secs(20), || {
            (cluster.view(index)["limits"]["max_sessions"] == 3).then_some(())
        });
    }
    // Once every member knows rules 7, the leader names the cluster, alike on every node.
    let named = |index: usize| cluster.view(index)["cluster_id"].as_str().map(str::to_owned);
    let cluster_id = wait_until("the cluster to be named", Duration::from_secs(20), || named(0));
    for index in 1..3 {
        wait_until("every node to hold the name", Duration::from_secs(20), || {
            (named(index).as_deref() == Some(cluster_id.as_str())).then_some(())
        });
    }
}
