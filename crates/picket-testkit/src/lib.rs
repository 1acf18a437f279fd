//! Test support shared by Picket's integration tests.
//!
//! - [`http`]: blocking calls to the HTTP/JSON API, as `curl` would make them, through the one
//!   HTTP/1.1 client Picket has (`picket_proto::http1`).
//! - [`ServerProcess`]: a `picket serve` process on a free loopback port, with its own data
//!   directory, that can be killed with SIGKILL and restarted on the same data.
//! - [`wait_until`]: wait for a condition with a deadline instead of sleeping for a guess.
//! - [`fuzz_cases`]: how many cases a fuzz target runs.
//! - `pki` (the `pki` feature): CA and certificate files for tests of a TLS cluster.
//! - [`TcpProxy`]: a proxy in front of a server whose connections a test cuts.
//! - [`free_port`]: a loopback port for a server whose address must be known before it starts.

pub mod cluster;
pub mod http;
#[cfg(feature = "pki")]
pub mod pki;
mod ports;
mod proxy;

pub use ports::{free_port, free_ports_in_a_row, try_free_ports_in_a_row};
pub use proxy::TcpProxy;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Polls `condition` every 20 ms until it returns `Some`, or panics with `what` after
/// `timeout`.
///
/// # Panics
/// When the deadline passes.
pub fn wait_until<T>(what: &str, timeout: Duration, mut condition: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = condition() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The environment variable that sets how many cases every fuzz target runs.
pub const FUZZ_CASES_VAR: &str = "PICKET_FUZZ_CASES";

/// How many cases a fuzz target runs: `default` (a few thousand, so `cargo test` stays quick), or
/// `PICKET_FUZZ_CASES` when set, e.g. `PICKET_FUZZ_CASES=1000000 cargo test --test fuzz`.
///
/// # Panics
/// When the variable is set to something other than a positive number.
#[must_use]
pub fn fuzz_cases(default: u32) -> u32 {
    match std::env::var(FUZZ_CASES_VAR) {
        Ok(value) => {
            value.parse().ok().filter(|cases| *cases > 0).unwrap_or_else(|| {
                panic!("{FUZZ_CASES_VAR} must be a positive number, not {value:?}")
            })
        }
        Err(_) => default,
    }
}

/// A `picket serve` process.
#[derive(Debug)]
pub struct ServerProcess {
    binary: PathBuf,
    args: Vec<String>,
    /// Environment variables set for the process beside the test's own.
    env: Vec<(String, String)>,
    data_dir: PathBuf,
    child: Option<Child>,
    /// The address it listens on.
    pub addr: String,
}

impl ServerProcess {
    /// Starts `binary serve --data-dir <data_dir> --listen <addr>` plus `extra` arguments and
    /// waits until it prints its listening line. Port 0 stands for a [`free_port`].
    ///
    /// # Panics
    /// When the process cannot start or does not come up within 30 s.
    #[must_use]
    pub fn start(binary: &Path, data_dir: &Path, listen: SocketAddr, extra: &[String]) -> Self {
        Self::start_with_env(binary, data_dir, listen, extra, &[])
    }

    /// [`ServerProcess::start`] with environment variables `env` set for the process (and for
    /// each restart of it), such as `PICKET_MUTATION`.
    ///
    /// # Panics
    /// As [`ServerProcess::start`].
    #[must_use]
    pub fn start_with_env(
        binary: &Path,
        data_dir: &Path,
        listen: SocketAddr,
        extra: &[String],
        env: &[(&str, &str)],
    ) -> Self {
        let mut args = vec![
            "serve".to_owned(),
            "--data-dir".to_owned(),
            data_dir.display().to_string(),
            "--listen".to_owned(),
            listen.to_string(),
        ];
        args.extend_from_slice(extra);
        let env = env.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned()));
        Self::spawned(binary, data_dir, args, env.collect())
    }

    /// Starts a one-node `binary serve` in a new temporary directory, on a free loopback port,
    /// with `extra` arguments, and waits until it is ready (`/readyz`). Keep the directory as
    /// long as the server.
    ///
    /// # Panics
    /// When the node does not start or get ready within 10 s.
    #[must_use]
    pub fn start_ready(binary: &Path, extra: &[&str]) -> (tempfile::TempDir, Self) {
        let dir = temp_dir();
        let extra: Vec<String> = extra.iter().map(|arg| (*arg).to_owned()).collect();
        let listen = "127.0.0.1:0".parse().expect("an address");
        let server = Self::start(binary, &dir.path().join("data"), listen, &extra);
        wait_until("the node to be ready", Duration::from_secs(10), || {
            (http::get(&server.addr, "/readyz").status == 200).then_some(())
        });
        (dir, server)
    }

    /// Starts `binary` with exactly `args` (which must include `--listen`), for servers other
    /// than `picket serve` that print the same `listening on ADDR` line, such as `picket kv
    /// serve`.
    ///
    /// # Panics
    /// When the process cannot start or does not come up.
    #[must_use]
    pub fn start_with(binary: &Path, data_dir: &Path, args: Vec<String>) -> Self {
        Self::spawned(binary, data_dir, args, Vec::new())
    }

    fn spawned(
        binary: &Path,
        data_dir: &Path,
        mut args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Self {
        // A port the kernel picks (port 0) lies in its ephemeral range: while the process is
        // down for a restart, an outgoing connection could be given it. Pick one outside.
        if let Some(position) = args.iter().position(|arg| arg == "--listen")
            && let Some(listen) = args.get_mut(position + 1)
            && let Some(host) = listen.strip_suffix(":0")
        {
            *listen = format!("{host}:{}", free_port());
        }
        let mut process = Self {
            binary: binary.to_owned(),
            args,
            env,
            data_dir: data_dir.to_owned(),
            child: None,
            addr: String::new(),
        };
        process.spawn();
        process
    }

    fn spawn(&mut self) {
        let mut child = Command::new(&self.binary)
            .args(&self.args)
            .env("RUST_LOG", std::env::var("PICKET_TEST_LOG").unwrap_or_else(|_| "error".into()))
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start picket serve");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let line = lines.next().and_then(Result::ok).unwrap_or_default();
        let addr = line
            .split(" listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("picket serve did not start: {line:?}"))
            .to_owned();
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        self.addr = addr;
        self.child = Some(child);
    }

    /// The data directory.
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The process id, while running.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: the process gets no chance to flush or clean up.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same data directory and address.
    ///
    /// # Panics
    /// When it does not come up.
    pub fn restart(&mut self) {
        self.kill();
        // Restart on the address it had, so peers and clients find it again.
        if let Some(position) = self.args.iter().position(|arg| arg == "--listen") {
            self.args[position + 1].clone_from(&self.addr);
        }
        self.spawn();
    }

    /// Sends SIGSTOP or SIGCONT.
    pub fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill").args([signal, &pid.to_string()]).status();
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.signal("-CONT");
        self.kill();
    }
}

