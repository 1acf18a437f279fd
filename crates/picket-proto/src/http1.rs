//! The one HTTP/1.1 client in Picket: the CLI's calls to fenced resources (`picket kv`, fence
//! registration on acquire, the demo, the benchmark's fenced mode) and the integration tests'
//! calls to the HTTP/JSON API, in plaintext or over TLS. Built on hyper.
//!
//! A request is sent on an [`Http1Connection`]; [`send`] opens one for a single request. A
//! response is read whole ([`Http1Reply`]) or as a stream of body chunks ([`Http1Stream`], for
//! server-sent events).

use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::time::Duration;

/// Longest time [`send`] waits for a whole answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Http1Error {
    /// The URL is not `http://host:port/path`.
    #[error("{url:?} is not an http://host:port URL ({detail})")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        detail: &'static str,
    },
    /// The server could not be reached.
    #[error("cannot connect to {authority}: {source}; is the service running?")]
    Connect {
        /// `host:port`.
        authority: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The TLS handshake failed.
    #[error("the TLS handshake with {authority} failed: {detail}; check the CA and the host name")]
    Tls {
        /// `host:port`.
        authority: String,
        /// What rustls said.
        detail: String,
    },
    /// The request could not be built (a header name or value a request cannot carry).
    #[error("the request cannot be sent: {0}")]
    Request(#[from] http::Error),
    /// The connection broke or the answer was not HTTP.
    #[error("the HTTP exchange failed: {0}")]
    Protocol(#[from] hyper::Error),
    /// No whole answer within the time allowed.
    #[error("{what} did not answer within {timeout:?}")]
    Timeout {
        /// The URL or address asked.
        what: String,
        /// The time allowed.
        timeout: Duration,
    },
}

/// A whole response.
#[derive(Clone, Debug)]
pub struct Http1Reply {
    /// The status code.
    pub status: u16,
    /// The headers, names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Bytes,
}

impl Http1Reply {
    /// The body as text (invalid UTF-8 replaced).
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The first value of header `name` (any case).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(key, _)| *key == name).map(|(_, value)| value.as_str())
    }
}

/// A response whose body is read as it arrives.
#[derive(Debug)]
pub struct Http1Stream {
    /// The status code.
    pub status: u16,
    /// The headers, names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    body: Incoming,
}

impl Http1Stream {
    /// The next chunk of the body, `None` once it has ended.
    ///
    /// # Errors
    /// [`Http1Error::Protocol`] when the connection breaks.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, Http1Error> {
        while let Some(frame) = self.body.frame().await {
            if let Ok(data) = frame?.into_data() {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}

/// Splits `http://host:port/path` into the authority and the path (with its query).
///
/// # Errors
/// [`Http1Error::BadUrl`] for another scheme or no host.
pub fn split_url(url: &str) -> Result<(String, String), Http1Error> {
    let bad = |detail| Http1Error::BadUrl { url: url.to_owned(), detail };
    let rest = url.strip_prefix("http://").ok_or_else(|| bad("only http:// is supported here"))?;
    let (authority, path) =
        rest.split_once('/').map_or((rest, ""), |(authority, path)| (authority, path));
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    Ok((authority.to_owned(), format!("/{path}")))
}

/// Sends one request to `url` on a connection of its own and reads the whole answer within
/// [`REQUEST_TIMEOUT`].
///
/// # Errors
/// [`Http1Error`] when the URL is not `http://`, the server cannot be reached, the exchange
/// breaks, or no answer comes in time.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> Result<Http1Reply, Http1Error> {
    let exchange = async {
        let (authority, path) = split_url(url)?;
        let mut connection = Http1Connection::open(&authority, None).await?;
        connection.send(method, &path, headers, body).await
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| Http1Error::Timeout { what: url.to_owned(), timeout: REQUEST_TIMEOUT })?
}

/// A kept-alive HTTP/1.1 connection to one server, for one request after another.
pub struct Http1Connection {
    authority: String,
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl std::fmt::Debug for Http1Connection {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Http1Connection").field("authority", &self.authority).finish()
    }
}

impl Http1Connection {
    /// Connects to `authority` (`host:port`), over TLS with `tls` when given (the server's
    /// certificate must name the host; offer no ALPN protocol, or `http/1.1`).
    ///
    /// # Errors
    /// [`Http1Error::Connect`], [`Http1Error::Tls`], or [`Http1Error::Protocol`] when the
    /// handshake fails.
    pub async fn open(
        authority: &str,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<Self, Http1Error> {
        let connect = |source| Http1Error::Connect { authority: authority.to_owned(), source };
        let stream = tokio::net::TcpStream::connect(authority).await.map_err(connect)?;
        // Without TCP_NODELAY a request's body waits for the delayed ACK of its head.
        stream.set_nodelay(true).map_err(connect)?;
        let sender = match tls {
            None => handshake(stream).await?,
            Some(config) => {
                let tls_failed =
                    |detail: String| Http1Error::Tls { authority: authority.to_owned(), detail };
                let name = crate::tls::server_name(authority).map_err(tls_failed)?;
                let connector = tokio_rustls::TlsConnector::from(config);
                let stream = connector
                    .connect(name, stream)
                    .await
                    .map_err(|error| tls_failed(error.to_string()))?;
                handshake(stream).await?
            }
        };
        Ok(Self { authority: authority.to_owned(), sender })
    }

    /// Sends one request on this connection and reads the whole answer.
    ///
    /// # Errors
    /// [`Http1Error::Request`] for a header a request cannot carry; [`Http1Error::Protocol`]
    /// when the connection breaks.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> Result<Http1Reply, Http1Error> {
        let stream = self.open_stream(method, path, headers, body).await?;
        let Http1Stream { status, headers, body } = stream;
        let body = body.collect().await?.to_bytes();
        Ok(Http1Reply { status, headers, body })
    }

    /// Sends one request and returns the answer's head; its body is read as it arrives.
    ///
    /// # Errors
    /// As [`Http1Connection::send`].
    pub async fn open_stream(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> Result<Http1Stream, Http1Error> {
        self.sender.ready().await?;
        let mut request =
            http::Request::builder().method(method).uri(path).header("host", &self.authority);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let response =
            self.sender.send_request(request.body(Full::new(Bytes::from(body)))?).await?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| {
                (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned())
            })
            .collect();
        Ok(Http1Stream { status, headers, body: response.into_body() })
    }
}

/// The HTTP/1.1 handshake over an open stream; the connection is driven by a task of its own.
async fn handshake<Io>(
    io: Io,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, Http1Error>
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "an HTTP/1.1 connection ended with an error");
        }
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_authority_and_path() {
        assert_eq!(
            split_url("http://127.0.0.1:7690/kv/a/b?x=1").unwrap(),
            ("127.0.0.1:7690".into(), "/kv/a/b?x=1".into())
        );
        assert_eq!(split_url("http://h:1").unwrap(), ("h:1".into(), "/".into()));
        assert!(split_url("https://h:1/").is_err());
        assert!(split_url("http:///x").is_err());
    }
}
