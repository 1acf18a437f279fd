use super::*;
use crate::connection::{Connection, Protocol, was_not_sent};
use http::{HeaderMap, HeaderValue};
use http_body::Body as _;
use tokio::net::{TcpListener, TcpStream};

const TIMEOUT: Duration = Duration::from_secs(5);

/// A node's end of a wire connection, driven by the test.
pub(crate) struct Node {
    stream: TcpStream,
    buffer: BytesMut,
}

impl Node {
    pub(crate) async fn accept(listener: &TcpListener) -> Self {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut opening = [0_u8; MAGIC.len()];
        stream.read_exact(&mut opening).await.unwrap();
        assert_eq!(&opening, MAGIC);
        stream.write_all(MAGIC).await.unwrap();
        stream.write_all(&2_u32.to_le_bytes()).await.unwrap();
        stream.write_all(&1024_u32.to_le_bytes()).await.unwrap();
        Self { stream, buffer: BytesMut::new() }
    }

    pub(crate) async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = Frame::decode(&mut self.buffer, 1 << 20).unwrap() {
                return Some(frame);
            }
            if self.stream.read_buf(&mut self.buffer).await.unwrap() == 0 {
                return None;
            }
        }
    }

    pub(crate) async fn send(&mut self, frame: Frame) {
        self.stream.write_all(&frame.to_bytes()).await.unwrap();
    }

    /// Accepts a connection, and answers its first call with a head and `chunks` data frames
    /// of 1 MiB; returns the node's end and the call's id.
    async fn answer_in_chunks(listener: &TcpListener, chunks: usize) -> (Self, u64) {
        let mut node = Self::accept(listener).await;
        let id = node.request_ids(1).await[0];
        node.send(Frame::Head { id, status: 200, headers: HeaderMap::new() }).await;
        let chunk = Bytes::from(vec![7_u8; 1 << 20]);
        for _ in 0..chunks {
            node.send(Frame::Data { id, data: chunk.clone() }).await;
        }
        (node, id)
    }

    /// Reads frames until `count` requests have come, and returns their ids.
    async fn request_ids(&mut self, count: usize) -> Vec<u64> {
        let mut ids = Vec::new();
        while ids.len() < count {
            match self.next().await {
                Some(Frame::Request { id, .. }) => ids.push(id),
                Some(_) => {}
                None => panic!("the connection closed after {} of {count} requests", ids.len()),
            }
        }
        ids
    }
}

pub(crate) async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

async fn open(addr: &str) -> WireConnection {
    let stream = TcpStream::connect(addr).await.unwrap();
    WireConnection::start(stream, TIMEOUT).await.unwrap().expect("the node speaks it")
}

async fn next_frame(body: &mut WireBody) -> Option<Result<BodyFrame<Bytes>, Status>> {
    std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
}

