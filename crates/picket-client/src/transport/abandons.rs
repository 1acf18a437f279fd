//! The abandons of given-up acquires, sent by one task per client from a bounded queue.
//!
//! An acquire the caller gave up on (a timeout, a dropped future, retries run out) may have
//! left a wait or a grant at the service that no guard knows of, and the session would hold
//! it for as long as it lives. The client sends an `Abandon` for its last attempt, and keeps
//! trying while the cluster cannot be reached, for up to [`ABANDON_PERSISTS_FOR`].
//!
//! Each abandon used to run on a task of its own. During a long outage, a caller that retries
//! its acquire with a short timeout left one task behind per attempt, each trying for an hour,
//! and all of them called at once when the cluster came back. Now one task per client sends
//! them, at most [`ABANDONS_AT_ONCE`] at a time; at most [`MAX_PENDING_ABANDONS`] wait, and
//! past that the least recently tried (or, with none tried, the oldest) is dropped with a
//! warning (its grant, if it made one, stays until its session ends, as after an hour of
//! trying). The task runs while abandons are left, and holds the connections only while one
//! is on its way: soon after every handle of the client is gone, so is it, and the abandons
//! still waiting are forgotten (the sessions end with the client's handles, or expire).

use super::{Retry, Transport, WeakTransport, outcome_may_linger};
use crate::error::{ClientError, ErrorCode};
use futures_util::StreamExt as _;
use picket_proto::v1;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How long the abandon of a given-up acquire keeps trying to get through: the longest TTL
/// a node accepts by default. A session whose keepalives got through that long while its
/// abandons did not is beyond what the client can mend; otherwise, by then the session has
/// expired and taken its grants with it.
const ABANDON_PERSISTS_FOR: Duration = Duration::from_secs(3_600);

/// Most abandons waiting to be sent or tried again, per client.
pub(crate) const MAX_PENDING_ABANDONS: usize = 1_024;

/// Most abandons on their way at once, per client.
const ABANDONS_AT_ONCE: usize = 16;

/// A given-up acquire's lock: (session, lock name).
type LockKey = (u64, String);

/// The abandons of one client: those waiting, and whether its sending task runs.
#[derive(Debug, Default)]
pub(crate) struct Abandons {
    queue: Mutex<Queue>,
    /// Wakes the sending task when an abandon is queued.
    queued: Notify,
    /// The sending tasks' turns, for the tests to see that a task waits, not spins.
    #[cfg(test)]
    pub(crate) turns: std::sync::atomic::AtomicUsize,
}

#[derive(Debug, Default)]
struct Queue {
    /// Not tried yet, in the order they came.
    fresh: VecDeque<Pending>,
    /// Tried and not through, in the order they are due again (each is due a backoff after
    /// its last try, and tries end in order).
    retrying: VecDeque<Pending>,
    /// Abandons on their way, by lock: each flag is set when its abandon is done.
    by_lock: HashMap<LockKey, watch::Receiver<bool>>,
    /// Whether the sending task runs; it stops when nothing is left.
    sending: bool,
}

impl Queue {
    fn waiting(&self) -> usize {
        self.fresh.len() + self.retrying.len()
    }

    /// Marks `pending` done, and forgets its lock unless a later abandon of it is on its way.
    fn finish(&mut self, pending: Pending) {
        pending.done.send_replace(true);
        let key = (pending.request.session_id, pending.request.name);
        if self.by_lock.get(&key).is_some_and(|waiting| *waiting.borrow()) {
            self.by_lock.remove(&key);
        }
    }
}

#[derive(Debug)]
struct Pending {
    request: v1::AbandonRequest,
    /// Past this, an abandon that does not get through is given up.
    persist_until: Instant,
    /// Not tried again before this.
    due_at: Instant,
    /// Set when this abandon is done, however it ends; dropped (the client gone), it also
    /// ends the wait of [`Abandons::wait_for`].
    done: watch::Sender<bool>,
}

/// What the sending task does next.
enum Step {
    /// Send these.
    Send(Vec<Pending>),
    /// Look again when an abandon on its way ends, a new one is queued, or (with one) the
    /// first abandon tried before is due again.
    Wait(Option<Instant>),
    /// Nothing is left.
    Stop,
}

