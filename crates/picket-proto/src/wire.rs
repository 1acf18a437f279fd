//! Picket's wire protocol: the gRPC API's calls, framed for one TCP (or TLS) connection without
//! HTTP/2.
//!
//! Every call is the same gRPC call, encoded as gRPC encodes it: a path such as
//! `/picket.v1.Picket/Acquire`, a request body, response headers, body data and trailers that
//! carry the gRPC status and Picket's error metadata. Only the framing differs. (The hot unary
//! calls skip tonic's stack on both ends, the node's `listener/direct.rs` and the client's
//! `unary.rs`, and write and read the same bytes.) HTTP/2 costs a
//! node, per call, HPACK coding, flow-control bookkeeping and a task of its own for each stream,
//! for a protocol whose requests are a few dozen bytes; here a connection is served by one task,
//! and a call is a few frames of a length and a kind.
//!
//! A client opens with [`MAGIC`], and the node answers with the same bytes followed by two
//! little-endian `u32`s: how many calls it serves at once on this connection, and the longest
//! request body it takes (the client waits for a place before sending a further call, and
//! refuses a longer body itself, as an HTTP/2 client follows its server's settings).
//! The node tells this opening from HTTP/1 and HTTP/2 on the same port: no HTTP method and no
//! HTTP/2 preface begins with a zero byte. A node of an older build reads it as a bad HTTP/1
//! request and closes the connection, which tells the client to use gRPC instead.
//!
//! Every frame is `[u32 little-endian length of the rest][u8 kind][fields]`, with integers in
//! little endian and byte strings as `[u32 length][bytes]`. Kinds sent by the client:
//! [`Frame::Request`], [`Frame::Cancel`], [`Frame::Authorization`]; by the node: [`Frame::Head`],
//! [`Frame::Data`], [`Frame::Trailers`], [`Frame::Reset`], [`Frame::GoAway`]. Call ids are chosen
//! by the client, increasing on each connection.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

/// The client's first bytes on a connection, and the node's answer. The zero byte tells it apart
/// from HTTP; the line end makes an older node's HTTP/1 parser refuse it at once.
pub const MAGIC: &[u8; 16] = b"\0picket-wire/1\r\n";

/// How many bytes of frames either end gathers into one write at most, when frames queue
/// faster than the socket takes them.
pub const WRITE_BATCH_BYTES: usize = 64 * 1024;

/// Most headers or trailers one frame may carry; a call's metadata is a handful.
pub const MAX_HEADERS: usize = 64;
/// How long a connection may be silent before the kernel probes it (TCP keepalive), and how
/// long its probes may go unanswered before the connection is closed: the wire protocol has no
/// ping of its own, so a peer whose host went away without a word is found the way HTTP/2's
/// pings find it on the same port (20 s, then 10 s).
pub const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(20);
/// See [`KEEPALIVE_IDLE`].
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Probes sent within [`KEEPALIVE_TIMEOUT`].
const KEEPALIVE_PROBES: u32 = 2;

/// Turns on TCP keepalive on `stream` with [`KEEPALIVE_IDLE`] and [`KEEPALIVE_TIMEOUT`], and
/// bounds how long sent data may stay unacknowledged by their sum (`TCP_USER_TIMEOUT`: the
/// kernel sends no keepalive probe while data waits for its acknowledgement, and its own
/// retransmissions give up only after about 15 minutes): both ends of a wire connection do, so
/// each finds the other gone silent, idle or not.
///
/// # Errors
/// The socket refused the options.
pub fn keep_alive(stream: &tokio::net::TcpStream) -> std::io::Result<()> {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_TIMEOUT / KEEPALIVE_PROBES)
        .with_retries(KEEPALIVE_PROBES);
    let socket = socket2::SockRef::from(stream);
    socket.set_tcp_keepalive(&keepalive)?;
    socket.set_tcp_user_timeout(Some(KEEPALIVE_IDLE + KEEPALIVE_TIMEOUT))
}

/// Length of the length prefix.
const PREFIX_BYTES: usize = 4;

/// The most a frame's decoding reserves at once for the rest of a frame still to come.
const READ_AHEAD_BYTES: usize = 8 * 1024;

const REQUEST: u8 = 1;
const CANCEL: u8 = 2;
const AUTHORIZATION: u8 = 3;
const HEAD: u8 = 10;
const DATA: u8 = 11;
const TRAILERS: u8 = 12;
const RESET: u8 = 13;
const GO_AWAY: u8 = 14;

