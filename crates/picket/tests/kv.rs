//! `picket kv`, the reference fenced store, with real processes: durability across `kill -9`,
//! verify on advance, units, idempotent retries, bad input, and the seeds' canonical race with a
//! Picket server, the store and two client processes, one of them frozen with SIGSTOP.

use picket_testkit::http::{self, Reply};
use picket_testkit::{ServerProcess, temp_dir, wait_until};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PICKET: &str = env!("CARGO_BIN_EXE_picket");

struct World {
    dir: tempfile::TempDir,
    picket: ServerProcess,
    kv: ServerProcess,
}

impl World {
    fn start(kv_flags: &[&str]) -> Self {
        let dir = temp_dir();
        let picket = ServerProcess::start(
            Path::new(PICKET),
            &dir.path().join("picket"),
            "127.0.0.1:0".parse().unwrap(),
            &[],
        );
        wait_until("a leader", Duration::from_secs(10), || {
            (http::get(&picket.addr, "/v1/cluster").body["role"] == "leader").then_some(())
        });
        let mut args: Vec<String> =
            ["--endpoints", &picket.addr, "kv", "serve", "--listen", "127.0.0.1:0", "--data-dir"]
                .iter()
                .map(|arg| (*arg).to_owned())
                .collect();
        args.push(dir.path().join("kv").display().to_string());
        args.extend(
            [
                "--guard",
                "res/=res",
                "--guard",
                "a/=shop",
                "--guard",
                "b/=shop",
                "--strict-guard",
                "once/=once",
            ]
            .iter()
            .map(|arg| (*arg).to_owned()),
        );
        args.extend(kv_flags.iter().map(|flag| (*flag).to_owned()));
        let kv = ServerProcess::start_with(Path::new(PICKET), &dir.path().join("kv"), args);
        Self { dir, picket, kv }
    }

    fn kv_url(&self) -> String {
        format!("http://{}", self.kv.addr)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Acquires `name` in a fresh session over HTTP; returns (session, sequencer).
    fn acquire(&self, name: &str) -> (u64, String) {
        let session = http::post(&self.picket.addr, "/v1/sessions", &json!({ "ttl_ms": 30_000 }))
            .body["session_id"]
            .as_u64()
            .unwrap();
        let granted = http::post(
            &self.picket.addr,
            "/v1/locks/acquire",
            &json!({ "name": name, "session_id": session, "wait_ms": 0 }),
        );
        assert_eq!(granted.status, 200, "{}", granted.text);
        (session, granted.body["sequencer"].as_str().unwrap().to_owned())
    }

    fn release(&self, name: &str, session: u64, sequencer: &str) {
        let token: u64 = sequencer.split('.').nth(1).unwrap().parse().unwrap();
        let released = http::post(
            &self.picket.addr,
            "/v1/locks/release",
            &json!({ "name": name, "session_id": session, "token": token }),
        );
        assert_eq!(released.status, 200);
    }
}

fn kv_request(
    addr: &str,
    method: &str,
    path: &str,
    sequencer: Option<&str>,
    body: &[u8],
    extra: &[(&str, &str)],
) -> Reply {
    let sequencer =
        sequencer.map(|sequencer| ("Picket-Sequencer".to_owned(), sequencer.to_owned()));
    let headers = extra.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned()));
    let caller =
        http::As { headers: sequencer.into_iter().chain(headers).collect(), ..http::As::default() };
    http::request_bytes(addr, &caller, method, path, body.to_vec(), "application/octet-stream")
        .unwrap_or_else(|error| panic!("{method} {path} at {addr}: {error}"))
}

fn put(world: &World, key: &str, sequencer: Option<&str>, value: &str) -> Reply {
    kv_request(&world.kv.addr, "PUT", &format!("/kv/{key}"), sequencer, value.as_bytes(), &[])
}

fn get(world: &World, key: &str) -> Reply {
    kv_request(&world.kv.addr, "GET", &format!("/kv/{key}"), None, &[], &[])
}

