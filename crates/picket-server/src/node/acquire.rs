//! Acquiring on a node: the waiting acquire, its abandonment when its caller goes away,
//! releases and cancelled waits.

use super::{Node, unexpected};
use crate::error::ServiceError;
use crate::hub::WaiterRegistration;
use picket_core::{
    CancelCause, Command, CommandError, RequestId, Response, SessionId, Wait, WaitEnd,
};
use std::sync::Arc;

/// How an acquire asks: how long to wait, and which request (and attempt at it) this is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireRequest {
    /// Whether, and how long, to wait.
    pub wait: Wait,
    /// The request's id within the session; `None` for a fresh one. 0 is refused: it is what
    /// acquires logged before request ids existed read as.
    pub request: Option<RequestId>,
    /// 0 for the first attempt at the request, one more for each retry.
    pub attempt: u32,
    /// The principal sending it, when it must own the session (see
    /// [`picket_core::Input::principal`]).
    pub principal: Option<String>,
}

impl AcquireRequest {
    /// A new request (a fresh id, first attempt) that waits as `wait` says.
    #[must_use]
    pub fn new(wait: Wait) -> Self {
        Self { wait, request: None, attempt: 0, principal: None }
    }
}

/// How long the server keeps trying to abandon a request whose caller went away, across
/// leader changes, before it leaves the wait or grant to the session's end.
const ABANDON_RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// A lock grant as the APIs return it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The lock.
    pub name: String,
    /// Its token.
    pub token: u64,
    /// True when the session already held the lock.
    pub already_held: bool,
    /// Its sequencer, signed when the node has a signing key.
    pub sequencer: String,
}

impl Node {
    /// Acquires a lock, waiting as `wait` says, as `request` of the session (a fresh request id
    /// when the caller gives none; a retry must give the id of the request it retries).
    ///
    /// If the caller goes away before it has the answer (the returned future is dropped), or
    /// the answer is lost with the leadership, the request is abandoned: one `Abandon` command
    /// cancels its wait or releases the grant it produced, and nothing of any other request.
    /// A request this node refused before proposing it (not the leader) leaves nothing behind.
    ///
    /// # Errors
    /// [`CommandError::LockBusy`] for a try on a taken lock, [`ServiceError::WaitTimedOut`],
    /// [`ServiceError::WaitEnded`], refusals and cluster failures.
    pub async fn acquire(
        self: &Arc<Self>,
        session: SessionId,
        name: &str,
        asked: AcquireRequest,
    ) -> Result<Grant, ServiceError> {
        if asked.request == Some(RequestId(0)) {
            return Err(ServiceError::BadRequest(
                "request_id 0 is reserved: give a positive request id, or none for a fresh one"
                    .into(),
            ));
        }
        let AcquireRequest { wait, attempt, principal, .. } = asked;
        let request = asked.request.unwrap_or_else(fresh_request_id);
        let place = self.pending_acquires.take()?;
        let registration = self.hub().register_waiter(session, name, request);
        let mut guard = AcquireGuard {
            place: Some(place),
            node: self.clone(),
            session,
            name: name.to_owned(),
            request,
            attempt,
            registration: registration.id,
            settled: false,
        };
        let result = self
            .acquire_registered(session, name, wait, (request, attempt), registration, principal)
            .await;
        // Only an answer whose outcome is unknown leaves something to undo; a refusal, a
        // timeout and a grant are all known to the caller.
        guard.settled = !matches!(
            result,
            Err(ServiceError::Unavailable(_)
                | ServiceError::OutcomeUnknown(_)
                | ServiceError::Stopped(_)
                | ServiceError::WaitUntracked { .. })
        );
        result
    }

