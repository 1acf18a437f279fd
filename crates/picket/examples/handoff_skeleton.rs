//! The skeleton of a durable lock server, for issue 19's question: how far below its targets
//! can a write path with Picket's shape go on this machine, with no lock service in it at all?
//!
//! The server keeps lock holders and FIFO queues in memory, and writes every request as a record
//! into a preallocated file and syncs it (`fdatasync`) before it answers, as Picket's WAL does.
//! It does nothing else: no consensus, no sessions, no encoding beyond fixed 16-byte frames, no
//! request stack. It comes in three shapes, run as separate processes like a real server:
//!
//! - `pipeline`: the hops a Picket node's write passes through, each a tokio task on a
//!   two-worker runtime: the connection's reader, the log's task (openraft's core, which writes
//!   and syncs the batch itself on a quiet log), the apply task (openraft's state machine
//!   worker, which decides grants), and the connection's writer. Hand-offs are unbounded
//!   channels, as cheap as tokio has.
//! - `direct`: the same, except that the apply task writes each answer into its socket itself:
//!   only the hops openraft puts on a write (to its core, and from the core to the state
//!   machine worker), none of Picket's own.
//! - `loop`: no hops between threads. One thread (a current-thread runtime): the readers queue
//!   requests, and one task writes and syncs whatever is queued, decides, and writes each answer
//!   straight into its socket; Redis's event loop with `appendfsync always` works this way.
//!
//! `drive` is the bench client: tokio tasks on a two-worker runtime, one connection each, in
//! the modes of `picket bench` (`contended`: all on one lock; `uncontended`: a lock each). A
//! cycle is an acquire answered with a grant, then a release answered with an ack. It checks
//! that the shared lock's tokens come one after another as its clients see them, and that the
//! tokens of a lock of its own grow. It cannot see two holders at once: a client holds the
//! lock for no time between its grant and its release.
//! A server stopped with SIGTERM prints what its syncs took (its warm-up's included).
//!
//! ```sh
//! cargo build --release -p picket --example handoff_skeleton
//! target/release/examples/handoff_skeleton serve pipeline 127.0.0.1:17971 /tmp/skeleton-data &
//! target/release/examples/handoff_skeleton drive 127.0.0.1:17971 contended 8 6 PID TAG
//! ```
//!
//! `scripts/skeleton.sh` runs each shape beside `picket serve` and the floor, round by round.
//! Nothing here is part of Picket: it is a measuring instrument. What it measures is what a
//! server of each shape reaches with no work in it on the machine at hand: a reference to read
//! Picket's figures against, not a proof that no server could do better.

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};

/// Every frame on the wire, both ways: a kind and a number (the lock, or a token).
const FRAME_BYTES: usize = 16;
/// A request as the log writes it, about the size of Picket's small entries.
const RECORD_BYTES: usize = 64;
/// The log file's preallocated size; records wrap around inside it.
const LOG_BYTES: u64 = 64 << 20;
/// Requests the log's task takes in one batch, as a bound.
const MAX_BATCH: usize = 1_024;
/// Connections a server holds at once, as a bound. The driver has at most one request out per
/// connection (it waits for each answer), which bounds every queue of requests and answers
/// below by this too. A client that sends without reading its answers is not bounded: its
/// requests queue without limit, and an answer that does not fit its socket at once stops the
/// `direct` and `loop` servers. This is a measuring instrument for the driver, not a server.
const MAX_CONNECTIONS: usize = 1_024;
/// Locks a server keeps, as a bound: names are 0 to this, less one.
const MAX_LOCKS: usize = 1_024;
/// How long the `pipeline` and `direct` shapes' log holds queued acquires at most, counted
/// from the first one it held back (tokio's timer rounds it up to its 1 ms tick).
const DEFER_FOR: Duration = Duration::from_micros(500);

/// A request for a lock, answered with `GRANTED` once the caller holds it.
const ACQUIRE: u64 = 1;
/// A holder's release, answered with `RELEASED`.
const RELEASE: u64 = 2;
/// An acquire's answer; the frame's number is the grant's token.
const GRANTED: u64 = 3;
/// A release's answer.
const RELEASED: u64 = 4;
/// Not on the wire: a connection's reader sends it when its client goes (or sent what this
/// server does not take), so that its locks pass on and its socket closes.
const DISCONNECTED: u64 = 5;

type Frame = [u8; FRAME_BYTES];

