//! The fenced mode: writes with one grant's sequencer to `picket kv`, fenced and unfenced
//! stores measured in alternating slices.

use super::BenchArgs;
use super::locks::micros;
use crate::connect::Connect;
use crate::http_fence::HttpFence;
use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

/// Writes from every client with one grant's sequencer for the window; returns (writes/s,
/// latency histogram, errors).
/// Writes measured against one store: writes, their latencies and the failures.
pub(super) struct WriteTotals {
    ops: u64,
    measured_secs: f64,
    histogram: Histogram<u64>,
    errors: u64,
}

impl WriteTotals {
    fn new() -> Self {
        let histogram = Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid bounds");
        Self { ops: 0, measured_secs: 0.0, histogram, errors: 0 }
    }

    #[allow(clippy::cast_precision_loss)]
    fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.measured_secs
    }
}

/// One slice of writes to `url` by every client: `warmup_secs` unmeasured, then `secs` measured,
/// added to `totals`.
pub(super) async fn run_writes(
    args: &BenchArgs,
    url: &str,
    sequencer: &str,
    (warmup_secs, secs): (f64, f64),
    totals: &mut WriteTotals,
) -> anyhow::Result<()> {
    let measure_from = Instant::now() + Duration::from_secs_f64(warmup_secs);
    let end = measure_from + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for index in 0..args.clients {
        let (authority, _) = picket_proto::http1::split_url(url)?;
        let mut connection = picket_proto::http1::Http1Connection::open(&authority, None).await?;
        let path = format!("/kv/{}{index}", args.prefix);
        let headers = vec![(picket_fence::http::SEQUENCER_HEADER, sequencer.to_owned())];
        tasks.push(tokio::spawn(async move {
            let mut histogram =
                Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("valid bounds");
            let (mut ops, mut errors) = (0_u64, 0_u64);
            while Instant::now() < end {
                let started = Instant::now();
                let reply =
                    connection.send(hyper::Method::PUT, &path, &headers, b"value".to_vec()).await;
                let done = Instant::now();
                match reply {
                    Ok(reply) if reply.status == 200 => {
                        if started >= measure_from && done <= end {
                            histogram.record(micros(done - started)).ok();
                            ops += 1;
                        }
                    }
                    _ => errors += 1,
                }
            }
            (histogram, ops, errors)
        }));
    }
    for task in tasks {
        let (part, part_ops, part_errors) = task.await?;
        totals.histogram.add(&part).expect("same bounds");
        totals.ops += part_ops;
        totals.errors += part_errors;
    }
    totals.measured_secs += secs;
    Ok(())
}

/// Unmeasured time at the start of every slice after the first, while connections open.
pub(super) const SLICE_WARMUP_SECS: f64 = 0.1;

pub(super) async fn run_fenced(args: &BenchArgs, connect: &Connect) -> anyhow::Result<String> {
    let client = connect.connect().await?;
    let session = client.session(Duration::from_millis(args.ttl_ms)).await?;
    let store = HttpFence::new(format!("{}/fence/{}", args.kv.trim_end_matches('/'), args.prefix));
    let guard = session.lock_fenced(&args.lock, &[&store]).await?;
    let sequencer = guard.sequencer().to_string();
    let (mut fenced, mut unfenced) = (WriteTotals::new(), WriteTotals::new());
    match &args.kv_unfenced {
        None => {
            run_writes(args, &args.kv, &sequencer, (args.warmup_secs, args.secs), &mut fenced)
                .await?;
        }
        Some(unfenced_url) => {
            // The two stores are measured in alternating one-second slices, in the order
            // fenced-unfenced then unfenced-fenced, so that drift in a shared, noisy machine
            // falls on both sides alike instead of on whichever ran second.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let slices = (args.secs.round() as u32).max(1);
            let slice_secs = args.secs / f64::from(slices);
            for slice in 0..slices {
                let warmup = if slice == 0 { args.warmup_secs } else { SLICE_WARMUP_SECS };
                let mut order = [(&args.kv, &mut fenced), (unfenced_url, &mut unfenced)];
                if slice % 2 == 1 {
                    order.reverse();
                }
                for (url, totals) in order {
                    run_writes(args, url, &sequencer, (warmup, slice_secs), totals).await?;
                }
            }
        }
    }
    let mut line = format!(
        "RESULT system=picket-kv mode=fenced clients={} secs={:.1} ops_per_s={:.0} write_p50_us={} write_p99_us={} errors={}",
        args.clients,
        args.secs,
        fenced.ops_per_s(),
        fenced.histogram.value_at_quantile(0.5),
        fenced.histogram.value_at_quantile(0.99),
        fenced.errors
    );
    if args.kv_unfenced.is_some() {
        use std::fmt::Write;
        let overhead = (unfenced.ops_per_s() / fenced.ops_per_s() - 1.0) * 100.0;
        write!(
            line,
            " unfenced_ops_per_s={:.0} unfenced_p50_us={} unfenced_p99_us={} unfenced_errors={} fence_overhead_pct={overhead:.1}",
            unfenced.ops_per_s(),
            unfenced.histogram.value_at_quantile(0.5),
            unfenced.histogram.value_at_quantile(0.99),
            unfenced.errors
        )
        .expect("writing to a string");
    }
    guard.release().await.ok();
    Ok(format!("{line} tag={}", args.tag))
}
