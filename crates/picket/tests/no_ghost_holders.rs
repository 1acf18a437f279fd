//! Issue 14's promise against the real thing: no ghost holders, with a real `picket serve`, the
//! real server shell and the real Rust client. (`picket-core`'s `no_ghost_holders.rs` checks the
//! same rules on the state machine with the shell and client modelled; this runs them.)
//!
//! Three clients, each with a session and its own TCP proxy in front of the server, ask for two
//! locks in random interleavings drawn from a seed: try, bounded and unbounded waits; a caller
//! that gives up (its request's future dropped); connections cut under requests in flight (the
//! client retries them with the same request id); releases, guards dropped without one; and a
//! client cut off for longer than its TTL, so its session expires. After every step, once what
//! is in flight has settled (waited for, never slept on), the server and the clients agree:
//!
//! - every holder the server has is a guard the client holds (not lost), or a request of that
//!   session for that lock still in progress, and every waiter is such a request;
//! - every guard whose grant ended other than by its own release has fired `lost()`.
//!
//! At the end of each case every guard is released and every request given up, and both locks
//! are free while the sessions still live.

use picket_client::{Client, ClientError, Guard, Session};
use picket_testkit::{ServerProcess, TcpProxy};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

const CLIENTS: usize = 3;
const LOCKS: [&str; 2] = ["ghost/a", "ghost/b"];
const TTL: Duration = Duration::from_secs(2);
const STEPS: usize = 40;
/// How long the server and the clients may take to agree after a step.
const SETTLE: Duration = Duration::from_secs(15);

/// One client: its proxy, its current session, its guards and its requests in progress.
struct Slot {
    proxy: TcpProxy,
    client: Client,
    session: Arc<Session>,
    /// Guards by lock, with the session they belong to (an expired session's guards stay until
    /// the check has seen them lost).
    guards: BTreeMap<usize, Vec<(u64, Guard)>>,
    /// Requests in progress by lock, with their session.
    requests: BTreeMap<usize, (u64, JoinHandle<Result<Guard, ClientError>>)>,
}

impl Slot {
    async fn open(upstream: &str) -> Self {
        let proxy = TcpProxy::start(upstream.to_owned()).await;
        let client = Client::connect([proxy.addr.clone()]).await.expect("connects");
        let session = Arc::new(client.session(TTL).await.expect("a session"));
        Self { proxy, client, session, guards: BTreeMap::new(), requests: BTreeMap::new() }
    }

    /// Moves finished requests' guards into `guards`, and opens a new session if this one is
    /// lost and nothing of it is still asking.
    async fn reap(&mut self) {
        let finished: Vec<usize> = self
            .requests
            .iter()
            .filter(|(_, (_, request))| request.is_finished())
            .map(|(lock, _)| *lock)
            .collect();
        for lock in finished {
            let (session, request) = self.requests.remove(&lock).expect("listed");
            if let Ok(Ok(guard)) = request.await {
                self.guards.entry(lock).or_default().push((session, guard));
            }
        }
        if self.session.lost_reason().is_some()
            && self.requests.is_empty()
            && let Ok(session) = self.client.session(TTL).await
        {
            self.session = Arc::new(session);
        }
    }