fn frame(kind: u64, value: u64) -> Frame {
    let mut bytes = [0; FRAME_BYTES];
    bytes[..8].copy_from_slice(&kind.to_le_bytes());
    bytes[8..].copy_from_slice(&value.to_le_bytes());
    bytes
}

/// Records whether lock `name` is held, for the log's task to judge queued acquires by.
fn store_held(held: &[AtomicBool], name: u64, is_held: bool) {
    if let Some(index) = lock_index(name) {
        held[index].store(is_held, Ordering::Release);
    }
}

/// Whether a client's frame is a request this server takes: an acquire or a release of one
/// of its locks.
fn is_request(bytes: &Frame) -> bool {
    let (kind, name) = parse(bytes);
    (kind == ACQUIRE || kind == RELEASE) && lock_index(name).is_some()
}

/// A lock's index among the server's `MAX_LOCKS`, if its name is one of them.
fn lock_index(name: u64) -> Option<usize> {
    usize::try_from(name).ok().filter(|index| *index < MAX_LOCKS)
}

fn parse(bytes: &Frame) -> (u64, u64) {
    let (kind, value) = bytes.split_at(8);
    let number = |part: &[u8]| u64::from_le_bytes(part.try_into().unwrap_or([0; 8]));
    (number(kind), number(value))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |index: usize| args.get(index).map(String::as_str).unwrap_or("");
    match (arg(0), arg(1)) {
        ("serve", shape @ ("pipeline" | "direct" | "loop")) => {
            let listen: SocketAddr = arg(2).parse().context("serve SHAPE LISTEN_ADDR DIR")?;
            let log = Log::create(Path::new(arg(3)))?;
            let runtime = if shape == "loop" {
                tokio::runtime::Builder::new_current_thread().enable_all().build()?
            } else {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?
            };
            runtime.block_on(serve(shape, listen, log))
        }
        ("drive", _) => {
            let endpoint: SocketAddr =
                arg(1).parse().context("drive ENDPOINT MODE CLIENTS SECS PID TAG")?;
            let contended = match arg(2) {
                "contended" => true,
                "uncontended" => false,
                other => bail!("mode {other:?}: give contended or uncontended"),
            };
            let clients: usize = arg(3).parse().context("CLIENTS: a number")?;
            let secs: u64 = arg(4).parse().context("SECS: a number")?;
            // `SKELETON_DRIVE_THREADS=1` drives from one thread, with no wake-ups between
            // threads on the client's side either.
            let runtime = match std::env::var("SKELETON_DRIVE_THREADS").as_deref() {
                Ok("1") => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
                _ => tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?,
            };
            let line =
                runtime.block_on(drive(endpoint, contended, clients, secs, arg(5), arg(6)))?;
            println!("{line}");
            Ok(())
        }
        _ => bail!(
            "usage: serve pipeline|direct|loop LISTEN_ADDR DIR | drive ENDPOINT contended|uncontended CLIENTS SECS SERVER_PID TAG"
        ),
    }
}

/// The log: records written at increasing offsets of a preallocated file, each batch synced.
struct Log {
    file: File,
    offset: u64,
    buffer: Vec<u8>,
    /// Each sync's time, in µs: a sync in a chain of requests is not the floor's tight loop.
    syncs_us: Arc<Mutex<Histogram<u64>>>,
}

impl Log {
    fn create(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("skeleton.log"))
            .context("cannot open the log file")?;
        rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, LOG_BYTES)
            .context("cannot preallocate the log file")?;
        file.sync_all().context("cannot sync the preallocated log file")?;
        let syncs_us = Arc::new(Mutex::new(Histogram::new(3)?));
        Ok(Self { file, offset: 0, buffer: Vec::new(), syncs_us })
    }

    /// Puts one record per request into the buffer of records not yet written.
    fn append(&mut self, requests: &[(usize, Frame)]) {
        for (connection, bytes) in requests {
            let mut record = [0u8; RECORD_BYTES];
            record[..8].copy_from_slice(&(*connection as u64).to_le_bytes());
            record[8..8 + FRAME_BYTES].copy_from_slice(bytes);
            self.buffer.extend_from_slice(&record);
        }
    }

    /// Writes the buffered records and syncs them, as a WAL does before it answers.
    fn sync(&mut self) -> anyhow::Result<()> {
        let length = self.buffer.len() as u64;
        if self.offset + length > LOG_BYTES {
            self.offset = 0;
        }
        self.file.write_all_at(&self.buffer, self.offset).context("cannot write the log")?;
        let started = Instant::now();
        self.file.sync_data().context("cannot sync the log")?;
        let _ = lock(&self.syncs_us).record(micros(started.elapsed()));
        self.offset += length;
        self.buffer.clear();
        Ok(())
    }
}

