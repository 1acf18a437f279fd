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
        // A watch of a set is registered under each of its sessions, and an entry cut off for a
        // full buffer left the others holding the channel open: the stream went on after a gap
        // it never reported (found in review). The flag, not the channel's end, says so.
        if delivery.is_some() && self.subscription.fell_behind() {
            self.ended = true;
            return Some(Err(fell_behind()));
        }
        // Checked before anything more is delivered: a caller whose credentials were revoked or
        // whose roles no longer cover the target sees nothing after the change.
        if delivery.is_some()
            && let Some(recheck) = &mut self.recheck
            && let Err(error) = recheck.still_allowed(self.subscription.target())
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
                self.subscription.fell_behind().then(|| Err(fell_behind()))
            }
        }
    }
}

/// The end of a watch that did not keep up.
fn fell_behind() -> ServiceError {
    ServiceError::Unavailable(
        "the watch fell too far behind and was stopped; re-read the state and watch again".into(),
    )
}

impl WatchStream {
    /// What the stream follows: the request's target without the sessions of its set that had
    /// ended when it was registered (and whose places under `--max-watched-sessions` it does
    /// not take).
    pub(crate) fn target(&self) -> &Watched {
        self.subscription.target()
    }

    /// Asks `recheck` whether the caller may still see this watch whenever the auth file
    /// changed.
    pub(crate) fn with_recheck(mut self, recheck: Recheck) -> Self {
        self.recheck = Some(recheck);
        self
    }
}

/// Whether a caller may still see a watch, under the auth file as it is now.
pub(crate) type StillAllowed =
    Box<dyn Fn(&AuthFile, &Watched) -> Result<(), ServiceError> + Send + Sync>;

/// Whether a watch's caller may still see it, under the auth file as it is now.
pub(crate) struct Recheck {
    auth: Arc<AuthFile>,
    seen: u64,
    allowed: StillAllowed,
}

impl Recheck {
    /// Checks `target` with `allowed` every time the file's generation moved, and once now: a
    /// reload between the caller's authentication and this moment would otherwise go unseen.
    ///
    /// # Errors
    /// What `allowed` refuses now.
    pub(crate) fn new(
        auth: Arc<AuthFile>,
        allowed: StillAllowed,
        target: &Watched,
    ) -> Result<Self, ServiceError> {
        let seen = auth.generation();
        allowed(&auth, target)?;
        Ok(Self { auth, seen, allowed })
    }

    fn still_allowed(&mut self, target: &Watched) -> Result<(), ServiceError> {
        let now = self.auth.generation();
        if now != self.seen {
            (self.allowed)(&self.auth, target)?;
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
    /// [`ServiceError::Exhausted`] when this node has as many watch streams as it allows, or
    /// its watches follow as many sessions as it allows; `invalid_name` for a lock name, or a
    /// prefix, that no lock could have (a stream keeps it for its whole life: found in review,
    /// a 128 KiB name was kept by each of 10,000 streams).
    pub fn watch(&self, target: Watched) -> Result<WatchStream, ServiceError> {
        let named = match &target {
            Watched::Lock(name) => Some(name.as_str()),
            Watched::Prefix(prefix) if !prefix.is_empty() => Some(prefix.as_str()),
            _ => None,
        };
        if let Some(name) = named {
            let limits = self.read_local(|state| state.machine.limits().clone());
            picket_core::validate_name(name, &limits)
                .map_err(picket_core::CommandError::InvalidName)?;
        }
        let place = self.watch_streams.take()?;
        // Registered under the state's read lock, so a session that ends meanwhile has its
        // `SessionEnded` published after this stream is registered, and its entry goes then.
        // (The state's lock before the hub's, as a snapshot's install takes them.)
        let state = self.store.read();
        let subscription = self.hub().watch(target.without_ended(&state.machine))?;
        drop(state);
        Ok(WatchStream { subscription, ended: false, recheck: None, _place: place })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::{Hub, WATCH_BUFFER};
    use picket_core::SessionId;

    /// Found in review (2026-12-06): a watch of a set cut off for a full buffer under one
    /// session stayed registered under the others, so it went on delivering after a gap it
    /// never reported, and a lost `SessionEnded` went unseen.
    #[tokio::test]
    async fn a_set_watch_that_fell_behind_says_so_at_once() {
        let hub = Hub::default();
        let subscription =
            hub.watch(Watched::Sessions(vec![SessionId(1), SessionId(2)])).expect("a watch");
        let place = Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().expect("one");
        let mut stream = WatchStream { subscription, ended: false, recheck: None, _place: place };
        let granted =
            |session| Event::Granted { name: "x".into(), session: SessionId(session), token: 1 };
        for revision in 0..=WATCH_BUFFER as u64 {
            hub.publish(revision, &[granted(1)]);
        }
        hub.publish(WATCH_BUFFER as u64 + 1, &[granted(2)]);
        let first = stream.next().await.expect("an item");
        assert!(matches!(first, Err(ServiceError::Unavailable(_))), "{first:?}");
        assert!(stream.next().await.is_none(), "the stream ended");
        drop(stream);
        assert_eq!(hub.watched_sessions(), 0, "an ended stream holds no place");
    }
}
