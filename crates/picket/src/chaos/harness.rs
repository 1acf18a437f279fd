//! The harness: a 3-node cluster, `picket kv serve` guarding one prefix, and client processes,
//! all real processes of this binary, while a nemesis drawn from a seed injects faults. At the
//! end it reads the store's list and every node's log and checks the whole history.

use super::check::{Summary, Verdict, check};
use super::disk::Disks;
use super::history::{Event, Op, Phase};
use super::network::{Cut, Network};
use anyhow::{Context, bail};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// A node's data disk (a tmpfs of its own) fills up, the leader's half the time: the node
    /// must stop at its next write that needs space (a snapshot, a new log segment) without
    /// acknowledging it; the nemesis then frees the space and starts it again.
    DiskFull,
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
}

impl Mutation {
    /// The name on the command line and in `PICKET_MUTATION`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::FenceAdmitsEverything => "fence_admits_everything",
            Self::TokenCounterResetsOnRestart => "token_counter_resets_on_restart",
        }
    }

    /// The mutation named `name`.
    ///
    /// # Errors
    /// When no mutation has that name.
    pub fn parse(name: &str) -> Result<Self, String> {
        [Self::FenceAdmitsEverything, Self::TokenCounterResetsOnRestart]
            .into_iter()
            .find(|mutation| mutation.name() == name)
            .ok_or_else(|| {
                format!(
                    "unknown mutation {name:?}; choose fence_admits_everything or \
                     token_counter_resets_on_restart"
                )
            })
    }
}

impl FaultKind {
    /// Every kind, in the order the command line lists them.
    pub const ALL: [Self; 15] = [
        Self::LeaderKillQuick,
        Self::LeaderKillLong,
        Self::FollowerKill,
        Self::ClientPause,
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
        Self::DiskFull,
    ];

    /// The name in the history and on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::LeaderKillQuick => "leader_kill_quick",
            Self::LeaderKillLong => "leader_kill_long",
            Self::FollowerKill => "follower_kill",
            Self::ClientPause => "client_pause",
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
            Self::DiskFull => "disk_full",
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

const LOCK: &str = "chaos";
const PREFIX: &str = "chaos/";
const KEY: &str = "chaos/list";

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Spawns `command` and waits for its first standard output line, `... listening on ADDR`;
/// returns the child and ADDR. The rest of its standard output is drained.
fn spawn_listening(mut command: Command) -> anyhow::Result<(Child, String)> {
    // A node recovering a long log takes a while; one that takes longer has hung.
    const START_DEADLINE: Duration = Duration::from_secs(60);
    let mut child = command.stdout(Stdio::piped()).spawn().context("cannot start a process")?;
    let stdout = child.stdout.take().context("stdout is piped")?;
    let (first, first_line) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = first.send(lines.next().and_then(Result::ok).unwrap_or_default());
        for _ in lines {}
    });
    let line = first_line.recv_timeout(START_DEADLINE).unwrap_or_default();
    let Some(addr) = line
        .split(" listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
    else {
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "a process did not start within {} s: its first line was {line:?}",
            START_DEADLINE.as_secs()
        );
    };
    Ok((child, addr))
}

/// A command that runs this binary with `args`, inside the cgroup whose `cgroup.procs` is
/// `procs` when the run cuts links.
fn launch(exe: &Path, procs: Option<&Path>, args: &[String]) -> Command {
    let mut command = Command::new(exe);
    if let Some(procs) = procs {
        command.args(["chaos", "enter", "--procs"]).arg(procs).arg("--");
    }
    command.args(args);
    command
}

/// A child process that is killed when dropped, so that a run that fails half-way leaves
/// nothing running.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn log_file(path: &Path) -> anyhow::Result<Stdio> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    Ok(Stdio::from(file))
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// One `picket serve` node.
struct Node {
    id: u64,
    addr: String,
    port: u16,
    /// The node's cgroup, when the run cuts links.
    procs: Option<PathBuf>,
    /// The deliberate bug the node runs with (through `PICKET_MUTATION`), if any.
    mutation: Option<Mutation>,
    args: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
    /// The script of the node's test clock, and the total jump written to it so far.
    clock: PathBuf,
    jump_ms: i64,
}

