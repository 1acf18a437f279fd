//! The race lab's results are measured, not asserted: these tests check that the measurements
//! come out as the mechanisms predict, that runs are deterministic, and that the lab notices a
//! broken fence or a resetting token counter (mutation checks).

use picket_sim::{Mutations, Report, Scenario, SimConfig, Strategy, simulate, trace};

const SEEDS: u64 = 6;

fn config(scenario: Scenario) -> SimConfig {
    SimConfig { duration_ms: 30_000, ..SimConfig::for_scenario(scenario) }
}

fn row(report: &Report, strategy: Strategy) -> &picket_sim::Row {
    report.rows.iter().find(|row| row.strategy == strategy).expect("the strategy was simulated")
}

/// The same seeds and options give the same JSON, byte for byte.
#[test]
fn same_seed_same_json() {
    let config = config(Scenario::Partition);
    let first = simulate(&config, 3, &Strategy::ALL).to_json();
    let second = simulate(&config, 3, &Strategy::ALL).to_json();
    assert_eq!(first, second);
    assert_eq!(trace(&config, Strategy::Picket, 2), trace(&config, Strategy::Picket, 2));
    assert_ne!(
        simulate(&config, 4, &Strategy::ALL).to_json(),
        first,
        "more seeds, different totals"
    );
}

/// Under the canonical pauses, trusting the lease and Redlock let stale-holder writes through;
/// fencing strategies do not. Plain fencing still loses updates (the zombie's write lands before
/// the new holder's first write); fence on acquire and verify on advance close that gap.
#[test]
fn canonical_scenario_earns_the_seeds_table() {
    let report = simulate(&config(Scenario::Canonical), SEEDS, &Strategy::ALL);
    for strategy in [Strategy::LeaseTrust, Strategy::Redlock] {
        let row = row(&report, strategy);
        assert!(row.totals.stale_admitted > 0, "{}: {:?}", row.name, row.totals);
        assert_eq!(row.stale_write_blocked.get(..2), Some("no"));
    }
    for strategy in [
        Strategy::Zookeeper,
        Strategy::Etcd,
        Strategy::Picket,
        Strategy::PicketFenceOnAcquire,
        Strategy::PicketVerify,
    ] {
        let row = row(&report, strategy);
        assert_eq!(row.totals.stale_admitted, 0, "{}: {:?}", row.name, row.totals);
        assert_eq!(row.monotonic_token, "yes");
    }
    let plain = row(&report, Strategy::Picket);
    assert!(
        plain.totals.lost_updates > 0,
        "plain fencing shows the lost-update gap: {:?}",
        plain.totals
    );
    for strategy in [Strategy::PicketFenceOnAcquire, Strategy::PicketVerify] {
        let row = row(&report, strategy);
        assert_eq!(row.totals.lost_updates, 0, "{}: {:?}", row.name, row.totals);
        assert_eq!(row.seeds_with_violation, 0, "{}", row.name);
    }
}

/// Recreating the lock restarts ZooKeeper's sequence: its tokens regress. Picket's tokens come
/// from the replicated revision and never do.
#[test]
fn recreate_scenario_breaks_the_zookeeper_counter_but_not_picket() {
    let report = simulate(&config(Scenario::Recreate), SEEDS, &Strategy::ALL);
    let zookeeper = row(&report, Strategy::Zookeeper);
    assert!(zookeeper.totals.token_regressions > 0, "{:?}", zookeeper.totals);
    assert!(zookeeper.seeds_with_violation > 0);
    assert!(zookeeper.monotonic_token.starts_with("no"));
    for strategy in
        [Strategy::Etcd, Strategy::Picket, Strategy::PicketFenceOnAcquire, Strategy::PicketVerify]
    {
        assert_eq!(row(&report, strategy).totals.token_regressions, 0);
    }
}

/// In every scenario, Picket with fence on acquire or verify on advance admits no stale write,
/// loses no update and never regresses a token; a resource that forgets its highest token on
/// restart (the seeds' trap) does let stale writes through.
#[test]
fn picket_holds_in_every_scenario_and_the_in_memory_trap_is_visible() {
    for scenario in Scenario::ALL {
        let report = simulate(&config(scenario), SEEDS, &Strategy::ALL);
        for strategy in [Strategy::Picket, Strategy::PicketFenceOnAcquire, Strategy::PicketVerify] {
            let row = row(&report, strategy);
            assert_eq!(
                row.totals.stale_admitted,
                0,
                "{} in {}: {:?}",
                row.name,
                scenario.name(),
                row.totals
            );
            assert_eq!(row.totals.token_regressions, 0, "{} in {}", row.name, scenario.name());
        }
        for strategy in [Strategy::PicketFenceOnAcquire, Strategy::PicketVerify] {
            let row = row(&report, strategy);
            assert_eq!(
                row.seeds_with_violation,
                0,
                "{} in {}: {:?}",
                row.name,
                scenario.name(),
                row.totals
            );
        }
        if scenario == Scenario::Restart {
            let trap = row(&report, Strategy::PicketVolatileFence);
            assert!(
                trap.totals.stale_admitted > 0 || trap.totals.lost_updates > 0,
                "{:?}",
                trap.totals
            );
        }
    }
}

/// Mutation check: a fence whose comparison admits everything is caught within a few seeds.
#[test]
fn a_fence_that_admits_everything_is_caught() {
    let mut config = config(Scenario::Canonical);
    config.mutations = Mutations { fence_admits_everything: true, ..Mutations::default() };
    let report = simulate(&config, 3, &[Strategy::PicketFenceOnAcquire]);
    let row = &report.rows[0];
    assert!(row.totals.stale_admitted > 0 && row.seeds_with_violation > 0, "{:?}", row.totals);
}

/// Mutation check: a token counter that starts over after a leader failover is caught within a
/// few seeds.
#[test]
fn a_token_counter_that_resets_on_restart_is_caught() {
    let mut config = config(Scenario::Restart);
    config.mutations = Mutations { token_counter_resets_on_restart: true, ..Mutations::default() };
    let report = simulate(&config, 3, &[Strategy::PicketFenceOnAcquire]);
    let row = &report.rows[0];
    assert!(row.totals.token_regressions > 0 && row.seeds_with_violation > 0, "{:?}", row.totals);
}

/// A trace reads like the seeds' worked example: a pause, a new grant with a greater token, and
/// the old holder's write refused.
#[test]
fn a_trace_shows_the_refused_zombie() {
    let config = config(Scenario::Canonical);
    let seed = (0..50)
        .find(|seed| {
            trace(&config, Strategy::PicketFenceOnAcquire, *seed)
                .iter()
                .any(|line| line.contains("REFUSES"))
        })
        .expect("some seed shows a refusal");
    let lines = trace(&config, Strategy::PicketFenceOnAcquire, seed);
    let refusal = lines.iter().position(|line| line.contains("REFUSES")).unwrap();
    assert!(
        lines[..refusal].iter().any(|line| line.contains("pauses for")),
        "a pause precedes the refusal"
    );
    assert!(lines[refusal].contains("highest seen is"), "{}", lines[refusal]);
}
