//! The Rust client against a real server: guards, tokens across holders, `lost()` on
//! revocation and on a server that stops answering for longer than the TTL, release on drop,
//! and FIFO across three clients.

use picket_client::{Client, ErrorCode, LostReason, Released, SessionId};
use picket_testkit::ServerProcess;
use std::path::Path;
use std::time::{Duration, Instant};

async fn start() -> (tempfile::TempDir, ServerProcess, Client) {
    let (dir, server) = ServerProcess::start_ready(Path::new(env!("CARGO_BIN_EXE_picket")), &[]);
    let client = Client::connect([server.addr.clone()]).await.unwrap();
    (dir, server, client)
}

/// Successive holders of one lock get strictly growing tokens; dropping a guard releases.
#[tokio::test]
async fn tokens_grow_across_holders_and_drop_releases() {
    let (_dir, _server, client) = start().await;
    let mut last = 0;
    for _ in 0..5 {
        let session = client.session(Duration::from_secs(10)).await.unwrap();
        let guard = session.try_lock("shared").await.unwrap();
        assert!(guard.token() > last);
        assert_eq!(guard.sequencer().to_string(), format!("p1.{}.shared", guard.token()));
        last = guard.token();
        drop(guard);
        // Dropping released it: the next holder can take it with a try.
        let deadline = Instant::now() + Duration::from_secs(5);
        while client.lock_info("shared").await.unwrap().holder.is_some() {
            assert!(Instant::now() < deadline, "the dropped guard was not released");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let held = session.try_lock("busy").await.unwrap();
    let other = client.session(Duration::from_secs(10)).await.unwrap();
    let refused = other.try_lock("busy").await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::LockBusy));
    assert_eq!(refused.holder_token(), Some(held.token()));
    assert!(refused.to_string().contains(&held.token().to_string()));
}

/// A release says whether it ended the grant, or the grant had ended before it arrived (here
/// released behind the guard's back, as an operator's `picket release` would).
#[tokio::test]
async fn a_release_says_whether_it_ended_the_grant() {
    let (_dir, _server, client) = start().await;
    let session = client.session(Duration::from_secs(30)).await.unwrap();
    let guard = session.try_lock("said").await.unwrap();
    assert_eq!(guard.release().await.unwrap(), Released::Now);
    let guard = session.try_lock("said").await.unwrap();
    let behind = client.release_in(session.id(), "said", guard.token()).await.unwrap();
    assert_eq!(behind, Released::Now);
    assert_eq!(guard.release().await.unwrap(), Released::Earlier);
}

/// An operator's revocation reaches the holder's `lost()` at once, not at the next keepalive:
/// with a TTL of two minutes the first keepalive goes out after 40 s, and `lost()` must fire
/// well before it. (This asserted `< 5 s` right after a 5 s timeout, which could not fail, with
/// a keepalive every 10 s.)
#[tokio::test]
async fn lost_fires_when_the_session_is_revoked() {
    let (_dir, _server, client) = start().await;
    let session = client.session(Duration::from_secs(120)).await.unwrap();
    let guard = session.lock("revoked").await.unwrap();
    client.revoke_session(session.id()).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("lost() fired before the first keepalive could tell");
    assert_eq!(reason, LostReason::Revoked);
    assert_eq!(session.lost_reason(), Some(LostReason::Revoked));
    assert_eq!(
        session.try_lock("other").await.unwrap_err().to_string(),
        "the session is lost (Revoked): open a new session"
    );
}