impl Node {
    /// Sets the node's clock to run at `rate` with a total jump of `jump_ms`.
    fn set_clock(&mut self, rate: f64, jump_ms: i64) -> anyhow::Result<()> {
        let temporary = self.clock.with_extension("tmp");
        std::fs::write(&temporary, format!("rate={rate} jump_ms={jump_ms}\n"))?;
        std::fs::rename(&temporary, &self.clock)?;
        self.jump_ms = jump_ms;
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn start(&mut self, exe: &Path) -> anyhow::Result<()> {
        let mut command = launch(exe, self.procs.as_deref(), &self.args);
        command.stderr(log_file(&self.dir.with_extension("log"))?);
        if let Some(mutation) = self.mutation {
            command.env("PICKET_MUTATION", mutation.name());
        }
        let (child, _) = spawn_listening(command)?;
        self.child = Some(child);
        Ok(())
    }

    /// How the node's process exited, if it has.
    fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|child| child.try_wait().ok().flatten())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A run that fails half-way leaves no node running.
        self.kill();
    }
}

/// The cluster, as the nemesis sees it.
struct Cluster {
    exe: PathBuf,
    nodes: Vec<Node>,
    /// The run's link cuts, when it has partition faults. Declared after the nodes: dropped
    /// (its rules and cgroups deleted) once they are stopped.
    network: Option<Network>,
    /// The nodes' data disks, when the run fills them; unmounted when dropped.
    disks: Option<Disks>,
    /// Nodes that exited when no fault asked them to: each one a violation.
    unexpected_exits: Vec<String>,
}

impl Cluster {
    fn start(exe: &Path, plan: &RunPlan, mut network: Option<Network>) -> anyhow::Result<Self> {
        let (out, election_timeout) = (&plan.out, plan.election_timeout);
        let mutation =
            plan.mutation.filter(|mutation| *mutation != Mutation::FenceAdmitsEverything);
        let mut disks = plan.faults.contains(&FaultKind::DiskFull).then(Disks::new);
        let ports = (0..3).map(|_| free_port()).collect::<anyhow::Result<Vec<u16>>>()?;
        let peers = ports
            .iter()
            .enumerate()
            .map(|(index, port)| format!("{}=127.0.0.1:{port}", index + 1))
            .collect::<Vec<_>>()
            .join(",");
        // The restart mutation empties only a state restored from a snapshot: snapshot often
        // enough that one exists before the first restart, however slowly a loaded machine
        // runs the clients (a CI run once reached 74 grants and no snapshot, and missed it).
        let snapshot_every =
            if mutation == Some(Mutation::TokenCounterResetsOnRestart) { "20" } else { "200" };
        let mut nodes = Vec::new();
        for (index, port) in ports.iter().enumerate() {
            let id = index as u64 + 1;
            let dir = out.join(format!("node{id}"));
            if let Some(disks) = &mut disks {
                disks.mount(&dir)?;
            }
            let addr = format!("127.0.0.1:{port}");
            let clock = out.join(format!("node{id}.clock"));
            let args: Vec<String> = [
                "serve",
                "--node-id",
                &id.to_string(),
                "--peers",
                &peers,
                "--listen",
                &addr,
                "--data-dir",
                &dir.display().to_string(),
                "--heartbeat-ms",
                "50",
                "--election-timeout-ms",
                &election_timeout.as_millis().to_string(),
                "--test-clock-file",
                &clock.display().to_string(),
                // Snapshots, compaction and snapshot installs happen within a short run.
                "--snapshot-every",
                snapshot_every,
                "--keep-entries",
                "50",
                // Small segments: the log rotates (and needs new space) within a run.
                "--wal-segment-bytes",
                "1048576",
            ]
            .iter()
            .map(|arg| (*arg).to_owned())
            .collect();
            let procs = match &mut network {
                Some(network) => Some(network.member(&node_member(index))?),
                None => None,
            };
            let mut node = Node {
                id,
                addr,
                port: *port,
                procs,
                mutation,
                args,
                dir,
                child: None,
                clock,
                jump_ms: 0,
            };
            node.set_clock(1.0, 0)?;
            node.start(exe)?;
            nodes.push(node);
        }
        Ok(Self { exe: exe.to_owned(), nodes, network, disks, unexpected_exits: Vec::new() })
    }

    /// Cuts `cuts` (replacing any others); returns the packets the previous cuts dropped.
    fn set_cuts(&self, cuts: &[Cut]) -> anyhow::Result<u64> {
        self.network.as_ref().context("this run has no partition faults")?.set_cuts(cuts)
    }

