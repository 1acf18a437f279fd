use super::*;
use picket_core::CancelCause;

fn granted(name: &str, session: u64, token: u64) -> Event {
    Event::Granted { name: name.into(), session: SessionId(session), token }
}

/// The revisions of what `subscription` has received so far.
fn revisions(subscription: &mut Subscription) -> Vec<u64> {
    std::iter::from_fn(|| subscription.receiver.try_recv().ok())
        .map(|delivery| match delivery {
            Delivery::Event { revision, .. } | Delivery::Resync { revision } => revision,
        })
        .collect()
}

/// Issue 13, point 2: every applied event scanned every prefix watcher. With more watched
/// prefixes than the name has bytes, the event looks up its name's prefixes instead; both
/// ways reach exactly the watchers of the name's prefixes.
#[test]
fn prefix_watchers_are_found_by_the_names_prefixes_however_many_there_are() {
    let hub = Hub::default();
    let mut nested: Vec<Subscription> = ["", "j", "jobs/", "jobs/é", "jobs/éx"]
        .iter()
        .map(|p| hub.watch(Watched::Prefix((*p).into())).expect("a watch"))
        .collect();
    let mut others: Vec<Subscription> = (0..50)
        .map(|n| hub.watch(Watched::Prefix(format!("other/{n}"))).expect("a watch"))
        .collect();
    for name in ["jobs/éx", "jobs/é"] {
        hub.publish(7, &[granted(name, 1, 7)]);
    }
    let count = |subscription: &mut Subscription| {
        std::iter::from_fn(|| subscription.receiver.try_recv().ok()).count()
    };
    let received: Vec<usize> = nested.iter_mut().map(count).collect();
    assert_eq!(received, [2, 2, 2, 2, 1]);
    assert!(others.iter_mut().all(|other| count(other) == 0));
    // Fewer prefixes (55) than the name has bytes: the other way, the same answer.
    hub.publish(8, &[granted(&format!("jobs/éx{}", "y".repeat(60)), 1, 8)]);
    let received: Vec<usize> = nested.iter_mut().map(count).collect();
    assert_eq!(received, [1, 1, 1, 1, 1]);
    assert!(others.iter_mut().all(|other| count(other) == 0));
    // Two closed watches' entries go when an event is offered to them, counted.
    nested.truncate(3);
    assert_eq!(hub.watcher_entries(), 55, "not swept yet");
    hub.publish(9, &[granted("jobs/éx", 1, 9)]);
    assert_eq!(hub.watcher_entries(), 53);
}

#[test]
fn events_reach_only_the_watchers_they_concern() {
    let hub = Hub::default();
    let mut by_session = hub.watch(Watched::Session(SessionId(1))).expect("a watch");
    let mut by_lock = hub.watch(Watched::Lock("a/x".into())).expect("a watch");
    let mut by_prefix = hub.watch(Watched::Prefix("a/".into())).expect("a watch");
    let mut elsewhere = hub.watch(Watched::Prefix("b/".into())).expect("a watch");
    hub.publish(5, &[granted("a/x", 1, 5)]);
    hub.publish(6, &[granted("a/y", 2, 6)]);
    assert_eq!(revisions(&mut by_session), [5]);
    assert_eq!(revisions(&mut by_lock), [5]);
    assert_eq!(revisions(&mut by_prefix), [5, 6]);
    assert_eq!(revisions(&mut elsewhere), Vec::<u64>::new());
}

