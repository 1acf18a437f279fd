use super::*;

fn write(lock: &str, token: u64, seq: Option<u64>) -> Presented {
    Presented {
        lock: lock.into(),
        stamp: Stamp { token, seq },
        idempotency_key: None,
        request_digest: None,
    }
}

/// The backend's wall clock in these tests, unless a test moves it.
const NOW_MS: u64 = 1_764_000_000_000;

/// Applies a write to `record` and returns the reason if refused.
fn step(
    record: &mut Option<FenceRecord>,
    policy: &Policy,
    presented: &Presented,
) -> Result<Admission, RefusalReason> {
    step_at(record, policy, presented, NOW_MS)
}

/// [`step`] at `now_ms`.
fn step_at(
    record: &mut Option<FenceRecord>,
    policy: &Policy,
    presented: &Presented,
    now_ms: u64,
) -> Result<Admission, RefusalReason> {
    match admit("res", record.as_ref(), policy, presented, now_ms) {
        Ok((admission, next)) => {
            *record = Some(next);
            Ok(admission)
        }
        Err(refusal) => Err(refusal.reason),
    }
}

/// The seeds' canonical trace at the resource: 34 lands, then the paused holder's 33 is
/// refused, whatever order the writes were sent in.
#[test]
fn stale_token_is_refused_after_a_newer_one_landed() {
    let policy = Policy::new("res-lock");
    let mut record = None;
    assert_eq!(
        step(&mut record, &policy, &write("res-lock", 34, None)),
        Ok(Admission::Advanced { previous_token: 0 })
    );
    assert_eq!(step(&mut record, &policy, &write("res-lock", 33, None)), Err(RefusalReason::Stale));
    assert_eq!(step(&mut record, &policy, &write("res-lock", 34, None)), Ok(Admission::Same));
    assert_eq!(record.unwrap().highest_token, 34);
}

#[test]
fn tokens_of_another_lock_and_token_zero_are_refused() {
    let policy = Policy::new("a");
    let mut record = None;
    assert_eq!(step(&mut record, &policy, &write("b", 5, None)), Err(RefusalReason::WrongLock));
    assert_eq!(step(&mut record, &policy, &write("a", 0, None)), Err(RefusalReason::InvalidToken));
    assert_eq!(record, None);
}

#[test]
fn same_grant_must_raise_seq() {
    let policy = Policy::new("a");
    let mut record = None;
    step(&mut record, &policy, &write("a", 7, Some(1))).unwrap();
    assert_eq!(step(&mut record, &policy, &write("a", 7, Some(2))), Ok(Admission::Same));
    assert_eq!(
        step(&mut record, &policy, &write("a", 7, Some(2))),
        Err(RefusalReason::Replay { last_seq: 2 })
    );
    assert_eq!(
        step(&mut record, &policy, &write("a", 7, Some(1))),
        Err(RefusalReason::Replay { last_seq: 2 })
    );
    assert_eq!(step(&mut record, &policy, &write("a", 7, None)), Ok(Admission::Same));
    assert_eq!(step(&mut record, &policy, &write("a", 8, Some(1))).map(|_| ()), Ok(()));
}

#[test]
fn strict_mode_admits_one_write_per_grant_and_registration_does_not_spend_it() {
    let policy = Policy::new("a").strict();
    let mut record = None;
    step(&mut record, &policy, &write("a", 3, None)).unwrap();
    assert_eq!(step(&mut record, &policy, &write("a", 3, None)), Err(RefusalReason::StrictRepeat));
    record = Some(register("res", record.as_ref(), &policy, "a", 4).unwrap());
    assert_eq!(step(&mut record, &policy, &write("a", 4, None)), Ok(Admission::Same));
    assert_eq!(step(&mut record, &policy, &write("a", 4, None)), Err(RefusalReason::StrictRepeat));
}

#[test]
fn registration_fences_out_the_previous_holder_before_the_new_one_writes() {
    let policy = Policy::new("a");
    let mut record = None;
    step(&mut record, &policy, &write("a", 10, None)).unwrap();
    record = Some(register("res", record.as_ref(), &policy, "a", 12).unwrap());
    assert_eq!(step(&mut record, &policy, &write("a", 10, None)), Err(RefusalReason::Stale));
    assert!(check_read("res", record.as_ref(), &policy, "a", 10).is_err());
    assert!(check_read("res", record.as_ref(), &policy, "a", 12).is_ok());
    assert!(register("res", record.as_ref(), &policy, "a", 11).is_err());
}