    async fn acquire_registered(
        &self,
        session: SessionId,
        name: &str,
        wait: Wait,
        (request, attempt): (RequestId, u32),
        registration: WaiterRegistration,
        principal: Option<String>,
    ) -> Result<Grant, ServiceError> {
        let arrived = std::time::Instant::now();
        let command = Command::Acquire { session, name: name.to_owned(), wait, request, attempt };
        let applied = self.propose_as(principal, command).await?;
        match applied.result? {
            Response::Granted { name, token, already_held } => {
                let sequencer = self.sequencer(&name, token, session);
                return Ok(Grant { name, token, already_held, sequencer });
            }
            Response::Queued { .. } => {}
            other => return Err(unexpected(&other)),
        }
        // Only what happens after this acquire was queued ends its wait.
        self.hub().queued(session, name, registration.id, applied.revision);
        match registration.outcome.await {
            Ok(WaitEnd::Granted { token }) => {
                self.metrics().acquire_waited(arrived.elapsed());
                let sequencer = self.sequencer(name, token, session);
                Ok(Grant { name: name.to_owned(), token, already_held: false, sequencer })
            }
            Ok(WaitEnd::Cancelled { cause: CancelCause::TimedOut }) => {
                Err(ServiceError::WaitTimedOut {
                    name: name.to_owned(),
                    holder_token: self.read_local(|state| {
                        state
                            .machine
                            .lock(name)
                            .and_then(|lock| lock.holder)
                            .map(|holder| holder.token)
                    }),
                })
            }
            Ok(WaitEnd::Cancelled { cause }) => {
                Err(ServiceError::WaitEnded { name: name.to_owned(), cause })
            }
            // An ending of a newer core than this shell knows, or the hub gone: either way this
            // request cannot say how its wait ended.
            Ok(_) | Err(_) => Err(ServiceError::WaitUntracked { name: name.to_owned() }),
        }
    }

    /// Undoes attempt `attempt` of acquire `request` on this node (it must lead): cancels its
    /// wait or releases the grant it produced; returns the released grant's token, `None` when
    /// a wait was cancelled.
    ///
    /// An abandon that finds nothing (the request was refused, released, or a later attempt of
    /// it reached its wait or grant) still succeeds: the request is remembered as abandoned, so
    /// an attempt of it that arrives later is refused.
    ///
    /// # Errors
    /// Cluster failures, and an unknown session.
    pub async fn abandon(
        &self,
        session: SessionId,
        name: &str,
        request: RequestId,
        attempt: u32,
        principal: Option<&str>,
    ) -> Result<Option<u64>, ServiceError> {
        let command = Command::Abandon { session, name: name.to_owned(), request, attempt };
        match self.command_as(principal, command).await? {
            Response::Abandoned { released_token, .. } => Ok(released_token),
            other => Err(unexpected(&other)),
        }
    }