/// Found in review (2026-12-06): a set of sessions that named one twice registered the
/// stream twice under it, so each of its events came twice, and one request of 10,000 copies
/// of one id took 10,000 places in the fan-out.
#[test]
fn a_session_named_twice_in_a_watch_gets_each_event_once() {
    let hub = Hub::default();
    let mut watch = hub.watch(Watched::Sessions(vec![SessionId(1); 10_000])).expect("a watch");
    let mut losses =
        hub.watch(Watched::SessionLosses(vec![SessionId(2), SessionId(2)])).expect("a watch");
    hub.publish(5, &[granted("x", 1, 5)]);
    hub.publish(
        6,
        &[Event::SessionEnded { session: SessionId(2), cause: picket_core::SessionEnd::Revoked }],
    );
    assert_eq!(revisions(&mut watch), [5]);
    assert_eq!(revisions(&mut losses), [6]);
    assert_eq!(lock(&hub.watchers).by_session.values().map(|keyed| keyed.len()).sum::<usize>(), 2);
}

/// Found in review (2026-12-06): a stream that follows a set of sessions kept an entry for
/// each of them in the hub for as long as it lived, ended sessions included; a long-lived
/// client that opens and closes sessions grew the hub without bound. An ended session's entry
/// is now dropped, but for the stream's last, which keeps the stream open.
#[test]
fn an_ended_sessions_entry_is_dropped_but_for_a_streams_last() {
    let hub = Hub::default();
    let mut watch =
        hub.watch(Watched::SessionLosses(vec![SessionId(1), SessionId(2)])).expect("a watch");
    let mut other = hub.watch(Watched::Sessions(vec![SessionId(2)])).expect("a watch");
    let ended = |session| Event::SessionEnded {
        session: SessionId(session),
        cause: picket_core::SessionEnd::Expired,
    };
    let entries = |hub: &Hub| -> usize { hub.watcher_entries() };
    assert_eq!(entries(&hub), 3);
    hub.publish(5, &[ended(1)]);
    assert_eq!(entries(&hub), 2, "session 1's entry goes");
    hub.publish(6, &[ended(2)]);
    assert_eq!(entries(&hub), 2, "each stream keeps its last entry");
    hub.publish(7, &[granted("x", 2, 7)]);
    assert_eq!(hub.watched_sessions(), entries(&hub), "each entry holds one place");
    assert_eq!(revisions(&mut watch), [5, 6]);
    assert_eq!(revisions(&mut other), [6, 7]);
    assert!(!watch.receiver.is_closed() && !other.receiver.is_closed(), "a stream closed");
}

/// helper-69's review: sessions that had ended before a stream registered them (the Rust
/// client registers its closed sessions again when it reconnects or merges its streams), and
/// sessions that ended in a snapshot's gap, never had a `SessionEnded` to drop their entries.
/// A watch now leaves out the sessions the state shows ended (but one, if all did), and a
/// resync drops the entries of sessions the new state shows ended (but each stream's last).
#[test]
fn sessions_ended_before_a_watch_or_in_a_snapshots_gap_leave_no_entry() {
    use picket_core::{Command, Input, Limits, Response};
    let mut machine = StateMachine::new(Limits::default());
    let mut apply = |command| machine.apply(&Input::new(0, command));
    let open = || Command::OpenSession { ttl_ms: 10_000, lock_delay_ms: 0, owner: None };
    let mut opened = || {
        let Ok(Response::SessionOpened { session, .. }) = apply(open()).result else { panic!() };
        session
    };
    let (a, b, c) = (opened(), opened(), opened());
    apply(Command::CloseSession { session: a });
    // An id past the state's revision: a session this node has not applied the opening of.
    let later = SessionId(machine.revision() + 100);
    let hub = Hub::default();
    let entries = |hub: &Hub| -> usize { hub.watcher_entries() };
    let mut watch = hub
        .watch(Watched::SessionLosses(vec![a, b, c, later]).without_ended(&machine))
        .expect("a watch");
    assert_eq!(entries(&hub), 3, "the ended session a is left out");
    let _only_ended =
        hub.watch(Watched::Sessions(vec![a]).without_ended(&machine)).expect("a watch");
    assert_eq!(entries(&hub), 4, "a watch of ended sessions alone keeps one");
    // Session b ends in a gap the hub never sees; the snapshot's state shows it.
    machine.apply(&Input::new(0, Command::CloseSession { session: b }));
    hub.resync(&machine);
    assert_eq!(entries(&hub), 3, "b's entry goes, a's lone one stays");
    assert_eq!(hub.watched_sessions(), 3, "b's place comes back");
    assert_eq!(revisions(&mut watch), [machine.revision()], "the resync itself");
    assert!(!watch.receiver.is_closed());
}

