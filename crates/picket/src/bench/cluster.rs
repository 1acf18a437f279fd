//! `--cluster`: a local 3-node cluster (and its stores) started for the run and stopped after.

use super::{BenchArgs, Mode};
use anyhow::bail;
use picket_client::Client;
use std::time::{Duration, Instant};

/// A 3-node loopback cluster of this binary, stopped when dropped.
pub(super) struct LocalCluster {
    /// The three nodes first (index = node id - 1), then any `picket kv` stores.
    children: Vec<std::process::Child>,
    pub(super) endpoints: Vec<String>,
    dir: std::path::PathBuf,
}

/// A loopback port outside the kernel's ephemeral range, so no outgoing connection takes it
/// before its node binds it.
pub(super) fn free_port() -> std::io::Result<u16> {
    picket_testkit::try_free_ports_in_a_row(1)
}

impl LocalCluster {
    fn start() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("picket-bench-cluster-{}", std::process::id()));
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
        let endpoints: Vec<String> = ports.iter().map(|port| format!("127.0.0.1:{port}")).collect();
        let peers = endpoints
            .iter()
            .enumerate()
            .map(|(index, addr)| format!("{}={addr}", index + 1))
            .collect::<Vec<_>>()
            .join(",");
        let binary = std::env::current_exe()?;
        // Built before the first spawn so that a failed spawn still stops the nodes started.
        let mut cluster = Self { children: Vec::new(), endpoints, dir };
        for (index, addr) in cluster.endpoints.iter().enumerate() {
            let node = std::process::Command::new(&binary)
                .args([
                    "serve",
                    "--node-id",
                    &(index + 1).to_string(),
                    "--listen",
                    addr,
                    "--peers",
                    &peers,
                ])
                .arg("--data-dir")
                .arg(cluster.dir.join(format!("node{}", index + 1)))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()?;
            cluster.children.push(node);
        }
        Ok(cluster)
    }

    /// Starts two `picket kv` stores against the cluster, one fenced and one with `--no-fence`,
    /// guarding `prefix` with `lock`, and returns their URLs once both listen.
    fn start_kv_stores(&mut self, prefix: &str, lock: &str) -> anyhow::Result<(String, String)> {
        let binary = std::env::current_exe()?;
        let mut urls = Vec::new();
        for (name, no_fence) in [("kv-fenced", false), ("kv-unfenced", true)] {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let mut command = std::process::Command::new(&binary);
            command
                .args(["--endpoints", &self.endpoints.join(","), "kv", "serve", "--listen", &addr])
                .arg("--data-dir")
                .arg(self.dir.join(name))
                .args(["--guard", &format!("{prefix}={lock}")])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            if no_fence {
                command.arg("--no-fence");
            }
            self.children.push(command.spawn()?);
            urls.push(addr);
        }
        for addr in &urls {
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(addr).is_err() {
                if Instant::now() > deadline {
                    bail!("the benchmark's kv store on {addr} did not start listening in 10 s");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok((format!("http://{}", urls[0]), format!("http://{}", urls[1])))
    }

    /// The pid of the leader, once the same node has been reported leader five times in a row
    /// (a first election can be followed by a second one while the nodes start).
    pub(super) async fn leader_pid(&self, client: &Client) -> anyhow::Result<u32> {
        let (mut last, mut seen) = (0, 0);
        for _ in 0..300 {
            match client.cluster().await {
                Ok(info) if info.leader_id > 0 && info.leader_id == last => seen += 1,
                Ok(info) => (last, seen) = (info.leader_id, 1),
                Err(_) => (last, seen) = (0, 0),
            }
            if last > 0 && seen >= 5 {
                let index = usize::try_from(last - 1)?;
                return Ok(self.children[index].id());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the local cluster elected no stable leader in 30 s")
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a local 3-node cluster (and, for the fenced mode, its stores) and points `args` at
/// it: the leader's pid for the CPU figures, the stores' URLs.
pub(super) fn start_local_cluster(
    runtime: &tokio::runtime::Runtime,
    args: &mut BenchArgs,
) -> anyhow::Result<LocalCluster> {
    let mut cluster = LocalCluster::start()?;
    let endpoints = cluster.endpoints.clone();
    let leader = runtime.block_on(async {
        // The nodes need a moment to start listening.
        let mut attempts = 0;
        let client = loop {
            match Client::connect(endpoints.clone()).await {
                Ok(client) => break client,
                Err(error) if attempts >= 50 => {
                    return Err(
                        anyhow::Error::new(error).context("the local cluster did not start")
                    );
                }
                Err(_) => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        cluster.leader_pid(&client).await
    })?;
    args.server_pid = Some(leader);
    // The stores connect to the cluster when they start, so they start once it has a leader.
    if args.mode == Mode::Fenced {
        let (fenced, unfenced) = cluster.start_kv_stores(&args.prefix, &args.lock)?;
        args.kv = fenced;
        args.kv_unfenced = Some(unfenced);
    }
    Ok(cluster)
}
