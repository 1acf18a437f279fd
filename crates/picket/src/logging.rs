//! Logging, set up here for every command: the long-running ones (`picket serve`, `picket kv
//! serve`) take `--log-format` and `--log`; the others log text lines on standard error,
//! filtered by `RUST_LOG`.

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

/// Installs a text logger on standard error, filtered by `RUST_LOG`, else by `default_filter`:
/// for the commands that take no log options.
pub fn init_plain(default_filter: &str) {
    let plain = LogArgs { log_format: LogFormat::Text, log_filter: None };
    // Without `--log` nothing is parsed that could fail: `RUST_LOG` that does not parse falls
    // back to the default.
    plain.init(default_filter).expect("a logger without --log always installs");
}