    /// The leader that the nodes at `indices` agree on, if they do.
    async fn leader_among(&self, indices: &[usize]) -> Option<u64> {
        let mut named = Vec::new();
        for node in indices.iter().filter_map(|index| self.nodes.get(*index)) {
            let url = format!("http://{}/v1/cluster", node.addr);
            let reply = crate::http_client::send(hyper::Method::GET, &url, &[], Vec::new()).await;
            let view: serde_json::Value =
                reply.ok().and_then(|reply| serde_json::from_slice(&reply.body).ok())?;
            named.push(view["leader_id"].as_u64()?);
        }
        let leader = *named.first()?;
        named.iter().all(|id| *id == leader).then_some(leader)
    }

    fn endpoints(&self) -> String {
        self.nodes.iter().map(|node| node.addr.as_str()).collect::<Vec<_>>().join(",")
    }

    /// The index of the node the running nodes agree leads, if any.
    async fn leader(&self) -> Option<usize> {
        let running: Vec<usize> =
            (0..self.nodes.len()).filter(|index| self.nodes[*index].child.is_some()).collect();
        let leader = self.leader_among(&running).await?;
        let index = usize::try_from(leader).ok()?.checked_sub(1)?;
        running.contains(&index).then_some(index)
    }

    async fn wait_for_leader(&self, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(leader) = self.leader().await {
                return Some(leader);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Notes every node that exited by itself (a crash: no fault in progress stops a node),
    /// and starts it again so the run goes on.
    fn reap_unexpected_exits(&mut self, record: &impl Fn(String)) -> anyhow::Result<()> {
        for index in 0..self.nodes.len() {
            let node = &mut self.nodes[index];
            let Some(Ok(Some(status))) = node.child.as_mut().map(Child::try_wait) else {
                continue;
            };
            node.child = None;
            let exit = format!("node {} exited by itself ({status}); see its log", node.id);
            record(format!("node_exited node={} status={status}", node.id));
            self.unexpected_exits.push(exit);
            self.restart(index)?;
        }
        Ok(())
    }

    fn restart(&mut self, index: usize) -> anyhow::Result<()> {
        let exe = self.exe.clone();
        self.nodes[index].start(&exe)
    }
}

/// The fenced store (`picket kv serve`), restartable on its port and data.
struct Store {
    exe: PathBuf,
    args: Vec<String>,
    procs: Option<PathBuf>,
    log: PathBuf,
    url: String,
    child: Option<Process>,
}

impl Store {
    fn start(&mut self) -> anyhow::Result<()> {
        let mut command = launch(&self.exe, self.procs.as_deref(), &self.args);
        command.stderr(log_file(&self.log)?);
        let (child, _) = spawn_listening(command)?;
        self.child = Some(Process(child));
        Ok(())
    }
}

/// The cgroup name of the node at `index`.
fn node_member(index: usize) -> String {
    format!("node{}", index + 1)
}

/// The cgroup name of client `process` (from 1).
fn client_member(process: usize) -> String {
    format!("client{process}")
}

/// A client process and the history it reported.
struct ClientProcess {
    child: Process,
    stdin: Option<ChildStdin>,
    /// Reads its standard output into the history; ends when the process has exited.
    reader: std::thread::JoinHandle<()>,
}

fn start_client(
    exe: &Path,
    (endpoints, kv_url): (&str, &str),
    process: u32,
    procs: Option<&Path>,
    plan: &RunPlan,
    history: &Arc<Mutex<Vec<Event>>>,
) -> anyhow::Result<ClientProcess> {
    let args: Vec<String> = [
        "--endpoints",
        endpoints,
        "chaos",
        "client",
        "--process",
        &process.to_string(),
        "--kv",
        kv_url,
        "--ttl-ms",
        &plan.ttl.as_millis().to_string(),
        "--think-ms",
        &plan.think.as_millis().to_string(),
        "--seed",
        &plan.seed.to_string(),
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    let mut child = launch(exe, procs, &args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_file(&plan.out.join(format!("client{process}.log")))?)
        .spawn()
        .context("cannot start a chaos client")?;
    let stdout = child.stdout.take().context("stdout is piped")?;
    let history = history.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(event) = serde_json::from_str::<Event>(&line) {
                history.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(event);
            }
        }
    });
    let stdin = child.stdin.take();
    Ok(ClientProcess { child: Process(child), stdin, reader })
}

