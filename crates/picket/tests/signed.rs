//! Signed sequencers end to end (issue 15): `picket serve --signing-key` signs every grant's
//! sequencer, and `picket kv serve --sequencer-keys` verifies them with the public key alone,
//! before any other rule: a forged or altered sequencer is refused with `bad_signature`, also
//! while the lock service is down, and real ones are admitted.

use picket_core::{ErrorCode, Sequencer, SequencerSigner, SessionId};
use picket_testkit::http::{self, As, Reply};
use picket_testkit::pki::signing_key;
use picket_testkit::{ServerProcess, temp_dir, wait_until};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

const PICKET: &str = env!("CARGO_BIN_EXE_picket");
const CLUSTER: &str = "signed-test";

fn put(kv: &str, key: &str, sequencer: &str) -> Reply {
    let caller =
        As { headers: vec![("Picket-Sequencer".into(), sequencer.into())], ..As::default() };
    http::request_as(kv, &caller, "PUT", &format!("/kv/{key}"), Some(&json!("v"))).unwrap()
}

fn register(kv: &str, sequencer: &str) -> Reply {
    let caller =
        As { headers: vec![("Picket-Sequencer".into(), sequencer.into())], ..As::default() };
    http::request_as(kv, &caller, "POST", "/fence/res/", None).unwrap()
}

#[test]
fn a_store_with_the_public_key_refuses_forged_sequencers_even_with_picket_down() {
    let dir = temp_dir();
    let (private, public) = signing_key(&dir.path().join("keys"), "cluster");
    let key_arg = private.display().to_string();
    let (_picket_dir, mut picket) = ServerProcess::start_ready(
        Path::new(PICKET),
        &["--signing-key", &key_arg, "--cluster-id", CLUSTER],
    );
    let kv_args: Vec<String> = [
        "--endpoints",
        &picket.addr,
        "kv",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--guard",
        "res/=res",
        "--cluster-id",
        CLUSTER,
        "--sequencer-keys",
        &public.display().to_string(),
        "--data-dir",
        &dir.path().join("kv").display().to_string(),
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    let kv = ServerProcess::start_with(Path::new(PICKET), &dir.path().join("kv"), kv_args);

    // A real grant's sequencer is signed, and the store admits it.
    let session =
        http::post(&picket.addr, "/v1/sessions", &json!({ "ttl_ms": 30_000 })).body["session_id"]
            .as_u64()
            .unwrap();
    let granted = http::post(
        &picket.addr,
        "/v1/locks/acquire",
        &json!({ "name": "res", "session_id": session, "wait_ms": 0 }),
    );
    let real = granted.body["sequencer"].as_str().unwrap().to_owned();
    assert!(real.starts_with("p2."), "{real}");
    assert_eq!(http::get(&picket.addr, "/v1/locks/res").body["holder"]["sequencer"], real.as_str());
    let admitted = put(&kv.addr, "res/a", &real);
    assert_eq!(admitted.status, 200, "{}", admitted.text);

    let parsed = Sequencer::parse(&real).unwrap();
    let altered = |change: &dyn Fn(&mut Sequencer)| {
        let mut forged = parsed.clone();
        change(&mut forged);
        forged.to_string()
    };
    let stranger = SequencerSigner::from_seed(CLUSTER, &[9; 32]).unwrap();
    let forgeries = [
        ("altered token", altered(&|s| s.token += 1)),
        ("altered lock", altered(&|s| s.name = "res2".into())),
        ("u64::MAX", altered(&|s| s.token = u64::MAX)),
        ("wrong key", stranger.seal("res", parsed.token + 1, session).to_string()),
        ("unsigned", Sequencer::new("res", parsed.token + 1).to_string()),
        ("altered session", altered(&|s| s.seal.as_mut().unwrap().session += 1)),
    ];
    let refuse_all = |when: &str| {
        for (what, forged) in &forgeries {
            // A write, and fence on acquire (registering the token as the newest).
            for refused in [put(&kv.addr, "res/a", forged), register(&kv.addr, forged)] {
                assert_eq!(refused.status, 403, "{when}, {what}: {}", refused.text);
                assert_eq!(
                    refused.body["code"], "bad_signature",
                    "{when}, {what}: {}",
                    refused.text
                );
            }
        }
    };
    refuse_all("picket up");

    // With the lock service gone, forgeries are still refused by the signature alone (not as
    // unverified), and the real grant still writes.
    picket.kill();
    refuse_all("picket down");
    let again = put(&kv.addr, "res/b", &real);
    assert_eq!(again.status, 200, "{}", again.text);
    wait_until("the store to still answer", Duration::from_secs(5), || {
        (http::get(&kv.addr, "/healthz").status == 200).then_some(())
    });
}

/// The Rust client keeps the sequencer the server signed, and gRPC lock info shows it too.
#[tokio::test]
async fn the_rust_client_carries_the_signed_sequencer() {
    let dir = temp_dir();
    let (private, public) = signing_key(&dir.path().join("keys"), "cluster");
    let key_arg = private.display().to_string();
    let (_picket_dir, picket) = ServerProcess::start_ready(
        Path::new(PICKET),
        &["--signing-key", &key_arg, "--cluster-id", CLUSTER],
    );
    let client = picket_client::Client::connect([picket.addr.clone()]).await.unwrap();
    let session = client.session(Duration::from_secs(30)).await.unwrap();
    let guard = session.try_lock("jobs/signed").await.unwrap();
    let seal = guard.sequencer().seal.as_ref().expect("a signed sequencer");
    assert_eq!((seal.session, seal.cluster.as_str()), (session.id(), CLUSTER));
    let spki = picket_proto::tls::read_public_keys(&public).unwrap();
    let keys = picket_core::SequencerKeys::from_spki(CLUSTER, spki.iter().map(Vec::as_slice));
    assert_eq!(keys.unwrap().verify(guard.sequencer()), Ok(()));
    let info = client.lock_info("jobs/signed").await.unwrap();
    assert_eq!(&info.holder.expect("held").sequencer, guard.sequencer());
    // `check` judges a signed sequencer by its signature as well as its lock and token.
    let current = picket_client::CheckOutcome::Current { session: SessionId(session.id()) };
    assert_eq!(client.check(&guard.sequencer().to_string()).await.unwrap(), current);
    let mut altered = guard.sequencer().clone();
    altered.seal.as_mut().unwrap().session += 1;
    let refused = client.check(&altered.to_string()).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::BadRequest), "{refused}");
    assert!(refused.to_string().contains("forged or altered"), "{refused}");
}
