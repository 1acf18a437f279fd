//! A small HTTP/1.1 client for the CLI's calls to fenced resources (`picket kv put`, fence
//! registration on acquire), built on the hyper already in the build.

use anyhow::{Context, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use std::time::Duration;

/// Longest time one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A response: status and body.
#[derive(Debug)]
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: Bytes,
}

impl HttpReply {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Splits `http://host:port/path` into the authority and the path.
fn split_url(url: &str) -> anyhow::Result<(String, String)> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("{url:?} is not an http:// URL (https is not supported yet)"))?;
    let (authority, path) =
        rest.split_once('/').map_or((rest, ""), |(authority, path)| (authority, path));
    if authority.is_empty() {
        bail!("{url:?} has no host");
    }
    Ok((authority.to_owned(), format!("/{path}")))
}

/// Sends one request with `headers` and `body` and reads the whole answer.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> anyhow::Result<HttpReply> {
    tokio::time::timeout(REQUEST_TIMEOUT, send_inner(method, url, headers, body))
        .await
        .with_context(|| format!("{url} did not answer within {REQUEST_TIMEOUT:?}"))?
}

async fn send_inner(
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> anyhow::Result<HttpReply> {
    let (authority, path) = split_url(url)?;
    let stream = tokio::net::TcpStream::connect(&authority)
        .await
        .with_context(|| format!("cannot connect to {authority}: is the service running?"))?;
    stream.set_nodelay(true).ok();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let mut request = Request::builder().method(method).uri(path).header("host", authority);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = sender.send_request(request.body(Full::new(Bytes::from(body)))?).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok(HttpReply { status, body })
}

/// A kept-alive HTTP/1.1 connection, for many requests to one server (the benchmark).
pub struct Http1Connection {
    authority: String,
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Http1Connection {
    /// Connects to the server of `url` (an `http://host:port` URL).
    pub async fn open(url: &str) -> anyhow::Result<Self> {
        let (authority, _) = split_url(url)?;
        let stream = tokio::net::TcpStream::connect(&authority)
            .await
            .with_context(|| format!("cannot connect to {authority}: is the service running?"))?;
        stream.set_nodelay(true).ok();
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        Ok(Self { authority, sender })
    }

    /// Sends one request on this connection and reads the whole answer.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> anyhow::Result<HttpReply> {
        self.sender.ready().await?;
        let mut request =
            Request::builder().method(method).uri(path).header("host", &self.authority);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let response =
            self.sender.send_request(request.body(Full::new(Bytes::from(body)))?).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok(HttpReply { status, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_authority_and_path() {
        assert_eq!(
            split_url("http://127.0.0.1:7690/kv/a/b").unwrap(),
            ("127.0.0.1:7690".into(), "/kv/a/b".into())
        );
        assert_eq!(split_url("http://h:1").unwrap(), ("h:1".into(), "/".into()));
        assert!(split_url("https://h:1/").is_err());
        assert!(split_url("http:///x").is_err());
    }
}
