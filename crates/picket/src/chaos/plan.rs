//! What a run does: the faults its nemesis may deal, the deliberate bug it may switch on, and
//! its size and length.

use std::path::PathBuf;
use std::time::Duration;

/// A kind of fault the nemesis injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// `kill -9` the leader and restart it at once, inside the election timeout.
    LeaderKillQuick,
    /// `kill -9` the leader and keep it down for several election timeouts: a real failover.
    LeaderKillLong,
    /// `kill -9` a follower and restart it after up to three election timeouts.
    FollowerKill,
    /// SIGSTOP a client for half to twice its session TTL, then SIGCONT: its session expires
    /// and it wakes up writing with a superseded token.
    ClientPause,
    /// Waits (up to ten seconds) for a client holding the lock between its read and its write,
    /// and SIGSTOPs it for one and a half to three session TTLs: its session surely expires,
    /// the lock moves on, and it wakes up writing with a superseded token. Where
    /// [`FaultKind::ClientPause`] takes its chances, this one makes the stale write happen.
    HolderPause,
    /// Waits for a holder between its read and its write as [`FaultKind::HolderPause`] does,
    /// SIGSTOPs it, kills the leader for two to six election timeouts, restarts it, and wakes
    /// the holder two election timeouts after a leader is back: the holder's pause spans a
    /// failover, which must not cost it its session while its lease runs (a new leader gives
    /// every session a full TTL).
    HolderPauseFailover,
    /// SIGSTOP the leader for one to four election timeouts, then SIGCONT: it wakes up deposed
    /// or, if it was quick, still leading after a gap in its clock.
    LeaderPause,
    /// The leader's clock (the lock state's time, through `--test-clock-file`) jumps forward or
    /// back by one to three session TTLs.
    LeaderClockJump,
    /// The leader's clock runs at 0.5, 1.5 or 2 times real time for one to three session TTLs.
    LeaderClockRate,
    /// The leader is cut off from both followers, both ways, for three to eight election
    /// timeouts; clients can still reach it. The majority elects a new leader while the old one
    /// still believes it leads.
    PartitionLeader,
    /// One node (any) against the other two, both ways, for one to three session TTLs; each
    /// client lands on one side at random and cannot reach the nodes of the other.
    PartitionSplit,
    /// The leader cannot send to one follower (its connections there go dead); the follower
    /// can still send to the leader. Two to six election timeouts.
    PartitionOneWay,
    /// The leader and one follower cannot reach each other; the other follower reaches both.
    /// Two to six election timeouts.
    PartitionBridge,
    /// A client (a holder between its read and its write, when there is one) is cut off from
    /// every node, not from the store, for one to three session TTLs: its session expires, the
    /// lock moves on, and it wakes up writing with a superseded token.
    ClientIsolate,
    /// `kill -9` every node at once and restart them all after up to two election timeouts.
    ClusterRestart,
    /// `kill -9` the fenced store and restart it at once on the same data and port: what it
    /// acknowledged must survive, and its fence must remember every token it admitted.
    StoreRestart,
    /// `kill -9` one node (the leader half the time) and erase what it wrote to its Raft log but
    /// had not synced, as a power cut would lose it (`kill -9` alone keeps the page cache); the
    /// node restarts after up to three election timeouts. Needs a build with the test storage
    /// faults (`picket-server`'s `mutations` feature, which the tests compile).
    PowerLoss,
    /// The same on every node at once, restarted after up to two election timeouts.
    ClusterPowerLoss,
    /// A node's data disk (a tmpfs of its own) fills up, the leader's half the time: the node
    /// must stop at its next write that needs space (a snapshot, a new log segment) without
    /// acknowledging it; the nemesis then frees the space and starts it again.
    DiskFull,
    /// A node's log syncs fail (`EIO`), the leader's half the time: the node must stop without
    /// acknowledging what it could not sync; the nemesis then erases what its last good sync
    /// did not cover (after a failed `fsync` the kernel may have dropped those pages) and
    /// starts it again. Needs a build with the test storage faults, as the power losses do.
    SyncFailure,
    /// Peers' connections to some nodes get slow: every byte on them, both ways, arrives a
    /// quarter of an election timeout to two election timeouts late (a latency, not a loss),
    /// for two to six election timeouts: connections to both the leader's followers (three
    /// times in four: its replication, heartbeats and clock readings slow down), or to one of
    /// them. (Connections to the leader carry nothing in a quiet cluster, as a cut there would
    /// drop nothing.) See `delay.rs`.
    LinkDelay,
    /// Clients' connections to the leader get slow: every byte both ways arrives a quarter of
    /// an election timeout to a third of a session TTL late, for one to two TTLs: acquires,
    /// keepalives and their answers all lag (a keepalive answered late must not make its
    /// client count on more than the server promised). Clients then reach every node through
    /// a proxy (the nodes advertise it as their client address); only runs that draw this
    /// fault have them.
    ClientLinkDelay,
    /// A member is replaced, as a lost host is: the leader half the time, else a follower;
    /// removed while it runs, or killed first and removed by the others (half the time each);
    /// then a new node under a new id, with an empty data directory, starts at its ports with
    /// `--join` and is added. Each step (the removal, the add, the new voters on every node)
    /// must finish within 90 s; the removed node's log is compared with the others' at the end.
    MemberReplace,
}

