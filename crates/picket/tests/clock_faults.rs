//! Regression tests for issue 21: a leader whose clock jumps or runs fast or slow, or whose
//! process stalls, must not expire sessions that were kept alive.
//!
//! Before the fix, expiry went by the leader's clock alone and keepalives waited in the leader's
//! memory until its next tick: a leader whose clock jumped 8 s expired every session it had not
//! heard from since its last tick, and a leader that woke from a stall expired sessions whose
//! keepalives still sat unread in its sockets. Now a tick that follows a gap in the leader's
//! clock (a stall or a jump) refreshes every session instead, a tick expires by its own reading
//! taken together with the keepalives it carries, and a session lives half a second past its
//! deadline on the leader's clock.
//!
//! The clock faults are driven through `picket serve`'s hidden `--test-clock-file`: the lock
//! state's time then follows a script file (`rate=R jump_ms=J`) while Raft keeps the real clock.
//! Every test runs real processes; one test at a time, as they share two cores.

use picket_testkit::cluster::{Cluster, send};
use picket_testkit::http::try_request;
use picket_testkit::{ServerProcess, free_port, temp_dir, wait_until};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_picket"))
}

/// One script file per node.
struct Clocks {
    dir: tempfile::TempDir,
}

impl Clocks {
    fn new() -> Self {
        Self { dir: temp_dir() }
    }

    fn path(&self, node_id: usize) -> PathBuf {
        self.dir.path().join(format!("clock-{node_id}"))
    }

    fn set(&self, node_id: usize, rate: f64, jump_ms: i64) {
        let script = format!("rate={rate} jump_ms={jump_ms}\n");
        let temporary = self.dir.path().join("clock.tmp");
        std::fs::write(&temporary, script).expect("the script is written");
        std::fs::rename(&temporary, self.path(node_id)).expect("the script is replaced");
    }

    fn args(&self, node_id: usize) -> Vec<String> {
        vec!["--test-clock-file".to_owned(), self.path(node_id).display().to_string()]
    }
}

/// A 3-node cluster, every node's clock scripted at rate 1 for now.
fn scripted_cluster() -> (Clocks, Cluster) {
    let clocks = Clocks::new();
    for node_id in 1..=3 {
        clocks.set(node_id, 1.0, 0);
    }
    let cluster = Cluster::start_each(binary(), 3, |node_id| {
        // Raft's timing does not matter here; a long election timeout keeps a loaded machine
        // from moving leadership in the middle of the test.
        let mut args: Vec<String> = ["--heartbeat-ms", "100", "--election-timeout-ms", "2000"]
            .iter()
            .map(|arg| (*arg).to_owned())
            .collect();
        args.extend(clocks.args(node_id));
        args
    });
    (clocks, cluster)
}

fn post(addrs: &[String], path: &str, body: &Value) -> picket_testkit::http::Reply {
    send(addrs, "POST", path, Some(body), Duration::from_secs(30)).expect("the service answers")
}

fn open_session(addrs: &[String], ttl_ms: u64) -> u64 {
    let reply = post(addrs, "/v1/sessions", &json!({ "ttl_ms": ttl_ms }));
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.body["session_id"].as_u64().expect("a session id")
}

fn acquire_try(addrs: &[String], session: u64, name: &str) -> u64 {
    let body = json!({ "name": name, "session_id": session, "wait_ms": 0 });
    let reply = post(addrs, "/v1/locks/acquire", &body);
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.body["token"].as_u64().expect("a token")
}

fn live_sessions(addrs: &[String]) -> Vec<u64> {
    let reply = send(addrs, "GET", "/v1/sessions", None, Duration::from_secs(30))
        .expect("the service answers");
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.body["sessions"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|session| session["session_id"].as_u64())
        .collect()
}

/// A waiting acquire in its own thread: its reply and when it came.
fn wait_for_lock(
    addrs: &[String],
    session: u64,
    name: &str,
) -> JoinHandle<(picket_testkit::http::Reply, Instant)> {
    let addrs_again = addrs;
    let addrs = addrs.to_vec();
    let body = json!({ "name": name, "session_id": session, "wait_ms": 60_000 });
    let handle = std::thread::spawn(move || {
        let reply = send(&addrs, "POST", "/v1/locks/acquire", Some(&body), Duration::from_secs(90))
            .expect("the service answers");
        (reply, Instant::now())
    });
    wait_until("the waiter to be queued", Duration::from_secs(10), || {
        let lock = lock(addrs_again, name);
        lock["waiters"].as_array()?.contains(&json!(session)).then_some(())
    });
    handle
}

