//! `picket chaos run`, short: a real 3-node cluster, the fenced store and four client
//! processes for 40 s under leader kills (inside and past the election timeout), follower kills
//! and client pauses aimed at a holder between its read and its write. The run must end
//! `valid`: every fault kind fired, no token granted twice or out of order, no stale write
//! admitted, no acknowledged append lost, and every node's log agrees.

use std::process::Command;

#[test]
fn a_short_chaos_run_under_kills_and_pauses_is_valid() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("run");
    let output = Command::new(env!("CARGO_BIN_EXE_picket"))
        .args(["chaos", "run", "--duration", "40s", "--seed", "5", "--fault-gap", "2s"])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("picket chaos runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let summary: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("summary.json")).expect("the run wrote its summary"),
    )
    .expect("the summary is JSON");
    assert_eq!(summary["verdict"], "valid", "{stdout}\n{stderr}");
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // The history holds the invocations and completions of every client, and the faults.
    let history = std::fs::read_to_string(out.join("history.jsonl")).expect("a history");
    assert!(history.lines().count() > 100, "a short history: {} lines", history.lines().count());
    assert!(summary["grants"].as_u64().unwrap_or(0) > 20, "{summary}");
}
