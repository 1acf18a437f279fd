//! One HTTP/2 connection to one endpoint, driven by hyper directly.
//!
//! tonic's `Channel` puts a `tower::Buffer` in front of its connection, so every call is first
//! handed to a worker task and only then to the connection's task: one more task wake-up per
//! call, on the client's share of the CPU. A Picket client talks to one endpoint at a time and
//! reconnects itself (see `Client::call`), so it needs neither the buffer nor the channel's
//! reconnect layer; it sends on the connection's `SendRequest` instead.

use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::Status;
use tonic::body::Body;

/// The start of every error message for a request that certainly never left this process;
/// such a request may be sent again even when it is not idempotent.
pub(crate) const NOT_SENT: &str = "not sent: ";

/// An open HTTP/2 connection. Cheap to clone; clones multiplex on the same connection.
#[derive(Clone, Debug)]
pub(crate) struct Connection {
    send: SendRequest<Body>,
}

impl Connection {
    /// Opens a TCP connection to `endpoint` (`host:port`) with `TCP_NODELAY` and performs the
    /// HTTP/2 handshake, all within `connect_timeout`.
    pub(crate) async fn open(endpoint: &str, connect_timeout: Duration) -> Result<Self, Status> {
        let connecting = async {
            let stream = tokio::net::TcpStream::connect(endpoint).await?;
            // Without TCP_NODELAY, HTTP/2's small frames wait for delayed ACKs.
            stream.set_nodelay(true)?;
            let (send, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .handshake(TokioIo::new(stream))
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(async move {
                if let Err(error) = connection.await {
                    tracing::debug!(%error, "connection to the server closed");
                }
            });
            Ok::<_, std::io::Error>(send)
        };
        match tokio::time::timeout(connect_timeout, connecting).await {
            Ok(Ok(send)) => Ok(Self { send }),
            Ok(Err(error)) => {
                Err(Status::unavailable(format!("{NOT_SENT}cannot connect to {endpoint}: {error}")))
            }
            Err(_) => Err(Status::unavailable(format!(
                "{NOT_SENT}cannot connect to {endpoint} within {connect_timeout:?}"
            ))),
        }
    }

    /// Whether the connection has closed; a closed one is replaced before the next call.
    pub(crate) fn is_closed(&self) -> bool {
        self.send.is_closed()
    }
}

fn closed_before_sending(error: &hyper::Error) -> Status {
    Status::unavailable(format!("{NOT_SENT}the connection closed ({error}); connect again"))
}

impl tower_service::Service<http::Request<Body>> for Connection {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Status>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.send.poll_ready(cx).map_err(|error| closed_before_sending(&error))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let response = self.send.try_send_request(request);
        Box::pin(async move {
            response.await.map_err(|mut failure| {
                if failure.take_message().is_some() {
                    closed_before_sending(failure.error())
                } else {
                    Status::from_error(Box::new(failure.into_error()))
                }
            })
        })
    }
}