/// Issue 14, point 3: the client's watch stream broke, and the session was revoked before it
/// reconnected: the revocation's event went by unseen. Reconnecting, the watcher asks whether
/// each of its sessions lives and each grant is still held, and marks what is gone, so
/// `lost()` fires at the reconnect, not at the next keepalive (40 s away with this TTL). Before
/// e628ef5 the watcher only subscribed again and the holder learnt at the keepalive.
#[tokio::test]
async fn point_3_a_loss_missed_while_the_watch_was_cut_is_found_on_reconnect() {
    let (_dir, server, direct) = start().await;
    let proxy = picket_testkit::TcpProxy::start(server.addr.clone()).await;
    let client = Client::connect([proxy.addr.clone()]).await.unwrap();
    // A session is returned once the client's watch stream covers it.
    let session = client.session(Duration::from_secs(120)).await.unwrap();
    let guard = session.lock("missed").await.unwrap();
    proxy.block(true);
    direct.revoke_session(session.id()).await.unwrap();
    proxy.block(false);
    let reason = tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("lost() fired at the reconnect, before the first keepalive");
    // The recheck learns only that the session is gone, not how.
    assert_eq!(reason, LostReason::Expired);
}

/// Issue 14, point 3: a node that installs a snapshot cannot replay the events the snapshot
/// skipped, and tells its watch streams `resync`; the client's watcher dropped that message, so
/// a revocation inside the snapshot reached the holder only at its next keepalive. Here the
/// client watches through the leader, which is stopped while the others elect a new leader,
/// revoke the session and compact their logs past it; resumed, it installs a snapshot, and
/// `lost()` fires at the resync, long before the first keepalive (40 s with this TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn point_3_a_loss_inside_an_installed_snapshot_is_found_on_resync() {
    let args: Vec<String> =
        ["--heartbeat-ms", "50", "--election-timeout-ms", "300", "--snapshot-every", "50"]
            .iter()
            .chain(&["--keep-entries", "5"])
            .map(|arg| (*arg).to_owned())
            .collect();
    let cluster =
        picket_testkit::cluster::Cluster::start(Path::new(env!("CARGO_BIN_EXE_picket")), 3, &args);
    let addrs = cluster.addrs();
    let old = cluster.leader(Duration::from_secs(20));
    let client = Client::connect([addrs[old].clone()]).await.unwrap();
    let session = client.session(Duration::from_secs(120)).await.unwrap();
    let guard = session.lock("resync").await.unwrap();
    let index_at_stop = cluster.applied_log_index(old);
    cluster.nodes[old].signal("-STOP");
    let others: Vec<String> =
        (0..3).filter(|index| *index != old).map(|index| addrs[index].clone()).collect();
    // To whichever of the two leads now, never to the stopped node they may still name.
    let send = |method: &str, path: &str, body: Option<&serde_json::Value>| {
        let what = format!("{method} {path} on the new leader");
        picket_testkit::wait_until(&what, Duration::from_secs(20), || {
            others.iter().find_map(|addr| {
                let reply = picket_testkit::http::try_request(addr, method, path, body).ok()?;
                (reply.body["code"] != "not_leader" && reply.status != 503).then_some(reply)
            })
        })
    };
    let revoked = send("POST", &format!("/v1/sessions/{}/revoke", session.id()), None);
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    // Enough entries for the new leader to snapshot and purge past the stopped node.
    let new = (0..3).find(|index| *index != old && cluster.view(*index)["role"] == "leader");
    let new = new.expect("a new leader");
    while cluster.view(new)["purged_log_index"].as_u64().unwrap_or(0) <= index_at_stop + 50 {
        let opened = send("POST", "/v1/sessions", Some(&serde_json::json!({ "ttl_ms": 60_000 })));
        let id = opened.body["session_id"].as_u64().expect("a session");
        send("DELETE", &format!("/v1/sessions/{id}"), None);
    }
    cluster.nodes[old].signal("-CONT");
    let reason = tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("lost() fired at the resync, before the first keepalive");
    // The recheck learns only that the session is gone, not how.
    assert_eq!(reason, LostReason::Expired);
    assert!(
        cluster.view(old)["snapshot_log_index"].as_u64().unwrap_or(0) > index_at_stop,
        "the old leader caught up through a snapshot"
    );
}

