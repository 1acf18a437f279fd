//! `picket lock NAME -- CMD...`: run a command while holding a lock.
//!
//! The command gets `PICKET_LOCK`, `PICKET_TOKEN` and `PICKET_SEQUENCER` in its environment and
//! runs in its own process group. If the lock or its session is lost while it runs, the whole
//! group gets SIGTERM at once and SIGKILL after `--kill-grace`, and `picket` exits with
//! [`EXIT_LOCK_LOST`]. Otherwise, when the command ends, whatever it left running in its group
//! gets SIGTERM (and SIGKILL after the grace), the lock is released, and `picket` exits with the
//! command's own exit code (with [`EXIT_LOCK_LOST`] if the release finds the lock ended
//! already). A `--ttl` too short to stop the command in time is refused. (etcdctl lock passes the revision but never kills; consul
//! lock kills but passes no index: this does both.)
//!
//! If `picket lock` itself dies (SIGKILL, the OOM killer), its session expires and the lock
//! goes to the next holder, so the command must die too. A watchdog process (`picket
//! __lock-watchdog`, in a process group of its own) holds the reading end of a pipe from
//! `picket lock`: when `picket lock` ends, it writes `done` first; when it dies, the pipe just
//! closes, and the watchdog stops the command's group as a lost lock would (SIGTERM, then
//! SIGKILL after the grace). `picket lock` also tells it, every 100 ms, the point by which the
//! command must be stopped if no keepalive is confirmed before it (on `CLOCK_BOOTTIME`, which
//! both read): a `picket lock` stopped (SIGSTOP, a debugger, Ctrl-Z with no terminal to hand
//! the command) keeps no lease, and the watchdog, in a group of its own, stops the command by
//! then. The crate forbids `unsafe`, so a parent-death signal is not an option.
//!
//! The watchdog must run before the command does: killed between the two, `picket lock` would
//! leave a command running that nothing stops. But the watchdog needs the command's process
//! group, which exists only once something runs in it. So the group is made first, by a
//! placeholder (`picket __lock-group`, which only waits for its standard input to close), then
//! the watchdog is started for that group, and only then does the command start, joining it.

use crate::duration::parse_duration;
use crate::http_fence::HttpFence;
use crate::terminal::Foreground;
use anyhow::Context;
use clap::Args;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use picket_client::{
    ClientError, ErrorCode, FenceRegistration, Guard, LostReason, Released, Session,
};
use std::process::ExitCode;
use std::time::Duration;

/// Exit code when the lock could not be acquired (taken, timed out, or refused).
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code when the lock was lost while the command ran and the command was stopped.
pub const EXIT_LOCK_LOST: u8 = 76;

/// Options of `picket lock`.
#[derive(Debug, Args)]
pub struct LockArgs {
    /// The lock to hold while the command runs.
    name: String,
    /// Session TTL: how long the lock survives this process stopping without a word.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    ttl: Duration,
    /// Wait at most this long for the lock (default: wait until granted).
    #[arg(long, value_parser = parse_duration, conflicts_with = "try_only")]
    wait: Option<Duration>,
    /// Do not wait: fail at once if the lock is taken.
    #[arg(long = "try")]
    try_only: bool,
    /// After SIGTERM, how long the command's process group gets before SIGKILL (at most a
    /// quarter of the TTL). When keepalives stop being confirmed, SIGTERM goes out this long
    /// (and half a second more) before the lease ends, so the command is gone before the
    /// service may grant the lock to anyone else.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    kill_grace: Duration,
    /// A fenced resource to register the new token with right after acquiring, before the
    /// command runs (fence on acquire): `POST URL` with the sequencer, e.g.
    /// http://127.0.0.1:7690/fence/orders/ for `picket kv`. Repeatable.
    #[arg(long = "fence")]
    fences: Vec<String>,
    /// After this process's session expires, keep the lock ungrantable this long.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    lock_delay: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

async fn acquire(
    session: &Session,
    name: &str,
    wait: Option<Duration>,
    try_only: bool,
) -> Result<Guard, ClientError> {
    match (try_only, wait) {
        (true, _) => session.try_lock(name).await,
        (false, Some(wait)) => session.lock_timeout(name, wait).await,
        (false, None) => session.lock(name).await,
    }
}

fn not_acquired(name: &str, error: &ClientError) -> String {
    match (error.code(), error.holder_token()) {
        (Some(ErrorCode::LockBusy), Some(token)) => format!(
            "lock {name:?} is held by another session (token {token}); not running the command"
        ),
        (Some(ErrorCode::WaitTimedOut), Some(token)) => format!(
            "timed out waiting for lock {name:?} (held under token {token}); not running the command"
        ),
        _ => format!("could not acquire lock {name:?}: {error}"),
    }
}

/// The signals that end `picket lock`: SIGINT, SIGTERM and SIGHUP.
pub(crate) struct Interrupts {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Interrupts {
    /// Starts listening: from now on these signals no longer end the process.
    pub(crate) fn listen() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next one to arrive.
    pub(crate) async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = self.hangup.recv() => Signal::SIGHUP,
        }
    }
}