/// Regression (review of the wire protocol): metadata past the frame's bound was cut
/// silently; such a call is now refused before anything is sent, and the next one goes.
#[tokio::test]
async fn a_call_with_more_metadata_than_a_frame_takes_is_refused_not_cut() {
    let (listener, addr) = listener().await;
    let node = tokio::spawn(async move {
        let mut node = Node::accept(&listener).await;
        match node.next().await.unwrap() {
            Frame::Request { path, headers, .. } => (path, headers.len()),
            other => panic!("unexpected {other:?}"),
        }
    });
    let connection = open(&addr).await;
    let mut headers = HeaderMap::new();
    for index in 0..=MAX_HEADERS {
        headers.insert(
            http::HeaderName::try_from(format!("x-entry-{index}")).unwrap(),
            "1".parse().unwrap(),
        );
    }
    let refused = connection.call("/many", headers.clone(), Bytes::new()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    headers.remove("x-entry-0");
    headers.remove("x-entry-1");
    let sending = connection.clone();
    let sent = tokio::spawn(async move { sending.call("/fewer", headers, Bytes::new()).await });
    let read = tokio::time::timeout(TIMEOUT, node).await.unwrap().unwrap();
    sent.abort();
    assert_eq!(read, ("/fewer".to_owned(), MAX_HEADERS - 1));
}

/// Regression (review of the wire protocol): a bearer token set on one handle of a wire
/// link applied to every handle sharing it. The link's authorization is the first one set;
/// a call whose handle carries another, or none, says so itself.
#[tokio::test]
async fn each_handle_sharing_a_link_is_authorized_as_itself() {
    let (listener, addr) = listener().await;
    let (seen_sender, mut seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut node = Node::accept(&listener).await;
        while let Some(frame) = node.next().await {
            let line = match frame {
                Frame::Authorization { value } => format!("link {value:?}"),
                // Each call is dropped once the node has it, to free its place.
                Frame::Cancel { .. } => continue,
                Frame::Request { path, headers, .. } => {
                    let own = headers.get("authorization").map(|value| value.to_str().unwrap());
                    format!("{path} {own:?}")
                }
                other => panic!("unexpected {other:?}"),
            };
            seen_sender.send(line).unwrap();
        }
    });
    let mut next_seen = async || tokio::time::timeout(TIMEOUT, seen.recv()).await.unwrap();
    let connection = open(&addr).await;
    let token = |value: &str| -> HeaderValue { value.parse().unwrap() };
    connection.authorize(&token("Bearer a"));
    connection.authorize(&token("Bearer b"));
    let mut lines = vec![next_seen().await.unwrap()];
    for (path, own) in [("/a", Some("Bearer a")), ("/none", None), ("/b", Some("Bearer b"))] {
        let mut headers = HeaderMap::new();
        if let Some(own) = own {
            headers.insert("authorization", token(own));
        }
        let sending = connection.clone();
        let call = tokio::spawn(async move { sending.call(path, headers, Bytes::new()).await });
        // One after the other; the node answers none, so each goes to free its place.
        lines.push(next_seen().await.unwrap());
        call.abort();
    }
    assert_eq!(
        lines,
        ["link b\"Bearer a\"", "/a None", "/none Some(\"\")", "/b Some(\"Bearer b\")",]
    );
}

/// A call's request reaches the node whole, and its answer comes back as headers, data
/// and trailers, whatever order the node answers concurrent calls in.
#[tokio::test]
async fn calls_are_answered_by_id_in_any_order() {
    let (listener, addr) = listener().await;
    let node = tokio::spawn(async move {
        let mut node = Node::accept(&listener).await;
        let mut requests = Vec::new();
        while requests.len() < 2 {
            match node.next().await.unwrap() {
                Frame::Request { id, path, body, .. } => requests.push((id, path, body)),
                other => panic!("unexpected {other:?}"),
            }
        }
        // The later call is answered first.
        for (id, path, body) in requests.into_iter().rev() {
            let mut headers = HeaderMap::new();
            headers.insert("content-type", "application/grpc".parse().unwrap());
            node.send(Frame::Head { id, status: 200, headers }).await;
            node.send(Frame::Data { id, data: Bytes::from(format!("{path}:{body:?}")) }).await;
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            node.send(Frame::Trailers { id, trailers }).await;
        }
        node
    });
    let connection = open(&addr).await;
    let (first, second) = tokio::join!(
        connection.call("/a", HeaderMap::new(), Bytes::from_static(b"one")),
        connection.call("/b", HeaderMap::new(), Bytes::from_static(b"two")),
    );
    for (response, expected) in [(first, "/a:b\"one\""), (second, "/b:b\"two\"")] {
        let response = response.unwrap();
        assert_eq!(response.headers()["content-type"], "application/grpc");
        let mut body = response.into_body();
        let data = next_frame(&mut body).await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(data, expected.as_bytes());
        let trailers = next_frame(&mut body).await.unwrap().unwrap().into_trailers().unwrap();
        assert_eq!(trailers["grpc-status"], "0");
        assert!(next_frame(&mut body).await.is_none());
        assert!(body.is_end_stream());
    }
    node.await.unwrap();
}

