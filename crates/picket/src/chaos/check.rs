//! Checks a chaos history: the promises Picket and its fence make, as a user relies on them.
//!
//! - No token is granted to two sessions, and a grant acknowledged before another acquire was
//!   sent has the smaller token (tokens grow in real time).
//! - At the store: no write whose token is below a token the store had already acknowledged is
//!   admitted (no stale write), and likewise no stale read; every acknowledged append is in the
//!   final list, once, and the list holds nothing that nobody wrote.
//! - No lock leaves a session while its client still counts on its lease (the TTL less the
//!   client's drift margin from its last confirmed keepalive) and has not released it: the
//!   previous holder must not believe it holds the lock when the next one is granted it (what
//!   Jepsen found etcd's locks doing). While a leader's clock runs at a wrong rate (or the
//!   correction for it lingers after), beyond the drift Picket assumes, such a break is counted
//!   apart instead: the fence, not the lease, keeps the data safe then.
//! - The lock's history is linearizable against a fenced mutex with sessions
//!   (`linearizable.rs`): grants in token order and releases acknowledged as ending their
//!   grant each take effect at one instant inside their interval.
//! - Every fault kind the run asked for fired; otherwise the verdict is `unknown`, not `valid`.

use super::history::{Event, Op, Phase};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// An operation with its invocation and, if it came, its completion.
#[derive(Clone, Debug)]
struct Completed {
    process: u32,
    op: Op,
    invoked_ns: u64,
    ended_ns: u64,
    phase: Phase,
}

/// The outcome of a check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every check passed and every fault kind fired.
    Valid,
    /// A check failed: see the violations.
    Invalid,
    /// No violation, but the run did not test what it should have (a fault kind never fired,
    /// or too little work got done).
    Unknown,
}

/// What a run did and what the checks found.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// The verdict.
    pub verdict: Verdict,
    /// Why the verdict is not `valid`, one sentence per finding (at most 50).
    pub violations: Vec<String>,
    /// Why the verdict is `unknown`, if it is.
    pub unknown_because: Vec<String>,
    /// Operations by kind and outcome, e.g. `write ok`.
    pub operations: BTreeMap<String, u64>,
    /// Refusals by code, e.g. `write stale_token`.
    pub refusals: BTreeMap<String, u64>,
    /// Faults by kind.
    pub faults: BTreeMap<String, u64>,
    /// Distinct tokens granted.
    pub grants: u64,
    /// Locks that went to another session while their holder still counted on its lease,
    /// during or after a leader's clock ran at a wrong rate (outside the drift bound Picket
    /// assumes); outside such a window each is a violation instead.
    pub lease_breaks_under_clock_rate_faults: u64,
    /// Elements in the final list.
    pub final_elements: u64,
}

const MAX_VIOLATIONS: usize = 50;

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Acquire => "acquire",
        Op::Register { .. } => "register",
        Op::Read { .. } => "read",
        Op::Write { .. } => "write",
        Op::Release { .. } => "release",
    }
}

fn token_of(op: &Op) -> Option<u64> {
    match op {
        Op::Acquire => None,
        Op::Register { token }
        | Op::Read { token }
        | Op::Write { token, .. }
        | Op::Release { token } => Some(*token),
    }
}

/// Pairs each invocation with the next event of the same process (a client does one thing
/// at a time). An invocation without a completion counts as `info`.
fn complete(events: &[Event]) -> Vec<Completed> {
    let mut pending: BTreeMap<u32, (Op, u64)> = BTreeMap::new();
    let mut done = Vec::new();
    for event in events {
        let (Some(op), Some(phase)) = (&event.op, &event.phase) else { continue };
        if *phase == Phase::Invoke {
            if let Some((op, invoked_ns)) = pending.insert(event.process, (op.clone(), event.at_ns))
            {
                done.push(Completed {
                    process: event.process,
                    op,
                    invoked_ns,
                    ended_ns: u64::MAX,
                    phase: Phase::Info { detail: "no completion".into() },
                });
            }
            continue;
        }
        if let Some((op, invoked_ns)) = pending.remove(&event.process) {
            done.push(Completed {
                process: event.process,
                op,
                invoked_ns,
                ended_ns: event.at_ns,
                phase: phase.clone(),
            });
        }
    }
    for (process, (op, invoked_ns)) in pending {
        done.push(Completed {
            process,
            op,
            invoked_ns,
            ended_ns: u64::MAX,
            phase: Phase::Info { detail: "no completion before the run ended".into() },
        });
    }
    done
}

