//! Micro-benchmarks of the fence's admission path: `cargo bench -p picket-fence`.
//! Figures are recorded in BENCHMARKS.md; nothing here asserts a timing.

use picket_fence::rule::{self, Policy, Presented, Stamp};
use picket_fence::{FencedStore, Guarded, ResourceGuard};
use picket_testkit::bench::measure;
use std::hint::black_box;

fn main() {
    let policy = Policy::new("orders");
    let presented = |token, seq| Presented {
        lock: "orders".into(),
        stamp: Stamp { token, seq },
        idempotency_key: None,
        request_digest: None,
    };
    let now_ms = 1_764_000_000_000;
    let (_, record) =
        rule::admit("orders/", None, &policy, &presented(40, Some(0)), now_ms).expect("admitted");

    let mut seq = 0;
    measure("fence rule: same grant, rising seq", 200_000, || {
        seq += 1;
        black_box(
            rule::admit("orders/", Some(&record), &policy, &presented(40, Some(seq)), now_ms)
                .is_ok(),
        );
    });
    measure("fence rule: stale token refused", 200_000, || {
        let refused = rule::admit("orders/", Some(&record), &policy, &presented(39, None), now_ms);
        black_box(refused.is_err());
    });

    let guarded = Guarded::new("orders/", policy.clone(), 0_u64);
    guarded.register("orders", 40).expect("registered");
    measure("fence in memory: admitted write under the mutex", 200_000, || {
        black_box(guarded.write(&presented(40, None), |value| *value += 1).is_ok());
    });

    // The durable store: the admission's share of a write is measured against the same write
    // without a fence record, both with fsync on.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = FencedStore::open(dir.path().join("bench.redb")).expect("the store opens");
    let guard = ResourceGuard { resource: "orders/", policy: &policy };
    let fenced = measure("fenced store: admitted write (one redb transaction, fsync)", 300, || {
        store
            .write(&[guard], &presented(40, None), |unit| unit.put("orders/1", b"value"))
            .expect("admitted");
    });
    let unfenced =
        measure("store without fence: same write (one redb transaction, fsync)", 300, || {
            store
                .write(&[], &presented(40, None), |unit| unit.put("orders/1", b"value"))
                .expect("written");
        });
    println!("fence overhead on a durable write: {:+.1} %", (fenced / unfenced - 1.0) * 100.0);
}
