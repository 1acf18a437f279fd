//! A node as one caller may use it: every operation first checks what the caller may do
//! ([`crate::auth`]), then runs on the node. Both APIs reach the node through this, so the rules
//! live in one place and no operation can skip them.

use crate::auth::{Access, AuthFile, Role};
use crate::client_clocks::ClientReading;
use crate::error::ServiceError;
use crate::node::{
    AcquireRequest, ClusterView, Grant, Node, Ownership, Recheck, WatchStream, Watched,
};
use crate::raft_types::NodeId;
use picket_core::{CheckOutcome, LockInfo, RequestId, Sequencer, SessionId, SessionInfo};
use std::sync::Arc;

/// A node and the caller of one request.
#[derive(Debug)]
pub struct Guarded<'a> {
    node: &'a Arc<Node>,
    access: Access,
}

impl Node {
    /// This node as `access` may use it.
    #[must_use]
    pub fn as_caller(self: &Arc<Self>, access: Access) -> Guarded<'_> {
        Guarded { node: self, access }
    }
}

impl Guarded<'_> {
    /// Refuses another principal's session early, with a sentence; the state machine checks
    /// again at apply, where nothing can slip in between.
    fn require_owner(&self, session: SessionId) -> Result<(), ServiceError> {
        self.access.require_owner(session.0, false, |name| self.node.ownership(session, name))
    }

    /// Like `require_owner`, and refuses an id no session has yet.
    fn require_watchable(&self, session: SessionId) -> Result<(), ServiceError> {
        self.access.require_owner(session.0, true, |name| self.node.ownership(session, name))
    }

    fn principal(&self) -> Option<&str> {
        self.access.acting_principal()
    }

    /// See [`Node::open_session`]; the session belongs to the caller.
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn open_session(
        &self,
        ttl_ms: u64,
        lock_delay_ms: u64,
        reading: Option<ClientReading>,
    ) -> Result<(SessionId, u64), ServiceError> {
        self.access.require_some_lock_role()?;
        let owner = self.access.owner().map(str::to_owned);
        // The reading is paired as of the open's arrival, as a keepalive's is: recorded as of
        // the open's commit, its interval to the next keepalive would be short by the commit's
        // time, and the client's clock would seem faster than it is.
        let arrived_ms = self.node.clock().source_ms();
        let opened = self.node.open_session(ttl_ms, lock_delay_ms, owner).await?;
        if let Some(reading) = reading {
            self.node.note_clock_reading(self.principal(), reading, arrived_ms);
        }
        Ok(opened)
    }

    /// See [`Node::keep_alive`].
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`] for another's session.
    pub async fn keep_alive(
        &self,
        session: SessionId,
        reading: Option<ClientReading>,
    ) -> Result<u64, ServiceError> {
        self.require_owner(session)?;
        self.node.keep_alive(session, self.principal(), reading).await
    }

    /// See [`Node::keep_alive_many`]; refused whole if any session is another's.
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn keep_alive_many(
        &self,
        sessions: &[SessionId],
        reading: Option<ClientReading>,
    ) -> Result<Vec<Option<u64>>, ServiceError> {
        for session in sessions {
            self.require_owner(*session)?;
        }
        self.node.keep_alive_many(sessions, self.principal(), reading).await
    }

    /// See [`Node::close_session`].
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`] for another's session.
    pub async fn close_session(&self, session: SessionId) -> Result<(), ServiceError> {
        self.require_owner(session)?;
        self.node.close_session(session, self.principal()).await
    }

    /// See [`Node::revoke_session`]: admins only.
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn revoke_session(&self, session: SessionId) -> Result<(), ServiceError> {
        self.access.require_admin(&format!("revoking session {session}"))?;
        self.node.revoke_session(session).await
    }

    /// See [`Node::sessions`]: an admin sees every session, a principal its own.
    ///
    /// # Errors
    /// As the node's.
    pub async fn sessions(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionInfo>, ServiceError> {
        let owner = if self.access.is_admin() { None } else { self.access.owner() };
        self.node.sessions(owner, after, limit).await
    }

    /// See [`Node::acquire`].
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn acquire(
        &self,
        session: SessionId,
        name: &str,
        asked: AcquireRequest,
    ) -> Result<Grant, ServiceError> {
        self.access.require(Role::Lock, name)?;
        self.require_owner(session)?;
        let asked = AcquireRequest { principal: self.principal().map(str::to_owned), ..asked };
        let acquiring = self.node.acquire(session, name, asked);
        let auth = match (&self.access, self.node.auth_file()) {
            (Access::Principal(..), Some(auth)) => auth.clone(),
            _ => return acquiring.await,
        };
        // A wait can outlast its caller's credential: a principal whose token is revoked, or
        // whose roles stop covering the lock, while it waits is refused then, and its request
        // is abandoned (dropping the acquire does that), so no lock goes to it afterwards.
        let mut reloads = auth.reloads();
        // Checks once at the start too: the file may have been reloaded since the caller was
        // authenticated.
        reloads.mark_changed();
        let access = self.access.clone();
        let revoked = async move {
            while reloads.changed().await.is_ok() {
                let still =
                    auth.reauthenticate(&access).and_then(|now| now.require(Role::Lock, name));
                if let Err(refusal) = still {
                    return refusal;
                }
            }
            std::future::pending().await
        };
        tokio::select! {
            granted = acquiring => granted,
            refusal = revoked => Err(refusal),
        }
    }

    /// See [`Node::abandon`].
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn abandon(
        &self,
        session: SessionId,
        name: &str,
        request: RequestId,
        attempt: u32,
    ) -> Result<Option<u64>, ServiceError> {
        self.access.require(Role::Lock, name)?;
        self.require_owner(session)?;
        self.node.abandon(session, name, request, attempt, self.principal()).await
    }

    /// See [`Node::release`].
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn release(
        &self,
        session: SessionId,
        name: &str,
        token: u64,
    ) -> Result<(), ServiceError> {
        self.access.require(Role::Lock, name)?;
        self.require_owner(session)?;
        self.node.release(session, name, token, self.principal()).await
    }

    /// See [`Node::cancel`].
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn cancel(&self, session: SessionId, name: &str) -> Result<(), ServiceError> {
        self.access.require(Role::Lock, name)?;
        self.require_owner(session)?;
        self.node.cancel(session, name, self.principal()).await
    }

    /// See [`Node::lock`].
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn lock(&self, name: &str) -> Result<LockInfo, ServiceError> {
        self.access.require(Role::Read, name)?;
        self.node.lock(name).await
    }

    /// See [`Node::lock_at`]: the caller must be able to read the lock.
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn lock_at(&self, name: &str) -> Result<(LockInfo, u64), ServiceError> {
        self.access.require(Role::Read, name)?;
        self.node.lock_at(name).await
    }

    /// See [`Node::locks`]: the caller must be able to read every lock under `prefix`.
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn locks(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<LockInfo>, ServiceError> {
        self.access.require_prefix(Role::Read, prefix)?;
        self.node.locks(prefix, after, limit).await
    }

    /// See [`Node::check`].
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn check(&self, sequencer: &str) -> Result<(CheckOutcome, u64), ServiceError> {
        // A sequencer that does not parse is refused by the node itself, and names no lock.
        if let Ok(parsed) = Sequencer::parse(sequencer) {
            self.access.require(Role::Read, &parsed.name)?;
        }
        self.node.check(sequencer).await
    }

    /// See [`Node::watch`]: a lock or prefix the caller may read, or sessions it opened.
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub fn watch(&self, target: Watched) -> Result<WatchStream, ServiceError> {
        // Once per session: each check below, and the recheck kept for the stream's life, costs
        // one per session named.
        let target = target.each_session_once();
        may_read_target(&self.access, &target)?;
        match &target {
            Watched::Lock(_) | Watched::Prefix(_) => {}
            Watched::Session(session) => self.require_watchable(*session)?,
            Watched::Sessions(sessions) | Watched::SessionLosses(sessions) => {
                for session in sessions {
                    self.require_watchable(*session)?;
                }
            }
        }
        let stream = self.node.watch(target)?;
        let auth = match (&self.access, self.node.auth_file()) {
            (Access::Principal(..), Some(auth)) => auth.clone(),
            _ => return Ok(stream),
        };
        // A principal whose credential is revoked, whose roles stop covering the target, or who
        // is no longer an admin watching another's session, sees nothing more on this stream.
        let access = self.access.clone();
        let node = self.node.clone();
        // It checks what the stream follows, kept once by the stream (not a copy of the
        // request's set, whose sessions that had ended the stream leaves out).
        let allowed = move |auth: &AuthFile, target: &Watched| {
            let access = auth.reauthenticate(&access)?;
            may_read_target(&access, target)?;
            for session in watched_sessions(target) {
                access.require_owner(session.0, false, |name| node.ownership(*session, name))?;
            }
            Ok(())
        };
        let recheck = Recheck::new(auth, Box::new(allowed), stream.target())?;
        Ok(stream.with_recheck(recheck))
    }

    /// The sequencer of a lock's holder as this caller may see it: signed for the principal
    /// that holds it and for admins; unsigned (`p1.`) for anyone else, who may read the lock but
    /// must not get a sequencer a resource that takes only signed ones would admit.
    #[must_use]
    pub fn holder_sequencer(&self, name: &str, token: u64, session: SessionId) -> String {
        let holds = match self.principal() {
            None => true,
            Some(principal) => self.node.ownership(session, principal) == Ownership::Owned,
        };
        if holds {
            self.node.sequencer(name, token, session)
        } else {
            Sequencer::new(name, token).to_string()
        }
    }

    /// See [`Node::cluster`]: any authenticated caller.
    #[must_use]
    pub fn cluster(&self) -> ClusterView {
        self.node.cluster()
    }

    /// See [`Node::backup`]: admins only.
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn backup(&self) -> Result<Vec<u8>, ServiceError> {
        self.access.require_admin("taking a backup")?;
        self.node.backup().await
    }

    /// See [`Node::add_member`]: admins only.
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn add_member(
        &self,
        node_id: NodeId,
        addr: String,
        peer_addr: Option<String>,
    ) -> Result<ClusterView, ServiceError> {
        self.access.require_admin(&format!("adding node {node_id} at {addr}"))?;
        self.node.add_member(node_id, addr, peer_addr).await
    }

    /// See [`Node::remove_member`]: admins only.
    ///
    /// # Errors
    /// As the node's, and [`ServiceError::PermissionDenied`].
    pub async fn remove_member(&self, node_id: NodeId) -> Result<ClusterView, ServiceError> {
        self.access.require_admin(&format!("removing node {node_id}"))?;
        self.node.remove_member(node_id).await
    }
}

/// Whether `access` may read what a watch of `target` shows: the lock, or every lock under the
/// prefix. Session watches show only the caller's own sessions, checked apart.
fn may_read_target(access: &Access, target: &Watched) -> Result<(), ServiceError> {
    match target {
        Watched::Lock(name) => access.require(Role::Read, name),
        Watched::Prefix(prefix) => access.require_prefix(Role::Read, prefix),
        Watched::Session(_) | Watched::Sessions(_) | Watched::SessionLosses(_) => Ok(()),
    }
}

/// The sessions a watch of `target` follows.
fn watched_sessions(target: &Watched) -> &[SessionId] {
    match target {
        Watched::Session(session) => std::slice::from_ref(session),
        Watched::Sessions(sessions) | Watched::SessionLosses(sessions) => sessions,
        Watched::Lock(_) | Watched::Prefix(_) => &[],
    }
}