#[test]
fn a_retry_with_the_same_key_and_stamp_gets_the_original_success() {
    let policy = Policy::new("a").strict();
    let mut record = None;
    let first = write("a", 5, None).with_idempotency_key("op-1");
    assert_eq!(step(&mut record, &policy, &first), Ok(Admission::Advanced { previous_token: 0 }));
    assert_eq!(step(&mut record, &policy, &first), Ok(Admission::Duplicate));
    let other_stamp = write("a", 6, None).with_idempotency_key("op-1");
    assert!(matches!(
        step(&mut record, &policy, &other_stamp),
        Err(RefusalReason::IdempotencyKeyReused { .. })
    ));
    // Keys are bounded: after DEFAULT_REMEMBERED_KEYS newer keys, the first is forgotten,
    // and its retry is judged by its seq: a replay.
    let policy = Policy::new("a");
    let mut record = None;
    step(&mut record, &policy, &write("a", 5, Some(0)).with_idempotency_key("k0")).unwrap();
    for seq in 1..=DEFAULT_REMEMBERED_KEYS as u64 {
        let key = format!("k{seq}");
        step(&mut record, &policy, &write("a", 5, Some(seq)).with_idempotency_key(key)).unwrap();
    }
    assert_eq!(record.as_ref().unwrap().remembered.len(), DEFAULT_REMEMBERED_KEYS);
    assert!(matches!(
        step(&mut record, &policy, &write("a", 5, Some(0)).with_idempotency_key("k0")),
        Err(RefusalReason::Replay { .. })
    ));
}

/// Issue 13, point 3: a key reused with the same stamp for another write was answered
/// `duplicate`, and the new write never happened.
#[test]
fn idempotency_key_reused_for_another_request_is_refused_not_answered_as_a_duplicate() {
    let policy = Policy::new("a");
    let mut record = None;
    let put = |value: &[u8]| {
        write("a", 5, None).with_idempotency_key("op-1").with_request(&[b"PUT", b"x", value])
    };
    assert!(step(&mut record, &policy, &put(b"1")).is_ok());
    assert_eq!(step(&mut record, &policy, &put(b"1")), Ok(Admission::Duplicate));
    assert_eq!(
        step(&mut record, &policy, &put(b"2")),
        Err(RefusalReason::IdempotencyKeyReused { original: Stamp { token: 5, seq: None } })
    );
    // Length prefixes keep parts apart: ("ab", "c") is not ("a", "bc").
    let split = |first: &[u8], second: &[u8]| write("a", 5, None).with_request(&[first, second]);
    assert_ne!(split(b"ab", b"c").request_digest, split(b"a", b"bc").request_digest);
}

/// Found in review: a write that did not say what it does was answered `duplicate` under a
/// key whose first write did say, so a different write was dropped unapplied. It is refused
/// now. A first write that said nothing (remembered by an earlier version, say) still takes
/// its retry at its word, said or not, so a retry across an upgrade gets its first outcome.
#[test]
fn a_keyed_write_that_says_nothing_is_not_a_retry_of_one_that_said_what_it_does() {
    let policy = Policy::new("a");
    let mut record = None;
    let said = write("a", 5, None).with_idempotency_key("op-1").with_request(&[b"PUT", b"x"]);
    let unsaid = write("a", 5, None).with_idempotency_key("op-1");
    assert!(step(&mut record, &policy, &said).is_ok());
    let reused =
        Err(RefusalReason::IdempotencyKeyReused { original: Stamp { token: 5, seq: None } });
    assert_eq!(step(&mut record, &policy, &unsaid), reused);
    assert_eq!(step(&mut record, &policy, &said), Ok(Admission::Duplicate));
    let mut record = None;
    assert!(step(&mut record, &policy, &unsaid).is_ok());
    assert_eq!(step(&mut record, &policy, &said), Ok(Admission::Duplicate));
    assert_eq!(step(&mut record, &policy, &unsaid), Ok(Admission::Duplicate));
}

