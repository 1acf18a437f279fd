//! The client end of [`crate::wire`]: one connection to one node, its calls multiplexed by id.
//!
//! A writer task sends the calls' frames in the order their ids were given; a reader task hands
//! each answer's frames to the call waiting for them, never waiting for a call to read them (a
//! hot unary call's plain answer is gathered and handed over whole, its message checked by the
//! reader: see [`crate::unary`]). A
//! call that may be sent again after a failure is told so the same way as on HTTP/2
//! ([`crate::connection::NotSent`]): when the connection broke before any of its frame was
//! handed to the socket, or the node said it never read it ([`Frame::GoAway`]). At most as many
//! calls are open at once as the node said it serves per connection; a further one waits for a
//! place before it is sent, as an HTTP/2 stream waits for the node's stream bound.

use crate::connection::not_sent_status;
use crate::unary::{MessageCheck, Plain, one_message, still_plain};
use crate::wire::{Frame, MAGIC, MAX_HEADERS, WRITE_BATCH_BYTES};
use bytes::{Bytes, BytesMut};
use http_body::Frame as BodyFrame;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tonic::Status;

/// Frames of one answer the reader may hold before the call reads them (a unary answer gathered
/// whole holds at most three). A call further behind (a watch stream nobody reads) is ended and
/// cancelled at the node, rather than slowing the connection's other calls.
const ANSWER_FRAMES: usize = 1024;
/// Bytes of one answer's data the reader may hold before the call reads them: a call further
/// behind is ended as one too many frames behind is. Frames alone let a backup read slower than
/// it arrived hold up to 1,024 chunks of 1 MiB.
const ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// Longest frame accepted from a node: a watch event or a backup chunk is far smaller.
const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
/// Most bytes queued for a node that is not reading them; past it the connection is closed.
const MAX_QUEUED_BYTES: usize = 64 * 1024 * 1024;
/// Most calls at once on one connection, whatever the node says.
const MOST_CALLS: u32 = 10_000;

/// One frame of a call's answer, or how the call ended without the rest.
pub(crate) type Answer = Result<Frame, Status>;

/// Who waits for a call's answer.
#[derive(Debug)]
enum Waiter {
    /// A call whose answer is read as it comes (a stream, any call made through
    /// [`WireConnection::call`], or a unary call whose answer showed it is not plain): its
    /// frames are handed over one by one.
    Frames(FrameSender),
    /// A unary call ([`WireConnection::unary`]) whose answer may still be plain: its frames are
    /// gathered here, at most a head, one message that `decodes` and the trailers, and handed
    /// over together at the answer's end, with no queue per call.
    Whole { answers: Vec<Answer>, done: oneshot::Sender<Gathered>, decodes: MessageCheck },
}

/// What a unary call's waiter hands over.
#[derive(Debug)]
enum Gathered {
    /// The whole answer, up to its end.
    Whole(Vec<Answer>),
    /// The answer is not plain: its frames so far, and every later one, come through this queue.
    Live(FrameReceiver),
}

/// A unary call's answer (see [`WireConnection::unary`]).
#[derive(Debug)]
pub(crate) enum Unary {
    /// The whole answer, gathered while it could be plain, up to its end or to the failure that
    /// cut it off.
    Whole(Vec<Answer>),
    /// An answer shown not to be plain before its end, read from then on as it comes, as
    /// [`WireConnection::call`] returns it.
    Live(Result<http::Response<WireBody>, Status>),
}

impl Waiter {
    /// Ends the call with `failure`, after whatever it has received.
    fn end(self, failure: Status) {
        match self {
            // A full queue drops the failure: the caller then reads the end of its answers,
            // which says the call ended early.
            Self::Frames(sender) => {
                let _ = sender.sender.try_send(Err(failure));
            }
            Self::Whole { mut answers, done, .. } => {
                answers.push(Err(failure));
                let _ = done.send(Gathered::Whole(answers));
            }
        }
    }
}

