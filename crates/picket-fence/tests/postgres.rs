//! The PostgreSQL fence against a real PostgreSQL server that the test starts on a free loopback
//! port (its own `initdb` in a temporary directory) and stops: the SQL function agrees with the
//! Rust rule on random histories, concurrent transactions on several connections never apply a
//! stale write nor lose one, and the highest token survives a restart of the database.
//!
//! Needs PostgreSQL's server binaries (Debian: `apt-get install postgresql`); `.ci/run` installs
//! them when they are missing.

// The ban on clocks covers the fence itself; a test waiting for a server needs one.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use picket_fence::postgres::{self, PgFenceError};
use picket_fence::{Guarded, Policy, Presented, Stamp};
use proptest::prelude::*;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

/// A private PostgreSQL server.
struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    as_postgres_user: bool,
}

fn postgres_bin_dir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.path().join("bin"))
                .filter(|bin| bin.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions.pop().expect("PostgreSQL's server binaries are not installed: run `apt-get install postgresql` (.ci/run does)")
}

impl Postgres {
    fn start() -> Self {
        let bin = postgres_bin_dir();
        let dir = tempfile::tempdir().unwrap();
        let uid = Command::new("id").arg("-u").output().unwrap();
        // initdb and postgres refuse to run as root: run them as the postgres user then.
        let as_postgres_user = String::from_utf8_lossy(&uid.stdout).trim() == "0";
        if as_postgres_user {
            assert!(
                Command::new("chown")
                    .args(["-R", "postgres:postgres"])
                    .arg(dir.path())
                    .status()
                    .unwrap()
                    .success()
            );
        }
        let port = picket_testkit::free_port();
        let server = Self { dir, bin, port, as_postgres_user };
        let data = server.data_dir();
        let initdb = server
            .command("initdb")
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(&data)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(initdb.success(), "initdb failed");
        server.launch();
        server
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.as_postgres_user {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    fn launch(&self) {
        let log = self.dir.path().join("postgres.log");
        let started = self
            .command("pg_ctl")
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(self.data_dir())
            .arg("-l")
            .arg(&log)
            .arg("-o")
            .arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on",
                self.port,
                self.dir.path().display()
            ))
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(
            started.success(),
            "postgres did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    fn stop(&self) {
        let _ = self
            .command("pg_ctl")
            .args(["stop", "-m", "fast", "-w", "-D"])
            .arg(self.data_dir())
            .stdout(Stdio::null())
            .status();
    }

    async fn connect(&self) -> tokio_postgres::Client {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match tokio_postgres::connect(
                &format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port),
                NoTls,
            )
            .await
            {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    return client;
                }
                Err(error) => {
                    assert!(Instant::now() < deadline, "cannot connect to postgres: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

fn presented(lock: &str, token: u64, seq: Option<u64>) -> Presented {
    Presented {
        lock: lock.to_owned(),
        stamp: Stamp { token, seq },
        idempotency_key: None,
        request_digest: None,
    }
}

fn code(result: &Result<picket_fence::Admission, PgFenceError>) -> String {
    match result {
        Ok(_) => "admitted".to_owned(),
        Err(PgFenceError::Refused(refusal)) => refusal.reason.code().to_owned(),
        Err(other) => panic!("database error: {other}"),
    }
}

/// `postgres::admit` in a transaction of its own, committed when admitted, rolled back when
/// not.
async fn admit_alone(
    client: &mut tokio_postgres::Client,
    resource: &str,
    policy: &Policy,
    presented: &Presented,
) -> Result<picket_fence::Admission, PgFenceError> {
    let transaction = client.transaction().await.unwrap();
    let admitted = postgres::admit(&transaction, resource, policy, presented).await;
    match admitted {
        Ok(_) => transaction.commit().await.unwrap(),
        Err(_) => transaction.rollback().await.unwrap(),
    }
    admitted
}

/// `postgres::admit_signed` in a transaction of its own, as [`admit_alone`].
async fn admit_signed_alone(
    client: &mut tokio_postgres::Client,
    policy: &Policy,
    sequencer: &str,
    keys: &picket_core::SequencerKeys,
) -> Result<picket_fence::Admission, PgFenceError> {
    let transaction = client.transaction().await.unwrap();
    let admitted = postgres::admit_signed(&transaction, "signed/", policy, sequencer, keys).await;
    match admitted {
        Ok(_) => transaction.commit().await.unwrap(),
        Err(_) => transaction.rollback().await.unwrap(),
    }
    admitted
}

#[derive(Clone, Debug)]
enum Op {
    Write { token: u64, seq: Option<u64>, other_lock: bool },
    Register { token: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop::sample::select(vec![3u64, 7, 7, 12, 20]), proptest::option::of(0u64..5), proptest::bool::weighted(0.05))
            .prop_map(|(token, seq, other_lock)| Op::Write { token, seq, other_lock }),
        1 => prop::sample::select(vec![3u64, 7, 12, 20]).prop_map(|token| Op::Register { token }),
    ]
}

/// One server for the whole file: starting PostgreSQL costs a second or two.
fn with_postgres<T>(test: impl FnOnce(&Postgres, &tokio::runtime::Runtime) -> T) -> T {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = Postgres::start();
    let client = runtime.block_on(server.connect());
    runtime.block_on(postgres::migrate(&client)).unwrap();
    // Migrating twice is harmless.
    runtime.block_on(postgres::migrate(&client)).unwrap();
    test(&server, &runtime)
}

/// The SQL function decides every write of random histories exactly as the Rust rule does.
#[test]
fn the_sql_function_agrees_with_the_rust_rule() {
    with_postgres(|server, runtime| {
        let client = std::cell::RefCell::new(runtime.block_on(server.connect()));
        let cases = AtomicU64::new(0);
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 40,
            ..ProptestConfig::default()
        });
        runner
            .run(&(proptest::collection::vec(op(), 1..40), any::<bool>()), |(ops, strict)| {
                let resource = format!("agree/{}", cases.fetch_add(1, Ordering::Relaxed));
                let policy =
                    if strict { Policy::new("lock").strict() } else { Policy::new("lock") };
                let reference = Guarded::new(resource.clone(), policy.clone(), ());
                for op in &ops {
                    match *op {
                        Op::Write { token, seq, other_lock } => {
                            let lock = if other_lock { "other" } else { "lock" };
                            let expected = reference
                                .write(&presented(lock, token, seq), |()| ())
                                .map(|_| ())
                                .map_err(|refusal| refusal.reason.code().to_owned());
                            let actual = runtime.block_on(admit_alone(
                                &mut client.borrow_mut(),
                                &resource,
                                &policy,
                                &presented(lock, token, seq),
                            ));
                            let expected = expected.err().unwrap_or_else(|| "admitted".to_owned());
                            prop_assert_eq!(code(&actual), expected, "{:?}", op);
                        }
                        Op::Register { token } => {
                            let expected = reference.register("lock", token).is_ok();
                            let actual = runtime
                                .block_on(postgres::register(
                                    &*client.borrow(),
                                    &resource,
                                    &policy,
                                    "lock",
                                    token,
                                ))
                                .is_ok();
                            prop_assert_eq!(actual, expected, "{:?}", op);
                        }
                    }
                    let highest = runtime
                        .block_on(postgres::highest_token(&*client.borrow(), &resource))
                        .unwrap();
                    prop_assert_eq!(highest, reference.highest_token());
                }
                Ok(())
            })
            .unwrap();
    });
}

const WRITERS: usize = 8;
const WRITES_PER_WRITER: usize = 60;

/// Eight connections race transactions with old and new tokens: admitted writes are applied in
/// an order whose tokens never go down, every admitted write is there, and the stored highest
/// token is the largest admitted.
#[test]
fn concurrent_transactions_apply_no_stale_write_and_lose_none() {
    with_postgres(|server, runtime| {
        runtime.block_on(async {
            let setup = server.connect().await;
            setup
                .batch_execute(
                    "CREATE TABLE race_log (id bigserial PRIMARY KEY, token bigint NOT NULL)",
                )
                .await
                .unwrap();
            let grants = Arc::new(AtomicU64::new(1));
            let policy = Policy::new("race");
            let mut tasks = Vec::new();
            for writer in 0..WRITERS {
                let mut client = server.connect().await;
                let (grants, policy) = (grants.clone(), policy.clone());
                tasks.push(tokio::spawn(async move {
                    let mut token = grants.fetch_add(1, Ordering::SeqCst);
                    let mut admitted = Vec::new();
                    for attempt in 0..WRITES_PER_WRITER {
                        if (attempt + writer) % 5 == 0 {
                            token = grants.fetch_add(1, Ordering::SeqCst);
                        }
                        let transaction = client.transaction().await.unwrap();
                        match postgres::admit(
                            &transaction,
                            "race/",
                            &policy,
                            &presented("race", token, None),
                        )
                        .await
                        {
                            Ok(_) => {
                                let token_bigint = i64::try_from(token).unwrap();
                                transaction
                                    .execute(
                                        "INSERT INTO race_log (token) VALUES ($1)",
                                        &[&token_bigint],
                                    )
                                    .await
                                    .unwrap();
                                transaction.commit().await.unwrap();
                                admitted.push(token);
                            }
                            Err(PgFenceError::Refused(_)) => transaction.rollback().await.unwrap(),
                            Err(other) => panic!("database error: {other}"),
                        }
                        tokio::task::yield_now().await;
                    }
                    admitted
                }));
            }
            let mut admitted = Vec::new();
            for task in tasks {
                admitted.extend(task.await.unwrap());
            }
            let rows = setup.query("SELECT token FROM race_log ORDER BY id", &[]).await.unwrap();
            let log: Vec<u64> =
                rows.iter().map(|row| u64::try_from(row.get::<_, i64>(0)).unwrap()).collect();
            assert_eq!(
                log.len(),
                admitted.len(),
                "every admitted write is there, and nothing else"
            );
            assert!(
                log.windows(2).all(|pair| pair[0] <= pair[1]),
                "a stale write was applied: {log:?}"
            );
            assert!(
                admitted.len() < WRITERS * WRITES_PER_WRITER,
                "some writes must have been stale"
            );
            let highest = postgres::highest_token(&setup, "race/").await.unwrap();
            assert_eq!(highest, *admitted.iter().max().unwrap());
        });
    });
}

/// The highest token is durable: after PostgreSQL restarts, the older token is still refused.
#[test]
fn the_highest_token_survives_a_database_restart() {
    with_postgres(|server, runtime| {
        let policy = Policy::new("durable");
        runtime.block_on(async {
            let mut client = server.connect().await;
            admit_alone(&mut client, "durable/", &policy, &presented("durable", 40, None))
                .await
                .unwrap();
            postgres::register(&client, "durable/", &policy, "durable", 41).await.unwrap();
        });
        server.stop();
        server.launch();
        runtime.block_on(async {
            let mut client = server.connect().await;
            assert_eq!(postgres::highest_token(&client, "durable/").await.unwrap(), 41);
            let stale =
                admit_alone(&mut client, "durable/", &policy, &presented("durable", 40, None))
                    .await;
            assert_eq!(code(&stale), "stale_token");
            let Err(PgFenceError::Refused(refusal)) = stale else { unreachable!() };
            assert_eq!((refusal.resource.as_str(), refusal.highest_token), ("durable/", 41));
            // Tokens and seqs beyond bigint never reach the table, and say so (a token was
            // refused as "token 0 is never issued"; a seq was clamped to the bound).
            let forged = presented("durable", u64::MAX, None);
            let forged = admit_alone(&mut client, "durable/", &policy, &forged).await;
            assert_eq!(
                code(&forged),
                "invalid_token",
                "tokens beyond bigint never reach the table"
            );
            let said = forged.unwrap_err().to_string();
            assert!(said.contains("above what this fence stores"), "{said}");
            let huge_seq = presented("durable", 41, Some(1 << 63));
            let huge_seq = admit_alone(&mut client, "durable/", &policy, &huge_seq).await;
            assert!(
                matches!(huge_seq, Err(PgFenceError::OutOfRange { what: "seq", .. })),
                "{huge_seq:?}"
            );
        });
    });
}

/// SPEC: a retry with the same stamp and key gets the original outcome back, never a second
/// application. The PostgreSQL fence keeps no keys, so a write that presents one is refused
/// before the database, and the table is left as it was; it was admitted, key ignored, so its
/// retry was applied twice.
#[test]
fn a_write_with_an_idempotency_key_is_refused_not_applied_twice() {
    with_postgres(|server, runtime| {
        let policy = Policy::new("keyed");
        runtime.block_on(async {
            let mut client = server.connect().await;
            let mut keyed = presented("keyed", 5, None);
            keyed.idempotency_key = Some("retry-1".to_owned());
            for _ in 0..2 {
                let refused = admit_alone(&mut client, "keyed/", &policy, &keyed).await;
                assert!(matches!(refused, Err(PgFenceError::KeysNotKept)), "{refused:?}");
                let said = refused.unwrap_err().to_string();
                assert!(said.contains("unique key"), "says what to do: {said}");
            }
            assert_eq!(postgres::highest_token(&client, "keyed/").await.unwrap(), 0);
        });
    });
}

/// Issue 15: with the lock service's public keys, the helper verifies a signed sequencer before
/// the database sees it. A forged huge token, an altered lock or token, and a sequencer signed
/// by an unknown key are refused (`BadSignature`) and leave the table as it was; real ones are
/// admitted.
#[test]
fn signed_sequencers_are_verified_before_the_database() {
    use picket_core::{SequencerKeys, SequencerSigner};
    let signer = SequencerSigner::from_seed("prod", &[7; 32]).unwrap();
    let stranger = SequencerSigner::from_seed("prod", &[8; 32]).unwrap();
    let spki = signer.public_key_spki();
    let keys = SequencerKeys::from_spki("prod", [spki.as_slice()]).unwrap();
    with_postgres(|server, runtime| {
        let policy = Policy::new("signed");
        runtime.block_on(async {
            let mut client = server.connect().await;
            let real = signer.seal("signed", 30, 4).to_string();
            admit_signed_alone(&mut client, &policy, &real, &keys).await.unwrap();
            let mut huge = signer.seal("signed", 31, 4);
            huge.token = u64::MAX / 4;
            let mut other_lock = signer.seal("signed", 32, 4);
            other_lock.name = "elsewhere".into();
            for forged in [huge, other_lock, stranger.seal("signed", 33, 4)] {
                let refused =
                    admit_signed_alone(&mut client, &policy, &forged.to_string(), &keys).await;
                assert!(matches!(refused, Err(PgFenceError::BadSignature(_))), "{refused:?}");
            }
            assert_eq!(postgres::highest_token(&client, "signed/").await.unwrap(), 30);
            // Fence on acquire takes the same check: a forged huge token never becomes the
            // highest.
            let mut forged = signer.seal("signed", 31, 4);
            forged.token = i64::MAX as u64;
            let refused =
                postgres::register_signed(&client, "signed/", &policy, &forged.to_string(), &keys)
                    .await;
            assert!(matches!(refused, Err(PgFenceError::BadSignature(_))), "{refused:?}");
            assert_eq!(postgres::highest_token(&client, "signed/").await.unwrap(), 30);
            let next = signer.seal("signed", 34, 5).to_string();
            admit_signed_alone(&mut client, &policy, &next, &keys).await.unwrap();
            assert_eq!(postgres::highest_token(&client, "signed/").await.unwrap(), 34);
        });
    });
}