/// Issue 13, point 3: only 32 keys were remembered, and a retry arriving after 32 newer keyed
/// writes of the same grant (no seq) was applied a second time.
#[test]
fn idempotency_retry_after_its_key_was_forgotten_is_refused_never_applied_twice() {
    let policy = Policy::new("a").remembering_keys(4);
    let mut record = None;
    let keyed = |key: &str| write("a", 5, None).with_idempotency_key(key);
    for key in ["k0", "k1", "k2", "k3"] {
        assert!(step(&mut record, &policy, &keyed(key)).is_ok());
    }
    assert_eq!(step(&mut record, &policy, &keyed("k0")), Ok(Admission::Duplicate));
    assert!(step(&mut record, &policy, &keyed("k4")).is_ok(), "k0 is forgotten now");
    assert_eq!(record.as_ref().unwrap().remembered.len(), 4);
    assert_eq!(
        step(&mut record, &policy, &keyed("k0")),
        Err(RefusalReason::IdempotencyWindowPassed),
        "the retry of k0 cannot be told from a new write: refused"
    );
    assert_eq!(
        step(&mut record, &policy, &keyed("k5")),
        Err(RefusalReason::IdempotencyWindowPassed),
        "nor can a new keyed write of that grant without a seq"
    );
    assert!(step(&mut record, &policy, &keyed("k6").with_seq(1)).is_ok(), "a seq orders it");
    assert!(step(&mut record, &policy, &write("a", 6, None).with_idempotency_key("k7")).is_ok());
    assert_eq!(step(&mut record, &policy, &keyed("k0")), Err(RefusalReason::Stale));
    assert!(step(&mut record, &policy, &write("a", 6, None)).is_ok(), "unkeyed writes as ever");
}

/// Issue 13, point 3: keys are kept for a stated time as well as a count. Within the time a
/// retry gets the original outcome; after it the retry is refused, never applied twice.
#[test]
fn idempotency_retry_after_its_key_was_remembered_for_its_time_is_refused_never_applied_twice() {
    let policy = Policy::new("a").remembering_keys_for_ms(60_000);
    let mut record = None;
    let keyed = |key: &str| write("a", 5, None).with_idempotency_key(key);
    assert!(step_at(&mut record, &policy, &keyed("k0"), NOW_MS).is_ok());
    assert_eq!(
        step_at(&mut record, &policy, &keyed("k0"), NOW_MS + 59_999),
        Ok(Admission::Duplicate),
        "within the time: the original outcome"
    );
    assert_eq!(
        step_at(&mut record, &policy, &keyed("k0"), NOW_MS + 60_000),
        Err(RefusalReason::IdempotencyWindowPassed),
        "after it: refused, since it cannot be told from a new write of the grant"
    );
    // A keyed write of that grant without a seq cannot be told from that retry, fresh key or not.
    assert_eq!(
        step_at(&mut record, &policy, &keyed("fresh"), NOW_MS + 60_001),
        Err(RefusalReason::IdempotencyWindowPassed)
    );
    // With a seq the retry is a replay, told apart from a new write by its order.
    let sequenced = |key: &str, seq| write("a", 5, Some(seq)).with_idempotency_key(key);
    assert!(step_at(&mut record, &policy, &sequenced("s1", 1), NOW_MS + 70_000).is_ok());
    assert_eq!(
        step_at(&mut record, &policy, &sequenced("s1", 1), NOW_MS + 200_000),
        Err(RefusalReason::Replay { last_seq: 1 })
    );
}

/// A backend clock that steps back never makes the fence forget a key early: it is kept until
/// the time has passed by the clock that remembered it and by the count.
#[test]
fn idempotency_keys_outlive_a_clock_that_steps_back() {
    let policy = Policy::new("a").remembering_keys_for_ms(60_000);
    let mut record = None;
    let keyed = |key: &str| write("a", 5, None).with_idempotency_key(key);
    assert!(step_at(&mut record, &policy, &keyed("k0"), NOW_MS).is_ok());
    assert!(step_at(&mut record, &policy, &keyed("k1"), NOW_MS - 3_600_000).is_ok());
    assert_eq!(
        step_at(&mut record, &policy, &keyed("k0"), NOW_MS - 3_600_000 + 1),
        Ok(Admission::Duplicate)
    );
    assert_eq!(
        step_at(&mut record, &policy, &keyed("k1"), NOW_MS + 1),
        Ok(Admission::Duplicate),
        "k1 sits behind k0, which is not due yet"
    );
}

