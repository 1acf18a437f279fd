//! The harness: a 3-node cluster, `picket kv serve` guarding one prefix, and client processes,
//! all real processes of this binary, while a nemesis drawn from a seed injects faults. At the
//! end it reads the store's list and every node's log and checks the whole history.

use super::check::{Summary, Verdict, check};
use super::history::Event;
use super::nemesis::run_nemesis;
use super::network::Network;
use super::plan::{Mutation, RunPlan};
use super::processes::{
    ClientProcess, Cluster, KEY, LOCK, PREFIX, Store, client_member, free_port, signal,
    start_client,
};
use anyhow::{Context, bail};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

pub(super) async fn run_started(
    plan: &RunPlan,
    exe: &Path,
    cluster: &mut Cluster,
) -> anyhow::Result<Summary> {
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
            cluster.restart(index);
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
    Ok(check(&events, &final_list, &required, plan.ttl))
}

pub(super) async fn read_final_list(kv_url: &str) -> anyhow::Result<String> {
    let url = format!("{kv_url}/kv/{KEY}");
    let reply = picket_proto::http1::send(hyper::Method::GET, &url, &[], Vec::new()).await?;
    match reply.status {
        200 => Ok(reply.text()),
        404 => Ok(String::new()),
        status => bail!("the store answered {status} to the final read: {}", reply.text()),
    }
}

pub(super) fn write_history(path: &Path, events: &[Event]) -> anyhow::Result<()> {
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

/// After the run, with every node stopped: no log id holds different entries on two nodes, the
/// nodes replaced during the run included.
pub(super) fn check_logs_agree(cluster: &Cluster, summary: &mut Summary) {
    let mut by_id: BTreeMap<(String, u64), Vec<(u64, String)>> = BTreeMap::new();
    let nodes = cluster.nodes.iter().map(|node| (node.id, &node.dir));
    let retired = cluster.retired.iter().map(|(id, dir)| (*id, dir));
    for (id, dir) in nodes.chain(retired) {
        match picket_server::read_entries(dir) {
            Ok(entries) => {
                for entry in entries {
                    by_id.entry((entry.leader, entry.index)).or_default().push((id, entry.payload));
                }
            }
            Err(error) => {
                summary.violations.push(format!("node {id}'s log cannot be read: {error}"))
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