/// Checks `events` and the list the store held at the end. `required_faults` are the fault
/// kinds that must each have fired at least once; `ttl` is the clients' session TTL.
#[must_use]
pub fn check(
    events: &[Event],
    final_list: &str,
    required_faults: &[&str],
    ttl: Duration,
) -> Summary {
    let ops = complete(events);
    let mut violations = Vec::new();
    let mut summary = Summary {
        verdict: Verdict::Valid,
        violations: Vec::new(),
        unknown_because: Vec::new(),
        operations: BTreeMap::new(),
        refusals: BTreeMap::new(),
        faults: BTreeMap::new(),
        grants: 0,
        lease_breaks_under_clock_rate_faults: 0,
        final_elements: 0,
    };
    for op in &ops {
        let outcome = match &op.phase {
            Phase::Ok { .. } => "ok".to_owned(),
            Phase::Fail { code } => {
                *summary.refusals.entry(format!("{} {code}", op_name(&op.op))).or_default() += 1;
                "fail".to_owned()
            }
            Phase::Info { .. } | Phase::Invoke => "info".to_owned(),
        };
        *summary.operations.entry(format!("{} {outcome}", op_name(&op.op))).or_default() += 1;
    }
    for event in events {
        if let Some(fault) = &event.fault {
            let kind = fault.split_whitespace().next().unwrap_or_default().to_owned();
            *summary.faults.entry(kind).or_default() += 1;
        }
    }
    summary.grants = check_grants(&ops, &mut violations);
    let certain = super::linearizable::certain_operations(
        ops.iter().map(|op| (op.process, &op.op, op.invoked_ns, op.ended_ns, &op.phase)),
    );
    if let Err(broken) = super::linearizable::check(certain) {
        violations.push(broken.describe(events.first().map_or(0, |first| first.at_ns)));
    }
    let wrong_rates = clock_rate_windows(events, ttl);
    for lease_break in lease_breaks(&ops, events) {
        if wrong_rates.iter().any(|(from, to)| (*from..=*to).contains(&lease_break.granted_ns)) {
            summary.lease_breaks_under_clock_rate_faults += 1;
        } else {
            violations.push(lease_break.describe(events.first().map_or(0, |first| first.at_ns)));
        }
    }
    check_store_order(&ops, &mut violations);
    summary.final_elements = check_final_list(&ops, final_list, &mut violations);
    for kind in required_faults {
        if summary.faults.get(*kind).copied().unwrap_or(0) == 0 {
            summary.unknown_because.push(format!("no {kind} fault fired"));
        }
    }
    if summary.operations.get("write ok").copied().unwrap_or(0) < 10 {
        summary.unknown_because.push("fewer than 10 writes were acknowledged".into());
    }
    violations.truncate(MAX_VIOLATIONS);
    summary.verdict = if !violations.is_empty() {
        Verdict::Invalid
    } else if !summary.unknown_because.is_empty() {
        Verdict::Unknown
    } else {
        Verdict::Valid
    };
    summary.violations = violations;
    summary
}

