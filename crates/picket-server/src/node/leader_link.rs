//! The connection a node hands abandons to its leader on, kept from one hand-over to the next.
//!
//! A leader that is deposed with acquires in flight hands an abandon of each to the new leader
//! when its caller goes away (`AcquireGuard`), and retries each for up to 30 s. Each used to
//! open a connection of its own, so a failover with thousands of waiters opened thousands of
//! connections to the new leader at once, past its peer port's bound (`--max-peer-connections`,
//! 256), where replication and votes need places too. They now share one connection, which
//! multiplexes them (as many at once as the leader's wire protocol allows; the rest wait for a
//! place), and a connection that failed is opened again at most once per
//! [`RECONNECT_PAUSE`].

use crate::error::ServiceError;
use picket_core::{CommandError, ErrorCode, RequestId, SessionId};
use picket_proto::connection::Connection;
use picket_proto::tls::ClientTls;
use tokio::time::Instant;

/// How long a connection to the leader may take to open.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// The largest message the connection sends: an abandon is far below it.
const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// How long after failing to reach an address the link refuses at once rather than try again,
/// so that many hand-overs to a leader that cannot be reached do not each wait for a connect.
const RECONNECT_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

/// The connection to the leader this node last handed an abandon to.
#[derive(Debug, Default)]
pub(crate) struct LeaderLink {
    /// Held while a connection is opened, so that hand-overs waiting meanwhile take it.
    kept: tokio::sync::Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    /// The address `connection` and `failed_at` are of.
    addr: String,
    connection: Option<Connection>,
    /// When opening a connection to `addr` last failed.
    failed_at: Option<Instant>,
}

/// Where an abandon goes: the leader's peer address, TLS for it when the cluster runs TLS, and
/// the cluster id this node holds, if any.
pub(super) type Destination<'a> = (&'a str, Option<&'a ClientTls>, Option<&'a str>);

impl LeaderLink {
    /// Sends an abandon to the node at `addr` (the leader, as this node believes), telling it
    /// the cluster id this node holds, if any (a node of another cluster refuses it: session
    /// ids of two clusters can coincide).
    pub(super) async fn abandon(
        &self,
        (addr, tls, cluster_id): Destination<'_>,
        session: SessionId,
        name: &str,
        (request, attempt): (RequestId, u32),
    ) -> Result<Option<u64>, ServiceError> {
        use picket_proto::v1::raft_client::RaftClient;
        let connection = self.connection(addr, tls).await?;
        let origin = connection.origin();
        let mut client = RaftClient::with_origin(connection, origin);
        let message = picket_proto::v1::AbandonRequest {
            name: name.to_owned(),
            session_id: session.0,
            request_id: request.0,
            attempt,
        };
        let mut message = tonic::Request::new(message);
        if let Some(value) = cluster_id.and_then(|cluster_id| cluster_id.parse().ok()) {
            message.metadata_mut().insert(crate::network::CLUSTER_KEY, value);
        }
        let status = match client.abandon(message).await {
            Ok(response) => return Ok(response.into_inner().released_token),
            Err(status) => status,
        };
        let code = error_code(&status);
        if code.is_none() {
            // No answer of the leader's own: the connection may be broken, or the leader gone
            // from under it. The next hand-over opens a new one.
            self.forget(addr).await;
        }
        match code {
            // A leader of an earlier build refuses an abandon that finds nothing.
            Some(ErrorCode::NothingToAbandon) => Ok(None),
            Some(ErrorCode::UnknownSession) => {
                Err(ServiceError::Command(CommandError::UnknownSession { session }))
            }
            Some(ErrorCode::NotLeader) => {
                Err(ServiceError::NotLeader { leader_id: None, leader_addr: None })
            }
            _ => Err(ServiceError::Unavailable(format!("leader at {addr}: {}", status.message()))),
        }
    }

