//! Hostile input against a real `picket serve` (issue 13).
//!
//! Regression for point 1 of the issue: refused commands entered the Raft log. `Acquire`,
//! `Release` and `Cancel` were proposed before anything was validated, and refused only at
//! apply, after the entry was durable: 200 acquires with 60,000-byte names cost 200 syncs and
//! 12 MB of log, and kept on, a crash loop. Now a refusal that no later entry could overturn
//! (bad input, a session that ended for good) is answered before the log on any node, and a
//! settled leader answers every other refusal from its applied state, before the log too.

use picket_proto::ERROR_CODE_KEY;
use picket_proto::v1::picket_client::PicketClient;
use picket_proto::v1::{self};
use picket_testkit::http::{Reply, get, post};
use picket_testkit::{ServerProcess, wait_until};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use tonic::Status;

fn applied_log_index(addr: &str) -> u64 {
    get(addr, "/v1/cluster").body["applied_log_index"].as_u64().expect("an applied index")
}

fn assert_refused(reply: &Reply, code: &str) {
    assert_eq!(reply.body["code"], code, "{}", reply.text);
}

fn grpc_code(status: &Status) -> &str {
    status.metadata().get(ERROR_CODE_KEY).and_then(|value| value.to_str().ok()).unwrap_or_default()
}

fn picket_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_picket"))
}

fn acquire(name: &str, session_id: u64, wait_ms: Option<u64>) -> Value {
    json!({ "name": name, "session_id": session_id, "wait_ms": wait_ms })
}

