//! Watch streams in `picket-core`'s terms: each message a node sends becomes a core [`Event`]
//! with its revision, so a program matches on the same types the state machine emits, not on
//! protobuf fields and strings.
//!
//! A node built before the typed fields sends only names (`kind`, `cause`); they are read then.
//! A kind or cause a newer node sends that this build does not know comes out as
//! [`Watched::Unknown`] with its name, never as a guess.

use crate::error::{ClientError, Failure, classify};
use picket_core::{CancelCause, Event, ReleaseCause, SessionEnd, SessionId};
use picket_proto::v1;

/// One item of a watch stream.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Watched {
    /// An applied event, and the revision of the command that caused it.
    Event {
        /// The revision of the command whose apply emitted the event.
        revision: u64,
        /// What happened.
        event: Event,
    },
    /// Events may have been missed (a snapshot replaced the node's state): read the state of
    /// what you watch again.
    Resync {
        /// The revision the node's state is at.
        revision: u64,
    },
    /// An event of a kind, or with a cause, that this build does not know (a newer node sent
    /// it): its fields as the node sent them (empty or 0 where it had none).
    Unknown {
        /// The revision of the command that caused it.
        revision: u64,
        /// The event's kind, e.g. `released`.
        kind: String,
        /// Its cause, when it has one.
        cause: String,
        /// The lock, for an event about one.
        name: String,
        /// The session.
        session: SessionId,
        /// The grant's token, for an event about one.
        token: u64,
    },
}

/// A stream of [`Watched`] items, from [`crate::Client::watch`].
#[derive(Debug)]
pub struct WatchStream {
    messages: tonic::Streaming<v1::WatchEvent>,
}

impl WatchStream {
    pub(crate) fn new(messages: tonic::Streaming<v1::WatchEvent>) -> Self {
        Self { messages }
    }

    /// The next item; `None` when the node ended the stream (it stopped, or lost leadership
    /// of nothing: a watch is served by any node). Watch again to go on; what went by in
    /// between is not replayed, so read the state first.
    ///
    /// # Errors
    /// The stream broke, or the node refused it.
    pub async fn next(&mut self) -> Result<Option<Watched>, ClientError> {
        match self.messages.message().await {
            Ok(message) => Ok(message.as_ref().map(watched)),
            Err(status) => Err(match classify(&status) {
                Failure::Final(error) | Failure::OtherCluster(error) => error,
                Failure::NotLeader(_) => ClientError::OutcomeUnknown(status.message().to_owned()),
                Failure::Unavailable(detail)
                | Failure::Unsent(detail)
                | Failure::Broken(detail) => {
                    ClientError::Unreachable { endpoints: "the watched node".to_owned(), detail }
                }
            }),
        }
    }
}

/// A message as a core event.
/// Reads a message of [`crate::Client::watch_with`]'s stream.
#[must_use]
pub fn watched(message: &v1::WatchEvent) -> Watched {
    let revision = message.revision;
    let unknown = || Watched::Unknown {
        revision,
        kind: message.kind.clone(),
        cause: message.cause.clone(),
        name: message.name.clone(),
        session: SessionId(message.session_id),
        token: message.token,
    };
    let name = || message.name.clone();
    let session = SessionId(message.session_id);
    let cause_name = |typed: &str, prefix: &str| typed_or_named(typed, prefix, &message.cause);
    let event = match event_kind(message) {
        v1::WatchEventKind::Resync => return Watched::Resync { revision },
        v1::WatchEventKind::Granted => {
            Event::Granted { name: name(), session, token: message.token }
        }
        v1::WatchEventKind::Released => {
            let named = cause_name(message.release_cause().as_str_name(), "RELEASE_CAUSE_");
            let Some(cause) = ReleaseCause::ALL.into_iter().find(|cause| cause.as_str() == named)
            else {
                return unknown();
            };
            Event::Released { name: name(), session, token: message.token, cause }
        }
        v1::WatchEventKind::Queued => {
            let position = usize::try_from(message.position).unwrap_or(usize::MAX);
            Event::Queued { name: name(), session, position }
        }
        v1::WatchEventKind::Cancelled => {
            let named = cause_name(message.cancel_cause().as_str_name(), "CANCEL_CAUSE_");
            let Some(cause) = CancelCause::ALL.into_iter().find(|cause| cause.as_str() == named)
            else {
                return unknown();
            };
            Event::Cancelled { name: name(), session, cause }
        }
        v1::WatchEventKind::SessionEnded => {
            let named = cause_name(message.session_end().as_str_name(), "SESSION_END_");
            let Some(cause) = SessionEnd::ALL.into_iter().find(|cause| cause.as_str() == named)
            else {
                return unknown();
            };
            Event::SessionEnded { session, cause }
        }
        _ => return unknown(),
    };
    Watched::Event { revision, event }
}

