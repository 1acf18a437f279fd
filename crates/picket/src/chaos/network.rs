//! Network partitions for the harness, on one machine and on loopback.
//!
//! Every process of a run (each node, the store, each client) lives in its own cgroup (v2), and
//! one nftables table of the run drops, on the output hook, the packets a process sends to a
//! port it must not reach: `socket cgroupv2 level 2 "<its cgroup>" tcp dport <port> drop`. The
//! kernel knows which process opened every socket, so a cut is per link and per direction of
//! connection, with no proxy in the path and no change to the processes: a node that cannot
//! send to a peer's port sees its requests vanish, as on a real network, and times out.
//!
//! Why not a TCP proxy per link: nodes reach each other at the one peer address each member
//! advertises in the replicated membership, and clients follow leader hints to the client
//! addresses, so a proxy cannot tell who is calling. (Slow links do use a proxy per node, in
//! front of its peer port: see `delay.rs`. Node-to-node cuts aim at those proxies' ports.) Why not network namespaces: this machine's kernel has
//! no traffic-control classifiers (and no `netem`), so per-pair rules need nftables anyway.
//!
//! Needs root, the `nft` command (Debian's `nftables` package) and the cgroup v2 hierarchy
//! mounted at or under `/sys/fs/cgroup` without a cgroup namespace (the levels nftables
//! compares are counted from the real root). A cut only affects sockets opened after their
//! process joined its cgroup, so processes join before they exec (`picket chaos enter`).

use anyhow::{Context, bail};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where nftables resolves `socket cgroupv2` paths from.
const NFT_CGROUP_BASE: &str = "/sys/fs/cgroup";

/// Prefix of each run's cgroup and nftables table; the run's process id follows.
const RUN_PREFIX: &str = "picket_chaos_";

/// One link cut: packets that `from` sends to TCP port `to_port` are dropped.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cut {
    /// The member whose packets are dropped.
    pub from: String,
    /// The port it cannot reach (a node's or the store's listening port).
    pub to_port: u16,
}

/// The run's cgroups and nftables table. Dropping it deletes both.
#[derive(Debug)]
pub struct Network {
    /// The run's cgroup directory: every member's cgroup is a directory in it.
    run_dir: PathBuf,
    /// `run_dir` as nftables names it, relative to [`NFT_CGROUP_BASE`].
    nft_run_path: String,
    table: String,
    members: BTreeSet<String>,
}

impl Network {
    /// Creates the run's cgroup and its empty nftables table, after deleting those of earlier
    /// runs whose harness is gone.
    ///
    /// # Errors
    /// When the machine cannot cut links: not root, no `nft`, no cgroup v2 under
    /// `/sys/fs/cgroup`.
    pub fn open() -> anyhow::Result<Self> {
        if !rustix::process::geteuid().is_root() {
            bail!("network partitions need root (nftables rules and cgroups)");
        }
        let mount = cgroup2_mount()?;
        let relative = mount.strip_prefix(NFT_CGROUP_BASE).map_err(|_| {
            anyhow::anyhow!(
                "the cgroup v2 hierarchy is mounted at {}; nftables looks for it under {NFT_CGROUP_BASE}",
                mount.display()
            )
        })?;
        nft("list tables\n").context(
            "network partitions need the `nft` command: apt-get install nftables (Debian)",
        )?;
        remove_stale_runs(&mount);
        let name = format!("{RUN_PREFIX}{}", std::process::id());
        let run_dir = mount.join(&name);
        std::fs::create_dir_all(&run_dir)
            .with_context(|| format!("cannot create the cgroup {}", run_dir.display()))?;
        let nft_run_path = Path::new(relative).join(&name).display().to_string();
        let network = Self { run_dir, nft_run_path, table: name, members: BTreeSet::new() };
        nft(&format!(
            "add table inet {table}\n\
             add chain inet {table} out {{ type filter hook output priority 0; policy accept; }}\n",
            table = network.table
        ))
        .context("cannot create the run's nftables table")?;
        Ok(network)
    }

    /// Creates the cgroup of member `name` (a node, the store or a client) and returns the
    /// path of its `cgroup.procs`, for `picket chaos enter`.
    ///
    /// # Errors
    /// When the cgroup cannot be created.
    pub fn member(&mut self, name: &str) -> anyhow::Result<PathBuf> {
        assert!(is_member_name(name), "member names are short and plain: {name:?}");
        let dir = self.run_dir.join(name);
        if !dir.exists() {
            std::fs::create_dir(&dir)
                .with_context(|| format!("cannot create the cgroup {}", dir.display()))?;
        }
        self.members.insert(name.to_owned());
        Ok(dir.join("cgroup.procs"))
    }

