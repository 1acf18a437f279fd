//! Sessions on a node: opening, keepalives (one or a batch, folded into the leader's next
//! tick), closing and revoking, and whose a session is.

use super::{Node, unexpected};
use crate::client_clocks::ClientReading;
use crate::error::ServiceError;
use crate::renewals::Noted;
use openraft::ReadPolicy;
use picket_core::{Command, CommandError, Response, SessionId};
use picket_proto::MAX_KEEPALIVE_BATCH;
use std::time::Duration;

/// Whose a session is, for one principal ([`Node::ownership`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// The principal opened it.
    Owned,
    /// Another principal opened it, or it was opened without authentication.
    Foreign,
    /// No such session any more (or there never was one with this id).
    Ended,
    /// No session has this id yet; a later one may.
    NotYet,
}

/// How long a keepalive that reached the leader after its session's deadline waits for the
/// tick that decides whether the session survived.
const KEEPALIVE_CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);

impl Node {
    /// Opens a session; returns its id and TTL.
    ///
    /// # Errors
    /// A refusal (TTL out of range, too many sessions) or a cluster failure.
    pub async fn open_session(
        &self,
        ttl_ms: u64,
        lock_delay_ms: u64,
        owner: Option<String>,
    ) -> Result<(SessionId, u64), ServiceError> {
        match self.command(Command::OpenSession { ttl_ms, lock_delay_ms, owner }).await? {
            Response::SessionOpened { session, ttl_ms, .. } => Ok((session, ttl_ms)),
            other => Err(unexpected(&other)),
        }
    }

    /// Records a reading of a client's clock sent with a session's open by `principal`'s
    /// client, which arrived at `arrived_ms` of the node's clock source (see
    /// [`crate::client_clocks`]): a new client's first keepalive then pairs with it (2 s or
    /// more later, or for a provisional rate 500 ms or more later), where it had to wait for a
    /// later one. Only a leader records it, and only if nothing later of that clock was (see
    /// [`crate::client_clocks::ClientClocks::record_open`]); the session the reading came with
    /// is the principal's own, just opened.
    pub fn note_clock_reading(
        &self,
        principal: Option<&str>,
        reading: ClientReading,
        arrived_ms: f64,
    ) {
        if self.is_leader() {
            self.renewals.note_reading(&self.clock, principal, reading, arrived_ms);
        }
    }

    /// Keeps a session alive: it gets a full TTL from the next tick. No log entry is written
    /// for it; the leader batches keepalives into the tick that would otherwise expire them.
    /// Once answered, the session is not expired before a TTL from now by the leader's clock
    /// (see [`crate::renewals`]).
    ///
    /// The leader first confirms it still holds its leader lease, so a deposed leader never
    /// confirms a keepalive the new leader will not honour.
    ///
    /// # Errors
    /// [`CommandError::UnknownSession`] when the session is gone; cluster failures.
    pub async fn keep_alive(
        &self,
        session: SessionId,
        principal: Option<&str>,
        reading: Option<ClientReading>,
    ) -> Result<u64, ServiceError> {
        let ttls = self.keep_alive_many(&[session], principal, reading).await?;
        ttls.first().copied().flatten().ok_or(CommandError::UnknownSession { session }.into())
    }