#[test]
fn a_losses_watch_gets_only_what_the_session_did_not_ask_for() {
    let hub = Hub::default();
    let mut losses = hub.watch(Watched::SessionLosses(vec![SessionId(1)])).expect("a watch");
    let released =
        |cause| Event::Released { name: "x".into(), session: SessionId(1), token: 5, cause };
    hub.publish(5, &[granted("x", 1, 5)]);
    hub.publish(6, &[released(picket_core::ReleaseCause::Released)]);
    hub.publish(7, &[granted("x", 1, 7)]);
    hub.publish(8, &[released(picket_core::ReleaseCause::SessionRevoked)]);
    hub.publish(
        8,
        &[Event::SessionEnded { session: SessionId(1), cause: picket_core::SessionEnd::Revoked }],
    );
    let kinds: Vec<String> = std::iter::from_fn(|| losses.receiver.try_recv().ok())
        .map(|delivery| match delivery {
            Delivery::Event { revision, event } => format!("{revision}:{event:?}"),
            Delivery::Resync { revision } => format!("{revision}:resync"),
        })
        .collect();
    assert_eq!(kinds.len(), 2, "{kinds:?}");
    assert!(kinds[0].starts_with("8:Released") && kinds[0].contains("SessionRevoked"));
    assert!(kinds[1].starts_with("8:SessionEnded"));
}

#[test]
fn a_watcher_that_does_not_keep_up_is_cut_off_and_told() {
    let hub = Hub::default();
    let mut slow = hub.watch(Watched::Lock("x".into())).expect("a watch");
    for revision in 0..=WATCH_BUFFER as u64 {
        hub.publish(revision, &[granted("x", 1, revision)]);
    }
    let mut count = 0;
    while slow.receiver.try_recv().is_ok() {
        count += 1;
    }
    assert_eq!(count, WATCH_BUFFER);
    assert!(slow.fell_behind());
    assert_eq!(hub.watcher_entries(), 0, "its entry went, counted");
    // It was dropped: later events do not revive it.
    hub.publish(9_999, &[granted("x", 1, 9_999)]);
    assert!(slow.receiver.try_recv().is_err());
}

fn cancelled(name: &str, session: u64, cause: CancelCause) -> Event {
    Event::Cancelled { name: name.into(), session: SessionId(session), cause }
}

/// A request registers before its acquire is applied. An earlier wait of the same session
/// for the same lock that ends in that gap is not this request's outcome (it used to be:
/// the request answered `wait_timed_out` while its own acquire stayed queued, a ghost).
#[test]
fn an_outcome_applied_before_the_acquire_was_queued_is_not_the_requests() {
    let hub = Hub::default();
    let mut registration = hub.register_waiter(SessionId(1), "x", RequestId(7));
    hub.publish(10, &[cancelled("x", 1, CancelCause::TimedOut)]);
    hub.queued(SessionId(1), "x", registration.id, 11);
    assert!(registration.outcome.try_recv().is_err(), "the earlier wait's end is not ours");
    hub.publish(12, &[granted("x", 1, 12)]);
    assert_eq!(registration.outcome.try_recv(), Ok(WaitEnd::Granted { token: 12 }));
    assert_eq!(hub.waiting_acquires(), 0);
}

