//! Fuzz targets for the core's decoders, on stable Rust (issue 13): proptest feeds each one
//! arbitrary and damaged input, and none may panic. Each target runs a few thousand cases in
//! `cargo test`; `PICKET_FUZZ_CASES=1000000 cargo test -p picket-core --test fuzz` runs more. A
//! finding becomes a named regression test below the targets.
//!
//! - Sequencer parsing, from any bytes and from near-valid text.
//! - Snapshot restore, from any bytes, and from a real snapshot with bits flipped, bytes cut, or
//!   one number replaced anywhere in its JSON (which reaches the invariant checks).
//! - Commands decoded from JSON shaped like the log's and applied to a state with sessions,
//!   holders and waiters: every decodable command is either refused or applied, and the state's
//!   invariants hold after it.

use picket_core::{Command, Input, Limits, RequestId, Sequencer, SessionId, StateMachine, Wait};
use picket_testkit::fuzz_cases;
use proptest::prelude::*;
use serde_json::{Value, json};

fn config(default_cases: u32) -> ProptestConfig {
    ProptestConfig { cases: fuzz_cases(default_cases), ..ProptestConfig::default() }
}

/// A state with open sessions, held locks, waiters and a lock-delay, for commands to land on.
fn busy_machine() -> StateMachine {
    let mut machine = StateMachine::new(Limits::default());
    let mut now_ms = 1_000;
    let mut apply = |machine: &mut StateMachine, command: Command| {
        now_ms += 10;
        machine.apply(&Input::new(now_ms, command));
    };
    for lock_delay_ms in [0, 0, 2_000] {
        apply(&mut machine, Command::OpenSession { ttl_ms: 5_000, lock_delay_ms, owner: None });
    }
    let sessions: Vec<SessionId> =
        machine.sessions(None, 10).iter().map(|info| info.session).collect();
    for (index, name) in ["a", "b", "jobs/x"].iter().enumerate() {
        for (attempt, session) in sessions.iter().enumerate() {
            let wait = if attempt == 0 { Wait::Try } else { Wait::Forever };
            let request = RequestId(u64::try_from(index * 10 + attempt).expect("small"));
            let command = Command::Acquire {
                session: *session,
                name: (*name).to_owned(),
                wait,
                request,
                attempt: 0,
            };
            apply(&mut machine, command);
        }
    }
    apply(&mut machine, Command::RevokeSession { session: sessions[2] });
    machine.check_invariants().expect("a consistent start");
    machine
}

/// JSON values of the kinds a hostile or damaged input holds.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(|n| json!(n)),
        prop_oneof![Just(0_u64), Just(1), Just(2), Just(3), Just(u64::MAX)].prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|n| json!(n)),
        "\\PC{0,12}".prop_map(Value::String),
        prop_oneof![Just("\0".repeat(300)), Just("a".repeat(300)), Just(String::new())]
            .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{1,8}", inner, 0..3)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0_u64..8,
        1 => proptest::sample::select(vec![999, 1_000, 3_600_000, 3_600_001, u64::MAX / 2, u64::MAX]),
        1 => any::<u64>(),
    ]
}

fn edge_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(vec!["a", "b", "jobs/x", "", "a\0b", " "]).prop_map(str::to_owned),
        1 => proptest::sample::select(vec![255_usize, 256, 257, 70_000]).prop_map(|n| "n".repeat(n)),
        1 => "\\PC{0,16}",
    ]
}

fn edge_wait() -> impl Strategy<Value = Wait> {
    prop_oneof![
        Just(Wait::Try),
        Just(Wait::Forever),
        edge_u64().prop_map(|wait_ms| Wait::For { wait_ms })
    ]
}

/// Commands with values at the edges (ids of sessions that exist, ended or never did; names
/// empty, too long or with NUL bytes; TTLs and waits around their bounds), in the log's JSON
/// shape; some with one field replaced by any JSON value, which mostly stops them decoding.
fn command_json() -> impl Strategy<Value = Value> {
    let session = || edge_u64().prop_map(SessionId);
    let command =
        prop_oneof![
            (edge_u64(), edge_u64()).prop_map(|(ttl_ms, lock_delay_ms)| Command::OpenSession {
                ttl_ms,
                lock_delay_ms,
                owner: None
            }),
            session().prop_map(|session| Command::KeepAlive { session }),
            session().prop_map(|session| Command::CloseSession { session }),
            session().prop_map(|session| Command::RevokeSession { session }),
            (session(), edge_name(), edge_wait(), edge_u64(), 0_u32..3).prop_map(
                |(session, name, wait, request, attempt)| {
                    Command::Acquire { session, name, wait, request: RequestId(request), attempt }
                }
            ),
            (session(), edge_name(), edge_u64(), 0_u32..3).prop_map(
                |(session, name, request, attempt)| {
                    Command::Abandon { session, name, request: RequestId(request), attempt }
                }
            ),
            (session(), edge_name()).prop_map(|(session, name)| Command::Cancel { session, name }),
            (session(), edge_name(), edge_u64())
                .prop_map(|(session, name, token)| Command::Release { session, name, token }),
            (
                proptest::collection::vec(session(), 0..6),
                proptest::collection::vec((session(), edge_u64()), 0..3)
            )
                .prop_map(|(renew, renew_for)| Command::Tick { renew, renew_for }),
            Just(Command::Refresh),
        ];
    (command, proptest::option::weighted(0.2, ("[a-z_]{1,8}", any_json()))).prop_map(
        |(command, damage)| {
            let mut value = serde_json::to_value(&command).expect("a command serializes");
            if let (Some((field, junk)), Value::Object(map)) = (damage, &mut value) {
                map.insert(field, junk);
            }
            value
        },
    )
}

