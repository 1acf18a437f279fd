//! Watches on a node: a stream of events for a lock, a prefix or sessions, checked again
//! whenever the auth file changes.

use super::Node;
use crate::auth::AuthFile;
use crate::error::ServiceError;
use crate::hub::{Delivery, Subscription, Watched};
use picket_core::Event;
use std::sync::Arc;

/// A watch: events for its target from when it started.
#[derive(Debug)]
pub struct WatchStream {
    subscription: Subscription,
    ended: bool,
    /// Whether the caller may still see this watch, asked again when the auth file changed.
    recheck: Option<Recheck>,
    /// This stream's place under `--max-watch-streams`, given back when it is dropped.
    _place: tokio::sync::OwnedSemaphorePermit,
}

impl WatchStream {
    /// The next item; `None` when the node stops. A watch that fell too far behind ends with an
    /// error: re-read the state and watch again.
    pub async fn next(&mut self) -> Option<Result<WatchItem, ServiceError>> {
        if self.ended {
            return None;
        }
        let delivery = self.subscription.receiver.recv().await;
        // Checked before anything more is delivered: a caller whose credentials were revoked or
        // whose roles no longer cover the target sees nothing after the change.
        if delivery.is_some()
            && let Some(recheck) = &mut self.recheck
            && let Err(error) = recheck.still_allowed()
        {
            self.ended = true;
            return Some(Err(error));
        }
        match delivery {
            Some(Delivery::Event { revision, event }) => {
                Some(Ok(WatchItem::Event { revision, event }))
            }
            Some(Delivery::Resync { revision }) => Some(Ok(WatchItem::Resync { revision })),
            None => {
                self.ended = true;
                self.subscription.fell_behind().then(|| {
                    Err(ServiceError::Unavailable(
                        "the watch fell too far behind and was stopped; re-read the state and watch again".into(),
                    ))
                })
            }
        }
    }
}

impl WatchStream {
    /// Asks `recheck` whether the caller may still see this watch whenever the auth file
    /// changed.
    pub(crate) fn with_recheck(mut self, recheck: Recheck) -> Self {
        self.recheck = Some(recheck);
        self
    }
}

/// Whether a caller may still see a watch, under the auth file as it is now.
pub(crate) type StillAllowed = Box<dyn Fn(&AuthFile) -> Result<(), ServiceError> + Send + Sync>;

/// Whether a watch's caller may still see it, under the auth file as it is now.
pub(crate) struct Recheck {
    auth: Arc<AuthFile>,
    seen: u64,
    allowed: StillAllowed,
}

impl Recheck {
    /// Checks with `allowed` every time the file's generation moved, and once now: a reload
    /// between the caller's authentication and this moment would otherwise go unseen.
    ///
    /// # Errors
    /// What `allowed` refuses now.
    pub(crate) fn new(auth: Arc<AuthFile>, allowed: StillAllowed) -> Result<Self, ServiceError> {
        let seen = auth.generation();
        allowed(&auth)?;
        Ok(Self { auth, seen, allowed })
    }

    fn still_allowed(&mut self) -> Result<(), ServiceError> {
        let now = self.auth.generation();
        if now != self.seen {
            (self.allowed)(&self.auth)?;
            self.seen = now;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Recheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recheck").field("seen", &self.seen).finish_non_exhaustive()
    }
}

/// An item of a watch stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchItem {
    /// Something happened, at `revision`.
    Event {
        /// The revision of the command that caused it.
        revision: u64,
        /// What happened.
        event: Event,
    },
    /// The state jumped (a snapshot was installed): re-read what you watch.
    Resync {
        /// The revision of the new state.
        revision: u64,
    },
}

impl Node {
    /// Streams events for `target` from now on. The stream ends with an error if the reader falls
    /// too far behind; it then has to re-read the state and watch again.
    ///
    /// # Errors
    /// [`ServiceError::Exhausted`] when this node has as many watch streams as it allows.
    pub fn watch(&self, target: Watched) -> Result<WatchStream, ServiceError> {
        let place = self.watch_streams.take()?;
        let target = self.read_local(|state| target.without_ended(&state.machine));
        let subscription = self.hub().watch(target);
        Ok(WatchStream { subscription, ended: false, recheck: None, _place: place })
    }
}