/// The seeds' in-memory-reset trap: after `kill -9` and a restart, the store still remembers
/// the highest token and still refuses the older one.
#[test]
fn the_highest_token_survives_kill_9() {
    let mut world = World::start(&["--no-verify"]);
    let (old_session, old) = world.acquire("res");
    assert_eq!(put(&world, "res/x", Some(&old), "old").status, 200);
    world.release("res", old_session, &old);
    let (_, new) = world.acquire("res");
    assert_eq!(put(&world, "res/x", Some(&new), "new").status, 200);
    world.kv.kill();
    world.kv.restart();
    let record = kv_request(&world.kv.addr, "GET", "/fence/res/", None, &[], &[]);
    let new_token: u64 = new.split('.').nth(1).unwrap().parse().unwrap();
    assert_eq!(record.body["record"]["highest_token"], new_token);
    let stale = put(&world, "res/x", Some(&old), "zombie");
    assert_eq!(stale.status, 409, "{}", stale.text);
    assert_eq!(stale.body["code"], "stale_token");
    assert_eq!(stale.body["highest_token"], new_token);
    assert_eq!(get(&world, "res/x").text, "new");
}

/// `GET /metrics` of the store counts admissions by kind and refusals by code.
#[test]
fn store_metrics_count_admissions_and_refusals_by_reason() {
    let world = World::start(&[]);
    let metric = |name: &str| -> f64 {
        let text = get_path(&world, "/metrics").text;
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or(0.0)
    };
    let (old_session, old) = world.acquire("res");
    assert_eq!(put(&world, "res/x", Some(&old), "old").status, 200);
    assert_eq!(put(&world, "res/x", Some(&old), "again").status, 200);
    world.release("res", old_session, &old);
    let (_, new) = world.acquire("res");
    assert_eq!(put(&world, "res/x", Some(&new), "new").status, 200);
    assert_eq!(put(&world, "res/x", Some(&old), "zombie").status, 409);
    assert_eq!(put(&world, "res/x", Some(&format!("p1.{}.res", u64::MAX)), "forged").status, 409);
    assert_eq!(metric("picket_kv_admissions_total{admission=\"advanced\"}"), 2.0);
    assert_eq!(metric("picket_kv_admissions_total{admission=\"same\"}"), 1.0);
    assert_eq!(metric("picket_kv_refusals_total{code=\"stale_token\"}"), 1.0);
    assert_eq!(metric("picket_kv_refusals_total{code=\"not_current_grant\"}"), 1.0);
}

fn get_path(world: &World, path: &str) -> Reply {
    kv_request(&world.kv.addr, "GET", path, None, &[], &[])
}

/// Verify on advance: a forged huge token from a client that never held the lock is refused
/// instead of wedging the resource, and a superseded grant is refused even before the new holder
/// writes. Without verification the forged token would wedge the resource.
#[test]
fn verify_on_advance_refuses_forged_and_superseded_tokens() {
    let world = World::start(&[]);
    let forged = format!("p1.{}.res", u64::MAX);
    let refused = put(&world, "res/k", Some(&forged), "forged");
    assert_eq!(refused.status, 409, "{}", refused.text);
    assert_eq!(refused.body["code"], "not_current_grant");
    let (old_session, old) = world.acquire("res");
    world.release("res", old_session, &old);
    let (_, current) = world.acquire("res");
    // The old grant never wrote and the new holder has not written yet: only the lock service
    // knows the old one is superseded.
    let zombie = put(&world, "res/k", Some(&old), "zombie");
    assert_eq!(zombie.status, 409, "{}", zombie.text);
    assert_eq!(zombie.body["code"], "not_current_grant");
    assert_eq!(put(&world, "res/k", Some(&current), "current").status, 200);
    // Writes with the already-highest token need no call to the service: stop it and write on.
    let mut world = world;
    world.picket.kill();
    assert_eq!(put(&world, "res/k", Some(&current), "again").status, 200);
    // A token above the highest cannot be verified now: refused, not admitted.
    let unverifiable = put(&world, "res/k", Some(&format!("p1.{}.res", u64::MAX - 1)), "x");
    assert_eq!(unverifiable.status, 503, "{}", unverifiable.text);
    assert_eq!(unverifiable.body["code"], "unverified_token");

    // The same forged token against a store without verification wedges the resource: every
    // honest grant after it is refused. This is why verification is on by default.
    let unverified = World::start(&["--no-verify"]);
    assert_eq!(put(&unverified, "res/k", Some(&forged), "forged").status, 200);
    let (_, honest) = unverified.acquire("res");
    assert_eq!(put(&unverified, "res/k", Some(&honest), "honest").body["code"], "stale_token");
}

