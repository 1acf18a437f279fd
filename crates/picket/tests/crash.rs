//! Crash safety of one node: `kill -9` while clients acquire and release in a loop, restart on
//! the same data directory, and check that every acknowledged grant and release is still
//! there and every new token is greater than every token acknowledged before the crash.
//! Repeated several times in one test.

use picket_testkit::http::{self, try_request};
use picket_testkit::{ServerProcess, temp_dir, wait_until};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const CLIENTS: usize = 4;
const CRASHES: usize = 3;

/// What a client last knows about its lock.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Known {
    /// Acknowledged: held under this token.
    Held(u64),
    /// Acknowledged: released (or never taken).
    Free,
}

/// One client's record: its last acknowledged state, and whether a request was in flight when
/// the server died (its outcome is unknown).
#[derive(Debug)]
struct Record {
    session: u64,
    name: String,
    known: Known,
    in_flight: Option<&'static str>,
    max_token: u64,
    operations: usize,
}

fn wait_for_leader(addr: &str) {
    wait_until("a leader", Duration::from_secs(15), || {
        try_request(addr, "GET", "/v1/cluster", None)
            .ok()
            .filter(|reply| reply.body["role"] == "leader")
            .map(|_| ())
    });
}

/// Acquires and releases in a loop until the server stops answering.
fn client_loop(addr: &str, mut record: Record, stop: &AtomicBool) -> Record {
    while !stop.load(Ordering::Relaxed) {
        let (path, body, op) = match record.known {
            Known::Free => (
                "/v1/locks/acquire",
                json!({ "name": record.name, "session_id": record.session, "wait_ms": 0 }),
                "acquire",
            ),
            Known::Held(token) => (
                "/v1/locks/release",
                json!({ "name": record.name, "session_id": record.session, "token": token }),
                "release",
            ),
        };
        record.in_flight = Some(op);
        let Ok(reply) = try_request(addr, "POST", path, Some(&body)) else { return record };
        assert_eq!(reply.status, 200, "{op} failed: {}", reply.text);
        record.in_flight = None;
        record.operations += 1;
        record.known = match record.known {
            Known::Free => {
                let token = reply.body["token"].as_u64().unwrap();
                assert!(token > record.max_token, "token {token} not above {}", record.max_token);
                record.max_token = token;
                Known::Held(token)
            }
            Known::Held(_) => Known::Free,
        };
    }
    record
}

/// After a restart, the lock must be in the acknowledged state, or (only if a request was in
/// flight) in the state that request would have produced.
fn reconcile(addr: &str, record: &mut Record) {
    let lock = http::get(addr, &format!("/v1/locks/{}", record.name));
    assert_eq!(lock.status, 200, "{}", lock.text);
    let holder = &lock.body["holder"];
    let actual = if holder.is_null() {
        Known::Free
    } else {
        assert_eq!(holder["session_id"], record.session);
        Known::Held(holder["token"].as_u64().unwrap())
    };
    match (&record.known, record.in_flight, &actual) {
        (known, _, actual) if known == actual => {}
        // An acquire in flight may have been applied: held under a newer token.
        (Known::Free, Some("acquire"), Known::Held(token)) if *token > record.max_token => {}
        // A release in flight may have been applied.
        (Known::Held(_), Some("release"), Known::Free) => {}
        (known, in_flight, actual) => {
            panic!(
                "{}: acknowledged {known:?} (in flight: {in_flight:?}) but found {actual:?}",
                record.name
            )
        }
    }
    if let Known::Held(token) = actual {
        record.max_token = record.max_token.max(token);
    }
    record.known = actual;
    record.in_flight = None;
}

#[test]
fn kill_9_loses_no_acknowledged_grant_and_tokens_keep_growing() {
    crash_repeatedly(&[]);
}

/// The same with the write-ahead log's smallest segments and frequent snapshots, so that the
/// kills land around segment rotations, checkpoints and purges.
#[test]
fn kill_9_across_wal_segment_rotations_and_snapshots_loses_nothing() {
    let args = ["--wal-segment-bytes", "65536", "--snapshot-every", "150", "--keep-entries", "20"];
    let generation = crash_repeatedly(&args.map(str::to_owned));
    // Every start begins a segment; anything beyond one per start was a rotation.
    assert!(
        generation > CRASHES as u64 + 1,
        "the log never rotated its segments (generation {generation})"
    );
}