/// An open wire connection. Cheap to clone; clones share it, and it closes when the last
/// clone (or the last call's body) is dropped.
#[derive(Clone, Debug)]
pub(crate) struct WireConnection {
    owner: Arc<Owner>,
}

/// Held by every handle and none of the tasks: dropped, it closes the connection.
#[derive(Debug)]
struct Owner {
    shared: Arc<Shared>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        // The writer's queue ends, so it shuts the socket's sending side; the node then closes.
        let mut calls = self.shared.lock();
        calls.outgoing = None;
        calls.closed.get_or_insert_with(|| "the connection was dropped".to_owned());
    }
}

#[derive(Debug)]
struct Shared {
    calls: Mutex<Calls>,
    /// Places for calls at once: as many as the node serves per connection.
    places: Arc<Semaphore>,
    /// Longest request body the node takes on this connection.
    max_request_bytes: usize,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct Calls {
    next_id: u64,
    waiting: HashMap<u64, Waiter>,
    /// The writer's queue; `None` once the connection can take no more calls.
    outgoing: Option<mpsc::UnboundedSender<(u64, Bytes)>>,
    /// Bytes in the writer's queue.
    queued_bytes: usize,
    /// Every call with an id at or below this was handed to the socket, in part or whole: it
    /// may have reached the node. Moved only under this lock, before the write.
    handed_through: u64,
    /// Why the connection takes no more calls.
    closed: Option<String>,
    /// The connection failed and its calls with it: the writer writes nothing more.
    broken: bool,
    /// The authorization the node applies to every call of this connection that carries none
    /// of its own: the first one a handle set.
    authorization: Option<http::HeaderValue>,
}

impl Calls {
    /// Queues `frame` (of call `id`, or 0 for a frame of no call) for the writer; closes the
    /// connection when the node has stopped reading what is queued already.
    fn queue(&mut self, shared: &Shared, id: u64, frame: Bytes) -> bool {
        if self.queued_bytes + frame.len() > MAX_QUEUED_BYTES {
            self.close(shared, "the node stopped reading the connection");
            return false;
        }
        let length = frame.len();
        let queued = self.outgoing.as_ref().is_some_and(|out| out.send((id, frame)).is_ok());
        if queued {
            self.queued_bytes += length;
        }
        queued
    }

    /// Ends the connection: every call still waiting fails, as not sent when none of its frame
    /// was handed to the socket.
    fn close(&mut self, shared: &Shared, reason: &str) {
        self.closed.get_or_insert_with(|| reason.to_owned());
        self.outgoing = None;
        self.broken = true;
        shared.places.close();
        for (id, waiter) in self.waiting.drain() {
            let failure = if id > self.handed_through {
                not_sent_status(&format!("{reason}; connect again"))
            } else {
                Status::unavailable(format!("{reason} during the call"))
            };
            waiter.end(failure);
        }
    }

    /// How call `id` checks a message it may gather: a unary call's while it gathers.
    fn message_check(&self, id: u64) -> Option<MessageCheck> {
        match self.waiting.get(&id)? {
            Waiter::Whole { decodes, .. } => Some(*decodes),
            Waiter::Frames(_) => None,
        }
    }