/// Issue 12, fence availability: while the lock service does not answer (frozen with SIGSTOP,
/// so connections hang rather than fail), a write that needs verification is refused
/// `unverified_token` after the store's bound, and it does not hold the resource meanwhile:
/// writes with the already-admitted token to the same key are served while it waits.
#[test]
fn verify_on_advance_fails_closed_without_stalling_the_resource() {
    let world = World::start(&["--verify-timeout-ms", "3000"]);
    let (_, current) = world.acquire("res");
    assert_eq!(put(&world, "res/k", Some(&current), "first").status, 200);
    let token: u64 = current.split('.').nth(1).unwrap().parse().unwrap();
    world.picket.signal("-STOP");
    let advancing = {
        let addr = world.kv.addr.clone();
        let sequencer = format!("p1.{}.res", token + 1);
        std::thread::spawn(move || {
            kv_request(&addr, "PUT", "/kv/res/k", Some(&sequencer), b"advancing", &[])
        })
    };
    // The advancing write is now waiting for the frozen service; the admitted grant writes on.
    for round in 0..5 {
        let value = format!("same-{round}");
        let same = put(&world, "res/k", Some(&current), &value);
        assert_eq!(same.status, 200, "{}", same.text);
        assert_eq!(get(&world, "res/k").text, value);
    }
    assert!(
        !advancing.is_finished(),
        "the advancing write should still be waiting for the frozen lock service"
    );
    let refused = advancing.join().unwrap();
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert_eq!(refused.body["code"], "unverified_token", "{}", refused.text);
    world.picket.signal("-CONT");
    assert_eq!(get(&world, "res/k").text, "same-4");
}

/// A unit over two resources is admitted at both or neither; an idempotent retry returns the
/// original success, and the same key for another write is refused; strict mode gives each grant
/// one write.
#[test]
fn units_idempotent_retries_and_strict_mode() {
    let world = World::start(&["--no-verify"]);
    let (shop_session, shop) = world.acquire("shop");
    let unit = json!({ "ops": [{ "put": { "key": "a/1", "value": "x" } }, { "put": { "key": "b/1", "value": "y" } }] });
    let txn = |sequencer: &str, extra: &[(&str, &str)]| {
        kv_request(
            &world.kv.addr,
            "POST",
            "/txn",
            Some(sequencer),
            unit.to_string().as_bytes(),
            extra,
        )
    };
    assert_eq!(txn(&shop, &[]).status, 200);
    // A newer grant registered at b/ only: a unit with the old grant lands nowhere.
    world.release("shop", shop_session, &shop);
    let (_, newer) = world.acquire("shop");
    assert_eq!(kv_request(&world.kv.addr, "POST", "/fence/b/", Some(&newer), &[], &[]).status, 200);
    let mixed = json!({ "ops": [{ "put": { "key": "a/1", "value": "stale" } }, { "put": { "key": "b/1", "value": "stale" } }] });
    let refused =
        kv_request(&world.kv.addr, "POST", "/txn", Some(&shop), mixed.to_string().as_bytes(), &[]);
    assert_eq!(refused.status, 409, "{}", refused.text);
    assert_eq!(refused.body["resource"], "b/");
    assert_eq!(get(&world, "a/1").text, "x", "the admitting resource was not written either");

    let retry = [("Idempotency-Key", "op-7"), ("Picket-Seq", "1")];
    let first = kv_request(&world.kv.addr, "PUT", "/kv/a/2", Some(&newer), b"v", &retry);
    assert_eq!(first.body["admission"], "advanced", "{}", first.text);
    let again = kv_request(&world.kv.addr, "PUT", "/kv/a/2", Some(&newer), b"v", &retry);
    assert_eq!((again.status, again.body["admission"].as_str()), (200, Some("duplicate")));
    let replay =
        kv_request(&world.kv.addr, "PUT", "/kv/a/2", Some(&newer), b"v", &[("Picket-Seq", "1")]);
    assert_eq!(replay.body["code"], "replayed_seq");
    // Issue 13, point 3: the same key and stamp with another value was answered `duplicate`
    // and the new value never landed; it is refused now, and the first value stays.
    let other = kv_request(&world.kv.addr, "PUT", "/kv/a/2", Some(&newer), b"w", &retry);
    assert_eq!((other.status, other.body["code"].as_str()), (409, Some("idempotency_key_reused")));
    assert_eq!(get(&world, "a/2").text, "v");
    let deleted = kv_request(&world.kv.addr, "DELETE", "/kv/a/2", Some(&newer), &[], &retry);
    assert_eq!(deleted.body["code"], "idempotency_key_reused", "{}", deleted.text);

    let (_, once) = world.acquire("once");
    assert_eq!(put(&world, "once/x", Some(&once), "1").status, 200);
    assert_eq!(put(&world, "once/x", Some(&once), "2").body["code"], "strict_repeat");
}

