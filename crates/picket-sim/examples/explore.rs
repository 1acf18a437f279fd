//! Explores a small world with the bounds given as `name=value` arguments, e.g.
//! `cargo run --release -p picket-sim --example explore -- clients=2 acquires=2 keepalives=1`.
//! Names: clients, acquires, keepalives, steps, refreshes, lock_delay, max_states, wait=1 for
//! acquires that wait in the queue, and broken_fence=1 or resetting_tokens=1 for the deliberate
//! bugs.

use picket_sim::small_world::{Bounds, explore};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut bounds = Bounds::default();
    for argument in std::env::args().skip(1) {
        let Some((name, value)) = argument.split_once('=') else {
            eprintln!("arguments are name=value, e.g. clients=2; got {argument:?}");
            return ExitCode::FAILURE;
        };
        let Ok(number) = value.parse::<usize>() else {
            eprintln!("{name} takes a number; got {value:?}");
            return ExitCode::FAILURE;
        };
        let small = u8::try_from(number).unwrap_or(u8::MAX);
        match name {
            "clients" => bounds.clients = small.clamp(1, 3),
            "acquires" => bounds.acquires_per_client = small,
            "keepalives" => bounds.keepalives_per_client = small,
            "steps" => bounds.time_steps = small,
            "refreshes" => bounds.refreshes = small,
            "lock_delay" => bounds.lock_delay_steps = small,
            "max_states" => bounds.max_states = number,
            "wait" => bounds.wait_in_queue = number != 0,
            "broken_fence" => bounds.fence_admits_everything = number != 0,
            "resetting_tokens" => bounds.token_counter_resets_on_refresh = number != 0,
            _ => {
                eprintln!("unknown bound {name:?}");
                return ExitCode::FAILURE;
            }
        }
    }
    #[expect(
        clippy::disallowed_methods,
        reason = "the example times the search; the search itself reads no clock"
    )]
    let started = std::time::Instant::now();
    let exploration = explore(&bounds);
    println!("{bounds:?}");
    println!(
        "{} states, {} transitions ({} with an expiry, {} granting after one), depth {}, {} in {:.1?}",
        exploration.states,
        exploration.transitions,
        exploration.expiries,
        exploration.grants_after_expiry,
        exploration.depth,
        if exploration.complete { "complete" } else { "cut short by max_states" },
        started.elapsed()
    );
    match exploration.violation {
        None => {
            println!("no violation");
            ExitCode::SUCCESS
        }
        Some(violation) => {
            println!("VIOLATION: {}", violation.property);
            for (step, action) in violation.trace.iter().enumerate() {
                println!("{:>3}. {action}", step + 1);
            }
            ExitCode::FAILURE
        }
    }
}
