//! Sessions kept alive in the background, and lock guards.

use crate::client::{Client, Retry};
use crate::error::ClientError;
use crate::lease_clock::{self, LeaseEnd};
use picket_core::Sequencer;
use picket_proto::v1;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Why a session (and with it every grant it held) is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The service expired it: it was not kept alive in time.
    Expired,
    /// An operator revoked it.
    Revoked,
    /// It was closed.
    Closed,
    /// The client could not confirm it within its TTL (the service may still count it alive,
    /// but nothing guarantees that any more).
    Unconfirmed,
    /// This one grant ended while the session lives on (released elsewhere).
    GrantEnded,
}

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

type LostSender = watch::Sender<Option<LostReason>>;

#[derive(Debug)]
pub(crate) struct Shared {
    client: Client,
    id: u64,
    ttl: Duration,
    lost: LostSender,
    /// When the lease runs out on the lease clock (which counts a suspension of the machine).
    lease_end: LeaseEnd,
    /// Grants held through this session: lock name to (token, lost signal).
    grants: Mutex<HashMap<String, (u64, Arc<LostSender>)>>,
    stop: watch::Sender<bool>,
}

impl Shared {
    /// Why the session is lost, if it is; a lease that ran out on the lease clock is lost now,
    /// even before the keepalive loop wakes up to notice (after a suspension, say).
    fn lost_reason(&self) -> Option<LostReason> {
        let known = *self.lost.borrow();
        if known.is_none() && self.lease_end.ran_out(lease_clock::now()) {
            self.mark_lost(LostReason::Unconfirmed);
            return Some(LostReason::Unconfirmed);
        }
        known
    }

    fn mark_lost(&self, reason: LostReason) {
        if let Some(watcher) = self.client.existing_session_watcher() {
            watcher.unregister(self.id);
        }
        if self.lost.borrow().is_none() {
            tracing::warn!(session = self.id, ?reason, "session lost");
            self.lost.send_replace(Some(reason));
        }
        let grants = self.grants.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, signal) in grants.values() {
            signal.send_if_modified(|current| {
                current.is_none() && {
                    *current = Some(reason);
                    true
                }
            });
        }
        self.stop.send_replace(true);
    }

    fn grant_ended(&self, name: &str, token: u64, reason: LostReason) {
        let grants = self.grants.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((held, signal)) = grants.get(name)
            && *held == token
        {
            signal.send_if_modified(|current| {
                current.is_none() && {
                    *current = Some(reason);
                    true
                }
            });
        }
    }
}

/// A session: a lease kept alive in the background at a third of its TTL.
///
/// [`Session::lost`] fires as soon as the session is known to be gone, or when the client
/// cannot confirm it before its TTL runs out, measured from the moment the last confirmed
/// keepalive was sent. Dropping the session stops the keepalive and closes it.
#[derive(Debug)]
pub struct Session {
    shared: Arc<Shared>,
}