/// No token went to two sessions; a grant acknowledged before another acquire was sent has the
/// smaller token. Returns the number of distinct tokens granted.
fn check_grants(ops: &[Completed], violations: &mut Vec<String>) -> u64 {
    let mut grants: Vec<(u64, u64, u64, u64)> = ops
        .iter()
        .filter_map(|op| match (&op.op, &op.phase) {
            (Op::Acquire, Phase::Ok { token: Some(token), session: Some(session), .. }) => {
                Some((op.invoked_ns, op.ended_ns, *token, *session))
            }
            _ => None,
        })
        .collect();
    let mut owners: BTreeMap<u64, u64> = BTreeMap::new();
    for &(_, _, token, session) in &grants {
        if let Some(other) = owners.insert(token, session)
            && other != session
        {
            violations.push(format!("token {token} was granted to sessions {other} and {session}"));
        }
    }
    // Sweep acquires in the order they were sent, keeping the highest token acknowledged
    // before each was sent.
    let mut by_end: Vec<(u64, u64, u64)> =
        grants.iter().map(|&(_, ended, token, session)| (ended, token, session)).collect();
    by_end.sort_unstable();
    grants.sort_unstable();
    let mut acknowledged = by_end.iter().peekable();
    let mut highest: Option<(u64, u64)> = None;
    for &(invoked, _, token, session) in &grants {
        while let Some(&&(ended, earlier_token, earlier_session)) = acknowledged.peek() {
            if ended >= invoked {
                break;
            }
            if highest.is_none_or(|(high, _)| earlier_token > high) {
                highest = Some((earlier_token, earlier_session));
            }
            acknowledged.next();
        }
        if let Some((high, high_session)) = highest {
            let same_grant = high == token && high_session == session;
            if token <= high && !same_grant {
                violations.push(format!(
                    "token {token} (session {session}) was granted after token {high} (session {high_session}) had been acknowledged"
                ));
            }
        }
    }
    owners.len() as u64
}

/// How far a reported lease may reach past a grant before it counts as a break: the reading of
/// two clocks a report adds up, with room to spare.
const LEASE_SLACK_NS: u64 = 2_000_000;

/// A lock that went to another session while its holder still counted on its lease.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LeaseBreak {
    token: u64,
    session: u64,
    process: u32,
    lease_until_ns: u64,
    next_token: u64,
    next_session: u64,
    granted_ns: u64,
}

impl LeaseBreak {
    fn describe(&self, start_ns: u64) -> String {
        let ms = |ns: u64| ns.saturating_sub(start_ns) / 1_000_000;
        format!(
            "token {} (session {}) was granted by {} ms while session {} (process {}) held token {} without releasing it and counted on its lease until {} ms",
            self.next_token,
            self.next_session,
            ms(self.granted_ns),
            self.session,
            self.process,
            self.token,
            ms(self.lease_until_ns)
        )
    }
}

