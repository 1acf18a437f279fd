//! Fuzz targets for the fence's decoders, on stable Rust (issue 13): none may panic, whatever it
//! is given. A few thousand cases each in `cargo test`; `PICKET_FUZZ_CASES=N` runs N.
//!
//! - The stamp headers (`Picket-Sequencer`, `Picket-Seq`, `Idempotency-Key`) from any bytes.
//! - A fence record decoded from any bytes, and records with values at the edges (as a damaged
//!   or hand-edited store could hold) fed to every rule with any stamp.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use picket_fence::http::{
    IDEMPOTENCY_HEADER, SEQ_HEADER, SEQUENCER_HEADER, presented_from_headers,
};
use picket_fence::rule::{self, FenceRecord, Policy, Presented, RememberedWrite, Stamp};
use picket_testkit::fuzz_cases;
use proptest::prelude::*;

fn config(default_cases: u32) -> ProptestConfig {
    ProptestConfig { cases: fuzz_cases(default_cases), ..ProptestConfig::default() }
}

fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0_u64..6, 1 => Just(u64::MAX), 1 => any::<u64>()]
}

fn stamp() -> impl Strategy<Value = Stamp> {
    (edge_u64(), proptest::option::of(edge_u64())).prop_map(|(token, seq)| Stamp { token, seq })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(vec!["k0", "k1", "k2", ""]).prop_map(str::to_owned),
        Just("k".repeat(129)),
        "\\PC{0,8}",
    ]
}

/// Records as a damaged or hand-edited store could hold them: any stamps, any number of
/// remembered keys (more than any policy allows), a `seq` without a token.
fn record() -> impl Strategy<Value = FenceRecord> {
    let remembered = || {
        (key(), stamp(), proptest::option::of("[0-9a-f]{0,64}"), proptest::option::of(edge_u64()))
            .prop_map(|(key, stamp, request_digest, admitted_at_ms)| RememberedWrite {
                key,
                stamp,
                request_digest,
                admitted_at_ms,
            })
    };
    (
        proptest::sample::select(vec!["orders", "other", ""]),
        any::<bool>(),
        edge_u64(),
        proptest::option::of(edge_u64()),
        any::<bool>(),
        prop_oneof![
            15 => proptest::collection::vec(remembered(), 0..6),
            1 => proptest::collection::vec(remembered(), 1_025..1_027),
        ],
        edge_u64(),
    )
        .prop_map(|(lock, strict, highest_token, last_seq, spent, remembered, forgotten)| {
            FenceRecord {
                lock: lock.to_owned(),
                strict,
                highest_token,
                last_seq,
                spent,
                remembered: remembered.into(),
                legacy_keys: std::collections::VecDeque::new(),
                forgotten_unsequenced_token: forgotten,
            }
        })
}

fn presented() -> impl Strategy<Value = Presented> {
    (
        proptest::sample::select(vec!["orders", "other"]),
        stamp(),
        proptest::option::of(key()),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..4)),
    )
        .prop_map(|(lock, stamp, idempotency_key, body)| {
            let mut presented = Presented::new(lock, stamp.token);
            presented.stamp = stamp;
            presented.idempotency_key = idempotency_key;
            match body {
                Some(body) => presented.with_request(&[&body]),
                None => presented,
            }
        })
}

fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..40),
        "p1\\.[0-9]{0,21}\\.[a-z%0-9]{0,6}".prop_map(String::into_bytes),
        "[0-9-+ ]{0,22}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(config(4_000))]

    #[test]
    fn stamp_headers_take_any_bytes(
        sequencer in proptest::option::of(header_value()),
        seq in proptest::option::of(header_value()),
        key in proptest::option::of(header_value()),
    ) {
        let mut headers = HeaderMap::new();
        for (name, value) in [(SEQUENCER_HEADER, sequencer), (SEQ_HEADER, seq), (IDEMPOTENCY_HEADER, key)] {
            // Bytes no header may carry (a newline) never reach a server; the rest do.
            if let Some(value) = value.and_then(|value| HeaderValue::from_bytes(&value).ok()) {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
        if let Ok(Some(presented)) = presented_from_headers(&headers, None) {
            prop_assert!(presented.stamp.token > 0, "token 0 is never presented as a grant");
        }
    }

    #[test]
    fn a_record_decodes_from_any_bytes_or_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = serde_json::from_slice::<FenceRecord>(&bytes);
    }

    #[test]
    fn every_rule_takes_any_record_and_any_stamp(
        current in proptest::option::of(record()),
        presented in presented(),
        strict in any::<bool>(),
        remembered_keys in 0_usize..8,
        remember_keys_for_ms in edge_u64(),
        now_ms in edge_u64(),
    ) {
        let policy = Policy::new("orders")
            .remembering_keys(remembered_keys)
            .remembering_keys_for_ms(remember_keys_for_ms);
        let policy = if strict { policy.strict() } else { policy };
        if let Ok((admission, next)) = rule::admit("orders/", current.as_ref(), &policy, &presented, now_ms) {
            // A duplicate only reports what the record remembers, however inconsistent.
            prop_assert!(!admission.should_apply() || next.highest_token >= presented.stamp.token);
            prop_assert!(next.remembered.len() <= rule::MAX_REMEMBERED_KEYS);
        }
        let inputs = [("orders/", current.as_ref(), &policy), ("orders/b", None, &policy)];
        let _ = rule::admit_all(&inputs, &presented, now_ms);
        let token = presented.stamp.token;
        if let Ok(next) = rule::register("orders/", current.as_ref(), &policy, &presented.lock, token) {
            prop_assert!(next.highest_token >= token);
        }
        let _ = rule::check_read("orders/", current.as_ref(), &policy, &presented.lock, token);
    }
}
