//! Sessions kept alive in the background.

use crate::error::LostReason;
use crate::error::{ClientError, ErrorCode};
use crate::guard::{FenceRegistration, Guard, grant_sequencer};
use crate::keepalive::KeepAlives;
use crate::lease_clock::{self, LeaseEnd};
use crate::state::SessionState;
use crate::transport::{Retry, Transport};
use picket_core::Wait;
use picket_proto::v1;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A session: a lease kept alive in the background at a third of its TTL.
///
/// [`Session::lost`] fires as soon as the session is known to be gone, or when the client
/// cannot confirm it before its TTL runs out, measured from the moment the last confirmed
/// keepalive was sent. Dropping the session stops the keepalive and closes it.
#[derive(Debug)]
pub struct Session {
    shared: Arc<SessionState>,
}

impl Session {
    /// Opens a session and starts its keepalive task. The caller registers it with the
    /// client's session watcher.
    pub(crate) async fn open(
        transport: Transport,
        keepalives: Arc<KeepAlives>,
        ttl: Duration,
        lock_delay: Duration,
    ) -> Result<Self, ClientError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let lock_delay_ms = u64::try_from(lock_delay.as_millis()).unwrap_or(u64::MAX);
        let opened_at = Instant::now();
        let opened_at_lease_clock = lease_clock::now();
        let timeout = Some(transport.config().request_timeout);
        let opened = transport
            .call(Retry::UnlessSent, timeout, |connection| async move {
                // A reading of this process's lease clock, so the leader can pair it with the
                // first keepalive's (see `keepalive.rs`). Taken as this attempt is sent, once
                // connected: a reading taken before a connection's setup or an earlier attempt
                // would arrive late, and the client's clock would seem to run fast. (The lease
                // is still counted from before the first attempt, the safe side.)
                let request = v1::OpenSessionRequest {
                    ttl_ms,
                    lock_delay_ms,
                    clock_id: lease_clock::clock_id(),
                    clock_ms: lease_clock::now().as_secs_f64() * 1_000.0,
                };
                connection.open_session(request).await
            })
            .await?;
        let (lost, _) = watch::channel(None);
        let (stop, _) = watch::channel(false);
        let shared = Arc::new(SessionState {
            transport,
            keepalives,
            id: opened.session_id,
            ttl: Duration::from_millis(opened.ttl_ms),
            lost,
            lease_end: LeaseEnd::new(
                opened_at_lease_clock + lease_after_send(Duration::from_millis(opened.ttl_ms)),
            ),
            grants: Mutex::new(HashMap::new()),
            ended_grants: Mutex::new(HashMap::new()),
            stop,
        });
        tokio::spawn(keep_alive(shared.clone(), opened_at));
        Ok(Self { shared })
    }

    /// The state the client's session watcher follows.
    pub(crate) fn state(&self) -> &Arc<SessionState> {
        &self.shared
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

    async fn acquire(&self, name: &str, wait: Wait) -> Result<Guard, ClientError> {
        self.check_alive()?;
        let session_id = self.shared.id;
        let granted = self.shared.transport.acquire(session_id, name, wait).await?;
        // A loss either shows in the state the signal starts from or finds the guard: see
        // `register_grant`. (Created outside the grants lock, a loss between the read and the
        // insert reached neither, and the guard never heard of it.)
        let signal = self.shared.register_grant(name, granted.token);
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
        self.acquire(name, Wait::Forever).await
    }

    /// Acquires `name` only if it is free now; otherwise fails with code `lock_busy` and the
    /// holder's token.
    ///
    /// # Errors
    /// `lock_busy` or `lock_delayed` when taken; as [`Session::lock`] otherwise.
    pub async fn try_lock(&self, name: &str) -> Result<Guard, ClientError> {
        self.acquire(name, Wait::Try).await
    }

    /// Acquires `name`, waiting at most `wait`; fails with code `wait_timed_out` after that.
    ///
    /// # Errors
    /// `wait_timed_out`; as [`Session::lock`] otherwise.
    pub async fn lock_timeout(&self, name: &str, wait: Duration) -> Result<Guard, ClientError> {
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
        self.acquire(name, Wait::For { wait_ms }).await
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

async fn close(shared: &SessionState) -> Result<(), ClientError> {
    let session_id = shared.id;
    let timeout = Some(shared.transport.config().request_timeout);
    let result = shared
        .transport
        .call(Retry::Safe, timeout, |connection| async move {
            connection.close_session(v1::SessionRequest { session_id }).await
        })
        .await;
    match result {
        // A retried close can meet its own earlier success.
        Err(error) if error.is(ErrorCode::UnknownSession) => Ok(()),
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
async fn keep_alive(shared: Arc<SessionState>, opened_at: Instant) {
    let sender = shared.clone();
    keep_alive_with(shared, opened_at, move || {
        let sender = sender.clone();
        async move { sender.keep_alive().await }
    })
    .await;
}

/// [`keep_alive`]'s loop, with the keepalive call given (tests answer it themselves on tokio's
/// paused clock).
async fn keep_alive_with<Sender, Sent>(
    shared: Arc<SessionState>,
    opened_at: Instant,
    mut send: Sender,
) where
    Sender: FnMut() -> Sent,
    Sent: std::future::Future<Output = Result<u64, ClientError>>,
{
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
        let attempt = send();
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
            Err(error) if error.is(ErrorCode::UnknownSession) => {
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

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    /// Runs the keepalive loop of a fresh session on tokio's paused clock, each keepalive
    /// answered by `answer(n)` for the n-th call (from 0); returns the session, the times the
    /// keepalives went out, and the loop's task.
    fn run_keepalives<Answer, Answered>(
        mut answer: Answer,
    ) -> (Arc<SessionState>, Arc<Mutex<Vec<Duration>>>, tokio::task::JoinHandle<()>)
    where
        Answer: FnMut(usize) -> Answered + Send + 'static,
        Answered: std::future::Future<Output = Result<u64, ClientError>> + Send + 'static,
    {
        let shared = Arc::new(SessionState::for_tests(TTL));
        let opened_at = Instant::now();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let send = {
            let sent = sent.clone();
            move || {
                let mut sent = sent.lock().unwrap();
                sent.push(opened_at.elapsed());
                answer(sent.len() - 1)
            }
        };
        let task = tokio::spawn(keep_alive_with(shared.clone(), opened_at, send));
        (shared, sent, task)
    }

    fn unavailable() -> ClientError {
        ClientError::Unreachable { endpoints: "test".into(), detail: "cut".into() }
    }

    /// Waits for `signal` to be marked; returns the reason and when, from the start.
    async fn lost_at(
        signal: &crate::state::LostSender,
        started: Instant,
    ) -> (LostReason, Duration) {
        let reason = signal.subscribe().wait_for(Option::is_some).await.unwrap().unwrap();
        (reason, started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn confirmed_keepalives_go_out_every_third_of_the_ttl_and_keep_the_session() {
        let (shared, sent, task) = run_keepalives(|_| async { Ok(3_000) });
        tokio::time::sleep(TTL * 10 + TTL / 6).await;
        assert_eq!(shared.lost_reason(), None);
        let expected: Vec<Duration> = (1..=30).map(|n| TTL / 3 * n).collect();
        assert_eq!(*sent.lock().unwrap(), expected);
        shared.stop.send_replace(true);
        task.await.unwrap();
        assert_eq!(shared.lost_reason(), None, "stopping is not a loss");
    }

    /// The client's promise: it counts on its session for the TTL less the drift margin from
    /// the sending of the last confirmed keepalive, and not a moment longer, however many
    /// failed keepalives it retried in between.
    #[tokio::test(start_paused = true)]
    async fn lost_fires_at_the_lease_end_of_the_last_confirmed_keepalive() {
        let started = Instant::now();
        let (shared, sent, task) =
            run_keepalives(|n| async move { if n < 2 { Ok(3_000) } else { Err(unavailable()) } });
        let guard = shared.register_grant("jobs", 4);
        let (reason, at) = lost_at(&guard, started).await;
        assert_eq!(reason, LostReason::Unconfirmed);
        // The second keepalive, confirmed, went out at 2 s: 2 s + 97 % of 3 s.
        assert_eq!(at, TTL / 3 * 2 + lease_after_send(TTL));
        assert_eq!(shared.lost_reason(), Some(LostReason::Unconfirmed));
        task.await.unwrap();
        let retries = sent.lock().unwrap().len() - 2;
        assert!(retries > 5, "failed keepalives are retried, {retries} times here");
    }

    /// A keepalive that never answers (a server stopped, a connection that hangs) does not
    /// stretch the lease: the session is lost at its lease end all the same.
    #[tokio::test(start_paused = true)]
    async fn a_keepalive_that_never_answers_loses_the_session_at_its_lease_end() {
        let started = Instant::now();
        let (shared, sent, task) = run_keepalives(|_| std::future::pending());
        let (reason, at) = lost_at(&shared.lost, started).await;
        assert_eq!((reason, at), (LostReason::Unconfirmed, lease_after_send(TTL)));
        task.await.unwrap();
        assert_eq!(*sent.lock().unwrap(), vec![TTL / 3], "one keepalive, still out");
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_the_service_does_not_know_is_lost_as_expired_at_once() {
        let started = Instant::now();
        let (shared, _sent, task) = run_keepalives(|_| async {
            Err(ClientError::Service {
                code: ErrorCode::UnknownSession,
                message: "no such session".into(),
                holder_token: None,
            })
        });
        let guard = shared.register_grant("jobs", 4);
        assert_eq!(lost_at(&guard, started).await, (LostReason::Expired, TTL / 3));
        task.await.unwrap();
    }

    #[test]
    fn the_client_counts_on_its_session_for_the_ttl_less_three_percent() {
        assert_eq!(lease_after_send(Duration::from_secs(10)), Duration::from_millis(9_700));
        assert_eq!(lease_after_send(Duration::from_secs(1)), Duration::from_millis(970));
    }
}
