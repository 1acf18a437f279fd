//! One chaos client process: loops acquire, fence on acquire, read, think, append, release,
//! and prints every invocation and completion as a JSON line on standard output.
//!
//! It never checks `Guard::lost()` before writing: it behaves like the worst client, one that
//! paused after its last check, so that only the fence stands between its late writes and the
//! data. It stops after the current cycle once its standard input closes.
//!
//! SIGUSR1 stalls it: its current think (or its next one) lasts twice its session TTL, like a
//! worker busy with a long job. The harness sends it with `client_isolate`, so that a holder cut
//! off from every node is still working when its session expires and the lock moves on.

use super::history::{Event, Lease, Op, Phase, now_ns};
use anyhow::Context;
use picket_client::{Client, ClientError, Guard, Released, Session};
use picket_fence::http::SEQUENCER_HEADER;
use picket_proto::http1;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// A stall asked for by SIGUSR1 and not yet served: a `Notify` permit, taken by the think
/// running when it arrives or else by the next one, once.
#[derive(Debug, Default)]
struct Stall {
    wake: Notify,
}

impl Stall {
    /// Listens for SIGUSR1 for the rest of the process's life.
    fn listen() -> anyhow::Result<Arc<Self>> {
        use tokio::signal::unix::{SignalKind, signal};
        let stall = Arc::new(Self::default());
        let mut signals =
            signal(SignalKind::user_defined1()).context("cannot listen for SIGUSR1")?;
        let asked = stall.clone();
        tokio::spawn(async move {
            while signals.recv().await.is_some() {
                asked.wake.notify_one();
            }
        });
        Ok(stall)
    }

    /// Thinks for `think`, or for `long` from the moment a stall is asked for.
    async fn think(&self, think: Duration, long: Duration) {
        tokio::select! {
            () = tokio::time::sleep(think) => {}
            () = self.wake.notified() => tokio::time::sleep(long).await,
        }
    }
}

/// How one client process behaves.
#[derive(Clone, Debug)]
pub struct ClientPlan {
    /// This process's number, from 1.
    pub process: u32,
    /// The store's URL, e.g. `http://127.0.0.1:7690`.
    pub kv: String,
    /// The lock.
    pub lock: String,
    /// The guarded key holding the list; its prefix is bound to `lock`.
    pub key: String,
    /// The guarded prefix, for fence registration.
    pub prefix: String,
    /// The session TTL.
    pub ttl: Duration,
    /// Longest think time between the read and the write.
    pub think: Duration,
    /// Seed of the think times.
    pub seed: u64,
}

fn emit(event: &Event) {
    let mut out = std::io::stdout().lock();
    // A client whose harness went away has nobody to tell; it stops at its next cycle.
    let _ = serde_json::to_writer(&mut out, event);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// An error body's `code`, or the status when it has none.
fn refusal_code(reply: &http1::Http1Reply) -> String {
    serde_json::from_slice::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|body| body["code"].as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("http_{}", reply.status))
}

/// What a call to the store said, as a history phase: 2xx ok, 4xx a refusal (nothing was
/// done), anything else or no answer unknown.
fn phase_of(reply: Result<http1::Http1Reply, http1::Http1Error>, value: bool) -> (Phase, bool) {
    match reply {
        Ok(reply) if (200..300).contains(&reply.status) => {
            let value = value.then(|| reply.text());
            (Phase::Ok { token: None, session: None, value }, true)
        }
        // A missing key reads as the empty list.
        Ok(reply) if value && reply.status == 404 => {
            (Phase::Ok { token: None, session: None, value: Some(String::new()) }, true)
        }
        Ok(reply) if (400..500).contains(&reply.status) => {
            (Phase::Fail { code: refusal_code(&reply) }, false)
        }
        Ok(reply) => (Phase::Info { detail: format!("{}: {}", reply.status, reply.text()) }, false),
        Err(error) => (Phase::Info { detail: format!("{error:#}") }, false),
    }
}

fn acquire_phase(error: &ClientError) -> Phase {
    match error {
        ClientError::Service { code, .. } => Phase::Fail { code: code.as_str().to_owned() },
        ClientError::UnknownRefusal { code, .. } => Phase::Fail { code: code.clone() },
        ClientError::SessionLost(_) => Phase::Fail { code: "session_lost".into() },
        ClientError::InvalidArgument(_) => Phase::Fail { code: "invalid_argument".into() },
        other => Phase::Info { detail: other.to_string() },
    }
}

