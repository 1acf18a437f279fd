//! `picket demo`: the seeds' canonical race, live, with real processes and real tokens.
//!
//! It starts a one-node Picket and two `picket kv` stores (one fenced, one not) as child
//! processes in a temporary directory, and runs the race twice:
//!
//! 1. Client 1 acquires the lock and writes.
//! 2. Client 1 stops, as a process stops in a long GC pause or when its VM is descheduled: it
//!    sends nothing, not even keepalives, for longer than its session's TTL.
//! 3. Picket expires client 1's session and grants the lock to client 2, which writes.
//! 4. Client 1 wakes up, still believing it holds the lock, and writes with its old token.
//!
//! The fenced store refuses that write with a structured refusal naming both tokens; the
//! unfenced one takes it, over client 2's data. Client 1 talks HTTP/JSON with no keepalive
//! thread (what a stopped process sends: nothing); client 2 uses the Rust client library.
//! Everything it started is stopped and its directory removed, on success, failure or Ctrl-C.

use anyhow::{Context, bail};
use hyper::Method;
use picket_proto::http1;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The lock both clients take, and the key prefix it guards.
const LOCK: &str = "demo/report";
/// Client 1's session TTL: the shortest Picket allows, so the demo is quick.
const CLIENT1_TTL_MS: u64 = 1_000;
/// How long client 1 stays stopped: well past its TTL and the server's expiry grace.
const PAUSE: Duration = Duration::from_millis(3_000);
/// How long a child process may take to say it is listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A child process, stopped and reaped when dropped.
struct Spawned {
    child: Child,
    addr: String,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `picket ARGS` and waits for its `listening on ADDR` line.
fn spawn(args: &[&str], log: &Path) -> anyhow::Result<Spawned> {
    let exe = std::env::current_exe().context("cannot find the picket executable")?;
    let log_file = std::fs::File::create(log)?;
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .with_context(|| format!("cannot start picket {}", args.join(" ")))?;
    let stdout = child.stdout.take().expect("piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("listening on ").nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or_default().to_owned();
                let _ = sender.send(addr);
            }
        }
    });
    let mut spawned = Spawned { child, addr: String::new() };
    spawned.addr = receiver.recv_timeout(START_TIMEOUT).with_context(|| {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        format!("picket {} did not start:\n{log}", args.join(" "))
    })?;
    Ok(spawned)
}

/// Runs `picket demo`.
pub fn run() -> anyhow::Result<ExitCode> {
    let dir = tempfile::Builder::new().prefix("picket-demo-").tempdir()?;
    let path = |name: &str| dir.path().join(name).display().to_string();
    println!("Picket demo: a lock lease alone cannot stop a paused client; a fencing token can.\n");
    let picket = spawn(
        &["serve", "--listen", "127.0.0.1:0", "--data-dir", &path("picket"), "--log", "warn"],
        &dir.path().join("picket.log"),
    )?;
    let guard = format!("demo/={LOCK}");
    let store = |name: &str, extra: &[&str]| -> anyhow::Result<Spawned> {
        let data = path(name);
        let mut args = vec!["--endpoints", &picket.addr, "kv", "serve", "--listen", "127.0.0.1:0"];
        args.extend(["--data-dir", &data, "--guard", &guard, "--log", "warn"]);
        args.extend(extra);
        spawn(&args, &dir.path().join(format!("{name}.log")))
    };
    let fenced = store("kv-fenced", &[])?;
    let unfenced = store("kv-unfenced", &["--no-fence"])?;
    println!("  lock service   picket serve     on {}", picket.addr);
    println!("  fenced store   picket kv serve  on {}", fenced.addr);
    println!("  unfenced store picket kv serve --no-fence on {}\n", unfenced.addr);

    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let outcome = runtime.block_on(async {
        tokio::select! {
            result = both_races(&picket.addr, &fenced.addr, &unfenced.addr) => result,
            _ = tokio::signal::ctrl_c() => bail!("interrupted"),
        }
    });
    drop((fenced, unfenced, picket));
    let removed = dir.path().to_owned();
    dir.close().context("cannot remove the demo's directory")?;
    println!("\nStopped the three processes and removed {}.", removed.display());
    outcome.map(|()| ExitCode::SUCCESS)
}

