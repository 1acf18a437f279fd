use super::*;
use axum::routing::any;
use bytes::Bytes;
use picket_proto::connection::{Connection, Protocol};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const IDLE: Duration = Duration::from_millis(300);

/// Streams `chunks` chunks, one every 100 ms: a response that stays open longer than [`IDLE`].
/// Reads the request's body first, as a gRPC handler does: the test's client (the one the Rust
/// client uses) sends the body's end after the headers, and a stream answered before that is
/// closed under it.
async fn slow_stream(_request: String) -> axum::body::Body {
    let chunks = futures_util::stream::unfold(0_u32, |sent| async move {
        if sent == 8 {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        Some((Ok::<_, std::convert::Infallible>(format!("chunk {sent}\n")), sent + 1))
    });
    axum::body::Body::from_stream(chunks)
}

struct Listening {
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    serving: tokio::task::JoinHandle<()>,
}

/// Calls open at once on `/count` now, and the most ever seen; `/forever` counts into `now`
/// when it starts and into `dropped` when its handler is dropped.
#[derive(Default)]
struct Concurrency {
    now: AtomicUsize,
    most: AtomicUsize,
    dropped: AtomicUsize,
}

struct Dropped(Arc<Concurrency>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// A stream of 5,000 chunks, all ready at once.
async fn flood(_request: String) -> axum::body::Body {
    let chunks = (0..5_000).map(|i| Ok::<_, std::convert::Infallible>(format!("chunk {i}\n")));
    axum::body::Body::from_stream(futures_util::stream::iter(chunks))
}

/// Found in review: while every place of a wire connection was taken, the node read nothing,
/// so a cancel behind the calls never arrived and a call the client had dropped (a waiting
/// acquire) went on. The client now waits for a place itself, the node reads cancels at any
/// time, and the dropped call's handler is dropped, so the waiting call gets its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wire_call_is_cancelled_at_the_node_even_with_every_place_taken() {
    let concurrency = Arc::new(Concurrency::default());
    let listening = listen_with(1, concurrency.clone()).await;
    let connection = connect_with(&listening.addr, Protocol::Wire).await;
    let forever = tokio::spawn({
        let connection = connection.clone();
        async move { fetch(&connection, "/forever").await }
    });
    wait_for(|| concurrency.now.load(Ordering::SeqCst) == 1).await;
    // The one place is taken: this call waits for it.
    let next = tokio::spawn({
        let connection = connection.clone();
        async move { fetch(&connection, "/hello").await }
    });
    forever.abort();
    assert_eq!(next.await.expect("no panic"), "hello");
    wait_for(|| concurrency.dropped.load(Ordering::SeqCst) == 1).await;
}

/// Found in review: the client's reader waited for each call to take its frames, so one stream
/// nobody read (past 64 frames) stalled every other call on the connection. A call that falls
/// that far behind is now ended alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_nobody_reads_does_not_stall_its_connection() {
    let listening = listen().await;
    let connection = connect_with(&listening.addr, Protocol::Wire).await;
    let uri = format!("http://{}/flood", listening.addr);
    let request = http::Request::get(uri).body(tonic::body::Body::empty()).expect("a request");
    let unread = connection.clone().oneshot(request).await.expect("an answer");
    for _ in 0..3 {
        let answer = tokio::time::timeout(Duration::from_secs(10), fetch(&connection, "/hello"));
        assert_eq!(answer.await.expect("answered while the flood is unread"), "hello");
    }
    drop(unread);
}

/// Waits until `done` holds (at most 10 s).
async fn wait_for(done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "not done within 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn listen() -> Listening {
    listen_with(200, Arc::default()).await
}

/// A wire frame is read whole before its path is known, so its bound is the longest message
/// the connection may send: a client's request, or a Raft message where the listener serves
/// the `Raft` service (here, without TLS, to every connection). Past it the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wire_frame_may_be_as_long_as_the_longest_message_the_listener_serves() {
    let body = Bytes::from(vec![b'x'; 256 * 1024]);
    for (max_raft_message_bytes, served) in [(0, false), (1 << 20, true)] {
        let listening = serve_with(200, Arc::default(), max_raft_message_bytes).await;
        let connection = connect_with(&listening.addr, Protocol::Wire).await;
        let uri = format!("http://{}/hello", listening.addr);
        let request = http::Request::post(uri)
            .body(tonic::body::Body::new(http_body_util::Full::new(body.clone())))
            .expect("a request");
        let answer = connection.clone().oneshot(request).await;
        assert_eq!(answer.is_ok(), served, "{max_raft_message_bytes}: {answer:?}");
        if !served {
            wait_closed(&connection, Duration::from_secs(5)).await;
        }
    }
}

/// Serves `/hello`, `/stream`, and `/count`, which takes 100 ms and counts into `concurrency`;
/// each connection carries at most `max_streams` requests at once. Every route takes any method:
/// HTTP/2 requests here are `GET`s, wire calls are `POST`s, as gRPC's are.
async fn listen_with(max_streams: u32, concurrency: Arc<Concurrency>) -> Listening {
    serve_with(max_streams, concurrency, 0).await
}