/// Issue 13, point 3: a key is kept for a stated time as well as a count. Within it a retry
/// gets the original outcome; after it the retry is refused, never applied twice.
#[test]
fn idempotency_keys_are_forgotten_after_their_time_and_a_late_retry_is_refused() {
    // Long enough that the retry within it is not raced by a loaded machine.
    let world = World::start(&["--no-verify", "--remember-keys-for-ms", "4000"]);
    let (_, sequencer) = world.acquire("res");
    let keyed = [("Idempotency-Key", "op-1")];
    let write = || kv_request(&world.kv.addr, "PUT", "/kv/res/1", Some(&sequencer), b"v", &keyed);
    let written = Instant::now();
    assert_eq!(write().body["admission"], "advanced");
    assert_eq!(write().body["admission"], "duplicate", "a retry within the time");
    let refused = wait_until("the key to be forgotten", Duration::from_secs(20), || {
        let late = write();
        (late.status == 409).then_some(late)
    });
    assert_eq!(refused.body["code"], "idempotency_window_passed", "{}", refused.text);
    assert!(
        written.elapsed() >= Duration::from_secs(1),
        "forgotten early: {:?}",
        written.elapsed()
    );
}

/// Bad input gets a clear error and changes nothing.
#[test]
fn bad_input_changes_nothing() {
    let world = World::start(&["--no-verify"]);
    let (_, sequencer) = world.acquire("res");
    assert_eq!(put(&world, "res/k", Some(&sequencer), "good").status, 200);
    let record_before = kv_request(&world.kv.addr, "GET", "/fence/res/", None, &[], &[]).body;
    let cases = [
        (put(&world, "res/k", None, "no stamp"), 428, "sequencer_required"),
        (put(&world, "res/k", Some("p1.x.res"), "garbled"), 400, "bad_sequencer"),
        (put(&world, "res/k", Some("p1.999.other"), "other lock"), 409, "wrong_lock"),
        (put(&world, "elsewhere/k", Some(&sequencer), "unguarded"), 403, "unguarded_key"),
        (
            kv_request(
                &world.kv.addr,
                "PUT",
                "/kv/res/k",
                Some(&sequencer),
                b"x",
                &[("Picket-Seq", "minus one")],
            ),
            400,
            "bad_header",
        ),
        (
            kv_request(&world.kv.addr, "POST", "/txn", Some(&sequencer), b"{not json", &[]),
            400,
            "bad_request",
        ),
    ];
    for (index, (reply, status, code)) in cases.iter().enumerate() {
        assert_eq!(reply.status, *status, "case {index}: {}", reply.text);
        assert_eq!(reply.body["code"], *code, "case {index}: {}", reply.text);
    }
    let huge = vec![b'x'; 2 << 20];
    let too_large = kv_request(&world.kv.addr, "PUT", "/kv/res/k", Some(&sequencer), &huge, &[]);
    assert_eq!(too_large.status, 413, "{}", too_large.text);
    assert_eq!(get(&world, "res/k").text, "good");
    assert_eq!(
        kv_request(&world.kv.addr, "GET", "/fence/res/", None, &[], &[]).body,
        record_before
    );
}