fn lock(addrs: &[String], name: &str) -> Value {
    let reply = send(addrs, "GET", &format!("/v1/locks/{name}"), None, Duration::from_secs(30))
        .expect("the service answers");
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.body
}

/// Keepalives of some sessions every `period`, each answer kept, until stopped.
struct Keeper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<KeepAlive>>>,
}

#[derive(Debug)]
#[allow(dead_code, reason = "the session and code are read in failure messages, through Debug")]
struct KeepAlive {
    session: u64,
    sent_at: Instant,
    status: u16,
    code: String,
}

impl Keeper {
    fn start(addrs: &[String], sessions: &[u64], period: Duration) -> Self {
        Self::start_with(addrs, sessions, period, keep_alive)
    }

    /// Keeps `sessions` alive every `period` with `keep_alive`.
    fn start_with(
        addrs: &[String],
        sessions: &[u64],
        period: Duration,
        keep_alive: fn(&[String], u64) -> KeepAlive,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (addrs, sessions, stopping) = (addrs.to_vec(), sessions.to_vec(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut answers = Vec::new();
            while !stopping.load(Ordering::SeqCst) {
                let round = Instant::now();
                for session in &sessions {
                    answers.push(keep_alive(&addrs, *session));
                }
                std::thread::sleep(period.saturating_sub(round.elapsed()));
            }
            answers
        });
        Self { stop, thread: Some(thread) }
    }

    fn stop(self) -> Vec<KeepAlive> {
        Self::stop_all(vec![self])
    }

    /// Stops every keeper at once, then collects their answers.
    fn stop_all(keepers: Vec<Self>) -> Vec<KeepAlive> {
        for keeper in &keepers {
            keeper.stop.store(true, Ordering::SeqCst);
        }
        keepers
            .into_iter()
            .flat_map(|mut keeper| {
                let thread = keeper.thread.take().expect("running");
                thread.join().expect("the keeper does not panic")
            })
            .collect()
    }
}

/// Acquire and release cycles over eight locks by one session, until stopped. The session is
/// kept alive every few seconds: grants do not renew it, and a slow machine can stretch a test
/// past its TTL (CI once saw it expire 85 s into a run).
struct Load {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Load {
    fn start(addrs: &[String]) -> Self {
        let addrs = addrs.to_vec();
        let worker = open_session(&addrs, 60_000);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut cycles = 0_u64;
            let mut kept_at = Instant::now();
            while !stopping.load(Ordering::SeqCst) {
                if kept_at.elapsed() > Duration::from_secs(5) {
                    let kept = keep_alive(&addrs, worker);
                    assert_eq!(kept.status, 200, "the load's session: {kept:?}");
                    kept_at = Instant::now();
                }
                let name = format!("load/{}", cycles % 8);
                let token = acquire_try(&addrs, worker, &name);
                let body = json!({ "name": name, "session_id": worker, "token": token });
                let released = post(&addrs, "/v1/locks/release", &body);
                assert_eq!(released.status, 200, "{}", released.text);
                cycles += 1;
            }
            cycles
        });
        Self { stop, thread }
    }

    /// Stops the cycles and returns how many were done.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("the load does not panic")
    }
}

/// Opens `count` sessions of `ttl_ms`, each kept alive every third of its TTL from the moment
/// it opens, so a slow machine cannot let one expire before the test's fault.
fn open_kept(addrs: &[String], count: usize, ttl_ms: u64) -> (Vec<u64>, Vec<Keeper>) {
    open_kept_with(addrs, count, ttl_ms, keep_alive)
}