/// A server that stops answering (SIGSTOP) for longer than the TTL: the client cannot confirm
/// its session and `lost()` fires by its own clock, within the TTL of the last confirmed
/// keepalive.
#[tokio::test]
async fn lost_fires_when_the_server_is_stopped_longer_than_the_ttl() {
    let (_dir, server, client) = start().await;
    let ttl = Duration::from_millis(1_500);
    let session = client.session(ttl).await.unwrap();
    let guard = session.lock("paused").await.unwrap();
    // Wait for a keepalive to be confirmed first (the lease's end moves on), not for a guess.
    let opened_lease_end = Instant::now() + session.lease_remaining();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() + session.lease_remaining() < opened_lease_end + ttl / 6 {
        assert!(Instant::now() < deadline, "no keepalive was confirmed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.signal("-STOP");
    let stopped_at = Instant::now();
    let reason =
        tokio::time::timeout(Duration::from_secs(10), guard.lost()).await.expect("lost() fired");
    let after = stopped_at.elapsed();
    server.signal("-CONT");
    assert_eq!(reason, LostReason::Unconfirmed);
    assert!(
        after <= ttl + Duration::from_millis(500),
        "lost() fired {after:?} after the server stopped"
    );
}

/// Three clients wait for one lock and get it in the order they asked, each with a greater
/// token than the last.
#[tokio::test]
async fn waiters_are_served_in_fifo_order_across_clients() {
    let (_dir, server, client) = start().await;
    let holder = client.session(Duration::from_secs(10)).await.unwrap();
    let first = holder.lock("fifo").await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for index in 0..3_u64 {
        let waiting = Client::connect([server.addr.clone()]).await.unwrap();
        // Queue strictly one after another.
        let deadline = Instant::now() + Duration::from_secs(5);
        while client.lock_info("fifo").await.unwrap().waiters.len() as u64 != index {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let order_tx = order_tx.clone();
        tasks.push(tokio::spawn(async move {
            let session = waiting.session(Duration::from_secs(10)).await.unwrap();
            let guard = session.lock("fifo").await.unwrap();
            order_tx.send((index, guard.token())).unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await.unwrap();
        }));
        let deadline = Instant::now() + Duration::from_secs(5);
        while client.lock_info("fifo").await.unwrap().waiters.len() as u64 != index + 1 {
            assert!(Instant::now() < deadline, "waiter {index} never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let first_token = first.token();
    first.release().await.unwrap();
    let mut last = first_token;
    for expected in 0..3 {
        let (index, token) = order_rx.recv().await.unwrap();
        assert_eq!(index, expected, "granted out of order");
        assert!(token > last);
        last = token;
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// A client pointed at nothing says so in words a person can act on, and says it once every
/// endpoint refused the connection a few times, not after its retry window (an hour here; the
/// guard below only keeps a broken build from hanging the suite).
#[tokio::test]
async fn connecting_to_nothing_says_so_at_once_not_after_the_retry_window() {
    let port = picket_testkit::free_port();
    let config =
        picket_client::ClientConfig { retry_for: Duration::from_secs(3_600), ..Default::default() };
    let connecting = Client::connect_with([format!("127.0.0.1:{port}")], config);
    let error = tokio::time::timeout(Duration::from_secs(120), connecting)
        .await
        .expect("gave up before its retry window ran out")
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains(&format!("no Picket server at 127.0.0.1:{port}")), "{message}");
    assert!(message.contains("picket serve"), "{message}");
}

/// Regression: a first endpoint that knows no leader is passed over for the next. Here it is a
/// node started with `--join` and never added; a node cut off from the others, or one removed
/// from the cluster (it keeps its last vote, for itself), answers the same. The client used to
/// ask that same endpoint again after each such answer, so every call failed once `retry_for`
/// ran out although the next endpoint was the leader.
#[tokio::test]
async fn a_first_endpoint_that_knows_no_leader_is_passed_over_for_the_next() {
    let binary = Path::new(env!("CARGO_BIN_EXE_picket"));
    let (_dir, leader) = ServerProcess::start_ready(binary, &[]);
    let lone_dir = picket_testkit::temp_dir();
    let listen = format!("127.0.0.1:{}", picket_testkit::free_port()).parse().expect("an address");
    let join = ["--node-id", "2", "--join"].map(str::to_owned);
    let lone = ServerProcess::start(binary, &lone_dir.path().join("node2"), listen, &join);
    picket_testkit::wait_until("the lone node to answer", Duration::from_secs(10), || {
        picket_testkit::http::try_request(&lone.addr, "GET", "/v1/cluster", None).ok()
    });
    let config =
        picket_client::ClientConfig { retry_for: Duration::from_secs(5), ..Default::default() };
    let client = Client::connect_with([lone.addr.clone(), leader.addr.clone()], config)
        .await
        .expect("the client connects");
    let session = client.session(Duration::from_secs(30)).await.expect("the leader was found");
    let guard = session.try_lock("passed-over").await.expect("the leader grants");
    assert_eq!(guard.release().await.unwrap(), Released::Now);
}

/// Regression: each session used to hold an HTTP/2 stream of its own for its watch, and a server
/// allows 200 concurrent streams per connection, so the 201st session on one client stalled.
/// Sessions now share their client's watch streams: 400 sessions open on one client, and
/// revoking one still reaches its `lost()` at once, whichever stream follows it (the oldest
/// session's stream was merged many times over, the newest one's is a fresh piece).
#[tokio::test]
async fn regression_more_sessions_than_http2_streams_per_connection() {
    let (_dir, _server, client) = start().await;
    let mut sessions = Vec::new();
    for _ in 0..400 {
        sessions.push(client.session(Duration::from_secs(30)).await.unwrap());
    }
    for index in [0, 255, 399] {
        let session = &sessions[index];
        let guard = session.try_lock(&format!("many/{index}")).await.unwrap();
        client.revoke_session(session.id()).await.unwrap();
        let reason =
            tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("lost() fired");
        assert_eq!(reason, LostReason::Revoked, "session {index}");
    }
    assert!(sessions[1].lost_reason().is_none(), "the other sessions live on");
}

/// The client keeps one HTTP/2 connection per endpoint and opens a new one when it closes: after
/// the server is killed and restarted on its address, the same client and session go on, and the
/// next holder's token is greater than any token issued before the crash.
#[tokio::test]
async fn the_client_reconnects_after_the_server_restarts() {
    let (_dir, mut server, client) = start().await;
    let session = client.session(Duration::from_secs(30)).await.unwrap();
    let before = session.lock("restart/a").await.unwrap();
    let token_before = before.token();
    // Held across the crash; dropping the guard would send a release to a dead server.
    std::mem::forget(before);
    server.restart();
    let after = session.lock("restart/b").await.expect("the client reconnected");
    assert!(after.token() > token_before, "{} after {token_before}", after.token());
    after.release().await.unwrap();
}

/// A TCP proxy in front of a node that can stop passing the node's replies on: the requests
/// still reach the node, the answers never reach the client (a network that loses one
/// direction, or replies lost as a connection breaks). It can also drop the requests, cutting
/// the client off from the node altogether, and pass everything again afterwards.
struct ReplyDroppingProxy {
    addr: String,
    dropping_replies: std::sync::Arc<std::sync::atomic::AtomicBool>,
    dropping_requests: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ReplyDroppingProxy {
    async fn start(target: &str) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let dropping_replies = Arc::new(AtomicBool::new(false));
        let dropping_requests = Arc::new(AtomicBool::new(false));
        let (target, replies, requests) =
            (target.to_owned(), dropping_replies.clone(), dropping_requests.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else { continue };
                let (from_client, to_client) = inbound.into_split();
                let (from_node, to_node) = outbound.into_split();
                tokio::spawn(Self::pass(from_client, to_node, requests.clone()));
                tokio::spawn(Self::pass(from_node, to_client, replies.clone()));
            }
        });
        Self { addr, dropping_replies, dropping_requests }
    }

    /// Copies `from` to `to`, dropping what arrives while `dropping` is set.
    async fn pass(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        dropping: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buffer = vec![0_u8; 16 * 1024];
        while let Ok(read) = from.read(&mut buffer).await {
            if read == 0 {
                break;
            }
            if !dropping.load(std::sync::atomic::Ordering::SeqCst)
                && to.write_all(&buffer[..read]).await.is_err()
            {
                break;
            }
        }
    }

    fn drop_replies(&self) {
        self.dropping_replies.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Drops the requests too (`true`), or passes both ways again (`false`).
    fn cut(&self, cut: bool) {
        self.dropping_requests.store(cut, std::sync::atomic::Ordering::SeqCst);
        self.dropping_replies.store(cut, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A session with a 60 s TTL, opened by a client whose request timeout is short (a few hundred
/// ms, the subject of the tests that use it). An open is not retried once sent, so a loaded
/// machine that answers one late would fail the test before it begins: the test tries again
/// (a session given up on holds nothing and expires).
async fn open_session_despite_short_timeouts(client: &Client) -> picket_client::Session {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match client.session(Duration::from_secs(60)).await {
            Ok(session) => return session,
            Err(error) => assert!(attempts < 5, "no session opened in {attempts} tries: {error}"),
        }
    }
}

/// A node, a client behind a [`ReplyDroppingProxy`] to it whose retries last `retry_for` and
/// attempts `request_timeout`, a session of that client (60 s TTL), and a client straight to
/// the node to look at its locks. Its fields drop in order: the session first, the data
/// directory last (a test binds them in the opposite order, as locals drop last first).
struct BehindProxy {
    session: picket_client::Session,
    _client: Client,
    proxy: ReplyDroppingProxy,
    direct: Client,
    _server: ServerProcess,
    _dir: tempfile::TempDir,
}

async fn behind_proxy(retry_for: Duration, request_timeout: Duration) -> BehindProxy {
    let (dir, server, direct) = start().await;
    let proxy = ReplyDroppingProxy::start(&server.addr).await;
    let config = picket_client::ClientConfig { retry_for, request_timeout, ..Default::default() };
    let client = Client::connect_with([proxy.addr.clone()], config).await.unwrap();
    let session = open_session_despite_short_timeouts(&client).await;
    BehindProxy { session, _client: client, proxy, direct, _server: server, _dir: dir }
}

/// Issue 14: the abandon of a given-up acquire is not itself given up while the session may
/// live on. The node granted the acquire, then the client was cut off from it for longer than
/// its `retry_for`, so the abandon's first round of retries failed too; once the link is back,
/// the abandon still lands and frees the lock, long before the session's 60 s TTL would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandon_outlasts_an_outage_longer_than_its_retries() {
    let BehindProxy { _dir, _server, direct, proxy, _client, session } =
        behind_proxy(Duration::from_secs(1), Duration::from_millis(300)).await;
    proxy.drop_replies();
    let cut_once_granted = async {
        let deadline = Instant::now() + Duration::from_secs(5);
        while direct.lock_info("outlasted").await.unwrap().holder_session()
            != Some(SessionId(session.id()))
        {
            assert!(Instant::now() < deadline, "the acquire never reached the node");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        proxy.cut(true);
    };
    let (given_up, ()) = tokio::join!(session.try_lock("outlasted"), cut_once_granted);
    given_up.expect_err("no answer arrives");
    // The outage: three times the client's retry budget, so the abandon's first round fails.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        direct.lock_info("outlasted").await.unwrap().holder_session(),
        Some(SessionId(session.id())),
        "nothing reached the node during the outage"
    );
    proxy.cut(false);
    let deadline = Instant::now() + Duration::from_secs(15);
    while direct.lock_info("outlasted").await.unwrap().holder.is_some() {
        assert!(Instant::now() < deadline, "the given-up acquire's grant is still held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 14: an acquire the node granted but whose answers were all lost, so that the client
/// gave up on it, is abandoned by the client: the session, which its keepalives keep alive at
/// the node, does not hold a lock that nobody knows it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_given_up_unanswered_leaves_no_ghost_holder() {
    let BehindProxy { _dir, _server, direct, proxy, _client, session } =
        behind_proxy(Duration::from_secs(2), Duration::from_millis(500)).await;
    proxy.drop_replies();
    let given_up = session.try_lock("unanswered").await.expect_err("no answer arrives");
    // The node granted it: the request arrived, only the answers were lost.
    let held_by = direct.lock_info("unanswered").await.unwrap().holder_session();
    assert!(held_by.is_none_or(|held_by| held_by.0 == session.id()), "{held_by:?}: {given_up}");
    // The client's abandon reaches the node (requests still do) and frees the lock, long
    // before the session's 60 s TTL could.
    let deadline = Instant::now() + Duration::from_secs(15);
    while direct.lock_info("unanswered").await.unwrap().holder.is_some() {
        assert!(Instant::now() < deadline, "the given-up acquire's grant is still held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A release given up on (its future dropped, here by a timeout) while nothing reached the
/// node still ends the grant: the guard it consumed releases it in the background once the
/// node can be reached. The guard was marked released before the request went out, so its
/// drop sent nothing, and the session, kept alive by its keepalives, held the lock with no
/// guard left to know it: a ghost holder until the session ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_given_up_on_still_ends_the_grant() {
    let BehindProxy { _dir, _server, direct, proxy, _client, session } =
        behind_proxy(Duration::from_secs(10), Duration::from_millis(500)).await;
    let guard = session.try_lock("given-up-release").await.unwrap();
    proxy.cut(true);
    tokio::time::timeout(Duration::from_millis(300), guard.release())
        .await
        .expect_err("nothing answers while the link is cut");
    assert_eq!(
        direct.lock_info("given-up-release").await.unwrap().holder_session(),
        Some(SessionId(session.id())),
        "nothing reached the node"
    );
    proxy.cut(false);
    let deadline = Instant::now() + Duration::from_secs(15);
    while direct.lock_info("given-up-release").await.unwrap().holder.is_some() {
        assert!(Instant::now() < deadline, "the grant of the given-up release is still held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Many acquires given up at once during an outage are all abandoned once it ends. The node
/// granted every one (only the answers were lost), then the client was cut off from it for
/// longer than its retries: the client's one abandons task keeps 16 on their way at a time,
/// tries again those that do not get through, and frees every lock long before the session's
/// 60 s TTL would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_acquires_given_up_during_an_outage_are_all_abandoned_when_it_ends() {
    let BehindProxy { _dir, _server, direct, proxy, _client, session } =
        behind_proxy(Duration::from_secs(5), Duration::from_millis(500)).await;
    proxy.drop_replies();
    let names: Vec<String> = (0..40).map(|n| format!("given-up/{n}")).collect();
    let holder = Some(SessionId(session.id()));
    let cut_once_granted = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        for name in &names {
            while direct.lock_info(name).await.unwrap().holder_session() != holder {
                assert!(Instant::now() < deadline, "{name}: the acquire never reached the node");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        proxy.cut(true);
    };
    let tries = futures_util::future::join_all(names.iter().map(|name| session.try_lock(name)));
    let (given_up, ()) = tokio::join!(tries, cut_once_granted);
    for outcome in given_up {
        outcome.expect_err("no answer arrives");
    }
    // The outage: past the client's retries (5 s, long enough for the look above to see all
    // 40 grants before any acquire gives up), so the abandons' first tries fail too.
    tokio::time::sleep(Duration::from_secs(6)).await;
    for name in &names {
        let held_by = direct.lock_info(name).await.unwrap().holder_session();
        assert_eq!(held_by, holder, "{name}: something reached the node during the outage");
    }
    proxy.cut(false);
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in &names {
        while direct.lock_info(name).await.unwrap().holder.is_some() {
            assert!(
                Instant::now() < deadline,
                "{name}: the given-up acquire's grant is still held"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The client finds the leader from a follower's refusal and follows the next leader when that
/// one is killed: a follower listed first answers the client's first look at the cluster, and
/// refuses the session's open with the leader's name, which the client follows; once that
/// leader is gone, the client moves on through the other endpoints until one names the new
/// leader, and the same session and client go on there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_finds_the_leader_and_follows_the_next_one_when_it_stops() {
    let binary = Path::new(env!("CARGO_BIN_EXE_picket"));
    let mut cluster = picket_testkit::cluster::Cluster::start(binary, 3, &[]);
    let leader = cluster.leader(Duration::from_secs(30));
    let addrs = cluster.addrs();
    let endpoints: Vec<String> = (1..=3).map(|step| addrs[(leader + step) % 3].clone()).collect();
    let client = Client::connect(endpoints).await.unwrap();
    let (session, last_token) = tokio::time::timeout(Duration::from_secs(60), async {
        let session = client.session(Duration::from_secs(60)).await.unwrap();
        let mut last_token = 0;
        for _ in 0..3 {
            let guard = session.try_lock("followed").await.unwrap();
            assert!(guard.token() > last_token);
            last_token = guard.token();
            assert_eq!(guard.release().await.unwrap(), Released::Now);
        }
        (session, last_token)
    })
    .await
    .expect("finding the leader took over a minute");

    cluster.nodes[leader].kill();
    let next = cluster.leader(Duration::from_secs(30));
    assert_ne!(next, leader);
    // The session lives on under the new leader (a new leader gives every session a full TTL).
    tokio::time::timeout(Duration::from_secs(60), async {
        let guard = session.try_lock("followed").await.unwrap();
        assert!(guard.token() > last_token, "{} after {last_token}", guard.token());
        assert_eq!(guard.release().await.unwrap(), Released::Now);
        let other = client.session(Duration::from_secs(60)).await.unwrap();
        assert!(other.try_lock("followed").await.unwrap().token() > last_token);
    })
    .await
    .expect("following the next leader took over a minute");
}

/// A gauge of the server's `/metrics`.
fn gauge(addr: &str, name: &str) -> u64 {
    let text = picket_testkit::http::get(addr, "/metrics").text;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Waits at most 30 s for the node's gauge `name` to be `wanted`.
async fn gauge_until(addr: &str, name: &str, wanted: impl Fn(u64) -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !wanted(gauge(addr, name)) {
        assert!(Instant::now() < deadline, "{what}: {name} {}", gauge(addr, name));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Found in review (2026-12-06): the client's watcher kept every stream it ever opened for its
/// sessions, closed or not, for as long as the client lived. A long-lived client that opens
/// and closes sessions held ever more places on the node (`--max-watch-streams`) and on its
/// connection (past 200 streams, each further open waited out the cover timeout). A stream
/// whose sessions are all gone now ends, and the client goes on watching the ones it opens.
#[tokio::test]
async fn a_clients_watch_streams_end_once_its_sessions_are_closed() {
    let (_dir, server, client) = start().await;
    let addr = server.addr.clone();
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(client.session(Duration::from_secs(60)).await.unwrap());
    }
    let streams = "picket_watch_streams";
    gauge_until(&addr, "picket_watched_sessions", |n| n == 3, "the client watches them").await;
    for session in sessions {
        session.close().await.unwrap();
    }
    gauge_until(&addr, streams, |n| n == 0, "the closed sessions' streams").await;
    assert_eq!(gauge(&addr, "picket_watched_sessions"), 0);
    let session = client.session(Duration::from_secs(60)).await.unwrap();
    gauge_until(&addr, "picket_watched_sessions", |n| n == 1, "the new session's stream").await;
    let revoked = picket_testkit::http::post(
        &addr,
        &format!("/v1/sessions/{}/revoke", session.id()),
        &serde_json::json!({}),
    );
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    let lost = tokio::time::timeout(Duration::from_secs(10), session.lost()).await;
    assert!(lost.is_ok(), "the new session's stream tells it of its revocation");
}