/// Grants whose lock went to another session while the holder, which had not asked to release
/// it, still counted on its session's lease. The run guards one lock, so the next grant of
/// it is the next larger token.
///
/// A session's lease reaching past the moment the next grant was acknowledged means either
/// Picket expired the session before the end it had promised (a confirmed keepalive sent
/// before the grant), or it took the lock from a session it kept alive (one sent after it):
/// both break the lock's promise, whatever the fence then saves.
fn lease_breaks(ops: &[Completed], events: &[Event]) -> Vec<LeaseBreak> {
    let mut lease_until_ns: BTreeMap<u64, u64> = BTreeMap::new();
    for lease in events.iter().filter_map(|event| event.lease.as_ref()) {
        let until_ns = lease_until_ns.entry(lease.session).or_default();
        *until_ns = (*until_ns).max(lease.until_ns);
    }
    let mut release_asked_ns: BTreeMap<(u32, u64), Vec<u64>> = BTreeMap::new();
    for op in ops {
        if let Op::Release { token } = op.op {
            release_asked_ns.entry((op.process, token)).or_default().push(op.invoked_ns);
        }
    }
    let mut grants: Vec<(u64, u64, u32, u64)> = ops
        .iter()
        .filter_map(|op| match (&op.op, &op.phase) {
            (Op::Acquire, Phase::Ok { token: Some(token), session: Some(session), .. }) => {
                Some((*token, *session, op.process, op.ended_ns))
            }
            _ => None,
        })
        .collect();
    grants.sort_unstable();
    // The earliest acknowledgement of any later grant: the lock had left each earlier holder
    // by then.
    let mut breaks = Vec::new();
    let mut earliest_later: Option<(u64, u64, u64)> = None;
    for &(token, session, process, ended_ns) in grants.iter().rev() {
        if let Some((granted_ns, next_token, next_session)) = earliest_later {
            // Only a release asked for after this grant was answered gives this grant up.
            let released_before = release_asked_ns.get(&(process, token)).is_some_and(|asked| {
                asked.iter().any(|&asked_ns| (ended_ns..granted_ns).contains(&asked_ns))
            });
            let until_ns = lease_until_ns.get(&session).copied().unwrap_or(0);
            if next_session != session
                && !released_before
                && until_ns > granted_ns.saturating_add(LEASE_SLACK_NS)
            {
                breaks.push(LeaseBreak {
                    token,
                    session,
                    process,
                    lease_until_ns: until_ns,
                    next_token,
                    next_session,
                    granted_ns,
                });
            }
        }
        if earliest_later.is_none_or(|(granted_ns, ..)| ended_ns < granted_ns) {
            earliest_later = Some((ended_ns, token, session));
        }
    }
    breaks.reverse();
    breaks
}

/// How long a leader's clock correction may stay wrong after its clock is right again. A
/// peer's rate above 1 counts only as far as its two newest intervals agree, and one left
/// without a ratio for more than 700 ms counts at 1 (`picket-server`'s `rate.rs`),
/// so a slow clock's correction (running the leader's time fast) ends about 200 ms after the
/// slow clock's end when the readings are usable (one interval straddles it, the next one at
/// the true rate ends it, in the round that reads it), and about 1 s after it when they are
/// dropped (a round trip over 5 ms, or an interval too short for its round trips). 7 s covers
/// that with room (a fault's end is logged by the harness, not by the leader's clock); it is a
/// margin, not a bound.
const RATE_CORRECTION_MEMORY_NS: u64 = 7_000_000_000;

