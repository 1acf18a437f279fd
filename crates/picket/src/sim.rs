//! `picket sim`: the race lab. Measures, rather than asserts, what each locking strategy lets
//! through under pauses, partitions, clock faults, lock re-creation and restarts.

use anyhow::bail;
use clap::Args;
use picket_sim::{Scenario, SimConfig, Strategy, simulate, trace};
use std::process::ExitCode;

/// Options of `picket sim`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Seeds to run per strategy (0..N).
    #[arg(long, default_value_t = 50)]
    seeds: u64,
    /// Simulated seconds per run.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Probability a cycle pauses (GC) after its last check and before its write; default per
    /// scenario (0.15 canonical, 0.03 otherwise).
    #[arg(long)]
    pause_rate: Option<f64>,
    /// canonical (pauses), partition, clock, recreate, restart, or all.
    #[arg(long, default_value = "canonical")]
    scenario: String,
    /// Print a step-by-step trace of this seed instead of the table (with --strategy).
    #[arg(long)]
    trace: Option<u64>,
    /// The strategy to trace: lease-trust, redlock, zookeeper, etcd, picket,
    /// picket-fence-on-acquire, picket-verify, picket-volatile-fence.
    #[arg(long, default_value = "picket-fence-on-acquire")]
    strategy: String,
    /// Print the table as Markdown.
    #[arg(long, conflicts_with = "json")]
    markdown: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_strategy(name: &str) -> anyhow::Result<Strategy> {
    let quoted = format!("\"{name}\"");
    serde_json::from_str(&quoted)
        .map_err(|_| anyhow::anyhow!("unknown strategy {name:?}; see `picket sim --help`"))
}

/// Runs `picket sim`.
pub fn run(args: &SimArgs) -> anyhow::Result<ExitCode> {
    let scenarios: Vec<Scenario> = if args.scenario == "all" {
        Scenario::ALL.to_vec()
    } else {
        match Scenario::parse(&args.scenario) {
            Some(scenario) => vec![scenario],
            None => bail!(
                "unknown scenario {:?}: use canonical, partition, clock, recreate, restart or all",
                args.scenario
            ),
        }
    };
    if args.seeds == 0 || args.duration == 0 || args.duration > 3_600 {
        bail!("--seeds must be positive and --duration between 1 and 3600 seconds");
    }
    for scenario in scenarios {
        let mut config = SimConfig::for_scenario(scenario);
        config.duration_ms = args.duration * 1_000;
        if let Some(rate) = args.pause_rate {
            if !(0.0..=1.0).contains(&rate) {
                bail!("--pause-rate is a probability between 0 and 1");
            }
            config.pause_rate = rate;
        }
        if let Some(seed) = args.trace {
            let strategy = parse_strategy(&args.strategy)?;
            println!("trace of seed {seed}, {}, scenario {}", strategy.name(), scenario.name());
            for line in trace(&config, strategy, seed) {
                println!("{line}");
            }
            continue;
        }
        let report = simulate(&config, args.seeds, &Strategy::ALL);
        if args.json {
            println!("{}", report.to_json());
        } else if args.markdown {
            println!("{}\n", report.to_markdown());
        } else {
            println!("{}\n", report.to_text());
        }
    }
    Ok(ExitCode::SUCCESS)
}
