//! Fuzz targets for the APIs of a real `picket serve` (issue 13), on stable Rust: proptest sends
//! HTTP requests with any method, path, query string and body, and gRPC messages with any field
//! values, to one running node. None may get a server error (a 5xx other than 503, a gRPC
//! `INTERNAL` or `UNKNOWN`), every refusal is in the API's error format, and the node keeps
//! serving. A few thousand cases in `cargo test`; `PICKET_FUZZ_CASES=N` runs N each.

use picket_proto::ERROR_CODE_KEY;
use picket_proto::v1::{self, picket_client::PicketClient};
use picket_testkit::http::{get, request_raw};
use picket_testkit::{ServerProcess, fuzz_cases};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use std::path::Path;
use tonic::Code;

/// A node for every case of both targets, with a few live sessions so fuzzed ids sometimes
/// name one. Owned by the one test that runs both targets, so it is stopped at the end (a
/// static would outlive the test process's cleanup and leak the server).
fn start_node() -> (tempfile::TempDir, ServerProcess) {
    let flags = ["--snapshot-every", "500", "--wal-segment-bytes", "65536"];
    let (dir, server) = ServerProcess::start_ready(Path::new(env!("CARGO_BIN_EXE_picket")), &flags);
    for _ in 0..3 {
        let body = br#"{"ttl_ms": 3600000}"#;
        let _ = request_raw(&server.addr, "POST", "/v1/sessions", Some(body), "application/json");
    }
    (dir, server)
}

fn config(default_cases: u32) -> ProptestConfig {
    ProptestConfig { cases: fuzz_cases(default_cases), ..ProptestConfig::default() }
}

/// A path segment: plain, percent-encoded bytes of any value, or empty.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(vec![
            "a",
            "jobs",
            "x",
            "1",
            "2",
            "0",
            "18446744073709551616",
            "-1"
        ])
        .prop_map(str::to_owned),
        proptest::collection::vec(any::<u8>(), 0..6)
            .prop_map(|bytes| bytes.iter().map(|byte| format!("%{byte:02X}")).collect()),
        "[a-zA-Z0-9._~-]{0,12}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    let templates = vec![
        "/v1/sessions",
        "/v1/sessions/{}",
        "/v1/sessions/{}/keepalive",
        "/v1/sessions/{}/revoke",
        "/v1/locks",
        "/v1/locks/{}",
        "/v1/locks/{}/{}",
        "/v1/locks/acquire",
        "/v1/locks/release",
        "/v1/locks/cancel",
        "/v1/locks/abandon",
        "/v1/check",
        "/v1/cluster",
        "/v1/cluster/members",
        "/v1/cluster/members/{}",
        "/{}",
    ];
    (proptest::sample::select(templates), segment(), segment(), query()).prop_map(
        |(template, first, second, query)| {
            template.replacen("{}", &first, 1).replacen("{}", &second, 1) + &query
        },
    )
}

fn query() -> impl Strategy<Value = String> {
    let key = proptest::sample::select(vec![
        "prefix",
        "after",
        "limit",
        "session_id",
        "sequencer",
        "name",
        "losses_only",
        "x",
    ]);
    let value = prop_oneof![segment(), Just("p1.5.a".to_owned()), Just("true".to_owned())];
    proptest::option::of(proptest::collection::vec((key, value), 0..4)).prop_map(|pairs| {
        pairs.map_or_else(String::new, |pairs| {
            let joined: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("?{}", joined.join("&"))
        })
    })
}

/// A JSON body with the API's field names and values of any type, or bytes that are not JSON.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let field = proptest::sample::select(vec![
        "name",
        "session_id",
        "ttl_ms",
        "lock_delay_ms",
        "wait_ms",
        "token",
        "request_id",
        "attempt",
        "node_id",
        "addr",
        "x",
    ]);
    let value = prop_oneof![
        (0_u64..5).prop_map(|n| serde_json::json!(n)),
        any::<u64>().prop_map(|n| serde_json::json!(n)),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        any::<f64>().prop_map(|n| serde_json::json!(n)),
        "\\PC{0,10}".prop_map(|text| serde_json::json!(text)),
        Just(serde_json::json!("\0".repeat(300))),
        Just(serde_json::json!(null)),
        Just(serde_json::json!([1, "a"])),
        Just(serde_json::json!({ "a": 1 })),
    ];
    prop_oneof![
        4 => proptest::collection::btree_map(field, value, 0..5).prop_map(|mut map| {
            // An acquire without a bound waits until granted, and one with a long bound waits
            // that long, which could hold the case for ever: waits are at most 50 ms. Only
            // bodies that look like an acquire get one (every other body refuses unknown fields).
            let wait_ms = map.get("wait_ms").and_then(serde_json::Value::as_u64);
            let acquire = map.contains_key("name") && map.contains_key("session_id");
            if acquire && map.get("wait_ms").is_none_or(|wait| wait.is_null() || wait.is_number()) {
                map.insert("wait_ms", serde_json::json!(wait_ms.unwrap_or(0) % 50));
            }
            serde_json::to_vec(&map).expect("json")
        }),
        1 => proptest::collection::vec(any::<u8>(), 0..32),
    ]
}

fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0_u64..6, 1 => Just(u64::MAX), 1 => any::<u64>()]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(vec!["a", "jobs/x", "", "a\0b"]).prop_map(str::to_owned),
        Just("n".repeat(300)),
        "\\PC{0,12}",
    ]
}