async fn serve_with(
    max_streams: u32,
    concurrency: Arc<Concurrency>,
    max_raft_message_bytes: usize,
) -> Listening {
    let counted = concurrency.clone();
    let count = move |_request: String| {
        let concurrency = counted.clone();
        async move {
            let now = concurrency.now.fetch_add(1, Ordering::SeqCst) + 1;
            concurrency.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            concurrency.now.fetch_sub(1, Ordering::SeqCst);
            "counted"
        }
    };
    let forever = {
        let concurrency = concurrency.clone();
        move |_request: String| {
            let concurrency = concurrency.clone();
            async move {
                concurrency.now.fetch_add(1, Ordering::SeqCst);
                let _dropped = Dropped(concurrency);
                std::future::pending::<&str>().await
            }
        }
    };
    let app = axum::Router::new()
        .route("/hello", any(|_request: String| async { "hello" }))
        .route("/stream", any(slow_stream))
        .route("/flood", any(flood))
        .route("/forever", any(forever))
        .route("/count", any(count));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().expect("bound").to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let limits = ConnectionLimits {
        max_connections: 8,
        max_connections_per_ip: 4,
        idle_timeout: IDLE,
        max_streams_per_connection: max_streams,
        max_message_bytes: 1 << 16,
        max_raft_message_bytes,
    };
    let serving = tokio::spawn(serve(listener, app, None, limits, None, async move {
        let _ = stopped.await;
    }));
    Listening { addr, stop: Some(stop), serving }
}

/// Stops the listener and waits for it to end; returns how long that took.
async fn stop(listening: &mut Listening) -> Duration {
    let start = Instant::now();
    listening.stop.take().expect("not stopped yet").send(()).expect("listening");
    tokio::time::timeout(DRAIN_TIMEOUT, &mut listening.serving)
        .await
        .expect("the listener ended before the drain timeout")
        .expect("no panic");
    start.elapsed()
}

async fn connect(addr: &str) -> Connection {
    connect_with(addr, Protocol::Grpc).await
}

async fn connect_with(addr: &str, protocol: Protocol) -> Connection {
    let connection = Connection::open_with(addr, Duration::from_secs(5), 1 << 22, None, protocol)
        .await
        .expect("connected");
    assert_eq!(connection.protocol(), protocol, "the listener speaks both");
    connection
}

/// Sends GET `path` on `connection` (a wire call: POST) and reads the whole body.
async fn fetch(connection: &Connection, path: &str) -> String {
    let origin = connection.origin();
    let uri = format!("http://{}{path}", origin.authority().expect("host:port"));
    let request = http::Request::get(uri).body(tonic::body::Body::empty()).expect("a request");
    let response = connection.clone().oneshot(request).await.expect("an answer");
    assert_eq!(response.status(), 200);
    let body = http_body_util_collect(response.into_body()).await;
    String::from_utf8(body).expect("text")
}

async fn http_body_util_collect<B>(mut body: B) -> Vec<u8>
where
    B: hyper::body::Body + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut all = Vec::new();
    while let Some(frame) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
    {
        if let Ok(data) = frame.expect("a frame").into_data() {
            all.extend_from_slice(hyper::body::Buf::chunk(&data));
        }
    }
    all
}