/// Keys remembered before they had a time start their time at the record's next admission.
#[test]
fn idempotency_keys_remembered_without_a_time_start_it_at_the_next_admission() {
    let policy = Policy::new("a").remembering_keys_for_ms(60_000);
    let old = r#"{"lock":"a","strict":false,"highest_token":7,"last_seq":null,"spent":true,
            "remembered":[{"key":"k","stamp":{"token":7,"seq":null},"request_digest":null}]}"#;
    let record: FenceRecord = serde_json::from_str(old).expect("a record without times decodes");
    let mut record = Some(record);
    let retry = write("a", 7, None).with_idempotency_key("k");
    assert_eq!(step_at(&mut record, &policy, &retry, NOW_MS), Ok(Admission::Duplicate));
    let unrelated = write("a", 7, Some(1));
    assert!(step_at(&mut record, &policy, &unrelated, NOW_MS).is_ok());
    assert_eq!(record.as_ref().unwrap().remembered[0].admitted_at_ms, Some(NOW_MS));
    assert_eq!(
        step_at(&mut record, &policy, &retry, NOW_MS + 60_000),
        Err(RefusalReason::IdempotencyWindowPassed)
    );
}

/// Found in review: a record written before `remembered` existed kept its keys under
/// `recent_keys`, which the new record ignored, so a retry of a keyed write admitted before an
/// upgrade was applied a second time after it.
#[test]
fn idempotency_keys_of_a_record_from_before_the_upgrade_still_count() {
    let policy = Policy::new("a");
    let old = r#"{"lock":"a","strict":false,"highest_token":7,"last_seq":null,"spent":true,
            "recent_keys":[["k",{"token":7,"seq":null}]]}"#;
    let record: FenceRecord = serde_json::from_str(old).expect("an old record decodes");
    let retry = write("a", 7, None).with_idempotency_key("k");
    let (admission, upgraded) = admit("res", Some(&record), &policy, &retry, NOW_MS).unwrap();
    assert_eq!(admission, Admission::Duplicate, "the retry is not applied again");
    let new = write("a", 7, None).with_idempotency_key("other");
    let (_, next) = admit("res", Some(&upgraded), &policy, &new, NOW_MS).unwrap();
    assert_eq!(next.remembered.len(), 2);
    let json = serde_json::to_string(&next).expect("serializes");
    assert!(!json.contains("recent_keys"), "{json}");
}

/// Found by `tests/fuzz.rs`: a stored record holding more keys than any policy allows (a
/// damaged or hand-edited store) hit the assertion on the next unkeyed write.
#[test]
fn fuzz_a_record_holding_more_keys_than_any_policy_allows_is_trimmed_not_a_panic() {
    let policy = Policy::new("a");
    let mut record = FenceRecord::empty(&policy);
    let stamp = Stamp { token: 1, seq: Some(0) };
    record.remembered = (0..=MAX_REMEMBERED_KEYS)
        .map(|n| RememberedWrite {
            key: format!("k{n}"),
            stamp,
            request_digest: None,
            admitted_at_ms: Some(NOW_MS),
        })
        .collect();
    let (_, next) = admit("res", Some(&record), &policy, &write("a", 2, None), NOW_MS).unwrap();
    assert_eq!(next.remembered.len(), DEFAULT_REMEMBERED_KEYS);
}

#[test]
fn refusal_carries_what_the_client_needs() {
    let policy = Policy::new("orders");
    let record = admit("orders/db", None, &policy, &write("orders", 9, None), NOW_MS).unwrap().1;
    let refusal = admit("orders/db", Some(&record), &policy, &write("orders", 8, Some(3)), NOW_MS)
        .unwrap_err();
    assert_eq!(refusal.resource, "orders/db");
    assert_eq!(refusal.lock, "orders");
    assert_eq!(refusal.presented, Stamp { token: 8, seq: Some(3) });
    assert_eq!(refusal.highest_token, 9);
    let message = refusal.to_string();
    assert!(message.contains("token 8") && message.contains("9"), "{message}");
}