/// One gRPC call with fuzzed fields.
#[derive(Clone, Debug)]
enum Call {
    Open(v1::OpenSessionRequest),
    KeepAlive(v1::KeepAliveRequest),
    KeepAliveMany(v1::KeepAliveManyRequest),
    Close(v1::SessionRequest),
    Acquire(v1::AcquireRequest),
    Abandon(v1::AbandonRequest),
    Cancel(v1::CancelRequest),
    Release(v1::ReleaseRequest),
    GetLock(v1::GetLockRequest),
    ListLocks(v1::ListLocksRequest),
    Check(v1::CheckRequest),
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        (edge_u64(), edge_u64()).prop_map(|(ttl_ms, lock_delay_ms)| Call::Open(
            v1::OpenSessionRequest { ttl_ms, lock_delay_ms, ..Default::default() }
        )),
        (edge_u64(), edge_u64(), any::<f64>()).prop_map(|(session_id, clock_id, clock_ms)| {
            Call::KeepAlive(v1::KeepAliveRequest { session_id, clock_id, clock_ms })
        }),
        (proptest::collection::vec(edge_u64(), 0..20), edge_u64(), any::<f64>()).prop_map(
            |(session_ids, clock_id, clock_ms)| {
                Call::KeepAliveMany(v1::KeepAliveManyRequest { session_ids, clock_id, clock_ms })
            }
        ),
        edge_u64().prop_map(|session_id| Call::Close(v1::SessionRequest { session_id })),
        (name(), edge_u64(), edge_u64(), proptest::option::of(edge_u64()), any::<u32>()).prop_map(
            |(name, session_id, wait_ms, request_id, attempt)| Call::Acquire(v1::AcquireRequest {
                name,
                session_id,
                // Bounded: a wait until granted could hold the case for ever.
                wait_ms: Some(wait_ms % 50),
                request_id,
                attempt
            })
        ),
        (name(), edge_u64(), edge_u64(), any::<u32>()).prop_map(
            |(name, session_id, request_id, attempt)| Call::Abandon(v1::AbandonRequest {
                name,
                session_id,
                request_id,
                attempt
            })
        ),
        (name(), edge_u64())
            .prop_map(|(name, session_id)| Call::Cancel(v1::CancelRequest { name, session_id })),
        (name(), edge_u64(), edge_u64()).prop_map(|(name, session_id, token)| Call::Release(
            v1::ReleaseRequest { name, session_id, token }
        )),
        name().prop_map(|name| Call::GetLock(v1::GetLockRequest { name })),
        (name(), name(), any::<u32>()).prop_map(|(prefix, after, limit)| Call::ListLocks(
            v1::ListLocksRequest { prefix, after, limit }
        )),
        prop_oneof![name(), Just("p1.5.a".to_owned()), Just("p1.0.a".to_owned())]
            .prop_map(|sequencer| Call::Check(v1::CheckRequest { sequencer })),
    ]
}

async fn send(
    client: &mut PicketClient<tonic::transport::Channel>,
    call: Call,
) -> Result<(), tonic::Status> {
    match call {
        Call::Open(request) => client.open_session(request).await.map(drop),
        Call::KeepAlive(request) => client.keep_alive(request).await.map(drop),
        Call::KeepAliveMany(request) => client.keep_alive_many(request).await.map(drop),
        Call::Close(request) => client.close_session(request).await.map(drop),
        Call::Acquire(request) => client.acquire(request).await.map(drop),
        Call::Abandon(request) => client.abandon(request).await.map(drop),
        Call::Cancel(request) => client.cancel(request).await.map(drop),
        Call::Release(request) => client.release(request).await.map(drop),
        Call::GetLock(request) => client.get_lock(request).await.map(drop),
        Call::ListLocks(request) => client.list_locks(request).await.map(drop),
        Call::Check(request) => client.check(request).await.map(drop),
    }
}

#[test]
fn any_request_is_served_or_refused_in_the_api_format() {
    let (_dir, server) = start_node();
    let addr = server.addr.clone();
    let http =
        (proptest::sample::select(vec!["GET", "POST", "PUT", "DELETE", "PATCH"]), path(), body());
    let mut runner = TestRunner::new(config(2_000));
    let result = runner.run(&http, |(method, path, body)| {
        let reply = request_raw(&addr, method, &path, Some(&body), "application/json");
        prop_assert!(
            reply.status < 500 || reply.status == 503,
            "{} {}: {} {}",
            method,
            path,
            reply.status,
            reply.text
        );
        if reply.status >= 400 {
            prop_assert!(
                reply.body["code"].is_string(),
                "{} {}: {} {}",
                method,
                path,
                reply.status,
                reply.text
            );
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("HTTP: {failure}");
    }

    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let client =
        runtime.block_on(PicketClient::connect(format!("http://{addr}"))).expect("connects");
    let mut runner = TestRunner::new(config(2_000));
    let result = runner.run(&call(), |call| {
        // A tonic client is a cheap handle to one connection.
        let mut client = client.clone();
        if let Err(status) = runtime.block_on(send(&mut client, call.clone())) {
            prop_assert!(
                !matches!(status.code(), Code::Internal | Code::Unknown),
                "{:?}: {:?}",
                call,
                status
            );
            prop_assert!(
                status.metadata().get(ERROR_CODE_KEY).is_some(),
                "{:?}: {:?}",
                call,
                status
            );
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("gRPC: {failure}");
    }
    assert_eq!(get(&addr, "/readyz").status, 200, "the node still serves");
}