/// [`open_kept`], keeping them alive with `keep_alive`.
fn open_kept_with(
    addrs: &[String],
    count: usize,
    ttl_ms: u64,
    keep_alive: fn(&[String], u64) -> KeepAlive,
) -> (Vec<u64>, Vec<Keeper>) {
    (0..count)
        .map(|_| {
            let session = open_session(addrs, ttl_ms);
            let period = Duration::from_millis(ttl_ms / 3);
            (session, Keeper::start_with(addrs, &[session], period, keep_alive))
        })
        .unzip()
}

fn keep_alive(addrs: &[String], session: u64) -> KeepAlive {
    keep_alive_at(addrs, &format!("/v1/sessions/{session}/keepalive"), session)
}

/// This test process's clock, as a client sends it with its keepalives: milliseconds of real
/// time since the process first read it, under one clock id.
fn client_clock_query() -> String {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let clock_ms = ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64() * 1_000.0;
    format!("clock_id=77&clock_ms={clock_ms:.3}")
}

/// A keepalive that carries a reading of the client's clock (real time).
fn keep_alive_clocked(addrs: &[String], session: u64) -> KeepAlive {
    let path = format!("/v1/sessions/{session}/keepalive?{}", client_clock_query());
    keep_alive_at(addrs, &path, session)
}

fn keep_alive_at(addrs: &[String], path: &str, session: u64) -> KeepAlive {
    let sent_at = Instant::now();
    let reply = post(addrs, path, &json!({}));
    KeepAlive {
        session,
        sent_at,
        status: reply.status,
        code: reply.body["code"].as_str().unwrap_or_default().to_owned(),
    }
}

fn assert_all_kept_alive(answers: &[KeepAlive], after: Instant) {
    let refused: Vec<&KeepAlive> = answers.iter().filter(|answer| answer.status != 200).collect();
    assert!(refused.is_empty(), "keepalives refused: {refused:?}");
    let after_fault = answers.iter().filter(|answer| answer.sent_at > after).count();
    assert!(after_fault >= 3, "only {after_fault} keepalives were sent after the fault");
}

fn clock_gaps(addr: &str) -> u64 {
    let reply = try_request(addr, "GET", "/v1/cluster", None).expect("the node answers");
    reply.body["clock_gaps_total"].as_u64().expect("a gap count")
}

/// The scenario. Session A (TTL 5 s) holds `L` and keeps alive; session C waits for `L`;
/// session B's keepalive is acknowledged once, then B goes quiet. The leader's clock jumps 8 s
/// forward. Before the fix, the next tick expired A and B and granted `L` to C about a second
/// after A's last acknowledged keepalive.
#[test]
fn leader_clock_jump_expires_no_kept_alive_session_and_grants_no_waiter_early() {
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (clocks, cluster) = scripted_cluster();
    let leader = cluster.leader(Duration::from_secs(20));
    let addrs = cluster.addrs();
    let a = open_session(&addrs, 5_000);
    let b = open_session(&addrs, 5_000);
    let c = open_session(&addrs, 10_000);
    let token_a = acquire_try(&addrs, a, "L");
    let waiter = wait_for_lock(&addrs, c, "L");
    let keeper = Keeper::start(&addrs, &[a, c], Duration::from_millis(400));
    let b_kept = keep_alive(&addrs, b);
    assert_eq!(b_kept.status, 200);
    // A tick writes a keepalive within half a second; after a second, B's renewal is in the log
    // and nothing pending protects it from the jump.
    std::thread::sleep(Duration::from_secs(1));

    let jumped_at = Instant::now();
    clocks.set(leader + 1, 1.0, 8_000);
    // B was promised 5 s from its keepalive; look just before that runs out.
    let promised = b_kept.sent_at + Duration::from_millis(4_700);
    std::thread::sleep(promised.saturating_duration_since(Instant::now()));
    assert!(
        live_sessions(&addrs).contains(&b),
        "B expired before the TTL its acknowledged keepalive promised"
    );
    std::thread::sleep(Duration::from_secs(6).saturating_sub(jumped_at.elapsed()));
    let answers = keeper.stop();
    assert_all_kept_alive(&answers, jumped_at);
    assert!(!waiter.is_finished(), "C was granted L while A kept its session alive");
    assert_eq!(lock(&addrs, "L")["holder"]["session_id"], json!(a));
    assert_eq!(cluster.agreed_leader(), Some(leader), "the jump must not move leadership");
    assert!(clock_gaps(&addrs[leader]) >= 1, "the leader counts the jump as a gap");

    let released = post(
        &addrs,
        "/v1/locks/release",
        &json!({ "name": "L", "session_id": a, "token": token_a }),
    );
    assert_eq!(released.status, 200, "{}", released.text);
    let (granted, _) = waiter.join().expect("the waiter does not panic");
    assert_eq!(granted.status, 200, "{}", granted.text);
    assert!(granted.body["token"].as_u64().expect("a token") > token_a);
    // B went quiet: it still expires, a TTL and grace after the leader's refresh.
    wait_until("B to expire", Duration::from_secs(20), || {
        (!live_sessions(&addrs).contains(&b)).then_some(())
    });
}