/// The exit code of a process that a signal ended: 128 plus its number, as shells report it.
pub(crate) fn exit_code_of_signal(signal: Signal) -> u8 {
    u8::try_from(128 + signal as i32).unwrap_or(1)
}

fn signal_group(group: Pid, signal: Signal) {
    // The group may be gone already; that is the goal.
    let _ = killpg(group, signal);
}

/// SIGTERM to the group, and SIGCONT after it: a group stopped (Ctrl-Z, SIGTTIN) would keep
/// the SIGTERM pending, never clean up, and wait out the whole grace for its SIGKILL (found
/// in review).
fn terminate_group(group: Pid) {
    signal_group(group, Signal::SIGTERM);
    signal_group(group, Signal::SIGCONT);
}

/// Whether any process is left in `group` (signal 0 asks without sending anything).
fn group_alive(group: Pid) -> bool {
    killpg(group, None).is_ok()
}

fn exit_code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
        (None, None) => 1,
    }
}

/// Options of the hidden `picket __lock-watchdog`.
#[derive(Debug, Args)]
pub struct WatchdogArgs {
    /// The command's process group.
    #[arg(long)]
    group: i32,
    /// Between SIGTERM and SIGKILL, in milliseconds.
    #[arg(long)]
    grace_ms: u64,
}

/// What `picket lock` writes to its watchdog when it ends normally.
const WATCHDOG_DONE: &str = "done";

/// What `picket lock` writes to its watchdog, followed by a reading of [`boottime_ms`], each
/// time the point moves by which the command must be stopped if no keepalive is confirmed
/// before it (the lease's end less the grace and [`STOP_MARGIN`]).
const WATCHDOG_UNTIL: &str = "until ";

/// `CLOCK_BOOTTIME` in milliseconds: the clock the client counts its lease on, which counts a
/// suspension, read alike by `picket lock` and its watchdog (two processes).
fn boottime_ms() -> u64 {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let clock = nix::time::ClockId::CLOCK_BOOTTIME;
    // Elsewhere the client counts its lease on the monotonic clock too.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let clock = nix::time::ClockId::CLOCK_MONOTONIC;
    nix::time::clock_gettime(clock).map_or(0, |reading| {
        let seconds = u64::try_from(reading.tv_sec()).unwrap_or(0);
        let millis = u64::try_from(reading.tv_nsec()).unwrap_or(0) / 1_000_000;
        seconds.saturating_mul(1_000).saturating_add(millis)
    })
}