impl Session {
    pub(crate) async fn open(
        client: Client,
        ttl: Duration,
        lock_delay: Duration,
    ) -> Result<Self, ClientError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let lock_delay_ms = u64::try_from(lock_delay.as_millis()).unwrap_or(u64::MAX);
        let opened_at = Instant::now();
        let opened_at_lease_clock = lease_clock::now();
        let timeout = Some(client.config().request_timeout);
        let opened = client
            .call(Retry::UnlessSent, timeout, |mut grpc| async move {
                grpc.open_session(v1::OpenSessionRequest { ttl_ms, lock_delay_ms }).await
            })
            .await?;
        let (lost, _) = watch::channel(None);
        let (stop, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            client,
            id: opened.session_id,
            ttl: Duration::from_millis(opened.ttl_ms),
            lost,
            lease_end: LeaseEnd::new(
                opened_at_lease_clock + lease_after_send(Duration::from_millis(opened.ttl_ms)),
            ),
            grants: Mutex::new(HashMap::new()),
            stop,
        });
        tokio::spawn(keep_alive(shared.clone(), opened_at));
        // Follow the session's events over the client's shared watch streams, and wait until a
        // stream covers it, so an end applied right after the open is not missed.
        let watcher = shared.client.session_watcher().await;
        let generation = watcher.register(shared.id, &shared);
        if !watcher.covered(generation, crate::watcher::COVER_TIMEOUT).await {
            tracing::debug!(
                session = shared.id,
                "no watch stream yet; the keepalive protects the session meanwhile"
            );
        }
        Ok(Self { shared })
    }

    /// The session's id.
    #[must_use]
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The session's TTL as granted.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// Why the session is lost, if it is.
    #[must_use]
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason()
    }

    /// How long the client still counts on the session if no further keepalive is confirmed:
    /// its lease (the TTL less the drift margin, from the last confirmed keepalive's sending)
    /// measured on the lease clock; zero once it ran out. A holder that must stop before the
    /// service may expire the session (a command, a batch) stops when this gets short.
    #[must_use]
    pub fn lease_remaining(&self) -> Duration {
        self.shared.lease_end.remaining(lease_clock::now())
    }

    /// Resolves when the session is lost, with the reason.
    pub async fn lost(&self) -> LostReason {
        let mut receiver = self.shared.lost.subscribe();
        let reason = receiver.wait_for(Option::is_some).await.map(|reason| *reason);
        reason.ok().flatten().unwrap_or(LostReason::Closed)
    }

    fn check_alive(&self) -> Result<(), ClientError> {
        match self.lost_reason() {
            Some(reason) => Err(ClientError::SessionLost(reason)),
            None => Ok(()),
        }
    }

    async fn acquire(&self, name: &str, wait_ms: Option<u64>) -> Result<Guard, ClientError> {
        self.check_alive()?;
        let session_id = self.shared.id;
        // A waiting acquire is not cut off by the request timeout: the server ends the wait.
        let request_timeout = self.shared.client.config().request_timeout;
        let timeout = wait_ms.map(|wait_ms| request_timeout + Duration::from_millis(wait_ms));
        // Every attempt carries the same request id, so a retry after a broken connection
        // joins the first attempt's wait or gets its grant: it is safe to retry.
        let request_id = Some(crate::client::fresh_request_id());
        let mut attempt = 0;
        let granted = self
            .shared
            .client
            .call(Retry::Safe, timeout, |mut grpc| {
                let request = v1::AcquireRequest {
                    name: name.to_owned(),
                    session_id,
                    wait_ms,
                    request_id,
                    attempt,
                };
                attempt += 1;
                async move { grpc.acquire(request).await }
            })
            .await?;
        // The signal starts from the session's state read under the grants lock, the lock
        // `mark_lost` takes after marking the session: a loss either shows in the state read
        // here or finds this grant in the map. (Created outside the lock, a loss between the
        // read and the insert reached neither, and the guard never heard of it.)
        let signal = {
            let mut grants =
                self.shared.grants.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let signal = Arc::new(watch::channel(*self.shared.lost.borrow()).0);
            grants.insert(name.to_owned(), (granted.token, signal.clone()));
            signal
        };
        Ok(Guard {
            shared: self.shared.clone(),
            name: name.to_owned(),
            token: granted.token,
            sequencer: grant_sequencer(name, granted.token, &granted.sequencer),
            lost: signal,
            released: false,
        })
    }

    /// Acquires `name`, waiting as long as it takes.
    ///
    /// # Errors
    /// The session being lost; refusals; the cluster being unreachable.
    pub async fn lock(&self, name: &str) -> Result<Guard, ClientError> {
        self.acquire(name, None).await
    }

    /// Acquires `name` only if it is free now; otherwise fails with code `lock_busy` and the
    /// holder's token.
    ///
    /// # Errors
    /// `lock_busy` or `lock_delayed` when taken; as [`Session::lock`] otherwise.
    pub async fn try_lock(&self, name: &str) -> Result<Guard, ClientError> {
        self.acquire(name, Some(0)).await
    }

    /// Acquires `name`, waiting at most `wait`; fails with code `wait_timed_out` after that.
    ///
    /// # Errors
    /// `wait_timed_out`; as [`Session::lock`] otherwise.
    pub async fn lock_timeout(&self, name: &str, wait: Duration) -> Result<Guard, ClientError> {
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
        self.acquire(name, Some(wait_ms)).await
    }

    /// Acquires `name`, then registers the new token with every fenced resource in `fences`
    /// before returning (fence on acquire; see [`Guard::fenced`]).
    ///
    /// # Errors
    /// As [`Session::lock`] and [`Guard::fenced`].
    pub async fn lock_fenced(
        &self,
        name: &str,
        fences: &[&dyn FenceRegistration],
    ) -> Result<Guard, ClientError> {
        self.lock(name).await?.fenced(fences).await
    }

    /// Closes the session: its locks are released. The keepalive stops.
    ///
    /// # Errors
    /// The cluster being unreachable.
    pub async fn close(self) -> Result<(), ClientError> {
        let result = close(&self.shared).await;
        self.shared.mark_lost(LostReason::Closed);
        result
    }
}