/// A call the node says it never read (`GoAway` below its id) may be sent again: it fails
/// marked not sent, while a call the node read and then lost with the connection does not.
#[tokio::test]
async fn a_call_past_a_go_away_is_not_sent_and_one_before_it_is_unknown() {
    let (listener, addr) = listener().await;
    let node = tokio::spawn(async move {
        let mut node = Node::accept(&listener).await;
        let ids = node.request_ids(2).await;
        node.send(Frame::GoAway { last_id: ids[0] }).await;
        // The first call was read; the connection then breaks before its answer.
        drop(node);
        ids
    });
    let connection = open(&addr).await;
    let (read, unread) = tokio::join!(
        connection.call("/read", HeaderMap::new(), Bytes::new()),
        connection.call("/unread", HeaderMap::new(), Bytes::new()),
    );
    let (read, unread) = (read.unwrap_err(), unread.unwrap_err());
    assert!(!was_not_sent(&read), "{read:?}");
    assert!(was_not_sent(&unread), "{unread:?}");
    assert!(connection.is_closed());
    let late = connection.call("/late", HeaderMap::new(), Bytes::new()).await.unwrap_err();
    assert!(was_not_sent(&late), "a closed connection sends nothing: {late:?}");
    assert_eq!(node.await.unwrap().len(), 2);
}

/// The not-sent rule at the moment it matters, without a race to win: a call whose frame
/// was cut off mid-write may have reached the node (it must not be sent again blindly), while
/// one queued behind it, none of it handed to the socket, is marked not sent. An in-memory
/// pipe of 64 bytes holds the write in the middle of the first frame until the node's end
/// goes away.
#[tokio::test]
async fn a_call_cut_off_mid_write_is_unknown_and_one_queued_behind_it_is_not_sent() {
    let (client_end, mut node_end) = tokio::io::duplex(64);
    let node = tokio::spawn(async move {
        let mut opening = [0_u8; MAGIC.len()];
        node_end.read_exact(&mut opening).await.unwrap();
        node_end.write_all(MAGIC).await.unwrap();
        node_end.write_all(&2_u32.to_le_bytes()).await.unwrap();
        node_end.write_all(&(1_u32 << 20).to_le_bytes()).await.unwrap();
        // Part of the first frame, then the pipe is full and the writer waits mid-frame.
        let mut part = [0_u8; 16];
        node_end.read_exact(&mut part).await.unwrap();
        node_end
    });
    let connection = WireConnection::start(client_end, TIMEOUT).await.unwrap().unwrap();
    let cut = tokio::spawn({
        let connection = connection.clone();
        async move { connection.call("/cut", HeaderMap::new(), Bytes::from(vec![7; 4096])).await }
    });
    let node_end = tokio::time::timeout(TIMEOUT, node).await.unwrap().unwrap();
    assert_eq!(connection.shared().lock().handed_through, 1, "the first frame is being written");
    let queued = tokio::spawn({
        let connection = connection.clone();
        async move { connection.call("/queued", HeaderMap::new(), Bytes::new()).await }
    });
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while connection.shared().lock().waiting.len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "the second call was never queued");
        tokio::task::yield_now().await;
    }
    assert_eq!(connection.shared().lock().handed_through, 1, "the writer is still mid-frame");
    drop(node_end);
    let cut = tokio::time::timeout(TIMEOUT, cut).await.unwrap().unwrap().unwrap_err();
    let queued = tokio::time::timeout(TIMEOUT, queued).await.unwrap().unwrap().unwrap_err();
    assert!(!was_not_sent(&cut), "part of it went: it may have reached the node: {cut:?}");
    assert!(was_not_sent(&queued), "none of it went: {queued:?}");
}