/// Runs the watchdog. It reads `picket lock`'s lines until `done`, and stops the command's
/// process group (SIGTERM, SIGKILL after the grace) when the pipe closes without it (`picket
/// lock` died), or when the last point `picket lock` gave (`until`) passes without a newer one:
/// `picket lock` stopped (SIGSTOP, or Ctrl-Z with no terminal to hand the command) keeps no
/// lease, and the command ran on past it, after the lock could be granted again (found in
/// review).
pub fn watchdog(args: &WatchdogArgs) -> ExitCode {
    use std::io::BufRead;
    use std::sync::mpsc::RecvTimeoutError;
    let (lines, said) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut until: Option<u64> = None;
    let why = loop {
        // Checked every 100 ms at least: the channel's timeout does not count a suspension.
        let wait = until.map_or(Duration::from_millis(100), |at| {
            Duration::from_millis(at.saturating_sub(boottime_ms())).min(Duration::from_millis(100))
        });
        match said.recv_timeout(wait) {
            Ok(line) if line == WATCHDOG_DONE => return ExitCode::SUCCESS,
            Ok(line) => {
                if let Some(at) = line.strip_prefix(WATCHDOG_UNTIL).and_then(|at| at.parse().ok()) {
                    until = Some(at);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                break "picket lock ended without a word (killed?)";
            }
            Err(RecvTimeoutError::Timeout) => {
                if until.is_some_and(|at| boottime_ms() >= at) {
                    break "picket lock confirmed no keepalive in time (stopped or frozen?), and its lease was about to end";
                }
            }
        }
    };
    let group = Pid::from_raw(args.group);
    terminate_group(group);
    let deadline = std::time::Instant::now() + Duration::from_millis(args.grace_ms);
    while std::time::Instant::now() < deadline && group_alive(group) {
        std::thread::sleep(Duration::from_millis(20));
    }
    signal_group(group, Signal::SIGKILL);
    eprintln!("picket: {why}; stopped its command's process group");
    ExitCode::SUCCESS
}

/// Runs the placeholder of a command's process group: waits for standard input to close
/// (`picket lock` ended or died), then exits.
pub fn group_placeholder() -> ExitCode {
    let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
    ExitCode::SUCCESS
}

/// The process group a command runs in, made before the command (see the module
/// documentation). Dropped, its placeholder is killed and reaped.
struct Group {
    placeholder: std::process::Child,
    id: Pid,
}

impl Group {
    fn start() -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt;
        let placeholder = std::process::Command::new(std::env::current_exe()?)
            .arg("__lock-group")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .context("cannot start the command's process group")?;
        let id = Pid::from_raw(i32::try_from(placeholder.id()).context("pid out of range")?);
        Ok(Self { placeholder, id })
    }

    /// Ends the placeholder, so that whatever is left in the group is the command's.
    fn end_placeholder(&mut self) {
        // Killed, not asked: a group stopped by Ctrl-Z would not read its end of the pipe.
        let _ = self.placeholder.kill();
        let _ = self.placeholder.wait();
    }

    /// Stops what the command left running in its group once it exited (a job it put in
    /// the background, a daemon that did not leave the group): SIGTERM, and SIGKILL after
    /// `grace`. Returns whether anything was left. The lock is released only after this: the
    /// command's other processes carry its token, and wrote on after the release before
    /// (found in review).
    async fn stop_the_rest(&mut self, grace: Duration) -> bool {
        self.end_placeholder();
        if !group_alive(self.id) {
            return false;
        }
        terminate_group(self.id);
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline && group_alive(self.id) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        signal_group(self.id, Signal::SIGKILL);
        true
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.end_placeholder();
    }
}

/// The watchdog of one command. [`Watchdog::finish`] tells it `done` once the command has
/// ended the way `picket lock` meant it to; dropped without that (an error returned early, a
/// panic), it only closes the pipe, so the watchdog stops the command's group as it would had
/// `picket lock` died. A command is never left running with nothing to stop it.
struct Watchdog {
    child: std::process::Child,
    /// The pipe to it, written from the task that keeps it told of the lease.
    pipe: std::sync::Mutex<Option<std::process::ChildStdin>>,
}

