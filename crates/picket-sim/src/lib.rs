//! Picket's race lab: a deterministic, seeded discrete-event simulation of clients, a lock
//! authority, a network and a protected resource, which measures what each locking strategy
//! lets through.
//!
//! The seeds' comparison table (lease + trust, Redlock, ZooKeeper, etcd, fencing tokens) is not
//! asserted here; it is measured. Picket's rows use the real `picket-core` state machine as the
//! authority and the real `picket-fence` rule at the resource.
//!
//! ```
//! use picket_sim::{Scenario, SimConfig, Strategy, simulate};
//!
//! let config = SimConfig { duration_ms: 5_000, ..SimConfig::for_scenario(Scenario::Canonical) };
//! let report = simulate(&config, 2, &[Strategy::LeaseTrust, Strategy::PicketFenceOnAcquire]);
//! println!("{}", report.to_text());
//! assert_eq!(report.rows[1].totals.stale_admitted, 0);
//! ```

mod authority;
mod config;
mod report;
mod rng;
pub mod small_world;
mod world;

pub use config::{Mutations, Scenario, SimConfig, Strategy};
pub use report::{Report, Row, simulate, trace};
pub use rng::Rng;
pub use world::RunStats;
