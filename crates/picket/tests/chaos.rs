//! `picket chaos run`, short: a real 3-node cluster, the fenced store and four client
//! processes for about a minute under faults, twice. The runs must end `valid`: every fault kind fired
//! (a partition counts only if its rules dropped packets), no token granted twice or out of
//! order, no stale write admitted, no acknowledged append lost, no lock granted while its
//! holder still counted on its lease, and every node's log agrees.
//!
//! The first run kills the leader (inside and past the election timeout) and followers,
//! freezes clients between their read and their write, cuts the leader off from the followers,
//! splits the cluster into a majority and a minority with clients on both sides, and cuts a
//! stalled holder off from every node, and fails a node's log syncs (it must stop without
//! acknowledging them), and replaces a member with a new node through the API. The second is the leader's own misfortunes (issue 21):
//! stopped with SIGSTOP, its clock jumping or running fast or slow, a one-way cut from the
//! leader to a follower, and a bridge (the leader and a follower cut apart, the third node
//! reaching both); with them, the whole cluster killed and restarted at once, the store killed
//! and restarted, a node's data disk filled until it stops (then freed and the node
//! restarted), a power loss of the whole cluster (the first run has one of a single node), and
//! a holder stopped between its read and its write, past its session's end or across a
//! failover.
//!
//! Partitions need root, nftables and cgroup v2 (`scripts/test.sh` installs nftables); full
//! disks need root (each node's data is a tmpfs of its own).
//!
//! Then the proof that the checker can fail: runs with a deliberate bug switched on
//! (`--mutation`) must end `invalid`, with the violation that bug causes. The same
//! configuration without the bug is valid (each mutation's settings were run both ways).

use std::process::Command;
use std::sync::Mutex;

/// One run at a time: each is a cluster, a store and clients on the machine's two cores.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn a_short_chaos_run_under_kills_pauses_and_partitions_is_valid() {
    run_valid(
        "60s",
        &[
            "--seed",
            "5",
            "--faults",
            "leader_kill_quick,leader_kill_long,follower_kill,client_pause,partition_leader,\
         partition_split,client_isolate,power_loss,fsync_failure,link_delay,client_link_delay,\
         member_replace",
        ],
    );
}

#[test]
fn a_short_chaos_run_under_the_leaders_pauses_clocks_cuts_and_full_disks_is_valid() {
    run_valid(
        "80s",
        &[
            "--seed",
            "7",
            "--faults",
            "leader_pause,leader_clock_jump,leader_clock_rate,partition_one_way,partition_bridge,\
         cluster_restart,store_restart,disk_full,cluster_power_loss,holder_pause,\
         holder_pause_failover",
        ],
    );
}

/// A stale write needs a holder paused between its read and its write while its lock goes to
/// another. `holder_pause` waits for such a holder and pauses it past its session's end, so
/// every pause makes one (a 20 s run of `client_pause` and `client_isolate`, which only hope
/// to land there, missed it once in CI).
#[test]
fn the_checker_catches_a_fence_that_admits_everything() {
    let summary =
        run("20s", &["--seed", "3", "--faults", "holder_pause"], "fence_admits_everything");
    assert_eq!(summary["verdict"], "invalid", "{summary}");
    assert!(violations(&summary).iter().any(|v| v.contains("admitted a stale")), "{summary}");
}

#[test]
fn the_checker_catches_a_token_counter_that_resets_on_restart() {
    let summary = run(
        "20s",
        &["--seed", "3", "--faults", "cluster_restart"],
        "token_counter_resets_on_restart",
    );
    assert_eq!(summary["verdict"], "invalid", "{summary}");
    assert!(
        violations(&summary)
            .iter()
            .any(|v| v.contains("was granted to sessions") || v.contains("was granted after")),
        "a token granted twice or out of order: {summary}"
    );
}

/// A log that acknowledges before it syncs survives `kill -9` (the page cache keeps the write),
/// so only a power loss shows it: the cluster loses writes it acknowledged, and the checker
/// sees a safety violation that loss causes. Which one depends on what was lost: a grant
/// (its token granted again or out of order), an append (lost), or a release or an acquire
/// (the lock granted while its holder still counted on it, or a history no order of the
/// lock's operations explains), or a follower that committed an entry the new leader's log
/// contradicts (it stops, saying committed entries were lost). A node that merely exits is not
/// enough.
#[test]
fn the_checker_catches_a_log_that_acknowledges_before_syncing_under_power_loss() {
    let summary = run(
        "20s",
        &["--seed", "3", "--faults", "cluster_power_loss"],
        "wal_acknowledges_before_sync",
    );
    assert_eq!(summary["verdict"], "invalid", "{summary}");
    assert!(
        violations(&summary).iter().any(|v| [
            "was granted to sessions",
            "was granted after",
            "is lost",
            "without releasing it and counted on its lease",
            "not linearizable",
            "committed entries were lost",
        ]
        .iter()
        .any(|found| v.contains(found))),
        "a safety violation from acknowledged writes lost: {summary}"
    );
}

