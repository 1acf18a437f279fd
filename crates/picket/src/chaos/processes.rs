//! The processes of a run, all of this binary: the nodes of the cluster (each with its clock
//! file and data disk), the store, and the client processes; started, killed and restarted.

use super::disk::Disks;
use super::history::Event;
use super::network::{Cut, Network};
use super::plan::{FaultKind, Mutation, RunPlan};
use anyhow::{Context, bail};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(super) const LOCK: &str = "chaos";

pub(super) const PREFIX: &str = "chaos/";

pub(super) const KEY: &str = "chaos/list";

/// A loopback port for a node or store that is killed and restarted on it: one outside the
/// kernel's ephemeral range, so no outgoing connection takes it while its owner is down.
pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(picket_testkit::try_free_ports_in_a_row(1)?)
}

/// Spawns `command` and waits for its first standard output line, `... listening on ADDR`;
/// returns the child and ADDR. The rest of its standard output is drained.
pub(super) fn spawn_listening(mut command: Command) -> anyhow::Result<(Child, String)> {
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
    if let Ok(Some(status)) = child.try_wait() {
        bail!("the process exited ({status}) before it was listening");
    }
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
pub(super) fn launch(exe: &Path, procs: Option<&Path>, args: &[String]) -> Command {
    let mut command = Command::new(exe);
    if let Some(procs) = procs {
        command.args(["chaos", "enter", "--procs"]).arg(procs).arg("--");
    }
    command.args(args);
    command
}

/// A child process that is killed when dropped, so that a run that fails half-way leaves
/// nothing running.
pub(super) struct Process(pub(super) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(super) fn log_file(path: &Path) -> anyhow::Result<Stdio> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    Ok(Stdio::from(file))
}

pub(super) fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// One `picket serve` node.
pub(super) struct Node {
    pub(super) id: u64,
    pub(super) addr: String,
    /// The client port: clients reach the node here.
    pub(super) port: u16,
    /// The port of the delaying proxy in front of the node's peer port: peers reach the node
    /// here (see [`super::delay`]).
    pub(super) peer_proxy_port: u16,
    /// The delay the proxy holds peers' traffic to this node for.
    pub(super) delay: std::sync::Arc<super::delay::Delay>,
    /// The delaying proxy in front of the client port, when the run delays client links: its
    /// port (clients reach the node there) and its delay.
    pub(super) client_proxy: Option<(u16, std::sync::Arc<super::delay::Delay>)>,
    /// The node's cgroup, when the run cuts links.
    pub(super) procs: Option<PathBuf>,
    /// The deliberate bug the node runs with (through `PICKET_MUTATION`), if any.
    pub(super) mutation: Option<Mutation>,
    pub(super) args: Vec<String>,
    pub(super) dir: PathBuf,
    pub(super) child: Option<Child>,
    /// The script of the node's test clock, the rate and total jump the faults gave it so
    /// far, and where its current process's clock counts from.
    pub(super) clock: PathBuf,
    pub(super) rate: f64,
    pub(super) jump_ms: i64,
    pub(super) origin_ms: i64,
    /// While a file exists here, the node's log syncs fail (test builds only).
    pub(super) fail_sync: PathBuf,
}

/// The origin the next node start's clock counts from.
static NEXT_CLOCK_ORIGIN_MS: AtomicI64 = AtomicI64::new(0);

/// Each start of a node counts its clock from an origin an hour past every origin before it.
/// The origin is arbitrary, as in a real cluster where each process counts from its own start:
/// a node's readings mean nothing to another node, nor to itself across a restart. A leader
/// that trusted deadlines set by another leader's clock, instead of giving every session a
/// full TTL on its own (`Refresh`), would expire sessions at once whenever leadership moves to
/// a node started more recently.
fn next_clock_origin_ms() -> i64 {
    NEXT_CLOCK_ORIGIN_MS.fetch_add(3_600_000, Ordering::Relaxed)
}

impl Node {
    /// The port clients reach this node at: its client proxy's, when it has one.
    pub(super) fn client_port(&self) -> u16 {
        self.client_proxy.as_ref().map_or(self.port, |(port, _)| *port)
    }

    /// Sets the node's clock to run at `rate` with a total jump of `jump_ms` (beside its
    /// origin).
    pub(super) fn set_clock(&mut self, rate: f64, jump_ms: i64) -> anyhow::Result<()> {
        let temporary = self.clock.with_extension("tmp");
        let script_jump_ms = jump_ms.saturating_add(self.origin_ms);
        std::fs::write(&temporary, format!("rate={rate} jump_ms={script_jump_ms}\n"))?;
        std::fs::rename(&temporary, &self.clock)?;
        self.rate = rate;
        self.jump_ms = jump_ms;
        Ok(())
    }

    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(super) fn start(&mut self, exe: &Path) -> anyhow::Result<()> {
        self.origin_ms = next_clock_origin_ms();
        self.set_clock(self.rate, self.jump_ms)?;
        let mut command = launch(exe, self.procs.as_deref(), &self.args);
        command.stderr(log_file(&self.dir.with_extension("log"))?);
        if let Some(mutation) = self.mutation {
            command.env("PICKET_MUTATION", mutation.name());
        }
        // Every node notes how far its log is synced, so that a power loss can erase the rest
        // (a build without the test storage faults ignores it).
        command.env("PICKET_TEST_SYNCED_MARK", "1");
        command.env("PICKET_TEST_FAIL_SYNC", &self.fail_sync);
        let (child, _) = spawn_listening(command)?;
        self.child = Some(child);
        Ok(())
    }

    /// How the node's process exited, if it has.
    pub(super) fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|child| child.try_wait().ok().flatten())
    }

    /// Waits up to `longest` for the node's process to exit by itself; returns how long it
    /// took and how it exited, if it did.
    pub(super) async fn wait_for_exit(
        &mut self,
        longest: Duration,
    ) -> Option<(Duration, std::process::ExitStatus)> {
        let started = Instant::now();
        while started.elapsed() < longest {
            if let Some(status) = self.exit_status() {
                return Some((started.elapsed(), status));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    pub(super) fn kill(&mut self) {
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
pub(super) struct Cluster {
    pub(super) exe: PathBuf,
    pub(super) nodes: Vec<Node>,
    /// The run's link cuts, when it has partition faults. Declared after the nodes: dropped
    /// (its rules and cgroups deleted) once they are stopped.
    pub(super) network: Option<Network>,
    /// The nodes' data disks, when the run fills them; unmounted when dropped.
    pub(super) disks: Option<Disks>,
    /// What went wrong with the nodes beyond what a fault asked of them (a node that exited
    /// by itself, crashed, or could not be replaced): each one a violation.
    pub(super) unexpected_exits: Vec<String>,
    /// Nodes replaced by new ones (`member_replace`): their ids and data directories, whose
    /// logs are compared with the others' at the end.
    pub(super) retired: Vec<(u64, PathBuf)>,
}

impl Cluster {
    pub(super) fn start(
        exe: &Path,
        plan: &RunPlan,
        mut network: Option<Network>,
    ) -> anyhow::Result<Self> {
        let (out, election_timeout) = (&plan.out, plan.election_timeout);
        let mutation =
            plan.mutation.filter(|mutation| *mutation != Mutation::FenceAdmitsEverything);
        let mut disks = plan.faults.contains(&FaultKind::DiskFull).then(Disks::new);
        let ports = (0..3).map(|_| free_port()).collect::<anyhow::Result<Vec<u16>>>()?;
        // Peers reach each node through a proxy that can delay them (see `delay.rs`).
        let mut peer_ports = Vec::new();
        let mut proxies = Vec::new();
        for _ in 0..3 {
            let peer_port = free_port()?;
            peer_ports.push(peer_port);
            proxies.push(super::delay::start_proxy(([127, 0, 0, 1], peer_port).into())?);
        }
        // Clients reach each node through a proxy of its own too, when the run delays their
        // links: the node advertises it as its client address, so leader hints lead there.
        let mut client_proxies = Vec::new();
        for port in &ports {
            client_proxies.push(if plan.faults.contains(&FaultKind::ClientLinkDelay) {
                Some(super::delay::start_proxy(([127, 0, 0, 1], *port).into())?)
            } else {
                None
            });
        }
        let client_ports: Vec<u16> = ports
            .iter()
            .zip(&client_proxies)
            .map(|(port, proxy)| proxy.as_ref().map_or(*port, |(proxy_port, _)| *proxy_port))
            .collect();
        let peers = client_ports
            .iter()
            .zip(&proxies)
            .enumerate()
            .map(|(index, (port, (proxy_port, _)))| {
                format!("{}=127.0.0.1:{port}/127.0.0.1:{proxy_port}", index + 1)
            })
            .collect::<Vec<_>>()
            .join(",");
        // The restart mutation empties only a state restored from a snapshot: snapshot often
        // enough that one exists before the first restart, however slowly a loaded machine
        // runs the clients (a CI run once reached 74 grants and no snapshot, and missed it).
        let snapshot_every =
            if mutation == Some(Mutation::TokenCounterResetsOnRestart) { "20" } else { "200" };
        let mut nodes = Vec::new();
        let proxied = proxies.into_iter().zip(client_proxies);
        for (index, (port, ((peer_proxy_port, delay), client_proxy))) in
            ports.iter().zip(proxied).enumerate()
        {
            let id = index as u64 + 1;
            let dir = out.join(format!("node{id}"));
            if let Some(disks) = &mut disks {
                disks.mount(&dir)?;
            }
            let addr = format!("127.0.0.1:{port}");
            let clock = out.join(format!("node{id}.clock"));
            let advertise = format!("127.0.0.1:{}", client_ports[index]);
            let args: Vec<String> = [
                "serve",
                "--node-id",
                &id.to_string(),
                "--advertise",
                &advertise,
                "--peers",
                &peers,
                "--listen",
                &addr,
                "--peer-listen",
                &format!("127.0.0.1:{}", peer_ports[index]),
                "--peer-advertise",
                &format!("127.0.0.1:{peer_proxy_port}"),
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
                peer_proxy_port,
                delay,
                client_proxy,
                procs,
                mutation,
                args,
                dir,
                child: None,
                clock,
                rate: 1.0,
                jump_ms: 0,
                origin_ms: 0,
                fail_sync: out.join(format!("node{id}.fail-sync")),
            };
            node.start(exe).with_context(|| {
                format!(
                    "node {id} did not start; its log ends: {}",
                    log_tail(&node.dir.with_extension("log"))
                )
            })?;
            nodes.push(node);
        }
        let unexpected_exits = Vec::new();
        Ok(Self {
            exe: exe.to_owned(),
            nodes,
            network,
            disks,
            unexpected_exits,
            retired: Vec::new(),
        })
    }

    /// Cuts `cuts` (replacing any others); returns the packets the previous cuts dropped.
    pub(super) fn set_cuts(&self, cuts: &[Cut]) -> anyhow::Result<u64> {
        self.network.as_ref().context("this run has no partition faults")?.set_cuts(cuts)
    }

    /// The leader that the nodes at `indices` agree on, if they do.
    pub(super) async fn leader_among(&self, indices: &[usize]) -> Option<u64> {
        let mut named = Vec::new();
        for node in indices.iter().filter_map(|index| self.nodes.get(*index)) {
            let url = format!("http://{}/v1/cluster", node.addr);
            let reply = picket_proto::http1::send(hyper::Method::GET, &url, &[], Vec::new()).await;
            let view: serde_json::Value =
                reply.ok().and_then(|reply| serde_json::from_slice(&reply.body).ok())?;
            named.push(view["leader_id"].as_u64()?);
        }
        let leader = *named.first()?;
        named.iter().all(|id| *id == leader).then_some(leader)
    }

    /// Where clients reach the nodes (through the client proxies, when there are any).
    pub(super) fn endpoints(&self) -> String {
        let endpoints: Vec<String> =
            self.nodes.iter().map(|node| format!("127.0.0.1:{}", node.client_port())).collect();
        endpoints.join(",")
    }

    /// The index of the node the running nodes agree leads, if any.
    pub(super) async fn leader(&self) -> Option<usize> {
        let running: Vec<usize> =
            (0..self.nodes.len()).filter(|index| self.nodes[*index].child.is_some()).collect();
        let leader = self.leader_among(&running).await?;
        // Ids and places part once a node is replaced by a new one.
        running.into_iter().find(|index| self.nodes[*index].id == leader)
    }

    pub(super) async fn wait_for_leader(&self, timeout: Duration) -> Option<usize> {
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
    pub(super) fn reap_unexpected_exits(&mut self, record: &impl Fn(String)) -> anyhow::Result<()> {
        for index in 0..self.nodes.len() {
            let node = &mut self.nodes[index];
            let Some(Ok(Some(status))) = node.child.as_mut().map(Child::try_wait) else {
                continue;
            };
            node.child = None;
            record(format!("node_exited node={} status={status}", node.id));
            if status.code() == Some(i32::from(crate::serve::EXIT_COMMITTED_ENTRY_LOST)) {
                // Its own log is what disagrees with the cluster's: starting it again would
                // only stop it again. It stays down.
                self.unexpected_exits.push(format!(
                    "node {} stopped because {}: the leader sent entries that contradict \
                     entries it had committed; see its log",
                    node.id,
                    picket_server::COMMITTED_ENTRY_LOST
                ));
                continue;
            }
            let exit = format!("node {} exited by itself ({status}); see its log", node.id);
            self.unexpected_exits.push(exit);
            self.restart(index);
        }
        Ok(())
    }

    /// Stops node `index` and starts in its place a new node `new_id`, on the same ports and
    /// clock, with an empty data directory of its own and `--join` instead of the peer list,
    /// as a lost host is replaced; the old node's data directory is kept for the log check.
    /// Adding it to the membership is the caller's part.
    ///
    /// # Errors
    /// When the new data directory cannot be made (its disk mounted, in a run with full disks).
    pub(super) fn replace(&mut self, index: usize, new_id: u64) -> anyhow::Result<()> {
        let node = &mut self.nodes[index];
        // A node removed while it ran went through its own removal (a removed leader steps
        // down): one that exited meanwhile crashed, which the kill below would hide.
        if let Some(status) = node.exit_status() {
            self.unexpected_exits
                .push(format!("node {} exited by itself ({status}) during its removal", node.id));
        }
        node.kill();
        let dir = node.dir.with_file_name(format!("node{new_id}"));
        if let Some(disks) = &mut self.disks {
            disks.mount(&dir)?;
        }
        let old_dir = std::mem::replace(&mut node.dir, dir);
        self.retired.push((node.id, old_dir));
        node.id = new_id;
        let mut args = Vec::with_capacity(node.args.len());
        let mut given = node.args.iter();
        while let Some(arg) = given.next() {
            match arg.as_str() {
                "--node-id" => {
                    given.next();
                    args.extend(["--node-id".to_owned(), new_id.to_string()]);
                }
                "--data-dir" => {
                    given.next();
                    args.extend(["--data-dir".to_owned(), node.dir.display().to_string()]);
                }
                "--peers" => {
                    given.next();
                    args.push("--join".to_owned());
                }
                _ => args.push(arg.clone()),
            }
        }
        node.args = args;
        self.restart(index);
        Ok(())
    }

    /// Starts node `index` again, trying a few times: while a node is down, another process
    /// may briefly hold its port as the local end of an outgoing connection. A node that still
    /// cannot start (it exits or hangs on its way up, as a deliberate bug can make it) is a
    /// violation, not the end of the run: it stays down and the run goes on to its verdict.
    pub(super) fn restart(&mut self, index: usize) {
        const ATTEMPTS: u32 = 5;
        let exe = self.exe.clone();
        let node = &mut self.nodes[index];
        for attempt in 1..=ATTEMPTS {
            match node.start(&exe) {
                Ok(()) => return,
                Err(error) if attempt == ATTEMPTS => {
                    node.child = None;
                    self.unexpected_exits.push(format!(
                        "node {} did not start again in {ATTEMPTS} attempts: {error:#}; its log \
                         ends: {}",
                        node.id,
                        log_tail(&node.dir.with_extension("log"))
                    ));
                }
                Err(error) => {
                    tracing::warn!(node = node.id, %error, "a node did not start; trying again");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }
}

/// The fenced store (`picket kv serve`), restartable on its port and data.
pub(super) struct Store {
    pub(super) exe: PathBuf,
    pub(super) args: Vec<String>,
    pub(super) procs: Option<PathBuf>,
    pub(super) log: PathBuf,
    pub(super) url: String,
    pub(super) child: Option<Process>,
}

impl Store {
    /// Starts the store, trying a few times: just after it was killed, another process may
    /// briefly hold its port as the local end of an outgoing connection, as with a node.
    ///
    /// # Errors
    /// When it did not start in any attempt; the error ends with the tail of its log.
    pub(super) fn start(&mut self) -> anyhow::Result<()> {
        const ATTEMPTS: u32 = 5;
        for attempt in 1..=ATTEMPTS {
            let mut command = launch(&self.exe, self.procs.as_deref(), &self.args);
            command.stderr(log_file(&self.log)?);
            match spawn_listening(command) {
                Ok((child, _)) => {
                    self.child = Some(Process(child));
                    return Ok(());
                }
                Err(error) if attempt == ATTEMPTS => {
                    return Err(error.context(format!(
                        "the store did not start in {ATTEMPTS} attempts; its log ends: {}",
                        log_tail(&self.log)
                    )));
                }
                Err(error) => {
                    tracing::warn!(%error, "the store did not start; trying again");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        unreachable!("the last attempt returns")
    }
}

/// The last lines of the log at `path`, joined with ` | `, for an error message.
pub(super) fn log_tail(path: &Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(5).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// The cgroup name of the node at `index`.
pub(super) fn node_member(index: usize) -> String {
    format!("node{}", index + 1)
}

/// The cgroup name of client `process` (from 1).
pub(super) fn client_member(process: usize) -> String {
    format!("client{process}")
}

/// A client process and the history it reported.
pub(super) struct ClientProcess {
    pub(super) child: Process,
    pub(super) stdin: Option<ChildStdin>,
    /// Reads its standard output into the history; ends when the process has exited.
    pub(super) reader: std::thread::JoinHandle<()>,
}

pub(super) fn start_client(
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