/// One frame of the wire protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Frame {
    /// A call: its path, its metadata, and its whole request body (gRPC's length-prefixed
    /// message).
    Request {
        /// The call's id, larger than every earlier id on the connection.
        id: u64,
        /// The gRPC path, e.g. `/picket.v1.Picket/Acquire`.
        path: String,
        /// The call's metadata: its request headers but those every gRPC call carries the
        /// same (`content-type`, `te`, `user-agent`) and the connection's authorization.
        headers: HeaderMap,
        /// The request body.
        body: Bytes,
    },
    /// The client no longer wants call `id`'s answer (it gave up on it, or dropped a stream):
    /// the node stops serving it, as an HTTP/2 stream reset would.
    Cancel {
        /// The call given up on.
        id: u64,
    },
    /// The `authorization` header to send with every later call on the connection.
    Authorization {
        /// The header's value, e.g. `Bearer <token>`.
        value: Bytes,
    },
    /// The response status and headers of call `id` (for a gRPC error, the headers carry the
    /// gRPC status).
    Head {
        /// The call answered.
        id: u64,
        /// The HTTP status (200 for every gRPC answer; 404 for a path the node does not serve).
        status: u16,
        /// The response headers.
        headers: HeaderMap,
    },
    /// A piece of call `id`'s response body.
    Data {
        /// The call answered.
        id: u64,
        /// The bytes.
        data: Bytes,
    },
    /// The end of call `id`'s response, with its trailers (empty when it had none).
    Trailers {
        /// The call answered.
        id: u64,
        /// The trailers (`grpc-status` and the rest).
        trailers: HeaderMap,
    },
    /// Call `id` ended without a whole response (its response body failed).
    Reset {
        /// The call that ended.
        id: u64,
        /// Why, for people.
        message: String,
    },
    /// The node reads nothing more on this connection: calls up to `last_id` are answered,
    /// and any later one was never read, so it may be sent again on a new connection.
    GoAway {
        /// The last call the node read.
        last_id: u64,
    },
}

/// Why bytes received are not a frame of this protocol. The connection cannot go on after one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// A frame longer than the receiver accepts.
    #[error("a frame of {length} bytes is longer than the {max} bytes accepted")]
    TooLong {
        /// The frame's length.
        length: usize,
        /// The most accepted.
        max: usize,
    },
    /// A frame of a kind this build does not know.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A frame whose fields are cut short, or longer than its length.
    #[error("a malformed {0} frame")]
    Malformed(&'static str),
}

impl Frame {
    /// Appends the frame to `out`.
    ///
    /// # Panics
    /// If a field is longer than `u32::MAX` bytes (no frame the API sends comes near).
    pub fn encode(&self, out: &mut BytesMut) {
        let start = out.len();
        out.put_u32_le(0);
        match self {
            Self::Request { id, path, headers, body } => {
                out.put_u8(REQUEST);
                out.put_u64_le(*id);
                put_bytes(out, path.as_bytes());
                put_headers(out, headers);
                put_bytes(out, body);
            }
            Self::Cancel { id } => {
                out.put_u8(CANCEL);
                out.put_u64_le(*id);
            }
            Self::Authorization { value } => {
                out.put_u8(AUTHORIZATION);
                put_bytes(out, value);
            }
            Self::Head { id, status, headers } => {
                out.put_u8(HEAD);
                out.put_u64_le(*id);
                out.put_u16_le(*status);
                put_headers(out, headers);
            }
            Self::Data { id, data } => {
                out.put_u8(DATA);
                out.put_u64_le(*id);
                put_bytes(out, data);
            }
            Self::Trailers { id, trailers } => {
                out.put_u8(TRAILERS);
                out.put_u64_le(*id);
                put_headers(out, trailers);
            }
            Self::Reset { id, message } => {
                out.put_u8(RESET);
                out.put_u64_le(*id);
                put_bytes(out, message.as_bytes());
            }
            Self::GoAway { last_id } => {
                out.put_u8(GO_AWAY);
                out.put_u64_le(*last_id);
            }
        }
        let length = u32::try_from(out.len() - start - PREFIX_BYTES).expect("a frame under 4 GiB");
        out[start..start + PREFIX_BYTES].copy_from_slice(&length.to_le_bytes());
    }

