//! Aggregating runs over seeds, and rendering the table as text, Markdown and JSON.

use crate::config::{SimConfig, Strategy};
use crate::world::{self, RunStats};
use serde::{Deserialize, Serialize};

/// One strategy's row, summed over every seed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    /// The strategy.
    pub strategy: Strategy,
    /// Its display name.
    pub name: String,
    /// "yes", or why not: filled from the measured token regressions.
    pub monotonic_token: String,
    /// "yes" when no stale-holder write was admitted in any seed.
    pub stale_write_blocked: String,
    /// Counts summed over seeds.
    pub totals: RunStats,
    /// Seeds with any safety violation (stale write admitted, lost update, token regression).
    pub seeds_with_violation: u64,
}

/// A whole table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The configuration every seed ran with.
    pub config: SimConfig,
    /// Seeds run (0..seeds).
    pub seeds: u64,
    /// One row per strategy.
    pub rows: Vec<Row>,
}

fn seed_for(seed: u64, strategy: Strategy) -> u64 {
    let index =
        Strategy::ALL.iter().position(|candidate| *candidate == strategy).unwrap_or(0) as u64;
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// Runs `seeds` seeds of each strategy, on up to two threads. The result does not depend on the
/// number of threads: each seed is independent, and sums are taken in seed order.
#[must_use]
pub fn simulate(config: &SimConfig, seeds: u64, strategies: &[Strategy]) -> Report {
    let rows = strategies
        .iter()
        .map(|&strategy| {
            let run = |seed: u64| world::run(config, strategy, seed_for(seed, strategy), false).0;
            let results: Vec<RunStats> = std::thread::scope(|scope| {
                let half = seeds / 2;
                let first = scope.spawn(move || (0..half).map(run).collect::<Vec<_>>());
                let mut second: Vec<RunStats> = (half..seeds).map(run).collect();
                let mut results = first.join().expect("a simulation thread does not panic");
                results.append(&mut second);
                results
            });
            let mut totals = RunStats::default();
            for result in &results {
                totals.add(result);
            }
            let seeds_with_violation =
                results.iter().filter(|result| result.violated()).count() as u64;
            let monotonic_token = if !strategy.has_token() {
                "no (no token)".to_owned()
            } else if totals.token_regressions == 0 {
                "yes".to_owned()
            } else {
                format!("no ({} regressions)", totals.token_regressions)
            };
            let stale_write_blocked = if totals.stale_admitted == 0 {
                "yes".to_owned()
            } else {
                format!("no ({})", totals.stale_admitted)
            };
            Row {
                strategy,
                name: strategy.name().to_owned(),
                monotonic_token,
                stale_write_blocked,
                totals,
                seeds_with_violation,
            }
        })
        .collect();
    Report { config: config.clone(), seeds, rows }
}

/// The step-by-step trace of one seed of one strategy.
#[must_use]
pub fn trace(config: &SimConfig, strategy: Strategy, seed: u64) -> Vec<String> {
    world::run(config, strategy, seed_for(seed, strategy), true).1
}

const HEADERS: [&str; 12] = [
    "strategy",
    "monotonic token?",
    "stale-holder write blocked?",
    "grants",
    "writes admitted",
    "stale admitted",
    "stale refused",
    "newest grant refused",
    "superseded admitted",
    "lost updates",
    "token regressions",
    "seeds with violation",
];

fn cells(row: &Row) -> Vec<String> {
    let t = &row.totals;
    vec![
        row.name.clone(),
        row.monotonic_token.clone(),
        row.stale_write_blocked.clone(),
        t.grants.to_string(),
        t.writes_admitted.to_string(),
        t.stale_admitted.to_string(),
        t.stale_refused.to_string(),
        t.newest_grant_refused.to_string(),
        t.superseded_admitted.to_string(),
        t.lost_updates.to_string(),
        t.token_regressions.to_string(),
        row.seeds_with_violation.to_string(),
    ]
}

impl Report {
    fn heading(&self) -> String {
        format!(
            "scenario {}: {} seeds x {} s simulated, {} clients, TTL {} ms, pause rate {}",
            self.config.scenario.name(),
            self.seeds,
            self.config.duration_ms / 1_000,
            self.config.clients,
            self.config.ttl_ms,
            self.config.pause_rate
        )
    }

    /// A table for a terminal.
    #[must_use]
    pub fn to_text(&self) -> String {
        let rows: Vec<Vec<String>> = self.rows.iter().map(cells).collect();
        let mut widths: Vec<usize> = HEADERS.iter().map(|header| header.len()).collect();
        for row in &rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.len());
            }
        }
        let line = |cells: Vec<&str>| -> String {
            cells
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_owned()
        };
        let mut out = vec![self.heading(), String::new(), line(HEADERS.to_vec())];
        out.extend(rows.iter().map(|row| line(row.iter().map(String::as_str).collect())));
        out.join("\n")
    }

    /// The same table in Markdown.
    #[must_use]
    pub fn to_markdown(&self) -> String {
        let mut out = vec![
            format!("{}\n", self.heading()),
            format!("| {} |", HEADERS.join(" | ")),
            format!("|{}", "---|".repeat(HEADERS.len())),
        ];
        out.extend(self.rows.iter().map(|row| format!("| {} |", cells(row).join(" | "))));
        out.join("\n")
    }

    /// The report as JSON. Two runs with the same seeds and options give the same bytes.
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }
}