/// Runs the client until its standard input closes.
///
/// # Errors
/// Only when it cannot start; failures of the service are recorded, not returned.
pub async fn run(plan: ClientPlan, endpoints: Vec<String>) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let stall = Stall::listen()?;
    let client = Client::connect(endpoints).await.context("cannot reach Picket")?;
    let mut rng = picket_sim::Rng::new(plan.seed ^ u64::from(plan.process));
    let mut session: Option<Arc<Session>> = None;
    let mut cycle: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let current = match session.take() {
            Some(open) if open.lost_reason().is_none() => open,
            _ => match client.session(plan.ttl).await {
                Ok(open) => {
                    let open = Arc::new(open);
                    report_leases(plan.process, &open);
                    open
                }
                Err(error) => {
                    tracing::debug!(%error, "cannot open a session; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        cycle += 1;
        run_cycle(&plan, &current, (cycle, &stall), &mut rng).await;
        session = Some(current);
    }
    // The lease reports hold the session for an instant at a time: wait for the last one.
    let mut session = session;
    for _ in 0..100 {
        match session.map(Arc::try_unwrap) {
            Some(Ok(open)) => {
                let _ = open.close().await;
                break;
            }
            Some(Err(shared)) => session = Some(shared),
            None => break,
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// How often a client looks at its lease.
const LEASE_LOOK: Duration = Duration::from_millis(20);

/// Reports the session's lease whenever a confirmed keepalive extends it, until the session is
/// lost or dropped, so the checker can tell whether a lock left the session while its client
/// still counted on it. A report may come up to [`LEASE_LOOK`] late (or not at all if the
/// process is stopped meanwhile): the checker then sees less of the lease, never more.
fn report_leases(process: u32, session: &Arc<Session>) {
    let session = Arc::downgrade(session);
    tokio::spawn(async move {
        let mut reported_until_ns = 0;
        loop {
            let lost = {
                let Some(session) = session.upgrade() else { return };
                // The clock first: a stop between the two readings then shortens the lease
                // reported, never lengthens it.
                let read_ns = now_ns();
                let remaining = session.lease_remaining();
                let until_ns =
                    read_ns.saturating_add(u64::try_from(remaining.as_nanos()).unwrap_or(u64::MAX));
                // A keepalive moves the lease by about a third of the TTL; the step filters
                // out the jitter of reading two clocks.
                if !remaining.is_zero()
                    && Duration::from_nanos(until_ns.saturating_sub(reported_until_ns)) > LEASE_LOOK
                {
                    emit(&Event::lease(process, Lease { session: session.id(), until_ns }));
                    reported_until_ns = until_ns;
                }
                session.lost_reason().is_some()
            };
            if lost {
                return;
            }
            tokio::time::sleep(LEASE_LOOK).await;
        }
    });
}

/// One acquire, register, read, think, write, release.
async fn run_cycle(
    plan: &ClientPlan,
    session: &Arc<Session>,
    (cycle, stall): (u64, &Stall),
    rng: &mut picket_sim::Rng,
) {
    let process = plan.process;
    emit(&Event::client(process, Op::Acquire, Phase::Invoke));
    let guard = match session.lock_timeout(&plan.lock, Duration::from_secs(3)).await {
        Ok(guard) => guard,
        Err(error) => {
            emit(&Event::client(process, Op::Acquire, acquire_phase(&error)));
            return;
        }
    };
    let token = guard.token();
    let granted = Phase::Ok { token: Some(token), session: Some(session.id()), value: None };
    emit(&Event::client(process, Op::Acquire, granted));
    let headers = [(SEQUENCER_HEADER, guard.sequencer().to_string())];

    let op = Op::Register { token };
    emit(&Event::client(process, op.clone(), Phase::Invoke));
    let url = format!("{}/fence/{}", plan.kv, plan.prefix);
    let (phase, registered) =
        phase_of(http1::send(hyper::Method::POST, &url, &headers, Vec::new()).await, false);
    emit(&Event::client(process, op, phase));
    if !registered {
        release(process, guard).await;
        return;
    }

    let op = Op::Read { token };
    emit(&Event::client(process, op.clone(), Phase::Invoke));
    let url = format!("{}/kv/{}", plan.kv, plan.key);
    let (phase, read) =
        phase_of(http1::send(hyper::Method::GET, &url, &headers, Vec::new()).await, true);
    let list = match &phase {
        Phase::Ok { value: Some(value), .. } => value.clone(),
        _ => String::new(),
    };
    emit(&Event::client(process, op, phase));
    if !read {
        release(process, guard).await;
        return;
    }

    // Think: a pause of this process lands here as often as anywhere.
    let think_ms = u64::try_from(plan.think.as_millis()).unwrap_or(u64::MAX).max(1);
    stall.think(Duration::from_millis(rng.range(0, think_ms)), 2 * plan.ttl).await;

    let element = format!("p{process}-{cycle}");
    let op = Op::Write { token, element: element.clone() };
    emit(&Event::client(process, op.clone(), Phase::Invoke));
    let value = format!("{list}{element}\n").into_bytes();
    let (phase, _) = phase_of(http1::send(hyper::Method::PUT, &url, &headers, value).await, false);
    emit(&Event::client(process, op, phase));
    release(process, guard).await;
}

async fn release(process: u32, guard: Guard) {
    let op = Op::Release { token: guard.token() };
    emit(&Event::client(process, op.clone(), Phase::Invoke));
    let phase = match guard.release().await {
        Ok(Released::Now) => Phase::Ok { token: None, session: None, value: None },
        // The grant ended before (its session expired, or a retried release's first attempt
        // ended it): this release may or may not have been the one.
        Ok(_) => Phase::Info { detail: "the grant had already ended".into() },
        Err(error) => acquire_phase(&error),
    };
    emit(&Event::client(process, op, phase));
}