    /// Hands `answer` to call `id`'s waiter; `decodes` says whether `answer` is a data frame
    /// holding one message that the waiter's check accepts. A call given up on has no waiter:
    /// its late frames are dropped.
    fn deliver(&mut self, shared: &Shared, id: u64, answer: Answer, decodes: bool) {
        let Some(waiter) = self.waiting.get_mut(&id) else {
            return;
        };
        let overflow = match waiter {
            Waiter::Frames(sender) => !sender.send(answer),
            Waiter::Whole { answers, .. } => match still_plain(answers, &answer, decodes) {
                Plain::Gather => {
                    answers.push(answer);
                    false
                }
                Plain::Ended => {
                    answers.push(answer);
                    if let Some(Waiter::Whole { answers, done, .. }) = self.waiting.remove(&id) {
                        let _ = done.send(Gathered::Whole(answers));
                    }
                    false
                }
                Plain::Not => {
                    // From here the call is read as it comes, as any other call is.
                    let (sender, receiver) = frame_queue();
                    let gathered = std::mem::replace(waiter, Waiter::Frames(sender));
                    let mut refused = false;
                    if let (Waiter::Whole { answers, done, .. }, Waiter::Frames(sender)) =
                        (gathered, &*waiter)
                    {
                        // At most two were gathered: the queue holds them and this one, unless
                        // their data is over the bound, and then the call is ended as behind.
                        for answer in answers.into_iter().chain([answer]) {
                            refused |= !sender.send(answer);
                        }
                        let _ = done.send(Gathered::Live(receiver));
                    }
                    refused
                }
            },
        };
        if overflow {
            // The caller fell behind its stream: end that call alone, not the connection. Its
            // queue closes, so it reads that it fell behind.
            self.waiting.remove(&id);
            self.queue(shared, 0, Frame::Cancel { id }.to_bytes());
        }
    }
}

impl WireConnection {
    /// Opens the protocol on `io` (connected, TLS done): sends the opening and waits for the
    /// node's, within `timeout`. `Ok(None)` when the node answers something else or closes the
    /// connection: it does not speak the protocol (a node of an older build).
    pub(crate) async fn start<Io>(mut io: Io, timeout: Duration) -> std::io::Result<Option<Self>>
    where
        Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let opening = async {
            io.write_all(MAGIC).await?;
            io.flush().await?;
            let mut answer = [0_u8; MAGIC.len() + 8];
            match io.read_exact(&mut answer).await {
                Ok(_) => Ok(answer.starts_with(MAGIC).then(|| {
                    let number = |at: usize| {
                        u32::from_le_bytes(answer[at..at + 4].try_into().expect("four bytes"))
                    };
                    (number(MAGIC.len()), number(MAGIC.len() + 4))
                })),
                Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
                Err(error) => Err(error),
            }
        };
        let spoken = tokio::time::timeout(timeout, opening).await.map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "the node did not answer in time")
        })??;
        let Some((max_calls, max_request_bytes)) = spoken else {
            return Ok(None);
        };
        let (outgoing, queue) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            calls: Mutex::new(Calls {
                next_id: 1,
                waiting: HashMap::new(),
                outgoing: Some(outgoing),
                queued_bytes: 0,
                handed_through: 0,
                closed: None,
                broken: false,
                authorization: None,
            }),
            places: Arc::new(Semaphore::new(max_calls.clamp(1, MOST_CALLS) as usize)),
            max_request_bytes: max_request_bytes as usize,
        });
        let (reader, writer) = tokio::io::split(io);
        tokio::spawn(write(writer, queue, shared.clone()));
        tokio::spawn(read(reader, shared.clone()));
        Ok(Some(Self { owner: Arc::new(Owner { shared }) }))
    }

    fn shared(&self) -> &Shared {
        &self.owner.shared
    }

    /// Has the node apply `value` to every later call that carries no authorization of its own,
    /// unless a handle sharing the link set one first. Either way a call carries its handle's
    /// authorization in full only when it differs from the link's (see [`WireConnection::call`]).
    pub(crate) fn authorize(&self, value: &http::HeaderValue) {
        let mut calls = self.shared().lock();
        if calls.authorization.is_some() {
            return;
        }
        calls.authorization = Some(value.clone());
        let frame = Frame::Authorization { value: Bytes::copy_from_slice(value.as_bytes()) };
        calls.queue(self.shared(), 0, frame.to_bytes());
    }

    /// Whether the connection takes no more calls; such a connection is replaced.
    pub(crate) fn is_closed(&self) -> bool {
        self.shared().lock().closed.is_some()
    }

    /// Calls `path` with `headers` (those every call carries the same are left out) and `body`,
    /// and waits for the answer's headers; its body follows. The `authorization` among
    /// `headers` (the calling handle's, or none) is sent only when it differs from the link's,
    /// an empty one standing for none: handles sharing a link may carry different tokens.
    pub(crate) async fn call(
        &self,
        path: &str,
        headers: http::HeaderMap,
        body: Bytes,
    ) -> Result<http::Response<WireBody>, Status> {
        let queue = || {
            let (answers, answer) = frame_queue();
            (Waiter::Frames(answers), answer)
        };
        let (pending, answer) = self.send(path, headers, body, queue).await?;
        answered(pending, answer).await
    }

    /// [`WireConnection::call`] for a unary call, cheaper for the answers a node nearly always
    /// sends. While the answer may still be plain (see [`still_plain`]; `decodes` says whether
    /// a message decodes as the call's answer) the reader gathers it, without a queue per call,
    /// and hands it over whole at its end; an answer shown not to be plain is handed over as
    /// [`WireConnection::call`] would have returned it, and read as it comes from then on.
    pub(crate) async fn unary(
        &self,
        path: &str,
        headers: http::HeaderMap,
        body: Bytes,
        decodes: MessageCheck,
    ) -> Result<Unary, Status> {
        let gatherer = || {
            let (done, gathered) = oneshot::channel();
            (Waiter::Whole { answers: Vec::new(), done, decodes }, gathered)
        };
        let (mut pending, gathered) = self.send(path, headers, body, gatherer).await?;
        match gathered.await {
            Ok(Gathered::Whole(answers)) => {
                // The reader took the call off the waiting list as it handed the answer over.
                pending.place = None;
                Ok(Unary::Whole(answers))
            }
            Ok(Gathered::Live(answer)) => Ok(Unary::Live(answered(pending, answer).await)),
            // A waiter is always ended with a word; should one not be, the call ends early.
            Err(_) => Ok(Unary::Whole(vec![Err(ended_early())])),
        }
    }

    /// Sends a call once it has a place, with the waiter `waiter` makes waiting for its answer
    /// (and gives back what `waiter` returns beside it, the caller's end). Refused, as not sent,
    /// when the connection has closed.
    async fn send<R>(
        &self,
        path: &str,
        mut headers: http::HeaderMap,
        body: Bytes,
        waiter: impl FnOnce() -> (Waiter, R),
    ) -> Result<(Pending, R), Status> {
        // gRPC's 5-byte message prefix is not the node's to count.
        if body.len() > self.shared().max_request_bytes.saturating_add(5) {
            return Err(Status::invalid_argument(format!(
                "the request is larger than the {} bytes the node takes; send less at once",
                self.shared().max_request_bytes
            )));
        }
        for same_on_every_call in
            [http::header::CONTENT_TYPE, http::header::TE, http::header::USER_AGENT]
        {
            headers.remove(same_on_every_call);
        }
        let authorization = headers.remove(http::header::AUTHORIZATION);
        // The frame carries at most MAX_HEADERS, one of them kept for the authorization; a call
        // is refused rather than sent without some of its metadata.
        if headers.len() >= MAX_HEADERS {
            return Err(Status::invalid_argument(format!(
                "the request carries {} metadata entries, more than the {} the wire protocol \
                 takes; send fewer, or use the gRPC protocol (--protocol grpc)",
                headers.len(),
                MAX_HEADERS - 1
            )));
        }
        // Waiting for a place sends nothing: a connection that closes meanwhile refuses the
        // call as not sent.
        let place = self.shared().places.clone().acquire_owned().await.map_err(|_| {
            not_sent_status(&self.shared().lock().closed.clone().unwrap_or_default())
        })?;
        // Made only now, and outside the lock: a call waiting for its place holds no queue.
        let (waiter, answer) = waiter();
        let mut calls = self.shared().lock();
        if let Some(reason) = &calls.closed {
            return Err(not_sent_status(reason));
        }
        let id = calls.next_id;
        calls.next_id += 1;
        // Decided under the lock that orders frames: a link authorized meanwhile by another
        // handle is authorized before this call on the node too.
        if authorization != calls.authorization {
            let own = authorization.unwrap_or_else(|| http::HeaderValue::from_static(""));
            headers.insert(http::header::AUTHORIZATION, own);
        }
        let request = Frame::Request { id, path: path.to_owned(), headers, body }.to_bytes();
        // Queued under the lock, so the writer sends calls in the order of their ids.
        if !calls.queue(self.shared(), id, request) {
            return Err(not_sent_status("the connection closed; connect again"));
        }
        calls.waiting.insert(id, waiter);
        drop(calls);
        Ok((Pending { connection: self.clone(), id, place: Some(place) }, answer))
    }
}

