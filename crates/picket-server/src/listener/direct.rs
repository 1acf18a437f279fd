//! The client API's hot unary calls served straight from a wire frame: the same handlers as the
//! router's, without building an HTTP request, routing it and going through tonic's codec.
//!
//! Only a request in the plain form is taken here: exactly one uncompressed message within the
//! client API's size limit that decodes, with no `grpc-encoding`. Anything else goes to the
//! router, so every refusal of a malformed call is tonic's own. The answer is written as tonic
//! writes it: headers, one message and `grpc-status: 0`, or, for an error, the status in the
//! headers with no message (a "trailers-only" answer).

use crate::grpc::ClientService;
use crate::tls::Caller;
use bytes::{BufMut as _, Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue};
use picket_proto::v1::picket_server::Picket as _;
use picket_proto::wire::Frame;
use std::future::Future;
use tonic::{Request, Response, Status};

/// The length of a gRPC message's prefix: whether it is compressed, and its length.
const MESSAGE_PREFIX_BYTES: usize = 5;

/// Headers tonic leaves out of a response's metadata: they are the protocol's own.
const RESERVED_HEADERS: [&str; 5] =
    ["te", "content-type", "grpc-message", "grpc-message-type", "grpc-status"];

/// The calls a client port's wire connections serve themselves.
#[derive(Clone, Debug)]
pub(crate) struct DirectCalls {
    service: ClientService,
    /// The client API's limit on a request message (tonic's `max_decoding_message_size`).
    max_message_bytes: usize,
}

/// A call served directly: its answer's frames, encoded.
pub(super) type DirectCall = BoxFuture<'static, Bytes>;

impl DirectCalls {
    pub(crate) fn new(service: ClientService, max_message_bytes: usize) -> Self {
        Self { service, max_message_bytes }
    }

    /// The call `id` to `path`, served directly, or `None` when the router must take it (a path
    /// not served here, or a request not in the plain form).
    pub(super) fn call(
        &self,
        id: u64,
        path: &str,
        headers: &HeaderMap,
        body: &Bytes,
        caller: &Caller,
    ) -> Option<DirectCall> {
        if headers.contains_key("grpc-encoding") {
            return None;
        }
        let message = plain_message(body, self.max_message_bytes)?;
        let service = self.service.clone();
        let parts = Parts { id, headers: headers.clone(), caller: caller.clone() };
        match path {
            "/picket.v1.Picket/Acquire" => {
                unary(parts, message, move |request| async move { service.acquire(request).await })
            }
            "/picket.v1.Picket/Release" => {
                unary(parts, message, move |request| async move { service.release(request).await })
            }
            "/picket.v1.Picket/KeepAlive" => {
                unary(
                    parts,
                    message,
                    move |request| async move { service.keep_alive(request).await },
                )
            }
            "/picket.v1.Picket/KeepAliveMany" => unary(parts, message, move |request| async move {
                service.keep_alive_many(request).await
            }),
            "/picket.v1.Picket/OpenSession" => {
                unary(
                    parts,
                    message,
                    move |request| async move { service.open_session(request).await },
                )
            }
            "/picket.v1.Picket/CloseSession" => {
                unary(
                    parts,
                    message,
                    move |request| async move { service.close_session(request).await },
                )
            }
            _ => None,
        }
    }
}

/// The message of a body that holds exactly one, uncompressed and of at most
/// `max_message_bytes`.
fn plain_message(body: &Bytes, max_message_bytes: usize) -> Option<&[u8]> {
    let (prefix, message) = body.split_at_checked(MESSAGE_PREFIX_BYTES)?;
    let compressed = prefix[0];
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
    let plain = compressed == 0
        && usize::try_from(length).is_ok_and(|length| length == message.len())
        && message.len() <= max_message_bytes;
    plain.then_some(message)
}

/// What a call carries beside its message.
struct Parts {
    id: u64,
    headers: HeaderMap,
    caller: Caller,
}

/// Decodes `message` as `Req` (`None` if it does not decode: the router refuses it) and runs
/// `handler` on it as a gRPC request with the call's metadata and caller.
fn unary<Req, Resp, Handler, Answer>(
    parts: Parts,
    message: &[u8],
    handler: Handler,
) -> Option<DirectCall>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + 'static,
    Handler: FnOnce(Request<Req>) -> Answer + Send + 'static,
    Answer: Future<Output = Result<Response<Resp>, Status>> + Send + 'static,
{
    let message = Req::decode(message).ok()?;
    let Parts { id, headers, caller } = parts;
    Some(Box::pin(async move {
        let mut request = http::Request::new(message);
        *request.headers_mut() = headers;
        request.extensions_mut().insert(caller);
        answer(id, handler(Request::from_http(request)).await)
    }))
}

/// The frames of an answer, as tonic's unary answer becomes over the wire protocol.
fn answer<Resp: prost::Message>(id: u64, answer: Result<Response<Resp>, Status>) -> Bytes {
    let mut out = BytesMut::new();
    match answer {
        Ok(response) => {
            let (metadata, message, _) = response.into_parts();
            let mut headers = metadata.into_headers();
            for reserved in RESERVED_HEADERS {
                headers.remove(reserved);
            }
            headers
                .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            Frame::Head { id, status: 200, headers }.encode(&mut out);
            let length = message.encoded_len();
            let mut data = BytesMut::with_capacity(MESSAGE_PREFIX_BYTES + length);
            data.put_u8(0);
            // A handler's answer is far below 4 GiB: the largest is a page of a listing.
            data.put_u32(u32::try_from(length).expect("an answer under 4 GiB"));
            message.encode_raw(&mut data);
            Frame::Data { id, data: data.freeze() }.encode(&mut out);
            let mut trailers = HeaderMap::new();
            trailers.insert(Status::GRPC_STATUS, HeaderValue::from_static("0"));
            Frame::Trailers { id, trailers }.encode(&mut out);
        }
        Err(status) => {
            let (head, ()) = status.into_http::<()>().into_parts();
            Frame::Head { id, status: head.status.as_u16(), headers: head.headers }
                .encode(&mut out);
            Frame::Trailers { id, trailers: HeaderMap::new() }.encode(&mut out);
        }
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(compressed: u8, length: u32, message: &[u8]) -> Bytes {
        let mut body = vec![compressed];
        body.extend_from_slice(&length.to_be_bytes());
        body.extend_from_slice(message);
        Bytes::from(body)
    }

    #[test]
    fn only_one_uncompressed_message_within_the_limit_is_taken_directly() {
        let plain = |body: &Bytes| plain_message(body, 4).map(<[u8]>::to_vec);
        assert_eq!(plain(&framed(0, 3, b"abc")), Some(b"abc".to_vec()));
        assert_eq!(plain(&framed(0, 0, b"")), Some(Vec::new()));
        assert_eq!(plain(&framed(1, 3, b"abc")), None, "compressed");
        assert_eq!(plain(&framed(0, 4, b"abc")), None, "short");
        assert_eq!(plain(&framed(0, 2, b"abc")), None, "a second message follows");
        assert_eq!(plain(&framed(0, 5, b"abcde")), None, "over the limit");
        assert_eq!(plain(&Bytes::from_static(b"\0\0\0")), None, "no prefix");
    }
}
