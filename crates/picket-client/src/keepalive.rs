//! Keepalives of all of a client's sessions, batched: every keepalive due within a couple of
//! milliseconds shares one `KeepAliveMany` call.

use crate::error::{ClientError, ErrorCode};
use crate::lease_clock;
use crate::transport::{Retry, Transport, WeakTransport};
use picket_proto::MAX_KEEPALIVE_BATCH;
use picket_proto::v1;
use std::time::Duration;
use tokio::sync::{OnceCell, mpsc, oneshot};

/// One session's keepalive waiting to join a batch.
type Job = (u64, oneshot::Sender<Result<u64, ClientError>>);

/// How long the batcher waits for more keepalives to join a batch.
const LINGER: Duration = Duration::from_millis(2);

/// The batcher of one client's keepalives, started on first use.
#[derive(Debug, Default)]
pub(crate) struct KeepAlives {
    jobs: OnceCell<mpsc::Sender<Job>>,
}

impl KeepAlives {
    /// Keeps `session_id` alive, sharing one RPC with every other session whose keepalive is
    /// due within the same couple of milliseconds. Returns the session's TTL.
    pub(crate) async fn keep_alive(
        &self,
        transport: &Transport,
        session_id: u64,
    ) -> Result<u64, ClientError> {
        let jobs = self
            .jobs
            .get_or_init(|| async {
                let (sender, receiver) = mpsc::channel(MAX_KEEPALIVE_BATCH);
                tokio::spawn(run_batcher(transport.downgrade(), receiver));
                sender
            })
            .await;
        let (reply, answer) = oneshot::channel();
        jobs.send((session_id, reply)).await.map_err(|_| batcher_gone())?;
        answer.await.map_err(|_| batcher_gone())?
    }
}

fn batcher_gone() -> ClientError {
    ClientError::OutcomeUnknown("the client's keepalive task stopped".into())
}

/// Collects keepalives for a moment and sends them as one `KeepAliveMany` call. Holds the
/// connections only weakly: it stops when every sender is gone, or every transport.
async fn run_batcher(transport: WeakTransport, mut jobs: mpsc::Receiver<Job>) {
    while let Some(first) = jobs.recv().await {
        let mut batch = vec![first];
        let linger = tokio::time::sleep(LINGER);
        tokio::pin!(linger);
        while batch.len() < MAX_KEEPALIVE_BATCH {
            tokio::select! {
                () = &mut linger => break,
                job = jobs.recv() => match job {
                    Some(job) => batch.push(job),
                    None => break,
                },
            }
        }
        let Some(transport) = transport.upgrade() else { return };
        let ids: Vec<u64> = batch.iter().map(|(id, _)| *id).collect();
        let timeout = Some(transport.config().request_timeout);
        let result = transport
            .call(Retry::Safe, timeout, |connection| {
                let request = v1::KeepAliveManyRequest {
                    session_ids: ids.clone(),
                    clock_id: lease_clock::clock_id(),
                    clock_ms: lease_clock::now().as_secs_f64() * 1_000.0,
                };
                async move { connection.keep_alive_many(request).await }
            })
            .await;
        drop(transport);
        match result {
            Ok(response) => {
                for ((session, reply), ttl_ms) in batch.into_iter().zip(response.ttl_ms) {
                    let answer = if ttl_ms == 0 {
                        Err(ClientError::Service {
                            code: ErrorCode::UnknownSession,
                            message: format!(
                                "session {session} does not exist (it expired or was closed): open a new session"
                            ),
                            holder_token: None,
                        })
                    } else {
                        Ok(ttl_ms)
                    };
                    let _ = reply.send(answer);
                }
            }
            Err(error) => {
                for (_, reply) in batch {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }
}