/// How the canonical race ended.
#[derive(Debug)]
struct RaceOutcome {
    /// Exit status of client 1's delayed write (0 = admitted).
    stale_write_status: i32,
    /// What the store answered client 1.
    stale_write_answer: String,
    /// The final value.
    final_value: String,
    /// Client 2's token.
    new_token: u64,
}

/// `picket kv put` and `get` take any key: characters that mean something in a URL (`?`, `#`,
/// `%`, spaces) are escaped, so the key written is the key named (`picket kv` sent them raw).
#[test]
fn kv_commands_escape_keys() {
    let world = World::start(&[]);
    let (_session, sequencer) = world.acquire("res");
    let key = "res/a b?c#d%e/été";
    let kv = |args: &[&str]| {
        Command::new(PICKET)
            .args(["kv"])
            .args(args)
            .args(["--kv", &world.kv_url()])
            .output()
            .unwrap()
    };
    let put = kv(&["put", "--sequencer", &sequencer, key, "value"]);
    assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));
    let got = kv(&["get", key]);
    assert!(got.status.success(), "{}", String::from_utf8_lossy(&got.stderr));
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), "value");
    let near = kv(&["get", "res/a b"]);
    assert!(!near.status.success(), "a key cut at its '?' must not be found");
}

fn spawn_client(world: &World, lock_args: &[&str], script: &str) -> Child {
    let mut command = Command::new(PICKET);
    command
        .args(["--endpoints", &world.picket.addr, "lock"])
        .args(lock_args)
        .args(["res", "--", "sh", "-c", script])
        .env("PICKET_KV", world.kv_url())
        .env("PICKET_BIN", PICKET)
        .current_dir(world.dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    command.spawn().unwrap()
}

/// The pid of the watchdog `picket lock` (pid `lock`) started: its child running
/// `__lock-watchdog`.
fn watchdog_of(lock: u32) -> i64 {
    wait_until("picket lock's watchdog", Duration::from_secs(10), || {
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
            let pid: i64 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let parent: u32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let watching = String::from_utf8_lossy(&cmdline).contains("__lock-watchdog");
            (parent == lock && watching).then_some(pid)
        })
    })
}

fn signal(target: i64, signal: &str) {
    Command::new("kill").args([signal, "--", &target.to_string()]).status().unwrap();
}

