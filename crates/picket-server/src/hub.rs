//! Fan-out of applied events: to acquires waiting in this node, and to watch streams.
//!
//! Every node applies every committed command, so every node can answer its own waiting
//! acquires and watches, whichever node the command was proposed on.

use picket_core::{CancelCause, Event, SessionId, StateMachine};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, oneshot, watch};

/// Events from one applied command, or a notice that events were skipped.
#[derive(Clone, Debug)]
pub enum Batch {
    /// The events of the command applied at `revision`.
    Events {
        /// The revision after the command.
        revision: u64,
        /// What changed.
        events: Vec<Event>,
    },
    /// The state was replaced by a snapshot: events between the old and new state are unknown.
    /// Watchers must re-read the state.
    Resync {
        /// The revision of the installed state.
        revision: u64,
    },
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The waiter now holds the lock.
    Granted {
        /// The grant's token.
        token: u64,
    },
    /// The waiter left the queue without a grant.
    Cancelled {
        /// Why.
        cause: CancelCause,
    },
}

/// Most batches a watch may fall behind before it is told to resync.
pub const WATCH_BUFFER: usize = 4_096;

type WaiterKey = (SessionId, String);

/// Where applied events go.
#[derive(Debug)]
pub struct Hub {
    waiters: Mutex<HashMap<WaiterKey, oneshot::Sender<WaitOutcome>>>,
    batches: broadcast::Sender<Arc<Batch>>,
    applied_revision: watch::Sender<u64>,
}

impl Default for Hub {
    fn default() -> Self {
        Self {
            waiters: Mutex::new(HashMap::new()),
            batches: broadcast::channel(WATCH_BUFFER).0,
            applied_revision: watch::channel(0).0,
        }
    }
}

impl Hub {
    /// Registers interest in how `session`'s wait for `name` ends. A newer registration for the
    /// same pair replaces the older one, whose receiver then sees its sender dropped.
    pub fn register_waiter(
        &self,
        session: SessionId,
        name: &str,
    ) -> oneshot::Receiver<WaitOutcome> {
        let (sender, receiver) = oneshot::channel();
        self.lock_waiters().insert((session, name.to_owned()), sender);
        receiver
    }

    /// Forgets a registration (the wait ended by other means, or the caller left).
    pub fn forget_waiter(&self, session: SessionId, name: &str) {
        self.lock_waiters().remove(&(session, name.to_owned()));
    }

    fn lock_waiters(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<WaiterKey, oneshot::Sender<WaitOutcome>>> {
        self.waiters.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Subscribes to every batch applied from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Batch>> {
        self.batches.subscribe()
    }

    /// Watches the applied revision.
    pub fn applied_revision(&self) -> watch::Receiver<u64> {
        self.applied_revision.subscribe()
    }

    /// Delivers the events of one applied command.
    pub fn publish(&self, revision: u64, events: Vec<Event>) {
        if !events.is_empty() {
            let mut waiters = self.lock_waiters();
            for event in &events {
                let (key, outcome) = match event {
                    Event::Granted { name, session, token } => {
                        ((*session, name.clone()), WaitOutcome::Granted { token: *token })
                    }
                    Event::Cancelled { name, session, cause } => {
                        ((*session, name.clone()), WaitOutcome::Cancelled { cause: *cause })
                    }
                    _ => continue,
                };
                if let Some(sender) = waiters.remove(&key) {
                    let _ = sender.send(outcome);
                }
            }
        }
        if !events.is_empty() && self.batches.receiver_count() > 0 {
            let _ = self.batches.send(Arc::new(Batch::Events { revision, events }));
        }
        self.applied_revision.send_replace(revision);
    }

    /// The state jumped to `machine` (a snapshot was installed): settle every waiter from the new
    /// state and tell watchers to re-read.
    pub fn resync(&self, machine: &StateMachine) {
        let mut waiters = self.lock_waiters();
        let keys: Vec<WaiterKey> = waiters.keys().cloned().collect();
        for (session, name) in keys {
            let holder = machine.lock(&name).and_then(|lock| lock.holder);
            let still_waiting =
                machine.lock(&name).is_some_and(|lock| lock.waiters.contains(&session));
            let outcome = match holder {
                Some(holder) if holder.session == session => {
                    WaitOutcome::Granted { token: holder.token }
                }
                _ if still_waiting => continue,
                _ if machine.session(session).is_none() => {
                    WaitOutcome::Cancelled { cause: CancelCause::SessionExpired }
                }
                _ => WaitOutcome::Cancelled { cause: CancelCause::TimedOut },
            };
            if let Some(sender) = waiters.remove(&(session, name)) {
                let _ = sender.send(outcome);
            }
        }
        drop(waiters);
        let revision = machine.revision();
        if self.batches.receiver_count() > 0 {
            let _ = self.batches.send(Arc::new(Batch::Resync { revision }));
        }
        self.applied_revision.send_replace(revision);
    }
}
