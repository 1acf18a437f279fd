//! Concurrency: many threads race writes with old and new tokens against each backend. No stale
//! write may be applied (the applied log's tokens never go down), none may be lost (every
//! admitted write is in the log), and the stored highest token is the largest admitted.

use picket_fence::{FencedStore, Guarded, Policy, Presented, ResourceGuard, Stamp, WriteError};
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

const THREADS: usize = 8;
const WRITES_PER_THREAD: usize = 200;

fn presented(token: u64) -> Presented {
    Presented {
        lock: "race".into(),
        stamp: Stamp { token, seq: None },
        idempotency_key: None,
        request_digest: None,
    }
}

/// Each thread sometimes takes a fresh grant from the shared counter and otherwise keeps writing
/// with the token it has, which other threads' newer grants make stale. Returns, per thread, the
/// tokens of its admitted writes.
fn race(write: impl Fn(u64) -> bool + Sync) -> Vec<Vec<u64>> {
    let grants = AtomicU64::new(1);
    let start = Barrier::new(THREADS);
    thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread_index| {
                let (grants, write, start) = (&grants, &write, &start);
                scope.spawn(move || {
                    start.wait();
                    let mut token = grants.fetch_add(1, Ordering::SeqCst);
                    let mut admitted = Vec::new();
                    for attempt in 0..WRITES_PER_THREAD {
                        if (attempt + thread_index) % 7 == 0 {
                            token = grants.fetch_add(1, Ordering::SeqCst);
                        }
                        if write(token) {
                            admitted.push(token);
                        }
                        // Let other threads take newer grants between this thread's writes.
                        thread::yield_now();
                    }
                    admitted
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    })
}

fn assert_log_is_sound(log: &[u64], admitted: &[Vec<u64>], highest: u64) {
    let admitted_count: usize = admitted.iter().map(Vec::len).sum();
    assert_eq!(log.len(), admitted_count, "every admitted write landed, and nothing else");
    assert!(log.windows(2).all(|pair| pair[0] <= pair[1]), "a stale write was applied: {log:?}");
    let max_admitted = admitted.iter().flatten().copied().max().unwrap();
    assert_eq!(highest, max_admitted);
    assert!(admitted_count > THREADS, "the race admitted too little to mean anything");
    assert!(admitted_count < THREADS * WRITES_PER_THREAD, "some writes must have been stale");
}

#[test]
fn in_memory_guard_applies_no_stale_write_under_contention() {
    let guarded = Guarded::new("race/", Policy::new("race"), Vec::new());
    let admitted = race(|token| guarded.write(&presented(token), |log| log.push(token)).is_ok());
    let log = guarded.read("race", guarded.highest_token(), Clone::clone).unwrap();
    assert_log_is_sound(&log, &admitted, guarded.highest_token());
}

#[test]
fn durable_store_applies_no_stale_write_under_contention() {
    let dir = tempfile::tempdir().unwrap();
    let store = FencedStore::open(dir.path().join("fence.redb")).unwrap();
    let policy = Policy::new("race");
    let guard = ResourceGuard { resource: "race/", policy: &policy };
    let admitted = race(|token| {
        let result = store.write(&[guard], &presented(token), |unit| {
            let count = unit
                .get("race/count")?
                .map_or(0, |bytes| u64::from_be_bytes(bytes.try_into().unwrap()));
            unit.put(&format!("race/log/{count:08}"), &token.to_be_bytes())?;
            unit.put("race/count", &(count + 1).to_be_bytes())
        });
        match result {
            Ok(_) => true,
            Err(WriteError::Refused(_)) => false,
            Err(other) => panic!("storage failed: {other}"),
        }
    });
    let decode = |bytes: Vec<u8>| u64::from_be_bytes(bytes.try_into().unwrap());
    let count = store.get("race/count").unwrap().map_or(0, decode);
    let log: Vec<u64> = (0..count)
        .map(|index| decode(store.get(&format!("race/log/{index:08}")).unwrap().unwrap()))
        .collect();
    let highest = store.record("race/").unwrap().unwrap().highest_token;
    assert_log_is_sound(&log, &admitted, highest);
}

/// One operation over several resources is admitted at all of them or at none.
#[test]
fn a_write_over_several_resources_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = FencedStore::open(dir.path().join("fence.redb")).unwrap();
    let (orders, stock) = (Policy::new("shop"), Policy::new("shop"));
    let guards = [
        ResourceGuard { resource: "orders/", policy: &orders },
        ResourceGuard { resource: "stock/", policy: &stock },
    ];
    // A newer grant reached "stock/" only.
    store.register(guards[1], "shop", 10).unwrap();
    let stale = store.write(&guards, &presented_for("shop", 9), |unit| {
        unit.put("orders/1", b"x")?;
        unit.put("stock/1", b"y")
    });
    assert!(matches!(stale, Err(WriteError::Refused(ref refusal)) if refusal.resource == "stock/"));
    assert_eq!(
        store.get("orders/1").unwrap(),
        None,
        "nothing landed at the admitting resource either"
    );
    assert_eq!(store.record("orders/").unwrap(), None, "no fence record changed");
    store
        .write(&guards, &presented_for("shop", 10), |unit| {
            unit.put("orders/1", b"x")?;
            unit.put("stock/1", b"y")
        })
        .unwrap();
    assert_eq!(store.record("orders/").unwrap().unwrap().highest_token, 10);
    assert_eq!(store.get("stock/1").unwrap().as_deref(), Some(&b"y"[..]));
}

/// A unit that fails leaves nothing behind, not even the advanced fence record.
#[test]
fn a_failing_unit_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = FencedStore::open(dir.path().join("fence.redb")).unwrap();
    let policy = Policy::new("race");
    let guard = ResourceGuard { resource: "race/", policy: &policy };
    let failed = store.write(&[guard], &presented(5), |unit| {
        unit.put("race/a", b"1")?;
        unit.put("", b"empty keys are refused")
    });
    assert!(matches!(failed, Err(WriteError::Store(_))));
    assert_eq!(store.get("race/a").unwrap(), None);
    assert_eq!(store.record("race/").unwrap(), None);
}

fn presented_for(lock: &str, token: u64) -> Presented {
    Presented {
        lock: lock.into(),
        stamp: Stamp { token, seq: None },
        idempotency_key: None,
        request_digest: None,
    }
}