async fn close(shared: &Shared) -> Result<(), ClientError> {
    let session_id = shared.id;
    let timeout = Some(shared.client.config().request_timeout);
    let result = shared
        .client
        .call(Retry::Safe, timeout, |mut grpc| async move {
            grpc.close_session(v1::SessionRequest { session_id }).await
        })
        .await;
    match result {
        // A retried close can meet its own earlier success.
        Err(error) if error.code() == Some("unknown_session") => Ok(()),
        other => other.map(|_| ()),
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.shared.lost.borrow().is_some() {
            return;
        }
        let shared = self.shared.clone();
        shared.stop.send_replace(true);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = close(&shared).await;
                shared.mark_lost(LostReason::Closed);
            });
        }
    }
}

/// The share of a TTL the client gives up early, for clock drift: Picket assumes every clock
/// runs within 1 % of real time, so the client's clock may run 1 % slow while the leader's runs
/// 1 % fast; 3 % leaves room for both and for rounding (see ARCHITECTURE.md, "Time").
const DRIFT_MARGIN_PERCENT: u32 = 3;

/// How long after sending a confirmed keepalive the client still counts on its session: the TTL
/// less the drift margin.
fn lease_after_send(ttl: Duration) -> Duration {
    ttl - ttl * DRIFT_MARGIN_PERCENT / 100
}

/// Keeps the session alive every third of its TTL. Marks it lost when the service says it is
/// gone, or when no keepalive was confirmed within its lease (the TTL less a drift margin) of
/// the last confirmed one being sent.
async fn keep_alive(shared: Arc<Shared>, opened_at: Instant) {
    let mut stop = shared.stop.subscribe();
    let mut confirmed_sent_at = opened_at;
    let period = shared.ttl / 3;
    let lease = lease_after_send(shared.ttl);
    let retry_pause = Duration::from_millis(100).min(period);
    let mut next_attempt = opened_at + period;
    loop {
        let deadline = confirmed_sent_at + lease;
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {
                shared.mark_lost(LostReason::Unconfirmed);
                return;
            }
            _ = stop.wait_for(|stop| *stop) => return,
            () = tokio::time::sleep_until(next_attempt) => {}
        }
        // Tokio's timers do not count a suspension of the machine: after one, this is the first
        // moment the loop runs, at most a third of the TTL after waking.
        if shared.lost_reason().is_some() {
            return;
        }
        let sent_at = Instant::now();
        let sent_at_lease_clock = lease_clock::now();
        let attempt = shared.client.keep_alive(shared.id);
        let result = tokio::select! {
            result = attempt => result,
            () = tokio::time::sleep_until(deadline) => {
                shared.mark_lost(LostReason::Unconfirmed);
                return;
            }
            _ = stop.wait_for(|stop| *stop) => return,
        };
        if shared.lost_reason().is_some() {
            // The lease ran out while the keepalive was out (the machine was suspended): its
            // answer, whatever it is, came too late to count.
            return;
        }
        match result {
            Ok(_) => {
                shared.lease_end.extend_to(sent_at_lease_clock + lease);
                confirmed_sent_at = sent_at;
                next_attempt = sent_at + period;
            }
            Err(error) if error.code() == Some("unknown_session") => {
                shared.mark_lost(LostReason::Expired);
                return;
            }
            Err(error) => {
                tracing::debug!(session = shared.id, %error, "keepalive failed; retrying");
                next_attempt = Instant::now() + retry_pause;
            }
        }
    }
}

