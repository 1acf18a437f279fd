//! The connection a node hands abandons to its leader on, kept from one hand-over to the next.
//!
//! A leader that is deposed with acquires in flight hands an abandon of each to the new leader
//! when its caller goes away (`AcquireGuard`), and retries each for up to 30 s. Each used to
//! open a connection of its own, so a failover with thousands of waiters opened thousands of
//! connections to the new leader at once, past its peer port's bound (`--max-peer-connections`,
//! 256), where replication and votes need places too. They now share one connection, which
//! multiplexes them (as many at once as the leader allows on one connection; the rest wait for
//! a place). A connection is dropped after a failure that is not an answer of the node's own,
//! or that refuses this node's credentials (the next hand-over opens a new one, under the TLS
//! files in force then), and an attempt that is not
//! answered within [`ATTEMPT_TIMEOUT`] counts as a failure, so a connection to a host gone
//! silent does not hold every retry; a connection that could not be opened is tried again at
//! most once per [`RECONNECT_PAUSE`].

use crate::error::ServiceError;
use picket_core::{CommandError, ErrorCode, RequestId, SessionId};
use picket_proto::connection::Connection;
use picket_proto::tls::ClientTls;
use tokio::time::Instant;

/// How long a connection to the leader may take to open.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// The largest message the connection sends: an abandon is far below it.
const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// How long one hand-over may wait for the leader's answer (an abandon is one log entry).
const ATTEMPT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
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
    /// The kept connection, and its number among those this link opened.
    connection: Option<(Connection, u64)>,
    /// How many connections this link opened.
    opened: u64,
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
        let (connection, number) = self.connection(addr, tls).await?;
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
        let answer = tokio::time::timeout(ATTEMPT_TIMEOUT, client.abandon(message)).await;
        let status = match answer {
            Ok(Ok(response)) => return Ok(response.into_inner().released_token),
            Ok(Err(status)) => status,
            Err(_) => {
                tonic::Status::deadline_exceeded(format!("no answer within {ATTEMPT_TIMEOUT:?}"))
            }
        };
        let code = error_code(&status);
        // Any answer with a code is the node's own, over a working connection, except one
        // about who this node is: its certificate may no longer be a member's (the peer CA
        // rotated), and a new connection presents the TLS files in force now. No code: the
        // connection may be broken, or the host gone silent. The next hand-over opens anew.
        let keep = code.is_some_and(|code| {
            !matches!(code, ErrorCode::Unauthenticated | ErrorCode::PermissionDenied)
        });
        if !keep {
            self.forget(number).await;
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

    /// The kept connection to `addr` while it is open, with its number; otherwise a new one,
    /// unless opening one failed less than [`RECONNECT_PAUSE`] ago. The lock is held while a
    /// connection opens (at most [`CONNECT_TIMEOUT`]), so that hand-overs waiting meanwhile
    /// share it rather than each open one.
    async fn connection(
        &self,
        addr: &str,
        tls: Option<&ClientTls>,
    ) -> Result<(Connection, u64), ServiceError> {
        let mut kept = self.kept.lock().await;
        if kept.addr != addr {
            kept.addr = addr.to_owned();
            kept.connection = None;
            kept.failed_at = None;
        }
        if let Some((connection, number)) = kept.connection.as_ref()
            && !connection.is_closed()
        {
            return Ok((connection.clone(), *number));
        }
        if kept.failed_at.is_some_and(|failed| failed.elapsed() < RECONNECT_PAUSE) {
            return Err(ServiceError::Unavailable(format!(
                "the leader at {addr} could not be reached a moment ago"
            )));
        }
        match Connection::open(addr, CONNECT_TIMEOUT, MAX_MESSAGE_BYTES, tls).await {
            Ok(connection) => {
                kept.opened += 1;
                let number = kept.opened;
                kept.connection = Some((connection.clone(), number));
                kept.failed_at = None;
                Ok((connection, number))
            }
            Err(status) => {
                kept.connection = None;
                kept.failed_at = Some(Instant::now());
                Err(ServiceError::Unavailable(format!("leader at {addr}: {}", status.message())))
            }
        }
    }

    /// Drops the kept connection if it is still connection `number`: one opened since, after
    /// another hand-over's failure, stays.
    async fn forget(&self, number: u64) {
        let mut kept = self.kept.lock().await;
        if kept.connection.as_ref().is_some_and(|(_, kept_number)| *kept_number == number) {
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

    /// A loopback proxy to `to` that counts the connections it accepts, and passes nothing on
    /// while `frozen` is set (a host gone silent).
    struct Proxy {
        addr: String,
        accepted: Arc<AtomicUsize>,
        frozen: Arc<std::sync::atomic::AtomicBool>,
    }

    async fn one_way(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        frozen: Arc<std::sync::atomic::AtomicBool>,
    ) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut buffer = vec![0_u8; 16 * 1024];
        while let Ok(read) = from.read(&mut buffer).await {
            if read == 0 {
                return;
            }
            while frozen.load(Ordering::SeqCst) {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            if to.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    }

    async fn proxy(to: std::net::SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (counted, freezing) = (accepted.clone(), frozen.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let outbound = tokio::net::TcpStream::connect(to).await.unwrap();
                let (inbound_read, inbound_write) = inbound.into_split();
                let (outbound_read, outbound_write) = outbound.into_split();
                tokio::spawn(one_way(inbound_read, outbound_write, freezing.clone()));
                tokio::spawn(one_way(outbound_read, inbound_write, freezing.clone()));
            }
        });
        Proxy { addr, accepted, frozen }
    }

    fn unknown_session(answered: &Result<Option<u64>, ServiceError>) -> bool {
        matches!(answered, Err(ServiceError::Command(CommandError::UnknownSession { .. })))
    }

    /// Regression (hostile-input audit): each hand-over of an abandon opened a connection of
    /// its own, so a deposed leader with many acquires in flight opened as many connections
    /// to the new leader at once. Hand-overs now share one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hand_overs_share_one_connection_to_the_leader() {
        let dir = tempfile::tempdir().unwrap();
        let handle = super::super::ready_single_node(dir.path()).await;
        let proxy = proxy(handle.addr()).await;
        let link = Arc::new(LeaderLink::default());
        let hand_overs: Vec<_> = (0..64_u64)
            .map(|n| {
                let (link, addr) = (link.clone(), proxy.addr.clone());
                tokio::spawn(async move {
                    let to = (addr.as_str(), None, None);
                    link.abandon(to, SessionId(1_000 + n), "l", (RequestId(n + 1), 0)).await
                })
            })
            .collect();
        for hand_over in hand_overs {
            // Each reached the leader, which knows no such session.
            let answered = hand_over.await.unwrap();
            assert!(unknown_session(&answered), "{answered:?}");
        }
        assert_eq!(proxy.accepted.load(Ordering::SeqCst), 1, "one connection for all of them");
        handle.shutdown().await;
    }

    /// Found in review: a kept connection to a host gone silent (no reset, so not closed) held
    /// each retry until the whole 30 s were spent, where a fresh connection per attempt had
    /// failed fast and moved on. An attempt not answered in time now fails, and the next one
    /// opens a new connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_attempt_not_answered_in_time_fails_and_the_next_reconnects() {
        let dir = tempfile::tempdir().unwrap();
        let handle = super::super::ready_single_node(dir.path()).await;
        let proxy = proxy(handle.addr()).await;
        let link = LeaderLink::default();
        let to = (proxy.addr.as_str(), None, None);
        let first = link.abandon(to, SessionId(7), "l", (RequestId(1), 0)).await;
        assert!(unknown_session(&first), "{first:?}");

        proxy.frozen.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let silent = link.abandon(to, SessionId(7), "l", (RequestId(1), 0)).await;
        let Err(ServiceError::Unavailable(message)) = &silent else { panic!("{silent:?}") };
        assert!(message.contains("no answer within"), "{message}");
        assert!(started.elapsed() < ATTEMPT_TIMEOUT * 2, "{:?}", started.elapsed());

        proxy.frozen.store(false, Ordering::SeqCst);
        let again = link.abandon(to, SessionId(7), "l", (RequestId(1), 0)).await;
        assert!(unknown_session(&again), "{again:?}");
        assert_eq!(proxy.accepted.load(Ordering::SeqCst), 2, "a new connection after the silence");
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
