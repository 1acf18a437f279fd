//! One watcher per client for the events of all its sessions.
//!
//! Each session must hear at once when the service ends it (`lost()`), so each needs a watch.
//! A watch per session would be one HTTP/2 stream per session, and servers cap concurrent
//! streams per connection (hyper: 200), so a client with more sessions would stall. Instead the
//! sessions of a client share a few streams: chunks of up to [`CHUNK`] sessions, each watched by
//! one `sessions` stream. New sessions join the open chunk, whose stream is replaced (new one
//! first, then the old one dropped, so nothing is missed) after a short pause that lets a burst
//! of opens share one replacement. A stream that breaks reconnects by itself, and then asks the
//! service about each of its sessions and their grants (`state::recheck`), since their events
//! may have gone by meanwhile; so does a `resync` message, which the service sends when it
//! cannot say which events it skipped (after installing a snapshot).

use crate::LostReason;
use crate::state::{self, SessionState};
use crate::transport::WeakTransport;
use picket_proto::v1::{SessionSet, WatchRequest, watch_request::Target};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// Most sessions one stream follows.
pub(crate) const CHUNK: usize = 5_000;
const _: () = assert!(CHUNK <= picket_proto::MAX_WATCHED_SESSIONS);
/// Pause after a new session before the open chunk's stream is replaced.
const DEBOUNCE: Duration = Duration::from_millis(2);
/// How long opening a session waits for a stream to cover it.
pub(crate) const COVER_TIMEOUT: Duration = Duration::from_secs(2);

