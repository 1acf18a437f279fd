//! A hostile client against a real `picket serve` (issue 13): thousands of oversized and
//! malformed requests, NUL names, wrong types, unknown sessions, a flood of watch streams, more
//! connections than the node accepts, idle connections and connections that send their headers
//! a byte at a time. Meanwhile and afterwards an honest client is served; the node's memory,
//! open files and data directory stay bounded; a refused request writes nothing to the log; and
//! the node restarts cleanly after `kill -9`.
//!
//! The node runs with small WAL segments and frequent snapshots, so log rotation and
//! compaction happen many times during the test.

use picket_proto::connection::Connection;
use picket_proto::v1::{self, picket_client::PicketClient};
use picket_testkit::http::{Reply, get, request_raw};
use picket_testkit::{ServerProcess, wait_until};
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MAX_CONNECTIONS: usize = 300;
const MAX_WATCH_STREAMS: usize = 60;
const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
const IDLE_HTTP2_CONNECTIONS: usize = 20;
/// Generous: an honest cycle answered later than this means the node was wedged, not slow.
const HONEST_BOUND: Duration = Duration::from_secs(5);

fn applied_log_index(addr: &str) -> u64 {
    get(addr, "/v1/cluster").body["applied_log_index"].as_u64().expect("an applied index")
}

/// Log entries that did not advance the state: refused commands that reached the log (and the
/// leader's blank entries). Constant while nothing but accepted commands is written.
fn entries_without_revision(addr: &str) -> u64 {
    let cluster = get(addr, "/v1/cluster").body;
    let index = cluster["applied_log_index"].as_u64().expect("an applied index");
    index - cluster["applied_revision"].as_u64().expect("an applied revision")
}

/// Reads until the node closes the connection; panics if it does not within `limit`.
fn assert_closed_within(mut stream: TcpStream, limit: Duration, what: &str) {
    stream.set_read_timeout(Some(limit)).expect("a timeout");
    let mut rest = Vec::new();
    let closed = stream.read_to_end(&mut rest);
    assert!(closed.is_ok(), "{what}: not closed within {limit:?}: {closed:?}");
}

fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("a live process");
    let line = status.lines().find(|line| line.starts_with(field)).expect("the field");
    line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("a number")
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).expect("a live process").count()
}

fn dir_bytes(path: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![path.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable").flatten() {
            let meta = entry.metadata().expect("metadata");
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

/// An honest client on one gRPC connection, as the Rust client keeps: acquire and release one
/// lock in a loop, keeping its session alive; returns how many cycles it made and the slowest
/// request.
struct Honest {
    stop: Arc<AtomicBool>,
    cycles: Arc<AtomicU64>,
    thread: JoinHandle<(u64, Duration)>,
}

impl Honest {
    fn start(addr: &str) -> Self {
        let addr = format!("http://{addr}");
        let stop = Arc::new(AtomicBool::new(false));
        let cycles = Arc::new(AtomicU64::new(0));
        let (stopping, counted) = (stop.clone(), cycles.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let mut grpc = PicketClient::connect(addr).await.expect("connects");
                let open = v1::OpenSessionRequest {
                    ttl_ms: 10_000,
                    lock_delay_ms: 0,
                    ..Default::default()
                };
                let session = grpc.open_session(open).await.expect("a session").into_inner();
                let session_id = session.session_id;
                let (mut cycles, mut slowest) = (0, Duration::ZERO);
                while !stopping.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    let acquire = v1::AcquireRequest {
                        name: "honest/l".into(),
                        session_id,
                        wait_ms: Some(0),
                        ..v1::AcquireRequest::default()
                    };
                    let token = grpc.acquire(acquire).await.expect("granted").into_inner().token;
                    let release = v1::ReleaseRequest { name: "honest/l".into(), session_id, token };
                    grpc.release(release).await.expect("released");
                    grpc.keep_alive(v1::KeepAliveRequest { session_id, ..Default::default() })
                        .await
                        .expect("kept");
                    slowest = slowest.max(started.elapsed());
                    cycles += 1;
                    counted.store(cycles, Ordering::SeqCst);
                }
                (cycles, slowest)
            })
        });
        Self { stop, cycles, thread }
    }

    /// Cycles completed so far.
    fn cycles(&self) -> u64 {
        self.cycles.load(Ordering::SeqCst)
    }

    fn stop(self) -> (u64, Duration) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("the honest client does not panic")
    }
}

