//! Test support shared by Picket's integration tests.
//!
//! - [`http`]: blocking calls to the HTTP/JSON API, as `curl` would make them, through the one
//!   HTTP/1.1 client Picket has (`picket_proto::http1`).
//! - [`ServerProcess`]: a `picket serve` process on a free loopback port, with its own data
//!   directory, that can be killed with SIGKILL and restarted on the same data.
//! - [`wait_until`]: wait for a condition with a deadline instead of sleeping for a guess.
//! - [`fuzz_cases`]: how many cases a fuzz target runs.
//! - [`pki`]: CA and certificate files for tests of a TLS cluster.

pub mod cluster;
pub mod pki;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
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

/// A loopback port that was free a moment ago. Needed where an address must be known before
/// the server starts (a cluster's peer list); single servers listen on port 0 instead.
///
/// # Panics
/// When no port can be bound.
#[must_use]
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .expect("an address")
        .port()
}

pub mod http {
    //! Blocking calls to the HTTP/JSON API through Picket's one HTTP/1.1 client
    //! (`picket_proto::http1`), as `curl` would make them: a connection per request.
    //!
    //! They may be called from an async test (the call then runs on a thread of its own), but
    //! they block the caller's thread meanwhile: in a current-thread test, the test's own
    //! spawned tasks do not run until the call returns.

    use picket_proto::http1::{Http1Connection, Http1Error, Http1Stream};
    use serde_json::Value;
    use std::future::Future;
    use std::time::Duration;

    /// Longest time one request, or one wait for a server-sent event, may take.
    const TIMEOUT: Duration = Duration::from_secs(60);

    /// A response: status code and body parsed as JSON (`Null` when empty or not JSON).
    #[derive(Debug, Clone)]
    pub struct Reply {
        /// The status code.
        pub status: u16,
        /// The body, as JSON.
        pub body: Value,
        /// The body, as text.
        pub text: String,
        /// The headers, names in lower case, in order.
        pub headers: Vec<(String, String)>,
    }

    impl Reply {
        /// The first value of header `name` (any case).
        #[must_use]
        pub fn header(&self, name: &str) -> Option<&str> {
            let name = name.to_ascii_lowercase();
            self.headers.iter().find(|(key, _)| *key == name).map(|(_, value)| value.as_str())
        }
    }

    /// Runs `future` to its end on `runtime`, from a thread of its own when the caller is
    /// already inside a runtime (an async test), where blocking on another is not allowed.
    fn run<F>(runtime: &Runtime, future: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        let runtime = runtime.0.as_ref().expect("a runtime until dropped");
        if tokio::runtime::Handle::try_current().is_err() {
            return runtime.block_on(future);
        }
        std::thread::scope(|scope| {
            scope.spawn(|| runtime.block_on(future)).join().expect("the request does not panic")
        })
    }

    /// A runtime of the caller's own that may be dropped anywhere, an async test included.
    #[derive(Debug)]
    struct Runtime(Option<tokio::runtime::Runtime>);

    impl Runtime {
        fn new() -> Self {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            Self(Some(runtime))
        }
    }

    impl Drop for Runtime {
        fn drop(&mut self) {
            // Dropping a runtime blocks, which an async caller may not do; this does not.
            if let Some(runtime) = self.0.take() {
                runtime.shutdown_background();
            }
        }
    }