/// Runs the plan and returns the checked summary. Everything it started is stopped before it
/// returns, whatever happens.
///
/// # Errors
/// When the processes cannot be started or the store cannot be read at the end.
pub async fn run(plan: &RunPlan) -> anyhow::Result<Summary> {
    std::fs::create_dir_all(&plan.out)
        .with_context(|| format!("cannot create {}", plan.out.display()))?;
    let exe = std::env::current_exe().context("cannot find the picket binary")?;
    let network = if plan.faults.iter().any(|kind| kind.is_partition()) {
        Some(Network::open().context("this run's partition faults cannot be set up")?)
    } else {
        None
    };
    let mut cluster = Cluster::start(&exe, plan, network)?;
    let result = run_started(plan, &exe, &mut cluster).await;
    for node in &mut cluster.nodes {
        node.kill();
    }
    let mut summary = result?;
    check_logs_agree(&cluster, &mut summary);
    if !cluster.unexpected_exits.is_empty() {
        summary.violations.append(&mut cluster.unexpected_exits);
        summary.verdict = Verdict::Invalid;
    }
    Ok(summary)
}

async fn run_started(plan: &RunPlan, exe: &Path, cluster: &mut Cluster) -> anyhow::Result<Summary> {
    cluster
        .wait_for_leader(Duration::from_secs(30))
        .await
        .context("the cluster elected no leader within 30 s")?;
    let endpoints = cluster.endpoints();
    let kv_addr = format!("127.0.0.1:{}", free_port()?);
    let mut kv_args: Vec<String> =
        ["--endpoints", &endpoints, "kv", "serve", "--listen", &kv_addr, "--data-dir"]
            .iter()
            .map(|arg| (*arg).to_owned())
            .chain([plan.out.join("kv").display().to_string()])
            .chain(["--guard".to_owned(), format!("{PREFIX}={LOCK}")])
            .collect();
    if plan.mutation == Some(Mutation::FenceAdmitsEverything) {
        kv_args.push("--no-fence".to_owned());
    }
    let procs = match &mut cluster.network {
        Some(network) => Some(network.member("kv")?),
        None => None,
    };
    let mut store = Store {
        exe: exe.to_owned(),
        args: kv_args,
        procs,
        log: plan.out.join("kv.log"),
        url: format!("http://{kv_addr}"),
        child: None,
    };
    store.start()?;
    let kv_url = store.url.clone();
    let history = Arc::new(Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    for process in 1..=plan.clients {
        let procs = match &mut cluster.network {
            Some(network) => Some(network.member(&client_member(process as usize))?),
            None => None,
        };
        let client =
            start_client(exe, (&endpoints, &kv_url), process, procs.as_deref(), plan, &history)?;
        clients.push(client);
    }
    let pids: Vec<u32> = clients.iter().map(|client| client.child.0.id()).collect();
    let nemesis = run_nemesis(plan, (cluster, &mut store), &pids, &history).await;
    // Wake every client, let it finish its cycle, and stop it.
    for pid in &pids {
        signal(*pid, nix::sys::signal::Signal::SIGCONT);
    }
    for client in &mut clients {
        drop(client.stdin.take());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for client in &mut clients {
        while Instant::now() < deadline && matches!(client.child.0.try_wait(), Ok(None)) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Every event a client printed is in the history once its reader has seen the pipe close.
    for client in clients {
        let ClientProcess { child, reader, .. } = client;
        drop(child);
        let _ = reader.join();
    }
    if cluster.network.is_some() {
        cluster.set_cuts(&[])?;
    }
    nemesis?;
    cluster.reap_unexpected_exits(&|description| {
        history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Event::fault(description));
    })?;
    for index in 0..cluster.nodes.len() {
        if cluster.nodes[index].child.is_none() {
            cluster.restart(index)?;
        }
    }
    if store.child.is_none() {
        store.start()?;
    }
    let final_list = read_final_list(&kv_url).await;
    drop(store);
    let final_list = final_list?;
    let mut events =
        std::mem::take(&mut *history.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    events.sort_by_key(|event| event.at_ns);
    write_history(&plan.out.join("history.jsonl"), &events)?;
    let required: Vec<&str> = plan.faults.iter().map(|kind| kind.name()).collect();
    Ok(check(&events, &final_list, &required))
}

async fn read_final_list(kv_url: &str) -> anyhow::Result<String> {
    let url = format!("{kv_url}/kv/{KEY}");
    let reply = crate::http_client::send(hyper::Method::GET, &url, &[], Vec::new()).await?;
    match reply.status {
        200 => Ok(reply.text()),
        404 => Ok(String::new()),
        status => bail!("the store answered {status} to the final read: {}", reply.text()),
    }
}

fn write_history(path: &Path, events: &[Event]) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?,
    );
    for event in events {
        serde_json::to_writer(&mut out, event)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// Draws faults until the run's time is up. Each fault is over (nodes back, clients woken)
/// before the next begins, except client pauses, which run beside the others.
async fn run_nemesis(
    plan: &RunPlan,
    (cluster, store): (&mut Cluster, &mut Store),
    clients: &[u32],
    history: &Arc<Mutex<Vec<Event>>>,
) -> anyhow::Result<()> {
    let record = |description: String| {
        tracing::info!(fault = %description, "nemesis");
        history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Event::fault(description));
    };
    let mut rng = picket_sim::Rng::new(plan.seed);
    let started = Instant::now();
    let election_ms = u64::try_from(plan.election_timeout.as_millis()).unwrap_or(1_000).max(1);
    let ttl_ms = u64::try_from(plan.ttl.as_millis()).unwrap_or(1_000).max(2);
    let gap_ms = u64::try_from(plan.max_fault_gap.as_millis()).unwrap_or(1_000).max(2);
    let mut pauses: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let mut deck: Vec<FaultKind> = Vec::new();
    // Clients frozen by a client pause, until when: no second fault picks them meanwhile.
    let mut paused: BTreeMap<usize, Instant> = BTreeMap::new();
    while started.elapsed() < plan.duration {
        tokio::time::sleep(Duration::from_millis(rng.range(gap_ms / 2, gap_ms))).await;
        cluster.reap_unexpected_exits(&record)?;
        paused.retain(|_, until| *until > Instant::now());
        if plan.faults.is_empty() {
            continue;
        }
        // Faults are dealt from a shuffled deck of the kinds, so every kind fires once in each
        // round of as many faults as there are kinds, whatever the seed.
        if deck.is_empty() {
            deck = plan.faults.clone();
            for index in (1..deck.len()).rev() {
                let other = usize::try_from(rng.range(0, index as u64 + 1)).unwrap_or(0);
                deck.swap(index, other);
            }
        }
        let Some(kind) = deck.pop() else { continue };
        match kind {
            FaultKind::ClientPause => {
                // The classic race wants the holder frozen after its read and before its write;
                // freeze that client when there is one, any client otherwise.
                let Some(pick) = pick_client(history, &paused, clients.len(), &mut rng) else {
                    record("no_unpaused_client".into());
                    continue;
                };
                let pid = clients[pick];
                let pause_ms = rng.range(ttl_ms / 2, 2 * ttl_ms);
                paused.insert(pick, Instant::now() + Duration::from_millis(pause_ms));
                record(format!("client_pause process={} pause_ms={pause_ms}", pick + 1));
                signal(pid, nix::sys::signal::Signal::SIGSTOP);
                pauses.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    signal(pid, nix::sys::signal::Signal::SIGCONT);
                }));
            }
            FaultKind::StoreRestart => {
                record("store_restart".to_owned());
                store.child = None;
                store.start()?;
            }
            FaultKind::ClusterRestart => {
                let down_ms = rng.range(0, 2 * election_ms);
                record(format!("cluster_restart down_ms={down_ms}"));
                for node in &mut cluster.nodes {
                    node.kill();
                }
                tokio::time::sleep(Duration::from_millis(down_ms)).await;
                for index in 0..cluster.nodes.len() {
                    cluster.restart(index)?;
                }
            }
            FaultKind::ClientIsolate => {
                let Some(pick) = pick_client(history, &paused, clients.len(), &mut rng) else {
                    record("no_unpaused_client".into());
                    continue;
                };
                isolate_client((pick + 1, clients[pick]), cluster, &mut rng, &record, ttl_ms)
                    .await?;
            }
            kind => {
                // Every other fault is aimed at the leader, or placed relative to it.
                let Some(leader) = cluster.wait_for_leader(Duration::from_secs(20)).await else {
                    record("no_leader_for_20s".into());
                    continue;
                };
                let timing = (election_ms, ttl_ms);
                if kind.is_partition() {
                    let partition =
                        partition_fault(kind, leader, cluster, clients.len(), &mut rng, timing);
                    hold_cuts(cluster, partition, &record).await?;
                } else {
                    node_fault(kind, leader, cluster, &mut rng, &record, timing).await?;
                }
            }
        }
    }
    for pause in pauses {
        let _ = pause.await;
    }
    Ok(())
}

