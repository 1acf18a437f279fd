//! Serving [`picket_proto::wire`]: the gRPC API's calls in Picket's own framing, on the client
//! port beside HTTP/1 and HTTP/2, and on the peer port beside HTTP/2.
//!
//! Each call is handed to the same router as a gRPC call over HTTP/2 (the same handlers,
//! authentication, limits and errors), built from its frame instead of from HTTP/2 streams;
//! the client API's hot unary calls and peers' Raft messages in their plain form skip the
//! request and the router and go to the same handlers straight from the frame (`direct.rs`).
//! A connection is served by one task: it reads frames, runs its calls' futures itself (at
//! most `max_streams_per_connection` at once, a number the client is told and waits for a
//! place under; cancels are read at any time), and writes their answers, several per write
//! when they come together. A call the client cancels, or every call of a connection that
//! breaks, is dropped, as an HTTP/2 stream reset drops it.

use super::direct::{DirectCalls, DirectRequest};
use super::{Phase, Serving};
use crate::tls::{Caller, ServerTls};
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::future::{AbortHandle, Abortable, Either};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt as _, StreamExt as _};
use http::{HeaderMap, HeaderValue};
use http_body_util::BodyExt as _;
use picket_proto::wire::{Frame, MAGIC, WRITE_BATCH_BYTES};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tower::ServiceExt as _;

/// Answer frames queued for the writer before a call waits for it to catch up.
const QUEUED_ANSWERS: usize = 256;
/// A frame's bytes beside its request body: its kind, id, path and metadata.
const FRAME_OVERHEAD_BYTES: usize = 16 * 1024;
/// Longest a write may take before the connection is closed: its client stopped reading (or
/// its host is gone). The same as HTTP/2's unanswered keepalive ping, interval and timeout.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What a connection's first bytes ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Opening {
    /// HTTP/1 or HTTP/2, for hyper.
    Http,
    /// The wire protocol: the connection opened with [`MAGIC`].
    Wire,
}

impl Opening {
    /// What `first` (a connection's first bytes, as many as have arrived) asks for, or `None`
    /// while too few have arrived to tell.
    pub(super) fn of(first: &[u8]) -> Option<Self> {
        if *first.first()? != MAGIC[0] {
            return Some(Self::Http);
        }
        let known = first.len().min(MAGIC.len());
        if first[..known] != MAGIC[..known] {
            // A zero byte that is not the opening: not HTTP either, which hyper then refuses.
            return Some(Self::Http);
        }
        (known == MAGIC.len()).then_some(Self::Wire)
    }
}

/// Reads a TLS connection's opening (the first read carries the opening's deadline, see
/// `OpensInTime`): `Wire` with the opening consumed, or `Http` with the bytes read so far, which
/// hyper must still see.
pub(super) async fn sniff<Io: AsyncRead + Unpin>(
    io: &mut Io,
) -> std::io::Result<(Opening, Vec<u8>)> {
    let mut first = Vec::with_capacity(MAGIC.len());
    let mut byte = [0_u8; 1];
    loop {
        // A byte at a time, so that nothing past the opening is taken from the stream.
        if io.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        first.push(byte[0]);
        match Opening::of(&first) {
            None => {}
            Some(Opening::Wire) => return Ok((Opening::Wire, Vec::new())),
            Some(Opening::Http) => return Ok((Opening::Http, first)),
        }
    }
}

/// What one wire connection knows of its caller.
struct Callers {
    caller: Caller,
    tls: Option<Arc<ServerTls>>,
    /// Set by the client's [`Frame::Authorization`]; sent with each later call.
    authorization: Option<HeaderValue>,
}

impl Callers {
    /// Judges the caller again by the TLS files in force now, if they were reloaded since.
    fn judge_again(&mut self) {
        if let Some(tls) = &self.tls {
            tls.judge_again(&mut self.caller);
        }
    }

    /// The longest request this connection may send. A frame is read whole before its path is
    /// known, so a connection that may send Raft messages (a member's, judged again after a TLS
    /// reload, or any without TLS, where the `Raft` service admits everyone) may send frames as
    /// long as the longest of them; any other, only a client's request.
    fn max_message_bytes(&self, serving: &Serving) -> usize {
        let may_send_raft = self.tls.is_none() || self.caller.member;
        if may_send_raft {
            serving.max_message_bytes.max(serving.max_raft_message_bytes)
        } else {
            serving.max_message_bytes
        }
    }