/// Asks the service what the session's events may have said while nobody listened (the watch
/// stream broke, or the service answered `resync` after installing a snapshot): whether the
/// session still lives, and whether each of its grants is still held with its token. Marks
/// what is gone, as the missed events would have. An error asking leaves things as they are:
/// the keepalive still notices a lost session.
pub(crate) async fn recheck(shared: &Shared) {
    if shared.lost.borrow().is_some() {
        return;
    }
    match shared.client.keep_alive(shared.id).await {
        Err(error) if error.code() == Some("unknown_session") => {
            shared.mark_lost(LostReason::Expired);
            return;
        }
        Err(error) => {
            tracing::debug!(session = shared.id, %error, "cannot recheck the session");
            return;
        }
        Ok(_) => {}
    }
    let held: Vec<(String, u64)> = {
        let grants = shared.grants.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        grants.iter().map(|(name, (token, _))| (name.clone(), *token)).collect()
    };
    for (name, token) in held {
        match shared.client.lock_info(&name).await {
            Ok(info) if info.holder_session_id == shared.id && info.token == token => {}
            // A lock nobody holds reads as holder 0.
            Ok(_) => shared.grant_ended(&name, token, LostReason::GrantEnded),
            Err(error) => tracing::debug!(session = shared.id, %error, "cannot recheck a grant"),
        }
    }
}

/// Applies one of the session's events: a revocation, an expiry or a grant ended elsewhere is
/// known as soon as the service applies it.
pub(crate) fn dispatch(shared: &Shared, event: &v1::WatchEvent) {
    match event.kind.as_str() {
        "session_ended" => {
            let reason = match event.cause.as_str() {
                "revoked" => LostReason::Revoked,
                "closed" => LostReason::Closed,
                _ => LostReason::Expired,
            };
            shared.mark_lost(reason);
        }
        "released" if event.cause != "released" => {
            let reason = match event.cause.as_str() {
                "session_revoked" => LostReason::Revoked,
                "session_expired" => LostReason::Expired,
                "session_closed" => LostReason::Closed,
                _ => LostReason::GrantEnded,
            };
            shared.grant_ended(&event.name, event.token, reason);
        }
        _ => {}
    }
}

/// A held lock. Exposes the grant's token and sequencer, and [`Guard::lost`], which fires when
/// the grant is known to be gone. Dropping the guard releases the lock in the background;
/// [`Guard::release`] does it now and reports errors.
#[derive(Debug)]
pub struct Guard {
    shared: Arc<Shared>,
    name: String,
    token: u64,
    sequencer: Sequencer,
    lost: Arc<LostSender>,
    released: bool,
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
                    code: "fence_registration_failed".into(),
                    message: format!("{error}; the lock was released"),
                    holder_token: None,
                });
            }
        }
        Ok(self)
    }

    /// Releases the lock now.
    ///
    /// # Errors
    /// `not_held` when the grant already ended; the cluster being unreachable.
    pub async fn release(mut self) -> Result<(), ClientError> {
        self.released = true;
        release(&self.shared, &self.name, self.token).await
    }
}

async fn release(shared: &Shared, name: &str, token: u64) -> Result<(), ClientError> {
    shared.grants.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(name);
    let session_id = shared.id;
    let timeout = Some(shared.client.config().request_timeout);
    let result = shared
        .client
        .call(Retry::Safe, timeout, |mut grpc| {
            let request = v1::ReleaseRequest { name: name.to_owned(), session_id, token };
            async move { grpc.release(request).await }
        })
        .await;
    match result {
        // A retried release can meet its own earlier success: the lock is no longer held under
        // this token, which is what was asked.
        Err(error) if error.code() == Some("not_held") && error.holder_token() != Some(token) => {
            Ok(())
        }
        other => other.map(|_| ()),
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.released || self.shared.lost.borrow().is_some() {
            return;
        }
        let (shared, name, token) =
            (self.shared.clone(), std::mem::take(&mut self.name), self.token);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = release(&shared, &name, token).await {
                    tracing::warn!(%error, name, token, "releasing a dropped guard failed");
                }
            });
        }
    }
}

/// The sequencer the server issued for a grant (signed, when the cluster signs), or the
/// unsigned one from a server too old to send any. One that does not parse or does not match
/// the grant is a server fault: it is said, and the unsigned one is used.
fn grant_sequencer(name: &str, token: u64, issued: &str) -> Sequencer {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_counts_on_its_session_for_the_ttl_less_three_percent() {
        assert_eq!(lease_after_send(Duration::from_secs(10)), Duration::from_millis(9_700));
        assert_eq!(lease_after_send(Duration::from_secs(1)), Duration::from_millis(970));
    }
}