/// A one-node leader is stopped for three TTLs while the clients of 40 sessions keep sending
/// keepalives, each on its own connection, then continued. Before the fix, its first tick after
/// the stall expired every session whose keepalive still sat unread in its sockets, and granted
/// the lock to the waiter.
#[test]
fn stalled_leader_expires_no_session_kept_alive_through_the_stall() {
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = temp_dir();
    let listen = format!("127.0.0.1:{}", free_port()).parse().expect("an address");
    let server = ServerProcess::start(binary(), &dir.path().join("node"), listen, &[]);
    let addrs = vec![server.addr.clone()];
    // Each session is kept alive from the moment it opens, so a slow machine cannot let one
    // expire before the stall.
    let (sessions, mut keepers) = open_kept(&addrs, 40, 2_000);
    let w = open_session(&addrs, 60_000);
    keepers.push(Keeper::start(&addrs, &[w], Duration::from_millis(600)));
    acquire_try(&addrs, sessions[0], "L");
    let waiter = wait_for_lock(&addrs, w, "L");
    std::thread::sleep(Duration::from_secs(1));

    let stalled_at = Instant::now();
    server.signal("-STOP");
    std::thread::sleep(Duration::from_secs(6));
    server.signal("-CONT");
    std::thread::sleep(Duration::from_secs(2));
    let answers = Keeper::stop_all(keepers);
    assert_all_kept_alive(&answers, stalled_at + Duration::from_secs(6));
    let live = live_sessions(&addrs);
    let gone: Vec<&u64> = sessions.iter().filter(|id| !live.contains(id)).collect();
    let of_gone: Vec<&KeepAlive> =
        answers.iter().filter(|answer| gone.contains(&&answer.session)).collect();
    assert!(
        gone.is_empty(),
        "sessions kept alive through the stall expired: {gone:?}: {of_gone:?}"
    );
    assert!(!waiter.is_finished(), "the waiter was granted L while its holder kept alive");
    assert_eq!(lock(&addrs, "L")["holder"]["session_id"], json!(sessions[0]));
    assert!(clock_gaps(&server.addr) >= 1, "the node counts the stall as a gap");
    // The waiter's thread ends with the server's process; it is not joined.
    drop(server);
    drop(waiter);
}

