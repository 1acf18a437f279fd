//! The protocol in small worlds, every interleaving up to a bound: the real state machine as the
//! lock service, the real fence rule at the resource, messages delivered in any order,
//! keepalives riding in the leader's ticks, sessions expiring, waiters granted, lock-delay, the
//! leader changing. No stale write is admitted and tokens strictly increase in every reachable
//! state; a broken fence and a token counter that starts again are caught.
//!
//! The bounds here keep each search to seconds in a debug build; larger ones run with
//! `cargo run --release -p picket-sim --example explore -- clients=3 ...`.

use picket_sim::small_world::{Bounds, Exploration, explore};

fn explore_clean(bounds: &Bounds) -> Exploration {
    let exploration = explore(bounds);
    assert!(exploration.violation.is_none(), "{:#?}", exploration.violation);
    assert!(exploration.complete, "the bound on states cut the search short: {exploration:?}");
    assert!(exploration.states > 10_000, "a world this size has more states: {exploration:?}");
    assert!(exploration.expiries > 0, "sessions must expire in these worlds: {exploration:?}");
    exploration
}

/// The world explored reaches grants made after a session expired: the stale-holder case.
fn assert_grants_after_expiry(exploration: &Exploration) {
    assert!(exploration.grants_after_expiry > 0, "no grant after an expiry: {exploration:?}");
}

#[test]
fn two_trying_clients_with_keepalives_expiry_and_a_leader_change_never_admit_a_stale_write() {
    assert_grants_after_expiry(&explore_clean(&Bounds::default()));
}

#[test]
fn two_waiting_clients_with_keepalives_expiry_and_a_leader_change_never_admit_a_stale_write() {
    assert_grants_after_expiry(&explore_clean(&Bounds {
        wait_in_queue: true,
        ..Bounds::default()
    }));
}

#[test]
fn two_waiting_clients_under_lock_delay_never_admit_a_stale_write() {
    let exploration = explore_clean(&Bounds {
        time_steps: 3,
        refreshes: 0,
        lock_delay_steps: 1,
        wait_in_queue: true,
        ..Bounds::default()
    });
    assert_grants_after_expiry(&exploration);
}

#[test]
fn two_clients_acquiring_twice_never_admit_a_stale_write() {
    explore_clean(&Bounds {
        acquires_per_client: 2,
        keepalives_per_client: 0,
        refreshes: 0,
        ..Bounds::default()
    });
}

#[test]
fn three_waiting_clients_never_admit_a_stale_write() {
    explore_clean(&Bounds {
        clients: 3,
        keepalives_per_client: 0,
        wait_in_queue: true,
        ..Bounds::default()
    });
}

#[test]
fn a_fence_that_admits_everything_is_caught() {
    let exploration = explore(&Bounds { fence_admits_everything: true, ..Bounds::default() });
    let violation = exploration.violation.expect("the broken fence is caught");
    assert!(violation.property.contains("admitted a write with token"), "{violation:#?}");
    // The shortest schedule: the first holder's write is delivered last, after its release
    // and after the next holder's write.
    let last = violation.trace.last().expect("a trace");
    assert!(last.starts_with("deliver Write"), "{violation:#?}");
    assert!(violation.trace.len() <= 12, "breadth-first finds a shortest trace: {violation:#?}");
}

#[test]
fn a_token_counter_that_starts_again_on_a_leader_change_is_caught() {
    let exploration =
        explore(&Bounds { token_counter_resets_on_refresh: true, ..Bounds::default() });
    let violation = exploration.violation.expect("the resetting counter is caught");
    assert!(violation.property.contains("granted after token"), "{violation:#?}");
    assert!(violation.trace.iter().any(|step| step.contains("leader changes")), "{violation:#?}");
}