impl Watchdog {
    fn start(group: Pid, kill_grace: Duration) -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .args(["__lock-watchdog", "--group", &group.as_raw().to_string()])
            .args(["--grace-ms", &kill_grace.as_millis().to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            // Its own group: a signal to the command's group, or the terminal's, passes it by.
            .process_group(0)
            .spawn()
            .context("cannot start the lock's watchdog")?;
        let pipe = std::sync::Mutex::new(child.stdin.take());
        Ok(Self { child, pipe })
    }

    fn say(&self, line: &str) {
        use std::io::Write;
        let mut pipe = self.pipe.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(pipe) = pipe.as_mut() {
            // A few bytes into a pipe the watchdog drains: this does not block. Failing, the
            // watchdog is gone, and nothing would hear it.
            let _ = pipe.write_all(format!("{line}\n").as_bytes());
        }
    }

    /// Tells the watchdog the point by which the command must be stopped if no keepalive is
    /// confirmed before it: the lease's end less `stop_before`, and [`WATCHDOG_LAG`] later, so
    /// that `picket lock`, when it runs, acts first (both acting, the command's end was taken
    /// for an exit: found in review), and a keepalive confirmed just before the point reaches
    /// the watchdog in time.
    fn tell_lease(&self, session: &Session, stop_before: Duration) {
        let left = session.lease_remaining().saturating_sub(stop_before) + WATCHDOG_LAG;
        let until = boottime_ms().saturating_add(u64::try_from(left.as_millis()).unwrap_or(0));
        self.say(&format!("{WATCHDOG_UNTIL}{until}"));
    }

    /// Keeps the watchdog told of the lease, every 100 ms, for as long as it is polled.
    async fn follow_lease(
        &self,
        session: &Session,
        stop_before: Duration,
    ) -> std::convert::Infallible {
        loop {
            self.tell_lease(session, stop_before);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Tells the watchdog the command ended as meant, and waits for it to exit.
    fn finish(mut self) {
        self.say(WATCHDOG_DONE);
        drop(self.pipe.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
        let _ = self.child.wait();
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Closing the pipe without `done` tells the watchdog to stop the group. It is not
        // waited for: it runs in a group of its own and outlives `picket lock` by design.
        drop(self.pipe.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
    }
}

/// Runs `picket lock`.
pub async fn run(args: LockArgs, connect: &crate::connect::Connect) -> anyhow::Result<ExitCode> {
    if let Some(too_short) = ttl_too_short(args.ttl, args.kill_grace) {
        anyhow::bail!(too_short);
    }
    let client = connect.connect_for_ttl(args.ttl).await?;
    let session = client.session_with_lock_delay(args.ttl, args.lock_delay).await?;
    let session_id = session.id();
    // Listened to from before the lock is asked for: a signal while waiting for it must end
    // the wait and close the session too, not the process with its session open.
    let mut interrupts = Interrupts::listen()?;
    let outcome = hold_and_run(&session, &args, &mut interrupts).await;
    // Every way out ends here: the session is closed, so it does not linger for its TTL (a
    // session dropped as the process exits never gets to close). Closing also releases
    // anything still held, without lock-delay.
    if let Err(error) = session.close().await {
        eprintln!(
            "picket: could not close session {session_id} ({error}); it expires after its TTL"
        );
    }
    outcome
}

/// Acquires the lock, registers it with the fences, and runs the command under it.
async fn hold_and_run(
    session: &Session,
    args: &LockArgs,
    interrupts: &mut Interrupts,
) -> anyhow::Result<ExitCode> {
    let acquired = tokio::select! {
        acquired = acquire(session, &args.name, args.wait, args.try_only) => acquired,
        signal = interrupts.next() => {
            eprintln!(
                "picket: {signal} while waiting for lock {:?}; not running the command",
                args.name
            );
            return Ok(ExitCode::from(exit_code_of_signal(signal)));
        }
    };
    let guard = match acquired {
        Ok(guard) => guard,
        Err(error) => {
            eprintln!("picket: {}", not_acquired(&args.name, &error));
            return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
        }
    };
    let fences: Vec<HttpFence> = args.fences.iter().map(HttpFence::new).collect();
    let fences: Vec<&dyn FenceRegistration> =
        fences.iter().map(|fence| fence as &dyn FenceRegistration).collect();
    let guard = match guard.fenced(&fences).await {
        Ok(guard) => guard,
        Err(error) => {
            eprintln!(
                "picket: could not fence the new grant of lock {:?} ({error}); not running the command",
                args.name
            );
            return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
        }
    };
    let (program, arguments) = args.command.split_first().expect("clap requires a command");
    let kill_grace = effective_kill_grace(args.kill_grace, session.ttl());
    // Fencing may have taken a while: a grant lost meanwhile, or a lease already too short to
    // stop the command in time, runs nothing (found in review).
    if let Some(reason) = guard.lost_reason() {
        eprintln!(
            "picket: lost lock {:?} ({}) before the command could start; not running it",
            args.name,
            describe(reason)
        );
        return Ok(ExitCode::from(EXIT_LOCK_LOST));
    }
    if session.lease_remaining() <= kill_grace + STOP_MARGIN {
        eprintln!(
            "picket: the lease of lock {:?} ran short before the command could start (no keepalive confirmed in time); not running it",
            args.name
        );
        return Ok(ExitCode::from(EXIT_LOCK_LOST));
    }
    // The group, then its watchdog, then the command: from the moment the command exists,
    // something stops it should `picket lock` die.
    let mut command_group = Group::start()?;
    let group = command_group.id;
    let watchdog = Watchdog::start(group, kill_grace)?;
    watchdog.tell_lease(session, kill_grace + STOP_MARGIN);
    let mut child = tokio::process::Command::new(program)
        .args(arguments)
        .env("PICKET_LOCK", &args.name)
        .env("PICKET_TOKEN", guard.token().to_string())
        .env("PICKET_SEQUENCER", guard.sequencer().to_string())
        .env("PICKET_SESSION", session.id().to_string())
        // A process group apart from picket's, so a lost lock stops the command and everything
        // it started.
        .process_group(group.as_raw())
        .spawn()
        .with_context(|| format!("cannot run {program:?}"))?;
    // From here on, an error returned stops the command's group first: returned, the session
    // is closed at once, and the watchdog would give the command the grace after that release
    // (found in review).
    let killed = |error: std::io::Error| {
        signal_group(group, Signal::SIGKILL);
        error
    };
    let command = child.id().map(|pid| Pid::from_raw(i32::try_from(pid).unwrap_or(0)));
    let Some(command) = command.filter(|pid| pid.as_raw() > 0) else {
        signal_group(group, Signal::SIGKILL);
        anyhow::bail!("the command has no pid");
    };
    // In a terminal's foreground, the command gets the foreground (see `terminal.rs`), as soon
    // as it runs.
    let foreground = Foreground::give(group);
    let still_held =
        || session.lost_reason().is_none() && session.lease_remaining() > kill_grace + STOP_MARGIN;
    let follow_stops = async {
        match &foreground {
            Some(foreground) => foreground.follow_stops(command, still_held).await,
            None => std::future::pending::<std::convert::Infallible>().await,
        }
    };
    let outcome = tokio::select! {
        // A loss first: a command that died of the SIGTERM its loss brought (from the
        // watchdog, say) is a loss, not an exit (found in review).
        biased;
        reason = guard.lost() => Outcome::Lost(reason),
        () = lease_running_short(session, kill_grace) => Outcome::LeaseShort,
        status = child.wait() => Outcome::Exited(status.map_err(killed)?),
        signal = interrupts.next() => Outcome::Interrupted(signal),
        never = follow_stops => match never {},
        never = watchdog.follow_lease(session, kill_grace + STOP_MARGIN) => match never {},
    };
    // A command that exited of its own while `picket lock` was frozen (both ready as it
    // resumed) did its work under the lock: a lease only short has not ended (found in review).
    let outcome = match outcome {
        Outcome::LeaseShort => match child.try_wait() {
            Ok(Some(status))
                if std::os::unix::process::ExitStatusExt::signal(&status).is_none() =>
            {
                Outcome::Exited(status)
            }
            _ => Outcome::LeaseShort,
        },
        other => other,
    };
    // The terminal goes back to picket's group now, not after the release: the command's
    // group may be gone, and Ctrl-C must reach someone.
    drop(foreground);
    // Whatever ends the command's group below, the watchdog is kept told of the lease until
    // it is told `done`: the waits below can take the grace and more, and a watchdog left
    // with the last point told stopped a command on a healthy session (found in review).
    let ended = async {
        match outcome {
            Outcome::Exited(status) => {
                let left = command_group.stop_the_rest(kill_grace).await;
                Ok::<_, std::io::Error>((Some(status), left, None))
            }
            Outcome::Lost(_) | Outcome::LeaseShort => {
                terminate_group(group);
                let stopped = tokio::time::timeout(kill_grace, child.wait()).await;
                // SIGKILL the group whether or not its leader exited: a grandchild may still
                // run.
                signal_group(group, Signal::SIGKILL);
                if stopped.is_err() {
                    let _ = child.wait().await;
                }
                let why = match outcome {
                    Outcome::Lost(reason) => describe(reason),
                    _ => {
                        "no keepalive was confirmed in time, and the lease would end before the command could be stopped"
                    }
                };
                Ok((None, false, Some(why)))
            }
            Outcome::Interrupted(signal) => {
                let status =
                    pass_on(signal, group, &mut child, kill_grace).await.map_err(killed)?;
                // What the command left in its group goes too, before the release.
                let left = command_group.stop_the_rest(kill_grace / 2).await;
                Ok((Some(status), left, None))
            }
        }
    };
    let ended = tokio::select! {
        ended = ended => ended?,
        never = watchdog.follow_lease(session, kill_grace + STOP_MARGIN) => match never {},
    };
    // The group is gone: nothing is left for the watchdog to stop.
    watchdog.finish();
    let exit_code = match ended {
        (_, _, Some(why)) => {
            eprintln!(
                "picket: lost lock {:?} ({why}) while the command ran; stopped the command and its process group. Its writes after this point may be refused by fenced resources.",
                args.name,
            );
            EXIT_LOCK_LOST
        }
        (status, left, None) => {
            if left {
                eprintln!(
                    "picket: the command left processes running in its group; stopped them before releasing lock {:?}",
                    args.name
                );
            }
            let lost_before = guard.lost_reason();
            let released = guard.release().await;
            release_outcome(&args.name, released, lost_before, status)
        }
    };
    Ok(ExitCode::from(exit_code))
}

/// Passes `signal`, which `picket lock` got, on to the command's group, and waits for the
/// command to end: as it came, since a command may treat a hangup or an interrupt apart from a
/// request to terminate. One that goes on (it reloads on SIGHUP, or ignores SIGINT as a shell's
/// background job does) gets SIGTERM halfway through the grace, and SIGKILL at its end. Each
/// signal is followed by SIGCONT, so a stopped group takes it (found in review).
async fn pass_on(
    signal: Signal,
    group: Pid,
    child: &mut tokio::process::Child,
    kill_grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    signal_group(group, signal);
    signal_group(group, Signal::SIGCONT);
    let terminated = signal == Signal::SIGTERM;
    let first_wait = if terminated { kill_grace } else { kill_grace / 2 };
    let mut ended = tokio::time::timeout(first_wait, child.wait()).await;
    if ended.is_err() && !terminated {
        terminate_group(group);
        ended = tokio::time::timeout(kill_grace - first_wait, child.wait()).await;
    }
    match ended {
        Ok(status) => status,
        Err(_) => {
            signal_group(group, Signal::SIGKILL);
            child.wait().await
        }
    }
}

/// The exit code once the command ended (`status`) and its lock's release answered: the
/// command's own, unless the lock was found lost before the release (`lost_before`), which
/// exits [`EXIT_LOCK_LOST`] (found in review: it exited with the command's 0). A release that
/// finds the lock ended with no loss seen is said, not counted a loss: a retried release whose
/// first attempt ended the lock answers so too.
fn release_outcome(
    name: &str,
    released: Result<Released, ClientError>,
    lost_before: Option<LostReason>,
    status: Option<std::process::ExitStatus>,
) -> u8 {
    let own = status.map_or(1, exit_code_of);
    match released {
        Ok(Released::Now) => own,
        Ok(_) => {
            eprintln!(
                "picket: the command finished, but lock {name:?} had ended before its release (its session was lost just then, or a retried release found its first attempt had ended it); writes made after that point may have been refused by fenced resources"
            );
            if lost_before.is_some() { EXIT_LOCK_LOST } else { own }
        }
        Err(error) => {
            eprintln!("picket: the command finished but releasing lock {name:?} failed: {error}");
            own
        }
    }
}

/// How long after `picket lock`'s own point to stop the command (see [`Watchdog::tell_lease`])
/// the watchdog waits: more than the period at which it is told (100 ms), and less than
/// [`STOP_MARGIN`], so its SIGKILL still lands before the lease ends.
const WATCHDOG_LAG: Duration = Duration::from_millis(200);

/// The margin kept between SIGKILL and the end of the lease, for the two clocks' drift and
/// for the signal to land.
const STOP_MARGIN: Duration = Duration::from_millis(500);

/// The time a keepalive's round trip may take without the command being stopped on a healthy
/// session.
const KEEPALIVE_ROUND_TRIP_BUDGET: Duration = Duration::from_millis(200);

/// Why `ttl` is too short for `picket lock`, if it is. The client counts on its lease for the
/// TTL less 3 % from each confirmed keepalive's send, and sends one every third of the TTL; the
/// command is stopped the grace and [`STOP_MARGIN`] before the lease ends. So just before a
/// keepalive is confirmed the lease has about 0.64 TTL left, which must be above the stop
/// point and a round trip. Below that every command was stopped on a healthy session (a TTL of
/// 1 s stopped it before the first keepalive went out: found in review).
fn ttl_too_short(ttl: Duration, kill_grace: Duration) -> Option<String> {
    let fits = |ttl: Duration| {
        let lowest_lease = ttl - ttl * 3 / 100 - ttl / 3;
        lowest_lease
            >= effective_kill_grace(kill_grace, ttl) + STOP_MARGIN + KEEPALIVE_ROUND_TRIP_BUDGET
    };
    if fits(ttl) {
        return None;
    }
    // The least TTL that fits, in tenths of a second (every TTL of 3 s or more fits).
    let least = (1..=30_u32)
        .map(|tenths| Duration::from_millis(u64::from(tenths) * 100))
        .find(|ttl| fits(*ttl))
        .unwrap_or(Duration::from_secs(3));
    Some(format!(
        "--ttl {ttl:?} is too short for picket lock: it stops the command --kill-grace (at most a quarter of the TTL) and {STOP_MARGIN:?} before the lease ends, and a lease renewed every third of the TTL leaves too little for that and a keepalive's round trip; give --ttl {least:?} or more"
    ))
}

/// The grace between SIGTERM and SIGKILL: `--kill-grace`, but never more than a quarter of the
/// TTL, so a healthy session's lease (renewed every third of the TTL) never runs that short.
fn effective_kill_grace(kill_grace: Duration, ttl: Duration) -> Duration {
    kill_grace.min(ttl / 4)
}

/// Resolves once the session's lease has only `kill_grace` and [`STOP_MARGIN`] left: the command
/// must get SIGTERM now, so that SIGKILL lands before the lease ends and before the service may
/// grant the lock to someone else (with a lock-delay of 0, at once).
async fn lease_running_short(session: &Session, kill_grace: Duration) {
    let stop_at = kill_grace + STOP_MARGIN;
    loop {
        let remaining = session.lease_remaining();
        if remaining <= stop_at {
            return;
        }
        // Rechecked at least every 100 ms: a confirmed keepalive moves the end further out,
        // and a suspended machine's timers do not count the suspension.
        tokio::time::sleep((remaining - stop_at).min(Duration::from_millis(100))).await;
    }
}

enum Outcome {
    Exited(std::process::ExitStatus),
    Lost(LostReason),
    /// The lease is about to run out without a confirmed keepalive.
    LeaseShort,
    /// `picket lock` got SIGINT, SIGTERM or SIGHUP: passed on to the command's group, whose end is
    /// waited for (SIGTERM halfway through the grace, SIGKILL at its end) before the lock is
    /// released.
    Interrupted(Signal),
}

fn describe(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Expired => "the session expired",
        LostReason::Revoked => "the session was revoked",
        LostReason::Closed => "the session was closed",
        LostReason::Unconfirmed => "the session could not be confirmed within its TTL",
        LostReason::GrantEnded => "the grant ended",
        _ => "the grant is gone",
    }
}