#[tokio::test]
async fn refused_commands_never_enter_the_raft_log() {
    let (_dir, server) = ServerProcess::start_ready(picket_binary(), &[]);
    let addr = server.addr.clone();
    let opened = post(&addr, "/v1/sessions", &json!({ "ttl_ms": 60_000 }));
    let session = opened.body["session_id"].as_u64().expect("a session");
    // A closed session is unknown for good: session ids are revisions, never reused.
    let closed = post(&addr, "/v1/sessions", &json!({ "ttl_ms": 60_000 }));
    let ended = closed.body["session_id"].as_u64().expect("a session");
    let reply =
        picket_testkit::http::request(&addr, "DELETE", &format!("/v1/sessions/{ended}"), None);
    assert_eq!(reply.status, 200, "{}", reply.text);
    let before = applied_log_index(&addr);

    let long_name = "x".repeat(60_000);
    for _ in 0..200 {
        let reply = post(&addr, "/v1/locks/acquire", &acquire(&long_name, session, Some(0)));
        assert_refused(&reply, "invalid_name");
    }
    let nul_name = "\u{0}".repeat(100);
    assert_refused(
        &post(&addr, "/v1/locks/acquire", &acquire(&nul_name, session, None)),
        "invalid_name",
    );
    let release = json!({ "name": nul_name, "session_id": session, "token": 1 });
    assert_refused(&post(&addr, "/v1/locks/release", &release), "invalid_name");
    assert_refused(&post(&addr, "/v1/sessions", &json!({ "ttl_ms": 0 })), "ttl_out_of_range");
    let delay = json!({ "ttl_ms": 10_000, "lock_delay_ms": 999_999_999 });
    assert_refused(&post(&addr, "/v1/sessions", &delay), "lock_delay_out_of_range");
    let too_long = acquire("jobs/x", session, Some(u64::MAX / 2));
    assert_refused(&post(&addr, "/v1/locks/acquire", &too_long), "wait_out_of_range");
    assert_refused(
        &post(&addr, "/v1/locks/acquire", &acquire("jobs/x", ended, Some(0))),
        "unknown_session",
    );
    let release = json!({ "name": "jobs/x", "session_id": ended, "token": 1 });
    assert_refused(&post(&addr, "/v1/locks/release", &release), "unknown_session");
    let cancel = json!({ "name": "jobs/x", "session_id": ended });
    assert_refused(&post(&addr, "/v1/locks/cancel", &cancel), "unknown_session");
    let abandon = json!({ "name": "jobs/x", "session_id": ended, "request_id": 5 });
    assert_refused(&post(&addr, "/v1/locks/abandon", &abandon), "unknown_session");
    assert_refused(
        &post(&addr, &format!("/v1/sessions/{ended}/revoke"), &json!({})),
        "unknown_session",
    );

    assert_eq!(applied_log_index(&addr), before, "a refused command reached the log");

    // Refusals that depend on the state: a settled leader answers them from its applied state.
    let other = post(&addr, "/v1/sessions", &json!({ "ttl_ms": 60_000 }));
    let other = other.body["session_id"].as_u64().expect("a session");
    let held = post(&addr, "/v1/locks/acquire", &acquire("jobs/held", other, Some(0)));
    let held_token = held.body["token"].as_u64().expect("a token");
    let before = applied_log_index(&addr);
    for _ in 0..50 {
        let busy = post(&addr, "/v1/locks/acquire", &acquire("jobs/held", session, Some(0)));
        assert_refused(&busy, "lock_busy");
    }
    // A retry (attempt above 0) whose earlier attempts are all applied is answered from the
    // state too; only one whose earlier attempt may still be on its way goes to the log.
    for attempt in 1..=20 {
        let retry = json!({ "name": "jobs/held", "session_id": session, "wait_ms": 0,
                            "request_id": 900 + attempt, "attempt": attempt });
        assert_refused(&post(&addr, "/v1/locks/acquire", &retry), "lock_busy");
    }
    let release = json!({ "name": "jobs/held", "session_id": session, "token": held_token });
    assert_refused(&post(&addr, "/v1/locks/release", &release), "not_held");
    let release = json!({ "name": "jobs/held", "session_id": other, "token": held_token + 1 });
    assert_refused(&post(&addr, "/v1/locks/release", &release), "token_mismatch");
    let cancel = json!({ "name": "jobs/held", "session_id": session });
    assert_refused(&post(&addr, "/v1/locks/cancel", &cancel), "not_waiting");
    // A watch of a name, or a prefix, no lock could have (found in review: each stream kept
    // it, whatever its length).
    let long = "n".repeat(300);
    for query in [format!("name={long}"), format!("prefix={long}"), "name=a%01b".to_owned()] {
        assert_refused(&get(&addr, &format!("/v1/watch?{query}")), "invalid_name");
    }
    // An abandon of a session not issued yet (found in review: each wrote a log entry, refused
    // only at apply).
    for unissued in [u64::MAX, before + 1_000] {
        let abandon = json!({ "name": "jobs/x", "session_id": unissued, "request_id": 5 });
        assert_refused(&post(&addr, "/v1/locks/abandon", &abandon), "unknown_session");
    }

    let mut grpc = PicketClient::connect(format!("http://{addr}")).await.expect("connects");
    for _ in 0..50 {
        let request = v1::AcquireRequest {
            name: long_name.clone(),
            session_id: session,
            wait_ms: Some(0),
            request_id: None,
            attempt: 0,
        };
        let refused = grpc.acquire(request).await.expect_err("refused");
        assert_eq!(grpc_code(&refused), "invalid_name");
    }
    let retry = v1::AcquireRequest {
        name: "jobs/held".to_owned(),
        session_id: session,
        wait_ms: Some(0),
        request_id: Some(950),
        attempt: 2,
    };
    let refused = grpc.acquire(retry).await.expect_err("refused");
    assert_eq!(grpc_code(&refused), "lock_busy");
    let refused = grpc
        .open_session(v1::OpenSessionRequest { ttl_ms: 0, lock_delay_ms: 0, ..Default::default() })
        .await
        .expect_err("refused");
    assert_eq!(grpc_code(&refused), "ttl_out_of_range");
    let release = v1::ReleaseRequest { name: "jobs/x".to_owned(), session_id: ended, token: 1 };
    let refused = grpc.release(release).await.expect_err("refused");
    assert_eq!(grpc_code(&refused), "unknown_session");
    let abandon = v1::AbandonRequest {
        name: "jobs/x".to_owned(),
        session_id: u64::MAX,
        request_id: 5,
        attempt: 0,
    };
    let refused = grpc.abandon(abandon).await.expect_err("refused");
    assert_eq!(grpc_code(&refused), "unknown_session");

    assert_eq!(applied_log_index(&addr), before, "a refused command reached the log");
    // The index does move for a command that is accepted, so the check above can fail.
    let granted = post(&addr, "/v1/locks/acquire", &acquire("jobs/x", session, Some(0)));
    assert_eq!(granted.status, 200, "{}", granted.text);
    assert_eq!(applied_log_index(&addr), before + 1);
}