/// Replaces the `pick`-th number of `value` (counted depth-first) with `replacement`.
fn replace_number(value: &mut Value, pick: usize, replacement: &Value) {
    let mut seen = 0;
    let mut stack: Vec<&mut Value> = vec![value];
    while let Some(node) = stack.pop() {
        match node {
            Value::Number(_) => {
                if seen == pick {
                    *node = replacement.clone();
                    return;
                }
                seen += 1;
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            Value::Object(map) => stack.extend(map.values_mut()),
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(config(4_000))]

    #[test]
    fn sequencer_parsing_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = Sequencer::parse(&text);
        let _ = Sequencer::parse(&format!("p1.{text}"));
        let _ = Sequencer::parse(&format!("p1.7.{text}"));
    }

    #[test]
    fn restore_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = StateMachine::restore(&bytes);
    }

    #[test]
    fn restore_takes_a_damaged_snapshot(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 0_u8..8), 0..4),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let mut bytes = busy_machine().snapshot();
        for (at, bit) in flips {
            let at = at.index(bytes.len());
            bytes[at] ^= 1 << bit;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok(machine) = StateMachine::restore(&bytes) {
            prop_assert!(machine.check_invariants().is_ok());
        }
    }

    #[test]
    fn restore_takes_a_snapshot_with_any_number_replaced(
        pick in 0_usize..400,
        replacement in any_json(),
    ) {
        let mut snapshot: Value = serde_json::from_slice(&busy_machine().snapshot()).expect("json");
        replace_number(&mut snapshot, pick, &replacement);
        let bytes = serde_json::to_vec(&snapshot).expect("serializes");
        if let Ok(mut machine) = StateMachine::restore(&bytes) {
            prop_assert!(machine.check_invariants().is_ok());
            // A restored state goes on working: time passes, every session expires.
            machine.apply(&Input::new(u64::MAX / 2, Command::Tick { renew: Vec::new(), renew_for: Vec::new() }));
            prop_assert!(machine.check_invariants().is_ok());
        }
    }

    #[test]
    fn any_decodable_command_is_refused_or_applied_and_the_state_stays_whole(
        commands in proptest::collection::vec((command_json(), any::<u64>()), 1..8),
    ) {
        let mut machine = busy_machine();
        for (command, now_ms) in commands {
            let Ok(command) = serde_json::from_value::<Command>(command) else { continue };
            let predicted = machine.validate(&command);
            let applied = machine.apply(&Input::new(now_ms, command));
            prop_assert_eq!(predicted.is_ok(), applied.result.is_ok());
            prop_assert!(machine.check_invariants().is_ok());
        }
    }
}

/// Regression: a snapshot whose revision was replaced by the greatest `u64` restored, and the
/// first command applied to it panicked on the revision's overflow (found by
/// `restore_takes_a_snapshot_with_any_number_replaced`). Such a state now refuses every command,
/// with a code that says why, and stays whole.
#[test]
fn a_snapshot_at_the_greatest_revision_refuses_commands_instead_of_overflowing() {
    let mut snapshot: Value = serde_json::from_slice(&busy_machine().snapshot()).expect("json");
    snapshot["revision"] = json!(u64::MAX);
    let bytes = serde_json::to_vec(&snapshot).expect("serializes");
    let mut machine = StateMachine::restore(&bytes).expect("a consistent state");
    for command in [
        Command::Tick { renew: Vec::new(), renew_for: Vec::new() },
        Command::Refresh,
        Command::OpenSession { ttl_ms: 10_000, lock_delay_ms: 0, owner: None },
    ] {
        let predicted = machine.validate(&command);
        let applied = machine.apply(&Input::new(u64::MAX / 2, command));
        let refusal = applied.result.expect_err("no revision is left to accept it");
        assert_eq!(refusal.code(), picket_core::ErrorCode::RevisionsExhausted);
        assert_eq!(predicted, Err(refusal.clone()));
        assert!(machine.refusal_lasts(&refusal), "refused before the log too");
        assert_eq!(machine.revision(), u64::MAX);
        assert!(machine.check_invariants().is_ok());
    }
}