/// Waits for the head of call `pending`'s answer, whose frames come through `answer`; its body
/// follows.
async fn answered(
    mut pending: Pending,
    mut answer: FrameReceiver,
) -> Result<http::Response<WireBody>, Status> {
    let first = std::future::poll_fn(|cx| answer.poll_recv(cx)).await;
    if matches!(first, Some(Err(_))) {
        pending.finish();
    }
    let head = match first {
        None => Err(answer.ended()),
        first => head_of(first),
    }?;
    Ok(response(head, WireBody { answer, pending, ended: false }))
}

/// The response head a call's first answer carries, or why there is none.
fn head_of(first: Option<Answer>) -> Result<(u16, http::HeaderMap), Status> {
    match first {
        Some(Ok(Frame::Head { status, headers, .. })) => Ok((status, headers)),
        Some(Ok(_)) => Err(Status::internal("the node answered without headers")),
        Some(Err(status)) => Err(status),
        None => Err(ended_early()),
    }
}

/// A response of `head` with `body`.
fn response<B>((status, headers): (u16, http::HeaderMap), body: B) -> http::Response<B> {
    let mut response = http::Response::new(body);
    *response.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    *response.headers_mut() = headers;
    response
}

/// A whole answer ([`WireConnection::unary`]) as [`WireConnection::call`] would have returned
/// it: the same head, then the same body frames, or the same refusal.
pub(crate) fn replay(answers: Vec<Answer>) -> Result<http::Response<ReplayBody>, Status> {
    let mut answers = std::collections::VecDeque::from(answers);
    let head = head_of(answers.pop_front())?;
    Ok(response(head, ReplayBody { answers, ended: false }))
}