/// A call given up on (its future or body dropped) is cancelled at the node, as an HTTP/2
/// stream reset would; one answered whole is not.
#[tokio::test]
async fn a_dropped_call_is_cancelled_at_the_node() {
    let (listener, addr) = listener().await;
    let node = tokio::spawn(async move {
        let mut node = Node::accept(&listener).await;
        let mut seen = Vec::new();
        while let Some(frame) = node.next().await {
            seen.push(frame);
            if matches!(seen.last(), Some(Frame::Cancel { .. })) {
                break;
            }
        }
        seen
    });
    let connection = open(&addr).await;
    let waiting = tokio::time::timeout(
        Duration::from_millis(50),
        connection.call("/wait", HeaderMap::new(), Bytes::new()),
    )
    .await;
    assert!(waiting.is_err(), "the node never answers");
    let seen = node.await.unwrap();
    assert!(matches!(&seen[0], Frame::Request { id: 1, path, .. } if path == "/wait"));
    assert_eq!(seen.last(), Some(&Frame::Cancel { id: 1 }));
}

/// A node that does not speak the protocol (an older build, which reads the opening as a
/// bad HTTP/1 request and closes) is connected to again in gRPC.
#[tokio::test]
async fn a_node_without_the_protocol_is_spoken_to_in_grpc() {
    let (listener, addr) = listener().await;
    let node = tokio::spawn(async move {
        let (mut old, _) = listener.accept().await.unwrap();
        let mut opening = [0_u8; MAGIC.len()];
        old.read_exact(&mut opening).await.unwrap();
        old.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await.unwrap();
        drop(old);
        let (stream, _) = listener.accept().await.unwrap();
        let mut connection = h2::server::handshake(stream).await.unwrap();
        while let Some(Ok(_)) = connection.accept().await {}
    });
    let connection =
        Connection::open_with(&addr, TIMEOUT, 1024, None, Protocol::Wire).await.unwrap();
    assert_eq!(connection.protocol(), Protocol::Grpc);
    drop(connection);
    node.await.unwrap();
}

/// Dropping every handle closes the connection: the node reads its end.
#[tokio::test]
async fn dropping_the_last_handle_closes_the_connection() {
    let (listener, addr) = listener().await;
    let node = tokio::spawn(async move {
        let mut node = Node::accept(&listener).await;
        node.next().await
    });
    let connection = open(&addr).await;
    let clone = connection.clone();
    drop(connection);
    drop(clone);
    let last = tokio::time::timeout(TIMEOUT, node).await.expect("closed").unwrap();
    assert_eq!(last, None);
}
fn any_message(_: &[u8]) -> bool {
    true
}

fn whole(unary: Unary) -> Vec<Answer> {
    match unary {
        Unary::Whole(answers) => answers,
        Unary::Live(response) => panic!("handed over live: {response:?}"),
    }
}

/// A unary call answered whole hears how the connection failed as a streamed call does: a
/// call the node never read is not sent, one it read and lost is not.
#[tokio::test]
async fn a_whole_answer_cut_off_keeps_the_not_sent_rule() {
    let (listener, addr) = listener().await;
    let node = tokio::spawn(async move {
        let mut node = Node::accept(&listener).await;
        let ids = node.request_ids(2).await;
        // The first call's head arrives, then the node says it never read the second and
        // the connection breaks.
        let headers = HeaderMap::new();
        node.send(Frame::Head { id: ids[0], status: 200, headers }).await;
        node.send(Frame::GoAway { last_id: ids[0] }).await;
    });
    let connection = open(&addr).await;
    let (read, unread) = tokio::join!(
        connection.unary("/read", HeaderMap::new(), Bytes::new(), any_message),
        connection.unary("/unread", HeaderMap::new(), Bytes::new(), any_message),
    );
    let (read, unread) = (whole(read.unwrap()), whole(unread.unwrap()));
    assert!(matches!(&read[..], [Ok(Frame::Head { .. }), Err(_)]), "{read:?}");
    let mut body = replay(read).unwrap().into_body();
    let cut = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
    let cut = cut.unwrap().unwrap_err();
    assert!(!was_not_sent(&cut), "{cut:?}");
    let unread = replay(unread).unwrap_err();
    assert!(was_not_sent(&unread), "{unread:?}");
    node.await.unwrap();
}