    /// Appends a [`Frame::Head`] of call `id` (with `Some(status)`) or a [`Frame::Trailers`]
    /// (with `None`) carrying `headers`: the bytes [`Frame::encode`] writes for that frame with
    /// those headers in its map, without building the map. A node answering many small calls
    /// saves a map's allocation and a hash of each name per frame.
    ///
    /// # Panics
    /// If a header is longer than `u32::MAX` bytes.
    pub fn encode_headers<'a>(
        out: &mut BytesMut,
        id: u64,
        status: Option<u16>,
        headers: impl IntoIterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    ) {
        let start = out.len();
        out.put_u32_le(0);
        match status {
            Some(status) => {
                out.put_u8(HEAD);
                out.put_u64_le(id);
                out.put_u16_le(status);
            }
            None => {
                out.put_u8(TRAILERS);
                out.put_u64_le(id);
            }
        }
        put_headers(out, headers);
        let length = u32::try_from(out.len() - start - PREFIX_BYTES).expect("a frame under 4 GiB");
        out[start..start + PREFIX_BYTES].copy_from_slice(&length.to_le_bytes());
    }

    /// The frame, encoded alone.
    #[must_use]
    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::new();
        self.encode(&mut out);
        out.freeze()
    }

    /// Takes the first whole frame off `buffer`: `Ok(None)` while it is incomplete (read
    /// more and ask again). A frame's body bytes are shared with the buffer, not copied.
    ///
    /// # Errors
    /// When the frame is longer than `max_frame_bytes` (known from its prefix, before it is
    /// read) or is not a frame of this protocol.
    pub fn decode(
        buffer: &mut BytesMut,
        max_frame_bytes: usize,
    ) -> Result<Option<Self>, WireError> {
        let Some(prefix) = buffer.get(..PREFIX_BYTES) else {
            return Ok(None);
        };
        let length = u32::from_le_bytes(prefix.try_into().expect("four bytes")) as usize;
        if length > max_frame_bytes {
            return Err(WireError::TooLong { length, max: max_frame_bytes });
        }
        if buffer.len() < PREFIX_BYTES + length {
            // Room for what is missing, but no more than `READ_AHEAD_BYTES` at once: the
            // buffer grows with the bytes that arrive (amortized), not with what a prefix
            // declares. Reserving the declared length let four bytes hold a frame's whole
            // bound, on every connection at once (found in a hostile-input audit).
            let missing = PREFIX_BYTES + length - buffer.len();
            buffer.reserve(missing.min(READ_AHEAD_BYTES));
            return Ok(None);
        }
        buffer.advance(PREFIX_BYTES);
        let mut frame = buffer.split_to(length).freeze();
        Self::parse(&mut frame).map(Some)
    }

    fn parse(frame: &mut Bytes) -> Result<Self, WireError> {
        let kind = take_u8(frame, "empty")?;
        let parsed = match kind {
            REQUEST => {
                let id = take_u64(frame, "request")?;
                let path = take_string(frame, "request")?;
                let headers = take_headers(frame, "request")?;
                Self::Request { id, path, headers, body: take_bytes(frame, "request")? }
            }
            CANCEL => Self::Cancel { id: take_u64(frame, "cancel")? },
            AUTHORIZATION => Self::Authorization { value: take_bytes(frame, "authorization")? },
            HEAD => {
                let id = take_u64(frame, "head")?;
                let status = frame.try_get_u16_le().map_err(|_| WireError::Malformed("head"))?;
                Self::Head { id, status, headers: take_headers(frame, "head")? }
            }
            DATA => {
                let id = take_u64(frame, "data")?;
                Self::Data { id, data: take_bytes(frame, "data")? }
            }
            TRAILERS => {
                let id = take_u64(frame, "trailers")?;
                Self::Trailers { id, trailers: take_headers(frame, "trailers")? }
            }
            RESET => {
                let id = take_u64(frame, "reset")?;
                Self::Reset { id, message: take_string(frame, "reset")? }
            }
            GO_AWAY => Self::GoAway { last_id: take_u64(frame, "go-away")? },
            other => return Err(WireError::UnknownKind(other)),
        };
        if frame.has_remaining() {
            return Err(WireError::Malformed("over-long"));
        }
        Ok(parsed)
    }
}

fn put_bytes(out: &mut BytesMut, bytes: &[u8]) {
    out.put_u32_le(u32::try_from(bytes.len()).expect("a field under 4 GiB"));
    out.put_slice(bytes);
}

fn put_headers<'a>(
    out: &mut BytesMut,
    headers: impl IntoIterator<Item = (&'a HeaderName, &'a HeaderValue)>,
) {
    // A response's headers come from the node's own handlers: far fewer than the bound. The
    // count goes before the headers and is known only once they are written.
    let count_at = out.len();
    out.put_u16_le(0);
    let mut count: u16 = 0;
    for (name, value) in headers.into_iter().take(MAX_HEADERS) {
        put_bytes(out, name.as_str().as_bytes());
        put_bytes(out, value.as_bytes());
        count += 1;
    }
    out[count_at..count_at + 2].copy_from_slice(&count.to_le_bytes());
}

