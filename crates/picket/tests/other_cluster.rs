//! A client keeps to one cluster. Session ids are revisions, so two clusters hand out the same
//! ids, and a client whose endpoints name nodes of two clusters (a host reused, a copied
//! configuration) used to send a session's calls to whichever answered: a release there ended
//! another client's grant, a keepalive kept another client's session alive. Each connection the
//! client opens now first asks its node which cluster it belongs to, and the client uses only
//! the nodes of its own, or of a cluster restored from a backup of it. Real processes, on free
//! loopback ports.

use picket_client::{Client, ClientConfig, ClientError, ClientTls};
use picket_proto::connection::{Connection, Protocol};
use picket_proto::v1;
use picket_testkit::pki::TestPki;
use picket_testkit::{ServerProcess, http, temp_dir, wait_until};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const PICKET: &str = env!("CARGO_BIN_EXE_picket");

/// The id the cluster of the node at `addr` was named, once it is (and, when `origin` is
/// given, once the node knows it was restored from that cluster).
fn cluster_id(addr: &str, origin: Option<&str>) -> String {
    wait_until("the cluster to be named", Duration::from_secs(20), || {
        let view = http::try_request(addr, "GET", "/v1/cluster", None).ok()?.body;
        let named = view["cluster_id"].as_str()?.to_owned();
        let restored_from = view["restored_from_cluster_id"].as_str();
        (origin.is_none() || restored_from == origin).then_some(named)
    })
}

