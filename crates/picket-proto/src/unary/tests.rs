use super::*;
use crate::connection::{Protocol, not_sent_status, was_not_sent};
use crate::wire_client::tests::{Node, listener};
use http::HeaderMap;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(5);

fn headers(entries: &[(&'static str, &str)]) -> HeaderMap {
    entries
        .iter()
        .map(|(name, value)| (http::HeaderName::from_static(name), value.parse().unwrap()))
        .collect()
}

fn message_body(flag: u8, message: &[u8], length: usize) -> Bytes {
    let mut body = vec![flag];
    body.extend_from_slice(&u32::try_from(length).unwrap().to_be_bytes());
    body.extend_from_slice(message);
    Bytes::from(body)
}

fn head(entries: &[(&'static str, &str)]) -> Answer {
    Ok(Frame::Head { id: 0, status: 200, headers: headers(entries) })
}

fn data(data: Bytes) -> Answer {
    Ok(Frame::Data { id: 0, data })
}

fn trailers(entries: &[(&'static str, &str)]) -> Answer {
    Ok(Frame::Trailers { id: 0, trailers: headers(entries) })
}

const CONTENT: (&str, &str) = ("content-type", "application/grpc");
const OK: (&str, &str) = ("grpc-status", "0");

/// tonic's bound on an answer message.
const TONIC_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// A grant whose encoded message is `length` bytes long.
fn grant_of_length(length: usize) -> Vec<u8> {
    // The token's field takes 2 bytes, the sequencer's tag 1, and its length 1 to 4.
    (4..=7)
        .map(|overhead| {
            let sequencer = "s".repeat(length - overhead);
            let grant = v1::AcquireResponse { token: 7, sequencer, already_held: false };
            prost::Message::encode_to_vec(&grant)
        })
        .find(|encoded| encoded.len() == length)
        .expect("a sequencer of some length makes it")
}

/// The answer forms a node may send, each with whether it is read directly: one message
/// and `grpc-status: 0`, or a refusal in the head (as the node sends them), and
/// everything else, left to tonic.
fn answer_forms() -> Vec<(&'static str, bool, Vec<Answer>)> {
    let granted = prost::Message::encode_to_vec(&v1::AcquireResponse {
        token: 7,
        sequencer: "picket:v1:lock:7".into(),
        already_held: false,
    });
    let plain = message_body(0, &granted, granted.len());
    let longest = grant_of_length(PLAIN_MESSAGE_BYTES);
    let longer = grant_of_length(PLAIN_MESSAGE_BYTES + 1);
    let too_long = grant_of_length(TONIC_MESSAGE_BYTES + 1);
    let refused = [
        CONTENT,
        ("grpc-status", "9"),
        ("grpc-message", "lock%20busy"),
        ("picket-error-code", "lock_busy"),
        ("picket-holder-token", "5"),
    ];
    let (half, rest) = plain.split_at(4);
    vec![
        (
            "granted",
            true,
            vec![head(&[CONTENT]), data(plain.clone()), trailers(&[OK, ("x-late", "1")])],
        ),
        (
            "granted, metadata in both",
            true,
            vec![
                head(&[CONTENT, ("x-both", "a"), ("x-both", "b")]),
                data(plain.clone()),
                trailers(&[OK, ("x-both", "c")]),
            ],
        ),
        (
            "granted, the longest message read directly",
            true,
            vec![head(&[CONTENT]), data(message_body(0, &longest, longest.len())), trailers(&[OK])],
        ),
        (
            "granted, a longer message",
            false,
            vec![head(&[CONTENT]), data(message_body(0, &longer, longer.len())), trailers(&[OK])],
        ),
        (
            "granted, with a message beside the status",
            true,
            vec![head(&[CONTENT]), data(plain.clone()), trailers(&[OK, ("grpc-message", "fine")])],
        ),
        (
            "granted, with a message badly escaped beside the status",
            false,
            vec![head(&[CONTENT]), data(plain.clone()), trailers(&[OK, ("grpc-message", "%FF")])],
        ),
        ("refused in the head", true, vec![head(&refused), trailers(&[])]),
        ("refused, no trailers", true, vec![head(&refused)]),
        ("refused, data after", true, vec![head(&refused), data(plain.clone()), trailers(&[OK])]),
        (
            "refused, not found",
            true,
            vec![Ok(Frame::Head { id: 0, status: 404, headers: headers(&refused) }), trailers(&[])],
        ),
        (
            "refused, a status not a number",
            true,
            vec![head(&[("grpc-status", "abc")]), trailers(&[])],
        ),
        (
            "refused, a message badly escaped",
            true,
            vec![head(&[("grpc-status", "9"), ("grpc-message", "100%FF")]), trailers(&[])],
        ),
        (
            "refused after the message",
            false,
            vec![
                head(&[CONTENT]),
                data(plain.clone()),
                trailers(&[("grpc-status", "14"), ("grpc-message", "gone")]),
            ],
        ),
        (
            "too long a message",
            false,
            vec![
                head(&[CONTENT]),
                data(message_body(0, &too_long, too_long.len())),
                trailers(&[OK]),
            ],
        ),
        (
            "compressed",
            false,
            vec![head(&[CONTENT]), data(message_body(1, &granted, granted.len())), trailers(&[OK])],
        ),
        (
            "cut short",
            false,
            vec![
                head(&[CONTENT]),
                data(message_body(0, &granted[..3], granted.len())),
                trailers(&[OK]),
            ],
        ),
        (
            "split over two frames",
            false,
            vec![
                head(&[CONTENT]),
                data(Bytes::copy_from_slice(half)),
                data(Bytes::copy_from_slice(rest)),
                trailers(&[OK]),
            ],
        ),
        (
            "two messages",
            false,
            vec![
                head(&[CONTENT]),
                data([plain.clone(), plain.clone()].concat().into()),
                trailers(&[OK]),
            ],
        ),
        (
            "undecodable",
            false,
            vec![head(&[CONTENT]), data(message_body(0, &[0xff, 0xff], 2)), trailers(&[OK])],
        ),
        (
            "compressed, no trailers",
            false,
            vec![head(&[CONTENT]), data(message_body(1, &granted, granted.len()))],
        ),
        (
            "too long a message declared, no trailers",
            false,
            vec![head(&[CONTENT]), data(message_body(0, &granted, TONIC_MESSAGE_BYTES + 1))],
        ),
        (
            "undecodable, no trailers",
            false,
            vec![head(&[CONTENT]), data(message_body(0, &[0xff, 0xff], 2))],
        ),
        ("no message", false, vec![head(&[CONTENT, OK]), trailers(&[])]),
        ("no status", false, vec![head(&[CONTENT]), data(plain.clone()), trailers(&[])]),
        (
            "encoded",
            false,
            vec![head(&[CONTENT, ("grpc-encoding", "gzip")]), data(plain.clone()), trailers(&[OK])],
        ),
        (
            "refused, encoded",
            false,
            vec![head(&[("grpc-status", "9"), ("grpc-encoding", "gzip")]), trailers(&[])],
        ),
        (
            "not found",
            false,
            vec![Ok(Frame::Head { id: 0, status: 404, headers: HeaderMap::new() }), trailers(&[])],
        ),
        (
            "reset",
            false,
            vec![head(&[CONTENT]), Err(Status::internal("the node ended the call: gone"))],
        ),
        (
            "reset after the message",
            false,
            vec![
                head(&[CONTENT]),
                data(plain.clone()),
                Err(Status::internal("the node ended the call: gone")),
            ],
        ),
        ("no head", false, vec![data(plain.clone()), trailers(&[OK])]),
        ("trailers first", false, vec![trailers(&[OK])]),
        (
            "details",
            false,
            vec![
                head(&[CONTENT, ("grpc-status", "9"), ("grpc-status-details-bin", "AA")]),
                trailers(&[]),
            ],
        ),
    ]
}

/// What a caller can see of an answer: the message and metadata, or the status with its
/// not-sent mark.
fn seen<T: std::fmt::Debug>(answer: Result<Response<T>, Status>) -> String {
    match answer {
        Ok(response) => {
            let metadata = response.metadata().clone().into_headers();
            format!("{:?} {metadata:?}", response.into_inner())
        }
        Err(status) => format!(
            "{:?} {:?} {:?} {:?} not sent: {}",
            status.code(),
            status.message(),
            status.details(),
            status.metadata().clone().into_headers(),
            was_not_sent(&status),
        ),
    }
}

/// Every form is read as tonic's own client reads it, and only the plain forms directly.
#[tokio::test]
async fn answers_read_directly_are_read_as_tonic_reads_them() {
    let failed = ("failed, not sent", false, vec![Err(not_sent_status("gone"))]);
    for (form, direct, answers) in answer_forms().into_iter().chain([failed]) {
        let path = "/picket.v1.Picket/Acquire";
        let by_tonic = seen(
            read_by_tonic::<v1::AcquireResponse, _>(path, replay(answers.clone()), 4 << 20).await,
        );
        match plain_answer::<v1::AcquireResponse>(answers) {
            Ok(answer) => {
                assert!(direct, "{form} is left to tonic");
                assert_eq!(seen(answer), by_tonic, "{form}");
            }
            Err(_) => assert!(!direct, "{form} is read directly"),
        }
    }
}

/// What the test node read: each request (id, path, metadata, body) and the calls cancelled.
#[derive(Default)]
struct Read {
    requests: Vec<(u64, String, HeaderMap, Bytes)>,
    cancelled: std::collections::HashSet<u64>,
}

impl Read {
    /// The next request's id, path and frame; the link's authorization is passed over.
    async fn next_request(&mut self, node: &mut Node) -> Option<u64> {
        loop {
            match node.next().await? {
                Frame::Request { id, path, headers, body } => {
                    self.requests.push((id, path, headers, body));
                    return Some(id);
                }
                Frame::Cancel { id } => {
                    self.cancelled.insert(id);
                }
                _ => {}
            }
        }
    }
}

/// Answers one request after another with `script`'s answers, the call's id set in each.
async fn answer_in_turn(node: &mut Node, script: Vec<Vec<Answer>>) -> Read {
    let mut read = Read::default();
    for answers in script {
        let id = read.next_request(node).await.expect("a request was due");
        for answer in answers {
            let frame = match answer {
                Ok(Frame::Head { status, headers, .. }) => Frame::Head { id, status, headers },
                Ok(Frame::Data { data, .. }) => Frame::Data { id, data },
                Ok(Frame::Trailers { trailers, .. }) => Frame::Trailers { id, trailers },
                Err(status) => {
                    let message = status.message().strip_prefix("the node ended the call: ");
                    Frame::Reset { id, message: message.unwrap().to_owned() }
                }
                Ok(other) => panic!("not an answer: {other:?}"),
            };
            node.send(frame).await;
        }
    }
    read
}

async fn within<T>(call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, call).await.expect("answered in time")
}

/// Over a wire connection, each hot call sends the frame the generated client sends and
/// returns what it returns, for every form of answer, and as soon as it does; a call the
/// node never read is not sent either way.
#[tokio::test]
async fn a_hot_call_over_the_wire_is_the_generated_clients_call() {
    let forms = answer_forms();
    let empty = vec![head(&[CONTENT]), data(message_body(0, &[], 0)), trailers(&[OK])];
    // Each answer serves two calls: the direct one, then the generated client's.
    let script: Vec<Vec<Answer>> = forms
        .iter()
        .map(|(_, _, answers)| answers.clone())
        .chain(std::iter::repeat_n(empty, 10))
        .flat_map(|answers| [answers.clone(), answers])
        .collect();
    let calls = script.len();
    let (listener, addr) = listener().await;
    let node = tokio::spawn(async move {
        let mut node = Node::accept(&listener).await;
        let mut read = answer_in_turn(&mut node, script).await;
        // One more call, which the node says it never read.
        let id = read.next_request(&mut node).await.expect("the last call came");
        node.send(Frame::GoAway { last_id: id - 1 }).await;
        (node, read)
    });
    let connection = Connection::open_with(&addr, TIMEOUT, 1 << 20, None, Protocol::Wire)
        .await
        .unwrap()
        .with_bearer_token("secret")
        .unwrap();
    let acquire = v1::AcquireRequest {
        name: "orders".into(),
        session_id: 3,
        wait_ms: Some(250),
        request_id: Some(9),
        attempt: 1,
    };
    let path = "/picket.v1.Picket/Acquire";
    for (form, plain, _) in &forms {
        let (direct, read_directly) = within(connection.read_unary::<_, v1::AcquireResponse>(
            path,
            tonic::Request::new(acquire.clone()),
            CLIENT_ANSWER_BYTES,
        ))
        .await;
        assert_eq!(read_directly, *plain, "{form}");
        let generated = seen(within(connection.grpc().acquire(acquire.clone())).await);
        assert_eq!(seen(direct), generated, "{form}");
    }
    let open =
        v1::OpenSessionRequest { ttl_ms: 5_000, lock_delay_ms: 0, clock_id: 2, clock_ms: 1.5 };
    let keepalive = v1::KeepAliveRequest { session_id: 3, clock_id: 2, clock_ms: 2.5 };
    let many = v1::KeepAliveManyRequest { session_ids: vec![3, 4], clock_id: 2, clock_ms: 3.5 };
    let session = v1::SessionRequest { session_id: 3 };
    let release = v1::ReleaseRequest { name: "orders".into(), session_id: 3, token: 7 };
    let pairs = [
        (
            seen(within(connection.open_session(open)).await),
            seen(within(connection.grpc().open_session(open)).await),
        ),
        (
            seen(within(connection.keep_alive(keepalive)).await),
            seen(within(connection.grpc().keep_alive(keepalive)).await),
        ),
        (
            seen(within(connection.keep_alive_many(many.clone())).await),
            seen(within(connection.grpc().keep_alive_many(many)).await),
        ),
        (
            seen(within(connection.close_session(session)).await),
            seen(within(connection.grpc().close_session(session)).await),
        ),
        (
            seen(within(connection.release(release.clone())).await),
            seen(within(connection.grpc().release(release)).await),
        ),
        (
            seen(within(connection.acquire(acquire.clone())).await),
            seen(within(connection.grpc().acquire(acquire.clone())).await),
        ),
    ];
    // The Raft messages carry their metadata (the node they are for, a deadline) as the
    // generated client sends it, without the headers it keeps for itself, and read answers
    // as it does with a Raft message's bound (a node's Raft client).
    let raft = v1::raft_client::RaftClient::with_origin(connection.clone(), connection.origin())
        .max_decoding_message_size(crate::MAX_RAFT_MESSAGE_BYTES);
    let message = || {
        let mut request =
            tonic::Request::new(v1::RaftPayload { data: b"{}".to_vec(), error: String::new() });
        let metadata = request.metadata_mut();
        metadata.insert("picket-target-node", "2".parse().unwrap());
        for reserved in ["te", "content-type", "grpc-status", "grpc-message", "grpc-message-type"] {
            metadata.insert(reserved, "kept by tonic".parse().unwrap());
        }
        request.set_timeout(TIMEOUT);
        request
    };
    let raft_pairs = [
        (
            seen(within(connection.append_entries(message())).await),
            seen(within(raft.clone().append_entries(message())).await),
        ),
        (
            seen(within(connection.vote(message())).await),
            seen(within(raft.clone().vote(message())).await),
        ),
        (
            seen(within(connection.pre_vote(message())).await),
            seen(within(raft.clone().pre_vote(message())).await),
        ),
        (
            seen(within(connection.install_snapshot(message())).await),
            seen(within(raft.clone().install_snapshot(message())).await),
        ),
    ];
    let pairs = pairs.into_iter().chain(raft_pairs);
    for (direct, generated) in pairs {
        assert_eq!(direct, generated);
    }
    let unread = within(connection.acquire(acquire.clone())).await.unwrap_err();
    assert!(was_not_sent(&unread), "{unread:?}");
    let (_node, read) = tokio::time::timeout(TIMEOUT, node).await.unwrap().unwrap();
    assert_eq!(read.requests.len(), calls + 1);
    for pair in read.requests[..calls].chunks(2) {
        let (direct, generated) = (&pair[0], &pair[1]);
        let frame = |request: &(u64, String, HeaderMap, Bytes)| {
            (request.1.clone(), request.2.clone(), request.3.clone())
        };
        assert_eq!(frame(direct), frame(generated), "the same request frame");
    }
    // The calls the two cancel are the same, but that the direct call sends no cancel for
    // an answer that ended with a refusal in its head.
    for ((form, plain, _), pair) in forms.iter().zip(read.requests.chunks(2)) {
        let (direct, generated) = (pair[0].0, pair[1].0);
        let cancelled = (read.cancelled.contains(&direct), read.cancelled.contains(&generated));
        if *plain {
            assert!(!cancelled.0, "{form}: an answer read whole is not cancelled");
        } else {
            assert_eq!(cancelled.0, cancelled.1, "{form}: cancelled (direct, generated)");
        }
    }
    let paths: Vec<&str> = read.requests[..calls]
        .iter()
        .rev()
        .step_by(2)
        .take(10)
        .map(|request| request.1.as_str())
        .collect();
    let raft_paths = ["InstallSnapshot", "PreVote", "Vote", "AppendEntries"]
        .map(|method| format!("/picket.v1.Raft/{method}"));
    let client_paths =
        ["Acquire", "Release", "CloseSession", "KeepAliveMany", "KeepAlive", "OpenSession"]
            .map(|method| format!("/picket.v1.Picket/{method}"));
    assert_eq!(paths, [raft_paths.as_slice(), client_paths.as_slice()].concat());
}