/// A state of many sessions is snapshotted after a count of entries that grows with it (an
/// eighth of its sessions and locks), not after every `--snapshot-every` entries, which made a
/// node holding a million sessions write its whole state every 20,000 entries; the snapshot
/// that falls due as the last entries are applied is still taken once the node goes idle; and
/// a `kill -9` and restart rebuild every session from the last snapshot plus the log behind it.
#[test]
fn snapshots_grow_apart_with_the_state_and_a_restart_restores_it_whole() {
    const SESSIONS: u64 = 400;
    let dir = temp_dir();
    let mut server = ServerProcess::start(
        Path::new(env!("CARGO_BIN_EXE_picket")),
        &dir.path().join("data"),
        "127.0.0.1:0".parse().unwrap(),
        &["--snapshot-every", "1", "--keep-entries", "1"].map(str::to_owned),
    );
    wait_for_leader(&server.addr);
    let mut opened: Vec<u64> = (0..SESSIONS)
        .map(|_| {
            let reply = http::post(&server.addr, "/v1/sessions", &json!({ "ttl_ms": 600_000 }));
            assert_eq!(reply.status, 200, "{}", reply.text);
            reply.body["session_id"].as_u64().expect("a session id")
        })
        .collect();
    // Due once the log runs SESSIONS / 8 entries past the last snapshot.
    wait_until("the last due snapshot", Duration::from_secs(15), || {
        let view = http::get(&server.addr, "/v1/cluster").body;
        let applied = view["applied_log_index"].as_u64()?;
        let snapshot = view["snapshot_log_index"].as_u64()?;
        (applied >= SESSIONS && applied - snapshot < SESSIONS / 8).then_some(())
    });
    let built = snapshots_built(&server.addr);
    // One per entry until the state holds 16 records, then each about 1/8 further: about 44
    // for 400 sessions (fewer when entries arrive faster than snapshots are built, which
    // merges due ones). Every `--snapshot-every` entries gave 246 here.
    assert!((10.0..=60.0).contains(&built), "{built} snapshots for {SESSIONS} sessions");

    server.restart();
    wait_for_leader(&server.addr);
    let listed = http::get(&server.addr, "/v1/sessions").body;
    let mut restored: Vec<u64> = listed["sessions"]
        .as_array()
        .expect("a list of sessions")
        .iter()
        .map(|session| session["session_id"].as_u64().expect("a session id"))
        .collect();
    restored.sort_unstable();
    opened.sort_unstable();
    assert_eq!(restored, opened, "every session survives the restart");
}

/// How many snapshots the node at `addr` built since it started.
fn snapshots_built(addr: &str) -> f64 {
    let text = http::get(addr, "/metrics").text;
    text.lines()
        .find_map(|line| line.strip_prefix("picket_snapshot_build_seconds_count "))
        .and_then(|count| count.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// Runs the crash loop against a server started with `server_args`; returns the generation of
/// the write-ahead log's current segment at the end.
fn crash_repeatedly(server_args: &[String]) -> u64 {
    let dir = temp_dir();
    let mut server = ServerProcess::start(
        Path::new(env!("CARGO_BIN_EXE_picket")),
        &dir.path().join("data"),
        "127.0.0.1:0".parse().unwrap(),
        server_args,
    );
    wait_for_leader(&server.addr);
    let mut records: Vec<Record> = (0..CLIENTS)
        .map(|index| {
            let reply = http::post(&server.addr, "/v1/sessions", &json!({ "ttl_ms": 600_000 }));
            Record {
                session: reply.body["session_id"].as_u64().unwrap(),
                name: format!("crash/{index}"),
                known: Known::Free,
                in_flight: None,
                max_token: 0,
                operations: 0,
            }
        })
        .collect();

    for crash in 0..CRASHES {
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = records
            .drain(..)
            .map(|record| {
                let (addr, stop) = (server.addr.clone(), stop.clone());
                std::thread::spawn(move || client_loop(&addr, record, &stop))
            })
            .collect();
        // Let the clients get going, then kill the server mid-stream.
        let progress_addr = server.addr.clone();
        let start_revision =
            http::get(&progress_addr, "/v1/cluster").body["applied_revision"].as_u64().unwrap();
        wait_until("the clients to make progress", Duration::from_secs(20), || {
            let revision =
                http::get(&progress_addr, "/v1/cluster").body["applied_revision"].as_u64().unwrap();
            (revision > start_revision + 200).then_some(())
        });
        server.kill();
        stop.store(true, Ordering::Relaxed);
        records = handles.into_iter().map(|handle| handle.join().unwrap()).collect();
        let acknowledged_max = records.iter().map(|record| record.max_token).max().unwrap();
        assert!(
            records.iter().all(|record| record.operations > 0),
            "crash {crash}: a client made no progress"
        );

        server.restart();
        wait_for_leader(&server.addr);
        for record in &mut records {
            reconcile(&server.addr, record);
        }
        // A brand-new grant after the restart outranks every token acknowledged before it.
        let session = http::post(&server.addr, "/v1/sessions", &json!({ "ttl_ms": 600_000 })).body
            ["session_id"]
            .clone();
        let fresh = http::post(
            &server.addr,
            "/v1/locks/acquire",
            &json!({ "name": format!("fresh/{crash}"), "session_id": session, "wait_ms": 0 }),
        );
        let fresh_token = fresh.body["token"].as_u64().unwrap();
        assert!(
            fresh_token > acknowledged_max,
            "crash {crash}: new token {fresh_token} not above {acknowledged_max}"
        );
        assert_ne!(fresh.body, Value::Null);
    }
    let segments = std::fs::read_dir(dir.path().join("data").join("wal")).unwrap();
    segments
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().unwrap();
            u64::from_str_radix(name.strip_suffix(".wal")?, 16).ok()
        })
        .max()
        .expect("a WAL segment")
}
