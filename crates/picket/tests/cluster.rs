//! A 3-node cluster on loopback: `kill -9` the leader under load, and a killed follower that
//! must catch up, once from the log and once through a snapshot after the leader compacted its
//! log.
//!
//! Checked: a new leader serves within a few election timeouts; no acknowledged grant or
//! release is lost; every token is greater than every earlier one; sessions that kept alive
//! through the failover did not expire.

use picket_testkit::cluster::{Cluster, send};
use picket_testkit::http::try_request;
use picket_testkit::{ServerProcess, free_port, temp_dir, wait_until};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const ELECTION_TIMEOUT_MS: u64 = 300;
const SESSION_TTL_MS: u64 = 4_000;
const SNAPSHOT_EVERY: u64 = 100;

fn start_cluster() -> Cluster {
    let args: Vec<String> = [
        "--heartbeat-ms",
        "50",
        "--election-timeout-ms",
        &ELECTION_TIMEOUT_MS.to_string(),
        "--snapshot-every",
        &SNAPSHOT_EVERY.to_string(),
        "--keep-entries",
        "10",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    Cluster::start(Path::new(env!("CARGO_BIN_EXE_picket")), 3, &args)
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Known {
    Held(u64),
    Free,
}

#[derive(Debug)]
struct Worker {
    session: u64,
    name: String,
    known: Known,
    /// An operation whose answer never came: it may or may not have been applied.
    unknown: Option<&'static str>,
    max_token: u64,
    acknowledged: usize,
}

/// Acquires, releases and keeps its session alive until `stop`.
fn work(addrs: &[String], mut worker: Worker, stop: &AtomicBool) -> Worker {
    let mut last_keepalive = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if last_keepalive.elapsed() > Duration::from_millis(SESSION_TTL_MS / 4) {
            let reply = send(
                addrs,
                "POST",
                &format!("/v1/sessions/{}/keepalive", worker.session),
                Some(&json!({})),
                Duration::from_secs(2),
            );
            if let Some(reply) = reply {
                assert_eq!(reply.status, 200, "session {} lost: {}", worker.session, reply.text);
                last_keepalive = Instant::now();
            }
        }
        if worker.unknown.is_some() {
            // Learn what happened before going on.
            let Some(lock) = send(
                addrs,
                "GET",
                &format!("/v1/locks/{}", worker.name),
                None,
                Duration::from_secs(1),
            ) else {
                continue;
            };
            settle(&mut worker, &lock.body);
            continue;
        }
        let (path, body, op) = match worker.known {
            Known::Free => (
                "/v1/locks/acquire",
                json!({ "name": worker.name, "session_id": worker.session, "wait_ms": 0 }),
                "acquire",
            ),
            Known::Held(token) => (
                "/v1/locks/release",
                json!({ "name": worker.name, "session_id": worker.session, "token": token }),
                "release",
            ),
        };
        match send(addrs, "POST", path, Some(&body), Duration::from_millis(500)) {
            Some(reply) if reply.status == 200 => {
                worker.acknowledged += 1;
                worker.known = match worker.known {
                    Known::Free => {
                        let token = reply.body["token"].as_u64().unwrap();
                        assert!(
                            token > worker.max_token,
                            "token {token} not above {}",
                            worker.max_token
                        );
                        worker.max_token = token;
                        Known::Held(token)
                    }
                    Known::Held(_) => Known::Free,
                };
            }
            // A retried request can meet its own earlier success.
            Some(reply)
                if reply.body["code"] == "not_held" || reply.body["code"] == "outcome_unknown" =>
            {
                worker.unknown = Some(op)
            }
            Some(reply) => panic!("{op} failed: {}", reply.text),
            None => worker.unknown = Some(op),
        }
    }
    worker
}

/// Reconciles a worker with the lock as the cluster reports it: it must match what was
/// acknowledged, or what the one unanswered operation would have done.
fn settle(worker: &mut Worker, lock: &Value) {
    let actual = match lock["holder"].as_object() {
        None => Known::Free,
        Some(holder) => {
            assert_eq!(
                holder["session_id"], worker.session,
                "{} is held by someone else",
                worker.name
            );
            Known::Held(holder["token"].as_u64().unwrap())
        }
    };
    match (&worker.known, worker.unknown, &actual) {
        (known, _, actual) if known == actual => {}
        (Known::Free, Some("acquire"), Known::Held(token)) if *token > worker.max_token => {
            worker.max_token = *token
        }
        (Known::Held(_), Some("release"), Known::Free) => {}
        (known, unknown, actual) => panic!(
            "{}: acknowledged {known:?} (unanswered: {unknown:?}) but the cluster says {actual:?}",
            worker.name
        ),
    }
    worker.known = actual;
    worker.unknown = None;
}

fn run_workers(addrs: &[String], workers: Vec<Worker>, during: impl FnOnce()) -> Vec<Worker> {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = workers
        .into_iter()
        .map(|worker| {
            let (addrs, stop) = (addrs.to_vec(), stop.clone());
            std::thread::spawn(move || work(&addrs, worker, &stop))
        })
        .collect();
    during();
    stop.store(true, Ordering::Relaxed);
    handles.into_iter().map(|handle| handle.join().unwrap()).collect()
}

fn applied_revision(cluster: &Cluster, index: usize) -> u64 {
    cluster.view(index)["applied_revision"].as_u64().unwrap_or(0)
}

#[test]
fn leader_failover_and_follower_catch_up_lose_nothing() {
    let mut cluster = start_cluster();
    let leader = cluster.leader(Duration::from_secs(20));
    let addrs = cluster.addrs();
    let workers: Vec<Worker> = (0..3)
        .map(|index| {
            let reply = send(
                &addrs,
                "POST",
                "/v1/sessions",
                Some(&json!({ "ttl_ms": SESSION_TTL_MS })),
                Duration::from_secs(5),
            )
            .unwrap();
            Worker {
                session: reply.body["session_id"].as_u64().unwrap(),
                name: format!("cluster/{index}"),
                known: Known::Free,
                unknown: None,
                max_token: 0,
                acknowledged: 0,
            }
        })
        .collect();

    // 1. Kill the leader under load. A new leader must serve writes within a few election
    //    timeouts, and nothing acknowledged may be lost.
    let mut failover = Duration::ZERO;
    let workers = run_workers(&addrs, workers, || {
        let before = applied_revision(&cluster, leader);
        wait_until("load on the leader", Duration::from_secs(20), || {
            (applied_revision(&cluster, leader) > before + 100).then_some(())
        });
        cluster.nodes[leader].kill();
        let killed_at = Instant::now();
        let new_leader = cluster.leader(Duration::from_secs(10));
        assert_ne!(new_leader, leader);
        let revision = applied_revision(&cluster, new_leader);
        wait_until("writes after the failover", Duration::from_secs(10), || {
            (applied_revision(&cluster, new_leader) > revision + 50).then_some(())
        });
        failover = killed_at.elapsed();
    });
    eprintln!("failover to a serving leader took {failover:?}");
    assert!(failover < Duration::from_secs(10), "failover took {failover:?}");
    let mut workers = workers;
    for worker in &mut workers {
        assert!(worker.acknowledged > 0);
        let lock = send(
            &addrs,
            "GET",
            &format!("/v1/locks/{}", worker.name),
            None,
            Duration::from_secs(5),
        )
        .unwrap();
        settle(worker, &lock.body);
        // The session kept alive through the failover: it must still exist.
        let alive = send(
            &addrs,
            "POST",
            &format!("/v1/sessions/{}/keepalive", worker.session),
            Some(&json!({})),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(
            alive.status, 200,
            "session {} expired across the failover: {}",
            worker.session, alive.text
        );
    }

    // 2. The old leader restarts as a follower and catches up from the log.
    cluster.nodes[leader].restart();
    let current = cluster.leader(Duration::from_secs(10));
    let target = applied_revision(&cluster, current);
    wait_until("the old leader to catch up", Duration::from_secs(20), || {
        (applied_revision(&cluster, leader) >= target).then_some(())
    });

    // 3. Kill a follower, write enough for the leader to snapshot and purge past it, restart
    //    it: it can only catch up by installing the snapshot.
    let current = cluster.leader(Duration::from_secs(10));
    let follower = (0..3).find(|index| *index != current).unwrap();
    let follower_index_at_kill = cluster.view(follower)["applied_log_index"].as_u64().unwrap();
    cluster.nodes[follower].kill();
    let workers = run_workers(&addrs, workers, || {
        wait_until(
            "the leader to compact past the stopped follower",
            Duration::from_secs(30),
            || {
                let purged = cluster.view(current)["purged_log_index"].as_u64().unwrap_or(0);
                (purged > follower_index_at_kill + SNAPSHOT_EVERY).then_some(())
            },
        );
    });
    cluster.nodes[follower].restart();
    let target = applied_revision(&cluster, current);
    wait_until("the follower to catch up through a snapshot", Duration::from_secs(20), || {
        let view = cluster.view(follower);
        let caught_up = view["applied_revision"].as_u64().unwrap_or(0) >= target;
        let from_snapshot =
            view["snapshot_log_index"].as_u64().unwrap_or(0) > follower_index_at_kill;
        (caught_up && from_snapshot).then_some(())
    });

    // Every lock is where its worker last saw it, and a fresh grant outranks every token seen.
    let mut workers = workers;
    for worker in &mut workers {
        let lock = send(
            &addrs,
            "GET",
            &format!("/v1/locks/{}", worker.name),
            None,
            Duration::from_secs(5),
        )
        .unwrap();
        settle(worker, &lock.body);
    }
    let highest = workers.iter().map(|worker| worker.max_token).max().unwrap();
    let fresh = send(
        &addrs,
        "POST",
        "/v1/locks/acquire",
        Some(&json!({ "name": "cluster/fresh", "session_id": workers[0].session, "wait_ms": 0 })),
        Duration::from_secs(5),
    )
    .unwrap();
    let fresh_token = fresh.body["token"].as_u64().unwrap();
    assert!(fresh_token > highest, "fresh token {fresh_token} not above {highest}");
    // The follower that installed the snapshot reports the same state as the leader.
    let on_follower =
        try_request(&cluster.nodes[follower].addr, "GET", "/v1/cluster", None).unwrap();
    assert_eq!(on_follower.body["leader_id"], cluster.view(current)["leader_id"]);
}

/// A node started with `--join` is added as a voter through the API, catches up, and is removed
/// again; the cluster serves writes throughout. The new node serves its peers on a port of its
/// own (`--peer-listen`) while the others serve theirs on their client ports: one cluster can
/// mix both.
#[test]
fn a_member_can_be_added_and_removed() {
    let cluster = start_cluster();
    let _ = cluster.leader(Duration::from_secs(20));
    let addrs = cluster.addrs();
    let port = free_port();
    let peer_addr = format!("127.0.0.1:{}", free_port());
    let joiner_dir = temp_dir();
    let joiner = ServerProcess::start(
        Path::new(env!("CARGO_BIN_EXE_picket")),
        &joiner_dir.path().join("node4"),
        format!("127.0.0.1:{port}").parse().unwrap(),
        &[
            "--node-id".to_owned(),
            "4".to_owned(),
            "--join".to_owned(),
            "--heartbeat-ms".to_owned(),
            "50".to_owned(),
            "--peer-listen".to_owned(),
            peer_addr.clone(),
        ],
    );
    let session = open_session(&addrs);
    let before = send(
        &addrs,
        "POST",
        "/v1/locks/acquire",
        Some(&json!({ "name": "membership", "session_id": session, "wait_ms": 0 })),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(before.status, 200);

    let added = send(
        &addrs,
        "POST",
        "/v1/cluster/members",
        Some(&json!({ "node_id": 4, "addr": joiner.addr, "peer_addr": peer_addr })),
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(added.status, 200, "{}", added.text);
    let voters = |view: &Value| {
        view["members"].as_array().unwrap().iter().filter(|m| m["voter"] == true).count()
    };
    assert_eq!(voters(&added.body), 4);
    assert_eq!(added.body["members"][3]["peer_addr"], peer_addr.as_str(), "{}", added.text);
    // Client input, checked before the log: a peer address is bounded like an address, and
    // reserved ids (a node refuses to start under them), addresses without a port and another
    // member's address are refused, where each used to end in the 60 s catch-up timeout.
    let bad_peer = |peer_addr: String| (5, "127.0.0.1:1", Some(peer_addr), "peer address");
    let refusals = [
        bad_peer("x".repeat(300)),
        bad_peer("127.0.0.1:1\n".to_owned()),
        bad_peer(String::new()),
        (0, "127.0.0.1:1", None, "reserved"),
        (u64::MAX, "127.0.0.1:1", None, "reserved"),
        (5, "127.0.0.1", None, "with a port"),
        (5, addrs[0].as_str(), None, "node 1 already listens at that address"),
    ];
    for (node_id, addr, peer_addr, why) in refusals {
        let body = json!({ "node_id": node_id, "addr": addr, "peer_addr": peer_addr });
        let refused =
            send(&addrs, "POST", "/v1/cluster/members", Some(&body), Duration::from_secs(30))
                .unwrap();
        assert_eq!(refused.status, 400, "{}", refused.text);
        assert!(refused.text.contains(why), "{}", refused.text);
    }
    // So is removing a node that is no member (openraft reports success).
    let missing =
        send(&addrs, "DELETE", "/v1/cluster/members/99", None, Duration::from_secs(30)).unwrap();
    assert_eq!(missing.status, 400, "{}", missing.text);
    assert!(missing.text.contains("node 99 is not a member"), "{}", missing.text);
    // Its addresses are fixed: openraft would keep the old ones and report success.
    let moved = send(
        &addrs,
        "POST",
        "/v1/cluster/members",
        Some(&json!({ "node_id": 4, "addr": joiner.addr })),
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(moved.status, 400, "{}", moved.text);
    assert!(moved.text.contains("cannot change"), "{}", moved.text);
    // The new member has the state written before it joined.
    let target = applied_revision(&cluster, cluster.leader(Duration::from_secs(5)));
    wait_until("the new member to catch up", Duration::from_secs(20), || {
        let view = try_request(&joiner.addr, "GET", "/v1/cluster", None).ok()?.body;
        (view["applied_revision"].as_u64()? >= target).then_some(())
    });

    let removed =
        send(&addrs, "DELETE", "/v1/cluster/members/4", None, Duration::from_secs(30)).unwrap();
    assert_eq!(removed.status, 200, "{}", removed.text);
    assert_eq!(voters(&removed.body), 3);
    let after = send(
        &addrs,
        "POST",
        "/v1/locks/acquire",
        Some(&json!({ "name": "membership/after", "session_id": session, "wait_ms": 0 })),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(after.status, 200, "the cluster still serves writes: {}", after.text);
    assert!(after.body["token"].as_u64() > before.body["token"].as_u64());
}

/// The leader removed from a 3-node cluster hands leadership over and leads nothing, but keeps
/// its last vote, for itself, and nobody replicates to it any more. It used to look ready for
/// ever (`/readyz` 200, itself as leader in `GET /v1/cluster`), so load balancers kept sending
/// clients to a node that could serve none of them. Now it says it was removed; the other two
/// go on serving, the session and its grant with them.
#[test]
fn a_removed_leader_says_so_and_the_others_go_on() {
    let cluster = start_cluster();
    let removed = cluster.leader(Duration::from_secs(20));
    let addrs = cluster.addrs();
    let session = open_session(&addrs);
    let acquire = |name: &str, addrs: &[String]| {
        send(
            addrs,
            "POST",
            "/v1/locks/acquire",
            Some(&json!({ "name": name, "session_id": session, "wait_ms": 0 })),
            Duration::from_secs(10),
        )
        .unwrap()
    };
    let before = acquire("removal/before", &addrs);
    assert_eq!(before.status, 200, "{}", before.text);

    let path = format!("/v1/cluster/members/{}", removed + 1);
    let answer = send(&addrs, "DELETE", &path, None, Duration::from_secs(30)).unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text);
    let others: Vec<String> =
        (0..3).filter(|index| *index != removed).map(|index| addrs[index].clone()).collect();
    let ready = |addr: &str| try_request(addr, "GET", "/readyz", None).ok();
    wait_until("the removed node to say so", Duration::from_secs(20), || {
        let reply = ready(&addrs[removed])?;
        (reply.status == 503 && reply.body["code"] == "removed").then_some(())
    });
    let view = cluster.view(removed);
    assert!(view["leader_id"].is_null(), "it names no leader: {view}");
    wait_until("the others to be ready", Duration::from_secs(20), || {
        others.iter().all(|addr| ready(addr).is_some_and(|reply| reply.status == 200)).then_some(())
    });
    let after = acquire("removal/after", &others);
    assert_eq!(after.status, 200, "the others serve writes: {}", after.text);
    assert!(after.body["token"].as_u64() > before.body["token"].as_u64());
    let held = send(&others, "GET", "/v1/locks/removal/before", None, Duration::from_secs(5));
    assert_eq!(held.unwrap().body["holder"]["token"], before.body["token"], "the grant lives on");
}

/// Found in an audit: removing a live voter while another was down went through a joint
/// configuration that needed a majority of the voters left, the down one included, so every
/// write stopped until it came back (and the membership lock was held meanwhile). The leader
/// now refuses such a removal at once, naming the silent voter, and writes go on; once that
/// voter answers again, the removal goes through.
#[test]
fn a_removal_that_would_leave_no_answering_majority_is_refused() {
    let cluster = start_cluster();
    let leader = cluster.leader(Duration::from_secs(20));
    let addrs = cluster.addrs();
    let others: Vec<usize> = (0..3).filter(|index| *index != leader).collect();
    let (silent, removed) = (others[0], others[1]);
    cluster.nodes[silent].signal("-STOP");
    // The leader counts a voter silent once a leader lease (the longest election timeout,
    // 2 x ELECTION_TIMEOUT_MS here) passed without its acknowledgement; wait well past it.
    std::thread::sleep(Duration::from_millis(6 * ELECTION_TIMEOUT_MS));
    // Still the leader (the other two form a majority); asked again in case it moved.
    let leader = wait_until("the leader", Duration::from_secs(20), || {
        let view = cluster.view(removed);
        let leader = usize::try_from(view["leader_id"].as_u64()?).ok()?.checked_sub(1)?;
        (leader != silent).then_some(leader)
    });
    let path = format!("/v1/cluster/members/{}", removed + 1);
    let refused = try_request(&addrs[leader], "DELETE", &path, None).expect("an answer");
    assert_eq!(refused.status, 409, "{}", refused.text);
    assert_eq!(refused.body["code"], "voters_not_answering", "{}", refused.text);
    let message = refused.body["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("[{}] have not answered", silent + 1)), "{message}");
    let session = try_request(
        &addrs[leader],
        "POST",
        "/v1/sessions",
        Some(&json!({ "ttl_ms": SESSION_TTL_MS })),
    );
    assert_eq!(session.expect("an answer").status, 200, "writes go on");
    cluster.nodes[silent].signal("-CONT");
    let removal = send(&addrs, "DELETE", &path, None, Duration::from_secs(30)).expect("an answer");
    assert_eq!(removal.status, 200, "{}", removal.text);
}

/// Issue 13, "add_member's check is check-then-act": two adds of one new id with other
/// addresses, sent at once, both passed the check that an existing member keeps its addresses,
/// and openraft kept the first addresses and reported success to both. Membership changes on a
/// node now go one at a time: one add succeeds, the other is refused, and the membership holds
/// the winner's address.
#[test]
fn two_adds_of_one_id_at_once_with_other_addresses_add_one_and_refuse_the_other() {
    let cluster = start_cluster();
    let _ = cluster.leader(Duration::from_secs(20));
    let addrs = cluster.addrs();
    let joiners_dir = temp_dir();
    let joiners: Vec<ServerProcess> = ["a", "b"]
        .iter()
        .map(|which| {
            ServerProcess::start(
                Path::new(env!("CARGO_BIN_EXE_picket")),
                &joiners_dir.path().join(which),
                format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                &["--node-id".to_owned(), "4".to_owned(), "--join".to_owned()],
            )
        })
        .collect();
    let adds: Vec<_> = joiners
        .iter()
        .map(|joiner| {
            let (addrs, addr) = (addrs.clone(), joiner.addr.clone());
            std::thread::spawn(move || {
                let body = json!({ "node_id": 4, "addr": addr });
                send(&addrs, "POST", "/v1/cluster/members", Some(&body), Duration::from_secs(90))
                    .unwrap()
            })
        })
        .collect();
    let replies: Vec<_> = adds.into_iter().map(|add| add.join().expect("an add")).collect();
    let statuses: Vec<u16> = replies.iter().map(|reply| reply.status).collect();
    let winner = statuses.iter().position(|status| *status == 200);
    let texts: Vec<&str> = replies.iter().map(|reply| reply.text.as_str()).collect();
    let Some(winner) = winner else { panic!("neither add succeeded: {texts:?}") };
    let loser = 1 - winner;
    assert_eq!(statuses[loser], 400, "the other add is refused: {texts:?}");
    assert!(replies[loser].text.contains("cannot change"), "{texts:?}");
    let view = send(&addrs, "GET", "/v1/cluster", None, Duration::from_secs(5)).unwrap();
    let member = view.body["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|member| member["node_id"] == 4)
        .cloned()
        .expect("node 4 is a member");
    assert_eq!(member["addr"], joiners[winner].addr.as_str(), "{}", view.text);
}

/// A follower refuses a request with 421 `not_leader` and names the leader three ways: in the
/// body, in a `picket-leader` header, and as a `Location` for the same path on the leader.
#[test]
fn a_follower_names_the_leader_in_the_body_a_header_and_a_location() {
    let cluster = start_cluster();
    let addrs = cluster.addrs();
    // With a 300 ms election timeout a loaded machine may elect again between finding the
    // leader and asking the follower: then the question is asked again.
    let (leader, refused) = (0..5)
        .find_map(|_| {
            let leader = cluster.leader(Duration::from_secs(20));
            let follower = (leader + 1) % addrs.len();
            let refused = picket_testkit::http::request(
                &addrs[follower],
                "POST",
                "/v1/sessions?from=follower",
                Some(&json!({ "ttl_ms": 10_000 })),
            );
            (cluster.agreed_leader() == Some(leader)).then_some((leader, refused))
        })
        .expect("a leader that stays for one request in five tries");
    assert_eq!(refused.status, 421, "{}", refused.text);
    assert_eq!(refused.body["code"], "not_leader");
    assert_eq!(refused.body["outcome"], "not_applied");
    assert_eq!(refused.body["leader"], json!(addrs[leader]));
    assert_eq!(refused.header("picket-leader"), Some(addrs[leader].as_str()));
    let location = format!("//{}/v1/sessions?from=follower", addrs[leader]);
    assert_eq!(refused.header("location"), Some(location.as_str()));
}

/// Waiters queued on one lock take it in turn on a 3-node cluster. Their acquires only queue
/// while another holds the lock, so the leader sends them to the followers together with the
/// release behind them, one request for both (`network/stream.rs`): every grant must still
/// come, with a token above every earlier one, and the replicas must converge.
#[test]
fn waiters_on_one_lock_take_it_in_turn_and_the_replicas_converge() {
    const WAITERS: usize = 4;
    const TURNS: usize = 25;
    let cluster = start_cluster();
    let _leader = cluster.leader(Duration::from_secs(20));
    let addrs = cluster.addrs();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let addrs = addrs.clone();
            std::thread::spawn(move || take_turns(&addrs, TURNS))
        })
        .collect();
    let mut tokens: Vec<u64> =
        waiters.into_iter().flat_map(|waiter| waiter.join().unwrap()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), WAITERS * TURNS, "every grant has a token of its own");
    cluster.wait_converged(Duration::from_secs(10));
}

/// Opens a session with a TTL of 30 s through any of `addrs`; returns its id.
fn open_session(addrs: &[String]) -> u64 {
    let body = json!({ "ttl_ms": 30_000 });
    let reply = send(addrs, "POST", "/v1/sessions", Some(&body), Duration::from_secs(30))
        .expect("a session opens");
    reply.body["session_id"].as_u64().expect("a session id")
}

/// Acquires the lock `turns`, waiting for it, and releases it `turns` times; returns the tokens
/// granted, each above the one before.
fn take_turns(addrs: &[String], turns: usize) -> Vec<u64> {
    let timeout = Duration::from_secs(30);
    let session = open_session(addrs);
    let mut tokens: Vec<u64> = Vec::with_capacity(turns);
    for _ in 0..turns {
        let acquire = json!({ "name": "turns", "session_id": session, "wait_ms": 20_000 });
        let reply = send(addrs, "POST", "/v1/locks/acquire", Some(&acquire), timeout)
            .expect("the acquire is answered");
        assert_eq!(reply.status, 200, "acquire: {}", reply.text);
        let token = reply.body["token"].as_u64().unwrap();
        assert!(tokens.last().is_none_or(|last| token > *last), "token {token} after {tokens:?}");
        tokens.push(token);
        let release = json!({ "name": "turns", "session_id": session, "token": token });
        let reply = send(addrs, "POST", "/v1/locks/release", Some(&release), timeout)
            .expect("the release is answered");
        assert_eq!(reply.status, 200, "release: {}", reply.text);
    }
    tokens
}

/// Every node's view of the cluster id, once all of `addrs` show the same one.
fn agreed_cluster_id(addrs: &[String]) -> Option<String> {
    let ids: Vec<Option<String>> = addrs
        .iter()
        .map(|addr| {
            let view = try_request(addr, "GET", "/v1/cluster", None).ok()?.body;
            view["cluster_id"].as_str().map(str::to_owned)
        })
        .collect();
    let first = ids.first()?.clone()?;
    ids.iter().all(|id| id.as_deref() == Some(first.as_str())).then_some(first)
}

/// No issue (noted since 2026-12-07): a node started on another cluster's data directory at an
/// address this cluster names (a host reused, a directory copied) took part in this cluster's
/// Raft. Without the check below, in this test, cluster A's node 3 won an election in cluster B
/// with its newer log (2 runs of 2) and went on committing with B's nodes, under A's history:
/// Raft tells entries apart only by term, leader and index, which two clusters can share, so
/// no check of committed entries stopped it. Each cluster now has an id in its log, every Raft message carries it, and a node
/// refuses messages of another cluster before Raft sees them: neither side takes the other's
/// messages, B goes on with its two nodes and the stray keeps A's state.
#[test]
fn a_node_of_another_cluster_at_a_members_address_is_refused_both_ways() {
    let binary = Path::new(env!("CARGO_BIN_EXE_picket"));
    let timing: Vec<String> = ["--heartbeat-ms", "50", "--election-timeout-ms", "300"]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
    let mut a = Cluster::start(binary, 3, &timing);
    let _ = a.leader(Duration::from_secs(20));
    let addrs = a.addrs();
    let id_a =
        wait_until("cluster A to be named", Duration::from_secs(20), || agreed_cluster_id(&addrs));
    // A few terms and entries, so that A's node 3 holds a log that is newer by term than B's.
    take_turns(&addrs, 3);
    for _ in 0..2 {
        let leader = a.leader(Duration::from_secs(20));
        a.nodes[leader].kill();
        wait_until("a new leader in A", Duration::from_secs(20), || a.agreed_leader());
        a.nodes[leader].restart();
        take_turns(&addrs, 3);
    }
    a.wait_converged(Duration::from_secs(20));
    let stray_revision = a.view(2)["applied_revision"].as_u64().expect("a revision");
    for node in &mut a.nodes {
        node.kill();
    }

    // Cluster B, on the same addresses, with data directories of its own.
    let b_dir = temp_dir();
    let peers = (0..3).map(|index| format!("{}={}", index + 1, addrs[index])).collect::<Vec<_>>();
    let start_node = |index: usize, data_dir: &Path| {
        let mut args = vec!["--node-id".to_owned(), (index + 1).to_string(), "--peers".to_owned()];
        args.push(peers.join(","));
        args.extend(timing.iter().cloned());
        let listen = addrs[index].parse().expect("a socket address");
        ServerProcess::start(binary, data_dir, listen, &args)
    };
    let mut b: Vec<ServerProcess> = (0..3)
        .map(|index| start_node(index, &b_dir.path().join(format!("node{}", index + 1))))
        .collect();
    let id_b =
        wait_until("cluster B to be named", Duration::from_secs(20), || agreed_cluster_id(&addrs));
    assert_ne!(id_a, id_b, "two clusters, two ids");
    let before = take_turns(&addrs, 2);

    b[2].kill();
    let stray = start_node(2, &a.data_dir(2));
    let others = addrs[..2].to_vec();
    let refused = |addr: &str| {
        try_request(addr, "GET", "/v1/cluster", None).ok()?.body["other_cluster_refused_total"]
            .as_u64()
    };
    wait_until("B's leader and the stray to refuse each other", Duration::from_secs(20), || {
        let by_b = others.iter().filter_map(|addr| refused(addr)).sum::<u64>();
        let by_stray = refused(&stray.addr)?;
        (by_b > 0 && by_stray > 0).then_some(())
    });
    // Several election timeouts in which the stray would have taken part.
    let after = take_turns(&others, 5);
    assert!(after[0] > *before.last().unwrap(), "B goes on: {before:?} then {after:?}");
    std::thread::sleep(Duration::from_millis(1_500));
    let stray_view = try_request(&stray.addr, "GET", "/v1/cluster", None)
        .expect("the stray still runs: it took nothing of B's")
        .body;
    assert_eq!(stray_view["cluster_id"].as_str(), Some(id_a.as_str()), "{stray_view}");
    // At most what A had applied (a restart replays only what the node knew was committed).
    let stray_applied = stray_view["applied_revision"].as_u64().expect("a revision");
    assert!(stray_applied <= stray_revision, "{stray_view}");
    for addr in &others {
        let view = try_request(addr, "GET", "/v1/cluster", None).expect("B's nodes run").body;
        assert_eq!(view["cluster_id"].as_str(), Some(id_b.as_str()), "{view}");
    }
    let last = take_turns(&others, 1);
    assert!(last[0] > *after.last().unwrap());
    drop(stray);
    for node in &mut b {
        node.kill();
    }
}

/// No issue: adding a node that holds another cluster's state (its data directory reused) waited
/// the full 60 s for it to catch up, which it never does (it refuses this cluster's messages),
/// answered `outcome_unknown` and left it a learner. The add now asks the node first, and
/// refuses at once, naming both clusters; the membership is unchanged.
#[test]
fn adding_a_node_of_another_cluster_is_refused_at_once() {
    let cluster = start_cluster();
    let _ = cluster.leader(Duration::from_secs(20));
    let addrs = cluster.addrs();
    let own = wait_until("the cluster to be named", Duration::from_secs(20), || {
        agreed_cluster_id(&addrs)
    });
    // A one-node cluster of its own, as node 4, named too.
    let dir = temp_dir();
    let addr = format!("127.0.0.1:{}", free_port());
    let args =
        vec!["--node-id".to_owned(), "4".to_owned(), "--peers".to_owned(), format!("4={addr}")];
    let other = ServerProcess::start(
        Path::new(env!("CARGO_BIN_EXE_picket")),
        &dir.path().join("node4"),
        addr.parse().expect("an address"),
        &args,
    );
    let theirs = wait_until("the other cluster to be named", Duration::from_secs(20), || {
        agreed_cluster_id(std::slice::from_ref(&other.addr))
    });
    let started = Instant::now();
    let body = json!({ "node_id": 4, "addr": other.addr });
    let answer = send(&addrs, "POST", "/v1/cluster/members", Some(&body), Duration::from_secs(90))
        .expect("the add is answered");
    assert_eq!(answer.status, 400, "{}", answer.text);
    let message = answer.body["message"].as_str().unwrap_or_default();
    assert!(message.contains(&theirs) && message.contains(&own), "{}", answer.text);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refused at once: {:?}",
        started.elapsed()
    );
    let members = cluster.view(0)["members"].as_array().map(Vec::len);
    assert_eq!(members, Some(3), "the membership is unchanged");
}

/// No issue: adding a node under another id than the one it runs with (a typo in the add, or in
/// its `--node-id`) waited the full 60 s for it to catch up, which it never does (it refuses
/// every message meant for another node), and left a learner that never would. The add now asks
/// the node first and refuses at once, naming the id it runs with. And an add asked again of a
/// voter (a retry) answers at once, even while that voter is down: it waited the 60 s too.
#[test]
fn adding_a_node_under_another_id_is_refused_and_a_retried_add_answers_at_once() {
    let cluster = start_cluster();
    let _ = cluster.leader(Duration::from_secs(20));
    let addrs = cluster.addrs();
    let dir = temp_dir();
    let mut node_5 = ServerProcess::start(
        Path::new(env!("CARGO_BIN_EXE_picket")),
        &dir.path().join("node5"),
        format!("127.0.0.1:{}", free_port()).parse().expect("an address"),
        &["--node-id".to_owned(), "5".to_owned(), "--join".to_owned()],
    );
    let node_5_addr = node_5.addr.clone();
    let add = |node_id: u64| {
        let started = Instant::now();
        let body = json!({ "node_id": node_id, "addr": node_5_addr });
        let answer =
            send(&addrs, "POST", "/v1/cluster/members", Some(&body), Duration::from_secs(90))
                .expect("the add is answered");
        (answer, started.elapsed())
    };
    let (answer, took) = add(4);
    assert_eq!(answer.status, 400, "{}", answer.text);
    let message = answer.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("is node 5, not node 4"), "{}", answer.text);
    assert!(took < Duration::from_secs(20), "refused at once: {took:?}");
    let members = cluster.view(0)["members"].as_array().map(Vec::len);
    assert_eq!(members, Some(3), "the membership is unchanged");
    let (answer, _) = add(5);
    assert_eq!(answer.status, 200, "added under its own id: {}", answer.text);
    node_5.kill();
    let (answer, took) = add(5);
    assert_eq!(answer.status, 200, "a retry of a voter's add: {}", answer.text);
    assert!(took < Duration::from_secs(20), "answered at once while it is down: {took:?}");
    let node_5 = answer.body["members"]
        .as_array()
        .and_then(|members| members.iter().find(|member| member["node_id"] == 5).cloned());
    assert_eq!(node_5.map(|member| member["voter"].clone()), Some(json!(true)));
}

/// No issue (found with the test above): openraft's wait for a new learner counts it caught up
/// when the leader's log is within 5,000 entries of what it matched, even if it matched
/// nothing, so on a young cluster a node never reached (not started yet, a wrong address) was
/// made a voter at once, and every quorum counted it from then on. The add now waits until the
/// node has acknowledged the entry that made it a learner (or answers `outcome_unknown` after
/// 60 s, the node left a learner).
#[test]
fn a_node_never_reached_is_not_made_a_voter() {
    let cluster = start_cluster();
    let leader = cluster.leader(Duration::from_secs(20));
    let addrs = cluster.addrs();
    let nowhere = format!("127.0.0.1:{}", free_port());
    let body = json!({ "node_id": 4, "addr": nowhere });
    let (answered, answer) = std::sync::mpsc::channel();
    let adding = addrs.clone();
    std::thread::spawn(move || {
        let reply =
            send(&adding, "POST", "/v1/cluster/members", Some(&body), Duration::from_secs(90));
        let _ = answered.send(reply.map(|reply| reply.text));
    });
    let node_4 = || {
        let view = cluster.view(leader);
        view["members"].as_array()?.iter().find(|member| member["node_id"] == 4).cloned()
    };
    wait_until("node 4 to be a learner", Duration::from_secs(20), node_4);
    // Many heartbeats and election timeouts later, it is still only a learner.
    std::thread::sleep(Duration::from_secs(3));
    let member = node_4().expect("node 4 stays in the membership");
    assert_eq!(member["voter"], false, "never reached, never a voter: {member}");
    assert!(answer.try_recv().is_err(), "the add still waits for node 4");
}