    /// Keeps many sessions alive at once: one leadership check for all of them. Returns each
    /// session's TTL, or `None` for a session that does not exist. `reading` is the client's
    /// clock when it sent them, if it said: where it runs at another rate than the leader's,
    /// the sessions live their TTL by it (see [`crate::client_clocks`]).
    ///
    /// # Errors
    /// Cluster failures, or more sessions than [`MAX_KEEPALIVE_BATCH`].
    pub async fn keep_alive_many(
        &self,
        sessions: &[SessionId],
        principal: Option<&str>,
        reading: Option<ClientReading>,
    ) -> Result<Vec<Option<u64>>, ServiceError> {
        if sessions.len() > MAX_KEEPALIVE_BATCH {
            return Err(ServiceError::BadRequest(format!(
                "{} sessions in one keepalive; send at most {MAX_KEEPALIVE_BATCH}",
                sessions.len()
            )));
        }
        // A session `principal` did not open is, to it, a session that does not exist: never
        // renewed, answered as unknown, decided on the same reading as the lease.
        let leases = |sessions: &[SessionId]| {
            self.read_local(|state| {
                let machine = &state.machine;
                let visible = |session: SessionId| {
                    principal.is_none_or(|principal| {
                        machine.session_owner(session) == Some(Some(principal))
                    })
                };
                sessions
                    .iter()
                    .map(|session| machine.session_lease(*session).filter(|_| visible(*session)))
                    .collect()
            })
        };
        // Noted on arrival, so a tick taken while the lease check below waits carries it. A
        // node that does not lead notes nothing: it refuses them below, and what it noted would
        // pile up with session churn until it next leads (review of issue 21).
        let client_rate = if self.is_leader() {
            self.renewals.note_arrival(&self.clock, sessions, (principal, reading), leases)
        } else {
            None
        };
        self.ensure_leader(ReadPolicy::LeaseRead).await?;
        let noted = self.renewals.note(&self.clock, sessions, client_rate, leases);
        let wait_for = noted.iter().filter_map(|answer| match answer {
            Noted::AfterBatch(batch) => Some(*batch),
            Noted::Alive { .. } | Noted::Unknown => None,
        });
        if let Some(batch) = wait_for.max() {
            // A session past its deadline on the applied state is answered only once a tick that
            // carries its keepalive has been applied: the tick renews it if it was still alive by
            // the tick's reading, and expires it otherwise.
            tokio::time::timeout(KEEPALIVE_CONFIRM_TIMEOUT, self.renewals.wait_written(batch))
                .await
                .map_err(|_| {
                    ServiceError::Unavailable(format!(
                        "the keepalive reached the leader after its session's deadline and no \
                         tick confirmed it within {} ms: retry",
                        KEEPALIVE_CONFIRM_TIMEOUT.as_millis()
                    ))
                })?;
        }
        let now_leases = leases(sessions);
        Ok(noted
            .iter()
            .zip(now_leases)
            .map(|(answer, lease)| match answer {
                Noted::Alive { ttl_ms } => Some(*ttl_ms),
                Noted::AfterBatch(_) => lease.map(|lease| lease.ttl_ms),
                Noted::Unknown => None,
            })
            .collect())
    }

    /// Closes a session at its client's request.
    ///
    /// # Errors
    /// [`CommandError::UnknownSession`]; cluster failures.
    pub async fn close_session(
        &self,
        session: SessionId,
        principal: Option<&str>,
    ) -> Result<(), ServiceError> {
        self.command_as(principal, Command::CloseSession { session }).await.map(|_| ())
    }

    /// Ends a session as an expiry would, at an operator's request.
    ///
    /// # Errors
    /// [`CommandError::UnknownSession`]; cluster failures.
    pub async fn revoke_session(&self, session: SessionId) -> Result<(), ServiceError> {
        self.command(Command::RevokeSession { session }).await.map(|_| ())
    }

    /// Revokes every session whose owner `known` does not name (a principal removed from the
    /// auth file): its keepalives are refused from then on, but the locks it holds would stay
    /// its own until its TTL ran out, and the TTL can be long. Only a leader that settled its
    /// term does it (any node may, but one is enough); returns how many it revoked.
    pub async fn revoke_sessions_of_removed_principals(
        &self,
        known: impl Fn(&str) -> bool,
    ) -> usize {
        if self.settled_term().is_none() {
            return 0;
        }
        let mut removed = Vec::new();
        let mut after = None;
        loop {
            let page = self.read_local(|state| state.machine.sessions(after, usize::MAX));
            let Some(last) = page.last() else { break };
            after = Some(last.session);
            removed.extend(page.into_iter().filter_map(|info| {
                let owner = info.owner?;
                (!known(&owner)).then_some((info.session, owner))
            }));
        }
        let mut revoked = 0;
        for (session, owner) in removed {
            match self.revoke_session(session).await {
                Ok(()) => {
                    revoked += 1;
                    tracing::warn!(
                        target: crate::auth::AUDIT,
                        session = session.0,
                        principal = owner,
                        "revoked a session of a principal removed from the auth file"
                    );
                }
                // Ended meanwhile.
                Err(ServiceError::Command(CommandError::UnknownSession { .. })) => {}
                Err(error) => {
                    tracing::warn!(%error, session = session.0, "cannot revoke a session of a removed principal; it ends with its TTL");
                }
            }
        }
        revoked
    }

    /// Whose `session` is, for `principal`, as this node's applied state has it. A session's
    /// owner never changes, so any replica that knows the session knows its owner; and session
    /// ids are revisions, never reused, so an unknown id at or below the applied revision is
    /// no session any more, while one above it may yet become anyone's.
    #[must_use]
    pub fn ownership(&self, session: SessionId, principal: &str) -> Ownership {
        self.read_local(|state| match state.machine.session_owner(session) {
            Some(owner) if owner == Some(principal) => Ownership::Owned,
            Some(_) => Ownership::Foreign,
            None if session.0 <= state.machine.revision() => Ownership::Ended,
            None => Ownership::NotYet,
        })
    }
}
