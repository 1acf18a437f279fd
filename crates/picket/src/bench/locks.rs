//! The lock modes: clients that acquire and release in a loop, one lock each (uncontended) or
//! one lock for all (contended), timing every step and checking that no two hold a lock at
//! once and no token goes back.

use super::{BenchArgs, Mode, Outcome, cpu_seconds, percent};
use crate::connect::Connect;
use anyhow::Context;
use hdrhistogram::Histogram;
use picket_client::{Client, Guard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(super) struct Recorder {
    acquire: Histogram<u64>,
    release: Histogram<u64>,
    cycle: Histogram<u64>,
    ops: u64,
    errors: u64,
}

impl Recorder {
    fn new() -> Self {
        let histogram =
            || Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds");
        Self { acquire: histogram(), release: histogram(), cycle: histogram(), ops: 0, errors: 0 }
    }

    fn add(&mut self, other: &Self) {
        self.acquire.add(&other.acquire).expect("same bounds");
        self.release.add(&other.release).expect("same bounds");
        self.cycle.add(&other.cycle).expect("same bounds");
        self.ops += other.ops;
        self.errors += other.errors;
    }
}

pub(super) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Safety checks shared by all clients.
#[derive(Debug, Default)]
pub(super) struct Checks {
    /// Lock name to the client that holds it, as the clients themselves believe.
    holders: Mutex<HashMap<String, usize>>,
    /// Lock name to the last token seen.
    tokens: Mutex<HashMap<String, u64>>,
    violations: AtomicU64,
    token_regressions: AtomicU64,
}

impl Checks {
    fn acquired(&self, client: usize, guard: &Guard) {
        let name = guard.name().to_owned();
        if let Some(other) = self.holders.lock().expect("not poisoned").insert(name.clone(), client)
            && other != client
        {
            self.violations.fetch_add(1, Ordering::Relaxed);
        }
        let mut tokens = self.tokens.lock().expect("not poisoned");
        let last = tokens.entry(name).or_insert(0);
        if guard.token() <= *last {
            self.token_regressions.fetch_add(1, Ordering::Relaxed);
        }
        *last = guard.token();
    }

    fn releasing(&self, name: &str) {
        self.holders.lock().expect("not poisoned").remove(name);
    }
}

pub(super) struct Window {
    measure_from: Instant,
    end: Instant,
}

/// A progress bar on standard error while a run is measured, when that is a terminal.
pub(super) async fn show_progress(window: Arc<Window>, ops: Arc<AtomicU64>) {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return;
    }
    let total = (window.end - window.measure_from).as_secs_f64();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = Instant::now();
        let done = if now < window.measure_from {
            0.0
        } else {
            (now.min(window.end) - window.measure_from).as_secs_f64()
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let filled = ((done / total) * 30.0) as usize;
        eprint!(
            "\r[{}{}] {done:5.1}/{total:.1} s  {} ops",
            "#".repeat(filled.min(30)),
            " ".repeat(30 - filled.min(30)),
            ops.load(Ordering::Relaxed)
        );
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn run_client(
    client: Client,
    index: usize,
    mode: Mode,
    ttl: Duration,
    window: Arc<Window>,
    checks: Arc<Checks>,
    ops: Arc<AtomicU64>,
    max_ops: u64,
) -> anyhow::Result<Recorder> {
    let session = client.session(ttl).await?;
    let name = match mode {
        Mode::Contended => "bench/contended".to_owned(),
        _ => format!("bench/uncontended/{index}"),
    };
    let mut recorder = Recorder::new();
    while Instant::now() < window.end && ops.load(Ordering::Relaxed) < max_ops {
        let started = Instant::now();
        let guard = match session.lock(&name).await {
            Ok(guard) => guard,
            Err(error) => {
                tracing::warn!(%error, "acquire failed");
                recorder.errors += 1;
                continue;
            }
        };
        let acquired = Instant::now();
        checks.acquired(index, &guard);
        checks.releasing(&name);
        let released = guard.release().await;
        let done = Instant::now();
        if released.is_err() {
            recorder.errors += 1;
        }
        if started >= window.measure_from && done <= window.end {
            recorder.acquire.record(micros(acquired - started)).ok();
            recorder.release.record(micros(done - acquired)).ok();
            recorder.cycle.record(micros(done - started)).ok();
            recorder.ops += 1;
            ops.fetch_add(1, Ordering::Relaxed);
        }
    }
    session.close().await.ok();
    Ok(recorder)
}

pub(super) async fn run_locks(
    args: &BenchArgs,
    connect: &Connect,
) -> anyhow::Result<(Recorder, Arc<Checks>, f64)> {
    let checks = Arc::new(Checks::default());
    let ops = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        clients.push(connect.connect().await.context("connecting a benchmark client")?);
    }
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup_secs);
    let window =
        Arc::new(Window { measure_from, end: measure_from + Duration::from_secs_f64(args.secs) });
    let ttl = Duration::from_millis(args.ttl_ms);
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(index, client)| {
            tokio::spawn(run_client(
                client,
                index,
                args.mode,
                ttl,
                window.clone(),
                checks.clone(),
                ops.clone(),
                args.max_ops,
            ))
        })
        .collect();
    let progress = tokio::spawn(show_progress(window.clone(), ops.clone()));
    let mut total = Recorder::new();
    for task in tasks {
        total.add(&task.await??);
    }
    progress.abort();
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprint!("\r{:60}\r", "");
    }
    let measured = (window.end.min(Instant::now()) - window.measure_from).as_secs_f64();
    Ok((total, checks, measured))
}

pub(super) async fn measure_locks(
    args: &BenchArgs,
    connect: &Connect,
    server_pid: Option<&str>,
) -> anyhow::Result<Outcome> {
    let server_cpu_start = server_pid.and_then(cpu_seconds);
    let client_cpu_start = cpu_seconds("self");
    let wall = Instant::now();
    let (recorder, checks, measured) = run_locks(args, connect).await?;
    let wall = wall.elapsed().as_secs_f64();
    let share = |end: Option<f64>, start: Option<f64>| {
        end.zip(start).map(|(end, start)| (end - start) / wall * 100.0)
    };
    let server_cpu = share(server_pid.and_then(cpu_seconds), server_cpu_start);
    let client_cpu = share(cpu_seconds("self"), client_cpu_start);
    #[allow(clippy::cast_precision_loss)]
    let ops_per_s = recorder.ops as f64 / measured;
    let mode = if args.mode == Mode::Contended { "contended" } else { "uncontended" };
    let violations = checks.violations.load(Ordering::Relaxed);
    let token_regressions = checks.token_regressions.load(Ordering::Relaxed);
    let line = format!(
        "RESULT system=picket mode={mode} clients={} secs={measured:.1} ops={} ops_per_s={ops_per_s:.0} acq_p50_us={} acq_p99_us={} acq_max_us={} rel_p50_us={} rel_p99_us={} cycle_p50_us={} cycle_p99_us={} errors={} violations={violations} token_regressions={token_regressions} server_cpu_pct={} client_cpu_pct={} tag={}",
        args.clients,
        recorder.ops,
        recorder.acquire.value_at_quantile(0.5),
        recorder.acquire.value_at_quantile(0.99),
        recorder.acquire.max(),
        recorder.release.value_at_quantile(0.5),
        recorder.release.value_at_quantile(0.99),
        recorder.cycle.value_at_quantile(0.5),
        recorder.cycle.value_at_quantile(0.99),
        recorder.errors,
        percent(server_cpu),
        percent(client_cpu),
        args.tag
    );
    Ok(Outcome { line, safe: violations == 0 && token_regressions == 0 })
}