/// Injects one fault on a node, `leader` being the index of the current leader.
async fn node_fault(
    kind: FaultKind,
    leader: usize,
    cluster: &mut Cluster,
    rng: &mut picket_sim::Rng,
    record: &impl Fn(String),
    (election_ms, ttl_ms): (u64, u64),
) -> anyhow::Result<()> {
    match kind {
        FaultKind::DiskFull => {
            let step = usize::try_from(rng.range(0, 4)).unwrap_or(0);
            // The leader half the time, else one of the followers.
            let index = if step < 2 { leader } else { (leader + step - 1) % cluster.nodes.len() };
            fill_disk(cluster, index, record).await?;
        }
        FaultKind::LeaderKillQuick | FaultKind::LeaderKillLong | FaultKind::FollowerKill => {
            let (index, down_ms) = match kind {
                FaultKind::LeaderKillQuick => (leader, 0),
                FaultKind::LeaderKillLong => (leader, rng.range(2 * election_ms, 6 * election_ms)),
                _ => {
                    let step = usize::try_from(rng.range(1, 3)).unwrap_or(1);
                    ((leader + step) % cluster.nodes.len(), rng.range(0, 3 * election_ms))
                }
            };
            record(format!("{} node={} down_ms={down_ms}", kind.name(), cluster.nodes[index].id));
            cluster.nodes[index].kill();
            tokio::time::sleep(Duration::from_millis(down_ms)).await;
            cluster.restart(index)?;
        }
        kind if matches!(
            kind,
            FaultKind::ClientPause | FaultKind::StoreRestart | FaultKind::ClusterRestart
        ) || kind.is_partition() =>
        {
            unreachable!("{} is not a fault of one node", kind.name())
        }
        _ => {
            let node = &mut cluster.nodes[leader];
            match kind {
                FaultKind::LeaderPause => {
                    let Some(pid) = node.pid() else { return Ok(()) };
                    let pause_ms = rng.range(election_ms, 4 * election_ms);
                    record(format!("leader_pause node={} pause_ms={pause_ms}", node.id));
                    signal(pid, nix::sys::signal::Signal::SIGSTOP);
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    signal(pid, nix::sys::signal::Signal::SIGCONT);
                }
                FaultKind::LeaderClockJump => {
                    let size_ms = i64::try_from(rng.range(ttl_ms, 3 * ttl_ms)).unwrap_or(0);
                    let jump_ms = if rng.range(0, 2) == 0 { size_ms } else { -size_ms };
                    record(format!("leader_clock_jump node={} jump_ms={jump_ms}", node.id));
                    node.set_clock(1.0, node.jump_ms + jump_ms)?;
                }
                _ => {
                    let rate = [0.5, 1.5, 2.0][usize::try_from(rng.range(0, 3)).unwrap_or(0)];
                    let for_ms = rng.range(ttl_ms, 3 * ttl_ms);
                    record(format!(
                        "leader_clock_rate node={} rate={rate} for_ms={for_ms}",
                        node.id
                    ));
                    node.set_clock(rate, node.jump_ms)?;
                    tokio::time::sleep(Duration::from_millis(for_ms)).await;
                    let node = &mut cluster.nodes[leader];
                    node.set_clock(1.0, node.jump_ms)?;
                }
            }
        }
    }
    Ok(())
}