/// A deliberate bug, to show that the checker catches it (`--mutation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// The store runs with `--no-fence` (its benchmark switch): it admits every write.
    FenceAdmitsEverything,
    /// Each node restores its lock state empty on restart, keeping its log position: the
    /// revision, and with it the token counter, starts again near zero. Only a binary built
    /// with `picket-server`'s `mutations` feature (tests only) has this bug to switch on.
    TokenCounterResetsOnRestart,
    /// Each node's log acknowledges a write before it syncs it, and syncs at most once a
    /// second (as Redis's `appendfsync everysec` does): only a power loss shows it (tests only,
    /// as above).
    WalAcknowledgesBeforeSync,
    /// A new leader writes a plain tick where its `Refresh` belongs: it expires sessions by its
    /// own clock (which started with its process) against deadlines set by the previous
    /// leader's, so sessions whose keepalives were confirmed expire early (tests only, as
    /// above).
    LeaderExpiresWithoutRefresh,
}

impl Mutation {
    /// The name on the command line and in `PICKET_MUTATION`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::FenceAdmitsEverything => "fence_admits_everything",
            Self::TokenCounterResetsOnRestart => "token_counter_resets_on_restart",
            Self::WalAcknowledgesBeforeSync => "wal_acknowledges_before_sync",
            Self::LeaderExpiresWithoutRefresh => "leader_expires_without_refresh",
        }
    }

    /// The mutation named `name`.
    ///
    /// # Errors
    /// When no mutation has that name.
    pub fn parse(name: &str) -> Result<Self, String> {
        let all = [
            Self::FenceAdmitsEverything,
            Self::TokenCounterResetsOnRestart,
            Self::WalAcknowledgesBeforeSync,
            Self::LeaderExpiresWithoutRefresh,
        ];
        all.into_iter().find(|mutation| mutation.name() == name).ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|mutation| mutation.name()).collect();
            format!("unknown mutation {name:?}; choose from {}", names.join(", "))
        })
    }
}

impl FaultKind {
    /// Every kind, in the order the command line lists them.
    pub const ALL: [Self; 23] = [
        Self::LeaderKillQuick,
        Self::LeaderKillLong,
        Self::FollowerKill,
        Self::ClientPause,
        Self::HolderPause,
        Self::HolderPauseFailover,
        Self::LeaderPause,
        Self::LeaderClockJump,
        Self::LeaderClockRate,
        Self::PartitionLeader,
        Self::PartitionSplit,
        Self::PartitionOneWay,
        Self::PartitionBridge,
        Self::ClientIsolate,
        Self::ClusterRestart,
        Self::StoreRestart,
        Self::PowerLoss,
        Self::ClusterPowerLoss,
        Self::DiskFull,
        Self::SyncFailure,
        Self::LinkDelay,
        Self::ClientLinkDelay,
        Self::MemberReplace,
    ];

    /// The name in the history and on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::LeaderKillQuick => "leader_kill_quick",
            Self::LeaderKillLong => "leader_kill_long",
            Self::FollowerKill => "follower_kill",
            Self::ClientPause => "client_pause",
            Self::HolderPause => "holder_pause",
            Self::HolderPauseFailover => "holder_pause_failover",
            Self::LeaderPause => "leader_pause",
            Self::LeaderClockJump => "leader_clock_jump",
            Self::LeaderClockRate => "leader_clock_rate",
            Self::PartitionLeader => "partition_leader",
            Self::PartitionSplit => "partition_split",
            Self::PartitionOneWay => "partition_one_way",
            Self::PartitionBridge => "partition_bridge",
            Self::ClientIsolate => "client_isolate",
            Self::ClusterRestart => "cluster_restart",
            Self::StoreRestart => "store_restart",
            Self::PowerLoss => "power_loss",
            Self::ClusterPowerLoss => "cluster_power_loss",
            Self::DiskFull => "disk_full",
            Self::SyncFailure => "fsync_failure",
            Self::LinkDelay => "link_delay",
            Self::ClientLinkDelay => "client_link_delay",
            Self::MemberReplace => "member_replace",
        }
    }

    /// Whether this fault cuts network links (and so needs [`Network`]).
    #[must_use]
    pub fn is_partition(self) -> bool {
        matches!(
            self,
            Self::PartitionLeader
                | Self::PartitionSplit
                | Self::PartitionOneWay
                | Self::PartitionBridge
                | Self::ClientIsolate
        )
    }

    /// The kind named `name`.
    ///
    /// # Errors
    /// When no kind has that name.
    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|kind| kind.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|kind| kind.name()).collect();
            format!("unknown fault {name:?}; choose from {}", names.join(", "))
        })
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RunPlan {
    /// How long the clients work under faults.
    pub duration: Duration,
    /// Seed of the fault schedule and of the clients' think times.
    pub seed: u64,
    /// Client processes.
    pub clients: u32,
    /// Where the nodes, the store, the logs, the history and the summary go.
    pub out: PathBuf,
    /// The nodes' shortest election timeout.
    pub election_timeout: Duration,
    /// The clients' session TTL.
    pub ttl: Duration,
    /// The clients' longest think time between read and write.
    pub think: Duration,
    /// Faults the nemesis draws from; each must fire for the run to be `valid`.
    pub faults: Vec<FaultKind>,
    /// Longest gap between two faults.
    pub max_fault_gap: Duration,
    /// A deliberate bug to switch on, for the mutation tests.
    pub mutation: Option<Mutation>,
}