/// A call's end without its whole answer, as its body sees it.
fn ended_early() -> Status {
    Status::unavailable("the call ended without its answer: the connection closed; call again")
}

/// A call ended for reading its answer slower than it came.
fn fell_behind() -> Status {
    Status::unavailable(format!(
        "the call was ended: its answer was read slower than it came (more than {ANSWER_FRAMES} \
         frames or {} MiB unread); read it as it comes, or call over gRPC (`Protocol::Grpc`, \
         or `--protocol grpc`), whose flow control waits for the reader",
        ANSWER_BYTES >> 20
    ))
}

/// What the reader holds of one call's answer, shared by the two ends of its queue.
#[derive(Debug, Default)]
struct Held {
    /// Bytes of data frames queued and not yet read.
    bytes: AtomicUsize,
    /// Set when the call was ended for falling behind.
    fell_behind: AtomicBool,
}

/// The reader's end of a call's queue of answers.
#[derive(Debug)]
struct FrameSender {
    sender: mpsc::Sender<Answer>,
    held: Arc<Held>,
}

/// The call's end of its queue of answers.
#[derive(Debug)]
pub(crate) struct FrameReceiver {
    receiver: mpsc::Receiver<Answer>,
    held: Arc<Held>,
}

/// A call's queue of answers, bounded by [`ANSWER_FRAMES`] and [`ANSWER_BYTES`].
fn frame_queue() -> (FrameSender, FrameReceiver) {
    let (sender, receiver) = mpsc::channel(ANSWER_FRAMES);
    let held = Arc::new(Held::default());
    (FrameSender { sender, held: held.clone() }, FrameReceiver { receiver, held })
}