/// A unary call's answer is gathered only while it may be plain: a refusal in the head is
/// handed over at once, without waiting for the trailers; an answer that cannot be plain
/// (here a second data frame) is handed over as soon as that shows, and read as it comes.
/// A unary call given up on, before any answer or with part of it gathered, is cancelled at
/// the node and frees its place.
#[tokio::test]
async fn a_unary_answer_is_gathered_only_while_it_may_be_plain() {
    let (listener, addr) = listener().await;
    let (cancelled, mut cancels) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut node = Node::accept(&listener).await;
        while let Some(frame) = node.next().await {
            match frame {
                Frame::Request { id, path, .. } if path == "/refused" => {
                    let mut headers = HeaderMap::new();
                    headers.insert("grpc-status", HeaderValue::from_static("9"));
                    node.send(Frame::Head { id, status: 200, headers }).await;
                }
                Frame::Request { id, path, .. } if path == "/split" => {
                    node.send(Frame::Head { id, status: 200, headers: HeaderMap::new() }).await;
                    for part in [&b"one"[..], b"two"] {
                        node.send(Frame::Data { id, data: Bytes::from_static(part) }).await;
                    }
                }
                Frame::Request { id, path, .. } if path == "/partial" => {
                    node.send(Frame::Head { id, status: 200, headers: HeaderMap::new() }).await;
                    let message = Bytes::from_static(&[0, 0, 0, 0, 1, b'x']);
                    node.send(Frame::Data { id, data: message }).await;
                }
                Frame::Cancel { id } => cancelled.send(id).unwrap(),
                _ => {}
            }
        }
    });
    let connection = open(&addr).await;
    let refused = connection.unary("/refused", HeaderMap::new(), Bytes::new(), any_message);
    let refused = whole(tokio::time::timeout(TIMEOUT, refused).await.unwrap().unwrap());
    assert!(matches!(&refused[..], [Ok(Frame::Head { .. })]), "{refused:?}");
    let split = connection.unary("/split", HeaderMap::new(), Bytes::new(), any_message);
    let split = match tokio::time::timeout(TIMEOUT, split).await.unwrap().unwrap() {
        Unary::Live(response) => response.unwrap(),
        Unary::Whole(answers) => panic!("gathered: {answers:?}"),
    };
    let mut body = split.into_body();
    for part in ["one", "two"] {
        let data = next_frame(&mut body).await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(data, part.as_bytes());
    }
    drop(body);
    let cancelled = tokio::time::timeout(TIMEOUT, cancels.recv()).await.unwrap();
    assert_eq!(cancelled, Some(2), "the split call, given up on; the refused one had ended");
    let waiting = tokio::time::timeout(
        Duration::from_millis(50),
        connection.unary("/wait", HeaderMap::new(), Bytes::new(), any_message),
    )
    .await;
    assert!(waiting.is_err(), "the node never answers");
    let cancelled = tokio::time::timeout(TIMEOUT, cancels.recv()).await.unwrap();
    assert_eq!(cancelled, Some(3), "the call given up on while it waited");
    let partial = tokio::time::timeout(
        Duration::from_millis(50),
        connection.unary("/partial", HeaderMap::new(), Bytes::new(), any_message),
    )
    .await;
    assert!(partial.is_err(), "the trailers never come");
    let cancelled = tokio::time::timeout(TIMEOUT, cancels.recv()).await.unwrap();
    assert_eq!(cancelled, Some(4), "the call given up on with its head and message gathered");
    assert_eq!(connection.shared().places.available_permits(), 2, "every place is free");
    assert!(connection.shared().lock().waiting.is_empty());
}