/// Lock holders and queues: what the apply step decides.
#[derive(Default)]
struct Locks {
    locks: HashMap<u64, Lock>,
}

#[derive(Default)]
struct Lock {
    /// The connection holding it.
    holder: Option<usize>,
    /// Connections waiting for it, first come first served.
    waiters: VecDeque<usize>,
    /// The last grant's token: every grant takes the next.
    token: u64,
}

impl Locks {
    /// Applies one request from `connection`, and pushes the answers it makes (to it, and a
    /// grant to the next waiter) onto `answers`.
    /// Returns the lock's name.
    fn apply(
        &mut self,
        connection: usize,
        bytes: &Frame,
        answers: &mut Vec<(usize, Frame)>,
    ) -> u64 {
        let (kind, name) = parse(bytes);
        if kind == DISCONNECTED {
            self.disconnect(connection, answers);
            return name;
        }
        let lock = self.locks.entry(name).or_default();
        match kind {
            ACQUIRE if lock.holder.is_none() => {
                lock.token += 1;
                lock.holder = Some(connection);
                answers.push((connection, frame(GRANTED, lock.token)));
            }
            ACQUIRE => lock.waiters.push_back(connection),
            RELEASE if lock.holder == Some(connection) => {
                // The grant goes out first: the next holder's turn is the chain a handoff
                // waits on, the releaser's ack is not.
                lock.holder = lock.waiters.pop_front();
                if let Some(next) = lock.holder {
                    lock.token += 1;
                    answers.push((next, frame(GRANTED, lock.token)));
                }
                answers.push((connection, frame(RELEASED, 0)));
            }
            // A release by a non-holder (the readers let no other kind through): answered,
            // changes nothing.
            _ => answers.push((connection, frame(RELEASED, 0))),
        }
        name
    }

    /// Takes a connection that went out of every queue, and passes on the locks it held.
    fn disconnect(&mut self, connection: usize, answers: &mut Vec<(usize, Frame)>) {
        for lock in self.locks.values_mut() {
            lock.waiters.retain(|waiter| *waiter != connection);
            if lock.holder == Some(connection) {
                lock.holder = lock.waiters.pop_front();
                if let Some(next) = lock.holder {
                    lock.token += 1;
                    answers.push((next, frame(GRANTED, lock.token)));
                }
            }
        }
    }

    fn is_held(&self, name: u64) -> bool {
        self.locks.get(&name).is_some_and(|lock| lock.holder.is_some())
    }
}

async fn serve(shape: &str, listen: SocketAddr, log: Log) -> anyhow::Result<()> {
    let listener =
        TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let syncs_us = log.syncs_us.clone();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let serving = async {
        match shape {
            "loop" => serve_loop(listener, log).await,
            _ => serve_pipeline(shape == "direct", listener, log).await,
        }
    };
    tokio::select! {
        served = serving => served,
        _ = terminate.recv() => {
            // On SIGTERM, what its syncs took, for the driver's run just ended.
            let syncs = lock(&syncs_us);
            println!(
                "SYNCS system=skeleton shape={} syncs={} sync_p50_us={} sync_mean_us={:.0} sync_p99_us={}",
                shape,
                syncs.len(),
                syncs.value_at_quantile(0.5),
                syncs.mean(),
                syncs.value_at_quantile(0.99),
            );
            Ok(())
        }
    }
}

/// Where the apply task sends a connection's answers.
enum Answers {
    /// To the connection's writer task (the `pipeline` shape).
    Writer(mpsc::UnboundedSender<Frame>),
    /// Straight into its socket (the `direct` shape).
    Socket(OwnedWriteHalf),
}

