//! A held lock, and fence on acquire.

use crate::error::{ClientError, ErrorCode, LostReason};
use crate::state::{LostSender, SessionState};
use crate::transport::released_elsewhere;
use picket_core::Sequencer;
use std::sync::Arc;

/// Something a new holder should register its token with right after acquiring, before it
/// reads: a fenced resource (SPEC §2, fence on acquire). Registration makes the resource refuse
/// the previous holder's writes at once, instead of only after the new holder's first write.
pub trait FenceRegistration: Send + Sync {
    /// Registers `sequencer` as the newest grant. An error aborts the acquire (the lock is
    /// released) because the resource would not be protected.
    fn register(
        &self,
        sequencer: &Sequencer,
    ) -> futures_util::future::BoxFuture<'_, Result<(), RegistrationError>>;
}

/// Why a fenced resource did not take a new grant's registration.
#[derive(Debug, thiserror::Error)]
#[error("{resource} did not take the registration: {cause}")]
pub struct RegistrationError {
    /// The resource, as its user names it (a URL, a table).
    pub resource: String,
    /// What went wrong: the resource refused, or could not be reached.
    pub cause: Box<dyn std::error::Error + Send + Sync>,
}

/// A held lock. Exposes the grant's token and sequencer, and [`Guard::lost`], which fires when
/// the grant is known to be gone. Dropping the guard releases the lock in the background;
/// [`Guard::release`] does it now and reports errors.
#[derive(Debug)]
pub struct Guard {
    pub(crate) shared: Arc<SessionState>,
    pub(crate) name: String,
    pub(crate) token: u64,
    pub(crate) sequencer: Sequencer,
    pub(crate) lost: LostSender,
    pub(crate) released: bool,
}

impl Guard {
    /// The lock's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The grant's fencing token.
    #[must_use]
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The grant's sequencer: token and lock in one string for headers and environments.
    #[must_use]
    pub fn sequencer(&self) -> &Sequencer {
        &self.sequencer
    }

    /// Why the grant is lost, if it is. Checks the session's lease on the lease clock, so right
    /// after the machine wakes from a suspension longer than the lease, the grant is lost.
    #[must_use]
    pub fn lost_reason(&self) -> Option<LostReason> {
        // Marks the session (and so this grant) lost if its lease ran out.
        let _ = self.shared.lost_reason();
        *self.lost.borrow()
    }

    /// Resolves when the grant is lost: its session is lost, or the grant ended without this
    /// guard releasing it.
    pub async fn lost(&self) -> LostReason {
        let mut receiver = self.lost.subscribe();
        let reason = receiver.wait_for(Option::is_some).await.map(|reason| *reason);
        reason.ok().flatten().unwrap_or(LostReason::Closed)
    }

    /// Registers this grant with every fenced resource in `fences`, in order, and returns it
    /// (fence on acquire, SPEC §2): each resource refuses the previous holder's writes from then
    /// on, not only after this holder's first write. Call it right after acquiring, before
    /// reading the resource.
    ///
    /// # Errors
    /// `fence_registration_failed` when a resource did not take it. The lock is then released,
    /// because that resource would still accept the previous holder.
    pub async fn fenced(self, fences: &[&dyn FenceRegistration]) -> Result<Self, ClientError> {
        for fence in fences {
            if let Err(error) = fence.register(self.sequencer()).await {
                let _ = self.release().await;
                return Err(ClientError::Service {
                    code: ErrorCode::FenceRegistrationFailed,
                    message: format!("{error}; the lock was released"),
                    holder_token: None,
                });
            }
        }
        Ok(self)
    }

    /// Releases the lock now, and says whether this release ended the grant or it had ended
    /// before (see [`Released`]).
    ///
    /// # Errors
    /// `token_mismatch`; the cluster being unreachable. A grant that already ended is not an
    /// error: there is nothing left to release.
    pub async fn release(mut self) -> Result<Released, ClientError> {
        let released = release(&self.shared, &self.name, self.token, &self.lost).await;
        // Marked only once the release is over: a caller that gives up on it (drops this
        // future, say by a timeout) drops the guard with it, whose drop then releases in the
        // background. Marked before, the grant stayed with the session while it lived, and no
        // guard knew of it (a ghost holder).
        self.released = true;
        released
    }
}

/// How a release ended, when it succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// This release ended the grant: the lock was held under its token until then.
    Now,
    /// The grant had already ended when the release arrived (its session expired or was
    /// revoked, it was abandoned, or an earlier attempt of this release, whose answer was lost,
    /// ended it): whatever was written under it after that point may have been refused by
    /// fenced resources.
    Earlier,
}

/// Releases a guard's grant. A grant that already ended (the lock is free or held under another
/// token) needs no release: the guard's holding is over either way, so that is not an error.
///
/// Another guard of the same grant (an acquire of the same lock in the same session, answered
/// `already_held` while this release was on its way) loses its grant with this one: it is told
/// so, since the watch does not report a holder's own release as a loss.
async fn release(
    shared: &SessionState,
    name: &str,
    token: u64,
    signal: &LostSender,
) -> Result<Released, ClientError> {
    shared.unregister_grant(name, signal);
    let released = match shared.transport.release(shared.id, name, token).await {
        Err(error) if released_elsewhere(&error, token) => Ok(Released::Earlier),
        other => other,
    };
    if released.is_ok() {
        shared.grant_ended(name, token, LostReason::GrantEnded);
    }
    released
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // A grant known to have ended (or a lost session) needs no release; its signal goes.
        if self.shared.lost.borrow().is_some() || self.lost.borrow().is_some() {
            self.shared.unregister_grant(&self.name, &self.lost);
            return;
        }
        let (shared, name, token, signal) =
            (self.shared.clone(), std::mem::take(&mut self.name), self.token, self.lost.clone());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            shared.unregister_grant(&name, &signal);
            return;
        };
        {
            runtime.spawn(async move {
                if let Err(error) = release(&shared, &name, token, &signal).await {
                    tracing::warn!(%error, name, token, "releasing a dropped guard failed");
                }
            });
        }
    }
}

/// The sequencer the server issued for a grant (signed, when the cluster signs), or the
/// unsigned one from a server too old to send any. One that does not parse or does not match
/// the grant is a server fault: it is said, and the unsigned one is used.
pub(crate) fn grant_sequencer(name: &str, token: u64, issued: &str) -> Sequencer {
    if issued.is_empty() {
        return Sequencer::new(name, token);
    }
    match Sequencer::parse(issued) {
        Ok(sequencer) if sequencer.name == name && sequencer.token == token => sequencer,
        _ => {
            tracing::warn!(
                issued,
                name,
                token,
                "the server's sequencer does not match its grant; using an unsigned one"
            );
            Sequencer::new(name, token)
        }
    }
}