/// A one-node leader (no other clock to check its rate against, unlike a cluster's leader: see
/// the last test) whose clock runs at 1.5 or 0.5 times real time, under acquire and release load:
/// sessions kept alive every third of their TTL never expire. Its clients send readings of their
/// own clock (real time here) with their keepalives; once the fast leader has compared a few with
/// its own, a session whose client stops lives its TTL and grace by its client's clock (plus at
/// most half a second of the leader's clock for the renewal). Before, the fast leader expired it
/// a third early, before its client's own lease ended. The slow leader keeps it for its TTL by
/// the leader's clock, twice as long: a lease is never shortened by a client's clock, as a slow
/// clock that recovers would end it early (review of issue 21).
#[test]
fn fast_or_slow_leader_clock_expires_no_kept_alive_session() {
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for rate in [1.5, 0.5] {
        let clocks = Clocks::new();
        clocks.set(1, rate, 0);
        let dir = temp_dir();
        let listen = format!("127.0.0.1:{}", free_port()).parse().expect("an address");
        let server =
            ServerProcess::start(binary(), &dir.path().join("node"), listen, &clocks.args(1));
        let addrs = vec![server.addr.clone()];
        let (sessions, keepers): (Vec<u64>, Vec<Keeper>) = (0..20)
            .map(|_| {
                let session = open_session(&addrs, 1_500);
                let period = Duration::from_millis(500);
                (session, Keeper::start_with(&addrs, &[session], period, keep_alive_clocked))
            })
            .unzip();
        let started = Instant::now();
        let load = Load::start(&addrs);
        // Readings of one clock are paired two seconds of the leader's clock apart, and three
        // ratios make a rate counted off: 6 s of the leader's clock, 12 s in real time at rate
        // 0.5 (4 s at rate 1.5).
        wait_until(
            "the leader to find its clients' clocks at another rate",
            Duration::from_secs(40),
            || {
                let view = cluster_view(&server.addr);
                (view["client_clocks_off_rate"].as_u64() >= Some(1)).then_some(())
            },
        );
        std::thread::sleep(Duration::from_secs(5).saturating_sub(started.elapsed()));
        let gaps_before = clock_gaps(&server.addr);
        let quiet = open_session(&addrs, 1_500);
        let quiet_kept = keep_alive_clocked(&addrs, quiet);
        assert_eq!(quiet_kept.status, 200, "{quiet_kept:?}");
        wait_until("the quiet session to expire", Duration::from_secs(20), || {
            (!live_sessions(&addrs).contains(&quiet)).then_some(())
        });
        let lived_ms = quiet_kept.sent_at.elapsed().as_secs_f64() * 1_000.0;
        let cycles = load.stop();
        let answers = Keeper::stop_all(keepers);
        assert!(cycles > 10, "rate {rate}: only {cycles} acquire-release cycles");
        assert_all_kept_alive(&answers, started);
        let live = live_sessions(&addrs);
        let expired: Vec<&u64> = sessions.iter().filter(|id| !live.contains(id)).collect();
        assert!(expired.is_empty(), "rate {rate}: kept-alive sessions expired: {expired:?}");
        // On the fast leader the quiet session lives its TTL and grace by its client's clock
        // (2,000 ms, 2 % more for the margin the rate is counted with), plus a renewal delay of
        // up to 500 ms of the leader's clock (333 ms in real time). Uncorrected it lived
        // 1,333-1,667 ms, and expired before its client gave up on it (1,455 ms after sending).
        // On the slow leader, TTL, grace and renewal delay all run on the leader's clock:
        // 4,000-5,000 ms.
        let longest_ms = if rate > 1.0 { 2_040.0 + 500.0 / rate } else { 2_500.0 / rate };
        let shortest_ms = 2_000.0;
        eprintln!("rate {rate}: the quiet session lived {lived_ms:.0} ms after its keepalive");
        assert!(
            lived_ms > shortest_ms - 100.0,
            "rate {rate}: the quiet session lived {lived_ms:.0} ms after its keepalive, \
             expected at least {shortest_ms:.0} ms"
        );
        // A stall of the loaded machine (a gap) refreshes every session and lengthens its life;
        // the upper bound holds only without one while the quiet session lived.
        if clock_gaps(&server.addr) == gaps_before {
            assert!(
                lived_ms < longest_ms + 700.0,
                "rate {rate}: the quiet session lived {lived_ms:.0} ms after its keepalive, \
                 expected at most {longest_ms:.0} ms"
            );
        }
        if rate > 1.0 {
            new_clients_session_outlives_its_promise_from_its_first_keepalive(&server.addr, rate);
            quiet_session_outlives_a_refresh_by_its_clients_clock(&clocks, &server.addr, rate);
        }
    }
}