/// An outcome applied after the acquire but delivered before the request learned where it
/// was queued is kept and handed over when it does.
#[test]
fn an_outcome_that_arrives_before_the_queue_position_is_kept_for_the_request() {
    let hub = Hub::default();
    let mut registration = hub.register_waiter(SessionId(1), "x", RequestId(7));
    hub.publish(12, &[granted("x", 1, 12)]);
    hub.queued(SessionId(1), "x", registration.id, 11);
    assert_eq!(registration.outcome.try_recv(), Ok(WaitEnd::Granted { token: 12 }));
    assert_eq!(hub.waiting_acquires(), 0);
}

/// A retry of a request and the request itself both hear how the wait ended; forgetting
/// one says whether a retry of the same request is still there.
#[test]
fn every_registration_of_a_wait_hears_its_end() {
    let hub = Hub::default();
    let mut first = hub.register_waiter(SessionId(1), "x", RequestId(7));
    let mut retry = hub.register_waiter(SessionId(1), "x", RequestId(7));
    let other = hub.register_waiter(SessionId(1), "x", RequestId(8));
    hub.queued(SessionId(1), "x", first.id, 5);
    hub.queued(SessionId(1), "x", retry.id, 6);
    assert!(!hub.forget_waiter(SessionId(1), "x", RequestId(8), other.id));
    hub.publish(9, &[granted("x", 1, 9)]);
    assert_eq!(first.outcome.try_recv(), Ok(WaitEnd::Granted { token: 9 }));
    assert_eq!(retry.outcome.try_recv(), Ok(WaitEnd::Granted { token: 9 }));
    let mut left = hub.register_waiter(SessionId(1), "y", RequestId(3));
    let again = hub.register_waiter(SessionId(1), "y", RequestId(3));
    assert!(hub.forget_waiter(SessionId(1), "y", RequestId(3), again.id), "the first remains");
    assert!(!hub.forget_waiter(SessionId(1), "y", RequestId(3), left.id));
    assert!(left.outcome.try_recv().is_err());
}

/// After a snapshot each waiting request hears how its own wait stands. Before, the hub asked
/// only whether the session still waited for the lock: a request whose wait had been cancelled
/// while a newer request of the same session waited for the same lock was never answered, and
/// (found in review) once the newer one was granted, the cancelled one was told it held the
/// lock too.
#[test]
fn a_resync_answers_each_waiting_request_with_its_own_wait() {
    use picket_core::{Command, Input, Limits, Response, Wait};
    let mut machine = StateMachine::new(Limits::default());
    let mut apply = |command| machine.apply(&Input::new(0, command));
    let open = || Command::OpenSession { ttl_ms: 10_000, lock_delay_ms: 0, owner: None };
    let Ok(Response::SessionOpened { session: a, .. }) = apply(open()).result else { panic!() };
    let Ok(Response::SessionOpened { session: b, .. }) = apply(open()).result else { panic!() };
    let acquire = |session, request| Command::Acquire {
        session,
        name: "x".into(),
        wait: Wait::Forever,
        request: RequestId(request),
        attempt: 0,
    };
    let Ok(Response::Granted { token, .. }) = apply(acquire(a, 1)).result else { panic!() };
    let hub = Hub::default();
    let mut first = hub.register_waiter(b, "x", RequestId(7));
    let queued = apply(acquire(b, 7)).revision;
    hub.queued(b, "x", first.id, queued);
    // The events from here on are missed (a snapshot will carry the state past them).
    apply(Command::Cancel { session: b, name: "x".into() });
    let mut second = hub.register_waiter(b, "x", RequestId(8));
    let queued = apply(acquire(b, 8)).revision;
    hub.queued(b, "x", second.id, queued);
    apply(Command::Release { session: a, name: "x".into(), token });

    hub.resync(&machine);
    let cancelled = WaitEnd::Cancelled { cause: CancelCause::Requested };
    assert_eq!(first.outcome.try_recv(), Ok(cancelled), "request 7's wait was cancelled");
    let granted = machine.lock("x").and_then(|lock| lock.holder).expect("granted to 8");
    assert_eq!(second.outcome.try_recv(), Ok(WaitEnd::Granted { token: granted.token }));
    assert_eq!(hub.waiting_acquires(), 0);
}