/// The sessions of one client and the streams that watch them.
#[derive(Debug, Default)]
pub(crate) struct SessionWatcher {
    state: Mutex<State>,
    changed: Notify,
    /// The newest registration generation that a live stream covers.
    covered: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct State {
    sessions: BTreeMap<u64, Weak<SessionState>>,
    /// The size at which `register` next drops sessions that ended or were dropped.
    prune_at: usize,
    /// Sessions of the open chunk, in registration order.
    open: Vec<u64>,
    generation: u64,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SessionWatcher {
    /// Adds a session; returns the generation to wait for with [`SessionWatcher::covered`].
    pub(crate) fn register(&self, id: u64, shared: &Arc<SessionState>) -> u64 {
        let generation = {
            let mut state = lock(&self.state);
            if state.sessions.len() >= state.prune_at {
                // Lost sessions hear nothing more; dropped ones cannot. Pruning when the map
                // doubled keeps the cost of a registration constant on average.
                state.sessions.retain(|_, session| {
                    session.upgrade().is_some_and(|session| !session.is_lost())
                });
                state.prune_at = (state.sessions.len() * 2).max(64);
            }
            state.sessions.insert(id, Arc::downgrade(shared));
            state.open.push(id);
            state.generation += 1;
            state.generation
        };
        self.changed.notify_one();
        generation
    }

    /// Waits until a stream covers registration `generation`, at most `timeout`. Returns false
    /// on timeout (the keepalive still protects the session meanwhile).
    pub(crate) async fn covered(&self, generation: u64, timeout: Duration) -> bool {
        let mut covered = self.covered.subscribe();
        tokio::time::timeout(timeout, covered.wait_for(|covered| *covered >= generation))
            .await
            .is_ok_and(|result| result.is_ok())
    }

    /// A registered session that is neither dropped nor lost.
    fn lookup(&self, id: u64) -> Option<Arc<SessionState>> {
        let session = lock(&self.state).sessions.get(&id).and_then(Weak::upgrade)?;
        (!session.is_lost()).then_some(session)
    }

    /// Rechecks each of `ids` that is still registered, in the background.
    fn recheck_all(&self, ids: &[u64]) {
        let sessions: Vec<Arc<SessionState>> =
            ids.iter().filter_map(|id| self.lookup(*id)).collect();
        if sessions.is_empty() {
            return;
        }
        tokio::spawn(async move {
            for shared in sessions {
                state::recheck(&shared).await;
            }
        });
    }
}

/// How often an idle watcher looks whether its client and sessions are all gone.
const GONE_CHECK: Duration = Duration::from_secs(10);

/// Runs the streams of one client's sessions. Holds the connections only weakly: it stops
/// within [`GONE_CHECK`] once the client and all its sessions are gone.
pub(crate) async fn run(weak_transport: WeakTransport, watcher: Arc<SessionWatcher>) {
    let mut sealed: Vec<JoinHandle<()>> = Vec::new();
    let mut open_stream: Option<JoinHandle<()>> = None;
    loop {
        tokio::select! {
            () = watcher.changed.notified() => {}
            // No registration may ever come again: look now and then whether anyone is left.
            () = tokio::time::sleep(GONE_CHECK) => {
                if weak_transport.upgrade().is_none() {
                    break;
                }
                continue;
            }
        }
        tokio::time::sleep(DEBOUNCE).await;
        let Some(transport) = weak_transport.upgrade() else { break };
        let (ids, generation, seal) = {
            let mut state = lock(&watcher.state);
            let seal = state.open.len() >= CHUNK;
            let ids = if seal { state.open.drain(..).collect() } else { state.open.clone() };
            (ids, state.generation, seal)
        };
        if ids.is_empty() {
            continue;
        }
        let stream = tokio::spawn(follow(transport.downgrade(), watcher.clone(), ids, generation));
        drop(transport);
        if let Some(old) = open_stream.take() {
            // The new stream is being opened; the old one may go once the new one covers.
            let watcher = watcher.clone();
            tokio::spawn(async move {
                watcher.covered(generation, COVER_TIMEOUT).await;
                old.abort();
            });
        }
        if seal {
            sealed.push(stream);
        } else {
            open_stream = Some(stream);
        }
    }
    for stream in sealed.into_iter().chain(open_stream) {
        stream.abort();
    }
}

/// Follows one chunk of sessions, reconnecting when the stream breaks. Marks `generation`
/// covered once its first stream is open.
async fn follow(
    weak_transport: WeakTransport,
    watcher: Arc<SessionWatcher>,
    ids: Vec<u64>,
    generation: u64,
) {
    let mut announced = false;
    loop {
        let Some(transport) = weak_transport.upgrade() else { return };
        let target = Target::Sessions(SessionSet { session_ids: ids.clone() });
        // Only losses: the session learns of its own grants and releases from their replies,
        // and one stream message per acquire and release would cost both sides CPU for nothing.
        let request = WatchRequest { target: Some(target), losses_only: true };
        let stream = transport.watch_with(request).await;
        drop(transport);
        let Ok(mut stream) = stream else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if announced {
            // A new stream after a broken one: what went by in between is not replayed.
            watcher.recheck_all(&ids);
        } else {
            announced = true;
            watcher.covered.send_if_modified(|covered| {
                (*covered < generation) && {
                    *covered = generation;
                    true
                }
            });
        }
        while let Ok(Some(message)) = stream.message().await {
            match crate::watched(&message) {
                crate::Watched::Resync { .. } => watcher.recheck_all(&ids),
                crate::Watched::Event { event, .. } => {
                    if let Some(shared) = watcher.lookup(event.session().0) {
                        state::dispatch(&shared, &event);
                    }
                }
                crate::Watched::Unknown { kind, name, session, token, .. } => {
                    // A cause a newer node knows: a release or a session's end is a loss
                    // whatever its cause; anything else is read again to be sure.
                    match (kind.as_str(), watcher.lookup(session.0)) {
                        ("released", Some(shared)) => {
                            shared.grant_ended(&name, token, LostReason::GrantEnded);
                        }
                        ("session_ended", Some(shared)) => shared.mark_lost(LostReason::Expired),
                        _ => watcher.recheck_all(&ids),
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{ClientConfig, Transport};

    /// Regression: the watcher's task waited for a registration that never came once its client
    /// and sessions were gone: an idle task per dropped client, for ever.
    #[tokio::test(start_paused = true)]
    async fn the_watcher_task_ends_once_its_client_is_gone() {
        let transport = Transport::new(["127.0.0.1:1"], ClientConfig::default()).unwrap();
        let task = tokio::spawn(run(transport.downgrade(), Arc::new(SessionWatcher::default())));
        tokio::time::sleep(GONE_CHECK * 3).await;
        assert!(!task.is_finished(), "the client is still there");
        drop(transport);
        let ended = tokio::time::timeout(GONE_CHECK * 2, task).await;
        assert!(matches!(ended, Ok(Ok(()))), "the task is still running");
    }
}