/// Issue 21: a new client (a clock the leader has not read) with a TTL of 3 s opens a session
/// with a reading of its clock, keeps it alive once a third of its TTL later, and goes quiet.
/// Its client counts on it for 2,910 ms after sending that keepalive, and the lease by its
/// clock, grace included, is 3,500 ms. The open and the keepalive are 1,500 ms apart by the
/// fast leader's clock, under the 2 s its pairs of readings need: the leader renewed the
/// session for its TTL and grace by its own clock, 2,333 ms in real time (at most about
/// 3,000 ms with the renewal's and the expiring tick's delays of up to 333 ms each), and it
/// could expire before its client gave up on it. That first short interval now gives the
/// client's clock a provisional rate, and the session lives its TTL and grace by it, counted
/// slower by the 20 ms of delay the interval may hide: about 3,600 ms, less 3.6 ms for each ms
/// by which the open arrived later after its reading than the keepalive did.
fn new_clients_session_outlives_its_promise_from_its_first_keepalive(addr: &str, rate: f64) {
    let addrs = vec![addr.to_owned()];
    let origin = Instant::now();
    let reading = || format!("clock_id=78&clock_ms={:.3}", origin.elapsed().as_secs_f64() * 1e3);
    let reply = post(&addrs, &format!("/v1/sessions?{}", reading()), &json!({ "ttl_ms": 3_000 }));
    assert_eq!(reply.status, 200, "{}", reply.text);
    let session = reply.body["session_id"].as_u64().expect("a session id");
    std::thread::sleep(Duration::from_millis(1_000).saturating_sub(origin.elapsed()));
    let path = format!("/v1/sessions/{session}/keepalive?{}", reading());
    let kept = keep_alive_at(&addrs, &path, session);
    assert_eq!(kept.status, 200, "{kept:?}");
    wait_until("the new client's session to expire", Duration::from_secs(20), || {
        (!live_sessions(&addrs).contains(&session)).then_some(())
    });
    let lived_ms = kept.sent_at.elapsed().as_secs_f64() * 1_000.0;
    eprintln!("rate {rate}: the new client's quiet session lived {lived_ms:.0} ms");
    assert!(
        lived_ms > 3_200.0,
        "rate {rate}: the new client's quiet session lived {lived_ms:.0} ms after its first \
         keepalive, expected more than 3,200 ms (its TTL and grace by its client's clock are \
         3,500 ms; by the leader's, at most about 3,000 ms)"
    );
}

/// Review of issue 21: a `Refresh` renewed every session for its TTL of the leader's clock,
/// cutting the lease a fast leader had lengthened for a quiet session's client. A session (TTL
/// 3 s, promised 3.5 s with the grace) is kept alive once with its client's clock, its tick is
/// written, and then the leader's clock jumps 600 ms ahead (a gap, so its next entry is a
/// refresh, written within the pulse's 100 ms). Counted from the refresh, the lengthened lease
/// runs (3,000 + 500) × 1.53 of the leader's clock, 3,570 ms in real time, so the session
/// outlives its promise. Cut to the TTL it ran 3,500 / 1.5 = 2,333 ms from the refresh, and
/// ended before its client's 3,500 ms (checked by cutting it: 3,244 ms).
fn quiet_session_outlives_a_refresh_by_its_clients_clock(clocks: &Clocks, addr: &str, rate: f64) {
    let addrs = vec![addr.to_owned()];
    let gaps_before = clock_gaps(addr);
    let quiet = open_session(&addrs, 3_000);
    let quiet_kept = keep_alive_clocked(&addrs, quiet);
    assert_eq!(quiet_kept.status, 200, "{quiet_kept:?}");
    // The renewal waits at most 500 ms for its tick (the driver sleeps in real time).
    std::thread::sleep(Duration::from_millis(700));
    let jumped_at = Instant::now();
    clocks.set(1, rate, 600);
    wait_until("the leader to see the jump", Duration::from_secs(10), || {
        (clock_gaps(addr) > gaps_before).then_some(())
    });
    wait_until("the quiet session to expire", Duration::from_secs(20), || {
        (!live_sessions(&addrs).contains(&quiet)).then_some(())
    });
    let lived_ms = quiet_kept.sent_at.elapsed().as_secs_f64() * 1_000.0;
    let after_jump_ms = jumped_at.elapsed().as_secs_f64() * 1_000.0;
    eprintln!(
        "rate {rate}: through a refresh, the quiet session lived {lived_ms:.0} ms, \
         {after_jump_ms:.0} ms of them after the jump"
    );
    // The refresh came after the jump: from it the lengthened lease runs 3,570 ms, the cut one
    // 2,333 ms; a late sleep before the jump cannot hide the cut from this bound.
    assert!(
        after_jump_ms > 3_000.0,
        "rate {rate}: the quiet session lived only {after_jump_ms:.0} ms after the jump that \
         refreshed it"
    );
    assert!(
        lived_ms > 3_400.0,
        "rate {rate}: through a refresh, the quiet session lived {lived_ms:.0} ms after its \
         keepalive, before its client's 3,500 ms ran out"
    );
}