impl Abandons {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Abandons waiting to be sent or tried again (not those on their way).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.lock().waiting()
    }

    /// Queues the abandon of `request`'s attempt, and starts the sending task if it is not
    /// running. Past [`MAX_PENDING_ABANDONS`] the least recently tried is dropped.
    pub(crate) fn queue(self: &Arc<Self>, transport: &Transport, request: v1::AbandonRequest) {
        let (done, waiting) = watch::channel(false);
        let now = Instant::now();
        let start = {
            let mut queue = self.lock();
            if queue.waiting() >= MAX_PENDING_ABANDONS {
                let oldest = queue.retrying.pop_front().or_else(|| queue.fresh.pop_front());
                if let Some(oldest) = oldest {
                    tracing::warn!(
                        session = oldest.request.session_id,
                        lock = %oldest.request.name,
                        "more than {MAX_PENDING_ABANDONS} abandons of given-up acquires are \
                         waiting; dropped the least recently tried: a grant it may have \
                         produced stays until the session ends"
                    );
                    queue.finish(oldest);
                }
            }
            queue.by_lock.insert((request.session_id, request.name.clone()), waiting);
            let persist_until = now + ABANDON_PERSISTS_FOR;
            queue.fresh.push_back(Pending { request, persist_until, due_at: now, done });
            !std::mem::replace(&mut queue.sending, true)
        };
        self.queued.notify_one();
        if start {
            self.start_sending(transport);
        }
    }

    /// Starts the sending task; the caller has just set `sending` under the lock.
    fn start_sending(self: &Arc<Self>, transport: &Transport) {
        let backoff = transport.config().max_backoff;
        let sending = Sending { abandons: self.clone(), stopped: false };
        tokio::spawn(send_abandons(sending, transport.downgrade(), backoff));
    }

    /// Waits until an abandon of `name` in `session_id` on its way is done, for at most
    /// `longest`. Abandons left waiting by a task that a runtime dropped get a new one here,
    /// so the wait is not the whole of `longest` for want of a sender.
    pub(crate) async fn wait_for(
        self: &Arc<Self>,
        transport: &Transport,
        session_id: u64,
        name: &str,
        longest: Duration,
    ) {
        let (waiting, start) = {
            let mut queue = self.lock();
            // Nearly always empty: no key is built on the acquire path then.
            if queue.by_lock.is_empty() {
                return;
            }
            let waiting = queue.by_lock.get(&(session_id, name.to_owned())).cloned();
            let stalled = waiting.is_some() && queue.waiting() > 0 && !queue.sending;
            if stalled {
                queue.sending = true;
            }
            (waiting, stalled)
        };
        if start {
            self.start_sending(transport);
        }
        if let Some(mut waiting) = waiting {
            let _ = tokio::time::timeout(longest, waiting.wait_for(|done| *done)).await;
        }
    }

    /// Up to `room` abandons to send now: fresh ones first, then those due again (so under
    /// a steady stream of new ones the oldest retries wait, and past the bound are dropped).
    /// With none to send: when one is due again, if any waits; else, with none on its way
    /// either, the task stops (said under the lock, so that the next [`Abandons::queue`]
    /// starts another).
    fn next_step(&self, now: Instant, room: usize, none_on_their_way: bool) -> Step {
        if room == 0 {
            // Only an abandon on its way ending makes room: waiting for one due again would
            // turn at once, and again, as long as the calls take (found in review).
            return Step::Wait(None);
        }
        let mut queue = self.lock();
        let mut batch = Vec::new();
        while batch.len() < room {
            let due = queue.retrying.front().is_some_and(|pending| pending.due_at <= now);
            match queue.fresh.pop_front() {
                Some(pending) => batch.push(pending),
                None if due => batch.extend(queue.retrying.pop_front()),
                None => break,
            }
        }
        if !batch.is_empty() {
            return Step::Send(batch);
        }
        match queue.retrying.front() {
            Some(pending) => Step::Wait(Some(pending.due_at)),
            None if none_on_their_way => {
                queue.sending = false;
                Step::Stop
            }
            None => Step::Wait(None),
        }
    }

    /// Settles one abandon's try: done, or due again after `backoff` while it may still land.
    fn settle(
        &self,
        mut pending: Pending,
        result: Result<v1::AbandonResponse, ClientError>,
        backoff: Duration,
    ) {
        let now = Instant::now();
        let session = pending.request.session_id;
        let mut queue = self.lock();
        match result {
            Err(error) if outcome_may_linger(&error) && now < pending.persist_until => {
                tracing::debug!(session, %error, "an abandon did not get through; trying again");
                pending.due_at = now + backoff;
                queue.retrying.push_back(pending);
                return;
            }
            Ok(answer) => tracing::debug!(
                session,
                released_token = answer.released_token,
                "abandoned a given-up acquire"
            ),
            // Nodes of an earlier build refuse an abandon that finds nothing.
            Err(error) if error.is(ErrorCode::NothingToAbandon) => {}
            // Its session has ended, and with it whatever the acquire left.
            Err(error) if error.is(ErrorCode::UnknownSession) => {
                tracing::debug!(session, "a given-up acquire needs no abandon: its session ended");
            }
            Err(error) => tracing::warn!(
                session,
                %error,
                "could not abandon a given-up acquire; a grant it may have produced stays \
                 until the session ends"
            ),
        }
        queue.finish(pending);
    }
}

