//! Checks a chaos history: the promises Picket and its fence make, as a user relies on them.
//!
//! - No token is granted to two sessions, and a grant acknowledged before another acquire was
//!   sent has the smaller token (tokens grow in real time).
//! - At the store: no write whose token is below a token the store had already acknowledged is
//!   admitted (no stale write), and likewise no stale read; every acknowledged append is in the
//!   final list, once, and the list holds nothing that nobody wrote.
//! - Every fault kind the run asked for fired; otherwise the verdict is `unknown`, not `valid`.

use super::history::{Event, Op, Phase};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

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
/// kinds that must each have fired at least once.
#[must_use]
pub fn check(events: &[Event], final_list: &str, required_faults: &[&str]) -> Summary {
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
            });
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
        assert_eq!(check(&builder.events, &list, &["pause"]).verdict, Verdict::Unknown);
        builder.fault("pause process=1");
        let summary = check(&builder.events, &list, &["pause"]);
        assert_eq!(summary.verdict, Verdict::Valid, "{summary:?}");
        assert_eq!(summary.grants, 12);
        assert_eq!(summary.operations["write ok"], 12);
    }

    #[test]
    fn a_token_granted_twice_is_caught() {
        let (mut builder, list) = elements(12);
        builder.grant(2, 11, 999);
        let summary = check(&builder.events, &list, &[]);
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
        let summary = check(&builder.events, &list, &[]);
        assert!(summary.violations.iter().any(|v| v.contains("was granted after")), "{summary:?}");
    }

    #[test]
    fn a_stale_write_admitted_is_caught() {
        let (mut builder, mut list) = elements(12);
        builder.ok(1, Op::Write { token: 12, element: "zombie".into() });
        list.push_str("zombie\n");
        let summary = check(&builder.events, &list, &[]);
        assert!(summary.violations.iter().any(|v| v.contains("stale write")), "{summary:?}");
    }

    #[test]
    fn a_lost_an_unknown_and_a_doubled_element_are_caught() {
        let (builder, list) = elements(12);
        let without_first = list.replacen("e0\n", "", 1);
        let summary = check(&builder.events, &without_first, &[]);
        assert!(summary.violations.iter().any(|v| v.contains("\"e0\" is lost")), "{summary:?}");
        let doubled = format!("{list}e3\nghost\n");
        let summary = check(&builder.events, &doubled, &[]);
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
        let summary = check(&builder.events, &list, &[]);
        assert_eq!(summary.verdict, Verdict::Valid, "{summary:?}");
        assert_eq!(summary.refusals["write stale_token"], 1);
        assert_eq!(summary.operations["write info"], 1);
    }
}
