//! The harness: a 3-node cluster, `picket kv serve` guarding one prefix, and client processes,
//! all real processes of this binary, while a nemesis drawn from a seed injects faults. At the
//! end it reads the store's list and every node's log and checks the whole history.

use super::check::{Summary, Verdict, check};
use super::history::{Event, Op, Phase};
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
}

impl FaultKind {
    /// Every kind, in the order the command line lists them.
    pub const ALL: [Self; 7] = [
        Self::LeaderKillQuick,
        Self::LeaderKillLong,
        Self::FollowerKill,
        Self::ClientPause,
        Self::LeaderPause,
        Self::LeaderClockJump,
        Self::LeaderClockRate,
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
        }
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
    let mut child = command.stdout(Stdio::piped()).spawn().context("cannot start a process")?;
    let stdout = child.stdout.take().context("stdout is piped")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = lines.next().transpose()?.unwrap_or_default();
    let Some(addr) = line
        .split(" listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
    else {
        let _ = child.kill();
        bail!("a process did not start: {line:?}");
    };
    std::thread::spawn(move || for _ in lines {});
    Ok((child, addr))
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
        let mut command = Command::new(exe);
        command.args(&self.args).stderr(log_file(&self.dir.with_extension("log"))?);
        let (child, _) = spawn_listening(command)?;
        self.child = Some(child);
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The cluster, as the nemesis sees it.
struct Cluster {
    exe: PathBuf,
    nodes: Vec<Node>,
}

impl Cluster {
    fn start(exe: &Path, out: &Path, election_timeout: Duration) -> anyhow::Result<Self> {
        let ports = (0..3).map(|_| free_port()).collect::<anyhow::Result<Vec<u16>>>()?;
        let peers = ports
            .iter()
            .enumerate()
            .map(|(index, port)| format!("{}=127.0.0.1:{port}", index + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for (index, port) in ports.iter().enumerate() {
            let id = index as u64 + 1;
            let dir = out.join(format!("node{id}"));
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
            ]
            .iter()
            .map(|arg| (*arg).to_owned())
            .collect();
            let mut node = Node { id, addr, args, dir, child: None, clock, jump_ms: 0 };
            node.set_clock(1.0, 0)?;
            node.start(exe)?;
            nodes.push(node);
        }
        Ok(Self { exe: exe.to_owned(), nodes })
    }

    fn endpoints(&self) -> String {
        self.nodes.iter().map(|node| node.addr.as_str()).collect::<Vec<_>>().join(",")
    }

    /// The index of the node the running nodes agree leads, if any.
    async fn leader(&self) -> Option<usize> {
        let mut named = Vec::new();
        for node in self.nodes.iter().filter(|node| node.child.is_some()) {
            let url = format!("http://{}/v1/cluster", node.addr);
            let reply = crate::http_client::send(hyper::Method::GET, &url, &[], Vec::new()).await;
            let view: serde_json::Value =
                reply.ok().and_then(|reply| serde_json::from_slice(&reply.body).ok())?;
            named.push(view["leader_id"].as_u64()?);
        }
        let leader = *named.first()?;
        let index = usize::try_from(leader).ok()?.checked_sub(1)?;
        let running = self.nodes.get(index).is_some_and(|node| node.child.is_some());
        (running && named.iter().all(|id| *id == leader)).then_some(index)
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

    fn restart(&mut self, index: usize) -> anyhow::Result<()> {
        let exe = self.exe.clone();
        self.nodes[index].start(&exe)
    }
}

/// A client process and the history it reported.
struct ClientProcess {
    child: Child,
    stdin: Option<ChildStdin>,
}

fn start_client(
    exe: &Path,
    endpoints: &str,
    kv_url: &str,
    process: u32,
    plan: &RunPlan,
    history: &Arc<Mutex<Vec<Event>>>,
) -> anyhow::Result<ClientProcess> {
    let mut child = Command::new(exe)
        .args([
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
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_file(&plan.out.join(format!("client{process}.log")))?)
        .spawn()
        .context("cannot start a chaos client")?;
    let stdout = child.stdout.take().context("stdout is piped")?;
    let history = history.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(event) = serde_json::from_str::<Event>(&line) {
                history.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(event);
            }
        }
    });
    let stdin = child.stdin.take();
    Ok(ClientProcess { child, stdin })
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
    let mut cluster = Cluster::start(&exe, &plan.out, plan.election_timeout)?;
    let result = run_started(plan, &exe, &mut cluster).await;
    for node in &mut cluster.nodes {
        node.kill();
    }
    let mut summary = result?;
    check_logs_agree(&cluster, &mut summary);
    Ok(summary)
}

async fn run_started(plan: &RunPlan, exe: &Path, cluster: &mut Cluster) -> anyhow::Result<Summary> {
    cluster
        .wait_for_leader(Duration::from_secs(30))
        .await
        .context("the cluster elected no leader within 30 s")?;
    let endpoints = cluster.endpoints();
    let mut kv_command = Command::new(exe);
    kv_command
        .args(["--endpoints", &endpoints, "kv", "serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(plan.out.join("kv"))
        .args(["--guard", &format!("{PREFIX}={LOCK}")])
        .stderr(log_file(&plan.out.join("kv.log"))?);
    let (mut kv, kv_addr) = spawn_listening(kv_command)?;
    let kv_url = format!("http://{kv_addr}");
    let history = Arc::new(Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    for process in 1..=plan.clients {
        clients.push(start_client(exe, &endpoints, &kv_url, process, plan, &history)?);
    }
    let pids: Vec<u32> = clients.iter().map(|client| client.child.id()).collect();
    let nemesis = run_nemesis(plan, cluster, &pids, &history).await;
    // Wake every client, let it finish its cycle, and stop it.
    for pid in &pids {
        signal(*pid, nix::sys::signal::Signal::SIGCONT);
    }
    for client in &mut clients {
        drop(client.stdin.take());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for client in &mut clients {
        while Instant::now() < deadline && matches!(client.child.try_wait(), Ok(None)) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = client.child.kill();
        let _ = client.child.wait();
    }
    nemesis?;
    for index in 0..cluster.nodes.len() {
        if cluster.nodes[index].child.is_none() {
            cluster.restart(index)?;
        }
    }
    let final_list = read_final_list(&kv_url).await;
    let _ = kv.kill();
    let _ = kv.wait();
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
    cluster: &mut Cluster,
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
    while started.elapsed() < plan.duration {
        tokio::time::sleep(Duration::from_millis(rng.range(gap_ms / 2, gap_ms))).await;
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
                let pick = thinking_client(history).unwrap_or_else(|| {
                    usize::try_from(rng.range(0, clients.len() as u64)).unwrap_or(0)
                });
                let pid = clients[pick];
                let pause_ms = rng.range(ttl_ms / 2, 2 * ttl_ms);
                record(format!("client_pause process={} pause_ms={pause_ms}", pick + 1));
                signal(pid, nix::sys::signal::Signal::SIGSTOP);
                pauses.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    signal(pid, nix::sys::signal::Signal::SIGCONT);
                }));
            }
            kind => {
                // Every other fault is aimed at the leader, or placed relative to it.
                let Some(leader) = cluster.wait_for_leader(Duration::from_secs(20)).await else {
                    record("no_leader_for_20s".into());
                    continue;
                };
                node_fault(kind, leader, cluster, &mut rng, &record, (election_ms, ttl_ms)).await?;
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
        FaultKind::ClientPause => unreachable!("client pauses are not node faults"),
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

/// The index (process - 1) of a client whose last event is a successful read: it holds the lock
/// and is thinking before its write.
fn thinking_client(history: &Arc<Mutex<Vec<Event>>>) -> Option<usize> {
    let history = history.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut last: BTreeMap<u32, &Event> = BTreeMap::new();
    for event in history.iter().rev().take(256) {
        last.entry(event.process).or_insert(event);
    }
    last.values()
        .find(|event| {
            matches!(event.op, Some(Op::Read { .. }))
                && matches!(event.phase, Some(Phase::Ok { .. }))
        })
        .and_then(|event| usize::try_from(event.process).ok()?.checked_sub(1))
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