/// Opens `count` HTTP/2 connections that answer the node's pings but open no stream; the
/// thread ends once the node has closed every one (or after `limit`) and says how many it
/// closed.
fn idle_http2_connections(addr: &str, count: usize, limit: Duration) -> JoinHandle<usize> {
    let addr = addr.to_owned();
    std::thread::spawn(move || {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async move {
            let mut open = Vec::new();
            for _ in 0..count {
                let connecting = Connection::open(&addr, Duration::from_secs(5), 1 << 16, None);
                open.push(connecting.await.expect("connects"));
            }
            let start = Instant::now();
            while open.iter().any(|connection| !connection.is_closed()) && start.elapsed() < limit {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            open.iter().filter(|connection| connection.is_closed()).count()
        })
    })
}

/// Sends `count` requests from `threads` threads, each built by `request(i)`; every answer must
/// be a refusal in the API's error format (4xx with a code), never a server error.
fn barrage(
    addr: &str,
    threads: usize,
    count: usize,
    request: fn(usize) -> (String, String, Vec<u8>),
) {
    let handles: Vec<JoinHandle<()>> = (0..threads)
        .map(|thread| {
            let addr = addr.to_owned();
            std::thread::spawn(move || {
                for i in (thread..count).step_by(threads) {
                    let (method, path, body) = request(i);
                    let reply = request_raw(&addr, &method, &path, Some(&body), "application/json");
                    assert_refusal(&reply, &method, &path);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("a hostile thread does not panic");
    }
}

fn assert_refusal(reply: &Reply, method: &str, path: &str) {
    assert!(
        (400..500).contains(&reply.status) && reply.body["code"].is_string(),
        "{method} {path}: {} {}",
        reply.status,
        reply.text.chars().take(200).collect::<String>()
    );
}

fn nul_name(_: usize) -> (String, String, Vec<u8>) {
    let body = json!({ "name": "\0".repeat(10_000), "session_id": 1, "wait_ms": 0 });
    ("POST".into(), "/v1/locks/acquire".into(), body.to_string().into_bytes())
}

fn oversized(i: usize) -> (String, String, Vec<u8>) {
    let paths = ["/v1/locks/acquire", "/v1/sessions", "/v1/locks/release"];
    ("POST".into(), paths[i % 3].into(), vec![b' '; 200_000])
}

fn wrong_types(i: usize) -> (String, String, Vec<u8>) {
    let bodies = [
        json!({ "name": 5, "session_id": "x" }),
        json!({ "name": "a", "session_id": -1 }),
        json!({ "ttl_ms": "long" }),
        json!([1, 2, 3]),
        json!({ "name": "a", "session_id": 1, "wait_ms": 1e300 }),
        json!({ "name": "a", "session_id": 1, "token": "zero" }),
    ];
    let paths = [
        "/v1/locks/acquire",
        "/v1/locks/acquire",
        "/v1/sessions",
        "/v1/locks/cancel",
        "/v1/locks/acquire",
        "/v1/locks/release",
    ];
    ("POST".into(), paths[i % 6].into(), bodies[i % 6].to_string().into_bytes())
}

fn unknown_sessions(i: usize) -> (String, String, Vec<u8>) {
    let session = 1_000_000 + i;
    match i % 3 {
        0 => ("POST".into(), format!("/v1/sessions/{session}/keepalive"), b"{}".to_vec()),
        1 => {
            let body = json!({ "name": "x", "session_id": session, "wait_ms": 0 });
            ("POST".into(), "/v1/locks/acquire".into(), body.to_string().into_bytes())
        }
        _ => ("DELETE".into(), format!("/v1/sessions/{session}"), Vec::new()),
    }
}

fn garbage(i: usize) -> (String, String, Vec<u8>) {
    let paths = [
        "/v1/locks/%FF",
        "/v1/sessions/abc",
        "/v1/nothing",
        "/v1/locks/acquire?x=%00",
        "/v1/watch?prefix=%ZZ",
    ];
    let methods = ["GET", "POST", "PUT", "DELETE", "GET"];
    (methods[i % 5].into(), paths[i % 5].into(), vec![0xff, 0xfe, b'{', 0])
}

/// Opens a connection that sends a request line and then nothing more.
fn slow_connection(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.write_all(b"GET /v1/cluster HTTP/1.1\r\nHost: x\r\nX-Slow: ").expect("send");
    stream
}

/// Opens a wire-protocol connection (the node answers its opening) and sends `then`.
fn wire_connection(addr: &str, then: &[u8]) -> TcpStream {
    use picket_proto::wire::MAGIC;
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("a timeout");
    stream.write_all(MAGIC).expect("send");
    let mut answer = [0_u8; MAGIC.len()];
    stream.read_exact(&mut answer).expect("the node's opening");
    assert_eq!(&answer, MAGIC);
    stream.write_all(then).expect("send");
    stream
}

fn open_watch(addr: &str) -> (u16, TcpStream) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("a timeout");
    stream.write_all(b"GET /v1/watch?prefix=jobs/ HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    let mut head = [0_u8; 12];
    stream.read_exact(&mut head).expect("a status line");
    let status = String::from_utf8_lossy(&head[9..12]).parse().expect("a status");
    (status, stream)
}

#[test]
fn a_hostile_client_cannot_crash_wedge_or_exhaust_a_node() {
    let flags = [
        "--wal-segment-bytes",
        "65536",
        "--snapshot-every",
        "100",
        "--max-connections",
        "300",
        "--max-watch-streams",
        "60",
        "--idle-connection-timeout-ms",
        "5000",
    ];
    let (dir, mut server) =
        ServerProcess::start_ready(Path::new(env!("CARGO_BIN_EXE_picket")), &flags);
    let addr = server.addr.clone();
    let pid = server.pid().expect("running");
    let rss_before_kib = proc_status_kib(pid, "VmRSS:");
    let honest = Honest::start(&addr);

    // Idle and slow connections, and more connections than the node accepts.
    let idle_http2 = idle_http2_connections(
        &addr,
        IDLE_HTTP2_CONNECTIONS,
        IDLE_CONNECTION_TIMEOUT * 4 + Duration::from_secs(20),
    );
    let idle: Vec<TcpStream> =
        (0..100).map(|_| TcpStream::connect(&addr).expect("connect")).collect();
    let slow: Vec<TcpStream> = (0..50).map(|_| slow_connection(&addr)).collect();
    // Wire-protocol connections that open and send nothing, or half a frame: closed once idle
    // for --idle-connection-timeout-ms, as an idle HTTP/2 connection is.
    let half_frame = [0x40_u8, 0, 0, 0, 1, 7];
    let idle_wire: Vec<TcpStream> = (0..20)
        .map(|i| wire_connection(&addr, if i % 2 == 0 { &[] } else { &half_frame }))
        .collect();
    // A frame longer than any request the node takes (its prefix says 1 GiB), and a frame of a
    // kind no client sends: each closes its connection at once, before anything is buffered.
    let oversized_frame = (1_u32 << 30).to_le_bytes();
    let unknown_kind = [1_u8, 0, 0, 0, 99];
    for frame in [&oversized_frame[..], &unknown_kind[..]] {
        assert_closed_within(
            wire_connection(&addr, frame),
            Duration::from_secs(2),
            "a wire connection that broke the protocol",
        );
    }
    let watches: Vec<(u16, TcpStream)> =
        (0..MAX_WATCH_STREAMS + 20).map(|_| open_watch(&addr)).collect();
    let refused_watches = watches.iter().filter(|(status, _)| *status == 429).count();
    assert_eq!(refused_watches, 20, "past --max-watch-streams a watch gets 429");
    // The node stops accepting at its bound; the rest wait in the kernel's backlog (or time out).
    let socket: std::net::SocketAddr = addr.parse().expect("an address");
    let excess: Vec<TcpStream> = (0..MAX_CONNECTIONS)
        .filter_map(|_| TcpStream::connect_timeout(&socket, Duration::from_millis(200)).ok())
        .collect();
    assert!(
        open_files(pid) <= MAX_CONNECTIONS + 128,
        "{} files open with --max-connections {MAX_CONNECTIONS}",
        open_files(pid)
    );
    drop(excess);

    let (index_before, cycles_before) = (applied_log_index(&addr), honest.cycles());
    let unrevised_before = entries_without_revision(&addr);
    barrage(&addr, 4, 300, nul_name);
    barrage(&addr, 4, 300, oversized);
    barrage(&addr, 4, 1_200, wrong_types);
    barrage(&addr, 4, 1_200, unknown_sessions);
    barrage(&addr, 4, 1_000, garbage);

    let (written, cycles_during) =
        (applied_log_index(&addr) - index_before, honest.cycles() - cycles_before);
    let (cycles, slowest) = honest.stop();
    assert!(cycles_during > 10, "the honest client made only {cycles_during} cycles meanwhile");
    assert!(slowest < HONEST_BOUND, "an honest cycle took {slowest:?}");
    // Every entry written meanwhile advanced the state: none of the 4,000 refusals reached the
    // log.
    assert_eq!(entries_without_revision(&addr), unrevised_before, "refused commands were logged");

    // Idle connections and slow ones are closed once their opening or headers are overdue
    // (10 s from when they connected).
    for stream in idle {
        assert_closed_within(stream, Duration::from_secs(20), "an idle connection");
    }
    for stream in slow {
        assert_closed_within(stream, Duration::from_secs(20), "a slow connection");
    }
    // HTTP/2 connections that answer pings but open no stream are closed once idle for
    // --idle-connection-timeout-ms.
    for stream in idle_wire {
        assert_closed_within(stream, IDLE_CONNECTION_TIMEOUT * 3, "an idle wire connection");
    }
    let closed_http2 = idle_http2.join().expect("the idle HTTP/2 client does not panic");
    assert_eq!(closed_http2, IDLE_HTTP2_CONNECTIONS, "idle HTTP/2 connections were left open");
    drop(watches);
    let rss_after_kib = proc_status_kib(pid, "VmRSS:");
    assert!(
        rss_after_kib < rss_before_kib + 128 * 1024,
        "resident memory grew from {rss_before_kib} KiB to {rss_after_kib} KiB"
    );
    let data_bytes = dir_bytes(&dir.path().join("data"));
    assert!(data_bytes < 32 << 20, "the data directory holds {data_bytes} bytes");
    eprintln!(
        "honest cycles {cycles} ({cycles_during} during the barrage), slowest {slowest:?}; \
         {written} entries written during the barrage; resident \
         {rss_before_kib} -> {rss_after_kib} KiB; data directory {data_bytes} bytes"
    );

    server.restart();
    wait_until("the node to be ready after kill -9", Duration::from_secs(20), || {
        (get(&server.addr, "/readyz").status == 200).then_some(())
    });
    let index_restarted = applied_log_index(&server.addr);
    let after = Honest::start(&server.addr);
    wait_until("honest cycles after the restart", Duration::from_secs(10), || {
        (applied_log_index(&server.addr) > index_restarted + 6).then_some(())
    });
    let (cycles, _) = after.stop();
    assert!(cycles > 0, "the restarted node serves");
}

/// Found in a hostile-input audit: a request that declared a body and then sent only part of
/// it held its request and its connection for as long as it liked (over gRPC, with the
/// decoder's buffer for the whole declared message, before any credential was checked). Now
/// the body must arrive within `BODY_DEADLINE` (10 s) of the headers: the request is refused
/// then, and the node goes on serving.
#[test]
fn a_request_body_that_never_arrives_whole_is_refused_at_its_deadline() {
    let (_dir, server) = ServerProcess::start_ready(Path::new(env!("CARGO_BIN_EXE_picket")), &[]);
    let mut stream = TcpStream::connect(&server.addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(40))).expect("a timeout");
    let started = Instant::now();
    stream
        .write_all(
            b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"ttl_ms\":",
        )
        .expect("send");
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 4096];
    while !answer.windows(4).any(|window| window == b"\r\n\r\n") {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => answer.extend_from_slice(&buffer[..read]),
        }
    }
    let waited = started.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "refused: {answer:?} after {waited:?}");
    assert!(waited >= Duration::from_secs(9), "not before its deadline: {waited:?}");
    assert!(waited < Duration::from_secs(30), "at its deadline, not never: {waited:?}");
    assert_eq!(get(&server.addr, "/healthz").status, 200, "the node goes on serving");
}