/// The event's typed kind; from its name when a node built before the typed field sent it.
fn event_kind(message: &v1::WatchEvent) -> v1::WatchEventKind {
    if message.event_kind() != v1::WatchEventKind::Unspecified {
        return message.event_kind();
    }
    let name = format!("WATCH_EVENT_KIND_{}", message.kind.to_ascii_uppercase());
    v1::WatchEventKind::from_str_name(&name).unwrap_or_default()
}

/// The core name of a cause: the typed field's protobuf name without its `prefix`, in lower
/// case, or the `named` field when the typed one is unspecified (a node built before it).
fn typed_or_named(typed: &str, prefix: &str, named: &str) -> String {
    match typed.strip_prefix(prefix) {
        Some(name) if name != "UNSPECIFIED" => name.to_ascii_lowercase(),
        _ => named.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: v1::WatchEventKind) -> v1::WatchEvent {
        v1::WatchEvent {
            event_kind: kind.into(),
            name: "x".into(),
            session_id: 4,
            revision: 9,
            ..v1::WatchEvent::default()
        }
    }

    /// Every core cause read back from its typed field and, as an older node sends it, from
    /// its name alone: the protobuf names and the core's stay in step.
    #[test]
    fn every_cause_reads_back_from_typed_fields_and_from_names() {
        for cause in ReleaseCause::ALL {
            let typed = v1::ReleaseCause::from_str_name(&format!(
                "RELEASE_CAUSE_{}",
                cause.as_str().to_ascii_uppercase()
            ))
            .expect("a protobuf value per cause");
            let expected = Watched::Event {
                revision: 9,
                event: Event::Released { name: "x".into(), session: SessionId(4), token: 3, cause },
            };
            let mut sent = v1::WatchEvent { token: 3, ..message(v1::WatchEventKind::Released) };
            sent.release_cause = typed.into();
            assert_eq!(watched(&sent), expected);
            let older = v1::WatchEvent {
                kind: "released".into(),
                cause: cause.as_str().into(),
                token: 3,
                ..message(v1::WatchEventKind::Unspecified)
            };
            assert_eq!(watched(&older), expected);
        }
        for cause in CancelCause::ALL {
            let older = v1::WatchEvent {
                kind: "cancelled".into(),
                cause: cause.as_str().into(),
                ..message(v1::WatchEventKind::Unspecified)
            };
            let Watched::Event { event: Event::Cancelled { cause: read, .. }, .. } =
                watched(&older)
            else {
                panic!("a cancellation: {older:?}")
            };
            assert_eq!(read, cause);
        }
        for cause in SessionEnd::ALL {
            let older = v1::WatchEvent {
                kind: "session_ended".into(),
                cause: cause.as_str().into(),
                ..message(v1::WatchEventKind::Unspecified)
            };
            let Watched::Event { event: Event::SessionEnded { cause: read, .. }, .. } =
                watched(&older)
            else {
                panic!("a session's end: {older:?}")
            };
            assert_eq!(read, cause);
        }
    }

    #[test]
    fn grants_queues_resyncs_and_unknown_kinds() {
        let granted = v1::WatchEvent { token: 7, ..message(v1::WatchEventKind::Granted) };
        assert_eq!(
            watched(&granted),
            Watched::Event {
                revision: 9,
                event: Event::Granted { name: "x".into(), session: SessionId(4), token: 7 }
            }
        );
        let queued = v1::WatchEvent { position: 2, ..message(v1::WatchEventKind::Queued) };
        assert_eq!(
            watched(&queued),
            Watched::Event {
                revision: 9,
                event: Event::Queued { name: "x".into(), session: SessionId(4), position: 2 }
            }
        );
        assert_eq!(watched(&message(v1::WatchEventKind::Resync)), Watched::Resync { revision: 9 });
        let newer = v1::WatchEvent {
            kind: "renamed".into(),
            cause: "moved".into(),
            ..message(v1::WatchEventKind::Unspecified)
        };
        assert_eq!(
            watched(&newer),
            Watched::Unknown {
                revision: 9,
                kind: "renamed".into(),
                cause: "moved".into(),
                name: "x".into(),
                session: SessionId(4),
                token: 0,
            }
        );
        let unknown_cause = v1::WatchEvent {
            kind: "released".into(),
            cause: "evicted".into(),
            ..message(v1::WatchEventKind::Unspecified)
        };
        assert!(matches!(watched(&unknown_cause), Watched::Unknown { .. }));
    }
}
