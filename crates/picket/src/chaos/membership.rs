//! The `member_replace` fault: a member replaced by a new node through the cluster's own API,
//! as an operator replaces a lost host.

use super::processes::Cluster;
use hyper::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// How long each step (the removal, the add, the new membership on every node) may take before
/// the run counts it a violation: the step itself waits at most 30 s (a removal) or 60 s (an
/// add) on the leader, and a leader may move meanwhile.
const STEP_LIMIT: Duration = Duration::from_secs(90);

/// Replaces the leader half the time, else a follower: removed while it runs, or killed first
/// and removed by the other two (half the time each); then a new node under the next unused id
/// starts in its place with an empty data directory and `--join`, and is added. A step that does
/// not finish within [`STEP_LIMIT`] is a violation (no other fault runs meanwhile, but client
/// pauses); the fault is recorded as fired once the new node is a voter on every node.
pub(super) async fn replace_member(
    cluster: &mut Cluster,
    leader: usize,
    rng: &mut picket_sim::Rng,
    record: &impl Fn(String),
) -> anyhow::Result<()> {
    let size = cluster.nodes.len();
    let step = usize::try_from(rng.range(0, 4)).unwrap_or(0);
    let index = if step < 2 { leader } else { (leader + step - 1) % size };
    let killed_first = rng.range(0, 2) == 0;
    let old_id = cluster.nodes[index].id;
    let retired = cluster.retired.iter().map(|(id, _)| *id);
    let new_id = cluster.nodes.iter().map(|node| node.id).chain(retired).max().unwrap_or(0) + 1;
    let what = format!("node={old_id} new_node={new_id} killed_first={killed_first}");
    let started = Instant::now();
    // Its start, under a word of its own (the fault counts as fired only once it ends).
    record(format!("replace {what}"));
    if killed_first {
        cluster.nodes[index].kill();
    }
    let removal = format!("/v1/cluster/members/{old_id}");
    if let Err(last) = ask(cluster, Method::DELETE, &removal, None).await {
        let reason =
            format!("its removal did not commit within {} s: {last}", STEP_LIMIT.as_secs());
        return failed(cluster, record, &what, &reason);
    }
    if let Err(error) = cluster.replace(index, new_id) {
        return failed(cluster, record, &what, &format!("starting the new node: {error:#}"));
    }
    let node = &cluster.nodes[index];
    let body = json!({
        "node_id": new_id,
        "addr": format!("127.0.0.1:{}", node.client_port()),
        "peer_addr": format!("127.0.0.1:{}", node.peer_proxy_port),
    });
    if let Err(last) = ask(cluster, Method::POST, "/v1/cluster/members", Some(&body)).await {
        let reason =
            format!("the new node's add did not end within {} s: {last}", STEP_LIMIT.as_secs());
        return failed(cluster, record, &what, &reason);
    }
    let mut voters: Vec<u64> = cluster.nodes.iter().map(|node| node.id).collect();
    voters.sort_unstable();
    let wanted = json!([voters]);
    let waited = Instant::now();
    loop {
        let mut views = Vec::new();
        for node in &cluster.nodes {
            views.push(view(&node.addr).await.map(|view| view["voter_sets"].clone()));
        }
        if views.iter().all(|sets| sets.as_ref() == Some(&wanted)) {
            break;
        }
        if waited.elapsed() > STEP_LIMIT {
            let reason = format!(
                "the nodes did not all show the voters {wanted} within {} s: {views:?}",
                STEP_LIMIT.as_secs()
            );
            return failed(cluster, record, &what, &reason);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    record(format!("member_replace {what} took_ms={}", started.elapsed().as_millis()));
    Ok(())
}

/// Records a replacement that did not finish, as a violation. The node in its place, if
/// started, stays: later faults go on against a cluster short of a voter.
fn failed(
    cluster: &mut Cluster,
    record: &impl Fn(String),
    what: &str,
    reason: &str,
) -> anyhow::Result<()> {
    record(format!("failed_member_replace {what}"));
    cluster.unexpected_exits.push(format!("replacing a member ({what}) failed: {reason}"));
    Ok(())
}

/// Asks the running nodes in turn until one answers 200 (a removal of a node that is no
/// member any more counts: an earlier try went through, its answer lost), for at most
/// [`STEP_LIMIT`]; returns the last answer otherwise.
async fn ask(
    cluster: &Cluster,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(), String> {
    let body = body.map(|body| body.to_string().into_bytes()).unwrap_or_default();
    let headers = [("content-type", "application/json".to_owned())];
    let started = Instant::now();
    let mut last = String::from("no node answered");
    while started.elapsed() < STEP_LIMIT {
        for node in cluster.nodes.iter().filter(|node| node.pid().is_some()) {
            let url = format!("http://{}{path}", node.addr);
            match picket_proto::http1::send(method.clone(), &url, &headers, body.clone()).await {
                Ok(reply) => {
                    let text = String::from_utf8_lossy(&reply.body).into_owned();
                    let gone = method == Method::DELETE && text.contains("is not a member");
                    if reply.status == 200 || (reply.status == 400 && gone) {
                        return Ok(());
                    }
                    last = format!("node {} answered {}: {text}", node.id, reply.status);
                }
                Err(error) => last = format!("node {}: {error}", node.id),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last)
}

/// `GET /v1/cluster` of the node at `addr`, if it answers.
async fn view(addr: &str) -> Option<Value> {
    let url = format!("http://{addr}/v1/cluster");
    let reply = picket_proto::http1::send(Method::GET, &url, &[], Vec::new()).await.ok()?;
    serde_json::from_slice(&reply.body).ok()
}