/// A partition drawn by the nemesis, not yet in place.
struct Partition {
    kind: FaultKind,
    /// Who is cut from what, for the record.
    description: String,
    cuts: Vec<Cut>,
    hold: Duration,
    /// The nodes expected to elect a leader among themselves while the cut holds.
    majority: Option<Vec<usize>>,
}

/// Both directions between nodes `a` and `b`.
fn cut_both_ways(cluster_ports: &[u16], a: usize, b: usize) -> [Cut; 2] {
    [
        Cut { from: node_member(a), to_port: cluster_ports[b] },
        Cut { from: node_member(b), to_port: cluster_ports[a] },
    ]
}

/// Draws the partition of `kind` (a node-level partition) around `leader`.
fn partition_fault(
    kind: FaultKind,
    leader: usize,
    cluster: &Cluster,
    clients: usize,
    rng: &mut picket_sim::Rng,
    (election_ms, ttl_ms): (u64, u64),
) -> Partition {
    let ports: Vec<u16> = cluster.nodes.iter().map(|node| node.port).collect();
    let count = ports.len();
    let pick = |rng: &mut picket_sim::Rng, below: usize| {
        usize::try_from(rng.range(0, below as u64)).unwrap_or(0)
    };
    let alone = pick(rng, count);
    // A follower: the one a one-way cut aims at, or that bridges the leader and the other
    // follower. Only the leader sends between nodes in a quiet cluster, so a cut that does not
    // start at the leader drops nothing (and is recorded as ineffective).
    let follower = (leader + 1 + pick(rng, count - 1)) % count;
    let sides: Vec<bool> = (0..clients).map(|_| rng.range(0, 2) == 0).collect();
    let hold_ms = match kind {
        FaultKind::PartitionLeader => rng.range(3 * election_ms, 8 * election_ms),
        FaultKind::PartitionSplit => rng.range(ttl_ms, 3 * ttl_ms),
        _ => rng.range(2 * election_ms, 6 * election_ms),
    };
    let id = |index: usize| cluster.nodes[index].id;
    let others = |index: usize| (0..count).filter(move |other| *other != index);
    let mut cuts = Vec::new();
    let mut majority = None;
    let description = match kind {
        FaultKind::PartitionLeader => {
            for other in others(leader) {
                cuts.extend(cut_both_ways(&ports, leader, other));
            }
            majority = Some(others(leader).collect());
            format!("partition_leader node={}", id(leader))
        }
        FaultKind::PartitionSplit => {
            for other in others(alone) {
                cuts.extend(cut_both_ways(&ports, alone, other));
            }
            let mut with_alone = Vec::new();
            for (client, beside_alone) in sides.iter().enumerate() {
                let process = client + 1;
                let unreachable: Vec<usize> =
                    if *beside_alone { others(alone).collect() } else { vec![alone] };
                if *beside_alone {
                    with_alone.push(process);
                }
                for node in unreachable {
                    cuts.push(Cut { from: client_member(process), to_port: ports[node] });
                }
            }
            if alone == leader {
                majority = Some(others(alone).collect());
            }
            format!(
                "partition_split alone={} leader={} clients_beside_it={with_alone:?}",
                id(alone),
                id(leader)
            )
        }
        FaultKind::PartitionOneWay => {
            cuts.push(Cut { from: node_member(leader), to_port: ports[follower] });
            format!("partition_one_way from={} to={}", id(leader), id(follower))
        }
        _ => {
            let end = others(leader).find(|other| *other != follower).unwrap_or(follower);
            cuts.extend(cut_both_ways(&ports, leader, end));
            format!(
                "partition_bridge middle={} leader={} other_end={}",
                id(follower),
                id(leader),
                id(end)
            )
        }
    };
    Partition { kind, description, cuts, hold: Duration::from_millis(hold_ms), majority }
}

