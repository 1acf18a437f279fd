//! Property test of the admission rule against a reference model that decides from the history
//! of admitted writes alone, run through both backends at once: the in-memory `Guarded` and the
//! durable `FencedStore`, which is closed and reopened at random points (restarts of the
//! resource). All three must agree on every decision, and the stored data must contain exactly
//! the admitted writes. Both backends read one test clock, which the test moves, so keys are
//! forgotten by time as well as by count.

use picket_fence::{
    Admission, FencedStore, Guarded, Policy, Presented, RefusalReason, ResourceGuard, Stamp,
    WallClock, WriteError,
};
use proptest::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const LOCK: &str = "orders";
const RESOURCE: &str = "orders/";
const TOKENS: [u64; 5] = [3, 7, 7, 12, 20];

#[derive(Clone, Debug)]
enum Op {
    Write {
        token: usize,
        other_lock: bool,
        seq: Option<u64>,
        key: Option<u8>,
        body: u8,
    },
    Register {
        token: usize,
    },
    Restart,
    /// The backends' clock moves forward this many milliseconds.
    Wait {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..TOKENS.len(), proptest::bool::weighted(0.05), proptest::option::of(0u64..6), proptest::option::weighted(0.4, 0u8..8), 0u8..2)
            .prop_map(|(token, other_lock, seq, key, body)| Op::Write { token, other_lock, seq, key, body }),
        2 => (0..TOKENS.len()).prop_map(|token| Op::Register { token }),
        1 => Just(Op::Restart),
        1 => (0_u64..=REMEMBER_KEYS_FOR_MS * 3 / 2).prop_map(|ms| Op::Wait { ms }),
    ]
}

/// What the model decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    Admitted,
    Duplicate,
    Refused(&'static str),
}

/// How many keyed writes the resource remembers in this test: few, so forgetting happens.
const REMEMBERED_KEYS: usize = 4;
/// How long the resource remembers a keyed write in this test, in milliseconds.
const REMEMBER_KEYS_FOR_MS: u64 = 100;
/// The test clock's first reading.
const START_MS: u64 = 1_764_000_000_000;

/// An admitted write: token, seq, idempotency key, body, and when it was admitted.
type Write = (u64, Option<u64>, Option<String>, u8, u64);

/// Decides from the history: the admitted writes and the registered tokens.
#[derive(Default)]
struct Model {
    strict: bool,
    admitted: Vec<Write>,
    registered: Vec<u64>,
}

impl Model {
    fn highest(&self) -> u64 {
        let writes = self.admitted.iter().map(|(token, ..)| *token);
        writes.chain(self.registered.iter().copied()).max().unwrap_or(0)
    }

    fn decide(
        &self,
        lock: &str,
        stamp: Stamp,
        key: Option<&str>,
        body: u8,
        now_ms: u64,
    ) -> Decision {
        if lock != LOCK {
            return Decision::Refused("wrong_lock");
        }
        let highest = self.highest();
        if let Some(key) = key {
            // The last few keyed writes are remembered, if not for too long; the rest are
            // forgotten.
            let keyed: Vec<&Write> =
                self.admitted.iter().filter(|(_, _, k, ..)| k.is_some()).collect();
            let last_few = keyed.len().saturating_sub(REMEMBERED_KEYS);
            let is_remembered = |position: usize, at_ms: u64| {
                position >= last_few && now_ms - at_ms < REMEMBER_KEYS_FOR_MS
            };
            let mut remembered: Vec<&Write> = Vec::new();
            let mut forgotten: Vec<&Write> = Vec::new();
            for (position, write) in keyed.into_iter().enumerate() {
                if is_remembered(position, write.4) {
                    remembered.push(write);
                } else {
                    forgotten.push(write);
                }
            }
            if let Some((token, seq, _, original_body, _)) =
                remembered.iter().find(|(_, _, k, ..)| k.as_deref() == Some(key))
            {
                return if (*token, *seq, *original_body) == (stamp.token, stamp.seq, body) {
                    Decision::Duplicate
                } else {
                    Decision::Refused("idempotency_key_reused")
                };
            }
            // A forgotten keyed write without a seq of the current grant: a keyed write of that
            // grant without a seq may be its retry.
            let forgotten_unsequenced =
                forgotten.iter().any(|(token, seq, ..)| seq.is_none() && *token == stamp.token);
            let newest_forgotten = forgotten
                .iter()
                .filter(|(_, seq, ..)| seq.is_none())
                .map(|(token, ..)| *token)
                .max();
            if stamp.seq.is_none()
                && stamp.token == highest
                && forgotten_unsequenced
                && newest_forgotten == Some(stamp.token)
            {
                return Decision::Refused("idempotency_window_passed");
            }
        }
        let highest = self.highest();
        if stamp.token < highest {
            return Decision::Refused("stale_token");
        }
        if stamp.token > highest {
            return Decision::Admitted;
        }
        let same_grant: Vec<Option<u64>> = self
            .admitted
            .iter()
            .filter(|(token, ..)| *token == stamp.token)
            .map(|(_, seq, ..)| *seq)
            .collect();
        if self.strict {
            return if same_grant.is_empty() {
                Decision::Admitted
            } else {
                Decision::Refused("strict_repeat")
            };
        }
        match (stamp.seq, same_grant.iter().flatten().max()) {
            (Some(seq), Some(last)) if seq <= *last => Decision::Refused("replayed_seq"),
            _ => Decision::Admitted,
        }
    }
}