/// Opens a watch stream by hand; returns the response's status line and the open connection.
fn open_watch(addr: &str) -> (String, std::net::TcpStream) {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("a timeout");
    let head = format!("GET /v1/watch?prefix=jobs/ HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    stream.write_all(head.as_bytes()).expect("send");
    let mut status_line = String::new();
    BufReader::new(stream.try_clone().expect("a clone"))
        .read_line(&mut status_line)
        .expect("a status line");
    (status_line, stream)
}

/// Issue 13, point 2 (in part): a node bounds its watch streams and its acquires in flight,
/// refuses past the bound with 429 and a code naming it, and takes a place back when a stream
/// or a request ends.
#[test]
fn watch_streams_and_pending_acquires_are_bounded_per_node() {
    let (_dir, server) = ServerProcess::start_ready(
        picket_binary(),
        &["--max-watch-streams", "2", "--max-pending-acquires", "1"],
    );
    let addr = server.addr.clone();

    let first = open_watch(&addr);
    let second = open_watch(&addr);
    assert!(first.0.contains(" 200 ") && second.0.contains(" 200 "), "{first:?} {second:?}");
    let refused = get(&addr, "/v1/watch?prefix=jobs/");
    assert_eq!(refused.status, 429, "{}", refused.text);
    assert_refused(&refused, "too_many_watch_streams");
    drop(first);
    let _third = wait_until("a freed place for a watch", Duration::from_secs(10), || {
        let (status_line, stream) = open_watch(&addr);
        status_line.contains(" 200 ").then_some(stream)
    });

    let open = |ttl_ms: u64| {
        post(&addr, "/v1/sessions", &json!({ "ttl_ms": ttl_ms })).body["session_id"]
            .as_u64()
            .expect("a session")
    };
    let (holder, waiter, other) = (open(60_000), open(60_000), open(60_000));
    let held = post(&addr, "/v1/locks/acquire", &acquire("jobs/l", holder, Some(0)));
    let token = held.body["token"].as_u64().expect("a token");
    let waiting = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            post(&addr, "/v1/locks/acquire", &acquire("jobs/l", waiter, Some(30_000)))
        })
    };
    wait_until("the waiter to queue", Duration::from_secs(10), || {
        let lock = get(&addr, "/v1/locks/jobs/l").body;
        lock["waiters"].as_array()?.contains(&json!(waiter)).then_some(())
    });
    let refused = post(&addr, "/v1/locks/acquire", &acquire("jobs/m", other, Some(0)));
    assert_eq!(refused.status, 429, "{}", refused.text);
    assert_refused(&refused, "too_many_pending_acquires");
    let release = json!({ "name": "jobs/l", "session_id": holder, "token": token });
    assert_eq!(post(&addr, "/v1/locks/release", &release).status, 200);
    let granted = waiting.join().expect("the waiter does not panic");
    assert_eq!(granted.status, 200, "{}", granted.text);
    let free_again = post(&addr, "/v1/locks/acquire", &acquire("jobs/m", other, Some(0)));
    assert_eq!(free_again.status, 200, "{}", free_again.text);
}

/// Found by the hostile-client test: a method a path does not take got an empty 405, and a lock
/// name that is not UTF-8 once decoded got a plain-text 400; both are answered in the API's
/// error format now.
#[test]
fn hostile_client_bad_methods_and_undecodable_names_get_the_api_error_format() {
    let (_dir, server) = ServerProcess::start_ready(picket_binary(), &[]);
    let addr = server.addr.clone();
    let method = picket_testkit::http::request(&addr, "DELETE", "/v1/locks/acquire", None);
    assert_eq!(method.status, 405);
    assert_refused(&method, "method_not_allowed");
    let name = get(&addr, "/v1/locks/%FF");
    assert_eq!(name.status, 400);
    assert_refused(&name, "bad_request");
    let id = picket_testkit::http::request(&addr, "DELETE", "/v1/cluster/members/abc", None);
    assert_eq!(id.status, 400);
    assert_refused(&id, "bad_request");
    // Found in review: member addresses were unbounded, and every membership entry lists them.
    let long = json!({ "node_id": 9, "addr": "h".repeat(300) });
    let refused = post(&addr, "/v1/cluster/members", &long);
    assert_eq!(refused.status, 400, "{}", refused.text);
}