/// A new leader must give every session a full TTL on its own clock (`Refresh`): each node's
/// clock counts from its own origin, so deadlines another leader set mean nothing to it. With
/// the refresh replaced by a plain tick, a leader started more recently than the last one
/// expires every session it has not heard from at once, and a frozen holder whose lease still
/// runs loses its lock to a waiter: the checker sees the lock granted while the holder still
/// counted on it. (The clients live longer, 10 s TTLs, so their leases outlast a failover;
/// eight of them, so a waiter is there to take the lock.) It needs a holder's pause to span a
/// failover, which `holder_pause_failover` makes happen each time it fires (`client_pause` with
/// `leader_kill_long` only hoped for it, and a 30 s run of them missed it once in CI). The
/// break then shows when the new leader's process started after the one that set the deadlines
/// (its clock counts from a later origin), which depends on who wins the election: 30 s gives
/// it six or seven failovers.
#[test]
fn the_checker_catches_a_leader_that_expires_sessions_without_a_refresh() {
    let summary = run(
        "30s",
        &[
            "--seed",
            "3",
            "--clients",
            "8",
            "--ttl",
            "10s",
            "--think",
            "500ms",
            "--faults",
            "holder_pause_failover",
        ],
        "leader_expires_without_refresh",
    );
    assert_eq!(summary["verdict"], "invalid", "{summary}");
    assert!(
        violations(&summary).iter().any(|v| v.contains("counted on its lease")),
        "a lock granted while its holder still counted on its lease: {summary}"
    );
}

fn violations(summary: &serde_json::Value) -> Vec<String> {
    summary["violations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|violation| violation.as_str().map(str::to_owned))
        .collect()
}

/// Runs `picket chaos run` for `duration` with `extra` and the deliberate bug `mutation`, and
/// returns its summary.
fn run(duration: &str, extra: &[&str], mutation: &str) -> serde_json::Value {
    let (succeeded, summary, output) = run_chaos(duration, &[extra, &["--mutation", mutation]]);
    assert!(!succeeded, "a run with a bug must not succeed:\n{output}");
    summary
}

/// Runs `picket chaos run` for `duration` with `extra` and asserts its verdict is `valid`.
fn run_valid(duration: &str, extra: &[&str]) {
    let (succeeded, summary, output) = run_chaos(duration, &[extra]);
    assert_eq!(summary["verdict"], "valid", "{output}");
    assert!(succeeded, "{output}");
    // The history holds the invocations and completions of every client, and the faults.
    assert!(summary["history_lines"].as_u64().unwrap_or(0) > 100, "a short history: {summary}");
    assert!(summary["grants"].as_u64().unwrap_or(0) > 20, "{summary}");
}

/// Runs `picket chaos run` (one at a time) and returns whether it exited 0, its summary (with
/// the history's line count added as `history_lines`), and its output.
fn run_chaos(duration: &str, extra: &[&[&str]]) -> (bool, serde_json::Value, String) {
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("run");
    let output = Command::new(env!("CARGO_BIN_EXE_picket"))
        .args(["chaos", "run", "--duration", duration, "--fault-gap", "2s"])
        .args(extra.iter().copied().flatten())
        .arg("--out")
        .arg(&out)
        .output()
        .expect("picket chaos runs");
    // The run's directory goes with this function: what a failure needs of the processes'
    // logs is kept in the output it reports.
    let printed = format!(
        "{}\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        log_tails(&out)
    );
    let mut summary: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("summary.json"))
            .unwrap_or_else(|error| panic!("no summary ({error}):\n{printed}")),
    )
    .expect("the summary is JSON");
    let history = std::fs::read_to_string(out.join("history.jsonl")).unwrap_or_default();
    summary["history_lines"] = history.lines().count().into();
    (output.status.success(), summary, printed)
}

/// The last lines of each process's log in a run's directory (the nodes', the store's, the
/// clients'), in name order.
fn log_tails(out: &std::path::Path) -> String {
    const LINES: usize = 12;
    let mut logs: Vec<std::path::PathBuf> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
        .collect();
    logs.sort();
    let mut tails = String::new();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(LINES)..].join("\n");
        tails.push_str(&format!("--- the end of {} ---\n{tail}\n", log.display()));
    }
    tails
}
