//! `picket serve` on one node, driven over gRPC: the lock operations, expiry with lock-delay,
//! `check`, watches, and bad input refused with a stable code in the status metadata.

use picket_proto::v1::picket_client::PicketClient;
use picket_proto::v1::{self, watch_request::Target};
use picket_proto::{ERROR_CODE_KEY, HOLDER_TOKEN_KEY};
use picket_testkit::ServerProcess;
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::{Code, Status};

async fn start() -> (tempfile::TempDir, ServerProcess, PicketClient<Channel>) {
    let (dir, server) = ServerProcess::start_ready(Path::new(env!("CARGO_BIN_EXE_picket")), &[]);
    let client = PicketClient::connect(format!("http://{}", server.addr)).await.unwrap();
    (dir, server, client)
}

async fn open(client: &mut PicketClient<Channel>, ttl_ms: u64, lock_delay_ms: u64) -> u64 {
    client
        .open_session(v1::OpenSessionRequest { ttl_ms, lock_delay_ms, ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .session_id
}

fn acquire_request(name: &str, session_id: u64, wait_ms: Option<u64>) -> v1::AcquireRequest {
    v1::AcquireRequest { name: name.to_owned(), session_id, wait_ms, request_id: None, attempt: 0 }
}

fn code_of(status: &Status) -> &str {
    status.metadata().get(ERROR_CODE_KEY).and_then(|value| value.to_str().ok()).unwrap_or_default()
}

/// The full lock life cycle over gRPC, FIFO hand-off included.
#[tokio::test]
async fn lock_life_cycle_over_grpc() {
    let (_dir, _server, mut client) = start().await;
    let a = open(&mut client, 10_000, 0).await;
    let b = open(&mut client, 10_000, 0).await;
    let granted = client.acquire(acquire_request("jobs/x", a, Some(0))).await.unwrap().into_inner();
    assert_eq!(granted.sequencer, format!("p1.{}.jobs/x", granted.token));

    let busy = client.acquire(acquire_request("jobs/x", b, Some(0))).await.unwrap_err();
    assert_eq!(busy.code(), Code::FailedPrecondition);
    assert_eq!(code_of(&busy), "lock_busy");
    assert_eq!(
        busy.metadata().get(HOLDER_TOKEN_KEY).unwrap().to_str().unwrap(),
        granted.token.to_string()
    );

    let timed_out = client.acquire(acquire_request("jobs/x", b, Some(200))).await.unwrap_err();
    assert_eq!(code_of(&timed_out), "wait_timed_out");

    // B waits without a deadline; A's release hands the lock over with a greater token.
    let mut waiting_client = client.clone();
    let waiter =
        tokio::spawn(
            async move { waiting_client.acquire(acquire_request("jobs/x", b, None)).await },
        );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let lock = client
            .get_lock(v1::GetLockRequest { name: "jobs/x".into() })
            .await
            .unwrap()
            .into_inner();
        if lock.waiters == [b] {
            break;
        }
        assert!(Instant::now() < deadline, "B never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client
        .release(v1::ReleaseRequest { name: "jobs/x".into(), session_id: a, token: granted.token })
        .await
        .unwrap();
    let handed = waiter.await.unwrap().unwrap().into_inner();
    assert!(handed.token > granted.token);

    let check = client
        .check(v1::CheckRequest { sequencer: granted.sequencer.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((check.status.as_str(), check.current_token), ("superseded", handed.token));
    let check = client
        .check(v1::CheckRequest { sequencer: handed.sequencer.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(check.status, "current");

    let listed = client
        .list_locks(v1::ListLocksRequest {
            prefix: "jobs/".into(),
            after: String::new(),
            limit: 10,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.locks.len(), 1);
    assert_eq!(listed.locks[0].holder_session_id, b);
}

/// SPEC: a waiter can cancel, over gRPC as over HTTP. The waiting Acquire is answered at once,
/// `wait_ended`, nothing applied; a cancel of a session that does not wait is `not_waiting`.
#[tokio::test]
async fn a_waiter_cancels_over_grpc() {
    let (_dir, _server, mut client) = start().await;
    let holder = open(&mut client, 10_000, 0).await;
    let waiter = open(&mut client, 10_000, 0).await;
    let granted = client.acquire(acquire_request("c", holder, Some(0))).await.unwrap();
    let mut waiting_client = client.clone();
    let waiting = tokio::spawn(async move {
        waiting_client.acquire(acquire_request("c", waiter, Some(60_000))).await
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while client
        .get_lock(v1::GetLockRequest { name: "c".into() })
        .await
        .unwrap()
        .into_inner()
        .waiters
        != [waiter]
    {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    client.cancel(v1::CancelRequest { name: "c".into(), session_id: waiter }).await.unwrap();
    let ended = waiting.await.unwrap().unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "answered at the cancel");
    assert_eq!((ended.code(), code_of(&ended)), (Code::FailedPrecondition, "wait_ended"));
    assert!(ended.message().contains("(requested)"), "{ended:?}");
    let again = client.cancel(v1::CancelRequest { name: "c".into(), session_id: waiter }).await;
    assert_eq!(code_of(&again.unwrap_err()), "not_waiting");
    let lock = client.get_lock(v1::GetLockRequest { name: "c".into() }).await.unwrap().into_inner();
    assert!(lock.waiters.is_empty());
    assert_eq!(lock.token, granted.into_inner().token, "the holder keeps it");
}

/// A session that stops keeping alive expires; its lock is granted to the waiter only after
/// the lock-delay; the waiter's session watch and the lock watch both see it happen.
#[tokio::test]
async fn expiry_lock_delay_and_watch_over_grpc() {
    let (_dir, _server, mut client) = start().await;
    // Measured from before the doomed session opens: its TTL counts from then, and the calls
    // before the wait may take long on a loaded machine.
    let started = Instant::now();
    let doomed = open(&mut client, 1_000, 1_000).await;
    let mut events = client
        .watch(v1::WatchRequest { target: Some(Target::SessionId(doomed)), losses_only: false })
        .await
        .unwrap()
        .into_inner();
    let mut losses = client
        .watch(v1::WatchRequest { target: Some(Target::SessionId(doomed)), losses_only: true })
        .await
        .unwrap()
        .into_inner();
    let first = client.acquire(acquire_request("r", doomed, Some(0))).await.unwrap().into_inner();
    let patient = open(&mut client, 30_000, 0).await;
    let mut waiting = client.clone();
    let waiter = tokio::spawn(async move {
        let granted = waiting.acquire(acquire_request("r", patient, Some(10_000))).await;
        (granted.unwrap().into_inner(), Instant::now())
    });
    // The last time the doomed session was seen holding the lock, taken before the read that
    // saw it: its grant ended after that. (Review: timing from the open alone let slow calls
    // before the wait hide a missing lock-delay.)
    let mut held_last = started;
    loop {
        let asked = Instant::now();
        let lock = client.get_lock(v1::GetLockRequest { name: "r".into() }).await.unwrap();
        if lock.into_inner().holder_session_id != doomed {
            break;
        }
        held_last = asked;
        assert!(started.elapsed() < Duration::from_secs(20), "the doomed grant never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (granted, granted_at) = waiter.await.expect("the waiter");
    assert!(
        granted_at - started >= Duration::from_millis(2_300),
        "granted after {:?}",
        granted_at - started
    );
    // The lock-delay (1 s) between the end of the doomed grant and the next, less 50 ms for the
    // two clocks' rounding; without it the grant follows within a round trip.
    let delayed = granted_at - held_last;
    assert!(delayed >= Duration::from_millis(950), "granted {delayed:?} after the doomed grant");
    assert!(granted.token > first.token);

    let kinds: Vec<(String, String)> = {
        let mut kinds = Vec::new();
        while kinds.len() < 3 {
            let event = events.message().await.unwrap().unwrap();
            kinds.push((event.kind, event.cause));
        }
        kinds
    };
    assert_eq!(
        kinds,
        [
            ("granted".into(), String::new()),
            ("released".into(), "session_expired".into()),
            ("session_ended".into(), "expired".into())
        ]
    );
    // The losses-only stream skips the grant the session asked for.
    let mut loss_kinds = Vec::new();
    while loss_kinds.len() < 2 {
        let event = losses.message().await.unwrap().unwrap();
        loss_kinds.push((event.kind, event.cause));
    }
    assert_eq!(
        loss_kinds,
        [("released".into(), "session_expired".into()), ("session_ended".into(), "expired".into())]
    );
    let gone = client
        .keep_alive(v1::KeepAliveRequest { session_id: doomed, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    assert_eq!(code_of(&gone), "unknown_session");
}

/// Bad input over gRPC: each refused with a status code and a stable error code; none changes
/// the state.
#[tokio::test]
async fn bad_input_over_grpc_is_refused_without_changes() {
    let (_dir, _server, mut client) = start().await;
    let session = open(&mut client, 10_000, 0).await;
    let token =
        client.acquire(acquire_request("held", session, Some(0))).await.unwrap().into_inner().token;
    let revision = client.cluster(v1::Empty {}).await.unwrap().into_inner().applied_revision;

    let ttl = client
        .open_session(v1::OpenSessionRequest { ttl_ms: 0, lock_delay_ms: 0, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!((ttl.code(), code_of(&ttl)), (Code::InvalidArgument, "ttl_out_of_range"));
    let name = client.acquire(acquire_request("", session, Some(0))).await.unwrap_err();
    assert_eq!(code_of(&name), "invalid_name");
    let control = client.acquire(acquire_request("a\nb", session, Some(0))).await.unwrap_err();
    assert_eq!(code_of(&control), "invalid_name");
    let unknown = client.acquire(acquire_request("held", 987_654, Some(0))).await.unwrap_err();
    assert_eq!((unknown.code(), code_of(&unknown)), (Code::NotFound, "unknown_session"));
    let wrong = client
        .release(v1::ReleaseRequest { name: "held".into(), session_id: session, token: token + 1 })
        .await
        .unwrap_err();
    assert_eq!(code_of(&wrong), "token_mismatch");
    let garbled = client.check(v1::CheckRequest { sequencer: "p1.x.y".into() }).await.unwrap_err();
    assert_eq!(code_of(&garbled), "bad_request");
    let no_target =
        client.watch(v1::WatchRequest { target: None, losses_only: false }).await.unwrap_err();
    assert_eq!(no_target.code(), Code::InvalidArgument);
    let lock_losses = client
        .watch(v1::WatchRequest { target: Some(Target::Name("held".into())), losses_only: true })
        .await
        .unwrap_err();
    assert_eq!(lock_losses.code(), Code::InvalidArgument);
    // A request over the size limit is refused by the decoder.
    let huge =
        client.acquire(acquire_request(&"n".repeat(100_000), session, Some(0))).await.unwrap_err();
    assert!(
        matches!(huge.code(), Code::OutOfRange | Code::ResourceExhausted | Code::InvalidArgument),
        "{huge:?}"
    );

    let after = client.cluster(v1::Empty {}).await.unwrap().into_inner().applied_revision;
    assert_eq!(after, revision, "a refused request changed the state");
    let lock =
        client.get_lock(v1::GetLockRequest { name: "held".into() }).await.unwrap().into_inner();
    assert_eq!((lock.holder_session_id, lock.token), (session, token));
}

/// A call's outcome as a client sees it: the answer, or the status's code, message and
/// metadata (without `date`, which differs by the second).
fn outcome<T: std::fmt::Debug>(result: Result<tonic::Response<T>, Status>) -> String {
    match result {
        Ok(answer) => format!("ok {:?}", answer.into_inner()),
        Err(status) => {
            let mut metadata: Vec<String> = status
                .metadata()
                .clone()
                .into_headers()
                .iter()
                .filter(|(key, _)| *key != "date")
                .map(|(key, value)| format!("{key}={value:?}"))
                .collect();
            metadata.sort();
            format!("error {:?} {:?} {metadata:?}", status.code(), status.message())
        }
    }
}

/// Sends `body` as a call to `path` on `service` and gives back the whole answer: its status,
/// its headers (without `date`), its data and its trailers.
async fn raw_call<S, B>(
    service: &mut S,
    origin: &str,
    path: &str,
    body: &[u8],
    encoding: Option<&str>,
) -> String
where
    S: tonic::codegen::Service<http::Request<tonic::body::Body>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body_util::BodyExt,
    B::Error: std::fmt::Debug,
{
    std::future::poll_fn(|cx| service.poll_ready(cx)).await.expect("ready");
    let mut request = http::Request::post(format!("{origin}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(encoding) = encoding {
        request = request.header("grpc-encoding", encoding);
    }
    let request = request
        .body(tonic::body::Body::new(http_body_util::Full::new(bytes::Bytes::copy_from_slice(
            body,
        ))))
        .expect("a request");
    let answer = service.call(request).await.expect("an answer");
    let (mut head, body) = answer.into_parts();
    head.headers.remove("date");
    let collected = body.collect().await.expect("the whole answer");
    // The wire protocol ends every answer with a trailers frame, empty after a trailers-only
    // answer, where HTTP/2 sends none.
    let trailers = collected.trailers().filter(|trailers| !trailers.is_empty()).cloned();
    format!("{} {:?} {:?} {trailers:?}", head.status, head.headers, collected.to_bytes())
}

/// How many wire calls `addr` has served straight from their frames.
fn direct_calls(addr: &str) -> u64 {
    let metrics = picket_testkit::http::get(addr, "/metrics").text;
    let line = metrics.lines().find(|line| line.starts_with("picket_wire_direct_calls_total "));
    line.and_then(|line| line.rsplit(' ').next()?.parse().ok()).expect("the counter")
}

/// The wire protocol serves the client API's hot calls straight from their frames, without
/// the router and tonic's codec that gRPC over HTTP/2 goes through (issue 19). The same calls
/// must answer the same either way: the same message, and for a refusal the same code,
/// message and metadata; a request not in the plain form (a message that does not decode,
/// a compressed one, two of them, one with `grpc-encoding`) is left to the router, which
/// refuses it as over HTTP/2. The node's count of direct calls shows which path each took.
#[tokio::test]
async fn hot_calls_answer_the_same_over_the_wire_protocol_and_http2() {
    use picket_proto::connection::{Connection, Protocol};
    let (_dir, server, mut h2) = start().await;
    let connection =
        Connection::open_with(&server.addr, Duration::from_secs(5), 1 << 22, None, Protocol::Wire)
            .await
            .expect("connected");
    assert_eq!(connection.protocol(), Protocol::Wire);
    let mut wire = PicketClient::new(connection.clone());
    let session = open(&mut h2, 10_000, 0).await;
    let other = open(&mut h2, 10_000, 0).await;
    let token =
        h2.acquire(acquire_request("held", session, Some(0))).await.unwrap().into_inner().token;
    let served_before = direct_calls(&server.addr);

    macro_rules! same {
        ($method:ident, $request:expr) => {{
            let over_wire = outcome(wire.$method($request).await);
            let over_h2 = outcome(h2.$method($request).await);
            assert_eq!(over_wire, over_h2, "{} over the two protocols", stringify!($method));
            over_wire
        }};
    }
    let kept =
        same!(keep_alive, v1::KeepAliveRequest { session_id: session, ..Default::default() });
    assert!(kept.starts_with("ok "), "{kept}");
    let again = same!(acquire, acquire_request("held", session, Some(0)));
    assert!(again.contains("already_held: true"), "{again}");
    let busy = same!(acquire, acquire_request("held", other, Some(0)));
    assert!(busy.contains("lock_busy") && busy.contains(&token.to_string()), "{busy}");
    same!(acquire, acquire_request("", session, Some(0)));
    same!(acquire, acquire_request("held", 987_654, Some(0)));
    same!(
        release,
        v1::ReleaseRequest { name: "held".into(), session_id: session, token: token + 1 }
    );
    same!(release, v1::ReleaseRequest { name: "free".into(), session_id: session, token: 1 });
    same!(keep_alive, v1::KeepAliveRequest { session_id: 987_654, ..Default::default() });
    same!(
        keep_alive_many,
        v1::KeepAliveManyRequest { session_ids: vec![session, 987_654], ..Default::default() }
    );
    same!(
        open_session,
        v1::OpenSessionRequest { ttl_ms: 0, lock_delay_ms: 0, ..Default::default() }
    );
    same!(close_session, v1::SessionRequest { session_id: 987_654 });
    let opened = v1::OpenSessionRequest { ttl_ms: 7_000, lock_delay_ms: 0, ..Default::default() };
    let wire_session = wire.open_session(opened).await.unwrap().into_inner();
    let h2_session = h2.open_session(opened).await.unwrap().into_inner();
    assert_eq!((wire_session.ttl_ms, h2_session.ttl_ms), (7_000, 7_000));
    for (name, id) in [("w", wire_session.session_id), ("h", h2_session.session_id)] {
        let granted = wire.acquire(acquire_request(name, id, Some(0))).await.unwrap().into_inner();
        let release =
            v1::ReleaseRequest { name: name.into(), session_id: id, token: granted.token };
        let released =
            if name == "w" { wire.release(release).await } else { h2.release(release).await };
        assert_eq!(outcome(released), "ok Empty");
    }
    let closed_over_wire = outcome(
        wire.close_session(v1::SessionRequest { session_id: wire_session.session_id }).await,
    );
    let closed_over_h2 =
        outcome(h2.close_session(v1::SessionRequest { session_id: h2_session.session_id }).await);
    assert_eq!(closed_over_wire, closed_over_h2);
    // Eleven calls made over both protocols above, and five more over the wire alone.
    assert_eq!(direct_calls(&server.addr) - served_before, 11 + 5, "served directly");
    // The client's own hot calls on an HTTP/2 connection (`Connection::acquire` and the rest,
    // which skip tonic's client stack only over the wire) answer as the generated client does.
    let over_h2_link =
        Connection::open_with(&server.addr, Duration::from_secs(5), 1 << 22, None, Protocol::Grpc)
            .await
            .expect("connected over HTTP/2");
    assert_eq!(over_h2_link.protocol(), Protocol::Grpc);
    for request in [
        acquire_request("held", session, Some(0)),
        acquire_request("held", other, Some(0)),
        acquire_request("", session, Some(0)),
        acquire_request("held", 987_654, Some(0)),
    ] {
        let own = outcome(over_h2_link.acquire(request.clone()).await);
        assert_eq!(own, outcome(h2.acquire(request).await), "acquire over HTTP/2");
    }
    let unknown = v1::KeepAliveRequest { session_id: 987_654, ..Default::default() };
    assert_eq!(
        outcome(over_h2_link.keep_alive(unknown).await),
        outcome(h2.keep_alive(unknown).await)
    );
    let wrong_token = v1::ReleaseRequest { name: "held".into(), session_id: session, token: 1 };
    assert_eq!(
        outcome(over_h2_link.release(wrong_token.clone()).await),
        outcome(h2.release(wrong_token).await)
    );
    assert_eq!(direct_calls(&server.addr) - served_before, 11 + 5, "none served directly");

    let origin = format!("http://{}", server.addr);
    let mut channel = tonic::transport::Channel::from_shared(origin.clone())
        .expect("an origin")
        .connect()
        .await
        .expect("connected over HTTP/2");
    let mut raw = connection;
    let session_bytes = {
        use prost::Message as _;
        v1::KeepAliveRequest { session_id: session, ..Default::default() }.encode_to_vec()
    };
    let framed = |compressed: u8, message: &[u8]| {
        let mut body = vec![compressed];
        body.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        body.extend_from_slice(message);
        body
    };
    let mut twice = framed(0, &session_bytes);
    twice.extend_from_slice(&framed(0, &session_bytes));
    let bodies = [
        ("plain", framed(0, &session_bytes)),
        ("does not decode", framed(0, &[0xff, 0xff, 0xff])),
        ("compressed", framed(1, &session_bytes)),
        ("two messages", twice),
        ("cut short", framed(0, &session_bytes)[..4].to_vec()),
    ];
    let served_before = direct_calls(&server.addr);
    for (what, body) in bodies {
        let path = "/picket.v1.Picket/KeepAlive";
        let over_wire = raw_call(&mut raw, &origin, path, &body, None).await;
        let over_h2 = raw_call(&mut channel, &origin, path, &body, None).await;
        assert_eq!(over_wire, over_h2, "a request that is {what}");
    }
    let plain = framed(0, &session_bytes);
    let over_wire =
        raw_call(&mut raw, &origin, "/picket.v1.Picket/KeepAlive", &plain, Some("identity")).await;
    let over_h2 =
        raw_call(&mut channel, &origin, "/picket.v1.Picket/KeepAlive", &plain, Some("identity"))
            .await;
    assert_eq!(over_wire, over_h2, "a request with grpc-encoding");
    // Only the first, plain, request was served directly.
    assert_eq!(direct_calls(&server.addr) - served_before, 1, "served directly");

    let lock = h2.get_lock(v1::GetLockRequest { name: "held".into() }).await.unwrap().into_inner();
    assert_eq!((lock.holder_session_id, lock.token), (session, token));
}

/// The wire protocol serves peers' Raft messages straight from their frames too, as it serves
/// the client API's hot calls (issue 19): each must answer as the router and tonic answer it
/// over HTTP/2, whether the node takes the message, refuses it as meant for another node or
/// without one named, or cannot decode it. A single node serves the `Raft` service on its client
/// port. The node's count of direct calls shows the wire's calls took the direct path.
#[tokio::test]
async fn raft_messages_answer_the_same_over_the_wire_protocol_and_http2() {
    use picket_proto::connection::{Connection, Protocol};
    use picket_proto::v1::RaftPayload;
    use picket_proto::v1::raft_client::RaftClient;
    let (_dir, server, mut client) = start().await;
    let node_id = client.cluster(v1::Empty {}).await.unwrap().into_inner().leader_id;
    let connection =
        Connection::open_with(&server.addr, Duration::from_secs(5), 1 << 22, None, Protocol::Wire)
            .await
            .expect("connected");
    assert_eq!(connection.protocol(), Protocol::Wire);
    let mut h2 = RaftClient::connect(format!("http://{}", server.addr)).await.unwrap();
    let h2_link =
        Connection::open_with(&server.addr, Duration::from_secs(5), 1 << 22, None, Protocol::Grpc)
            .await
            .expect("connected over HTTP/2");
    let message = |target: Option<u64>, data: &str| {
        let mut request = tonic::Request::new(RaftPayload {
            data: data.as_bytes().to_vec(),
            error: String::new(),
        });
        if let Some(target) = target {
            request
                .metadata_mut()
                .insert("picket-target-node", target.to_string().parse().unwrap());
        }
        request.set_timeout(Duration::from_secs(5));
        request
    };
    // A leader of term 0, long behind this node's: refused with the node's own vote.
    let stale = r#"{"vote":{"leader_id":{"term":0,"node_id":7},"committed":true},
        "prev_log_id":null,"leader_commit":null,"entries":[]}"#;
    let served_before = direct_calls(&server.addr);
    let mut outcomes = Vec::new();
    for (target, data) in
        [(Some(node_id), stale), (Some(node_id + 100), stale), (None, stale), (Some(node_id), "{")]
    {
        let over_wire = outcome(connection.append_entries(message(target, data)).await);
        let over_h2 = outcome(h2.append_entries(message(target, data)).await);
        assert_eq!(over_wire, over_h2, "append entries to {target:?} of {data}");
        // `Connection`'s own call on an HTTP/2 connection is tonic's: the same answer.
        let over_h2_link = outcome(h2_link.append_entries(message(target, data)).await);
        assert_eq!(over_h2_link, over_h2, "append entries over an HTTP/2 link");
        outcomes.push(over_wire);
        for (over_wire, over_h2) in [
            (
                outcome(connection.vote(message(target, data)).await),
                outcome(h2.vote(message(target, data)).await),
            ),
            (
                outcome(connection.pre_vote(message(target, data)).await),
                outcome(h2.pre_vote(message(target, data)).await),
            ),
            (
                outcome(connection.install_snapshot(message(target, data)).await),
                outcome(h2.install_snapshot(message(target, data)).await),
            ),
        ] {
            assert_eq!(over_wire, over_h2, "a message to {target:?} of {data}");
        }
    }
    assert!(outcomes[0].starts_with("ok RaftPayload"), "the node answers: {}", outcomes[0]);
    assert!(outcomes[1].contains("FailedPrecondition"), "another node's: {}", outcomes[1]);
    assert!(outcomes[2].contains("without a target node id"), "no node named: {}", outcomes[2]);
    assert!(outcomes[3].contains("undecodable raft message"), "no message: {}", outcomes[3]);
    assert_eq!(direct_calls(&server.addr) - served_before, 4 * 4, "served directly");
    // A Raft message far longer than a client's request may be (128 KiB) is served directly
    // too: the `Raft` service's own bound holds for it.
    let long = format!("{stale}{}", " ".repeat(1 << 20));
    let served_before = direct_calls(&server.addr);
    let over_wire = outcome(connection.append_entries(message(Some(node_id), &long)).await);
    assert_eq!(over_wire, outcomes[0], "a long message is read as a short one");
    assert_eq!(direct_calls(&server.addr) - served_before, 1, "served directly");
}