fn cluster_view(addr: &str) -> Value {
    try_request(addr, "GET", "/v1/cluster", None).expect("the node answers").body
}

fn rate_factor(addr: &str) -> f64 {
    cluster_view(addr)["clock_rate_factor"].as_f64().expect("a rate factor")
}

/// Waits until the leader at `addr` runs its clock at `factor` (within 5 %).
fn wait_for_factor(addr: &str, factor: f64) {
    wait_until(
        &format!("the leader's clock factor to reach {factor}"),
        Duration::from_secs(20),
        || ((rate_factor(addr) - factor).abs() < factor * 0.05).then_some(()),
    );
}

/// A 3-node cluster under acquire and release load whose leader's clock runs at 0.5, then at 1.5
/// times real time. Its peers' clocks show it: the leader's lock state then runs at their rate, so a session whose client
/// stops is expired a TTL and grace (plus at most half a second of renewal delay) after its last
/// keepalive in *real* time, and kept-alive sessions live on. Before the rate check, the slow
/// leader kept the quiet session twice as long and the fast one expired it a third early, while
/// its client still counted on it. A follower's slow clock, one clock of three, moves nothing.
#[test]
fn slow_or_fast_leader_clock_is_corrected_by_its_peers_clocks() {
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (clocks, cluster) = scripted_cluster();
    let leader = cluster.leader(Duration::from_secs(20));
    let addrs = cluster.addrs();
    // The keepalives carry the client's clock, as the Rust and Python clients' do: the peers'
    // correction and the clients' must not add up.
    let (kept, keepers) = open_kept_with(&addrs, 5, 3_000, keep_alive_clocked);
    let load = Load::start(&addrs);
    let started = Instant::now();
    for rate in [0.5, 1.5] {
        // A session whose client stops just before the leader's clock turns slow lives through
        // the time it takes to find the slow clock, its TTL running at the slow rate meanwhile.
        let silent_at_the_turn = (rate < 1.0).then(|| {
            // Mid-term: the leader has read its peers' clocks for over ten seconds, a full
            // window of readings in the estimate as it used to be (twenty, every 500 ms).
            std::thread::sleep(Duration::from_secs(11).saturating_sub(started.elapsed()));
            let session = open_session(&addrs, 4_000);
            let kept = keep_alive(&addrs, session);
            assert_eq!(kept.status, 200, "{kept:?}");
            let addrs = addrs.clone();
            let expired = std::thread::spawn(move || {
                wait_until("the silent session to expire", Duration::from_secs(30), || {
                    (!live_sessions(&addrs).contains(&session)).then(Instant::now)
                })
            });
            (kept.sent_at, expired)
        });
        let gaps_before = clock_gaps(&addrs[leader]);
        clocks.set(leader + 1, rate, 0);
        let turned = Instant::now();
        wait_for_factor(&addrs[leader], 1.0 / rate);
        let found_ms = turned.elapsed().as_secs_f64() * 1_000.0;
        if let Some((sent_at, expired)) = silent_at_the_turn {
            let lived_ms = (expired.join().expect("expires") - sent_at).as_secs_f64() * 1_000.0;
            eprintln!(
                "the slow clock was found after {found_ms:.0} ms; the session silent from its \
                 start lived {lived_ms:.0} ms"
            );
            // Here only the lock state's clock is scripted; the probes run every 100 ms of real
            // time, each interval 50 ms of the slow clock. The slow clock is found by the third
            // probe after the turn (the first interval straddles it, the next two agree), about
            // 300 ms, later where round trips over 1 ms make an interval too short for its ratio
            // (measured 346-543 ms; 1.0-1.1 s with probes every 500 ms; 5.8 s before issue 21's
            // fix, which waited for half of a twenty-ratio window). A stall of the machine (a
            // gap) makes the leader refresh every session, which lengthens its life: then the
            // times say nothing.
            // Round trips of a few milliseconds on a loaded machine make an interval too short
            // for its ratio and the next reading pairs over a longer one, so the bound allows
            // 2 s (1.0-1.1 s with probes every 500 ms always, 5.8 s before the fix).
            assert!(found_ms < 2_000.0, "the slow clock was found after {found_ms:.0} ms");
            if clock_gaps(&addrs[leader]) == gaps_before {
                // What the client was promised, TTL + renewal delay + grace (5 s of the leader's
                // clock), plus half the time to find the slow clock at rate 0.5 and 500 ms of
                // slack for a loaded machine (measured 5.14-5.22 s; 5.5 s with probes every
                // 500 ms, 7.7 s before the fix).
                let longest_ms = 5_000.0 + found_ms * (1.0 - rate) + 500.0;
                assert!(
                    lived_ms < longest_ms,
                    "the silent session lived {lived_ms:.0} ms, more than {longest_ms:.0} ms"
                );
            }
        }
        let quiet_gaps_before = clock_gaps(&addrs[leader]);
        let quiet = open_session(&addrs, 2_000);
        let quiet_kept = keep_alive_clocked(&addrs, quiet);
        assert_eq!(quiet_kept.status, 200);
        wait_until("the quiet session to expire", Duration::from_secs(20), || {
            (!live_sessions(&addrs).contains(&quiet)).then_some(())
        });
        let lived_ms = quiet_kept.sent_at.elapsed().as_secs_f64() * 1_000.0;
        eprintln!("rate {rate}: the quiet session lived {lived_ms:.0} ms after its keepalive");
        assert!(
            lived_ms > 1_900.0,
            "rate {rate}: the quiet session lived {lived_ms:.0} ms after its keepalive, less \
             than its 2,000 ms TTL"
        );
        // TTL 2,000 ms + grace 500 ms + renewal delay up to 500 ms, the factor's 5 % tolerance
        // and a second of polling on a loaded machine; uncorrected, the slow leader takes 4 s,
        // and so did the quiet session while the clients' clocks' ratios from before the factor
        // changed corrected the slow clock a second time (found in review).
        if clock_gaps(&addrs[leader]) == quiet_gaps_before {
            assert!(
                lived_ms < 3_900.0,
                "rate {rate}: the quiet session lived {lived_ms:.0} ms after its keepalive"
            );
        }
        clocks.set(leader + 1, 1.0, 0);
        wait_for_factor(&addrs[leader], 1.0);
    }

    // Both followers' rates back at 1 first: the factor returns to 1 as soon as one of them is
    // (the middle of three clocks), while the other's window may still hold ratios from the
    // fast leader, which would then be the middle clock once the first is slowed (found in
    // review).
    wait_until("the leader to read both followers' clocks at 1", Duration::from_secs(20), || {
        let view = cluster_view(&addrs[leader]);
        let rates = view["peer_clock_rates"].as_object()?;
        (rates.len() == 2
            && rates
                .values()
                .all(|rate| rate.as_f64().is_some_and(|rate| (rate - 1.0).abs() < 0.02)))
        .then_some(())
    });
    let follower = (leader + 1) % 3;
    clocks.set(follower + 1, 0.5, 0);
    wait_until("the leader to see the follower's slow clock", Duration::from_secs(20), || {
        let rate = cluster_view(&addrs[leader])["peer_clock_rates"][(follower + 1).to_string()]
            .as_f64()?;
        ((rate - 0.5).abs() < 0.05).then_some(())
    });
    assert!(
        (rate_factor(&addrs[leader]) - 1.0).abs() < 1e-9,
        "one slow follower of three moved the leader's clock"
    );
    let cycles = load.stop();
    assert!(cycles > 10, "only {cycles} acquire-release cycles");
    let answers = Keeper::stop_all(keepers);
    assert_all_kept_alive(&answers, started);
    let live = live_sessions(&addrs);
    let expired: Vec<&u64> = kept.iter().filter(|id| !live.contains(id)).collect();
    assert!(expired.is_empty(), "kept-alive sessions expired: {expired:?}");
    assert_eq!(cluster.agreed_leader(), Some(leader), "clock rates must not move leadership");
}