/// The bytes a queued answer holds that count against [`ANSWER_BYTES`].
fn data_bytes(answer: &Answer) -> usize {
    match answer {
        Ok(Frame::Data { data, .. }) => data.len(),
        _ => 0,
    }
}

impl FrameSender {
    /// Queues `answer`; `false` when the call has fallen too far behind to take it (it is
    /// marked so, and the answer dropped). A call that is gone takes anything.
    fn send(&self, answer: Answer) -> bool {
        let bytes = data_bytes(&answer);
        // Counted before it is queued: the call may read it, and count it off, at once.
        let held = self.held.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let taken = held <= ANSWER_BYTES
            && !matches!(self.sender.try_send(answer), Err(mpsc::error::TrySendError::Full(_)));
        if !taken {
            self.held.bytes.fetch_sub(bytes, Ordering::Relaxed);
            self.held.fell_behind.store(true, Ordering::Relaxed);
        }
        taken
    }
}

impl FrameReceiver {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Answer>> {
        let next = self.receiver.poll_recv(cx);
        if let Poll::Ready(Some(answer)) = &next {
            self.held.bytes.fetch_sub(data_bytes(answer), Ordering::Relaxed);
        }
        next
    }

    /// Why the queue ended short of a whole answer.
    fn ended(&self) -> Status {
        if self.held.fell_behind.load(Ordering::Relaxed) { fell_behind() } else { ended_early() }
    }
}

/// A call not yet answered whole; dropped before that, it tells the node to stop serving it.
/// It holds the call's place until then.
#[derive(Debug)]
struct Pending {
    connection: WireConnection,
    id: u64,
    place: Option<OwnedSemaphorePermit>,
}

impl Pending {
    /// The call was answered whole: its place is free, and the node needs no cancel.
    fn finish(&mut self) {
        self.place = None;
        self.connection.shared().lock().waiting.remove(&self.id);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.place.take().is_none() {
            return;
        }
        let shared = self.connection.shared();
        let mut calls = shared.lock();
        if calls.waiting.remove(&self.id).is_some() {
            calls.queue(shared, 0, Frame::Cancel { id: self.id }.to_bytes());
        }
    }
}

/// A response body read from the wire: data frames, then the trailers that carry the status.
#[derive(Debug)]
pub struct WireBody {
    answer: FrameReceiver,
    pending: Pending,
    ended: bool,
}

impl http_body::Body for WireBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let next = match self.answer.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(next) => next,
        };
        if next.is_none() {
            self.ended = true;
            return Poll::Ready(Some(Err(self.answer.ended())));
        }
        let (frame, step) = body_frame(next);
        match step {
            BodyStep::More => {}
            BodyStep::Answered => {
                self.pending.finish();
                self.ended = true;
            }
            BodyStep::Ended => self.ended = true,
        }
        Poll::Ready(Some(frame))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

/// Where a body stands after one of its frames.
enum BodyStep {
    /// More frames follow.
    More,
    /// The call was answered whole (or failed at the node's end): nothing to cancel.
    Answered,
    /// The body ended short of a whole answer.
    Ended,
}

/// The body frame a call's next answer makes.
fn body_frame(next: Option<Answer>) -> (Result<BodyFrame<Bytes>, Status>, BodyStep) {
    match next {
        Some(Ok(Frame::Data { data, .. })) => (Ok(BodyFrame::data(data)), BodyStep::More),
        Some(Ok(Frame::Trailers { trailers, .. })) => {
            (Ok(BodyFrame::trailers(trailers)), BodyStep::Answered)
        }
        Some(Ok(_)) => {
            (Err(Status::internal("the node sent a frame out of order")), BodyStep::Ended)
        }
        Some(Err(status)) => (Err(status), BodyStep::Answered),
        None => (Err(ended_early()), BodyStep::Ended),
    }
}

/// A whole answer's body, handed over frame by frame as [`WireBody`] hands over a call's.
#[derive(Debug)]
pub(crate) struct ReplayBody {
    answers: std::collections::VecDeque<Answer>,
    ended: bool,
}

