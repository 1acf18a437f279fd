//! Transcript tests: each drives the state machine through a story and compares what it printed
//! with the expected transcript, line by line, so a reader sees the whole behaviour at once.

use picket_core::{
    APPLY_RULES, Applied, CancelCause, CheckOutcome, Command, CommandError, ErrorCode, Event,
    Input, Limits, MAX_OWNER_BYTES, NameError, RequestId, Response, Sequencer, SessionId,
    StateMachine, Wait, WaitEnd,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Drives a state machine with sessions named by letters and records a transcript.
struct Story {
    machine: StateMachine,
    names: BTreeMap<String, SessionId>,
    transcript: String,
    /// The apply rules the story's entries are written under.
    rules: u32,
}

impl Story {
    fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    fn with_limits(limits: Limits) -> Self {
        Self {
            machine: StateMachine::new(limits),
            names: BTreeMap::new(),
            transcript: String::new(),
            rules: APPLY_RULES,
        }
    }

    fn id(&self, who: &str) -> SessionId {
        self.names[who]
    }

    fn who(&self, session: SessionId) -> String {
        self.names
            .iter()
            .find(|(_, id)| **id == session)
            .map_or_else(|| session.to_string(), |(name, _)| name.clone())
    }

    fn run(&mut self, now_ms: u64, command: Command) -> Applied {
        let before = self.machine.snapshot();
        let line = self.describe(&command);
        let applied =
            self.machine.apply(&Input { rules: self.rules, ..Input::new(now_ms, command) });
        self.machine.check_invariants().expect("invariants hold after every step");
        if applied.result.is_err() {
            assert_eq!(before, self.machine.snapshot(), "a refused command changes nothing");
        }
        let outcome = match &applied.result {
            Ok(response) => self.describe_response(response),
            Err(error) => format!("refused {}", error.code()),
        };
        writeln!(self.transcript, "t={now_ms} {line} -> {outcome}").unwrap();
        for event in &applied.events {
            let event = self.describe_event(event);
            writeln!(self.transcript, "    {event}").unwrap();
        }
        applied
    }

    fn open(&mut self, now_ms: u64, who: &str, ttl_ms: u64, lock_delay_ms: u64) -> SessionId {
        let applied = self.run(now_ms, Command::OpenSession { ttl_ms, lock_delay_ms, owner: None });
        let Ok(Response::SessionOpened { session, .. }) = applied.result else {
            panic!("open failed: {:?}", applied.result)
        };
        self.names.insert(who.to_owned(), session);
        // Re-render the line with the session's letter now that it is known.
        let last = self.transcript.lines().count() - 1;
        let lines: Vec<String> = self.transcript.lines().map(str::to_owned).collect();
        self.transcript = lines[..last].iter().map(|line| format!("{line}\n")).collect();
        writeln!(self.transcript, "t={now_ms} open {who} ttl={ttl_ms} delay={lock_delay_ms}")
            .unwrap();
        session
    }

    /// An acquire under request 0: asked again, it is the same request.
    fn acquire(&mut self, now_ms: u64, who: &str, name: &str, wait: Wait) -> Applied {
        self.acquire_as(now_ms, who, name, wait, 0)
    }

    fn acquire_as(
        &mut self,
        now_ms: u64,
        who: &str,
        name: &str,
        wait: Wait,
        request: u64,
    ) -> Applied {
        self.acquire_attempt(now_ms, who, name, wait, (request, 0))
    }

    fn acquire_attempt(
        &mut self,
        now_ms: u64,
        who: &str,
        name: &str,
        wait: Wait,
        (request, attempt): (u64, u32),
    ) -> Applied {
        let session = self.id(who);
        let request = RequestId(request);
        let name = name.to_owned();
        self.run(now_ms, Command::Acquire { session, name, wait, request, attempt })
    }

    fn abandon(&mut self, now_ms: u64, who: &str, name: &str, request: u64) -> Applied {
        self.abandon_attempt(now_ms, who, name, (request, 0))
    }

    fn abandon_attempt(
        &mut self,
        now_ms: u64,
        who: &str,
        name: &str,
        (request, attempt): (u64, u32),
    ) -> Applied {
        let session = self.id(who);
        let request = RequestId(request);
        self.run(now_ms, Command::Abandon { session, name: name.to_owned(), request, attempt })
    }

    fn release(&mut self, now_ms: u64, who: &str, name: &str, token: u64) -> Applied {
        let session = self.id(who);
        self.run(now_ms, Command::Release { session, name: name.to_owned(), token })
    }

    fn tick(&mut self, now_ms: u64, renew: &[&str]) -> Applied {
        let renew = renew.iter().map(|who| self.id(who)).collect();
        self.run(now_ms, Command::Tick { renew, renew_for: Vec::new() })
    }

    fn describe(&self, command: &Command) -> String {
        match command {
            Command::OpenSession { ttl_ms, lock_delay_ms, .. } => {
                format!("open ttl={ttl_ms} delay={lock_delay_ms}")
            }
            Command::KeepAlive { session } => format!("keepalive {}", self.who(*session)),
            Command::CloseSession { session } => format!("close {}", self.who(*session)),
            Command::RevokeSession { session } => format!("revoke {}", self.who(*session)),
            Command::Acquire { session, name, wait, request: RequestId(0), attempt: 0 } => {
                format!("acquire {} {name:?} {wait:?}", self.who(*session))
            }
            Command::Acquire { session, name, wait, request, attempt: 0 } => {
                format!("acquire {} {name:?} {wait:?} request={request}", self.who(*session))
            }
            Command::Acquire { session, name, wait, request, attempt } => format!(
                "acquire {} {name:?} {wait:?} request={request} attempt={attempt}",
                self.who(*session)
            ),
            Command::Abandon { session, name, request, attempt: 0 } => {
                format!("abandon {} {name:?} request={request}", self.who(*session))
            }
            Command::Abandon { session, name, request, attempt } => format!(
                "abandon {} {name:?} request={request} attempt={attempt}",
                self.who(*session)
            ),
            Command::Cancel { session, name } => format!("cancel {} {name:?}", self.who(*session)),
            Command::Release { session, name, token } => {
                format!("release {} {name:?} token={token}", self.who(*session))
            }
            Command::Tick { renew, .. } => {
                let renew: Vec<String> = renew.iter().map(|id| self.who(*id)).collect();
                format!("tick renew=[{}]", renew.join(","))
            }
            Command::Refresh => "refresh".to_owned(),
            other => format!("{other}"),
        }
    }

    fn describe_response(&self, response: &Response) -> String {
        match response {
            Response::Granted { token, already_held, .. } => {
                format!(
                    "granted token={token}{}",
                    if *already_held { " (already held)" } else { "" }
                )
            }
            Response::Queued { position, .. } => format!("queued position={position}"),
            Response::KeptAlive { deadline_ms, .. } => format!("deadline={deadline_ms}"),
            Response::SessionOpened { .. } => "opened".to_owned(),
            Response::SessionEnded { .. } => "ended".to_owned(),
            Response::Released { .. } => "released".to_owned(),
            Response::Cancelled { .. } => "cancelled".to_owned(),
            Response::Abandoned { released_token: Some(token), .. } => {
                format!("abandoned, released token={token}")
            }
            // Whether a wait was cancelled shows in the events.
            Response::Abandoned { released_token: None, .. } => "abandoned".to_owned(),
            Response::Ticked => "ok".to_owned(),
            Response::Refreshed => "refreshed".to_owned(),
            other => format!("{other:?}"),
        }
    }

    fn describe_event(&self, event: &Event) -> String {
        match event {
            Event::Granted { name, session, token } => {
                format!("granted {name:?} to {} token={token}", self.who(*session))
            }
            Event::Released { name, session, token, cause } => {
                format!("released {name:?} by {} token={token} ({cause:?})", self.who(*session))
            }
            Event::Queued { name, session, position } => {
                format!("queued {} for {name:?} at {position}", self.who(*session))
            }
            Event::Cancelled { name, session, cause } => {
                format!("cancelled {} for {name:?} ({cause:?})", self.who(*session))
            }
            Event::SessionEnded { session, cause } => {
                format!("session {} ended ({cause:?})", self.who(*session))
            }
            other => format!("{other:?}"),
        }
    }

    fn assert_transcript(&self, expected: &str) {
        let normalize = |text: &str| -> Vec<String> {
            text.lines().map(str::trim).filter(|line| !line.is_empty()).map(str::to_owned).collect()
        };
        assert_eq!(
            normalize(&self.transcript),
            normalize(expected),
            "\nactual transcript:\n{}",
            self.transcript
        );
    }
}

fn error_of(applied: &Applied) -> CommandError {
    applied.result.clone().expect_err("the command should be refused")
}

/// The seeds' canonical race, as the lock service sees it: A holds token t, pauses, its session
/// expires, B is granted t' > t, and A's sequencer is no longer current.
#[test]
fn canonical_trace_expired_holder_is_superseded_by_a_greater_token() {
    let mut story = Story::new();
    story.open(0, "A", 2_000, 0);
    story.open(0, "B", 2_000, 0);
    let granted = story.acquire(10, "A", "res", Wait::Try);
    let Ok(Response::Granted { token: token_a, .. }) = granted.result else { panic!() };
    story.acquire(20, "B", "res", Wait::Forever);
    // A is paused: only B's keepalives reach the service.
    story.tick(1_000, &["B"]);
    // A's deadline is 2,000; it lives through the 500 ms grace and expires after it.
    story.tick(2_500, &["B"]);
    story.tick(2_501, &["B"]);
    story.assert_transcript(
        "
        t=0 open A ttl=2000 delay=0
        t=0 open B ttl=2000 delay=0
        t=10 acquire A \"res\" Try -> granted token=3
            granted \"res\" to A token=3
        t=20 acquire B \"res\" Forever -> queued position=0
            queued B for \"res\" at 0
        t=1000 tick renew=[B] -> ok
        t=2500 tick renew=[B] -> ok
        t=2501 tick renew=[B] -> ok
            released \"res\" by A token=3 (SessionExpired)
            session A ended (Expired)
            granted \"res\" to B token=7
        ",
    );
    let holder = story.machine.lock("res").unwrap().holder.unwrap();
    assert!(holder.token > token_a);
    assert_eq!(
        story.machine.check(&Sequencer::new("res", token_a)),
        CheckOutcome::Superseded { current_token: Some(holder.token) }
    );
    assert_eq!(
        story.machine.check(&Sequencer::new("res", holder.token)),
        CheckOutcome::Current { session: story.id("B") }
    );
}

/// Waiters are granted strictly in arrival order, and each grant's token exceeds the last.
#[test]
fn waiters_are_granted_in_fifo_order_with_growing_tokens() {
    let mut story = Story::new();
    for who in ["A", "B", "C", "D"] {
        story.open(0, who, 5_000, 0);
    }
    story.acquire(1, "A", "q", Wait::Forever);
    story.acquire(2, "C", "q", Wait::Forever);
    story.acquire(3, "B", "q", Wait::For { wait_ms: 1_000 });
    story.acquire(4, "D", "q", Wait::Forever);
    let info = story.machine.lock("q").unwrap();
    assert_eq!(info.waiters, vec![story.id("C"), story.id("B"), story.id("D")]);
    let mut last_token = info.holder.unwrap().token;
    let mut order = Vec::new();
    for (now_ms, _) in (10..).zip(0..4) {
        let holder = story.machine.lock("q").unwrap().holder.unwrap();
        order.push(story.who(holder.session));
        let who = story.who(holder.session);
        story.release(now_ms, &who, "q", holder.token);
        if let Some(next) = story.machine.lock("q").and_then(|info| info.holder) {
            assert!(next.token > last_token);
            last_token = next.token;
        }
    }
    assert_eq!(order, ["A", "C", "B", "D"]);
    assert_eq!(story.machine.lock("q"), None, "an idle lock keeps no record");
}

/// Acquiring a lock the session already holds returns the same grant, with no re-entry count:
/// one release frees it.
#[test]
fn reacquire_by_holder_returns_the_same_token() {
    let mut story = Story::new();
    story.open(0, "A", 2_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    story.acquire(2, "A", "x", Wait::Forever);
    story.release(3, "A", "x", 2);
    story.assert_transcript(
        "
        t=0 open A ttl=2000 delay=0
        t=1 acquire A \"x\" Try -> granted token=2
            granted \"x\" to A token=2
        t=2 acquire A \"x\" Forever -> granted token=2 (already held)
        t=3 release A \"x\" token=2 -> released
            released \"x\" by A token=2 (Released)
        ",
    );
    assert_eq!(story.machine.lock("x"), None);
}

/// A bounded wait that runs out leaves the queue with a timeout event; a cancelled one too.
#[test]
fn bounded_waits_time_out_and_waits_can_be_cancelled() {
    let mut story = Story::new();
    story.open(0, "A", 10_000, 0);
    story.open(0, "B", 10_000, 0);
    story.open(0, "C", 10_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    story.acquire(2, "B", "x", Wait::For { wait_ms: 100 });
    story.acquire(3, "C", "x", Wait::Forever);
    story.tick(102, &[]);
    story.tick(103, &[]);
    let session = story.id("C");
    story.run(104, Command::Cancel { session, name: "x".into() });
    story.run(105, Command::Cancel { session, name: "x".into() });
    story.assert_transcript(
        "
        t=0 open A ttl=10000 delay=0
        t=0 open B ttl=10000 delay=0
        t=0 open C ttl=10000 delay=0
        t=1 acquire A \"x\" Try -> granted token=4
            granted \"x\" to A token=4
        t=2 acquire B \"x\" For { wait_ms: 100 } -> queued position=0
            queued B for \"x\" at 0
        t=3 acquire C \"x\" Forever -> queued position=1
            queued C for \"x\" at 1
        t=102 tick renew=[] -> ok
        t=103 tick renew=[] -> ok
            cancelled B for \"x\" (TimedOut)
        t=104 cancel C \"x\" -> cancelled
            cancelled C for \"x\" (Requested)
        t=105 cancel C \"x\" -> refused not_waiting
        ",
    );
}

/// After a session expires, its locks stay ungrantable for its lock-delay, even to a waiter, and
/// a try-acquire is told when the delay ends. A voluntary close applies no delay.
#[test]
fn lock_delay_holds_the_lock_after_expiry_but_not_after_close() {
    let mut story = Story::new();
    story.open(0, "A", 1_000, 500);
    story.open(0, "B", 10_000, 0);
    story.open(0, "C", 10_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    story.acquire(2, "B", "x", Wait::Forever);
    // A's deadline is 1,000; past its 500 ms grace it expires, and its delay starts then.
    story.tick(1_500, &[]);
    assert_eq!(story.machine.lock("x").unwrap().holder.unwrap().session, story.id("A"));
    story.tick(1_501, &[]);
    let delayed = story.acquire(1_600, "C", "x", Wait::Try);
    assert_eq!(error_of(&delayed), CommandError::LockDelayed { name: "x".into(), until_ms: 2_001 });
    story.tick(2_000, &[]);
    assert_eq!(story.machine.lock("x").unwrap().holder, None, "still inside the delay");
    story.tick(2_001, &[]);
    assert_eq!(story.machine.lock("x").unwrap().holder.unwrap().session, story.id("B"));

    let mut story = Story::new();
    story.open(0, "A", 1_000, 500);
    story.open(0, "B", 10_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    story.acquire(2, "B", "x", Wait::Forever);
    let session = story.id("A");
    story.run(3, Command::CloseSession { session });
    assert_eq!(story.machine.lock("x").unwrap().holder.unwrap().session, story.id("B"));
}

/// Issue 21: a tick expires by its own reading of the leader's clock. The leader reads its clock
/// and then takes the keepalives it holds; an acquire stamped later can reach the log first and
/// move the state's clock on, yet the tick must not expire a session whose keepalive the leader
/// acknowledged after the tick's reading (that keepalive rides in the next tick).
#[test]
fn a_tick_expires_by_its_own_stamp_even_behind_the_state_clock() {
    let mut story = Story::new();
    story.open(0, "A", 1_000, 0);
    story.open(0, "B", 10_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    // Stamped 1,600 (past A's deadline and grace), applied before the tick stamped 1,400.
    story.acquire(1_600, "B", "y", Wait::Try);
    story.tick(1_400, &[]);
    assert!(story.machine.session(story.id("A")).is_some(), "A expires by the tick's stamp");
    assert_eq!(story.machine.now_ms(), 1_600, "the state's clock never goes back");
    story.tick(1_501, &[]);
    assert!(story.machine.session(story.id("A")).is_none(), "A expires past its grace");
}

/// A new leader's refresh gives every session a full TTL on the new clock, so a session is not
/// expired early because the new leader's clock reads far ahead of the old one's.
#[test]
fn refresh_gives_every_session_a_full_ttl_on_the_new_clock() {
    let mut story = Story::new();
    story.open(0, "A", 2_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    // The new leader's monotonic clock reads 1,000,000 ms.
    story.run(1_000_000, Command::Refresh);
    story.tick(1_002_500, &[]);
    assert!(story.machine.lock("x").is_some(), "A keeps its lock within its full TTL and grace");
    story.tick(1_002_501, &[]);
    assert!(story.machine.lock("x").is_none(), "A expires a full TTL and grace after the refresh");
}

/// Operators can revoke a session: like expiry, it releases its locks and applies lock-delay.
#[test]
fn revoke_releases_locks_and_applies_lock_delay() {
    let mut story = Story::new();
    story.open(0, "A", 10_000, 300);
    story.acquire(1, "A", "x", Wait::Try);
    let session = story.id("A");
    story.run(2, Command::RevokeSession { session });
    assert_eq!(story.machine.lock("x").unwrap().delayed_until_ms, Some(302));
    story.tick(302, &[]);
    assert_eq!(story.machine.lock("x"), None);
}

/// Releasing takes the holder's session and its current token; anything else is refused and
/// changes nothing.
#[test]
fn release_with_a_wrong_token_or_by_another_session_is_refused() {
    let mut story = Story::new();
    story.open(0, "A", 10_000, 0);
    story.open(0, "B", 10_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    assert_eq!(
        error_of(&story.release(2, "A", "x", 2)),
        CommandError::TokenMismatch { name: "x".into(), presented_token: 2, current_token: 3 }
    );
    assert_eq!(
        error_of(&story.release(2, "B", "x", 3)),
        CommandError::NotHeld { name: "x".into(), session: story.id("B"), holder_token: Some(3) }
    );
    assert_eq!(
        error_of(&story.release(2, "B", "y", 3)),
        CommandError::NotHeld { name: "y".into(), session: story.id("B"), holder_token: None }
    );
    let unknown =
        story.run(2, Command::Release { session: SessionId(999), name: "x".into(), token: 3 });
    assert_eq!(error_of(&unknown), CommandError::UnknownSession { session: SessionId(999) });
}

/// Every bad input gets its own typed error and changes nothing (`Story::run` checks the
/// snapshot is unchanged after every refusal).
#[test]
fn bad_input_is_refused_with_a_typed_error() {
    let limits = Limits::default();
    let mut story = Story::new();
    story.open(0, "A", 2_000, 0);
    let over_long = "n".repeat(limits.max_name_bytes + 1);
    let cases: Vec<(Command, CommandError)> = vec![
        (
            Command::OpenSession { ttl_ms: 0, lock_delay_ms: 0, owner: None },
            CommandError::TtlOutOfRange { ttl_ms: 0, min_ttl_ms: 1_000, max_ttl_ms: 3_600_000 },
        ),
        (
            Command::OpenSession { ttl_ms: limits.max_ttl_ms + 1, lock_delay_ms: 0, owner: None },
            CommandError::TtlOutOfRange {
                ttl_ms: 3_600_001,
                min_ttl_ms: 1_000,
                max_ttl_ms: 3_600_000,
            },
        ),
        (
            Command::OpenSession {
                ttl_ms: 2_000,
                lock_delay_ms: limits.max_lock_delay_ms + 1,
                owner: None,
            },
            CommandError::LockDelayOutOfRange { lock_delay_ms: 60_001, max_lock_delay_ms: 60_000 },
        ),
        (
            Command::OpenSession { ttl_ms: 2_000, lock_delay_ms: 0, owner: Some(String::new()) },
            CommandError::InvalidOwner { owner_bytes: 0, max_owner_bytes: MAX_OWNER_BYTES },
        ),
        (
            Command::OpenSession {
                ttl_ms: 2_000,
                lock_delay_ms: 0,
                owner: Some("o".repeat(MAX_OWNER_BYTES + 1)),
            },
            CommandError::InvalidOwner { owner_bytes: 129, max_owner_bytes: MAX_OWNER_BYTES },
        ),
        (
            Command::Acquire {
                session: story.id("A"),
                name: String::new(),
                wait: Wait::Try,
                request: RequestId(0),
                attempt: 0,
            },
            CommandError::InvalidName(NameError::Empty),
        ),
        (
            Command::Acquire {
                session: story.id("A"),
                name: over_long,
                wait: Wait::Try,
                request: RequestId(0),
                attempt: 0,
            },
            CommandError::InvalidName(NameError::TooLong { len_bytes: 257, max_bytes: 256 }),
        ),
        (
            Command::Acquire {
                session: story.id("A"),
                name: "a\u{7}b".into(),
                wait: Wait::Try,
                request: RequestId(0),
                attempt: 0,
            },
            CommandError::InvalidName(NameError::ControlCharacter { index_bytes: 1 }),
        ),
        (
            Command::Acquire {
                session: story.id("A"),
                name: "x".into(),
                wait: Wait::For { wait_ms: limits.max_wait_ms + 1 },
                request: RequestId(0),
                attempt: 0,
            },
            CommandError::WaitOutOfRange { wait_ms: 3_600_001, max_wait_ms: 3_600_000 },
        ),
        (
            Command::Acquire {
                session: SessionId(77),
                name: "x".into(),
                wait: Wait::Try,
                request: RequestId(0),
                attempt: 0,
            },
            CommandError::UnknownSession { session: SessionId(77) },
        ),
        (
            Command::KeepAlive { session: SessionId(77) },
            CommandError::UnknownSession { session: SessionId(77) },
        ),
        (
            Command::CloseSession { session: SessionId(77) },
            CommandError::UnknownSession { session: SessionId(77) },
        ),
        (
            Command::Cancel { session: story.id("A"), name: "x".into() },
            CommandError::NotWaiting { name: "x".into(), session: story.id("A") },
        ),
    ];
    for (command, expected) in cases {
        let applied = story.run(5, command);
        let error = error_of(&applied);
        assert_eq!(error, expected);
        assert!(!error.to_string().is_empty());
    }
}

/// Each count limit refuses the command that would cross it.
#[test]
fn count_limits_are_enforced() {
    let limits = Limits {
        max_sessions: 3,
        max_locks_per_session: 2,
        max_waiters_per_lock: 1,
        max_list: 2,
        max_renewals_per_tick: 3,
        ..Limits::default()
    };
    let mut story = Story::with_limits(limits);
    story.open(0, "A", 2_000, 0);
    story.open(0, "B", 2_000, 0);
    story.open(0, "C", 2_000, 0);
    let fourth =
        story.run(0, Command::OpenSession { ttl_ms: 2_000, lock_delay_ms: 0, owner: None });
    assert_eq!(error_of(&fourth), CommandError::TooManySessions { max_sessions: 3 });

    story.acquire(1, "A", "x", Wait::Try);
    story.acquire(1, "A", "y", Wait::Try);
    let third = story.acquire(1, "A", "z", Wait::Try);
    assert_eq!(
        error_of(&third),
        CommandError::TooManyLocksForSession { session: story.id("A"), max_locks: 2 }
    );

    story.acquire(2, "B", "x", Wait::Forever);
    let queue_full = story.acquire(2, "C", "x", Wait::Forever);
    assert_eq!(
        error_of(&queue_full),
        CommandError::TooManyWaiters { name: "x".into(), max_waiters: 1 }
    );

    assert_eq!(story.machine.locks("", None, 100).len(), 2, "listings are capped");
    assert_eq!(story.machine.sessions(None, 100).len(), 2, "listings are capped");

    let ids = vec![story.id("A"); 4];
    let too_many = story.run(3, Command::Tick { renew: ids, renew_for: Vec::new() });
    assert_eq!(error_of(&too_many), CommandError::TooManyRenewals { count: 4, max: 3 });
}

/// Issue 13, point 2: nothing bounded the lock records in total. A new lock past `max_locks` is
/// refused; a lock that already has a record is still granted and queued for.
#[test]
fn lock_records_in_total_are_bounded() {
    let limits = Limits { max_locks: 2, ..Limits::default() };
    let mut story = Story::with_limits(limits);
    story.open(0, "A", 2_000, 0);
    story.open(0, "B", 2_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    story.acquire(1, "A", "y", Wait::Try);
    let third = story.acquire(1, "B", "z", Wait::Forever);
    assert_eq!(error_of(&third), CommandError::TooManyLocks { max_locks: 2 });
    assert_eq!(error_of(&third).code(), ErrorCode::TooManyLocks);
    let queued = story.acquire(1, "B", "x", Wait::Forever);
    assert!(queued.result.is_ok(), "an existing lock takes waiters");
    assert_eq!(story.machine.lock_count(), 2);
}

/// A try-acquire on a held lock is refused with the holder's token and leaves no trace.
#[test]
fn try_acquire_on_a_held_lock_names_the_holders_token() {
    let mut story = Story::new();
    story.open(0, "A", 2_000, 0);
    story.open(0, "B", 2_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    let busy = story.acquire(2, "B", "x", Wait::Try);
    assert_eq!(error_of(&busy), CommandError::LockBusy { name: "x".into(), holder_token: 3 });
    let zero = story.acquire(2, "B", "x", Wait::For { wait_ms: 0 });
    assert_eq!(error_of(&zero), CommandError::LockBusy { name: "x".into(), holder_token: 3 });
    assert!(story.machine.lock("x").unwrap().waiters.is_empty());
}

/// Listing by prefix returns names in order and pages with `after`.
#[test]
fn locks_list_by_prefix_in_pages() {
    let mut story = Story::new();
    story.open(0, "A", 2_000, 0);
    for name in ["jobs/a", "jobs/b", "jobs/c", "jobz", "other"] {
        story.acquire(1, "A", name, Wait::Try);
    }
    let names = |infos: Vec<picket_core::LockInfo>| -> Vec<String> {
        infos.into_iter().map(|info| info.name).collect()
    };
    assert_eq!(names(story.machine.locks("jobs/", None, 10)), ["jobs/a", "jobs/b", "jobs/c"]);
    assert_eq!(names(story.machine.locks("jobs/", None, 2)), ["jobs/a", "jobs/b"]);
    assert_eq!(names(story.machine.locks("jobs/", Some("jobs/b"), 2)), ["jobs/c"]);
    assert_eq!(names(story.machine.locks("", Some("jobz"), 10)), ["other"]);
    // A lock nobody holds: a token already issued is over, one above the revision never was.
    let superseded = CheckOutcome::Superseded { current_token: None };
    assert_eq!(story.machine.check(&Sequencer::new("nothing", 1)), superseded);
    let future = story.machine.revision() + 1;
    assert_eq!(story.machine.check(&Sequencer::new("nothing", future)), CheckOutcome::UnknownLock);
}

/// A snapshot restores to an equal state, and a damaged one is refused rather than loaded.
#[test]
fn snapshot_restores_and_damaged_snapshots_are_refused() {
    let mut story = Story::new();
    story.open(0, "A", 2_000, 100);
    story.open(0, "B", 2_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    story.acquire(1, "B", "x", Wait::For { wait_ms: 500 });
    let bytes = story.machine.snapshot();
    let restored = StateMachine::restore(&bytes).unwrap();
    assert_eq!(restored.snapshot(), bytes);
    assert!(StateMachine::restore(b"not json").is_err());
    // A snapshot whose holder lists no session is inconsistent.
    let text = String::from_utf8(bytes).unwrap();
    let broken = text.replace("\"held\":[\"x\"]", "\"held\":[]");
    assert_ne!(broken, text);
    assert!(matches!(
        StateMachine::restore(broken.as_bytes()),
        Err(picket_core::RestoreError::Inconsistent(_))
    ));
}

/// A session waits for a lock under one request at a time: the same request asked again keeps
/// its place, another request is refused rather than silently taking the wait over (issue 14,
/// point 1: two overlapping waits of one session left a ghost waiter).
#[test]
fn a_session_waits_under_one_request_at_a_time() {
    let mut story = Story::new();
    story.open(0, "A", 10_000, 0);
    story.open(0, "B", 10_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    story.acquire_as(2, "B", "x", Wait::Forever, 7);
    let refused = story.acquire_as(3, "B", "x", Wait::Forever, 8);
    story.acquire_as(4, "B", "x", Wait::For { wait_ms: 500 }, 7);
    story.assert_transcript(
        "
        t=0 open A ttl=10000 delay=0
        t=0 open B ttl=10000 delay=0
        t=1 acquire A \"x\" Try -> granted token=3
            granted \"x\" to A token=3
        t=2 acquire B \"x\" Forever request=7 -> queued position=0
            queued B for \"x\" at 0
        t=3 acquire B \"x\" Forever request=8 -> refused already_waiting
        t=4 acquire B \"x\" For { wait_ms: 500 } request=7 -> queued position=0
        ",
    );
    assert_eq!(
        error_of(&refused),
        CommandError::AlreadyWaiting {
            name: "x".into(),
            session: story.id("B"),
            waiting_request: RequestId(7)
        }
    );
}

/// Abandoning a request undoes exactly what that request did: its wait, or the grant it
/// produced, which then passes to the next waiter. The release counts as a loss
/// (`Abandoned`), not as the holder's own release.
#[test]
fn abandoning_a_request_cancels_its_wait_or_releases_its_grant() {
    let mut story = Story::new();
    story.open(0, "A", 10_000, 0);
    story.open(0, "B", 10_000, 0);
    story.open(0, "C", 10_000, 0);
    story.acquire_as(1, "A", "x", Wait::Forever, 1);
    story.acquire_as(2, "B", "x", Wait::Forever, 2);
    story.acquire_as(3, "C", "x", Wait::Forever, 3);
    story.abandon(4, "C", "x", 3);
    story.abandon(5, "A", "x", 1);
    story.abandon(6, "B", "x", 9);
    story.assert_transcript(
        "
        t=0 open A ttl=10000 delay=0
        t=0 open B ttl=10000 delay=0
        t=0 open C ttl=10000 delay=0
        t=1 acquire A \"x\" Forever request=1 -> granted token=4
            granted \"x\" to A token=4
        t=2 acquire B \"x\" Forever request=2 -> queued position=0
            queued B for \"x\" at 0
        t=3 acquire C \"x\" Forever request=3 -> queued position=1
            queued C for \"x\" at 1
        t=4 abandon C \"x\" request=3 -> abandoned
            cancelled C for \"x\" (Abandoned)
        t=5 abandon A \"x\" request=1 -> abandoned, released token=4
            released \"x\" by A token=4 (Abandoned)
            granted \"x\" to B token=8
        t=6 abandon B \"x\" request=9 -> abandoned
        ",
    );
}

/// Issue 12, bug 3: an acquire that was refused or abandoned must never release the grant an
/// earlier request of the same session produced. The abandon names its own request, which
/// produced nothing, so the earlier grant stands.
#[test]
fn abandoning_a_request_never_releases_another_requests_grant() {
    let mut story = Story::new();
    story.open(0, "S", 10_000, 0);
    story.acquire_as(1, "S", "x", Wait::Try, 1);
    story.acquire_as(2, "S", "x", Wait::For { wait_ms: 5_000 }, 2);
    story.abandon(3, "S", "x", 2);
    story.assert_transcript(
        "
        t=0 open S ttl=10000 delay=0
        t=1 acquire S \"x\" Try request=1 -> granted token=2
            granted \"x\" to S token=2
        t=2 acquire S \"x\" For { wait_ms: 5000 } request=2 -> granted token=2 (already held)
        t=3 abandon S \"x\" request=2 -> abandoned
        ",
    );
    assert_eq!(story.machine.lock("x").unwrap().holder.unwrap().token, 2);
}

/// A caller went away and retried its request: the retry (a later attempt) got the grant. The
/// first attempt's abandon, arriving late, must not release what the retry was told it holds;
/// the retry's own abandon does.
#[test]
fn abandoning_an_earlier_attempt_leaves_a_retrys_grant_alone() {
    let mut story = Story::new();
    story.open(0, "A", 10_000, 0);
    story.open(0, "S", 10_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    story.acquire_attempt(2, "S", "x", Wait::Forever, (5, 0));
    story.acquire_attempt(3, "S", "x", Wait::Forever, (5, 1));
    story.abandon_attempt(4, "S", "x", (5, 0));
    story.release(5, "A", "x", 3);
    story.acquire_attempt(6, "S", "x", Wait::Forever, (5, 2));
    story.abandon_attempt(7, "S", "x", (5, 1));
    story.abandon_attempt(8, "S", "x", (5, 2));
    story.assert_transcript(
        "
        t=0 open A ttl=10000 delay=0
        t=0 open S ttl=10000 delay=0
        t=1 acquire A \"x\" Try -> granted token=3
            granted \"x\" to A token=3
        t=2 acquire S \"x\" Forever request=5 -> queued position=0
            queued S for \"x\" at 0
        t=3 acquire S \"x\" Forever request=5 attempt=1 -> queued position=0
        t=4 abandon S \"x\" request=5 -> abandoned
        t=5 release A \"x\" token=3 -> released
            released \"x\" by A token=3 (Released)
            granted \"x\" to S token=7
        t=6 acquire S \"x\" Forever request=5 attempt=2 -> granted token=7 (already held)
        t=7 abandon S \"x\" request=5 attempt=1 -> abandoned
        t=8 abandon S \"x\" request=5 attempt=2 -> abandoned, released token=7
            released \"x\" by S token=7 (Abandoned)
        ",
    );
}

/// Issue 14: an attempt that a half-open connection delivers after its own abandon (the
/// caller gave up, or its connection broke and the node abandoned the attempt) found nothing to
/// undo when the abandon applied. It must not be granted afterwards: its caller is gone, and a
/// grant would be held by nobody for as long as the session lives. A later attempt of the same
/// request (the caller's retry) is served as usual, and so is a new request.
#[test]
fn an_attempt_arriving_after_its_abandon_is_refused_not_granted() {
    let mut story = Story::new();
    story.open(0, "S", 10_000, 0);
    story.abandon_attempt(1, "S", "x", (5, 0));
    story.acquire_attempt(2, "S", "x", Wait::Forever, (5, 0));
    story.acquire_attempt(3, "S", "y", Wait::Try, (6, 0));
    story.abandon_attempt(4, "S", "y", (6, 0));
    story.acquire_attempt(5, "S", "y", Wait::Try, (6, 0));
    story.acquire_attempt(6, "S", "x", Wait::Forever, (5, 1));
    story.acquire_attempt(7, "S", "x", Wait::Try, (7, 0));
    story.assert_transcript(
        "
        t=0 open S ttl=10000 delay=0
        t=1 abandon S \"x\" request=5 -> abandoned
        t=2 acquire S \"x\" Forever request=5 -> refused request_abandoned
        t=3 acquire S \"y\" Try request=6 -> granted token=3
            granted \"y\" to S token=3
        t=4 abandon S \"y\" request=6 -> abandoned, released token=3
            released \"y\" by S token=3 (Abandoned)
        t=5 acquire S \"y\" Try request=6 -> refused request_abandoned
        t=6 acquire S \"x\" Forever request=5 attempt=1 -> granted token=5
            granted \"x\" to S token=5
        t=7 acquire S \"x\" Try request=7 -> granted token=5 (already held)
        ",
    );
}

/// Apply rules are versioned: a log written before the abandon memory existed (rules 0) must
/// replay as it was applied then, or a node restarted on a newer build would count revisions,
/// and so tokens, differently from what it granted. Under rules 0 an abandon that finds
/// nothing is refused and nothing is remembered; the same story under rules 1 remembers it.
#[test]
fn entries_written_under_earlier_apply_rules_replay_as_they_were_applied() {
    let mut story = Story::new();
    story.rules = 0;
    story.open(0, "S", 10_000, 0);
    story.abandon_attempt(1, "S", "x", (5, 0));
    story.acquire_attempt(2, "S", "x", Wait::Try, (5, 0));
    story.rules = 1;
    story.abandon_attempt(3, "S", "y", (6, 0));
    story.acquire_attempt(4, "S", "y", Wait::Try, (6, 0));
    story.assert_transcript(
        "
        t=0 open S ttl=10000 delay=0
        t=1 abandon S \"x\" request=5 -> refused nothing_to_abandon
        t=2 acquire S \"x\" Try request=5 -> granted token=2
            granted \"x\" to S token=2
        t=3 abandon S \"y\" request=6 -> abandoned
        t=4 acquire S \"y\" Try request=6 -> refused request_abandoned
        ",
    );
}

/// Issue 14, "abandons retry for a bounded time": a caller gave up on request 1 and asked
/// again as request 2, which was answered `already_held` with request 1's grant; request 1's
/// abandon, landing late, released the grant request 2's caller holds. Under apply rules 2 a
/// grant belongs to every request told of it, and ends with the last one's abandon; the same
/// entries under rules 1 replay as they were applied then.
#[test]
fn a_late_abandon_of_the_producing_request_leaves_the_grant_to_a_request_told_of_it() {
    let mut story = Story::new();
    story.open(0, "S", 10_000, 0);
    story.acquire_as(1, "S", "x", Wait::Forever, 1);
    story.acquire_as(2, "S", "x", Wait::Forever, 2);
    story.abandon(3, "S", "x", 1);
    story.abandon(4, "S", "x", 2);
    story.rules = 1;
    story.acquire_as(5, "S", "y", Wait::Forever, 3);
    story.acquire_as(6, "S", "y", Wait::Forever, 4);
    story.abandon(7, "S", "y", 3);
    story.assert_transcript(
        "
        t=0 open S ttl=10000 delay=0
        t=1 acquire S \"x\" Forever request=1 -> granted token=2
            granted \"x\" to S token=2
        t=2 acquire S \"x\" Forever request=2 -> granted token=2 (already held)
        t=3 abandon S \"x\" request=1 -> abandoned
        t=4 abandon S \"x\" request=2 -> abandoned, released token=2
            released \"x\" by S token=2 (Abandoned)
        t=5 acquire S \"y\" Forever request=3 -> granted token=6
            granted \"y\" to S token=6
        t=6 acquire S \"y\" Forever request=4 -> granted token=6 (already held)
        t=7 abandon S \"y\" request=3 -> abandoned, released token=6
            released \"y\" by S token=6 (Abandoned)
        ",
    );
}

/// An entry written under apply rules newer than this build knows is refused and changes
/// nothing (the server stops before applying it: see `picket-server`'s state machine).
#[test]
fn an_entry_under_unknown_apply_rules_changes_nothing() {
    let mut story = Story::new();
    story.open(0, "S", 10_000, 0);
    story.rules = APPLY_RULES + 1;
    let applied = story.acquire_attempt(1, "S", "x", Wait::Try, (5, 0));
    assert_eq!(applied.result.unwrap_err().code(), ErrorCode::UnknownApplyRules);
    assert_eq!(story.machine.revision(), 1);
}

/// Review of the versioned apply rules: a snapshot says which rules its state was built under
/// (the newest of any accepted entry), a build that does not know them refuses it instead of
/// reading it without what it does not understand, and a state built under rules 0 alone
/// keeps the snapshot bytes older builds wrote.
#[test]
fn a_snapshot_built_under_unknown_apply_rules_is_refused() {
    let mut story = Story::new();
    story.rules = 0;
    story.open(0, "S", 10_000, 0);
    let under_rules_zero = story.machine.snapshot();
    assert!(!String::from_utf8_lossy(&under_rules_zero).contains("newest_apply_rules"));
    story.rules = APPLY_RULES;
    story.open(1, "T", 10_000, 0);
    let mut snapshot: serde_json::Value =
        serde_json::from_slice(&story.machine.snapshot()).unwrap();
    assert_eq!(snapshot["newest_apply_rules"], APPLY_RULES);
    assert!(StateMachine::restore(&serde_json::to_vec(&snapshot).unwrap()).is_ok());
    snapshot["newest_apply_rules"] = (APPLY_RULES + 1).into();
    let refused = StateMachine::restore(&serde_json::to_vec(&snapshot).unwrap()).unwrap_err();
    assert!(refused.to_string().contains("same version as the rest of the cluster"), "{refused}");
}

/// Issue 15: a session belongs to the principal that opened it. The owner is kept with the
/// session, through snapshots, and reported; a session opened without one has none, and a log
/// written before owners existed still reads.
#[test]
fn a_session_keeps_the_owner_it_was_opened_with() {
    let mut story = Story::new();
    let owned = story.run(
        0,
        Command::OpenSession { ttl_ms: 2_000, lock_delay_ms: 0, owner: Some("scheduler".into()) },
    );
    let Ok(Response::SessionOpened { session, .. }) = owned.result else {
        panic!("opened: {owned:?}")
    };
    let anonymous = story.open(0, "B", 2_000, 0);
    let restored = StateMachine::restore(&story.machine.snapshot()).unwrap();
    assert_eq!(restored.session(session).unwrap().owner.as_deref(), Some("scheduler"));
    assert_eq!(restored.session(anonymous).unwrap().owner, None);
    let old_entry = r#"{"type":"open_session","ttl_ms":2000,"lock_delay_ms":0}"#;
    let decoded: Command = serde_json::from_str(old_entry).unwrap();
    assert_eq!(decoded, Command::OpenSession { ttl_ms: 2_000, lock_delay_ms: 0, owner: None });
    assert_eq!(serde_json::to_string(&decoded).unwrap(), old_entry, "no owner, no new field");
}

/// Issue 15: a command sent by a principal in a session another principal opened is refused at
/// apply, where no check can be raced, and changes nothing; the owner itself, and a command
/// sent by no principal (an admin's), go through.
#[test]
fn a_principal_cannot_use_a_session_another_opened() {
    let mut machine = StateMachine::new(Limits::default());
    let open = Command::OpenSession { ttl_ms: 5_000, lock_delay_ms: 0, owner: Some("a".into()) };
    let Ok(Response::SessionOpened { session, .. }) = machine.apply(&Input::new(0, open)).result
    else {
        panic!("opened")
    };
    let acquire = |name: &str| Command::Acquire {
        session,
        name: name.into(),
        wait: Wait::Try,
        request: RequestId(1),
        attempt: 0,
    };
    let as_principal =
        |principal: &str, command: Command| Input::new(1, command).sent_by(Some(principal.into()));
    let before = machine.snapshot();
    let refused = machine.apply(&as_principal("b", acquire("x")));
    assert_eq!(refused.result, Err(CommandError::NotOwner { session }));
    assert_eq!(machine.snapshot(), before, "a refused command changes nothing");
    let closed = machine.apply(&as_principal("b", Command::CloseSession { session }));
    assert_eq!(closed.result, Err(CommandError::NotOwner { session }));
    assert!(machine.apply(&as_principal("a", acquire("x"))).result.is_ok());
    let admin = Input::new(2, Command::Release { session, name: "x".into(), token: 2 });
    assert!(machine.apply(&admin).result.is_ok(), "an admin's command names no principal");
}

#[test]
fn queue_summary_counts_holders_waiters_delays_and_the_longest_queues() {
    let mut story = Story::new();
    for who in ["A", "B", "C", "D", "E"] {
        story.open(0, who, 5_000, 0);
    }
    story.open(0, "L", 1_000, 3_000);
    for (holder, lock) in [("A", "one"), ("B", "two"), ("C", "three")] {
        story.acquire(1, holder, lock, Wait::Try);
    }
    for (waiter, lock) in [("D", "two"), ("E", "two"), ("D", "three")] {
        story.acquire(2, waiter, lock, Wait::Forever);
    }
    story.acquire(3, "L", "delayed", Wait::Try);
    story.tick(2_000, &["A", "B", "C", "D", "E"]);
    let summary = story.machine.queue_summary(2);
    assert_eq!(summary.held, 3, "L's grant ended with its session");
    assert_eq!(summary.waiters, 3);
    assert_eq!(summary.delayed, 1);
    assert_eq!(summary.longest, vec![("two".to_owned(), 2), ("three".to_owned(), 1)]);
    assert_eq!(story.machine.queue_summary(1).longest, vec![("two".to_owned(), 2)]);
    assert!(story.machine.queue_summary(0).longest.is_empty());
    let two = picket_core::Occupancy { held: true, waiters: 2, delayed: false };
    assert_eq!(story.machine.occupancy("two"), Some(two));
    let delayed = picket_core::Occupancy { held: false, waiters: 0, delayed: true };
    assert_eq!(story.machine.occupancy("delayed"), Some(delayed));
    assert_eq!(story.machine.occupancy("free"), None);
}

/// A holds `x`; B waits 500 ms for it under request 7 from t=2, retries at t=400, and the
/// leader ticks at t=600: under `rules`.
fn a_wait_retried_then_ticked(rules: u32) -> Story {
    let mut story = Story::new();
    story.rules = rules;
    story.open(0, "A", 10_000, 0);
    story.open(0, "B", 10_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    story.acquire_as(2, "B", "x", Wait::For { wait_ms: 500 }, 7);
    story.acquire_attempt(400, "B", "x", Wait::For { wait_ms: 500 }, (7, 1));
    story.tick(600, &["A", "B"]);
    story
}

/// Issue 14, "a retry gets the same answer, never a second wait": a retry of a request that
/// still waits joins its wait with the deadline it had (before apply rules 3 it restarted the
/// wait in full), and a retry of a request whose wait ended without the lock (timed out,
/// cancelled) gets that answer again (before, it waited a second time). A new request waits.
#[test]
fn a_retry_gets_the_answer_its_wait_ended_with_not_a_second_wait() {
    let mut story = a_wait_retried_then_ticked(APPLY_RULES);
    let timed_out = story.acquire_attempt(700, "B", "x", Wait::For { wait_ms: 500 }, (7, 2));
    story.acquire_as(800, "B", "x", Wait::Forever, 8);
    let session = story.id("B");
    story.run(900, Command::Cancel { session, name: "x".into() });
    let cancelled = story.acquire_attempt(1_000, "B", "x", Wait::Forever, (8, 1));
    story.acquire_as(1_100, "B", "x", Wait::Forever, 9);
    story.assert_transcript(
        "
        t=0 open A ttl=10000 delay=0
        t=0 open B ttl=10000 delay=0
        t=1 acquire A \"x\" Try -> granted token=3
            granted \"x\" to A token=3
        t=2 acquire B \"x\" For { wait_ms: 500 } request=7 -> queued position=0
            queued B for \"x\" at 0
        t=400 acquire B \"x\" For { wait_ms: 500 } request=7 attempt=1 -> queued position=0
        t=600 tick renew=[A,B] -> ok
            cancelled B for \"x\" (TimedOut)
        t=700 acquire B \"x\" For { wait_ms: 500 } request=7 attempt=2 -> refused wait_timed_out
        t=800 acquire B \"x\" Forever request=8 -> queued position=0
            queued B for \"x\" at 0
        t=900 cancel B \"x\" -> cancelled
            cancelled B for \"x\" (Requested)
        t=1000 acquire B \"x\" Forever request=8 attempt=1 -> refused wait_ended
        t=1100 acquire B \"x\" Forever request=9 -> queued position=0
            queued B for \"x\" at 0
        ",
    );
    assert_eq!(error_of(&timed_out).code(), ErrorCode::WaitTimedOut);
    assert_eq!(error_of(&cancelled).code(), ErrorCode::WaitEnded);
    // The same answer includes the holder's token, as the wait's own timeout said it.
    assert!(
        matches!(error_of(&timed_out), CommandError::WaitEnded { holder_token: Some(3), .. }),
        "{:?}",
        error_of(&timed_out)
    );
}

/// The same entries written under apply rules 2 replay as they were applied then: the retry
/// restarts the wait, and a retry of a timed-out request waits again.
#[test]
fn retries_under_apply_rules_2_wait_again_as_they_did() {
    let mut story = a_wait_retried_then_ticked(2);
    story.tick(950, &["A", "B"]);
    story.acquire_attempt(1_000, "B", "x", Wait::For { wait_ms: 500 }, (7, 2));
    story.assert_transcript(
        "
        t=0 open A ttl=10000 delay=0
        t=0 open B ttl=10000 delay=0
        t=1 acquire A \"x\" Try -> granted token=3
            granted \"x\" to A token=3
        t=2 acquire B \"x\" For { wait_ms: 500 } request=7 -> queued position=0
            queued B for \"x\" at 0
        t=400 acquire B \"x\" For { wait_ms: 500 } request=7 attempt=1 -> queued position=0
        t=600 tick renew=[A,B] -> ok
        t=950 tick renew=[A,B] -> ok
            cancelled B for \"x\" (TimedOut)
        t=1000 acquire B \"x\" For { wait_ms: 500 } request=7 attempt=2 -> queued position=0
            queued B for \"x\" at 0
        ",
    );
}

/// The shell lets the sync of an entry that only queues wait to be shared (nobody is answered
/// on it alone); the core says which those are, from the same plan apply follows.
#[test]
fn only_an_acquire_that_waits_only_queues() {
    let mut story = Story::new();
    story.open(0, "A", 10_000, 0);
    story.open(0, "B", 10_000, 0);
    story.acquire(1, "A", "x", Wait::Try);
    let (a, b) = (story.id("A"), story.id("B"));
    let acquire = |session, name: &str, wait, request| Command::Acquire {
        session,
        name: name.into(),
        wait,
        request: RequestId(request),
        attempt: 0,
    };
    let machine = &story.machine;
    assert!(machine.only_queues(&acquire(b, "x", Wait::Forever, 1)), "behind A's grant");
    assert!(machine.only_queues(&acquire(b, "x", Wait::For { wait_ms: 100 }, 1)));
    assert!(!machine.only_queues(&acquire(b, "x", Wait::Try, 1)), "refused: answered");
    assert!(!machine.only_queues(&acquire(b, "x", Wait::For { wait_ms: 0 }, 1)), "a try");
    assert!(!machine.only_queues(&acquire(a, "x", Wait::Forever, 2)), "already held");
    assert!(!machine.only_queues(&acquire(b, "y", Wait::Forever, 1)), "a grant");
    assert!(!machine.only_queues(&Command::KeepAlive { session: b }));
}

/// From review: a request remembered as ended can wait again through an entry of older rules (a
/// leader during the switch to rules 3 may still write one); its next retry joins that wait
/// rather than being told the wait ended: a live wait or grant wins over the memory.
#[test]
fn a_live_wait_wins_over_a_remembered_end_of_the_same_request() {
    let mut story = a_wait_retried_then_ticked(APPLY_RULES);
    story.rules = 2;
    let again = story.acquire_attempt(700, "B", "x", Wait::Forever, (7, 2));
    assert!(matches!(again.result, Ok(Response::Queued { .. })), "{:?}", again.result);
    story.rules = APPLY_RULES;
    let joined = story.acquire_attempt(800, "B", "x", Wait::Forever, (7, 3));
    assert!(matches!(joined.result, Ok(Response::Queued { .. })), "{:?}", joined.result);
}

/// `wait_end` tells a request how its own wait stands, as the events would have, so a shell
/// that lost the events in between (a snapshot replaced its state) answers each waiting request
/// with its own outcome, not its lock's latest. Before, the shell looked only at the lock: a
/// request whose wait had been cancelled while a newer request of the same session waited for
/// the same lock stayed waiting for ever.
#[test]
fn wait_end_answers_each_request_with_its_own_wait() {
    let mut story = Story::new();
    story.open(0, "A", 10_000, 0);
    story.open(0, "B", 10_000, 0);
    let (a, b) = (story.id("A"), story.id("B"));
    story.acquire(0, "A", "x", Wait::Forever);
    story.acquire_as(1, "B", "x", Wait::Forever, 7);
    assert_eq!(story.machine.wait_end(b, "x", RequestId(7)), None, "request 7 still waits");
    story.run(2, Command::Cancel { session: b, name: "x".into() });
    story.acquire_as(3, "B", "x", Wait::Forever, 8);
    let ended = Some(WaitEnd::Cancelled { cause: CancelCause::Requested });
    assert_eq!(story.machine.wait_end(b, "x", RequestId(7)), ended, "7's wait was cancelled");
    assert_eq!(story.machine.wait_end(b, "x", RequestId(8)), None, "8 waits in its place");
    let retry = story.acquire_attempt(4, "B", "x", Wait::Forever, (7, 1));
    assert_eq!(error_of(&retry).code(), ErrorCode::AlreadyWaiting, "a retry of 7 is refused");

    let token = story.machine.lock("x").unwrap().holder.unwrap().token;
    story.release(5, "A", "x", token);
    let granted = story.machine.lock("x").unwrap().holder.unwrap();
    assert_eq!(granted.session, b);
    assert_eq!(
        story.machine.wait_end(b, "x", RequestId(8)),
        Some(WaitEnd::Granted { token: granted.token }),
        "8 was granted"
    );
    // Found in review: 7 was told "granted" too, where the events had said "cancelled", and
    // its caller could then release the grant 8's caller relies on.
    assert_eq!(story.machine.wait_end(b, "x", RequestId(7)), ended, "8's grant is not 7's");
    // A session that ended took its waits with it.
    story.run(6, Command::CloseSession { session: b });
    assert_eq!(
        story.machine.wait_end(b, "x", RequestId(8)),
        Some(WaitEnd::Cancelled { cause: CancelCause::SessionExpired })
    );
    assert_eq!(
        story.machine.wait_end(a, "x", RequestId(0)),
        Some(WaitEnd::Cancelled { cause: CancelCause::TimedOut }),
        "a request whose grant ended long ago left no trace: it does not hold the lock"
    );
}

/// Limits reach the replicated state only through `SetLimits`, so every replica refuses the
/// same commands from the same entry on. New limits are refused when they contradict
/// themselves or when the state already holds more than they allow (nothing is ended for a
/// limit), and under apply rules older than 4; they travel in snapshots.
#[test]
fn set_limits_changes_what_is_refused_from_its_entry_on_and_never_ends_what_exists() {
    let mut story = Story::new();
    let set = |story: &mut Story, limits: Limits| story.run(1, Command::SetLimits { limits });
    let at_most = |max_sessions| Limits { max_sessions, ..Limits::default() };
    story.open(0, "A", 10_000, 0);
    story.open(0, "B", 10_000, 0);
    assert_eq!(set(&mut story, at_most(2)).result, Ok(Response::LimitsSet));
    assert_eq!(story.machine.limits().max_sessions, 2);
    let third =
        story.run(2, Command::OpenSession { ttl_ms: 10_000, lock_delay_ms: 0, owner: None });
    assert_eq!(error_of(&third).code(), ErrorCode::TooManySessions);

    let below = set(&mut story, at_most(1));
    assert_eq!(error_of(&below).code(), ErrorCode::LimitsRefused);
    assert!(
        error_of(&below).to_string().contains("2 sessions are open, more than max_sessions = 1")
    );
    assert_eq!(story.machine.session_count(), 2, "nothing is ended for a limit");
    let contradictory = Limits { max_renewals_per_tick: 1, ..at_most(2) };
    assert!(
        error_of(&set(&mut story, contradictory)).to_string().contains("max_renewals_per_tick")
    );

    story.run(3, Command::CloseSession { session: story.id("B") });
    assert_eq!(set(&mut story, at_most(1)).result, Ok(Response::LimitsSet));
    let restored = StateMachine::restore(&story.machine.snapshot()).expect("restores");
    assert_eq!(restored.limits(), &at_most(1), "the limits travel in the snapshot");

    // Every count a limit bounds is checked against what is in use, and so are the names.
    story.acquire(4, "A", "jobs/a", Wait::Try);
    story.acquire(4, "A", "jobs/b", Wait::Try);
    let per_session = Limits { max_locks_per_session: 1, ..at_most(1) };
    assert!(error_of(&set(&mut story, per_session)).to_string().contains("max_locks_per_session"));
    let locks = Limits { max_locks: 1, ..at_most(1) };
    assert!(error_of(&set(&mut story, locks)).to_string().contains("more than max_locks = 1"));
    let names = Limits { max_name_bytes: 5, ..at_most(1) };
    assert!(error_of(&set(&mut story, names)).to_string().contains("max_name_bytes"));
    assert_eq!(set(&mut story, at_most(3)).result, Ok(Response::LimitsSet));
    for who in ["V", "W"] {
        story.open(5, who, 10_000, 0);
        story.acquire(5, who, "jobs/a", Wait::Forever);
    }
    let waiters = Limits { max_waiters_per_lock: 1, ..at_most(3) };
    let refused = error_of(&set(&mut story, waiters)).to_string();
    assert!(refused.contains("2 sessions wait for one lock, more than max_waiters_per_lock = 1"));

    story.rules = 3;
    let older = set(&mut story, at_most(5));
    assert!(error_of(&older).to_string().contains("setting limits needs 4"), "{older:?}");
}

/// A cluster is named once (apply rules 7): the first well-formed id stays for good, the same
/// id again is a no-op and another is refused; an entry under older rules is refused. The id
/// travels in snapshots, and a restored state starts without one, so the restored cluster is
/// named anew and parts from the one its backup came from, whose id it keeps as its origin (with
/// its sessions or without) for clients to follow.
#[test]
fn a_cluster_is_named_once_and_a_restored_state_is_named_anew_and_knows_its_origin() {
    let mut story = Story::new();
    let first = "0123456789abcdef0123456789abcdef".to_owned();
    let name = |story: &mut Story, cluster_id: &str| {
        story.run(1, Command::NameCluster { cluster_id: cluster_id.to_owned() })
    };
    story.rules = 6;
    let older = name(&mut story, &first);
    assert_eq!(error_of(&older), CommandError::OlderApplyRules { rules: 6, needs: 7 });
    story.rules = APPLY_RULES;
    for malformed in
        ["0123456789ABCDEF0123456789ABCDEF", "0123", "", "0123456789abcdef0123456789abcdeg"]
    {
        assert_eq!(error_of(&name(&mut story, malformed)).code(), ErrorCode::ClusterNameRefused);
    }
    assert_eq!(story.machine.cluster_id(), None, "a refused naming changes nothing");
    assert_eq!(name(&mut story, &first).result, Ok(Response::ClusterNamed));
    assert_eq!(name(&mut story, &first).result, Ok(Response::ClusterNamed), "the same id again");
    let other = name(&mut story, "fedcba9876543210fedcba9876543210");
    assert_eq!(error_of(&other).code(), ErrorCode::ClusterNameRefused);
    assert!(error_of(&other).to_string().contains(&format!("it is named {first} already")));
    assert_eq!(story.machine.cluster_id(), Some(first.as_str()));

    let snapshot = story.machine.snapshot();
    let restored = StateMachine::restore(&snapshot).expect("restores");
    assert_eq!(restored.cluster_id(), Some(first.as_str()), "the id travels in snapshots");
    let next_epoch = restored.clone().into_next_epoch().expect("an epoch is left");
    assert_eq!(next_epoch.cluster_id(), None, "a restored state is a new cluster");
    assert_eq!(next_epoch.restored_from_cluster_id(), Some(first.as_str()), "clients follow it");
    let emptied = restored.without_sessions().into_next_epoch().expect("an epoch is left");
    assert_eq!(emptied.cluster_id(), None);
    assert_eq!(emptied.restored_from_cluster_id(), Some(first.as_str()), "without sessions too");
    let again = StateMachine::restore(&next_epoch.snapshot()).expect("restores");
    assert_eq!(again.restored_from_cluster_id(), Some(first.as_str()), "it travels in snapshots");
    let text = String::from_utf8(next_epoch.snapshot()).expect("a snapshot is JSON");
    let damaged = text.replace(&first, "not-an-id");
    let refused = StateMachine::restore(damaged.as_bytes()).expect_err("a malformed origin");
    assert!(refused.to_string().contains("restored from"), "{refused}");

    let text = String::from_utf8(snapshot).expect("a snapshot is JSON");
    let damaged = text.replace(&first, "not-an-id");
    assert!(StateMachine::restore(damaged.as_bytes()).is_err(), "a malformed id is refused");
}

/// Issue 21: a tick may renew a session for a lease of its own (its TTL on its client's clock,
/// converted to the leader's), held to between a quarter of the TTL and four times it; an entry
/// written under apply rules older than 5 is refused, and changes nothing (review: only the
/// leader's care kept one out before).
#[test]
fn a_tick_renews_for_a_clients_lease_within_bounds_and_is_refused_under_older_rules() {
    let mut story = Story::new();
    let short = story.open(0, "A", 4_000, 0);
    let long = story.open(0, "B", 4_000, 0);
    let floor = story.open(0, "C", 4_000, 0);
    let renew_for = vec![(short, 2_000), (long, 6_000), (floor, 10)];
    story.run(1_000, Command::Tick { renew: Vec::new(), renew_for });
    let deadline =
        |story: &Story, session| story.machine.session_lease(session).unwrap().deadline_ms;
    assert_eq!(deadline(&story, short), 3_000);
    assert_eq!(deadline(&story, long), 7_000);
    assert_eq!(deadline(&story, floor), 2_000, "a quarter of the TTL at least");
    assert_eq!(
        Command::Tick { renew: Vec::new(), renew_for: vec![(short, 1)] }.oldest_rules(),
        5,
        "a leader writes leases of their own only once every member knows rules 5"
    );
    story.rules = 4;
    let older =
        story.run(2_000, Command::Tick { renew: Vec::new(), renew_for: vec![(short, 2_000)] });
    assert_eq!(error_of(&older), CommandError::OlderApplyRules { rules: 4, needs: 5 });
    assert_eq!(deadline(&story, short), 3_000, "the refused tick renewed nothing");
    let plain = story.run(2_000, Command::Tick { renew: vec![short], renew_for: Vec::new() });
    assert!(plain.result.is_ok(), "a tick without leases of their own is fine under rules 4");
}

/// Review of issue 21: a `Refresh` (after a gap, for an over-full batch, or by a new leader)
/// renewed every session for its TTL, cutting a lease a fast leader had lengthened for a client
/// whose clock runs slower; the quiet session then ended before its client gave up on it. Under
/// apply rules 6 a session remembers its longer lease and a refresh renews for it; a renewal for
/// the TTL forgets it. Under rules 5 a refresh still gives the TTL, as the logs written then did.
#[test]
fn a_refresh_never_cuts_a_lease_lengthened_for_a_slow_client_clock() {
    let deadline =
        |story: &Story, session| story.machine.session_lease(session).unwrap().deadline_ms;
    for (rules, refreshed_ms) in [(APPLY_RULES, 12_000), (5, 6_000)] {
        let mut story = Story::new();
        story.rules = rules;
        let lengthened = story.open(0, "A", 4_000, 0);
        let plain = story.open(0, "B", 4_000, 0);
        story.run(
            1_000,
            Command::Tick { renew: vec![plain], renew_for: vec![(lengthened, 10_000)] },
        );
        assert_eq!(deadline(&story, lengthened), 11_000);
        assert!(story.run(2_000, Command::Refresh).result.is_ok());
        assert_eq!(deadline(&story, lengthened), refreshed_ms, "rules {rules}");
        assert_eq!(deadline(&story, plain), 6_000, "rules {rules}");
    }
    let mut story = Story::new();
    let session = story.open(0, "A", 4_000, 0);
    story.run(1_000, Command::Tick { renew: Vec::new(), renew_for: vec![(session, 10_000)] });
    story.run(2_000, Command::Tick { renew: vec![session], renew_for: Vec::new() });
    story.run(3_000, Command::Refresh);
    assert_eq!(deadline(&story, session), 7_000, "a renewal for the TTL forgets the longer lease");
    story.run(4_000, Command::Tick { renew: Vec::new(), renew_for: vec![(session, 2_000)] });
    story.run(5_000, Command::Refresh);
    assert_eq!(deadline(&story, session), 9_000, "a shorter lease is not remembered");
}

/// Review of issue 21: a remembered lease is part of the state under apply rules 6 only (a log
/// written under rules 5 keeps its snapshot bytes), and a snapshot whose remembered lease is
/// not longer than its session's TTL, or over four times it, is refused on restore.
#[test]
fn a_remembered_lease_is_kept_in_snapshots_under_rules_6_only_and_checked_on_restore() {
    for rules in [5, APPLY_RULES] {
        let mut story = Story::new();
        story.rules = rules;
        let session = story.open(0, "A", 4_000, 0);
        story.run(1_000, Command::Tick { renew: Vec::new(), renew_for: vec![(session, 10_000)] });
        let snapshot = String::from_utf8(story.machine.snapshot()).unwrap();
        assert_eq!(snapshot.contains("\"lease_ms\":10000"), rules >= 6, "rules {rules}");
        assert!(StateMachine::restore(snapshot.as_bytes()).is_ok());
        if rules >= 6 {
            for bad in ["\"lease_ms\":4000", "\"lease_ms\":16001"] {
                let damaged = snapshot.replace("\"lease_ms\":10000", bad);
                let refused = StateMachine::restore(damaged.as_bytes()).unwrap_err();
                assert!(refused.to_string().contains("remembers a lease"), "{refused}");
            }
        }
    }
}
