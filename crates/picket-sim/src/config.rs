//! What to simulate: the strategies (one row each), the named scenarios, and the knobs.

use serde::{Deserialize, Serialize};

/// A locking strategy: how grants are made and what the resource checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// A lease from a lock service; the client checks its own deadline, then writes. The
    /// resource checks nothing.
    LeaseTrust,
    /// Redlock: a random value set on a majority of independent nodes with a TTL and a drift
    /// allowance; the client checks the validity left, then writes. Nothing to order at the
    /// resource.
    Redlock,
    /// ZooKeeper recipe: the waiter node's sequence number is the token; the resource compares
    /// it. The sequence restarts when the lock's parent node is deleted and recreated (Curator
    /// container nodes).
    Zookeeper,
    /// etcd: the lock key's revision is the token; the resource compares it.
    Etcd,
    /// Picket: the real `picket-core` state machine grants; the real `picket-fence` rule
    /// decides at the resource. No fence on acquire, no verification.
    Picket,
    /// Picket, and the new holder registers its token with the resource before it reads.
    PicketFenceOnAcquire,
    /// Picket, and the resource asks the lock service about a token newer than any it has seen.
    PicketVerify,
    /// Picket with fence on acquire, but the resource keeps its highest token in memory only:
    /// the seeds' reset-on-restart trap.
    PicketVolatileFence,
}

impl Strategy {
    /// Every strategy, in table order.
    pub const ALL: [Self; 8] = [
        Self::LeaseTrust,
        Self::Redlock,
        Self::Zookeeper,
        Self::Etcd,
        Self::Picket,
        Self::PicketFenceOnAcquire,
        Self::PicketVerify,
        Self::PicketVolatileFence,
    ];

    /// The row's name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::LeaseTrust => "lease + trust the client",
            Self::Redlock => "Redlock (5 nodes)",
            Self::Zookeeper => "ZooKeeper seq node as token",
            Self::Etcd => "etcd revision as token",
            Self::Picket => "Picket fence",
            Self::PicketFenceOnAcquire => "Picket fence + fence on acquire",
            Self::PicketVerify => "Picket fence + verify on advance",
            Self::PicketVolatileFence => "Picket fence, in-memory highest",
        }
    }

    /// Whether grants carry a token the resource can compare.
    #[must_use]
    pub fn has_token(self) -> bool {
        !matches!(self, Self::LeaseTrust | Self::Redlock)
    }

    /// Whether the resource checks tokens at all.
    #[must_use]
    pub fn resource_checks(self) -> bool {
        self.has_token()
    }

    /// Whether the new holder registers its token before reading.
    #[must_use]
    pub fn fence_on_acquire(self) -> bool {
        matches!(self, Self::PicketFenceOnAcquire | Self::PicketVolatileFence)
    }

    /// Whether the authority is the real Picket state machine.
    #[must_use]
    pub fn is_picket(self) -> bool {
        matches!(
            self,
            Self::Picket
                | Self::PicketFenceOnAcquire
                | Self::PicketVerify
                | Self::PicketVolatileFence
        )
    }
}

/// A named set of faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// The seeds' race: clients pause (GC) after their last check and before their write.
    Canonical,
    /// Partitions cut clients off from the lock service for seconds at a time.
    Partition,
    /// Clocks step and drift, on clients and on lock-service nodes; a few pauses.
    Clock,
    /// The lock is deleted and recreated between grants; a few pauses.
    Recreate,
    /// The resource and the lock service's leader restart; a few pauses.
    Restart,
}

impl Scenario {
    /// Every scenario.
    pub const ALL: [Self; 5] =
        [Self::Canonical, Self::Partition, Self::Clock, Self::Recreate, Self::Restart];

    /// The scenario's name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Canonical => "canonical",
            Self::Partition => "partition",
            Self::Clock => "clock",
            Self::Recreate => "recreate",
            Self::Restart => "restart",
        }
    }

    /// Parses a scenario name.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|scenario| scenario.name() == name)
    }
}

/// Deliberate bugs, so tests can show the simulation catches them (mutation checks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mutations {
    /// The resource's fence admits every write.
    pub fence_admits_everything: bool,
    /// The lock service's token counter starts from zero again after a leader failover.
    pub token_counter_resets_on_restart: bool,
}

/// Every knob of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// The scenario.
    pub scenario: Scenario,
    /// Simulated length of one run, in milliseconds.
    pub duration_ms: u64,
    /// Clients doing read-modify-write cycles.
    pub clients: usize,
    /// Lease / session TTL.
    pub ttl_ms: u64,
    /// Safety margin the client keeps before its deadline.
    pub client_margin_ms: u64,
    /// Mean one-way network delay.
    pub mean_delay_ms: f64,
    /// Probability a cycle pauses after its last check and before its write.
    pub pause_rate: f64,
    /// Mean pause length.
    pub mean_pause_ms: f64,
    /// Deliberate bugs.
    pub mutations: Mutations,
}

impl SimConfig {
    /// The defaults of a scenario: 3 clients, 2 s TTL with a 200 ms margin, 5 ms mean delay.
    #[must_use]
    pub fn for_scenario(scenario: Scenario) -> Self {
        let pause_rate = match scenario {
            Scenario::Canonical => 0.15,
            _ => 0.03,
        };
        Self {
            scenario,
            duration_ms: 60_000,
            clients: 3,
            ttl_ms: 2_000,
            client_margin_ms: 200,
            mean_delay_ms: 5.0,
            pause_rate,
            mean_pause_ms: 3_000.0,
            mutations: Mutations::default(),
        }
    }
}