/// The `pipeline` shape: reader → log task → apply task → writer, each a task; or, `direct`,
/// the apply task writes each answer into its socket itself.
async fn serve_pipeline(direct: bool, listener: TcpListener, mut log: Log) -> anyhow::Result<()> {
    let (to_log, mut log_inbox) = mpsc::unbounded_channel::<(usize, Frame)>();
    let (to_apply, mut apply_inbox) = mpsc::unbounded_channel::<Vec<(usize, Frame)>>();
    let writers: Arc<Mutex<HashMap<usize, Answers>>> = Arc::default();
    let held: Arc<Vec<AtomicBool>> =
        Arc::new((0..MAX_LOCKS).map(|_| AtomicBool::new(false)).collect());
    let log_held = held.clone();
    let mut log_task = tokio::spawn(async move {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut deferred = Vec::new();
        let mut deferred_until = None;
        loop {
            // A batch of queued acquires only is not synced on its own: nobody waits for its
            // answer, which comes with a release's grant. It waits for the next batch that
            // someone does wait for (Picket's deferred records), or DEFER_FOR from the first
            // one held back at most, for an acquire queued on a lock whose release was already
            // being applied.
            let received = match deferred_until {
                None => log_inbox.recv_many(&mut batch, MAX_BATCH).await,
                Some(until) => {
                    tokio::time::timeout_at(until, log_inbox.recv_many(&mut batch, MAX_BATCH))
                        .await
                        .unwrap_or(0)
                }
            };
            if received == 0 && deferred.is_empty() {
                break;
            }
            let only_queued = batch.iter().all(|(_, bytes)| {
                let (kind, name) = parse(bytes);
                kind == ACQUIRE
                    && lock_index(name).is_some_and(|index| log_held[index].load(Ordering::Acquire))
            });
            deferred.append(&mut batch);
            if received > 0 && only_queued && deferred.len() < MAX_BATCH {
                deferred_until.get_or_insert_with(|| tokio::time::Instant::now() + DEFER_FOR);
                continue;
            }
            deferred_until = None;
            log.append(&deferred);
            log.sync()?;
            if to_apply.send(std::mem::take(&mut deferred)).is_err() {
                break;
            }
        }
        anyhow::Ok(())
    });
    let apply_writers = writers.clone();
    let mut apply_task = tokio::spawn(async move {
        let mut locks = Locks::default();
        let mut answers = Vec::new();
        while let Some(batch) = apply_inbox.recv().await {
            for (connection, bytes) in &batch {
                let name = locks.apply(*connection, bytes, &mut answers);
                if parse(bytes).0 == DISCONNECTED {
                    // A disconnect may free any lock: every flag is refreshed, or an acquire
                    // of a lock it freed would be held back for nothing.
                    for name in locks.locks.keys() {
                        store_held(&held, *name, locks.is_held(*name));
                    }
                } else {
                    store_held(&held, name, locks.is_held(name));
                }
            }
            let mut writers = lock(&apply_writers);
            for (connection, bytes) in &batch {
                if parse(bytes).0 == DISCONNECTED {
                    // Its writer (a task's channel, or the socket's half) goes: the socket closes.
                    writers.remove(connection);
                }
            }
            for (connection, answer) in answers.drain(..) {
                match writers.get(&connection) {
                    Some(Answers::Writer(writer)) => {
                        let _ = writer.send(answer);
                    }
                    Some(Answers::Socket(socket)) => write_at_once(socket, &answer)?,
                    None => {}
                }
            }
        }
        anyhow::Ok(())
    });
    let mut next_connection = 0_usize;
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted.context("accept")?,
            ended = &mut log_task => {
                ended??;
                bail!("the log's task ended");
            }
            ended = &mut apply_task => {
                ended??;
                bail!("the apply task ended");
            }
        };
        if lock(&writers).len() >= MAX_CONNECTIONS {
            // Refused: the stream is dropped, which closes it.
            continue;
        }
        stream.set_nodelay(true)?;
        let connection = next_connection;
        next_connection += 1;
        let (mut reader, mut writer) = stream.into_split();
        if direct {
            lock(&writers).insert(connection, Answers::Socket(writer));
        } else {
            let (answer_tx, mut answer_rx) = mpsc::unbounded_channel::<Frame>();
            lock(&writers).insert(connection, Answers::Writer(answer_tx));
            tokio::spawn(async move {
                let mut out = Vec::new();
                while let Some(answer) = answer_rx.recv().await {
                    out.clear();
                    out.extend_from_slice(&answer);
                    while let Ok(more) = answer_rx.try_recv() {
                        out.extend_from_slice(&more);
                    }
                    if writer.write_all(&out).await.is_err() {
                        break;
                    }
                }
            });
        }
        let to_log = to_log.clone();
        tokio::spawn(async move {
            let mut bytes = [0; FRAME_BYTES];
            while reader.read_exact(&mut bytes).await.is_ok() {
                if !is_request(&bytes) || to_log.send((connection, bytes)).is_err() {
                    break;
                }
            }
            let _ = to_log.send((connection, frame(DISCONNECTED, 0)));
        });
    }
}

