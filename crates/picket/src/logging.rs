//! Logging for the long-running commands (`picket serve`, `picket kv serve`): text or JSON
//! lines on standard error, filtered like `RUST_LOG`.

use clap::{Args, ValueEnum};

/// How log lines look.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line (timestamp, level, target, fields), for log collectors.
    Json,
}

/// Logging options.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log line format on standard error.
    #[arg(long, env = "PICKET_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Which events to log, in `RUST_LOG` syntax (e.g. `info,picket_server=debug`). Without
    /// it, `RUST_LOG` applies, else the command's default.
    #[arg(long = "log", env = "PICKET_LOG")]
    log_filter: Option<String>,
}

impl LogArgs {
    /// Installs the process's logger; `default_filter` applies when neither `--log` nor
    /// `RUST_LOG` says anything.
    ///
    /// # Errors
    /// When the filter does not parse.
    pub fn init(&self, default_filter: &str) -> anyhow::Result<()> {
        use tracing_subscriber::EnvFilter;
        let filter = match &self.log_filter {
            Some(filter) => EnvFilter::try_new(filter).map_err(|error| {
                anyhow::anyhow!("--log {filter:?} is not a valid filter: {error}")
            })?,
            None => EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into()),
        };
        let builder =
            tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
        match self.log_format {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder.json().flatten_event(true).init(),
        }
        Ok(())
    }
}