    fn busy(&self, lock: usize) -> bool {
        self.requests.contains_key(&lock)
            || self
                .guards
                .get(&lock)
                .is_some_and(|guards| guards.iter().any(|(_, guard)| guard.lost_reason().is_none()))
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Ask { slot: usize, lock: usize, wait_ms: Option<u64> },
    GiveUp { slot: usize, lock: usize },
    Cut { slot: usize },
    Release { slot: usize, lock: usize },
    DropGuard { slot: usize, lock: usize },
    CutOffPastTtl { slot: usize },
    Pause { ms: u64 },
}

fn draw(rng: &mut picket_sim::Rng) -> Step {
    let slot = usize::try_from(rng.range(0, CLIENTS as u64)).expect("small");
    let lock = usize::try_from(rng.range(0, LOCKS.len() as u64)).expect("small");
    match rng.range(0, 100) {
        0..35 => {
            let wait_ms = match rng.range(0, 3) {
                0 => Some(0),
                1 => Some(rng.range(50, 1_500)),
                _ => None,
            };
            Step::Ask { slot, lock, wait_ms }
        }
        35..45 => Step::GiveUp { slot, lock },
        45..57 => Step::Cut { slot },
        57..77 => Step::Release { slot, lock },
        77..85 => Step::DropGuard { slot, lock },
        85..88 => Step::CutOffPastTtl { slot },
        _ => Step::Pause { ms: rng.range(0, 300) },
    }
}

async fn take(observer: &Client, slots: &mut [Slot], step: Step) {
    match step {
        Step::Ask { slot, lock, wait_ms } => {
            let slot = &mut slots[slot];
            if slot.busy(lock) || slot.session.lost_reason().is_some() {
                return;
            }
            let session = slot.session.clone();
            let request = tokio::spawn(async move {
                match wait_ms {
                    Some(0) => session.try_lock(LOCKS[lock]).await,
                    Some(ms) => session.lock_timeout(LOCKS[lock], Duration::from_millis(ms)).await,
                    None => session.lock(LOCKS[lock]).await,
                }
            });
            slot.requests.insert(lock, (slot.session.id(), request));
        }
        Step::GiveUp { slot, lock } => {
            if let Some((_, request)) = slots[slot].requests.remove(&lock) {
                request.abort();
            }
        }
        Step::Cut { slot } => slots[slot].proxy.cut(),
        Step::Release { slot, lock } => {
            if let Some((_, guard)) = slots[slot].guards.get_mut(&lock).and_then(Vec::pop) {
                let _ = tokio::time::timeout(SETTLE, guard.release()).await;
            }
        }
        Step::DropGuard { slot, lock } => {
            slots[slot].guards.get_mut(&lock).and_then(Vec::pop);
        }
        Step::CutOffPastTtl { slot } => {
            let slot = &mut slots[slot];
            slot.proxy.block(true);
            // Until the server has expired the session (TTL, its grace and a tick): the client
            // must have marked it lost by then, by its own clock.
            let session = slot.session.id();
            let deadline = tokio::time::Instant::now() + SETTLE;
            while observer
                .sessions(1_000)
                .await
                .is_ok_and(|sessions| sessions.iter().any(|info| info.session.0 == session))
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            slot.proxy.block(false);
        }
        Step::Pause { ms } => tokio::time::sleep(Duration::from_millis(ms)).await,
    }
}

/// What is wrong now, if anything: see the module documentation.
async fn disagreements(observer: &Client, slots: &[Slot]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (index, name) in LOCKS.iter().enumerate() {
        let info = match observer.lock_info(name).await {
            Ok(info) => info,
            Err(error) => {
                wrong.push(format!("{name}: the lock could not be read: {error}"));
                continue;
            }
        };
        // Session 0 is never a session: "nobody" in what follows.
        let (holder, token) = info.holder.as_ref().map_or((0, 0), |h| (h.session.0, h.token));
        let asking = |session: u64| {
            slots.iter().any(|slot| {
                slot.requests.get(&index).is_some_and(|(asked_in, _)| *asked_in == session)
            })
        };
        if holder != 0 {
            let guarded = slots.iter().any(|slot| {
                slot.guards.get(&index).is_some_and(|guards| {
                    guards.iter().any(|(session, guard)| {
                        *session == holder
                            && guard.token() == token
                            && guard.lost_reason().is_none()
                    })
                })
            });
            if !guarded && !asking(holder) {
                wrong.push(format!(
                    "{name}: session {} holds token {} and no guard or request knows it",
                    holder, token
                ));
            }
        }
        for waiter in &info.waiters {
            if !asking(waiter.0) {
                wrong.push(format!("{name}: session {waiter} waits and no request knows it"));
            }
        }
        for slot in slots {
            for (session, guard) in slot.guards.get(&index).into_iter().flatten() {
                let holds = holder == *session && token == guard.token();
                if !holds && guard.lost_reason().is_none() {
                    wrong.push(format!(
                        "{name}: the guard of session {session} with token {} was not told its \
                         grant ended (the lock: session {} token {})",
                        guard.token(),
                        holder,
                        token
                    ));
                }
            }
        }
    }
    wrong
}

/// Waits until the server and the clients agree, then forgets the guards that are lost.
async fn settle(observer: &Client, slots: &mut [Slot], log: &str) {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        for slot in slots.iter_mut() {
            slot.reap().await;
        }
        let wrong = disagreements(observer, slots).await;
        if wrong.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after {} s the server and the clients still disagree:\n{}\nsteps:\n{log}",
            SETTLE.as_secs(),
            wrong.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for slot in slots.iter_mut() {
        for guards in slot.guards.values_mut() {
            guards.retain(|(_, guard)| guard.lost_reason().is_none());
        }
    }
}

/// Releases every guard and gives up every request, then waits for both locks to be free while
/// the sessions still live (closing them would free any ghost and hide it), then closes them.
async fn wind_down(observer: &Client, slots: &mut Vec<Slot>, log: &str) {
    for slot in slots.iter_mut() {
        for (_, request) in std::mem::take(&mut slot.requests).into_values() {
            request.abort();
        }
        for (_, guard) in std::mem::take(&mut slot.guards).into_values().flatten() {
            let _ = tokio::time::timeout(SETTLE, guard.release()).await;
        }
    }
    let deadline = tokio::time::Instant::now() + SETTLE;
    for name in LOCKS {
        loop {
            let info = observer.lock_info(name).await.expect("the lock can be read");
            if info.holder.is_none() && info.waiters.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} is still held or waited for with every request and guard gone: \
                 {info:?}\nsteps:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    slots.clear();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_interleavings_leave_no_ghost_holder_and_every_lost_grant_is_told() {
    let (_dir, server) = ServerProcess::start_ready(Path::new(env!("CARGO_BIN_EXE_picket")), &[]);
    let observer = Client::connect([server.addr.clone()]).await.expect("connects");
    let cases = picket_testkit::fuzz_cases(3);
    for seed in 1..=u64::from(cases) {
        let mut rng = picket_sim::Rng::new(seed);
        let mut slots = Vec::new();
        for _ in 0..CLIENTS {
            slots.push(Slot::open(&server.addr).await);
        }
        let mut log = format!("seed {seed}\n");
        for _ in 0..STEPS {
            let step = draw(&mut rng);
            let _ = writeln!(log, "{step:?}");
            take(&observer, &mut slots, step).await;
            settle(&observer, &mut slots, &log).await;
        }
        wind_down(&observer, &mut slots, &log).await;
    }
}
