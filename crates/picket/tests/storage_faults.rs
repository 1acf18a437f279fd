//! A node whose storage fails, against a real `picket serve` built with the test storage faults
//! (`picket-server`'s `mutations` feature, which the tests compile).

use picket_testkit::http::try_request;
use picket_testkit::{free_port, temp_dir, wait_until};
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const PICKET: &str = env!("CARGO_BIN_EXE_picket");

/// Starts `picket serve` on `data` at `addr`; its log syncs fail while `trigger` exists.
fn serve(data: &Path, addr: &str, trigger: &Path) -> Child {
    let child = Command::new(PICKET)
        .args(["serve", "--data-dir"])
        .arg(data)
        .args(["--listen", addr])
        .env("PICKET_TEST_FAIL_SYNC", trigger)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start picket serve");
    wait_until("the node to be ready", Duration::from_secs(20), || {
        try_request(addr, "GET", "/readyz", None).ok().filter(|reply| reply.status == 200)
    });
    child
}

fn open_session(addr: &str) -> Option<u64> {
    let reply = try_request(addr, "POST", "/v1/sessions", Some(&json!({ "ttl_ms": 60_000 })));
    reply.ok()?.body["session_id"].as_u64()
}

/// Regression for what the fault harness's full disks found (0441dd8): a node whose Raft core
/// stopped because its log could not be written kept running and answered every request
/// "stopped" for ever, so nothing restarted it. Now it exits with status 1 at its first write
/// that cannot be made durable, without acknowledging it, and started again on the same data
/// it serves everything that was.
#[test]
fn a_node_whose_log_syncs_fail_exits_and_serves_what_was_durable_when_started_again() {
    let dir = temp_dir();
    let (data, trigger) = (dir.path().join("data"), dir.path().join("fail-sync"));
    let addr = format!("127.0.0.1:{}", free_port());
    let mut node = serve(&data, &addr, &trigger);
    let durable = open_session(&addr).expect("a session before the fault");

    std::fs::write(&trigger, b"").expect("the trigger");
    let unsynced = open_session(&addr);
    assert_eq!(unsynced, None, "a write whose sync failed was acknowledged");
    let status = wait_until("the node to exit", Duration::from_secs(20), || {
        node.try_wait().expect("the node's status")
    });
    assert_eq!(status.code(), Some(1), "it stops with an error, not a crash: {status}");

    std::fs::remove_file(&trigger).expect("the trigger goes");
    let mut again = serve(&data, &addr, &trigger);
    let sessions = try_request(&addr, "GET", "/v1/sessions", None).expect("sessions");
    let ids: Vec<u64> = sessions.body["sessions"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|session| session["session_id"].as_u64())
        .collect();
    assert!(ids.contains(&durable), "the durable session is back: {ids:?}");
    assert!(open_session(&addr).is_some(), "the node writes again");
    let _ = again.kill();
    let _ = again.wait();
}
