//! The client commands: acquire, release, status, locks, sessions, watch, members, check.
//!
//! Read commands print a tidy table, or JSON with `--json`.

use crate::duration::parse_duration;
use anyhow::bail;
use clap::{Args, Subcommand};
use picket_client::{CheckOutcome, Client, LockState, Sequencer, WatchTarget, Watched};
use picket_core::{Event, Wait};
use serde_json::{Value, json};
use std::process::ExitCode;
use std::time::Duration;

/// Renders rows under headers, columns padded to their widest cell.
#[must_use]
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|header| header.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let render = |cells: Vec<&str>| -> String {
        let padded: Vec<String> =
            cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut lines = vec![render(headers.to_vec())];
    lines.extend(rows.iter().map(|row| render(row.iter().map(String::as_str).collect())));
    lines.join("\n")
}

fn lock_json(info: &LockState) -> Value {
    let holder = info.holder.as_ref().map(|holder| {
        json!({
            "session_id": holder.session.0,
            "token": holder.token,
            "sequencer": holder.sequencer.to_string(),
        })
    });
    let waiters: Vec<u64> = info.waiters.iter().map(|session| session.0).collect();
    json!({ "name": info.name, "holder": holder, "waiters": waiters, "delayed": info.delayed })
}

fn lock_row(info: &LockState) -> Vec<String> {
    let (session, token) = match &info.holder {
        None => ("-".to_owned(), "-".to_owned()),
        Some(holder) => (holder.session.to_string(), holder.token.to_string()),
    };
    let waiters = if info.waiters.is_empty() {
        "-".to_owned()
    } else {
        info.waiters.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
    };
    let state = match (&info.holder, info.delayed) {
        (_, true) => "lock-delay",
        (None, false) => "free",
        (Some(_), false) => "held",
    };
    vec![info.name.clone(), state.to_owned(), session, token, waiters]
}

const LOCK_HEADERS: [&str; 5] = ["LOCK", "STATE", "SESSION", "TOKEN", "WAITERS"];

/// `picket acquire`.
#[derive(Debug, Args)]
pub struct AcquireArgs {
    /// The lock.
    name: String,
    /// Acquire in this existing session (its owner keeps it alive) and exit at once. Without it,
    /// picket opens a session, holds the lock until interrupted, then releases it.
    #[arg(long)]
    session: Option<u64>,
    /// TTL of the session picket opens.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    ttl: Duration,
    /// Wait at most this long (default: until granted).
    #[arg(long, value_parser = parse_duration, conflicts_with = "try_only")]
    wait: Option<Duration>,
    /// Do not wait.
    #[arg(long = "try")]
    try_only: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn wait_of(wait: Option<Duration>, try_only: bool) -> Wait {
    match wait {
        _ if try_only => Wait::Try,
        // A wait shorter than a millisecond still waits, rather than only trying.
        Some(wait) => {
            Wait::For { wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1) }
        }
        None => Wait::Forever,
    }
}

fn print_grant(json: bool, name: &str, session: u64, token: u64, sequencer: &str) {
    if json {
        println!(
            "{}",
            json!({ "name": name, "session_id": session, "token": token, "sequencer": sequencer })
        );
    } else {
        println!("acquired {name} token={token} sequencer={sequencer} session={session}");
    }
}

/// Runs `picket acquire`.
pub async fn acquire(args: AcquireArgs, client: &Client) -> anyhow::Result<ExitCode> {
    let wait = wait_of(args.wait, args.try_only);
    if let Some(session) = args.session {
        let granted = client.acquire_in(session, &args.name, wait).await?;
        print_grant(args.json, &args.name, session, granted.token, &granted.sequencer.to_string());
        return Ok(ExitCode::SUCCESS);
    }
    let session = client.session(args.ttl).await?;
    // Every way out closes the session: a session left open would hold or wait for the lock
    // until its TTL ran out.
    let mut interrupts = crate::lock_cmd::Interrupts::listen()?;
    let outcome = acquire_and_hold(&session, &args, wait, &mut interrupts).await;
    let session_id = session.id();
    if let Err(error) = session.close().await {
        eprintln!(
            "picket: could not close session {session_id} ({error}); it expires after its TTL"
        );
    }
    outcome
}