/// Requests queued for the `loop` shape's one task, and each connection's socket to answer on.
#[derive(Default)]
struct Queued {
    requests: Vec<(usize, Frame)>,
    sockets: HashMap<usize, OwnedWriteHalf>,
}

/// The `loop` shape: one thread; the readers queue, one task writes, syncs, decides, answers.
async fn serve_loop(listener: TcpListener, mut log: Log) -> anyhow::Result<()> {
    let queued: Arc<Mutex<Queued>> = Arc::default();
    let wake = Arc::new(Notify::new());
    let (loop_queued, loop_wake) = (queued.clone(), wake.clone());
    let mut loop_task = tokio::spawn(async move {
        let mut locks = Locks::default();
        let mut batch = Vec::new();
        let mut answers = Vec::new();
        loop {
            loop_wake.notified().await;
            std::mem::swap(&mut batch, &mut lock(&loop_queued).requests);
            if batch.is_empty() {
                continue;
            }
            for (connection, bytes) in &batch {
                locks.apply(*connection, bytes, &mut answers);
                if parse(bytes).0 == DISCONNECTED {
                    // Its socket's half goes: the socket closes.
                    lock(&loop_queued).sockets.remove(connection);
                }
            }
            log.append(&batch);
            batch.clear();
            // Queued acquires only: their records are synced with the batch whose answers
            // come next, before any answer goes out.
            if answers.is_empty() {
                continue;
            }
            log.sync()?;
            let queued = lock(&loop_queued);
            for (connection, answer) in answers.drain(..) {
                if let Some(socket) = queued.sockets.get(&connection) {
                    write_at_once(socket, &answer)?;
                }
            }
        }
    });
    let mut next_connection = 0_usize;
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted.context("accept")?,
            ended = &mut loop_task => {
                let result: anyhow::Result<()> = ended?;
                result?;
                bail!("the loop's task ended");
            }
        };
        if lock(&queued).sockets.len() >= MAX_CONNECTIONS {
            // Refused: the stream is dropped, which closes it.
            continue;
        }
        stream.set_nodelay(true)?;
        let connection = next_connection;
        next_connection += 1;
        let (mut reader, writer) = stream.into_split();
        lock(&queued).sockets.insert(connection, writer);
        let (queued, wake) = (queued.clone(), wake.clone());
        tokio::spawn(async move {
            let mut bytes = [0; FRAME_BYTES];
            while reader.read_exact(&mut bytes).await.is_ok() {
                if !is_request(&bytes) {
                    break;
                }
                lock(&queued).requests.push((connection, bytes));
                wake.notify_one();
            }
            lock(&queued).requests.push((connection, frame(DISCONNECTED, 0)));
            wake.notify_one();
        });
    }
}