/// Puts a drawn partition in place, holds it, heals it, and records it as fired only if its
/// rules dropped packets (otherwise as `ineffective_<kind>`, which does not count).
async fn hold_cuts(
    cluster: &Cluster,
    partition: Partition,
    record: &impl Fn(String),
) -> anyhow::Result<()> {
    let hold_ms = partition.hold.as_millis();
    record(format!("cut {} hold_ms={hold_ms}", partition.description));
    cluster.set_cuts(&partition.cuts)?;
    let started = Instant::now();
    let mut new_leader = None;
    if let Some(majority) = &partition.majority {
        while new_leader.is_none() && started.elapsed() < partition.hold {
            new_leader = cluster
                .leader_among(majority)
                .await
                .filter(|leader| majority.iter().any(|index| cluster.nodes[*index].id == *leader));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(partition.hold.saturating_sub(started.elapsed())).await;
    let dropped = cluster.set_cuts(&[])?;
    let failover = match (&partition.majority, new_leader) {
        (None, _) => String::new(),
        (Some(_), Some(leader)) => format!(" majority_elected={leader}"),
        (Some(_), None) => " majority_elected=none".to_owned(),
    };
    let fired = if dropped > 0 { "" } else { "ineffective_" };
    record(format!(
        "{fired}{} hold_ms={hold_ms} dropped_packets={dropped}{failover}",
        partition.description
    ));
    debug_assert!(partition.kind.is_partition());
    Ok(())
}

/// Cuts client `process` (from 1, process id `pid`) off from every node, not from the store,
/// and stalls it (SIGUSR1: its think lasts two TTLs), so that it is still working when its
/// session expires.
async fn isolate_client(
    (process, pid): (usize, u32),
    cluster: &Cluster,
    rng: &mut picket_sim::Rng,
    record: &impl Fn(String),
    ttl_ms: u64,
) -> anyhow::Result<()> {
    let hold_ms = rng.range(ttl_ms + ttl_ms / 2, 2 * ttl_ms);
    signal(pid, nix::sys::signal::Signal::SIGUSR1);
    let partition = Partition {
        kind: FaultKind::ClientIsolate,
        description: format!("client_isolate process={process}"),
        cuts: cluster
            .nodes
            .iter()
            .map(|node| Cut { from: client_member(process), to_port: node.port })
            .collect(),
        hold: Duration::from_millis(hold_ms),
        majority: None,
    };
    hold_cuts(cluster, partition, record).await
}

/// Fills the data disk of the node at `index`, waits (at most 15 s) for the node to stop, frees
/// the space and starts the node again. Recorded as fired only if the node stopped.
async fn fill_disk(
    cluster: &mut Cluster,
    index: usize,
    record: &impl Fn(String),
) -> anyhow::Result<()> {
    const LONGEST_WAIT: Duration = Duration::from_secs(15);
    cluster.disks.as_ref().context("this run did not give the nodes disks of their own")?;
    let node = &mut cluster.nodes[index];
    let id = node.id;
    record(format!("fill node={id}"));
    let filled = Disks::fill(&node.dir)?;
    let started = Instant::now();
    let mut stopped_after = None;
    while started.elapsed() < LONGEST_WAIT {
        if let Some(status) = node.exit_status() {
            stopped_after = Some((started.elapsed(), status));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Disks::free(&node.dir)?;
    match stopped_after {
        // `picket serve` exits with 1 when its Raft core stops; anything else (a panic's 101,
        // a signal) is a crash.
        Some((_, status)) if status.code() != Some(1) => {
            record(format!("node_exited node={id} status={status} (its disk was full)"));
            cluster.unexpected_exits.push(format!(
                "node {id} crashed when its disk filled ({status}) instead of stopping cleanly"
            ));
            cluster.nodes[index].kill();
            cluster.restart(index)?;
        }
        Some((after, _)) => {
            record(format!(
                "disk_full node={id} filled_bytes={filled} stopped_after_ms={}",
                after.as_millis()
            ));
            node.kill();
            cluster.restart(index)?;
        }
        None => record(format!(
            "ineffective_disk_full node={id} filled_bytes={filled} (no write needed space within {} s)",
            LONGEST_WAIT.as_secs()
        )),
    }
    Ok(())
}

/// The index (process - 1) of a client whose last event is a successful read: it holds the lock
/// and is thinking before its write.
fn thinking_client(
    history: &Arc<Mutex<Vec<Event>>>,
    paused: &BTreeMap<usize, Instant>,
) -> Option<usize> {
    let history = history.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut last: BTreeMap<u32, &Event> = BTreeMap::new();
    for event in history.iter().rev().take(256) {
        last.entry(event.process).or_insert(event);
    }
    last.values()
        .filter(|event| {
            matches!(event.op, Some(Op::Read { .. }))
                && matches!(event.phase, Some(Phase::Ok { .. }))
        })
        .filter_map(|event| usize::try_from(event.process).ok()?.checked_sub(1))
        .find(|index| !paused.contains_key(index))
}

/// A client for a client fault: a thinking holder if there is one, else any client; never one
/// that is frozen by a client pause. None when every client is frozen.
fn pick_client(
    history: &Arc<Mutex<Vec<Event>>>,
    paused: &BTreeMap<usize, Instant>,
    clients: usize,
    rng: &mut picket_sim::Rng,
) -> Option<usize> {
    if let Some(thinking) = thinking_client(history, paused) {
        return Some(thinking);
    }
    let free: Vec<usize> = (0..clients).filter(|index| !paused.contains_key(index)).collect();
    let at = usize::try_from(rng.range(0, free.len() as u64)).ok()?;
    free.get(at).copied()
}

/// After the run, with every node stopped: no log id holds different entries on two nodes.
fn check_logs_agree(cluster: &Cluster, summary: &mut Summary) {
    let mut by_id: BTreeMap<(String, u64), Vec<(u64, String)>> = BTreeMap::new();
    for node in &cluster.nodes {
        match picket_server::read_entries(&node.dir) {
            Ok(entries) => {
                for entry in entries {
                    by_id
                        .entry((entry.leader, entry.index))
                        .or_default()
                        .push((node.id, entry.payload));
                }
            }
            Err(error) => {
                summary.violations.push(format!("node {}'s log cannot be read: {error}", node.id))
            }
        }
    }
    for ((leader, index), copies) in &by_id {
        if copies.iter().any(|(_, payload)| *payload != copies[0].1) {
            let nodes: Vec<u64> = copies.iter().map(|(id, _)| *id).collect();
            summary.violations.push(format!(
                "log id {leader} index {index} holds different entries on nodes {nodes:?}"
            ));
        }
    }
    if !summary.violations.is_empty() {
        summary.verdict = Verdict::Invalid;
    }
}