    /// The kept connection to `addr` while it is open; otherwise a new one, unless opening one
    /// failed less than [`RECONNECT_PAUSE`] ago.
    async fn connection(
        &self,
        addr: &str,
        tls: Option<&ClientTls>,
    ) -> Result<Connection, ServiceError> {
        let mut kept = self.kept.lock().await;
        if kept.addr != addr {
            *kept = Kept { addr: addr.to_owned(), ..Kept::default() };
        }
        if let Some(connection) = kept.connection.as_ref().filter(|open| !open.is_closed()) {
            return Ok(connection.clone());
        }
        if kept.failed_at.is_some_and(|failed| failed.elapsed() < RECONNECT_PAUSE) {
            return Err(ServiceError::Unavailable(format!(
                "the leader at {addr} could not be reached a moment ago"
            )));
        }
        match Connection::open(addr, CONNECT_TIMEOUT, MAX_MESSAGE_BYTES, tls).await {
            Ok(connection) => {
                kept.connection = Some(connection.clone());
                kept.failed_at = None;
                Ok(connection)
            }
            Err(status) => {
                kept.connection = None;
                kept.failed_at = Some(Instant::now());
                Err(ServiceError::Unavailable(format!("leader at {addr}: {}", status.message())))
            }
        }
    }

    /// Drops the kept connection to `addr`, if it is the one kept.
    async fn forget(&self, addr: &str) {
        let mut kept = self.kept.lock().await;
        if kept.addr == addr {
            kept.connection = None;
        }
    }
}

/// The stable error code a peer put in a refusal's metadata, if any this build knows.
fn error_code(status: &tonic::Status) -> Option<ErrorCode> {
    status
        .metadata()
        .get(picket_proto::ERROR_CODE_KEY)
        .and_then(|value| value.to_str().ok())
        .and_then(ErrorCode::from_wire)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A loopback proxy to `to` that counts the connections it accepts; dropping the returned
    /// handle's task closes them all.
    async fn counting_proxy(to: std::net::SocketAddr) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut outbound = tokio::net::TcpStream::connect(to).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        (addr, accepted)
    }

    /// Regression (hostile-input audit): each hand-over of an abandon opened a connection of
    /// its own, so a deposed leader with many acquires in flight opened as many connections
    /// to the new leader at once. Hand-overs now share one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hand_overs_share_one_connection_to_the_leader() {
        let dir = tempfile::tempdir().unwrap();
        let listen = "127.0.0.1:0".parse().unwrap();
        let config = crate::ServerConfig::single(dir.path().join("node"), listen);
        let handle = crate::start(config).await.unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        while handle.node().readiness().is_err() {
            assert!(Instant::now() < deadline, "the node did not become ready");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let (proxy, accepted) = counting_proxy(handle.addr()).await;
        let link = Arc::new(LeaderLink::default());
        let hand_overs: Vec<_> = (0..64_u64)
            .map(|n| {
                let (link, proxy) = (link.clone(), proxy.clone());
                tokio::spawn(async move {
                    let to = (proxy.as_str(), None, None);
                    link.abandon(to, SessionId(1_000 + n), "l", (RequestId(n + 1), 0)).await
                })
            })
            .collect();
        for hand_over in hand_overs {
            // Each reached the leader, which knows no such session.
            let answered = hand_over.await.unwrap();
            assert!(
                matches!(answered, Err(ServiceError::Command(CommandError::UnknownSession { .. }))),
                "{answered:?}"
            );
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection for all of them");
        handle.shutdown().await;
    }

    /// A leader that cannot be reached is tried once per pause, not once per hand-over.
    #[tokio::test]
    async fn an_unreachable_leader_is_not_dialled_again_at_once() {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = closed.local_addr().unwrap().to_string();
        drop(closed);
        let link = LeaderLink::default();
        let to = (addr.as_str(), None, None);
        let once = link.abandon(to, SessionId(1), "l", (RequestId(1), 0)).await;
        assert!(matches!(&once, Err(ServiceError::Unavailable(_))), "{once:?}");
        let again = link.abandon(to, SessionId(1), "l", (RequestId(1), 0)).await;
        let Err(ServiceError::Unavailable(message)) = again else { panic!("{again:?}") };
        assert!(message.contains("a moment ago"), "{message}");
    }
}
