//! A loopback cluster of `picket serve` processes, and a client that follows its leader.

use crate::http::{Reply, try_request};
use crate::{ServerProcess, free_port, temp_dir, wait_until};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `size` nodes of `picket serve` on loopback ports, each with its own data directory under one
/// temporary directory, formed from a static peer list.
#[derive(Debug)]
pub struct Cluster {
    dir: tempfile::TempDir,
    /// The nodes; node id `i + 1` is `nodes[i]`.
    pub nodes: Vec<ServerProcess>,
    peer_addrs: Vec<Option<String>>,
}

impl Cluster {
    /// Starts `size` nodes of `binary serve`, each with `--node-id`, `--peers` and `extra`.
    ///
    /// # Panics
    /// When a node does not start.
    #[must_use]
    pub fn start(binary: &Path, size: usize, extra: &[String]) -> Self {
        Self::start_each(binary, size, |_| extra.to_vec())
    }

    /// Like [`Cluster::start`], with arguments of each node's own: `extra(node_id)`.
    ///
    /// # Panics
    /// When a node does not start.
    #[must_use]
    pub fn start_each(binary: &Path, size: usize, extra: impl Fn(usize) -> Vec<String>) -> Self {
        Self::start_inner(binary, size, false, extra, &[])
    }

    /// Like [`Cluster::start`], with environment variables `env` set for every node, such as
    /// `PICKET_MUTATION`.
    ///
    /// # Panics
    /// When a node does not start.
    #[must_use]
    pub fn start_with_env(
        binary: &Path,
        size: usize,
        extra: &[String],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_inner(binary, size, false, |_| extra.to_vec(), env)
    }

    /// Like [`Cluster::start`], each node serving its peers on a port of its own
    /// (`--peer-listen`); [`Cluster::peer_addrs`] lists those ports.
    ///
    /// # Panics
    /// When a node does not start.
    #[must_use]
    pub fn start_with_peer_ports(binary: &Path, size: usize, extra: &[String]) -> Self {
        Self::start_inner(binary, size, true, |_| extra.to_vec(), &[])
    }

    fn start_inner(
        binary: &Path,
        size: usize,
        peer_ports: bool,
        extra: impl Fn(usize) -> Vec<String>,
        env: &[(&str, &str)],
    ) -> Self {
        let dir = temp_dir();
        let ports: Vec<u16> = (0..size).map(|_| free_port()).collect();
        let peer_addrs: Vec<Option<String>> = ports
            .iter()
            .map(|_| peer_ports.then(|| format!("127.0.0.1:{}", free_port())))
            .collect();
        let peers = ports
            .iter()
            .zip(&peer_addrs)
            .enumerate()
            .map(|(index, (port, peer_addr))| match peer_addr {
                Some(peer_addr) => format!("{}=127.0.0.1:{port}/{peer_addr}", index + 1),
                None => format!("{}=127.0.0.1:{port}", index + 1),
            })
            .collect::<Vec<_>>()
            .join(",");
        let nodes = ports
            .iter()
            .zip(&peer_addrs)
            .enumerate()
            .map(|(index, (port, peer_addr))| {
                let mut args =
                    vec!["--node-id".to_owned(), (index + 1).to_string(), "--peers".to_owned()];
                args.push(peers.clone());
                if let Some(peer_addr) = peer_addr {
                    args.extend(["--peer-listen".to_owned(), peer_addr.clone()]);
                }
                args.extend(extra(index + 1));
                ServerProcess::start_with_env(
                    binary,
                    &dir.path().join(format!("node{}", index + 1)),
                    format!("127.0.0.1:{port}").parse().expect("a socket address"),
                    &args,
                    env,
                )
            })
            .collect();
        Self { dir, nodes, peer_addrs }
    }

    /// Each node's peer address, when the nodes serve peers on ports of their own.
    #[must_use]
    pub fn peer_addrs(&self) -> Vec<Option<String>> {
        self.peer_addrs.clone()
    }

    /// The directory that holds every node's data directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The data directory of `nodes[index]`.
    #[must_use]
    pub fn data_dir(&self, index: usize) -> PathBuf {
        self.nodes[index].data_dir().to_owned()
    }

    /// Every node's address, running or not.
    #[must_use]
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.addr.clone()).collect()
    }

    /// The index of the node that every running node names as leader.
    ///
    /// # Panics
    /// When the nodes do not agree on a running leader within `timeout`.
    #[must_use]
    pub fn leader(&self, timeout: Duration) -> usize {
        wait_until("an agreed leader", timeout, || self.agreed_leader())
    }

    /// The index of the node that every running node names as leader now, if they agree.
    #[must_use]
    pub fn agreed_leader(&self) -> Option<usize> {
        let views: Vec<Value> = self
            .nodes
            .iter()
            .filter(|node| node.pid().is_some())
            .filter_map(|node| {
                try_request(&node.addr, "GET", "/v1/cluster", None).ok().map(|reply| reply.body)
            })
            .collect();
        let running = self.nodes.iter().filter(|node| node.pid().is_some()).count();
        if views.len() < running {
            return None;
        }
        let leader = views.first()?["leader_id"].as_u64()?;
        let agreed = views.iter().all(|view| view["leader_id"].as_u64() == Some(leader));
        let index = usize::try_from(leader).ok()?.checked_sub(1)?;
        (agreed && self.nodes.get(index)?.pid().is_some()).then_some(index)
    }

    /// `GET /v1/cluster` of `nodes[index]`, or `Null` when it does not answer.
    #[must_use]
    pub fn view(&self, index: usize) -> Value {
        try_request(&self.nodes[index].addr, "GET", "/v1/cluster", None)
            .map(|reply| reply.body)
            .unwrap_or(Value::Null)
    }

    /// The applied log index of `nodes[index]`, 0 when it does not answer.
    #[must_use]
    pub fn applied_log_index(&self, index: usize) -> u64 {
        self.view(index)["applied_log_index"].as_u64().unwrap_or(0)
    }

    /// Waits until every running node has applied the same log index, which stays put while
    /// nothing is written: the replicas have converged.
    ///
    /// # Panics
    /// When they do not converge within `timeout`.
    pub fn wait_converged(&self, timeout: Duration) {
        wait_until("every node to apply the same log index", timeout, || {
            let indexes: Vec<u64> = (0..self.nodes.len())
                .filter(|index| self.nodes[*index].pid().is_some())
                .map(|index| self.applied_log_index(index))
                .collect();
            let first = *indexes.first()?;
            (first > 0 && indexes.iter().all(|index| *index == first)).then_some(())
        });
    }
}

/// Sends a request to the cluster, following the leader: on `not_leader` it goes where the
/// refusal points, on `503` it waits a little, and when a node does not answer it tries the
/// next one. `None` when nothing answered otherwise within `timeout`.
#[must_use]
pub fn send(
    addrs: &[String],
    method: &str,
    path: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> Option<Reply> {
    let deadline = Instant::now() + timeout;
    let mut target = addrs[0].clone();
    let mut next = 0;
    while Instant::now() < deadline {
        match try_request(&target, method, path, body) {
            Ok(reply) if reply.body["code"] == "not_leader" => {
                match reply.body["leader"].as_str() {
                    Some(leader) => target = leader.to_owned(),
                    None => {
                        next = (next + 1) % addrs.len();
                        target = addrs[next].clone();
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            Ok(reply) if reply.status == 503 => std::thread::sleep(Duration::from_millis(50)),
            Ok(reply) => return Some(reply),
            Err(_) => {
                next = (next + 1) % addrs.len();
                target = addrs[next].clone();
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    None
}