    /// Gives a call's `headers` the authorization it is made with. A call's own authorization
    /// is its handle's, which may differ from the one the connection was given (handles of one
    /// client connection with different tokens); an empty one says the handle has none.
    fn authorize(&self, headers: &mut HeaderMap) {
        match headers.get(http::header::AUTHORIZATION) {
            Some(own) if own.is_empty() => {
                headers.remove(http::header::AUTHORIZATION);
            }
            Some(_) => {}
            None => {
                if let Some(authorization) = &self.authorization {
                    headers.insert(http::header::AUTHORIZATION, authorization.clone());
                }
            }
        }
    }
}

/// Call `path` with `metadata` and `body` by `caller` as the router takes it, `None` when the
/// path is not one.
fn routed_request(
    path: &str,
    metadata: HeaderMap,
    body: Bytes,
    caller: Caller,
) -> Option<http::Request<Body>> {
    let uri = http::Uri::try_from(path).ok().filter(|uri| uri.path() == path)?;
    let mut request = http::Request::new(Body::from(body));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri;
    *request.version_mut() = http::Version::HTTP_2;
    *request.headers_mut() = metadata;
    let headers = request.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    request.extensions_mut().insert(caller);
    request.extensions_mut().insert(crate::http::WholeBody);
    Some(request)
}

/// A call read from the client, to be started when it has a place.
enum Call {
    /// Through the router, as an HTTP request.
    Routed(Box<http::Request<Body>>),
    /// Straight to its handler, if its message decodes.
    Direct(DirectRequest),
}

impl Call {
    /// The call to `path` by `caller`, served directly if `direct` takes it; `None` when the
    /// path is not a call path.
    fn new(
        path: &str,
        metadata: HeaderMap,
        body: Bytes,
        caller: &Caller,
        direct: Option<&DirectCalls>,
    ) -> Option<Self> {
        let (metadata, body) = match direct {
            Some(direct) => match direct.take(path, metadata, body, caller) {
                Ok(request) => return Some(Self::Direct(request)),
                Err(given_back) => given_back,
            },
            None => (metadata, body),
        };
        let request = routed_request(path, metadata, body, caller.clone())?;
        Some(Self::Routed(Box::new(request)))
    }
}

/// The server's side of the opening: [`MAGIC`], then how many calls the client may have open at
/// once and the longest request it may send.
fn opening(max_calls: usize, max_request_bytes: usize) -> Vec<u8> {
    let mut opening = MAGIC.to_vec();
    opening.extend_from_slice(&u32::try_from(max_calls).unwrap_or(u32::MAX).to_le_bytes());
    opening.extend_from_slice(&u32::try_from(max_request_bytes).unwrap_or(u32::MAX).to_le_bytes());
    opening
}

/// What a connection knows of its calls (their futures are the serving task's).
#[derive(Default)]
struct CallBook {
    /// The calls running, by id; a cancelled one leaves at once (its future is dropped when
    /// next polled).
    running: HashMap<u64, AbortHandle>,
    /// Calls read while every place was taken: the client's places free as soon as it has an
    /// answer, which may be before this task has seen the call end.
    waiting: VecDeque<(u64, Call)>,
    /// The last call read, and the last started (every later one read is waiting).
    last_id: u64,
    last_started: u64,
}

/// What became of a frame the client sent.
enum Taken {
    /// A call now waits for a place, a cancel was done, or the authorization was set.
    Kept,
    /// A call to no call path: this `Reset` frame answers it.
    Refused(Bytes),
    /// The frame broke the protocol: the connection is closed.
    Close,
}

impl CallBook {
    /// Takes one frame from the client: a call (to wait for a place), a cancel, or the
    /// authorization for later calls. Calls `direct` serves go to it.
    fn take(&mut self, frame: Frame, callers: &mut Callers, direct: Option<&DirectCalls>) -> Taken {
        match frame {
            Frame::Request { id, path, mut headers, body } if id > self.last_id => {
                self.last_id = id;
                callers.authorize(&mut headers);
                // Judged again by `serve_wire` before this frame was read.
                let Some(call) = Call::new(&path, headers, body, &callers.caller, direct) else {
                    let message = format!("{path:?} is not a call path");
                    return Taken::Refused(Frame::Reset { id, message }.to_bytes());
                };
                self.waiting.push_back((id, call));
            }
            Frame::Cancel { id } => {
                if let Some(abort) = self.running.remove(&id) {
                    abort.abort();
                }
                self.waiting.retain(|(waiting_id, _)| *waiting_id != id);
            }
            Frame::Authorization { value } => {
                let Ok(mut value) = HeaderValue::from_bytes(&value) else {
                    tracing::debug!(
                        "closing a wire connection whose authorization is not a header value"
                    );
                    return Taken::Close;
                };
                value.set_sensitive(true);
                callers.authorization = Some(value);
            }
            _ => {
                tracing::debug!(
                    "closing a wire connection that sent a node's frame or reused a call id"
                );
                return Taken::Close;
            }
        }
        Taken::Kept
    }
}