/// The sending task: keeps up to [`ABANDONS_AT_ONCE`] abandons on their way, starting the
/// next as soon as one ends or is queued, waits for those due again, and stops when nothing is
/// left or the client is gone (nothing but its own abandons on their way holds the
/// connections). Each abandon on its way holds them; the task itself only weakly.
async fn send_abandons(mut sending: Sending, transport: WeakTransport, backoff: Duration) {
    let abandons = sending.abandons.clone();
    let mut on_their_way = futures_util::stream::FuturesUnordered::new();
    loop {
        #[cfg(test)]
        abandons.turns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let room = ABANDONS_AT_ONCE - on_their_way.len();
        let due_at = match abandons.next_step(Instant::now(), room, on_their_way.is_empty()) {
            Step::Send(batch) => {
                let Some(transport) = transport.upgrade() else { return };
                // The abandons on their way hold the connections too: without this look, each
                // would keep them open for the next, and the task would outlive the client.
                if Arc::strong_count(&transport.inner) <= on_their_way.len() + 1 {
                    return;
                }
                for pending in batch {
                    let transport = transport.clone();
                    on_their_way.push(async move {
                        let result = try_abandon(&transport, &pending.request).await;
                        (pending, result)
                    });
                }
                continue;
            }
            Step::Wait(due_at) => due_at,
            Step::Stop => {
                sending.stopped = true;
                return;
            }
        };
        tokio::select! {
            Some((pending, result)) = on_their_way.next(), if !on_their_way.is_empty() => {
                abandons.settle(pending, result, backoff);
            }
            () = sleep_until_some(due_at) => {}
            () = abandons.queued.notified() => {}
        }
    }
}

/// Sleeps until `due_at`, or forever without one.
async fn sleep_until_some(due_at: Option<Instant>) {
    match due_at {
        Some(due_at) => tokio::time::sleep_until(due_at).await,
        None => std::future::pending().await,
    }
}

/// Moved into the sending task when it is made: however the task ends without stopping by
/// [`Step::Stop`] (the client gone, or its runtime shutting down and dropping it, maybe
/// before it ever ran), the next [`Abandons::queue`] starts another instead of queueing
/// behind a task that is gone.
struct Sending {
    abandons: Arc<Abandons>,
    stopped: bool,
}

impl Drop for Sending {
    fn drop(&mut self) {
        if !self.stopped {
            self.abandons.lock().sending = false;
        }
    }
}

/// One round of retries of one abandon.
async fn try_abandon(
    transport: &Transport,
    request: &v1::AbandonRequest,
) -> Result<v1::AbandonResponse, ClientError> {
    let timeout = Some(transport.config().request_timeout);
    transport
        .call(Retry::Safe, timeout, |connection| {
            let request = request.clone();
            async move { connection.grpc().abandon(request).await }
        })
        .await
}