/// `picket acquire` in a session of its own: acquires, holds until a signal, then releases.
async fn acquire_and_hold(
    session: &picket_client::Session,
    args: &AcquireArgs,
    wait: Wait,
    interrupts: &mut crate::lock_cmd::Interrupts,
) -> anyhow::Result<ExitCode> {
    let acquiring = async {
        match wait {
            Wait::Try => session.try_lock(&args.name).await,
            Wait::For { wait_ms } => {
                session.lock_timeout(&args.name, Duration::from_millis(wait_ms)).await
            }
            Wait::Forever => session.lock(&args.name).await,
        }
    };
    let guard = tokio::select! {
        acquired = acquiring => acquired?,
        signal = interrupts.next() => {
            eprintln!("picket: {signal} while waiting for lock {:?}", args.name);
            return Ok(ExitCode::from(crate::lock_cmd::exit_code_of_signal(signal)));
        }
    };
    print_grant(args.json, &args.name, session.id(), guard.token(), &guard.sequencer().to_string());
    eprintln!("picket: holding {:?}; press Ctrl-C to release", args.name);
    tokio::select! {
        _ = interrupts.next() => {}
        reason = guard.lost() => bail!("lost lock {:?}: {reason:?}", args.name),
    }
    guard.release().await?;
    Ok(ExitCode::SUCCESS)
}

/// `picket release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The lock.
    name: String,
    /// The holding session.
    #[arg(long)]
    session: u64,
    /// The grant's token.
    #[arg(long)]
    token: u64,
}

/// Runs `picket release`.
pub async fn release(args: ReleaseArgs, client: &Client) -> anyhow::Result<ExitCode> {
    client.release_in(args.session, &args.name, args.token).await?;
    println!("released {} token={}", args.name, args.token);
    Ok(ExitCode::SUCCESS)
}

/// `picket status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The lock.
    name: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `picket status`.
pub async fn status(args: StatusArgs, client: &Client) -> anyhow::Result<ExitCode> {
    let info = client.lock_info(&args.name).await?;
    if args.json {
        println!("{}", lock_json(&info));
    } else {
        println!("{}", table(&LOCK_HEADERS, &[lock_row(&info)]));
    }
    Ok(ExitCode::SUCCESS)
}