/// The seeds' canonical trace with real processes. Client 1 acquires with a 2 s TTL and is
/// frozen (SIGSTOP) after its last check and before its write; its session expires; client 2
/// acquires and writes; client 1 resumes and sends its write with the old token.
fn canonical_race(world: &World, fence_on_acquire: bool) -> RaceOutcome {
    // Client 1 ignores SIGTERM so its write goes out even though `picket lock` notices the loss
    // on resume: the fence, not the client, must stop it.
    let client1 = spawn_client(
        world,
        &["--ttl", "2s", "--kill-grace", "30s"],
        "trap '' TERM; echo $$ > ready1; while [ ! -e go1 ]; do sleep 0.01; done; \"$PICKET_BIN\" kv put res/data client1 > out1 2>&1; echo $? > status1",
    );
    let script_pid: i64 = wait_until("client 1 to hold the lock", Duration::from_secs(10), || {
        std::fs::read_to_string(world.path("ready1")).ok()?.trim().parse().ok()
    });
    // Freeze client 1 entirely: `picket lock` (its keepalive), its command, and its watchdog
    // (in a group of its own), as a paused machine would be: the watchdog, left running,
    // stops the command by the lease's end on its own.
    let client1_pid = i64::from(client1.id());
    let watchdog = watchdog_of(client1.id());
    signal(-client1_pid, "-STOP");
    signal(-script_pid, "-STOP");
    signal(watchdog, "-STOP");
    wait_until("client 1's session to expire", Duration::from_secs(10), || {
        (http::get(&world.picket.addr, "/v1/locks/res").body["holder"].is_null()).then_some(())
    });
    let fence_url = format!("{}/fence/res/", world.kv_url());
    let mut client2_args = vec![];
    if fence_on_acquire {
        client2_args.extend(["--fence", fence_url.as_str()]);
    }
    let mut client2 = spawn_client(
        world,
        &client2_args,
        "echo ready > ready2; while [ ! -e go2 ]; do sleep 0.01; done; \"$PICKET_BIN\" kv put res/data client2",
    );
    wait_until("client 2 to hold the lock", Duration::from_secs(10), || {
        world.path("ready2").exists().then_some(())
    });
    let new_token =
        http::get(&world.picket.addr, "/v1/locks/res").body["holder"]["token"].as_u64().unwrap();
    if fence_on_acquire {
        // With fence on acquire the new holder's write order does not matter: let it write first.
        std::fs::write(world.path("go2"), "").unwrap();
        wait_until("client 2's write", Duration::from_secs(10), || {
            (get(world, "res/data").text == "client2").then_some(())
        });
    }
    // Client 1 wakes up and writes with its old token.
    std::fs::write(world.path("go1"), "").unwrap();
    signal(-script_pid, "-CONT");
    signal(-client1_pid, "-CONT");
    signal(watchdog, "-CONT");
    let stale_write_status: i32 = wait_until("client 1's write", Duration::from_secs(20), || {
        std::fs::read_to_string(world.path("status1")).ok()?.trim().parse().ok()
    });
    std::fs::write(world.path("go2"), "").unwrap();
    assert!(client2.wait().unwrap().success());
    let mut client1 = client1;
    let client1_exit = client1.wait().unwrap();
    assert_eq!(client1_exit.code(), Some(76), "picket lock reports the lost lock");
    RaceOutcome {
        stale_write_status,
        stale_write_answer: std::fs::read_to_string(world.path("out1")).unwrap(),
        final_value: get(world, "res/data").text,
        new_token,
    }
}

/// Fence on acquire: the new holder registers its token before it writes; the resumed client's
/// write is refused as stale with the structured refusal, and the store holds only client 2's
/// data.
#[test]
fn canonical_race_with_fence_on_acquire_refuses_the_zombie() {
    let world = World::start(&["--no-verify"]);
    let outcome = canonical_race(&world, true);
    assert_eq!(outcome.stale_write_status, 1, "{outcome:?}");
    assert!(outcome.stale_write_answer.contains("\"code\":\"stale_token\""), "{outcome:?}");
    assert!(
        outcome.stale_write_answer.contains(&format!("\"highest_token\":{}", outcome.new_token)),
        "{outcome:?}"
    );
    assert_eq!(outcome.final_value, "client2");
}

/// Without fence on acquire and without verification, the zombie's write slips through: it
/// arrives before the new holder's first write, when the store has seen no newer token. (The
/// final value is client 2's, but client 1's write landed in between: a read-modify-write by
/// client 2 would have worked on data client 1 had already changed.)
#[test]
fn canonical_race_without_fence_on_acquire_lets_the_zombie_write_slip_through() {
    let world = World::start(&["--no-verify"]);
    let outcome = canonical_race(&world, false);
    assert_eq!(outcome.stale_write_status, 0, "the zombie's write was admitted: {outcome:?}");
    assert_eq!(outcome.final_value, "client2");
}

/// Without fence on acquire but with verify on advance, the store asks the lock service about
/// the zombie's token (newer than any it has seen) and refuses it.
#[test]
fn canonical_race_with_verify_on_advance_refuses_the_zombie_without_registration() {
    let world = World::start(&[]);
    let outcome = canonical_race(&world, false);
    assert_eq!(outcome.stale_write_status, 1, "{outcome:?}");
    assert!(outcome.stale_write_answer.contains("\"code\":\"not_current_grant\""), "{outcome:?}");
    assert_eq!(outcome.final_value, "client2");
}
