//! The sessions mode: many sessions kept alive, the server's CPU and memory measured.

use super::{BenchArgs, Outcome, cpu_seconds, percent};
use crate::connect::Connect;
use std::time::{Duration, Instant};

/// Opens many sessions and keeps them alive; counts sessions that were lost.
pub(super) async fn run_sessions(
    args: &BenchArgs,
    connect: &Connect,
    server_pid: Option<&str>,
) -> anyhow::Result<(u64, u64, Option<f64>, Option<f64>)> {
    // Sessions share a few connections, as many processes on one machine must: one connection
    // per session would exhaust file descriptors long before the server. Each connection's
    // sessions send their keepalives together (KeepAliveMany).
    let connections = args.clients.max(1);
    let ttl = Duration::from_millis(args.ttl_ms);
    let mut openers = Vec::with_capacity(connections);
    for index in 0..connections {
        let client = connect.connect().await?;
        let count = args.sessions / connections + usize::from(index < args.sessions % connections);
        openers.push(tokio::spawn(async move {
            let mut sessions = Vec::with_capacity(count);
            for _ in 0..count {
                sessions.push(client.session(ttl).await?);
            }
            anyhow::Ok(sessions)
        }));
    }
    let mut sessions = Vec::with_capacity(args.sessions);
    for opener in openers {
        sessions.extend(opener.await??);
    }
    eprintln!("picket bench: {} sessions open; keeping them alive", sessions.len());
    // CPU is measured over the steady keepalive window only, after the warm-up.
    tokio::time::sleep(Duration::from_secs_f64(args.warmup_secs)).await;
    let (server_start, client_start, started) =
        (server_pid.and_then(cpu_seconds), cpu_seconds("self"), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(args.secs)).await;
    let wall = started.elapsed().as_secs_f64();
    let share = |end: Option<f64>, start: Option<f64>| {
        end.zip(start).map(|(end, start)| (end - start) / wall * 100.0)
    };
    let server_cpu = share(server_pid.and_then(cpu_seconds), server_start);
    let client_cpu = share(cpu_seconds("self"), client_start);
    let lost = sessions.iter().filter(|session| session.lost_reason().is_some()).count() as u64;
    Ok((sessions.len() as u64, lost, server_cpu, client_cpu))
}

pub(super) async fn measure_sessions(
    args: &BenchArgs,
    connect: &Connect,
    server_pid: Option<&str>,
) -> anyhow::Result<Outcome> {
    let (opened, lost, server_cpu, client_cpu) = run_sessions(args, connect, server_pid).await?;
    let rss = server_pid
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .map(|line| line.split_whitespace().nth(1).unwrap_or("0").to_owned())
        });
    let line = format!(
        "RESULT system=picket mode=sessions sessions={opened} connections={} ttl_ms={} secs={:.1} expired={lost} server_cpu_pct={} client_cpu_pct={} server_rss_kb={} tag={}",
        args.clients,
        args.ttl_ms,
        args.secs,
        percent(server_cpu),
        percent(client_cpu),
        rss.unwrap_or_else(|| "NA".to_owned()),
        args.tag
    );
    Ok(Outcome { line, safe: true })
}