    /// Replaces every cut with `cuts`, in one nftables transaction, and returns how many
    /// packets the cuts it replaced dropped.
    ///
    /// # Errors
    /// When `nft` refuses the rules; the previous cuts then stay in place.
    pub fn set_cuts(&self, cuts: &[Cut]) -> anyhow::Result<u64> {
        let dropped = self.dropped_packets()?;
        let mut script = format!("flush chain inet {} out\n", self.table);
        for cut in cuts {
            assert!(self.members.contains(&cut.from), "a cut from an unknown member: {cut:?}");
            script.push_str(&format!(
                "add rule inet {} out socket cgroupv2 level 2 \"{}/{}\" tcp dport {} counter drop\n",
                self.table, self.nft_run_path, cut.from, cut.to_port
            ));
        }
        nft(&script).context("cannot set the run's network cuts")?;
        Ok(dropped)
    }

    /// How many packets the current cuts have dropped.
    fn dropped_packets(&self) -> anyhow::Result<u64> {
        let listing = nft_output(&["-j", "list", "chain", "inet", &self.table, "out"])?;
        let json: serde_json::Value =
            serde_json::from_str(&listing).context("nft -j printed something other than JSON")?;
        let mut packets = 0;
        for item in json["nftables"].as_array().into_iter().flatten() {
            for expression in item["rule"]["expr"].as_array().into_iter().flatten() {
                packets += expression["counter"]["packets"].as_u64().unwrap_or(0);
            }
        }
        Ok(packets)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if let Err(error) = nft(&format!("delete table inet {}\n", self.table)) {
            tracing::warn!(%error, table = %self.table, "cannot delete the run's nftables table");
        }
        remove_run_dir(&self.run_dir);
    }
}

fn is_member_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
}

/// Where the cgroup v2 hierarchy is mounted.
fn cgroup2_mount() -> anyhow::Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("cannot read /proc/mounts")?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, path, kind) = (fields.next()?, fields.next()?, fields.next()?);
            (kind == "cgroup2").then(|| PathBuf::from(path))
        })
        .next()
        .context("no cgroup v2 hierarchy is mounted (see /proc/mounts)")
}

/// Deletes the tables and cgroups of runs whose harness process is gone.
fn remove_stale_runs(mount: &Path) {
    let alive = |name: &str| {
        name.strip_prefix(RUN_PREFIX)
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_none_or(|pid| Path::new(&format!("/proc/{pid}")).exists())
    };
    if let Ok(listing) = nft_output(&["list", "tables"]) {
        for table in listing.lines().filter_map(|line| line.strip_prefix("table inet ")) {
            if table.starts_with(RUN_PREFIX) && !alive(table) {
                let _ = nft(&format!("delete table inet {table}\n"));
            }
        }
    }
    for entry in std::fs::read_dir(mount).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(RUN_PREFIX) && !alive(&name) {
            remove_run_dir(&entry.path());
        }
    }
}

/// Removes a run's cgroup: its members first. A member that still holds a process (one that
/// outlived its harness) stays, with a warning.
fn remove_run_dir(run_dir: &Path) {
    for entry in std::fs::read_dir(run_dir).into_iter().flatten().flatten() {
        if entry.path().is_dir()
            && let Err(error) = std::fs::remove_dir(entry.path())
        {
            tracing::warn!(%error, cgroup = %entry.path().display(), "cannot remove a cgroup");
        }
    }
    if let Err(error) = std::fs::remove_dir(run_dir) {
        tracing::warn!(%error, cgroup = %run_dir.display(), "cannot remove the run's cgroup");
    }
}

/// Runs an nftables script (`nft -f -`).
fn nft(script: &str) -> anyhow::Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run nft")?;
    child.stdin.take().context("stdin is piped")?.write_all(script.as_bytes())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!("nft refused the rules: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

fn nft_output(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("nft").args(args).output().context("cannot run nft")?;
    if !output.status.success() {
        bail!("nft {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `picket chaos enter`: moves this process into the cgroup whose `cgroup.procs` is `procs`,
/// then becomes `args` (this binary with those arguments), keeping its process id, so that
/// every socket the command opens belongs to that cgroup.
///
/// # Errors
/// When the process cannot join the cgroup or the command cannot start.
pub fn enter(procs: &Path, args: &[String]) -> anyhow::Result<std::convert::Infallible> {
    use std::os::unix::process::CommandExt;
    // "0" is the writing process itself.
    std::fs::write(procs, "0").with_context(|| format!("cannot join {}", procs.display()))?;
    let exe = std::env::current_exe().context("cannot find the picket binary")?;
    let error = Command::new(exe).args(args).exec();
    Err(error).context("cannot start the command")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_are_plain_and_short() {
        assert!(is_member_name("node1"));
        assert!(is_member_name("client-12"));
        assert!(!is_member_name(""));
        assert!(!is_member_name("a/b"));
        assert!(!is_member_name("a\"b"));
        assert!(!is_member_name(&"x".repeat(33)));
    }
}
