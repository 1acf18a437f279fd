//! Blocking calls to the HTTP/JSON API through Picket's one HTTP/1.1 client
//! (`picket_proto::http1`), as `curl` would make them: a connection per request.
//!
//! They may be called from an async test (the call then runs on a thread of its own), but
//! they block the caller's thread meanwhile: in a current-thread test, the test's own
//! spawned tasks do not run until the call returns.

use picket_proto::http1::{Http1Connection, Http1Error, Http1Stream};
use serde_json::Value;
use std::future::Future;
use std::time::Duration;

/// Longest time one request, or one wait for a server-sent event, may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// A response: status code and body parsed as JSON (`Null` when empty or not JSON).
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The body, as JSON.
    pub body: Value,
    /// The body, as text.
    pub text: String,
    /// The headers, names in lower case, in order.
    pub headers: Vec<(String, String)>,
}

impl Reply {
    /// The first value of header `name` (any case).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(key, _)| *key == name).map(|(_, value)| value.as_str())
    }
}

/// Runs `future` to its end on `runtime`, from a thread of its own when the caller is
/// already inside a runtime (an async test), where blocking on another is not allowed.
fn run<F>(runtime: &Runtime, future: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    let runtime = runtime.0.as_ref().expect("a runtime until dropped");
    if tokio::runtime::Handle::try_current().is_err() {
        return runtime.block_on(future);
    }
    std::thread::scope(|scope| {
        scope.spawn(|| runtime.block_on(future)).join().expect("the request does not panic")
    })
}

/// A runtime of the caller's own that may be dropped anywhere, an async test included.
#[derive(Debug)]
struct Runtime(Option<tokio::runtime::Runtime>);

impl Runtime {
    fn new() -> Self {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        Self(Some(runtime))
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which an async caller may not do; this does not.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Sends one request with `body` and `content_type`, as `caller` says, on a connection of
/// its own, and reads the whole reply.
///
/// # Errors
/// When the connection or the TLS handshake fails, or no whole answer comes within 60 s.
pub fn request_bytes(
    addr: &str,
    caller: &As,
    method: &str,
    path: &str,
    body: Vec<u8>,
    content_type: &str,
) -> Result<Reply, String> {
    let method: http::Method =
        method.parse().map_err(|error| format!("method {method:?}: {error}"))?;
    let mut headers: Vec<(&str, String)> = Vec::new();
    if !caller.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
        headers.push(("content-type", content_type.to_owned()));
    }
    if let Some(token) = &caller.bearer_token {
        headers.push(("authorization", format!("Bearer {token}")));
    }
    headers.extend(caller.headers.iter().map(|(name, value)| (name.as_str(), value.clone())));
    let sending = async {
        let mut connection = Http1Connection::open(addr, caller.tls.clone()).await?;
        connection.send(method, path, &headers, body).await
    };
    let reply = run(&Runtime::new(), async { tokio::time::timeout(TIMEOUT, sending).await })
        .map_err(|_| format!("no answer within {TIMEOUT:?}"))?
        .map_err(|error: Http1Error| error.to_string())?;
    let text = reply.text();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Ok(Reply { status: reply.status, body, text, headers: reply.headers })
}

/// Sends one request and reads the whole response. `body` is sent as JSON when present.
///
/// # Panics
/// When the connection fails or the response is not HTTP.
#[must_use]
pub fn request(addr: &str, method: &str, path: &str, body: Option<&Value>) -> Reply {
    let raw = body.map(Value::to_string);
    request_raw(addr, method, path, raw.as_deref().map(str::as_bytes), "application/json")
}

/// Sends raw bytes as the body, with `content_type`.
///
/// # Panics
/// When the connection fails or the response is not HTTP.
#[must_use]
pub fn request_raw(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    content_type: &str,
) -> Reply {
    let body = body.unwrap_or_default().to_vec();
    request_bytes(addr, &As::default(), method, path, body, content_type)
        .unwrap_or_else(|error| panic!("{method} {path} at {addr}: {error}"))
}

/// Like [`request`], but a connection failure is an `Err` instead of a panic: for tests that
/// kill the server under the client's feet.
///
/// # Errors
/// When the connection fails or breaks before a whole response arrived.
pub fn try_request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Reply, String> {
    request_as(addr, &As::default(), method, path, body)
}

/// How a request is sent: over TLS with this configuration, with this bearer token.
#[derive(Clone, Debug, Default)]
pub struct As {
    /// TLS, or plaintext when `None`.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// Sent as `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
    /// More headers, as (name, value).
    pub headers: Vec<(String, String)>,
}

/// Sends one request as `caller` says and reads the whole response.
///
/// # Errors
/// When the connection or the TLS handshake fails.
pub fn request_as(
    addr: &str,
    caller: &As,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Reply, String> {
    let body = body.map(Value::to_string).unwrap_or_default().into_bytes();
    request_bytes(addr, caller, method, path, body, "application/json")
}

/// `GET path`.
#[must_use]
pub fn get(addr: &str, path: &str) -> Reply {
    request(addr, "GET", path, None)
}

/// `POST path` with a JSON body.
#[must_use]
pub fn post(addr: &str, path: &str, body: &Value) -> Reply {
    request(addr, "POST", path, Some(body))
}

/// Opens a server-sent events stream and returns a reader of its `data:` lines.
///
/// # Panics
/// When the connection fails or the server refuses the stream.
#[must_use]
pub fn events(addr: &str, path: &str) -> EventStream {
    let runtime = Runtime::new();
    let headers = [("accept", "text/event-stream".to_owned())];
    let opening = async {
        let mut connection = Http1Connection::open(addr, None).await?;
        let stream = connection.open_stream(http::Method::GET, path, &headers, Vec::new()).await?;
        Ok::<_, Http1Error>((connection, stream))
    };
    let (connection, stream) = run(&runtime, async {
        tokio::time::timeout(TIMEOUT, opening).await.expect("the watch answered in time")
    })
    .expect("the watch opens");
    assert_eq!(stream.status, 200, "the watch was refused");
    EventStream { runtime, _connection: connection, stream, pending: String::new() }
}

/// The `data:` payloads of a server-sent events stream.
#[derive(Debug)]
pub struct EventStream {
    runtime: Runtime,
    /// Kept open for as long as the stream is read.
    _connection: Http1Connection,
    stream: Http1Stream,
    /// Text received and not yet read as lines.
    pending: String,
}

impl EventStream {
    /// The next event's data, parsed as JSON. Skips keep-alive comments.
    ///
    /// # Panics
    /// When the stream ends or no event comes within 60 s.
    pub fn next_json(&mut self) -> Value {
        loop {
            while let Some((line, rest)) = self.pending.split_once('\n') {
                let data = line.trim_end().strip_prefix("data:").map(str::to_owned);
                self.pending = rest.to_owned();
                if let Some(data) = data {
                    return serde_json::from_str(data.trim()).expect("event data is JSON");
                }
            }
            let stream = &mut self.stream;
            let chunk = run(&self.runtime, async {
                tokio::time::timeout(TIMEOUT, stream.next_chunk()).await
            })
            .expect("an event within the timeout")
            .expect("the event stream is readable")
            .expect("the event stream ended");
            self.pending.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}