/// Regression (hostile-input audit): the body deadline bounded how long a request body on its
/// way was held, not how many were: clients that declared bodies and sent none could hold a
/// buffer each on every stream of every connection (over gRPC the decoder reserves a message's
/// whole declared length for five bytes sent). Now bodies on their way share the node's
/// `--max-body-bytes-in-flight`, of which one client host may hold a quarter: past it a
/// request is refused at once with 429 `too_many_request_bodies` (gRPC `RESOURCE_EXHAUSTED`),
/// requests without a body are served, and the places come back when the bodies'
/// connections go. (Every connection here comes from one host: the node-wide bound has a unit
/// test in `http/deadline.rs`.)
#[test]
fn request_bodies_on_their_way_share_a_bound_across_connections() {
    let (_dir, server) = ServerProcess::start_ready(
        Path::new(env!("CARGO_BIN_EXE_picket")),
        &[
            "--max-body-bytes-in-flight",
            "65536",
            "--max-http-body-bytes",
            "4096",
            "--max-grpc-message-bytes",
            "4096",
        ],
    );
    // Four connections declare a 4 KiB body each and send one byte of it: 16 KiB in all, the
    // host's quarter of the node's 64 KiB.
    let trickling: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut stream = TcpStream::connect(&server.addr).expect("connect");
            let head = b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n{";
            stream.write_all(head).expect("send");
            stream
        })
        .collect();
    let open = json!({"ttl_ms": 5000});
    let refused = wait_until("a request refused for the bodies on their way", HONEST_BOUND, || {
        let reply = picket_testkit::http::post(&server.addr, "/v1/sessions", &open);
        (reply.status != 200).then_some(reply)
    });
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.body["code"], "too_many_request_bodies", "{refused:?}");
    assert!(
        refused.body["message"].as_str().unwrap_or_default().contains("--max-body-bytes-in-flight"),
        "names its flag: {refused:?}"
    );
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let grpc = runtime.block_on(async {
        let mut grpc = PicketClient::connect(format!("http://{}", server.addr)).await.expect("h2");
        grpc.open_session(v1::OpenSessionRequest { ttl_ms: 5000, ..Default::default() }).await
    });
    let status = grpc.expect_err("refused over gRPC too");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(get(&server.addr, "/healthz").status, 200, "a request without a body is served");

    drop(trickling);
    wait_until("a session opened once those connections closed", HONEST_BOUND, || {
        (picket_testkit::http::post(&server.addr, "/v1/sessions", &open).status == 200)
            .then_some(())
    });
}