    /// Sends one request with `body` and `content_type`, as `caller` says, on a connection of
    /// its own, and reads the whole reply.
    ///
    /// # Errors
    /// When the connection or the TLS handshake fails, or no whole answer comes within 60 s.
    pub fn request_bytes(
        addr: &str,
        caller: &As,
        method: &str,
        path: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> Result<Reply, String> {
        let method: http::Method =
            method.parse().map_err(|error| format!("method {method:?}: {error}"))?;
        let mut headers: Vec<(&str, String)> = Vec::new();
        if !caller.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
            headers.push(("content-type", content_type.to_owned()));
        }
        if let Some(token) = &caller.bearer_token {
            headers.push(("authorization", format!("Bearer {token}")));
        }
        headers.extend(caller.headers.iter().map(|(name, value)| (name.as_str(), value.clone())));
        let sending = async {
            let mut connection = Http1Connection::open(addr, caller.tls.clone()).await?;
            connection.send(method, path, &headers, body).await
        };
        let reply = run(&Runtime::new(), async { tokio::time::timeout(TIMEOUT, sending).await })
            .map_err(|_| format!("no answer within {TIMEOUT:?}"))?
            .map_err(|error: Http1Error| error.to_string())?;
        let text = reply.text();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Reply { status: reply.status, body, text, headers: reply.headers })
    }

    /// Sends one request and reads the whole response. `body` is sent as JSON when present.
    ///
    /// # Panics
    /// When the connection fails or the response is not HTTP.
    #[must_use]
    pub fn request(addr: &str, method: &str, path: &str, body: Option<&Value>) -> Reply {
        let raw = body.map(Value::to_string);
        request_raw(addr, method, path, raw.as_deref().map(str::as_bytes), "application/json")
    }

    /// Sends raw bytes as the body, with `content_type`.
    ///
    /// # Panics
    /// When the connection fails or the response is not HTTP.
    #[must_use]
    pub fn request_raw(
        addr: &str,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        content_type: &str,
    ) -> Reply {
        let body = body.unwrap_or_default().to_vec();
        request_bytes(addr, &As::default(), method, path, body, content_type)
            .unwrap_or_else(|error| panic!("{method} {path} at {addr}: {error}"))
    }

    /// Like [`request`], but a connection failure is an `Err` instead of a panic: for tests that
    /// kill the server under the client's feet.
    ///
    /// # Errors
    /// When the connection fails or breaks before a whole response arrived.
    pub fn try_request(
        addr: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, String> {
        request_as(addr, &As::default(), method, path, body)
    }

    /// How a request is sent: over TLS with this configuration, with this bearer token.
    #[derive(Clone, Debug, Default)]
    pub struct As {
        /// TLS, or plaintext when `None`.
        pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
        /// Sent as `Authorization: Bearer <token>`.
        pub bearer_token: Option<String>,
        /// More headers, as (name, value).
        pub headers: Vec<(String, String)>,
    }

    /// Sends one request as `caller` says and reads the whole response.
    ///
    /// # Errors
    /// When the connection or the TLS handshake fails.
    pub fn request_as(
        addr: &str,
        caller: &As,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, String> {
        let body = body.map(Value::to_string).unwrap_or_default().into_bytes();
        request_bytes(addr, caller, method, path, body, "application/json")
    }

    /// `GET path`.
    #[must_use]
    pub fn get(addr: &str, path: &str) -> Reply {
        request(addr, "GET", path, None)
    }

    /// `POST path` with a JSON body.
    #[must_use]
    pub fn post(addr: &str, path: &str, body: &Value) -> Reply {
        request(addr, "POST", path, Some(body))
    }

    /// Opens a server-sent events stream and returns a reader of its `data:` lines.
    ///
    /// # Panics
    /// When the connection fails or the server refuses the stream.
    #[must_use]
    pub fn events(addr: &str, path: &str) -> EventStream {
        let runtime = Runtime::new();
        let headers = [("accept", "text/event-stream".to_owned())];
        let opening = async {
            let mut connection = Http1Connection::open(addr, None).await?;
            let stream =
                connection.open_stream(http::Method::GET, path, &headers, Vec::new()).await?;
            Ok::<_, Http1Error>((connection, stream))
        };
        let (connection, stream) = run(&runtime, async {
            tokio::time::timeout(TIMEOUT, opening).await.expect("the watch answered in time")
        })
        .expect("the watch opens");
        assert_eq!(stream.status, 200, "the watch was refused");
        EventStream { runtime, _connection: connection, stream, pending: String::new() }
    }

    /// The `data:` payloads of a server-sent events stream.
    #[derive(Debug)]
    pub struct EventStream {
        runtime: Runtime,
        /// Kept open for as long as the stream is read.
        _connection: Http1Connection,
        stream: Http1Stream,
        /// Text received and not yet read as lines.
        pending: String,
    }

    impl EventStream {
        /// The next event's data, parsed as JSON. Skips keep-alive comments.
        ///
        /// # Panics
        /// When the stream ends or no event comes within 60 s.
        pub fn next_json(&mut self) -> Value {
            loop {
                while let Some((line, rest)) = self.pending.split_once('\n') {
                    let data = line.trim_end().strip_prefix("data:").map(str::to_owned);
                    self.pending = rest.to_owned();
                    if let Some(data) = data {
                        return serde_json::from_str(data.trim()).expect("event data is JSON");
                    }
                }
                let stream = &mut self.stream;
                let chunk = run(&self.runtime, async {
                    tokio::time::timeout(TIMEOUT, stream.next_chunk()).await
                })
                .expect("an event within the timeout")
                .expect("the event stream is readable")
                .expect("the event stream ended");
                self.pending.push_str(&String::from_utf8_lossy(&chunk));
            }
        }
    }
}

/// A `picket serve` process.
#[derive(Debug)]
pub struct ServerProcess {
    binary: PathBuf,
    args: Vec<String>,
    data_dir: PathBuf,
    child: Option<Child>,
    /// The address it listens on.
    pub addr: String,
}

impl ServerProcess {
    /// Starts `binary serve --data-dir <data_dir> --listen <addr>` plus `extra` arguments and
    /// waits until it prints its listening line.
    ///
    /// # Panics
    /// When the process cannot start or does not come up within 30 s.
    #[must_use]
    pub fn start(binary: &Path, data_dir: &Path, listen: SocketAddr, extra: &[String]) -> Self {
        let mut args = vec![
            "serve".to_owned(),
            "--data-dir".to_owned(),
            data_dir.display().to_string(),
            "--listen".to_owned(),
            listen.to_string(),
        ];
        args.extend_from_slice(extra);
        Self::start_with(binary, data_dir, args)
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
        let mut process = Self {
            binary: binary.to_owned(),
            args,
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