/// `method path` at `addr` with `picket-expect-cluster: expected`.
fn expecting(
    addr: &str,
    expected: &str,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> http::Reply {
    let caller = http::As {
        headers: vec![("picket-expect-cluster".to_owned(), expected.to_owned())],
        ..http::As::default()
    };
    http::request_as(addr, &caller, method, path, body).expect("the node answers")
}

fn quick() -> ClientConfig {
    ClientConfig {
        retry_for: Duration::from_secs(3),
        request_timeout: Duration::from_secs(2),
        ..ClientConfig::default()
    }
}

/// Alice's client reached cluster A first; once A is down, the only node it can reach is one of
/// cluster B. A release naming B's session and grant (as a release of a session with the same
/// id would) is not sent there, and says why; B's grant stands. A client given a cluster's id
/// refuses the nodes of any other from its first call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_never_sends_a_call_to_a_node_of_another_cluster() {
    let (_a_dir, mut a) = ServerProcess::start_ready(Path::new(PICKET), &[]);
    let (_b_dir, b) = ServerProcess::start_ready(Path::new(PICKET), &[]);
    let (a_id, b_id) = (cluster_id(&a.addr, None), cluster_id(&b.addr, None));
    assert_ne!(a_id, b_id);

    let bob = Client::connect([b.addr.clone()]).await.unwrap();
    let bobs = bob.session(Duration::from_secs(60)).await.unwrap();
    let held = bobs.try_lock("shared").await.unwrap();

    // A retry window far longer than the bound below: the refusal must come from the client
    // finding no node of its cluster, not from the window running out.
    let patient = ClientConfig { retry_for: Duration::from_secs(30), ..quick() };
    let alice = Client::connect_with([a.addr.clone(), b.addr.clone()], patient).await.unwrap();
    assert_eq!(alice.cluster_id().as_deref(), Some(a_id.as_str()), "the first cluster reached");
    let alices = alice.session(Duration::from_secs(60)).await.unwrap();
    alices.try_lock("mine").await.unwrap();

    let given = ClientConfig { cluster_id: Some(b_id.clone()), ..quick() };
    let refused = Client::connect_with([a.addr.clone()], given).await.unwrap_err();
    assert!(matches!(refused, ClientError::OtherCluster { .. }), "{refused}");
    let message = refused.to_string();
    assert!(
        message.contains(&format!("belongs to cluster {a_id}, not to cluster {b_id}")),
        "{message}"
    );
    assert!(message.contains("the one this client was given"), "{message}");
    let malformed = ClientConfig { cluster_id: Some("B".to_owned()), ..quick() };
    let refused = Client::connect_with([a.addr.clone()], malformed).await.unwrap_err();
    assert!(matches!(refused, ClientError::InvalidArgument(_)), "{refused}");

    // Over HTTP, a request that names the cluster it expects is refused by a node of another,
    // and every answer names the node's cluster.
    let opened = expecting(
        &b.addr,
        &b_id,
        "POST",
        "/v1/sessions",
        Some(&serde_json::json!({ "ttl_ms": 10_000 })),
    );
    assert_eq!(opened.status, 200, "{}", opened.text);
    assert_eq!(opened.header("picket-cluster-id"), Some(b_id.as_str()));
    let sessions_before = http::get(&b.addr, "/v1/sessions").body;
    let body =
        serde_json::json!({ "name": "shared", "session_id": bobs.id(), "token": held.token() });
    let refused = expecting(&b.addr, &a_id, "POST", "/v1/locks/release", Some(&body));
    assert_eq!(
        (refused.status, refused.body["code"].as_str()),
        (412, Some("other_cluster")),
        "{}",
        refused.text
    );
    assert_eq!(refused.body["outcome"], "not_applied");
    assert!(
        refused.text.contains(&format!("belongs to cluster {b_id}, not to cluster {a_id}")),
        "{}",
        refused.text
    );
    let opened = expecting(
        &b.addr,
        &a_id,
        "POST",
        "/v1/sessions",
        Some(&serde_json::json!({ "ttl_ms": 10_000 })),
    );
    assert_eq!(opened.status, 412, "{}", opened.text);
    assert_eq!(http::get(&b.addr, "/v1/sessions").body, sessions_before, "nothing was applied");
    // A value no cluster has, long or not ASCII, is refused the same way, and the refusal
    // quotes no more of it than a cluster id's length and a little.
    for hostile in ["z".repeat(2_000), "é".repeat(40)] {
        let refused = expecting(&b.addr, &hostile, "GET", "/v1/locks/shared", None);
        assert_eq!(refused.status, 412, "{}", refused.text);
        assert_eq!(refused.body["code"], "other_cluster", "{}", refused.text);
        assert!(refused.text.len() < 1_000, "{} bytes", refused.text.len());
    }

    // Over gRPC too, on the wire protocol's direct path and on HTTP/2.
    for protocol in [Protocol::Wire, Protocol::Grpc] {
        let connection =
            Connection::open_with(&b.addr, Duration::from_secs(5), 1 << 22, None, protocol)
                .await
                .expect("connected");
        let mut release = tonic::Request::new(v1::ReleaseRequest {
            name: "shared".to_owned(),
            session_id: bobs.id(),
            token: held.token(),
        });
        release.metadata_mut().insert("picket-expect-cluster", a_id.parse().unwrap());
        let refused = connection.grpc().release(release).await.expect_err("refused");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{protocol:?}: {refused:?}");
        let code = refused.metadata().get("picket-error-code").map(|code| code.to_str().unwrap());
        assert_eq!(code, Some("other_cluster"), "{protocol:?}: {refused:?}");
        let mut read = tonic::Request::new(v1::GetLockRequest { name: "shared".to_owned() });
        read.metadata_mut().insert("picket-expect-cluster", b_id.parse().unwrap());
        let lock = connection.grpc().get_lock(read).await.expect("its own cluster").into_inner();
        assert_eq!((lock.holder_session_id, lock.token), (bobs.id(), held.token()), "{protocol:?}");
    }

    // A node that does not know its cluster's id yet (here one started to join a cluster, not
    // added yet) cannot tell whether it is of the expected cluster: it refuses the request as
    // unavailable, and a client that keeps to a cluster does not use it.
    let joiner_dir = temp_dir();
    let listen = "127.0.0.1:0".parse().expect("an address");
    let join = ["--node-id", "2", "--join"].map(str::to_owned);
    let joiner =
        ServerProcess::start(Path::new(PICKET), &joiner_dir.path().join("n2"), listen, &join);
    let view = http::get(&joiner.addr, "/v1/cluster").body;
    assert!(view["cluster_id"].is_null(), "{view}");
    let unsure = expecting(&joiner.addr, &a_id, "GET", "/v1/locks/shared", None);
    assert_eq!(
        (unsure.status, unsure.body["code"].as_str()),
        (503, Some("unavailable")),
        "{}",
        unsure.text
    );
    let kept_to_a = ClientConfig { cluster_id: Some(a_id.clone()), ..quick() };
    let error = Client::connect_with([joiner.addr.clone()], kept_to_a).await.unwrap_err();
    assert_eq!(error.code(), Some(picket_client::ErrorCode::Unavailable), "{error}");
    assert!(error.to_string().contains("does not know its cluster's id yet"), "{error}");
    drop(joiner);

    a.kill();
    let started = std::time::Instant::now();
    let error = alice.release_in(bobs.id(), "shared", held.token()).await.unwrap_err();
    assert!(matches!(error, ClientError::OtherCluster { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains(&format!("the node at {}", b.addr)), "{message}");
    assert!(message.contains(&format!("{a_id}, the one this client reached first")), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "not said at once: {:?}",
        started.elapsed()
    );
    let holder = bob.lock_info("shared").await.unwrap().holder.expect("B's grant stands");
    assert_eq!((holder.session.0, holder.token), (bobs.id(), held.token()));
    let error = alice.lock_info("shared").await.unwrap_err();
    assert!(matches!(error, ClientError::OtherCluster { .. }), "a read too: {error}");
    assert_eq!(alice.cluster_id().as_deref(), Some(a_id.as_str()));
}

/// A cluster restored from a backup, with its sessions (`--restore-sessions keep`), is a new
/// cluster with an id of its own. While the cluster the backup came from runs, its clients keep
/// to it; once it is gone, its client follows the restored one, and its session and grant go on
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_follows_its_cluster_to_a_restore_of_it_once_that_is_gone() {
    let dir = temp_dir();
    let backup = dir.path().join("picket.backup");
    let (_old_dir, old) = ServerProcess::start_ready(Path::new(PICKET), &[]);
    let old_id = cluster_id(&old.addr, None);
    let restored_addr = format!("127.0.0.1:{}", picket_testkit::free_port());

    let config = ClientConfig { retry_for: Duration::from_secs(30), ..ClientConfig::default() };
    let client =
        Client::connect_with([old.addr.clone(), restored_addr.clone()], config).await.unwrap();
    let session = client.session(Duration::from_secs(60)).await.unwrap();
    let guard = session.try_lock("kept").await.unwrap();

    let output = Command::new(PICKET)
        .args(["--endpoints", &old.addr, "snapshot", "save"])
        .arg(&backup)
        .output()
        .expect("picket snapshot save runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    let restore = ["--restore", &backup.display().to_string(), "--restore-sessions", "keep"]
        .map(str::to_owned);
    let listen = restored_addr.parse().expect("an address");
    let restored =
        ServerProcess::start(Path::new(PICKET), &dir.path().join("new"), listen, &restore);
    let restored_id = cluster_id(&restored.addr, Some(&old_id));
    assert_ne!(restored_id, old_id, "a restored cluster is named anew");

    // The old cluster still runs: a client of it that reaches the restored copy first is not
    // drawn away (a staging copy of production, in a copied configuration).
    let given = ClientConfig { cluster_id: Some(old_id.clone()), ..quick() };
    let staying =
        Client::connect_with([restored_addr.clone(), old.addr.clone()], given).await.unwrap();
    let holder = staying.lock_info("kept").await.unwrap().holder.expect("held in the old cluster");
    assert_eq!(holder.token, guard.token());
    assert_eq!(staying.cluster_id().as_deref(), Some(old_id.as_str()));
    drop(old);

    // Over HTTP, a request expecting the cluster the backup came from is taken when it says it
    // follows that cluster to a restore, and refused otherwise.
    let refused = expecting(&restored.addr, &old_id, "GET", "/v1/locks/kept", None);
    assert_eq!(refused.status, 412, "{}", refused.text);
    let following = http::As {
        headers: vec![
            ("picket-expect-cluster".to_owned(), old_id.clone()),
            ("picket-follow-restore".to_owned(), "1".to_owned()),
        ],
        ..http::As::default()
    };
    let read = http::request_as(&restored.addr, &following, "GET", "/v1/locks/kept", None)
        .expect("the node answers");
    assert_eq!(read.status, 200, "{}", read.text);
    assert_eq!(read.header("picket-cluster-id"), Some(restored_id.as_str()));

    let holder = client.lock_info("kept").await.unwrap().holder.expect("the grant was kept");
    assert_eq!((holder.session.0, holder.token), (session.id(), guard.token()));
    assert_eq!(client.cluster_id().as_deref(), Some(restored_id.as_str()), "followed");
    guard.release().await.unwrap();
    let next = session.try_lock("kept").await.unwrap();
    assert!(next.token() > 1 << 48, "granted in the restored cluster's epoch: {}", next.token());
}

/// The cluster a client over TLS reaches at `addr`, once it is named (and, when `origin` is
/// given, once it knows it was restored from that cluster).
async fn tls_cluster_id(addr: &str, tls: &ClientTls, origin: Option<&str>) -> String {
    let config = ClientConfig { tls: Some(tls.clone()), ..quick() };
    let probe = Client::connect_with([addr.to_owned()], config).await.expect("the node answers");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(info) = probe.cluster().await {
            let restored_from = info.restored_from_cluster_id.as_str();
            if !info.cluster_id.is_empty() && origin.is_none_or(|origin| origin == restored_from) {
                return info.cluster_id;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "{addr} was not named within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A node of the client's cluster whose TLS handshake fails (restarted with a certificate the
/// client does not trust) took the connection: it is not gone, and a restore of the cluster
/// does not draw the client away from it. It used to count as gone, as a refused connection
/// does. Once nothing listens at its address, the client follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_tls_handshake_fails_is_not_taken_for_gone() {
    let dir = temp_dir();
    let pki = TestPki::generate(&dir.path().join("pki"));
    let tls = ClientTls::from_files(&pki.peer_ca, None).expect("usable TLS files");
    let old_data = dir.path().join("old");
    let old_listen = format!("127.0.0.1:{}", picket_testkit::free_port()).parse().unwrap();
    let mut old = ServerProcess::start(Path::new(PICKET), &old_data, old_listen, &pki.serve_args());
    let old_id = tls_cluster_id(&old.addr, &tls, None).await;

    let restored_addr = format!("127.0.0.1:{}", picket_testkit::free_port());
    let config = ClientConfig {
        tls: Some(tls.clone()),
        cluster_id: Some(old_id.clone()),
        retry_for: Duration::from_secs(3),
        ..ClientConfig::default()
    };
    let client =
        Client::connect_with([old.addr.clone(), restored_addr.clone()], config).await.unwrap();
    let session = client.session(Duration::from_secs(60)).await.unwrap();
    let guard = session.try_lock("kept").await.unwrap();

    let backup = dir.path().join("picket.backup");
    let output = Command::new(PICKET)
        .args(["--endpoints", &old.addr, "--ca"])
        .arg(&pki.peer_ca)
        // A backup over TLS with no auth file takes a member's certificate.
        .arg("--cert")
        .arg(&pki.node.cert)
        .arg("--key")
        .arg(&pki.node.key)
        .args(["snapshot", "save"])
        .arg(&backup)
        .output()
        .expect("picket snapshot save runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let mut restore = pki.serve_args();
    restore.extend(
        ["--restore", &backup.display().to_string(), "--restore-sessions", "keep"]
            .map(str::to_owned),
    );
    let listen = restored_addr.parse().expect("an address");
    let _restored =
        ServerProcess::start(Path::new(PICKET), &dir.path().join("new"), listen, &restore);
    let restored_id = tls_cluster_id(&restored_addr, &tls, Some(&old_id)).await;

    // The old node comes back on its data and address with a certificate nobody trusts.
    let old_addr = old.addr.clone();
    drop(old);
    let mut untrusted = pki.serve_args();
    let cert = untrusted.iter().position(|arg| arg == "--tls-cert").expect("a certificate");
    untrusted[cert + 1] = pki.rogue_node.cert.display().to_string();
    untrusted[cert + 3] = pki.rogue_node.key.display().to_string();
    let listen = old_addr.parse().expect("an address");
    old = ServerProcess::start(Path::new(PICKET), &old_data, listen, &untrusted);
    let error = client.lock_info("kept").await.expect_err("no node the client may use");
    assert_eq!(client.cluster_id().as_deref(), Some(old_id.as_str()), "not followed: {error}");

    // Nothing listens there any more: the client's cluster is gone, and it follows the restore.
    drop(old);
    let holder = client.lock_info("kept").await.unwrap().holder.expect("the grant was kept");
    assert_eq!((holder.session.0, holder.token), (session.id(), guard.token()));
    assert_eq!(client.cluster_id().as_deref(), Some(restored_id.as_str()), "followed");
}