/// The spans during which a lease break is put down to a leader's clock running at a wrong
/// rate: from each `leader_clock_rate` fault until its end, plus the correction's memory, a TTL
/// and the service's expiry grace (a session renewed on a fast clock expires up to then). A
/// slow clock counts too: the correction for it makes the leader's time run fast, during the
/// fault and after it.
fn clock_rate_windows(events: &[Event], ttl: Duration) -> Vec<(u64, u64)> {
    let after_ns = u64::try_from(ttl.as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_add(picket_core::DEFAULT_SESSION_EXPIRY_GRACE_MS.saturating_mul(1_000_000))
        .saturating_add(RATE_CORRECTION_MEMORY_NS);
    events
        .iter()
        .filter_map(|event| {
            let fault = event.fault.as_deref()?;
            let mut words = fault.split_whitespace();
            if words.next() != Some("leader_clock_rate") {
                return None;
            }
            let field = |name: &str| words.clone().find_map(|word| word.strip_prefix(name));
            let rate: f64 = field("rate=")?.parse().ok()?;
            let for_ms: u64 = field("for_ms=")?.parse().ok()?;
            ((rate - 1.0).abs() > f64::EPSILON).then(|| {
                let until_ns = for_ms.saturating_mul(1_000_000).saturating_add(after_ns);
                (event.at_ns, event.at_ns.saturating_add(until_ns))
            })
        })
        .collect()
}

/// The store admits no write or read whose token is below one it had already acknowledged.
fn check_store_order(ops: &[Completed], violations: &mut Vec<String>) {
    let admitted: Vec<&Completed> = ops
        .iter()
        .filter(|op| {
            matches!(op.op, Op::Register { .. } | Op::Read { .. } | Op::Write { .. })
                && matches!(op.phase, Phase::Ok { .. })
        })
        .collect();
    let mut by_end: Vec<(u64, u64)> = admitted
        .iter()
        .filter_map(|op| token_of(&op.op).map(|token| (op.ended_ns, token)))
        .collect();
    by_end.sort_unstable();
    let mut by_invoke: Vec<&Completed> = admitted.clone();
    by_invoke.sort_by_key(|op| op.invoked_ns);
    let mut acknowledged = by_end.iter().peekable();
    let mut highest = 0;
    for op in by_invoke {
        while let Some(&&(ended, token)) = acknowledged.peek() {
            if ended >= op.invoked_ns {
                break;
            }
            highest = highest.max(token);
            acknowledged.next();
        }
        let token = token_of(&op.op).expect("store operations carry a token");
        if token < highest {
            violations.push(format!(
                "the store admitted a stale {} by process {} with token {token} after it had acknowledged token {highest}",
                op_name(&op.op),
                op.process
            ));
        }
    }
}

/// Every acknowledged append is in the final list, once, and the list holds only elements
/// somebody tried to write. Returns the number of elements in the list.
fn check_final_list(ops: &[Completed], final_list: &str, violations: &mut Vec<String>) -> u64 {
    let mut attempted = BTreeSet::new();
    let mut acknowledged = BTreeSet::new();
    for op in ops {
        if let Op::Write { element, .. } = &op.op {
            attempted.insert(element.as_str());
            if matches!(op.phase, Phase::Ok { .. }) {
                acknowledged.insert(element.as_str());
            }
        }
    }
    let mut seen = BTreeSet::new();
    for element in final_list.split('\n').filter(|element| !element.is_empty()) {
        if !seen.insert(element) {
            violations.push(format!("element {element:?} is in the final list twice"));
        }
        if !attempted.contains(element) {
            violations
                .push(format!("element {element:?} is in the final list but nobody wrote it"));
        }
    }
    for element in acknowledged.difference(&seen) {
        violations.push(format!("the acknowledged append of {element:?} is lost"));
    }
    seen.len() as u64
}

#[cfg(test)]
mod tests {
    //! The checker against hand-made histories: it must pass a clean one and catch each kind of
    //! violation, or a clean verdict would mean nothing.

    use super::*;
    use crate::chaos::history::Lease;

    const TTL: Duration = Duration::from_secs(2);

    struct Builder {
        events: Vec<Event>,
        clock: u64,
    }

    impl Builder {
        fn new() -> Self {
            Self { events: Vec::new(), clock: 0 }
        }

        fn push(&mut self, process: u32, op: Op, phase: Phase) -> &mut Self {
            self.clock += 10;
            self.events.push(Event {
                process,
                at_ns: self.clock,
                op: Some(op),
                phase: Some(phase),
                fault: None,
                lease: None,
            });
            self
        }

        /// `process` reports that it counts on `session` until `for_ns` from now.
        fn lease(&mut self, process: u32, session: u64, for_ns: u64) -> &mut Self {
            self.clock += 10;
            let mut event = Event::lease(process, Lease { session, until_ns: self.clock + for_ns });
            event.at_ns = self.clock;
            self.events.push(event);
            self
        }

        /// Lets `ns` pass.
        fn wait(&mut self, ns: u64) -> &mut Self {
            self.clock += ns;
            self
        }

        fn ok(&mut self, process: u32, op: Op) -> &mut Self {
            self.push(process, op.clone(), Phase::Invoke);
            self.push(process, op, Phase::Ok { token: None, session: None, value: None })
        }

        fn grant(&mut self, process: u32, token: u64, session: u64) -> &mut Self {
            self.push(process, Op::Acquire, Phase::Invoke);
            self.push(
                process,
                Op::Acquire,
                Phase::Ok { token: Some(token), session: Some(session), value: None },
            )
        }

        /// A whole clean cycle: acquire, register, read, write, release.
        fn cycle(&mut self, process: u32, token: u64, session: u64, element: &str) -> &mut Self {
            self.grant(process, token, session);
            self.ok(process, Op::Register { token });
            self.ok(process, Op::Read { token });
            self.ok(process, Op::Write { token, element: element.into() });
            self.ok(process, Op::Release { token })
        }

        fn fault(&mut self, kind: &str) -> &mut Self {
            self.clock += 10;
            let mut event = Event::fault(kind.into());
            event.at_ns = self.clock;
            self.events.push(event);
            self
        }
    }

    fn elements(count: u64) -> (Builder, String) {
        let mut builder = Builder::new();
        let mut list = String::new();
        for index in 0..count {
            let element = format!("e{index}");
            builder.cycle(1 + u32::try_from(index % 2).unwrap(), 10 + index, 100 + index, &element);
            list.push_str(&element);
            list.push('\n');
        }
        (builder, list)
    }

    #[test]
    fn a_clean_history_is_valid_once_every_fault_fired() {
        let (mut builder, list) = elements(12);
        assert_eq!(check(&builder.events, &list, &["pause"], TTL).verdict, Verdict::Unknown);
        builder.fault("pause process=1");
        let summary = check(&builder.events, &list, &["pause"], TTL);
        assert_eq!(summary.verdict, Verdict::Valid, "{summary:?}");
        assert_eq!(summary.grants, 12);
        assert_eq!(summary.operations["write ok"], 12);
    }

    /// A release the service acknowledged as ending a grant that a later grant had already
    /// replaced: each check of its own passes it; only linearizability catches it.
    #[test]
    fn a_release_acknowledged_after_the_next_grant_is_caught_as_not_linearizable() {
        let mut builder = Builder::new();
        builder.grant(1, 3, 100);
        builder.grant(2, 5, 200);
        builder.ok(1, Op::Release { token: 3 });
        builder.ok(2, Op::Release { token: 5 });
        let (mut more, list) = elements(12);
        for event in &mut more.events {
            event.at_ns += 1_000;
            builder.events.push(event.clone());
        }
        let summary = check(&builder.events, &list, &[], TTL);
        assert_eq!(summary.verdict, Verdict::Invalid, "{summary:?}");
        assert_eq!(summary.violations.len(), 1, "{:?}", summary.violations);
        assert!(summary.violations[0].contains("not linearizable"), "{:?}", summary.violations);
    }

    #[test]
    fn a_token_granted_twice_is_caught() {
        let (mut builder, list) = elements(12);
        builder.grant(2, 11, 999);
        let summary = check(&builder.events, &list, &[], TTL);
        assert_eq!(summary.verdict, Verdict::Invalid);
        assert!(
            summary.violations.iter().any(|v| v.contains("granted to sessions")),
            "{summary:?}"
        );
    }

    #[test]
    fn a_token_going_backwards_in_real_time_is_caught() {
        let (mut builder, list) = elements(12);
        builder.grant(1, 5, 555);
        let summary = check(&builder.events, &list, &[], TTL);
        assert!(summary.violations.iter().any(|v| v.contains("was granted after")), "{summary:?}");
    }

    #[test]
    fn a_stale_write_admitted_is_caught() {
        let (mut builder, mut list) = elements(12);
        builder.ok(1, Op::Write { token: 12, element: "zombie".into() });
        list.push_str("zombie\n");
        let summary = check(&builder.events, &list, &[], TTL);
        assert!(summary.violations.iter().any(|v| v.contains("stale write")), "{summary:?}");
    }

    #[test]
    fn a_lost_an_unknown_and_a_doubled_element_are_caught() {
        let (builder, list) = elements(12);
        let without_first = list.replacen("e0\n", "", 1);
        let summary = check(&builder.events, &without_first, &[], TTL);
        assert!(summary.violations.iter().any(|v| v.contains("\"e0\" is lost")), "{summary:?}");
        let doubled = format!("{list}e3\nghost\n");
        let summary = check(&builder.events, &doubled, &[], TTL);
        assert!(summary.violations.iter().any(|v| v.contains("twice")), "{summary:?}");
        assert!(summary.violations.iter().any(|v| v.contains("nobody wrote")), "{summary:?}");
    }

    #[test]
    fn a_refused_or_unknown_write_may_be_missing_and_is_counted() {
        let (mut builder, list) = elements(12);
        builder.push(1, Op::Write { token: 99, element: "refused".into() }, Phase::Invoke);
        builder.push(
            1,
            Op::Write { token: 99, element: "refused".into() },
            Phase::Fail { code: "stale_token".into() },
        );
        builder.push(2, Op::Write { token: 98, element: "unknown".into() }, Phase::Invoke);
        let summary = check(&builder.events, &list, &[], TTL);
        assert_eq!(summary.verdict, Verdict::Valid, "{summary:?}");
        assert_eq!(summary.refusals["write stale_token"], 1);
        assert_eq!(summary.operations["write info"], 1);
    }

    const SECOND_NS: u64 = 1_000_000_000;

    /// Process 1 holds token 10 in session 100 and counts on its lease for a second more;
    /// process 2 is then granted token 11 after `gap_ns`.
    fn held_then_granted(release_first: bool, gap_ns: u64) -> Builder {
        let mut builder = Builder::new();
        builder.grant(1, 10, 100).lease(1, 100, SECOND_NS);
        if release_first {
            builder.push(1, Op::Release { token: 10 }, Phase::Invoke);
        }
        builder.wait(gap_ns).grant(2, 11, 200);
        builder
    }

    #[test]
    fn a_lock_granted_while_its_holder_counts_on_its_lease_is_caught() {
        let builder = held_then_granted(false, SECOND_NS / 2);
        let summary = check(&builder.events, "", &[], TTL);
        assert_eq!(summary.verdict, Verdict::Invalid, "{summary:?}");
        assert!(
            summary.violations.iter().any(|v| v.contains("token 11 (session 200) was granted")
                && v.contains("session 100 (process 1) held token 10")),
            "{summary:?}"
        );
    }

    #[test]
    fn a_lock_granted_after_its_holder_asked_to_release_it_or_after_its_lease_is_no_break() {
        for (release_first, gap_ns) in [(true, SECOND_NS / 2), (false, 2 * SECOND_NS)] {
            let builder = held_then_granted(release_first, gap_ns);
            let ops = complete(&builder.events);
            assert_eq!(lease_breaks(&ops, &builder.events), Vec::new(), "{release_first} {gap_ns}");
        }
    }

    #[test]
    fn a_lease_break_under_a_leader_clock_rate_fault_is_counted_apart() {
        let mut builder = Builder::new();
        builder.fault("leader_clock_rate node=1 rate=2 for_ms=2000");
        builder.events.extend(held_then_granted(false, SECOND_NS / 2).events.into_iter().map(
            |mut event| {
                event.at_ns += 100;
                if let Some(lease) = &mut event.lease {
                    lease.until_ns += 100;
                }
                event
            },
        ));
        let summary = check(&builder.events, "", &[], TTL);
        assert!(summary.violations.is_empty(), "{summary:?}");
        assert_eq!(summary.lease_breaks_under_clock_rate_faults, 1);
        // A slow clock's correction runs the leader's time fast: excused too.
        builder.events[0].fault = Some("leader_clock_rate node=1 rate=0.5 for_ms=2000".into());
        let summary = check(&builder.events, "", &[], TTL);
        assert_eq!(summary.lease_breaks_under_clock_rate_faults, 1, "{summary:?}");
        // A clock jump excuses nothing (the leader refreshes every session after one).
        builder.events[0].fault = Some("leader_clock_jump node=1 jump_ms=4000".into());
        let summary = check(&builder.events, "", &[], TTL);
        assert_eq!(summary.violations.len(), 1, "{summary:?}");
    }
}