fn decision_of<R>(result: Result<Admission, (RefusalReason, R)>) -> Decision {
    match result {
        Ok(Admission::Duplicate) => Decision::Duplicate,
        Ok(_) => Decision::Admitted,
        Err((reason, _)) => Decision::Refused(reason.code()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn backends_agree_with_the_reference_model(ops in proptest::collection::vec(op(), 1..60), strict: bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence.redb");
        let policy = if strict { Policy::new(LOCK).strict() } else { Policy::new(LOCK) };
        let policy = policy
            .remembering_keys(REMEMBERED_KEYS)
            .remembering_keys_for_ms(REMEMBER_KEYS_FOR_MS);
        let guard = ResourceGuard { resource: RESOURCE, policy: &policy };
        let now_ms = Arc::new(AtomicU64::new(START_MS));
        let reading = now_ms.clone();
        let clock = WallClock::from_fn(move || reading.load(Ordering::SeqCst));
        let open = || FencedStore::open(&path).unwrap().with_clock(clock.clone());
        let mut store = Some(open());
        let memory =
            Guarded::new(RESOURCE, policy.clone(), Vec::<u64>::new()).with_clock(clock.clone());
        let mut model = Model { strict, ..Model::default() };
        for (index, op) in ops.iter().enumerate() {
            match op {
                Op::Restart => {
                    drop(store.take());
                    store = Some(open());
                }
                Op::Wait { ms } => {
                    now_ms.fetch_add(*ms, Ordering::SeqCst);
                }
                Op::Register { token } => {
                    let token = TOKENS[*token];
                    let expected = token >= model.highest();
                    let in_memory = memory.register(LOCK, token).is_ok();
                    let durable = store.as_ref().unwrap().register(guard, LOCK, token).is_ok();
                    prop_assert_eq!(in_memory, expected);
                    prop_assert_eq!(durable, expected);
                    if expected {
                        model.registered.push(token);
                    }
                }
                Op::Write { token, other_lock, seq, key, body } => {
                    let lock = if *other_lock { "other" } else { LOCK };
                    let stamp = Stamp { token: TOKENS[*token], seq: *seq };
                    let key = key.map(|k| format!("key-{k}"));
                    let mut presented = Presented::new(lock, stamp.token).with_request(&[&[*body]]);
                    presented.stamp = stamp;
                    presented.idempotency_key.clone_from(&key);
                    let expected = model.decide(lock, stamp, key.as_deref(), *body, now_ms.load(Ordering::SeqCst));
                    let write_id = index as u64;
                    let in_memory = decision_of(
                        memory
                            .write(&presented, |log| log.push(write_id))
                            .map(|written| written.admission)
                            .map_err(|refusal| (refusal.reason, ())),
                    );
                    let durable = decision_of(
                        store
                            .as_ref()
                            .unwrap()
                            .write(&[guard], &presented, |unit| unit.put(&format!("orders/{write_id:04}"), b"x"))
                            .map(|applied| applied.admission)
                            .map_err(|error| match error {
                                WriteError::Refused(refusal) => (refusal.reason, ()),
                                other => panic!("storage failed: {other}"),
                            }),
                    );
                    prop_assert_eq!(in_memory, expected, "memory, op {} {:?}", index, op);
                    prop_assert_eq!(durable, expected, "store, op {} {:?}", index, op);
                    if expected == Decision::Admitted {
                        model.admitted.push((stamp.token, stamp.seq, key, *body, now_ms.load(Ordering::SeqCst)));
                    }
                }
            }
            let store_ref = store.as_ref().unwrap();
            let highest = store_ref.record(RESOURCE).unwrap().map_or(0, |record| record.highest_token);
            prop_assert_eq!(highest, model.highest());
            prop_assert_eq!(memory.highest_token(), model.highest());
        }
        // Exactly the admitted writes landed, in both backends.
        let landed = store.as_ref().unwrap().scan("orders/", usize::MAX).unwrap().len();
        prop_assert_eq!(landed, model.admitted.len());
        let in_memory_len = memory.read(LOCK, model.highest().max(1), |log| log.len());
        prop_assert_eq!(in_memory_len.unwrap(), model.admitted.len());
    }
}