fn take_u8(frame: &mut Bytes, what: &'static str) -> Result<u8, WireError> {
    frame.try_get_u8().map_err(|_| WireError::Malformed(what))
}

fn take_u64(frame: &mut Bytes, what: &'static str) -> Result<u64, WireError> {
    frame.try_get_u64_le().map_err(|_| WireError::Malformed(what))
}

fn take_bytes(frame: &mut Bytes, what: &'static str) -> Result<Bytes, WireError> {
    let length = frame.try_get_u32_le().map_err(|_| WireError::Malformed(what))? as usize;
    if frame.remaining() < length {
        return Err(WireError::Malformed(what));
    }
    Ok(frame.split_to(length))
}

fn take_string(frame: &mut Bytes, what: &'static str) -> Result<String, WireError> {
    let bytes = take_bytes(frame, what)?;
    String::from_utf8(bytes.to_vec()).map_err(|_| WireError::Malformed(what))
}

fn take_headers(frame: &mut Bytes, what: &'static str) -> Result<HeaderMap, WireError> {
    let count = frame.try_get_u16_le().map_err(|_| WireError::Malformed(what))? as usize;
    if count > MAX_HEADERS {
        return Err(WireError::Malformed(what));
    }
    let mut headers = HeaderMap::with_capacity(count);
    for _ in 0..count {
        let name = take_bytes(frame, what)?;
        let value = take_bytes(frame, what)?;
        let name = HeaderName::from_bytes(&name).map_err(|_| WireError::Malformed(what))?;
        // Copied: a value that shared the read buffer would keep all of it alive as long as
        // its call lasts.
        let value = HeaderValue::from_bytes(&value).map_err(|_| WireError::Malformed(what))?;
        headers.append(name, value);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ends of a wire connection find a silent peer as HTTP/2's pings would: the kernel
    /// probes after KEEPALIVE_IDLE and gives up after KEEPALIVE_TIMEOUT of unanswered probes.
    #[tokio::test]
    async fn keep_alive_probes_a_silent_peer_on_the_pings_schedule() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let socket = socket2::SockRef::from(&stream);
        assert!(!socket.keepalive().unwrap(), "off until asked");
        keep_alive(&stream).unwrap();
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        let probes = socket.tcp_keepalive_retries().unwrap();
        assert_eq!(socket.tcp_keepalive_interval().unwrap() * probes, KEEPALIVE_TIMEOUT);
        let unacknowledged = socket.tcp_user_timeout().unwrap();
        assert_eq!(unacknowledged, Some(KEEPALIVE_IDLE + KEEPALIVE_TIMEOUT));
    }

    fn every_kind() -> Vec<Frame> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static("9"));
        headers.append("picket-error-code", HeaderValue::from_static("lock_busy"));
        vec![
            Frame::Request {
                id: 7,
                path: "/picket.v1.Picket/Acquire".into(),
                headers: HeaderMap::new(),
                body: Bytes::from_static(b"\0\0\0\0\x02ab"),
            },
            Frame::Request {
                id: 8,
                path: "/picket.v1.Raft/Vote".into(),
                headers: headers.clone(),
                body: Bytes::new(),
            },
            Frame::Cancel { id: 7 },
            Frame::Authorization { value: Bytes::from_static(b"Bearer s3cret") },
            Frame::Head { id: 7, status: 200, headers: headers.clone() },
            Frame::Data { id: 7, data: Bytes::from_static(b"answer") },
            Frame::Trailers { id: 7, trailers: headers },
            Frame::Trailers { id: u64::MAX, trailers: HeaderMap::new() },
            Frame::Reset { id: 8, message: "the body failed".into() },
            Frame::GoAway { last_id: 8 },
        ]
    }

    #[test]
    fn every_frame_decodes_to_itself_whole_or_byte_by_byte() {
        let frames = every_kind();
        let mut encoded = BytesMut::new();
        for frame in &frames {
            frame.encode(&mut encoded);
        }
        let mut whole = encoded.clone();
        let mut decoded = Vec::new();
        while let Some(frame) = Frame::decode(&mut whole, 1024).unwrap() {
            decoded.push(frame);
        }
        assert_eq!(decoded, frames);
        assert!(whole.is_empty());

        // Arriving a byte at a time, each frame appears once whole and not before.
        let mut trickle = BytesMut::new();
        let mut decoded = Vec::new();
        for byte in encoded {
            trickle.put_u8(byte);
            if let Some(frame) = Frame::decode(&mut trickle, 1024).unwrap() {
                decoded.push(frame);
            }
        }
        assert_eq!(decoded, frames);
    }

    #[test]
    fn heads_and_trailers_encoded_from_their_headers_are_the_frames_with_those_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.append("picket-error-code", HeaderValue::from_static("lock_busy"));
        headers.append("picket-error-code", HeaderValue::from_static("a second value"));
        for status in [Some(200), Some(404), None] {
            for headers in [HeaderMap::new(), headers.clone()] {
                let frame = match status {
                    Some(status) => Frame::Head { id: 9, status, headers: headers.clone() },
                    None => Frame::Trailers { id: 9, trailers: headers.clone() },
                };
                let mut direct = BytesMut::from(&b"before"[..]);
                Frame::encode_headers(&mut direct, 9, status, &headers);
                assert_eq!(&direct[..6], b"before");
                assert_eq!(direct[6..], frame.to_bytes());
                assert_eq!(Frame::decode(&mut direct.split_off(6), 1024), Ok(Some(frame)));
            }
        }

        // Past the bound, only the first MAX_HEADERS go, as from a map.
        let mut many = HeaderMap::new();
        for n in 0..MAX_HEADERS + 3 {
            many.append("x-many", HeaderValue::from(n));
        }
        let mut direct = BytesMut::new();
        Frame::encode_headers(&mut direct, 1, None, &many);
        assert_eq!(direct.freeze(), Frame::Trailers { id: 1, trailers: many }.to_bytes());
    }

    /// Regression (hostile-input audit): a prefix declaring a long frame reserved its whole
    /// length, so a client could make a connection hold the frame bound by sending four bytes.
    #[test]
    fn a_declared_length_does_not_reserve_more_than_what_arrives() {
        let mut buffer = BytesMut::new();
        buffer.put_u32_le(1 << 20);
        assert_eq!(Frame::decode(&mut buffer, 2 << 20), Ok(None));
        assert!(buffer.capacity() <= PREFIX_BYTES + READ_AHEAD_BYTES, "{}", buffer.capacity());

        // The frame still reads whole once its bytes are there.
        let whole = Frame::Cancel { id: 7 }.to_bytes();
        let mut buffer = BytesMut::new();
        for (at, byte) in whole.iter().enumerate() {
            buffer.put_u8(*byte);
            let decoded = Frame::decode(&mut buffer, 1024).unwrap();
            assert_eq!(decoded.is_some(), at + 1 == whole.len());
        }
    }

    #[test]
    fn a_frame_over_the_bound_is_refused_from_its_prefix_alone() {
        let mut buffer = BytesMut::new();
        buffer.put_u32_le(1 << 20);
        assert_eq!(
            Frame::decode(&mut buffer, 1024),
            Err(WireError::TooLong { length: 1 << 20, max: 1024 })
        );
    }

    #[test]
    fn malformed_frames_are_refused() {
        let framed = |body: &[u8]| {
            let mut buffer = BytesMut::new();
            buffer.put_u32_le(u32::try_from(body.len()).unwrap());
            buffer.put_slice(body);
            buffer
        };
        assert_eq!(Frame::decode(&mut framed(&[99]), 64), Err(WireError::UnknownKind(99)));
        assert_eq!(Frame::decode(&mut framed(&[]), 64), Err(WireError::Malformed("empty")));
        // A byte string longer than what is left of its frame.
        let mut cut = vec![DATA];
        cut.extend_from_slice(&1_u64.to_le_bytes());
        cut.extend_from_slice(&100_u32.to_le_bytes());
        assert_eq!(Frame::decode(&mut framed(&cut), 64), Err(WireError::Malformed("data")));
        // Bytes left over after the fields.
        let mut long = vec![CANCEL];
        long.extend_from_slice(&1_u64.to_le_bytes());
        long.push(0);
        assert_eq!(Frame::decode(&mut framed(&long), 64), Err(WireError::Malformed("over-long")));
        // A header name HTTP does not allow.
        let mut bad_name = vec![HEAD];
        bad_name.extend_from_slice(&1_u64.to_le_bytes());
        bad_name.extend_from_slice(&200_u16.to_le_bytes());
        bad_name.extend_from_slice(&1_u16.to_le_bytes());
        for field in [&b"bad name"[..], b"v"] {
            bad_name.extend_from_slice(&u32::try_from(field.len()).unwrap().to_le_bytes());
            bad_name.extend_from_slice(field);
        }
        assert_eq!(Frame::decode(&mut framed(&bad_name), 64), Err(WireError::Malformed("head")));
    }

    #[test]
    fn the_magic_is_neither_http1_nor_http2() {
        assert_eq!(MAGIC[0], 0, "no HTTP method or preface starts with a zero byte");
        assert!(MAGIC.ends_with(b"\n"));
    }
}