/// A call whose answer is read slower than it comes is ended once it holds more than
/// `ANSWER_BYTES` unread, and cancelled at the node: before, only its frames counted, so a
/// backup read slower than it arrived could hold up to 1,024 chunks of 1 MiB. The call reads
/// why it ended, and the connection's other calls go on.
#[tokio::test]
async fn a_call_read_slower_than_its_answer_comes_is_ended_by_the_bytes_it_holds() {
    const CHUNK: usize = 1 << 20;
    // Far fewer frames than ANSWER_FRAMES, more bytes than ANSWER_BYTES.
    let chunks = ANSWER_BYTES / CHUNK + 8;
    let (listener, addr) = listener().await;
    let (cancelled, was_cancelled) = oneshot::channel();
    let node = tokio::spawn(async move {
        let (mut node, id) = Node::answer_in_chunks(&listener, chunks).await;
        match node.next().await {
            Some(Frame::Cancel { id: cancel }) if cancel == id => cancelled.send(cancel).unwrap(),
            other => panic!("{other:?} instead of the call's cancel"),
        }
        let second = node.request_ids(1).await[0];
        node.send(Frame::Head { id: second, status: 200, headers: HeaderMap::new() }).await;
        node.send(Frame::Trailers { id: second, trailers: HeaderMap::new() }).await;
        node
    });
    let connection = open(&addr).await;
    let slow = connection.call("/backup", HeaderMap::new(), Bytes::new()).await.unwrap();
    // Nothing of the body is read until the node has seen the call's cancel.
    let cancel = tokio::time::timeout(TIMEOUT, was_cancelled).await.unwrap().unwrap();
    assert_eq!(cancel, 1);
    let mut body = slow.into_body();
    let mut read = 0;
    let ended = loop {
        match next_frame(&mut body).await {
            Some(Ok(frame)) => read += frame.into_data().map_or(0, |data| data.len()),
            Some(Err(status)) => break status,
            None => panic!("the body ended without saying why after {read} bytes"),
        }
    };
    assert_eq!(read, ANSWER_BYTES, "what was held for the call, no more and no less");
    assert!(ended.message().contains("read slower than it came"), "{ended:?}");
    let next = connection.call("/next", HeaderMap::new(), Bytes::new()).await.unwrap();
    assert_eq!(next.status(), 200);
    drop(tokio::time::timeout(TIMEOUT, node).await.unwrap().unwrap());
}

/// A call that reads its answer as it comes is never ended by the bound, however long the
/// answer: what it reads is counted off what the reader holds.
#[tokio::test]
async fn a_call_read_as_it_comes_takes_an_answer_longer_than_the_bound() {
    const CHUNK: usize = 1 << 20;
    let chunks = 2 * ANSWER_BYTES / CHUNK;
    let (listener, addr) = listener().await;
    let node = tokio::spawn(async move {
        let (mut node, id) = Node::answer_in_chunks(&listener, chunks).await;
        node.send(Frame::Trailers { id, trailers: HeaderMap::new() }).await;
        node
    });
    let connection = open(&addr).await;
    let answer = connection.call("/backup", HeaderMap::new(), Bytes::new()).await.unwrap();
    let mut body = answer.into_body();
    let mut read = 0;
    let mut trailers = false;
    while let Some(frame) = next_frame(&mut body).await {
        let frame = frame.unwrap_or_else(|status| panic!("ended after {read} bytes: {status:?}"));
        trailers |= frame.is_trailers();
        read += frame.into_data().map_or(0, |data| data.len());
    }
    assert_eq!(read, chunks * CHUNK);
    assert!(trailers, "the answer ended whole");
    drop(tokio::time::timeout(TIMEOUT, node).await.unwrap().unwrap());
}