async fn both_races(picket: &str, fenced: &str, unfenced: &str) -> anyhow::Result<()> {
    println!("== Race 1: the store checks the token (the fence) ==");
    let first = race(picket, fenced).await?;
    if first.stale_write_status != 409 {
        bail!("the fenced store admitted the stale write: {}", first.stale_write_answer);
    }
    println!("\n== Race 2: the same race, the store does not check tokens ==");
    let second = race(picket, unfenced).await?;
    if second.stale_write_status != 200 {
        bail!("the unfenced store refused the stale write: {}", second.stale_write_answer);
    }
    println!(
        "\nWith the fence, client 1's late write (token {}) was refused because the store had \
         seen token {}.\nWithout it, the same write landed and replaced client 2's data.",
        first.stale_token, first.new_token
    );
    Ok(())
}

struct Race {
    stale_token: u64,
    new_token: u64,
    stale_write_status: u16,
    stale_write_answer: String,
}

/// One race against the store at `store`; prints its trace.
async fn race(picket: &str, store: &str) -> anyhow::Result<Race> {
    let started = Instant::now();
    let say = |who: &str, what: String| {
        println!("  {:>5.2}s  {who:<9} {what}", started.elapsed().as_secs_f64());
    };
    let picket_url = format!("http://{picket}");
    let key_url = format!("http://{store}/kv/demo/report");

    // Client 1: HTTP/JSON, and no keepalive thread, like a process that is about to stop.
    let opened =
        post_json(&format!("{picket_url}/v1/sessions"), &json!({ "ttl_ms": CLIENT1_TTL_MS }))
            .await?;
    let session1 = opened["session_id"].as_u64().context("no session id")?;
    let body = json!({ "name": LOCK, "session_id": session1, "wait_ms": 0 });
    let granted = post_json(&format!("{picket_url}/v1/locks/acquire"), &body).await?;
    let token1 = granted["token"].as_u64().context("no token")?;
    let sequencer1 = granted["sequencer"].as_str().context("no sequencer")?.to_owned();
    say(
        "client 1",
        format!("acquires {LOCK} in a session with a {CLIENT1_TTL_MS} ms TTL: token {token1}"),
    );
    let written = put(&key_url, &sequencer1, "written by client 1").await?;
    say("client 1", format!("writes with {sequencer1}: {} {}", written.status, written.text()));
    say(
        "client 1",
        format!(
            "stops for {:.1} s (a GC pause, a descheduled VM): no keepalives",
            PAUSE.as_secs_f64()
        ),
    );
    let paused_at = Instant::now();

    // Client 2: the Rust client library, which keeps its session alive on its own.
    let client2 = picket_client::Client::connect(vec![picket.to_owned()]).await?;
    let session2 = client2.session(Duration::from_secs(10)).await?;
    say("client 2", format!("waits for {LOCK}"));
    let grant = session2.lock(LOCK).await?;
    let token2 = grant.token();
    say("picket", "expired client 1's session (no keepalive within its TTL)".to_owned());
    say("client 2", format!("acquires {LOCK}: token {token2}"));
    let sequencer2 = grant.sequencer().to_string();
    let written = put(&key_url, &sequencer2, "written by client 2").await?;
    say("client 2", format!("writes with {sequencer2}: {} {}", written.status, written.text()));

    tokio::time::sleep(PAUSE.saturating_sub(paused_at.elapsed())).await;
    say("client 1", "wakes up, still believes it holds the lock, and writes".to_owned());
    let stale = put(&key_url, &sequencer1, "written by client 1 after its pause").await?;
    let verdict = if stale.status == 200 { "ADMITTED" } else { "REFUSED" };
    say("store", format!("{verdict}: {} {}", stale.status, stale.text()));
    let value = http1::send(Method::GET, &key_url, &[], Vec::new()).await?;
    say("store", format!("{} now holds {:?}", "demo/report", value.text()));
    grant.release().await?;
    session2.close().await?;
    Ok(Race {
        stale_token: token1,
        new_token: token2,
        stale_write_status: stale.status,
        stale_write_answer: stale.text(),
    })
}

async fn post_json(url: &str, body: &Value) -> anyhow::Result<Value> {
    let headers = [("content-type", "application/json".to_owned())];
    let reply = http1::send(Method::POST, url, &headers, body.to_string().into_bytes()).await?;
    if reply.status != 200 {
        bail!("{url} answered {}: {}", reply.status, reply.text());
    }
    Ok(serde_json::from_slice(&reply.body)?)
}

async fn put(url: &str, sequencer: &str, value: &str) -> anyhow::Result<http1::Http1Reply> {
    let headers = [("picket-sequencer", sequencer.to_owned())];
    Ok(http1::send(Method::PUT, url, &headers, value.as_bytes().to_vec()).await?)
}