impl Hub {
    /// Entries held: one per session of a watch of many, one per other watch. Checks that the
    /// hub's own count, which its sweeps go by, is exact.
    fn watcher_entries(&self) -> usize {
        let watchers = lock(&self.watchers);
        let held = watchers
            .by_session
            .values()
            .chain(watchers.by_lock.values())
            .chain(watchers.by_prefix.values())
            .map(|keyed| keyed.len())
            .sum();
        assert_eq!(watchers.entries, held, "the hub's count of its entries");
        held
    }
}

/// A dropped watch gives its places back at once, and the entries of dropped watches are swept
/// without piling up, of sessions that never have another event too, and only theirs
/// (regressions: closed watches were swept only every so many registrations and held their
/// places until then; a sweep of every watcher every 256 registrations made each of a million
/// sessions' opens cost thousands of steps; dropping each stream's entries key by key cost
/// every entry under each of its keys).
#[test]
fn dropped_watches_give_their_places_back_at_once_and_are_swept_without_piling_up() {
    let hub = Hub::default();
    let live =
        hub.watch(Watched::SessionLosses((1..=5_000).map(SessionId).collect())).expect("a watch");
    let _lock = hub.watch(Watched::Lock("x".into())).expect("a watch");
    let _prefix = hub.watch(Watched::Prefix("x/".into())).expect("a watch");
    for round in 0..200_u64 {
        let first = 4_500 + round * 1_000;
        let dropped = hub
            .watch(Watched::SessionLosses((first..first + 1_000).map(SessionId).collect()))
            .expect("a watch");
        let single = hub.watch(Watched::Session(SessionId(first))).expect("a watch");
        let lock = hub.watch(Watched::Lock("x".into())).expect("a watch");
        let prefix = hub.watch(Watched::Prefix("x/".into())).expect("a watch");
        assert_eq!(hub.watched_sessions(), 5_000 + 1_000 + 1);
        drop((dropped, single, lock, prefix));
        assert_eq!(hub.watched_sessions(), 5_000, "round {round}: places come back at once");
        let entries = hub.watcher_entries();
        assert!(entries <= 2 * (5_000 + 2) + 1_004 + MIN_SWEEP_ENTRIES, "round {round}: {entries}");
    }
    // Only the dropped watches' entries went: the live ones still get their events.
    let mut live = live;
    let ended =
        Event::SessionEnded { session: SessionId(4_999), cause: picket_core::SessionEnd::Closed };
    hub.publish(9, &[ended]);
    assert_eq!(revisions(&mut live), [9]);
    drop(live);
    assert_eq!(hub.watched_sessions(), 0);
    // 4,999 closed entries are more than half of all: a sweep starts, and its close takes a
    // step as long as its own entries; the next call into the fan-out takes the rest.
    hub.publish(
        10,
        &[Event::SessionEnded { session: SessionId(1), cause: picket_core::SessionEnd::Closed }],
    );
    assert_eq!(hub.watcher_entries(), 2);
}