/// Serves one wire connection, its opening already read, until the client closes it, it is idle
/// for the idle timeout, or the node drains.
pub(super) async fn serve_wire<Io>(
    io: Io,
    serving: Serving,
    caller: Caller,
    tls: Option<Arc<ServerTls>>,
) where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let idle_timeout = serving.idle_timeout;
    // Made once and kept across the loop's turns, not made anew in each: a wait made and
    // dropped on every turn registered with the listener's phase channel, shared by every
    // connection, and left it again (1.6 % of a loaded node's CPU samples).
    let mut phase_change = std::pin::pin!(phase_reached(serving.phase.clone(), Phase::Draining));
    let max_calls = serving.max_calls.max(1);
    let (mut reader, mut writer) = tokio::io::split(io);
    let mut callers = Callers { caller, tls, authorization: None };
    if !write(&mut writer, &opening(max_calls, callers.max_message_bytes(&serving))).await {
        return;
    }
    let (answers, mut queue) = mpsc::channel::<Bytes>(QUEUED_ANSWERS);
    let mut calls = FuturesUnordered::new();
    let mut book = CallBook::default();
    let mut buffer = BytesMut::with_capacity(8 * 1024);
    let mut out = BytesMut::new();
    let mut reading = true;
    let idle = tokio::time::sleep(idle_timeout);
    let mut idle = std::pin::pin!(idle);
    loop {
        tokio::select! {
            biased;
            Some(answer) = queue.recv() => {
                out.extend_from_slice(&answer);
                while out.len() < WRITE_BATCH_BYTES && let Ok(answer) = queue.try_recv() {
                    out.extend_from_slice(&answer);
                }
                if !write(&mut writer, &out).await {
                    return;
                }
                out.clear();
            }
            Some(ended) = calls.next(), if !calls.is_empty() => {
                let ended: Result<(u64, Option<Bytes>), _> = ended;
                if let Ok((id, answer)) = ended {
                    book.running.remove(&id);
                    if let Some(answer) = answer {
                        out.extend_from_slice(&answer);
                        // Other direct answers ready now go out in the same write.
                        while out.len() < WRITE_BATCH_BYTES
                            && let Some(Some(ended)) = calls.next().now_or_never()
                        {
                            if let Ok((id, answer)) = ended {
                                book.running.remove(&id);
                                out.extend_from_slice(&answer.unwrap_or_default());
                            }
                        }
                        if !write(&mut writer, &out).await {
                            return;
                        }
                        out.clear();
                    }
                }
                if calls.is_empty() && book.waiting.is_empty() {
                    idle.as_mut().reset(tokio::time::Instant::now() + idle_timeout);
                }
            }
            // Cancels are read even while every place is taken; only a client that sends
            // more calls than it was told it may have open is not read further.
            read = reader.read_buf(&mut buffer), if reading && book.waiting.len() < max_calls => {
                // The client closed the connection, or it broke: nobody is left to answer, so
                // its calls are dropped, as HTTP/2 drops a closed connection's streams.
                if !matches!(read, Ok(read) if read > 0) {
                    return;
                }
            }
            () = &mut idle, if reading && calls.is_empty() && book.waiting.is_empty() => {
                tracing::debug!(?idle_timeout, "closing a wire connection idle for the idle timeout");
                reading = false;
                phase_change.set(phase_reached(serving.phase.clone(), Phase::Closed));
                if !write(&mut writer, &Frame::GoAway { last_id: book.last_id }.to_bytes()).await {
                    return;
                }
            }
            gone = &mut phase_change => {
                if !reading || gone {
                    return;
                }
                // Calls read but not started are dropped: the client may send them again.
                reading = false;
                phase_change.set(phase_reached(serving.phase.clone(), Phase::Closed));
                book.waiting.clear();
                let last_id = book.last_started;
                if !write(&mut writer, &Frame::GoAway { last_id }.to_bytes()).await {
                    return;
                }
            }
        }
        // Judged again before the bound too: a member dropped by a reload of the peer CA may
        // no longer send frames of a Raft message's length on a connection it already has,
        // from its first frame after the reload, not its second.
        callers.judge_again();
        let max_frame_bytes = callers.max_message_bytes(&serving) + FRAME_OVERHEAD_BYTES;
        while reading && book.waiting.len() < max_calls {
            let frame = match Frame::decode(&mut buffer, max_frame_bytes) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(%error, "closing a wire connection that broke the protocol");
                    return;
                }
            };
            match book.take(frame, &mut callers, serving.direct.as_ref()) {
                Taken::Kept => {}
                Taken::Refused(reset) => {
                    if !write(&mut writer, &reset).await {
                        return;
                    }
                }
                Taken::Close => return,
            }
        }
        while book.running.len() < max_calls
            && let Some((id, call)) = book.waiting.pop_front()
        {
            let (abort, registration) = AbortHandle::new_pair();
            let started = match call {
                Call::Routed(request) => Err(*request),
                Call::Direct(request) => {
                    let direct = serving.direct.as_ref().expect("only a direct node reads one");
                    direct.start(id, request).map_err(|request| {
                        let (path, metadata, body, caller) = request.into_routed();
                        routed_request(path, metadata, body, caller).expect("a hot call's path")
                    })
                }
            };
            let call = match started {
                Ok(call) => Either::Right(call.map(move |answer| (id, Some(answer)))),
                Err(request) => Either::Left(
                    serve_call(serving.app.clone(), request, id, answers.clone())
                        .map(|id| (id, None::<Bytes>)),
                ),
            };
            calls.push(Abortable::new(call, registration));
            book.running.insert(id, abort);
            book.last_started = id;
        }
        if !reading && calls.is_empty() && queue.is_empty() {
            let _ = writer.shutdown().await;
            return;
        }
    }
}