async fn wait_closed(connection: &Connection, within: Duration) -> Duration {
    let start = Instant::now();
    while !connection.is_closed() {
        assert!(start.elapsed() < within, "the connection is still open after {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_with_no_request_for_the_idle_timeout_is_closed() {
    for protocol in [Protocol::Grpc, Protocol::Wire] {
        let listening = listen().await;
        let connection = connect_with(&listening.addr, protocol).await;
        assert_eq!(fetch(&connection, "/hello").await, "hello");
        assert!(!connection.is_closed(), "open right after a request");
        let waited = wait_closed(&connection, Duration::from_secs(10)).await;
        assert!(waited >= IDLE / 2, "closed after {waited:?}, before it was idle long enough");
        // The client connects again and is served.
        assert_eq!(fetch(&connect_with(&listening.addr, protocol).await, "/hello").await, "hello");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_open_longer_than_the_idle_timeout_keeps_its_connection() {
    for protocol in [Protocol::Grpc, Protocol::Wire] {
        let listening = listen().await;
        let connection = connect_with(&listening.addr, protocol).await;
        let body = fetch(&connection, "/stream").await;
        assert_eq!(body.lines().count(), 8, "the whole stream arrived: {body:?}");
        assert!(!connection.is_closed(), "the connection was busy until the stream ended");
        wait_closed(&connection, Duration::from_secs(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_closes_open_connections_and_ends_the_listener_before_the_drain_timeout() {
    let mut listening = listen().await;
    let connection = connect(&listening.addr).await;
    let wire = connect_with(&listening.addr, Protocol::Wire).await;
    assert_eq!(fetch(&connection, "/hello").await, "hello");
    assert_eq!(fetch(&wire, "/hello").await, "hello");
    let took = stop(&mut listening).await;
    assert!(took < DRAIN_TIMEOUT);
    wait_closed(&connection, Duration::from_secs(1)).await;
    wait_closed(&wire, Duration::from_secs(1)).await;
}

/// A connection carries at most `max_streams_per_connection` requests at once
/// (`--max-streams-per-connection`): further ones wait for a place and are then served, in
/// HTTP/2 (its `SETTINGS_MAX_CONCURRENT_STREAMS`) and in the wire protocol (the node stops
/// reading until a call ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_carries_at_most_its_streams_at_once() {
    for protocol in [Protocol::Grpc, Protocol::Wire] {
        let concurrency = Arc::new(Concurrency::default());
        let listening = listen_with(2, concurrency.clone()).await;
        let connection = connect_with(&listening.addr, protocol).await;
        // Once one request is answered, the HTTP/2 client has the node's settings (its stream
        // bound); streams opened before that may be refused instead of waiting.
        assert_eq!(fetch(&connection, "/hello").await, "hello");
        let calls = (0..6).map(|_| fetch(&connection, "/count"));
        let answers = futures_util::future::join_all(calls).await;
        assert!(answers.iter().all(|answer| answer == "counted"), "{answers:?}");
        assert_eq!(concurrency.most.load(Ordering::SeqCst), 2, "{protocol:?}");
    }
}

/// Found in review: a request that started and ended between two looks of the idle timer did
/// not restart it, so a connection busy with quick requests was closed as idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_requests_more_often_than_the_idle_timeout_keep_their_connection() {
    for protocol in [Protocol::Grpc, Protocol::Wire] {
        let listening = listen().await;
        let connection = connect_with(&listening.addr, protocol).await;
        let start = Instant::now();
        while start.elapsed() < IDLE * 3 {
            assert_eq!(fetch(&connection, "/hello").await, "hello");
            assert!(!connection.is_closed(), "closed after {:?} of requests", start.elapsed());
            tokio::time::sleep(IDLE / 4).await;
        }
    }
}

/// Found in review: a connection that had sent nothing yet held its place through a stop, so
/// every stop waited out the drain timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_does_not_wait_for_a_connection_that_sent_nothing() {
    let mut listening = listen().await;
    let _silent = tokio::net::TcpStream::connect(&listening.addr).await.expect("connected");
    // The listener has accepted it once a request on another connection is answered.
    assert_eq!(fetch(&connect(&listening.addr).await, "/hello").await, "hello");
    let took = stop(&mut listening).await;
    assert!(took < DRAIN_TIMEOUT / 2, "the stop took {took:?}");
}

/// One address holds at most `max_connections_per_ip` connections: a further one is closed at
/// once while the others are served, and once one of them closes the address may connect again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_the_connections() {
    let listening = listen().await;
    let mut open = Vec::new();
    for _ in 0..4 {
        let connection = connect(&listening.addr).await;
        assert_eq!(fetch(&connection, "/hello").await, "hello");
        open.push(connection);
    }
    let fifth = connect(&listening.addr).await;
    let origin = fifth.origin();
    let uri = format!("http://{}/hello", origin.authority().expect("host:port"));
    let request = http::Request::get(uri).body(tonic::body::Body::empty()).expect("a request");
    assert!(fifth.clone().oneshot(request).await.is_err(), "a fifth connection is not served");
    assert!(open.iter().all(|connection| !connection.is_closed()), "the four stay open");
    assert_eq!(fetch(&open[0], "/hello").await, "hello");
    drop(open.pop());
    // The dropped connection's place comes back once the listener sees it closed.
    let start = Instant::now();
    loop {
        let again = connect(&listening.addr).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        if !again.is_closed() {
            assert_eq!(fetch(&again, "/hello").await, "hello");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "the place never came back");
    }
}

/// An IPv6 host is commonly given a whole /64: the per-address bound counts the /64 as one
/// address, so one host cannot take every place from as many addresses. IPv4, also when it
/// comes mapped into IPv6, counts per address.
#[test]
fn the_per_address_bound_counts_an_ipv6_64_as_one_host() {
    let table = Arc::new(PerIp::default());
    let ip = |text: &str| text.parse::<std::net::IpAddr>().expect("an address");
    let first = table.take(ip("2001:db8:1:2::1"), 1).expect("a place");
    assert!(table.take(ip("2001:db8:1:2:ffff::9"), 1).is_none(), "the same /64");
    let other = table.take(ip("2001:db8:1:3::1"), 1).expect("another /64");
    let v4 = table.take(ip("192.0.2.7"), 1).expect("an IPv4 address");
    assert!(table.take(ip("::ffff:192.0.2.7"), 1).is_none(), "the same address, mapped");
    assert!(table.take(ip("192.0.2.8"), 1).is_some(), "another IPv4 address");
    drop(first);
    assert!(table.take(ip("2001:db8:1:2::5"), 1).is_some(), "a place given back");
    drop((other, v4));
}