/// A temporary directory that is removed when dropped.
///
/// # Panics
/// When it cannot be created.
#[must_use]
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// A minimal micro-benchmark harness: runs `operation` in timed batches and reports the median
/// time per operation, so a regression in a hot path shows up as a changed number. It never
/// asserts a timing.
pub mod bench {
    use std::time::{Duration, Instant};

    /// Batches measured per benchmark; the median is reported.
    const SAMPLES: usize = 15;

    /// Times `operation` (which performs one operation per call) and prints
    /// `name: <median> ns/op (min .., max ..)`. Returns the median in nanoseconds.
    pub fn measure(name: &str, operations_per_sample: u32, mut operation: impl FnMut()) -> f64 {
        // Warm up caches and allocators first.
        for _ in 0..operations_per_sample {
            operation();
        }
        let mut samples: Vec<Duration> = (0..SAMPLES)
            .map(|_| {
                let started = Instant::now();
                for _ in 0..operations_per_sample {
                    operation();
                }
                started.elapsed() / operations_per_sample
            })
            .collect();
        samples.sort();
        let nanos = |duration: Duration| duration.as_secs_f64() * 1e9;
        let median = nanos(samples[SAMPLES / 2]);
        println!(
            "{name}: {median:.0} ns/op (min {:.0}, max {:.0}, {SAMPLES} samples of {operations_per_sample})",
            nanos(samples[0]),
            nanos(samples[SAMPLES - 1])
        );
        median
    }
}