impl http_body::Body for ReplayBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let next = self.answers.pop_front();
        let (frame, step) = body_frame(next);
        self.ended = !matches!(step, BodyStep::More);
        Poll::Ready(Some(frame))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

/// Sends queued frames, several per write when they queue faster than the socket takes them.
/// A frame is counted as handed to the socket before its write starts, and nothing is written
/// once the connection is closed: a call failed as not sent never reaches the node.
async fn write<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut queue: mpsc::UnboundedReceiver<(u64, Bytes)>,
    shared: Arc<Shared>,
) {
    let mut batch = BytesMut::new();
    while let Some((id, frame)) = queue.recv().await {
        let mut last_id = id;
        batch.extend_from_slice(&frame);
        while batch.len() < WRITE_BATCH_BYTES
            && let Ok((id, frame)) = queue.try_recv()
        {
            last_id = last_id.max(id);
            batch.extend_from_slice(&frame);
        }
        {
            let mut calls = shared.lock();
            if calls.broken {
                // Its calls were failed, some as not sent: they must stay unsent.
                return;
            }
            calls.queued_bytes = calls.queued_bytes.saturating_sub(batch.len());
            calls.handed_through = calls.handed_through.max(last_id);
        }
        let written = async {
            writer.write_all(&batch).await?;
            writer.flush().await
        };
        if let Err(error) = written.await {
            shared.lock().close(&shared, &format!("writing to the node failed: {error}"));
            return;
        }
        batch.clear();
    }
    let _ = writer.shutdown().await;
}

/// Hands every answer frame to its call until the connection ends.
async fn read<R: AsyncRead + Unpin>(mut reader: R, shared: Arc<Shared>) {
    let mut buffer = BytesMut::with_capacity(16 * 1024);
    let reason = loop {
        let frame = match Frame::decode(&mut buffer, MAX_FRAME_BYTES) {
            Ok(Some(frame)) => frame,
            Ok(None) => match reader.read_buf(&mut buffer).await {
                Ok(0) => break "the node closed the connection".to_owned(),
                Ok(_) => continue,
                Err(error) => break format!("reading from the node failed: {error}"),
            },
            Err(error) => break format!("the node sent {error}"),
        };
        let id = match &frame {
            Frame::Head { id, .. }
            | Frame::Data { id, .. }
            | Frame::Trailers { id, .. }
            | Frame::Reset { id, .. } => *id,
            Frame::GoAway { last_id } => {
                go_away(&shared, *last_id);
                continue;
            }
            _ => break "the node sent a client's frame".to_owned(),
        };
        let answer = match frame {
            Frame::Reset { message, .. } => {
                Err(Status::internal(format!("the node ended the call: {message}")))
            }
            frame => Ok(frame),
        };
        let mut calls = shared.lock();
        let check = match &answer {
            Ok(Frame::Data { .. }) => calls.message_check(id),
            _ => None,
        };
        let decodes = match (check, &answer) {
            (Some(check), Ok(Frame::Data { data, .. })) => {
                // A message a unary call may gather is checked with the lock let go: the
                // connection's callers and its writer do not wait for the decoding. Only this
                // task changes what a call has gathered, so the check still holds after.
                drop(calls);
                let decodes = one_message(data).is_some_and(check);
                calls = shared.lock();
                decodes
            }
            _ => false,
        };
        calls.deliver(&shared, id, answer, decodes);
        drop(calls);
    };
    shared.lock().close(&shared, &reason);
}

/// The node read nothing after `last_id`: later calls were never read and may be sent again.
fn go_away(shared: &Shared, last_id: u64) {
    let mut calls = shared.lock();
    calls.closed.get_or_insert_with(|| "the node is closing the connection".to_owned());
    shared.places.close();
    let unread: Vec<u64> = calls.waiting.keys().copied().filter(|id| *id > last_id).collect();
    for id in unread {
        if let Some(waiter) = calls.waiting.remove(&id) {
            waiter.end(not_sent_status(
                "the node closed the connection before reading the call; connect again",
            ));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