/// helper-67's audit (2026-12-06): 10,000 streams of 10,000 sessions each could make a node
/// hold 10⁸ entries in the fan-out. Every entry under a session now holds a place of
/// `--max-watched-sessions`; past it a watch gets 429 `too_many_watched_sessions`. A place comes
/// back when its entry goes: its session ended (but a stream's last), or its stream ended. (The
/// first version counted a stream's sessions for its whole life, so a long-lived client's
/// closed sessions would have used the bound up; found in review.)
#[test]
fn watched_sessions_are_bounded_per_node_and_come_back_as_sessions_and_streams_end() {
    let hub = Hub::new(3);
    let ended = |session| Event::SessionEnded {
        session: SessionId(session),
        cause: picket_core::SessionEnd::Closed,
    };
    let first = hub.watch(Watched::Sessions(vec![SessionId(1); 3])).expect("a watch");
    let both = hub
        .watch(Watched::SessionLosses(vec![SessionId(2), SessionId(3)]))
        .expect("two more, counted once each");
    assert_eq!(hub.watched_sessions(), 3);
    let refused = hub.watch(Watched::Session(SessionId(4))).expect_err("over the bound");
    assert_eq!(refused.code(), picket_core::ErrorCode::TooManyWatchedSessions);
    assert_eq!(refused.http_status(), 429);
    let _lock = hub.watch(Watched::Lock("x".into())).expect("a lock's watch holds no place");
    hub.publish(5, &[ended(2)]);
    assert_eq!(hub.watched_sessions(), 2, "an ended session's place comes back");
    let _fourth = hub.watch(Watched::Session(SessionId(4))).expect("the place that came back");
    hub.publish(6, &[ended(3)]);
    assert_eq!(hub.watched_sessions(), 3, "a stream's last entry keeps its place");
    drop(both);
    drop(first);
    assert_eq!(hub.watched_sessions(), 1, "an ended stream's places come back at once");
    let _again = hub.watch(Watched::Sessions(vec![SessionId(5), SessionId(6)])).expect("a watch");
    assert_eq!(hub.watched_sessions(), 3);
}

/// helper-73's review: the count the sweep goes by only grew between sweeps, so after a set's
/// entries went with their sessions' ends, closed watches' entries piled up far past half of
/// what was held before a sweep came. The count is exact now.
#[test]
fn closed_watches_are_swept_by_what_is_held_now_not_what_was_registered() {
    let hub = Hub::default();
    let mut set =
        hub.watch(Watched::SessionLosses((1..=10_000).map(SessionId).collect())).expect("a watch");
    for session in 1..=10_000 {
        let ended = Event::SessionEnded {
            session: SessionId(session),
            cause: picket_core::SessionEnd::Closed,
        };
        hub.publish(session, &[ended]);
        // Read as it goes, so that it does not fall behind.
        assert_eq!(revisions(&mut set), [session]);
    }
    assert_eq!(hub.watcher_entries(), 1, "the set keeps its last entry");
    for _ in 0..300 {
        drop(hub.watch(Watched::Session(SessionId(20_000))).expect("a watch"));
    }
    let held = hub.watcher_entries();
    assert!(held <= 1 + MIN_SWEEP_ENTRIES, "{held} entries held: closed ones were not swept");
    drop(set);
}

fn ended(session: u64) -> Event {
    Event::SessionEnded { session: SessionId(session), cause: picket_core::SessionEnd::Closed }
}

/// The leftover noted on 2026-12-06: a sweep was one pass over every entry the fan-out held,
/// under the lock applying takes: 0.25–0.29 s at a million entries. Now no call looks at more
/// entries than a step, or than its own, however many are held.
#[test]
fn a_sweep_never_pauses_applying_for_a_pass_over_every_entry() {
    let hub = Hub::new(1_000_000);
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for stream in 0..40_u64 {
        let sessions = (stream * 1_000..(stream + 1) * 1_000).map(SessionId).collect();
        let watch = hub.watch(Watched::SessionLosses(sessions)).expect("a watch");
        if stream % 2 == 0 { kept.push(watch) } else { dropped.push(watch) }
    }
    assert_eq!(hub.watcher_entries(), 40_000);
    drop(dropped);
    // Each later call takes a step, until every closed entry went.
    let mut calls = 0;
    while hub.watcher_entries() > 20_000 {
        calls += 1;
        assert!(calls <= 20, "a sweep's steps end: {} entries held", hub.watcher_entries());
        hub.publish(100_000 + calls, &[ended(1_000_000 + calls)]);
    }
    assert_eq!(hub.watcher_entries(), 20_000, "only the closed streams' entries went");
    let longest = lock(&hub.watchers).longest_step;
    // A step's bound (`SWEEP_STEP_ENTRIES`), a twentieth of the entries held.
    assert!(longest <= 2_048, "one step looked at {longest} entries");
    // The kept streams still hear of their sessions.
    hub.publish(7, &[ended(0)]);
    assert_eq!(revisions(&mut kept[0]), [7]);
}