/// Writes `bytes` whole, within [`WRITE_TIMEOUT`]: `false` when the connection is to be closed
/// (it failed, or its client stopped reading).
async fn write<W: AsyncWrite + Unpin>(writer: &mut W, bytes: &[u8]) -> bool {
    let written = async {
        writer.write_all(bytes).await?;
        writer.flush().await
    };
    match tokio::time::timeout(WRITE_TIMEOUT, written).await {
        Ok(Ok(())) => true,
        Ok(Err(error)) => {
            tracing::debug!(%error, "a wire connection failed");
            false
        }
        Err(_) => {
            tracing::debug!("closing a wire connection whose client stopped reading");
            false
        }
    }
}

/// Resolves once the listener's phase reaches `phase`: `true` if the listener is gone.
async fn phase_reached(mut watching: tokio::sync::watch::Receiver<Phase>, phase: Phase) -> bool {
    watching.wait_for(|now| *now >= phase).await.is_err()
}

/// Runs one call and queues its answer's frames: headers, data, trailers (a `Reset` when its
/// body fails). Frames ready together are queued as one.
async fn serve_call(
    app: axum::Router,
    request: http::Request<Body>,
    id: u64,
    answers: mpsc::Sender<Bytes>,
) -> u64 {
    let response = match app.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let (parts, mut body) = response.into_parts();
    let mut out = BytesMut::new();
    Frame::Head { id, status: parts.status.as_u16(), headers: parts.headers }.encode(&mut out);
    loop {
        // A long answer ready at once (a backup) goes out in pieces, not gathered whole.
        if out.len() >= WRITE_BATCH_BYTES && answers.send(out.split().freeze()).await.is_err() {
            return id;
        }
        let next = match body.frame().now_or_never() {
            Some(next) => next,
            None => {
                // Nothing more yet (a watch stream between events): send what is ready.
                if !out.is_empty() && answers.send(out.split().freeze()).await.is_err() {
                    return id;
                }
                body.frame().await
            }
        };
        match next {
            None => {
                Frame::Trailers { id, trailers: HeaderMap::new() }.encode(&mut out);
                break;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => Frame::Data { id, data }.encode(&mut out),
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        Frame::Trailers { id, trailers }.encode(&mut out);
                        break;
                    }
                }
            },
            Some(Err(error)) => {
                Frame::Reset { id, message: error.to_string() }.encode(&mut out);
                break;
            }
        }
    }
    let _ = answers.send(out.freeze()).await;
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opening_is_told_from_http_as_soon_as_a_byte_differs() {
        assert_eq!(Opening::of(b""), None);
        assert_eq!(Opening::of(b"P"), Some(Opening::Http), "the HTTP/2 preface");
        assert_eq!(Opening::of(b"GET / HTTP/1.1\r\n"), Some(Opening::Http));
        assert_eq!(Opening::of(&MAGIC[..5]), None, "wait for the rest");
        assert_eq!(Opening::of(MAGIC), Some(Opening::Wire));
        let mut longer = MAGIC.to_vec();
        longer.extend_from_slice(b"frames follow");
        assert_eq!(Opening::of(&longer), Some(Opening::Wire));
        assert_eq!(Opening::of(b"\0pick\xff"), Some(Opening::Http), "hyper refuses it");
    }
}