/// `picket locks`.
#[derive(Debug, Args)]
pub struct LocksArgs {
    /// Only locks whose names start with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// At most this many (the server caps it too).
    #[arg(long, default_value_t = 1_000)]
    limit: u32,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `picket locks`.
pub async fn locks(args: LocksArgs, client: &Client) -> anyhow::Result<ExitCode> {
    let locks = client.locks(&args.prefix, args.limit).await?;
    if args.json {
        println!("{}", Value::Array(locks.iter().map(lock_json).collect()));
    } else {
        let rows: Vec<Vec<String>> = locks.iter().map(lock_row).collect();
        println!("{}", table(&LOCK_HEADERS, &rows));
    }
    Ok(ExitCode::SUCCESS)
}

/// `picket sessions`.
#[derive(Debug, Args)]
pub struct SessionsArgs {
    #[command(subcommand)]
    action: Option<SessionsAction>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum SessionsAction {
    /// End a session as an expiry would: its locks are released (after its lock-delay) and its
    /// holder's `lost()` fires.
    Revoke {
        /// The session id.
        id: u64,
    },
}

/// Runs `picket sessions`.
pub async fn sessions(args: SessionsArgs, client: &Client) -> anyhow::Result<ExitCode> {
    if let Some(SessionsAction::Revoke { id }) = args.action {
        client.revoke_session(id).await?;
        println!("revoked session {id}");
        return Ok(ExitCode::SUCCESS);
    }
    let sessions = client.sessions(0).await?;
    if args.json {
        let values: Vec<Value> = sessions
            .iter()
            .map(|s| json!({ "session_id": s.session.0, "ttl_ms": s.ttl_ms, "lock_delay_ms": s.lock_delay_ms, "held": s.held, "waiting": s.waiting }))
            .collect();
        println!("{}", Value::Array(values));
    } else {
        let rows: Vec<Vec<String>> = sessions
            .iter()
            .map(|s| {
                let list = |names: &[String]| {
                    if names.is_empty() { "-".to_owned() } else { names.join(",") }
                };
                vec![
                    s.session.to_string(),
                    format!("{}ms", s.ttl_ms),
                    format!("{}ms", s.lock_delay_ms),
                    list(&s.held),
                    list(&s.waiting),
                ]
            })
            .collect();
        println!("{}", table(&["SESSION", "TTL", "LOCK-DELAY", "HOLDS", "WAITS FOR"], &rows));
    }
    Ok(ExitCode::SUCCESS)
}

/// `picket watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// A lock to watch.
    #[arg(required_unless_present_any = ["prefix", "session"], conflicts_with_all = ["prefix", "session"])]
    name: Option<String>,
    /// Watch every lock whose name starts with this instead.
    #[arg(long, conflicts_with = "session")]
    prefix: Option<String>,
    /// Watch one session instead.
    #[arg(long)]
    session: Option<u64>,
    /// Print JSON, one object per line.
    #[arg(long)]
    json: bool,
}

/// Runs `picket watch` until interrupted or the stream ends.
pub async fn watch(args: WatchArgs, client: &Client) -> anyhow::Result<ExitCode> {
    let target = match (args.name, args.prefix, args.session) {
        (Some(name), _, _) => WatchTarget::Name(name),
        (_, Some(prefix), _) => WatchTarget::Prefix(prefix),
        (_, _, Some(session)) => WatchTarget::SessionId(session),
        _ => bail!("give a lock name, --prefix or --session"),
    };
    let mut stream = client.watch(target).await?;
    while let Some(item) = stream.next().await? {
        let line = WatchLine::of(&item);
        if args.json {
            println!(
                "{}",
                json!({ "kind": line.kind, "name": line.name, "session_id": line.session_id, "token": line.token, "cause": line.cause, "revision": line.revision })
            );
        } else {
            let token =
                if line.token > 0 { format!(" token={}", line.token) } else { String::new() };
            let cause =
                if line.cause.is_empty() { String::new() } else { format!(" ({})", line.cause) };
            println!(
                "rev={} {} {} session={}{token}{cause}",
                line.revision, line.kind, line.name, line.session_id
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `picket watch` prints of one item: its names as the wire carries them (so a script
/// matches the HTTP stream's), 0 and empty where an item has no such field.
struct WatchLine {
    kind: String,
    name: String,
    session_id: u64,
    token: u64,
    cause: String,
    revision: u64,
}

impl WatchLine {
    fn of(item: &Watched) -> Self {
        let empty = |kind: &str, revision: u64| Self {
            kind: kind.to_owned(),
            name: String::new(),
            session_id: 0,
            token: 0,
            cause: String::new(),
            revision,
        };
        match item {
            Watched::Event { revision, event } => Self {
                kind: event.kind_name().to_owned(),
                name: event.lock_name().unwrap_or_default().to_owned(),
                session_id: event.session().0,
                token: match event {
                    Event::Granted { token, .. } | Event::Released { token, .. } => *token,
                    _ => 0,
                },
                cause: event.cause_name().unwrap_or_default().to_owned(),
                revision: *revision,
            },
            Watched::Resync { revision } => empty("resync", *revision),
            Watched::Unknown { revision, kind, cause, name, session, token } => Self {
                cause: cause.clone(),
                name: name.clone(),
                session_id: session.0,
                token: *token,
                ..empty(kind, *revision)
            },
            // A kind of a newer client library: nothing to say of it.
            _ => empty("unknown", 0),
        }
    }
}

/// `picket snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    action: SnapshotAction,
}

#[derive(Debug, Subcommand)]
enum SnapshotAction {
    /// Save a consistent backup of a running cluster's lock state to FILE (admins only).
    /// Restore it with `picket serve --restore FILE` into empty data directories: the restored
    /// cluster's tokens start above any the old cluster could have issued.
    Save {
        /// Where to write the backup; replaced only once the whole backup is on disk.
        file: std::path::PathBuf,
    },
    /// Check a backup file and print what it holds, without a server.
    Inspect {
        /// The backup.
        file: std::path::PathBuf,
    },
}

impl SnapshotArgs {
    /// The file to inspect, when that is the action: it needs no server.
    #[must_use]
    pub fn offline(&self) -> Option<&std::path::Path> {
        match &self.action {
            SnapshotAction::Inspect { file } => Some(file),
            SnapshotAction::Save { .. } => None,
        }
    }
}

/// Runs `picket snapshot save`.
pub async fn snapshot(args: SnapshotArgs, client: &Client) -> anyhow::Result<ExitCode> {
    let SnapshotAction::Save { file } = args.action else {
        unreachable!("inspect runs without a client")
    };
    // Written as it arrives, not gathered in memory first, into a file of its own: FILE is
    // replaced only by a backup that arrived whole and reads back as one.
    let mut temporary = file.clone().into_os_string();
    temporary.push(".partial");
    let temporary = std::path::PathBuf::from(temporary);
    let mut chunks = client.backup_chunks().await?;
    let checked = match write_backup(&mut chunks, &temporary).await {
        Ok(bytes) => picket_server::backup::read(&temporary)
            .map(|backup| (backup, bytes))
            .map_err(anyhow::Error::from),
        Err(error) => Err(error),
    };
    let (backup, bytes) = match checked {
        Ok(checked) => checked,
        Err(error) => {
            let _ = std::fs::remove_file(&temporary);
            return Err(error.context("the backup was not saved; take it again"));
        }
    };
    anyhow::Context::with_context(std::fs::rename(&temporary, &file), || {
        format!(
            "cannot rename the whole backup {} to {}; it is complete where it is",
            temporary.display(),
            file.display()
        )
    })?;
    // The new name reaches the disk with its directory.
    let directory = file.parent().filter(|parent| !parent.as_os_str().is_empty());
    let directory = directory.unwrap_or(std::path::Path::new("."));
    let synced = std::fs::File::open(directory).and_then(|directory| directory.sync_all());
    anyhow::Context::with_context(synced, || {
        format!(
            "saved the backup to {} but cannot sync {}: a crash now may lose its name; sync \
             the directory, or save it again",
            file.display(),
            directory.display()
        )
    })?;
    println!(
        "saved a backup of revision {} ({} sessions, {} locks, {} bytes) to {}",
        backup.meta.revision,
        backup.meta.sessions,
        backup.meta.locks,
        bytes,
        file.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes the backup arriving in `chunks` into a new file at `path` and syncs it: how many
/// bytes. At most [`picket_server::backup::MAX_BACKUP_BYTES`] are taken.
async fn write_backup(
    chunks: &mut picket_client::BackupChunks,
    path: &std::path::Path,
) -> anyhow::Result<u64> {
    use tokio::io::AsyncWriteExt as _;
    let cannot_write = || format!("cannot write the backup to {}", path.display());
    let mut out = anyhow::Context::with_context(tokio::fs::File::create(path).await, cannot_write)?;
    let mut bytes = 0_u64;
    while let Some(chunk) = chunks.next().await? {
        bytes += chunk.len() as u64;
        if bytes > picket_server::backup::MAX_BACKUP_BYTES {
            anyhow::bail!(
                "the backup is longer than {} bytes, the most a node restores",
                picket_server::backup::MAX_BACKUP_BYTES
            );
        }
        anyhow::Context::with_context(out.write_all(&chunk).await, cannot_write)?;
    }
    anyhow::Context::with_context(out.flush().await, cannot_write)?;
    anyhow::Context::with_context(out.sync_all().await, cannot_write)?;
    Ok(bytes)
}

/// Runs `picket snapshot inspect`.
pub fn inspect_snapshot(file: &std::path::Path) -> anyhow::Result<ExitCode> {
    let backup = picket_server::backup::read(file)?;
    let meta = &backup.meta;
    println!(
        "{}",
        json!({
            "revision": meta.revision,
            "restore_epoch": backup.machine.restore_epoch(),
            "log_index": meta.log_index,
            "node_id": meta.node_id,
            "taken_unix_ms": meta.taken_unix_ms,
            "sessions": meta.sessions,
            "locks": meta.locks,
            "sha256": backup.digest,
        })
    );
    Ok(ExitCode::SUCCESS)
}

/// `picket members`.
#[derive(Debug, Args)]
pub struct MembersArgs {
    #[command(subcommand)]
    action: Option<MembersAction>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum MembersAction {
    /// Add a node (started with `picket serve --join`) as a voter.
    Add {
        /// Its node id; never reuse the id of a removed node.
        id: u64,
        /// Its client address, HOST:PORT.
        addr: String,
        /// Its peer address, HOST:PORT, if it serves peers on a port of its own
        /// (`picket serve --peer-listen`).
        #[arg(long)]
        peer_addr: Option<String>,
    },
    /// Remove a node from the cluster's membership (a voter or a learner). The leader refuses
    /// to remove a voter when the voters left would have no majority answering it.
    Remove {
        /// Its node id.
        id: u64,
    },
}

/// Runs `picket members`.
pub async fn members(args: MembersArgs, client: &Client) -> anyhow::Result<ExitCode> {
    let info = match args.action {
        Some(MembersAction::Add { id, addr, peer_addr }) => {
            client.add_member(id, &addr, peer_addr.as_deref()).await?
        }
        Some(MembersAction::Remove { id }) => client.remove_member(id).await?,
        None => client.cluster().await?,
    };
    if args.json {
        let members: Vec<Value> = info
            .members
            .iter()
            .map(|m| {
                let mut member = json!({ "node_id": m.node_id, "addr": m.addr, "voter": m.voter });
                if !m.peer_addr.is_empty() {
                    member["peer_addr"] = json!(m.peer_addr);
                }
                member
            })
            .collect();
        let voter_sets: Vec<&[u64]> =
            info.voter_sets.iter().map(|set| set.node_ids.as_slice()).collect();
        let named = |id: &str| (!id.is_empty()).then(|| id.to_owned());
        println!(
            "{}",
            json!({
                "members": members,
                "voter_sets": voter_sets,
                "leader_id": info.leader_id,
                "leader_addr": info.leader_addr,
                "applied_revision": info.applied_revision,
                "cluster_id": named(&info.cluster_id),
                "restored_from_cluster_id": named(&info.restored_from_cluster_id),
                "waiting_for_peers": info.waiting_for_peers,
            })
        );
    } else {
        let rows: Vec<Vec<String>> = info
            .members
            .iter()
            .map(|m| {
                let role = if m.node_id == info.leader_id {
                    "leader"
                } else if m.voter {
                    "voter"
                } else {
                    "learner"
                };
                let peer_addr = if m.peer_addr.is_empty() { "-" } else { &m.peer_addr };
                vec![m.node_id.to_string(), m.addr.clone(), peer_addr.to_owned(), role.to_owned()]
            })
            .collect();
        println!("{}", table(&["NODE", "ADDRESS", "PEER ADDRESS", "ROLE"], &rows));
        if info.voter_sets.len() > 1 {
            let sets: Vec<String> =
                info.voter_sets.iter().map(|set| format!("{:?}", set.node_ids)).collect();
            println!(
                "a membership change is under way: every quorum needs a majority of each of {}",
                sets.join(" and ")
            );
        }
        match (info.cluster_id.as_str(), info.restored_from_cluster_id.as_str()) {
            ("", _) => println!("cluster id: none yet (its first leader names it)"),
            (cluster_id, "") => println!("cluster id: {cluster_id}"),
            (cluster_id, origin) => println!("cluster id: {cluster_id} (restored from {origin})"),
        }
        if !info.waiting_for_peers.is_empty() {
            println!(
                "this node has not formed the cluster yet: its data directory was empty, and it \
                 waits for nodes {:?} to answer (it forms the cluster once every peer has \
                 answered and none holds a log). Start them, or check their addresses in \
                 --peers; to form the cluster without one, restart the others with a peer list \
                 without it and add it later with --join",
                info.waiting_for_peers
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `picket check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The sequencer to check, as issued (`p1.<token>.<name>`).
    sequencer: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `picket check`: exit code 0 when the sequencer is the current grant, 1 otherwise.
pub async fn check(args: CheckArgs, client: &Client) -> anyhow::Result<ExitCode> {
    let outcome = client.check(&args.sequencer).await?;
    let (status, current_token) = match outcome {
        // The sequencer's own token is the current one.
        CheckOutcome::Current { .. } => {
            ("current", Sequencer::parse(&args.sequencer).ok().map(|s| s.token))
        }
        CheckOutcome::Superseded { current_token } => ("superseded", current_token),
        CheckOutcome::UnknownLock => ("unknown_lock", None),
    };
    if args.json {
        println!("{}", json!({ "status": status, "current_token": current_token }));
    } else {
        match current_token {
            Some(token) if status != "current" => println!("{status} (current token {token})"),
            _ => println!("{status}"),
        }
    }
    Ok(if status == "current" { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_columns_to_the_widest_cell() {
        let rendered = table(&["A", "LONG HEADER"], &[vec!["wide cell".into(), "x".into()]]);
        assert_eq!(rendered, "A          LONG HEADER\nwide cell  x");
    }
}