/// Streams on one HTTP/2 connection are bounded (200): one client cannot hold more watch
/// streams than that on a connection; the next waits until one ends.
#[tokio::test]
async fn watch_streams_on_one_connection_are_bounded() {
    let (_dir, server) = ServerProcess::start_ready(picket_binary(), &[]);
    let grpc = PicketClient::connect(format!("http://{}", server.addr)).await.expect("connects");
    let watch = || {
        let mut grpc = grpc.clone();
        async move {
            let request = v1::WatchRequest {
                target: Some(v1::watch_request::Target::Prefix("jobs/".into())),
                losses_only: false,
            };
            grpc.watch(request).await.expect("a watch stream")
        }
    };
    let mut open = Vec::new();
    for _ in 0..200 {
        open.push(watch().await);
    }
    let waiting = tokio::spawn(watch());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "a 201st stream opened on one connection");
    drop(open.pop());
    let opened = tokio::time::timeout(Duration::from_secs(10), waiting).await;
    assert!(opened.is_ok(), "the waiting stream opened once another ended");
}

/// The value of an unlabelled metric of `addr`'s `/metrics`, 0 when absent.
fn metric(addr: &str, name: &str) -> u64 {
    let text = get(addr, "/metrics").text;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

fn max_sessions(addr: &str) -> Option<u64> {
    get(addr, "/v1/cluster").body["limits"]["max_sessions"].as_u64()
}

/// Issue 13: the lock state's limits have flags. They are replicated, so the leader writes its
/// flags into the state (`SetLimits`) and the state refuses by them; limits lowered below what
/// is in use wait until enough has ended (the leader asks again every 10 s), and a restart with
/// other flags changes them.
#[test]
fn the_lock_states_limits_follow_the_leaders_flags_and_wait_for_what_is_in_use() {
    let dir = picket_testkit::temp_dir();
    let data = dir.path().join("data");
    let listen = format!("127.0.0.1:{}", picket_testkit::free_port()).parse().expect("an address");
    let flags = |max: &str| vec!["--max-sessions".to_owned(), max.to_owned()];
    let mut server = ServerProcess::start(picket_binary(), &data, listen, &flags("2"));
    let addr = server.addr.clone();
    wait_until("the leader's limits in the state", Duration::from_secs(10), || {
        (max_sessions(&addr) == Some(2)).then_some(())
    });
    let open = || post(&addr, "/v1/sessions", &json!({ "ttl_ms": 60_000 }));
    let first = open().body["session_id"].as_u64().expect("a session");
    assert_eq!(open().status, 200);
    let third = open();
    assert_eq!(third.status, 429, "{}", third.text);
    assert_refused(&third, "too_many_sessions");

    server.kill();
    let mut server = ServerProcess::start(picket_binary(), &data, listen, &flags("1"));
    // Two sessions live: a limit of one is refused, says why, and writes nothing to the log,
    // however often the leader asks again.
    let reason = wait_until("the leader's refused limits", Duration::from_secs(10), || {
        get(&addr, "/v1/cluster").body["limits_refused"].as_str().map(str::to_owned)
    });
    assert!(reason.contains("2 sessions are open, more than max_sessions = 1"), "{reason}");
    assert_eq!(max_sessions(&addr), Some(2), "nothing is ended for a limit");
    let refusals = || metric(&addr, "picket_limits_refused_total");
    // A refused `SetLimits` that reached the log would be refused again by the state machine
    // as it applied it, and counted so: that count must stay 0 while the leader asks again.
    // (It compared the log's index before and after, less the clock gaps' refreshes, and had
    // to sleep past a gap's refresh: a race it only narrowed.)
    let applied_refusals =
        || metric(&addr, r#"picket_refusals_total{code="limits_refused",stage="applied"}"#);
    let before = refusals();
    wait_until("the leader to ask again", Duration::from_secs(20), || {
        (refusals() > before).then_some(())
    });
    assert_eq!(applied_refusals(), 0, "a refused SetLimits reached the log");
    let closed =
        picket_testkit::http::request(&addr, "DELETE", &format!("/v1/sessions/{first}"), None);
    assert_eq!(closed.status, 200, "{}", closed.text);
    wait_until("the lower limit once one session ended", Duration::from_secs(30), || {
        (max_sessions(&addr) == Some(1)).then_some(())
    });
    assert_refused(&open(), "too_many_sessions");
    let before_log = r#"picket_refusals_total{code="too_many_sessions",stage="before_log"}"#;
    assert_eq!(metric(&addr, before_log), 1, "the refusal metric reads as this test expects");
    // A node given no limit flags leaves the state's as they are.
    server.kill();
    let server = ServerProcess::start(picket_binary(), &data, listen, &[]);
    wait_until("the node to be ready", Duration::from_secs(10), || {
        (get(&addr, "/readyz").status == 200).then_some(())
    });
    assert_eq!(max_sessions(&addr), Some(1));
    drop(server);

    // Flags that contradict each other are refused at start, saying which.
    let mut refused = std::process::Command::new(picket_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("other"))
        .args(["--max-sessions", "10", "--max-renewals-per-tick", "5"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = refused.try_wait().expect("waits") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = refused.kill();
            panic!("serve did not refuse contradictory limits");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut message = String::new();
    std::io::Read::read_to_string(&mut refused.stderr.take().expect("piped"), &mut message)
        .expect("reads");
    assert!(!status.success(), "{message}");
    assert!(
        message.contains("max_renewals_per_tick must allow renewing every session"),
        "{message}"
    );
}

/// The limits a leader writes reach every replica, so a follower that becomes leader refuses
/// by the same limits; every limit of the lock state has its flag.
#[test]
fn every_replica_enforces_the_limits_the_leader_wrote() {
    let flags = [
        ("--max-sessions", "max_sessions", 3),
        ("--max-locks", "max_locks", 7),
        ("--max-locks-per-session", "max_locks_per_session", 5),
        ("--max-waiters-per-lock", "max_waiters_per_lock", 4),
        ("--max-renewals-per-tick", "max_renewals_per_tick", 9),
        ("--max-name-bytes", "max_name_bytes", 32),
        ("--min-ttl-ms", "min_ttl_ms", 2_000),
        ("--max-ttl-ms", "max_ttl_ms", 20_000),
        ("--max-lock-delay-ms", "max_lock_delay_ms", 1_000),
        ("--max-wait-ms", "max_wait_ms", 9_000),
        ("--max-list", "max_list", 11),
    ];
    let extra: Vec<String> =
        flags.iter().flat_map(|(flag, _, value)| [(*flag).to_owned(), value.to_string()]).collect();
    let cluster = picket_testkit::cluster::Cluster::start(picket_binary(), 3, &extra);
    for index in 0..3 {
        wait_until("the limits on every node", Duration::from_secs(20), || {
            let limits = &cluster.view(index)["limits"];
            flags.iter().all(|(_, field, value)| limits[*field] == *value).then_some(())
        });
    }
    let addrs = cluster.addrs();
    let send = |path: &str, body: Value| {
        picket_testkit::cluster::send(&addrs, "POST", path, Some(&body), Duration::from_secs(20))
            .expect("the cluster answers")
    };
    assert_refused(&send("/v1/sessions", json!({ "ttl_ms": 30_000 })), "ttl_out_of_range");
    let opened = send("/v1/sessions", json!({ "ttl_ms": 10_000 }));
    let session = opened.body["session_id"].as_u64().expect("a session");
    let long = send("/v1/locks/acquire", acquire(&"x".repeat(33), session, Some(0)));
    assert_refused(&long, "invalid_name");
}

/// Issue 13: the request bounds have flags. A node started with 4 KiB bounds refuses a 5 KiB
/// HTTP body (413 `body_too_large`) and a 5 KiB gRPC message, and reads one under the bound
/// (refused then for its name, which is over the name bound).
#[tokio::test]
async fn request_bounds_follow_their_flags() {
    let (_dir, server) = ServerProcess::start_ready(
        picket_binary(),
        &["--max-http-body-bytes", "4096", "--max-grpc-message-bytes", "4096"],
    );
    let addr = server.addr.clone();
    let opened = post(&addr, "/v1/sessions", &json!({ "ttl_ms": 60_000 }));
    let session = opened.body["session_id"].as_u64().expect("a session");
    let over = post(&addr, "/v1/locks/acquire", &acquire(&"x".repeat(5_000), session, Some(0)));
    assert_eq!(over.status, 413, "{}", over.text);
    assert_refused(&over, "body_too_large");
    let under = post(&addr, "/v1/locks/acquire", &acquire(&"x".repeat(3_000), session, Some(0)));
    assert_refused(&under, "invalid_name");

    let mut grpc = PicketClient::connect(format!("http://{addr}")).await.expect("connects");
    let named = |length: usize| v1::AcquireRequest {
        name: "x".repeat(length),
        session_id: session,
        wait_ms: Some(0),
        ..v1::AcquireRequest::default()
    };
    let refused = grpc.acquire(named(5_000)).await.expect_err("over the bound");
    assert!(
        matches!(refused.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted),
        "{refused:?}"
    );
    let read = grpc.acquire(named(3_000)).await.expect_err("over the name bound");
    assert_eq!(grpc_code(&read), "invalid_name");
}

/// Found in review (2026-12-06): a watch of a set that named a session three times was
/// registered three times under it, so each of its events came three times (and one request of
/// 10,000 copies of one id took 10,000 places in the fan-out, and as many checks of the
/// caller's access). Now each session of a set is followed once.
#[tokio::test]
async fn a_watch_that_names_a_session_three_times_gets_each_event_once() {
    let (_dir, server) = ServerProcess::start_ready(picket_binary(), &[]);
    let addr = server.addr.clone();
    let opened = post(&addr, "/v1/sessions", &json!({ "ttl_ms": 60_000 }));
    let session = opened.body["session_id"].as_u64().expect("a session");
    let mut grpc = PicketClient::connect(format!("http://{addr}")).await.expect("connects");
    let request = v1::WatchRequest {
        target: Some(v1::watch_request::Target::Sessions(v1::SessionSet {
            session_ids: vec![session; 3],
        })),
        losses_only: false,
    };
    let mut events = grpc.watch(request).await.expect("a watch").into_inner();
    let held = post(&addr, "/v1/locks/acquire", &acquire("jobs/a", session, Some(0)));
    let token = held.body["token"].as_u64().expect("a token");
    let release = json!({ "name": "jobs/a", "session_id": session, "token": token });
    assert_eq!(post(&addr, "/v1/locks/release", &release).status, 200);
    let mut next_kind = async || {
        let event = tokio::time::timeout(Duration::from_secs(10), events.message()).await;
        event.expect("an event within 10 s").expect("the stream goes on").expect("an event").kind
    };
    assert_eq!(next_kind().await, "granted");
    assert_eq!(next_kind().await, "released", "the grant came twice");
}

/// helper-67's audit (2026-12-06): a stream may follow 10,000 sessions and a node takes 10,000
/// streams, so one caller could make a node hold 10⁸ entries in the fan-out of applied
/// commands, gigabytes of memory. Each session a watch follows now holds a place of
/// `--max-watched-sessions` (a set counts each session once; 429 `too_many_watched_sessions`
/// past it), and gives it back when the session ends or the stream does; a watch leaves out
/// sessions that had already ended, so a client that watches its closed sessions again uses
/// at most one place per stream.
#[tokio::test]
async fn the_sessions_followed_by_watches_are_bounded_per_node_and_ended_ones_hold_no_place() {
    let (_dir, server) =
        ServerProcess::start_ready(picket_binary(), &["--max-watched-sessions", "3"]);
    let addr = server.addr.clone();
    let grpc = PicketClient::connect(format!("http://{addr}")).await.expect("connects");
    let watch = |sessions: Vec<u64>| {
        let mut grpc = grpc.clone();
        async move {
            let request = v1::WatchRequest {
                target: Some(v1::watch_request::Target::Sessions(v1::SessionSet {
                    session_ids: sessions,
                })),
                losses_only: true,
            };
            grpc.watch(request).await
        }
    };
    let open = || {
        let opened = post(&addr, "/v1/sessions", &json!({ "ttl_ms": 60_000 }));
        opened.body["session_id"].as_u64().expect("a session")
    };
    let (a, b) = (open(), open());
    let first = watch(vec![a, a, b]).await.expect("two sessions, counted once each");
    // Ids far past the state: sessions not opened yet, which hold places too.
    let future = |n: u64| 1_000_000 + n;
    let refused = watch(vec![future(1), future(2)]).await.expect_err("two more than the bound");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert_eq!(grpc_code(&refused), "too_many_watched_sessions", "{refused:?}");
    let closed = picket_testkit::http::request(&addr, "DELETE", &format!("/v1/sessions/{a}"), None);
    assert_eq!(closed.status, 200, "{}", closed.text);
    // Session a's place comes back when its end is applied: [b] and [b] hold two.
    let again = wait_until_async("session a's place", || watch(vec![a, b])).await;
    let _last = watch(vec![future(1)]).await.expect("the third place: a is left out");
    let refused = watch(vec![future(2)]).await.expect_err("the bound is full again");
    assert_eq!(grpc_code(&refused), "too_many_watched_sessions", "{refused:?}");
    drop((first, again));
    let _freed =
        wait_until_async("the places of ended streams", || watch(vec![future(2), future(3)])).await;
}

/// Calls `attempt` until it succeeds, for at most 10 s.
async fn wait_until_async<T, E: std::fmt::Debug, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    attempt: impl Fn() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(error) if tokio::time::Instant::now() > deadline => {
                panic!("timed out waiting for {what}: {error:?}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Sends one HTTP/1.1 POST of `body` to `addr` and waits at most `wait` for the answer; gives
/// up (closing the connection, as a client that times out does) and returns `None` when none
/// came. The answer's status and text otherwise.
fn post_giving_up(addr: &str, path: &str, body: &str, wait: Duration) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(wait)).ok()?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    // Read until the node closes the connection after its answer, or the wait runs out.
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    Some((status, text))
}

/// A leader cut off from its majority must not take writes without bound: each would wait in
/// its log and memory for a commit that comes only when the partition heals, and a client that
/// gives up and writes again would grow both for as long as the partition lasts. openraft's
/// CheckQuorum refuses proposals once the leader has not heard from a quorum within its lease
/// (the maximum election timeout); Picket answers them 421 with no leader named, so clients
/// try the other nodes. This pins that behaviour: the log stops growing.
#[test]
fn a_leader_cut_off_from_its_majority_refuses_writes_after_its_lease_and_stops_growing_its_log() {
    let args: Vec<String> =
        ["--heartbeat-ms", "50", "--election-timeout-ms", "300"].map(str::to_owned).to_vec();
    let mut cluster = picket_testkit::cluster::Cluster::start(picket_binary(), 3, &args);
    let leader = cluster.leader(Duration::from_secs(30));
    let addr = cluster.addrs()[leader].clone();
    let session = r#"{"ttl_ms": 10000}"#;
    let opened = post_giving_up(&addr, "/v1/sessions", session, Duration::from_secs(10));
    assert_eq!(opened.as_ref().map(|(status, _)| *status), Some(200), "{opened:?}");
    for (index, node) in cluster.nodes.iter_mut().enumerate() {
        if index != leader {
            node.kill();
        }
    }
    // A write taken within the lease waits for a commit that cannot come; once the lease has
    // run out, writes are refused at once.
    let refusal = wait_until("a write refused at once", Duration::from_secs(30), || {
        let answer = post_giving_up(&addr, "/v1/sessions", session, Duration::from_millis(300));
        answer.filter(|(status, _)| *status == 421).map(|(_, text)| text)
    });
    assert!(refusal.contains("\"not_leader\""), "{refusal}");
    assert!(refusal.contains("\"not_applied\""), "{refusal}");
    let entries = metric(&addr, "picket_wal_entries_total");
    assert!(entries > 0, "the node reports the entries its log holds");
    for _ in 0..20 {
        // A refusal comes at once; the wait leaves room for a loaded machine.
        let answer = post_giving_up(&addr, "/v1/sessions", session, Duration::from_secs(5));
        assert_eq!(answer.map(|(status, _)| status), Some(421), "every further write is refused");
    }
    assert_eq!(metric(&addr, "picket_wal_entries_total"), entries, "the log grew");
}