/// Writes an answer into its socket without waiting. Each client has one request out, so its
/// socket's buffer has room for the answer; a short write would be a broken measurement, not a
/// case to handle.
fn write_at_once(socket: &OwnedWriteHalf, answer: &Frame) -> anyhow::Result<()> {
    match socket.try_write(answer) {
        Ok(FRAME_BYTES) => Ok(()),
        other => bail!("an answer did not fit its socket at once: {other:?}"),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What one client measured: its cycles, and their times in µs (histograms, bounded however
/// long the run).
struct Tally {
    cycles: u64,
    acquire_us: Histogram<u64>,
    cycle_us: Histogram<u64>,
}

async fn drive(
    endpoint: SocketAddr,
    contended: bool,
    clients: usize,
    secs: u64,
    server_pid: &str,
    tag: &str,
) -> anyhow::Result<String> {
    // The shared lock's last token seen by a client of this run (0 before the first), stored
    // before that client sends its release: each grant's token must be the next after it. A
    // token skipped, repeated or gone backwards breaks that; two holders at once do not (a
    // client holds for no time), so this is a check of the tokens, not of exclusion.
    let last_released = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let warm_until = Instant::now() + Duration::from_secs(1);
    let stop_at = warm_until + Duration::from_secs(secs);
    let server_cpu_before = Arc::new(Mutex::new(None));
    let client_cpu_before = Arc::new(Mutex::new(None));
    let mut tasks = Vec::new();
    for client in 0..clients {
        let mut stream = TcpStream::connect(endpoint)
            .await
            .with_context(|| format!("cannot connect to {endpoint}"))?;
        stream.set_nodelay(true)?;
        let name = if contended { 0 } else { client as u64 + 1 };
        let (last_released, violations) = (last_released.clone(), violations.clone());
        let (server_cpu_before, client_cpu_before) =
            (server_cpu_before.clone(), client_cpu_before.clone());
        let server_pid = server_pid.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut tally =
                Tally { cycles: 0, acquire_us: Histogram::new(3)?, cycle_us: Histogram::new(3)? };
            let mut last_own_token = 0;
            let mut bytes = [0; FRAME_BYTES];
            loop {
                let started = Instant::now();
                if started >= stop_at {
                    break;
                }
                stream.write_all(&frame(ACQUIRE, name)).await?;
                stream.read_exact(&mut bytes).await?;
                let granted = Instant::now();
                let (kind, token) = parse(&bytes);
                if kind != GRANTED {
                    bail!("an acquire was answered with kind {kind}");
                }
                let released = last_released.load(Ordering::SeqCst);
                let out_of_turn = if contended {
                    // The run's first grant follows whatever an earlier run left.
                    released != 0 && token != released + 1
                } else {
                    token <= last_own_token
                };
                if out_of_turn {
                    violations.fetch_add(1, Ordering::Relaxed);
                }
                last_own_token = token;
                if contended {
                    // Stored before the release is sent, so before the server can grant again.
                    last_released.store(token, Ordering::SeqCst);
                }
                stream.write_all(&frame(RELEASE, name)).await?;
                stream.read_exact(&mut bytes).await?;
                if parse(&bytes).0 != RELEASED {
                    bail!("a release was answered with kind {}", parse(&bytes).0);
                }
                if started >= warm_until {
                    tally.cycles += 1;
                    tally.acquire_us.record(micros(granted - started))?;
                    tally.cycle_us.record(micros(started.elapsed()))?;
                } else if Instant::now() >= warm_until {
                    // The first client past the warm-up reads the CPU counters once.
                    lock(&server_cpu_before).get_or_insert_with(|| cpu_seconds(&server_pid));
                    lock(&client_cpu_before).get_or_insert_with(|| cpu_seconds("self"));
                }
            }
            anyhow::Ok(tally)
        }));
    }
    let mut acquire = Histogram::<u64>::new(3)?;
    let mut cycle = Histogram::<u64>::new(3)?;
    let mut cycles = 0;
    for task in tasks {
        let tally = task.await??;
        cycles += tally.cycles;
        acquire.add(&tally.acquire_us)?;
        cycle.add(&tally.cycle_us)?;
    }
    let percent = |before: &Mutex<Option<Option<f64>>>, pid: &str| {
        let before = (*lock(before)).flatten()?;
        Some(100.0 * (cpu_seconds(pid)? - before) / Duration::from_secs(secs).as_secs_f64())
    };
    let shown =
        |value: Option<f64>| value.map_or_else(|| "NA".to_owned(), |value| format!("{value:.1}"));
    #[allow(clippy::cast_precision_loss)]
    let ops_per_s = cycles as f64 / Duration::from_secs(secs).as_secs_f64();
    Ok(format!(
        "RESULT system=skeleton mode={} clients={clients} secs={secs} ops={cycles} ops_per_s={:.0} acq_p50_us={} acq_p99_us={} cycle_p50_us={} cycle_p99_us={} violations={} server_cpu_pct={} client_cpu_pct={} tag={tag}",
        if contended { "contended" } else { "uncontended" },
        ops_per_s,
        acquire.value_at_quantile(0.5),
        acquire.value_at_quantile(0.99),
        cycle.value_at_quantile(0.5),
        cycle.value_at_quantile(0.99),
        violations.load(Ordering::Relaxed),
        shown(percent(&server_cpu_before, server_pid)),
        shown(percent(&client_cpu_before, "self")),
    ))
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// A process's user and system CPU seconds so far, from `/proc` (as `picket bench` reads it).
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields after the closing parenthesis are fixed.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // Linux reports CPU time in clock ticks of 1/100 s on every platform Picket targets.
    Some(ticks / 100.0)
}