/// helper-79's review: a sweep started only when a stream closed, so streams closed while one
/// was under way waited for a later close, however many other calls came: two streams that
/// were all the hub held, dropped one after the other, left the second's entries for good.
#[test]
fn streams_closed_during_a_sweep_are_swept_by_later_calls_without_another_close() {
    let hub = Hub::new(1_000_000);
    let first =
        hub.watch(Watched::Sessions((0..10_000).map(SessionId).collect())).expect("a watch");
    let second =
        hub.watch(Watched::Sessions((10_000..20_000).map(SessionId).collect())).expect("a watch");
    drop(first);
    drop(second);
    for call in 1..=10 {
        hub.publish(call, &[ended(100_000 + call)]);
    }
    assert_eq!(hub.watcher_entries(), 0, "both closed streams' entries went");
}

/// A key is looked under once a sweep, however many streams closed under it: 200 streams of the
/// same 100 sessions, half of them closed, cost the sweep about the entries held, not each
/// closed stream a look at every entry under its keys (the review's 2,000,000 steps).
#[test]
fn a_sweep_looks_under_each_key_once_however_many_streams_closed_under_it() {
    let hub = Hub::new(1_000_000);
    let sessions: Vec<SessionId> = (1..=100).map(SessionId).collect();
    let mut watches: Vec<_> = (0..200)
        .map(|_| hub.watch(Watched::Sessions(sessions.clone())).expect("a watch"))
        .collect();
    let closed: Vec<_> = watches.drain(100..).collect();
    drop(closed);
    let mut calls = 0;
    while lock(&hub.watchers).sweep.running() {
        calls += 1;
        assert!(calls <= 100, "a sweep's steps end");
        hub.publish(1_000 + calls, &[ended(10_000 + calls)]);
    }
    assert_eq!(hub.watcher_entries(), 10_000, "the closed streams' entries went");
    let looked_at = lock(&hub.watchers).looked_at_in_sweeps;
    assert!(looked_at <= 2 * 20_000, "the sweeps looked at {looked_at} entries for 20,000 held");
    drop(watches);
}

/// Not a test: the pause a sweep makes on the apply path, for BENCHMARKS.md ("What a sweep of
/// closed watches costs"): the longest call into the fan-out while half of the streams close
/// and later publishes take the sweep's steps. Run with
/// `cargo test --release -p picket-server --lib sweep_pause -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a test: it asserts nothing about time"]
fn sweep_pause() {
    for streams in [20_u64, 100, 200] {
        let hub = Hub::new(10_000_000);
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        for n in 0..streams {
            let ids: Vec<SessionId> = (n * 10_000..(n + 1) * 10_000).map(SessionId).collect();
            let watch = hub.watch(Watched::SessionLosses(ids)).expect("a watch");
            if n % 2 == 0 { kept.push(watch) } else { dropped.push(watch) }
        }
        let mut longest_drop = std::time::Duration::ZERO;
        for watch in dropped {
            let started = std::time::Instant::now();
            drop(watch);
            longest_drop = longest_drop.max(started.elapsed());
        }
        let (mut longest_publish, mut publishes) = (std::time::Duration::ZERO, 0_u64);
        while lock(&hub.watchers).sweep.running() {
            publishes += 1;
            let event = ended(u64::MAX - publishes);
            let started = std::time::Instant::now();
            hub.publish(publishes, &[event]);
            longest_publish = longest_publish.max(started.elapsed());
        }
        println!(
            "{} entries: the longest drop took {longest_drop:?}; then {publishes} publishes \
             finished the sweep, the longest in {longest_publish:?}",
            streams * 10_000
        );
    }
}