    /// Abandons a request wherever the leader is: here, or forwarded to the leader this node
    /// names, retried across leader changes for [`ABANDON_RETRY_FOR`] in all, every attempt
    /// included. Returns what the abandon did, or the last failure.
    async fn abandon_on_leader(
        &self,
        session: SessionId,
        name: &str,
        (request, attempt): (RequestId, u32),
    ) -> Result<Option<u64>, ServiceError> {
        let deadline = tokio::time::Instant::now() + ABANDON_RETRY_FOR;
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            // An attempt on a leader that cannot commit would wait for as long as it cannot;
            // the deadline bounds each attempt, not only the retries between them.
            let attempt_once = self.abandon_once(session, name, (request, attempt));
            let result =
                tokio::time::timeout_at(deadline, attempt_once).await.unwrap_or_else(|_| {
                    Err(ServiceError::OutcomeUnknown(format!(
                        "the abandon was not committed within {ABANDON_RETRY_FOR:?}"
                    )))
                });
            let retry = matches!(
                result,
                Err(ServiceError::NotLeader { .. }
                    | ServiceError::Unavailable(_)
                    | ServiceError::OutcomeUnknown(_))
            );
            if !retry || tokio::time::Instant::now() + pause > deadline {
                return result;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(1));
        }
    }

    /// One attempt of [`Node::abandon_on_leader`]: here, or handed to the leader this node
    /// names.
    async fn abandon_once(
        &self,
        session: SessionId,
        name: &str,
        (request, attempt): (RequestId, u32),
    ) -> Result<Option<u64>, ServiceError> {
        match self.abandon(session, name, request, attempt, None).await {
            Err(ServiceError::NotLeader { leader_id: Some(leader), .. }) => {
                // The hand-over is a peer RPC: it goes to the leader's peer address, which is
                // its client address only when it has no peer port.
                match self.peer_addr_of(leader) {
                    Some(addr) => {
                        let (to_peers, cluster_id) = (self.to_peers(), self.cluster_id());
                        let to = (addr.as_str(), to_peers, cluster_id.as_deref());
                        self.leader_link.abandon(to, session, name, (request, attempt)).await
                    }
                    None => Err(ServiceError::Unavailable(format!(
                        "the leader, node {leader}, is not in this node's membership yet"
                    ))),
                }
            }
            other => other,
        }
    }

    /// Releases a grant.
    ///
    /// # Errors
    /// [`CommandError::NotHeld`] or [`CommandError::TokenMismatch`]; cluster failures.
    pub async fn release(
        &self,
        session: SessionId,
        name: &str,
        token: u64,
        principal: Option<&str>,
    ) -> Result<(), ServiceError> {
        let command = Command::Release { session, name: name.to_owned(), token };
        self.command_as(principal, command).await.map(|_| ())
    }

    /// Leaves a lock's queue.
    ///
    /// # Errors
    /// [`CommandError::NotWaiting`]; cluster failures.
    pub async fn cancel(
        &self,
        session: SessionId,
        name: &str,
        principal: Option<&str>,
    ) -> Result<(), ServiceError> {
        self.command_as(principal, Command::Cancel { session, name: name.to_owned() })
            .await
            .map(|_| ())
    }
}

/// A fresh request id for a caller that gave none: random, so it collides with no other
/// request of the session in practice. Randomness is fine here, in the shell: the id enters
/// the log inside the command, and replicas only ever read it from there.
fn fresh_request_id() -> RequestId {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    RequestId(hasher.finish())
}

/// Undoes an acquire whose caller went away, or whose answer was lost, before it was settled.
struct AcquireGuard {
    /// The request's place under `--max-pending-acquires`, given back when it is answered, or,
    /// when its caller went away first, once its abandonment ends: a caller that gives up at
    /// once and asks again cannot pile abandonments up past the bound.
    place: Option<tokio::sync::OwnedSemaphorePermit>,
    node: Arc<Node>,
    session: SessionId,
    name: String,
    request: RequestId,
    attempt: u32,
    registration: u64,
    settled: bool,
}

impl Drop for AcquireGuard {
    fn drop(&mut self) {
        let retried = self.node.hub().forget_waiter(
            self.session,
            &self.name,
            self.request,
            self.registration,
        );
        // A retry of the same request, waiting on this node, now speaks for it.
        if self.settled || retried {
            return;
        }
        let (node, session) = (self.node.clone(), self.session);
        let name = std::mem::take(&mut self.name);
        let (request, attempt) = (self.request, self.attempt);
        let place = self.place.take();
        // Drop cannot wait; the abandon runs on its own, on whichever node leads.
        tokio::spawn(async move {
            let _place = place;
            match node.abandon_on_leader(session, &name, (request, attempt)).await {
                Ok(Some(token)) => {
                    tracing::info!(%session, name, token, %request, attempt, "released a grant whose caller went away");
                }
                Ok(None) | Err(ServiceError::Command(CommandError::UnknownSession { .. })) => {}
                Err(error) => {
                    tracing::warn!(%session, name, %request, attempt, %error, "could not abandon an acquire whose caller went away; its wait or grant may stay until the session ends");
                }
            }
        });
    }
}
