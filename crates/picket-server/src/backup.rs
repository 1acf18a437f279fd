//! Backups: a consistent copy of the lock state taken from a running cluster, and restoring it
//! into a new cluster whose tokens start above anything the old cluster could have issued.
//!
//! # The restore epoch
//!
//! A backup is a moment in the old cluster's life; the old cluster may have gone on granting
//! after it, with tokens the backup never saw, and fences may have admitted them. A restored
//! cluster that went on counting from the backup's revision would issue those very tokens
//! again: a fence would refuse the new holder's writes, or worse, take a grant of the new
//! cluster for one of the old. So revisions (every token and session id is one) carry a
//! *restore epoch* in their top 16 bits ([`picket_core::StateMachine::restore_epoch`]), and a
//! restore starts the next epoch: the restored state's first revision is `(epoch + 1) << 48`,
//! above every revision the old cluster could reach within its epoch (2^48 commands, 89 years
//! at 100,000 a second). Restoring the same backup twice starts the same epoch twice, so
//! restore a backup once, into one cluster, and take the next backup from that cluster.
//!
//! # The file
//!
//! `PICKETBK` | format version (u32 LE) | metadata length (u32 LE) | metadata (JSON) | the
//! state machine's snapshot | SHA-256 of everything before it. Any damage is refused whole.

use crate::raft_types::{LogId, Member, NodeId, StoredMembership};
use picket_core::{RESTORE_EPOCH_SHIFT, StateMachine};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

const MAGIC: &[u8; 8] = b"PICKETBK";
const FORMAT_VERSION: u32 = 1;
const DIGEST_BYTES: usize = 32;
/// Largest backup accepted: the largest state a node holds (every limit at its default) is far
/// below it.
pub const MAX_BACKUP_BYTES: u64 = 4 << 30;
/// Largest metadata block.
const MAX_META_BYTES: usize = 64 * 1024;
/// The file in a restored data directory that names the backup it was restored from.
const RESTORED_MARKER: &str = "restored.json";

/// What a backup says about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupMeta {
    /// The lock state's revision in the backup.
    pub revision: u64,
    /// The last log index the backup includes.
    pub log_index: u64,
    /// The node that took it.
    pub node_id: NodeId,
    /// When, in milliseconds since the Unix epoch, by that node's wall clock (for people only).
    pub taken_unix_ms: u64,
    /// Live sessions in it.
    pub sessions: usize,
    /// Locks held, awaited or delayed in it.
    pub locks: usize,
}

/// Why a backup could not be read or restored.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BackupError {
    /// The file is not a Picket backup, or it is damaged.
    #[error("{path} is not a usable Picket backup: {reason}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The data directory already holds a node's state.
    #[error(
        "refusing to restore into {path}: it already holds a Raft log or snapshot. Restore into an empty data directory, on every node of the new cluster"
    )]
    NotEmpty {
        /// The data directory.
        path: PathBuf,
    },
    /// The data directory was restored from another backup.
    #[error(
        "{path} was restored from another backup (SHA-256 {found}); start without --restore to run the node restored from that one (or with --restore of that backup, if its restore was cut short), or restore this backup into an empty directory"
    )]
    OtherBackup {
        /// The data directory.
        path: PathBuf,
        /// The digest of the backup it was restored from.
        found: String,
    },
    /// The data directory was restored from this backup, with options that would have made
    /// another state: a restart cannot change what the first restore wrote.
    #[error(
        "{path} was restored from this backup already, {detail}; start with the options of its first restore, or restore into an empty directory"
    )]
    OtherOptions {
        /// The data directory.
        path: PathBuf,
        /// What differs.
        detail: String,
    },
    /// The data directory holds a restore that was cut short, and the node was started
    /// without `--restore`: it would start empty, as a cluster of its own.
    #[error(
        "{path} holds a restore that was cut short (its restored.json, and no log yet): start again with the same --restore to finish it, or empty the directory"
    )]
    CutShort {
        /// The data directory.
        path: PathBuf,
    },
    /// No restore epoch is left to start above the backup (and `--restore-above`).
    #[error(
        "cannot restore: it would start restore epoch {epoch}, past the last one ({last}); {why}"
    )]
    NoEpochLeft {
        /// The epoch it would start.
        epoch: u64,
        /// The last epoch there is.
        last: u64,
        /// Why, and what to do.
        why: String,
    },
    /// Reading or writing failed.
    #[error("cannot restore: {0}")]
    Io(#[from] io::Error),
}

/// A backup read and checked, ready to restore.
#[derive(Debug)]
pub struct Backup {
    /// Its metadata.
    pub meta: BackupMeta,
    /// The lock state.
    pub machine: StateMachine,
    /// The SHA-256 of the whole file, in hex: a restored data directory remembers it.
    pub digest: String,
}

/// Encodes a backup of `machine`, described by `meta`.
#[must_use]
pub fn encode(meta: &BackupMeta, machine: &[u8]) -> Vec<u8> {
    let meta = serde_json::to_vec(meta).expect("backup metadata serializes");
    let mut bytes = Vec::with_capacity(16 + meta.len() + machine.len() + DIGEST_BYTES);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&u32::try_from(meta.len()).expect("metadata is small").to_le_bytes());
    bytes.extend_from_slice(&meta);
    bytes.extend_from_slice(machine);
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    bytes.extend_from_slice(digest.as_ref());
    bytes
}

/// Reads and checks the backup at `path`.
///
/// # Errors
/// [`BackupError::Damaged`] for anything but an intact backup of this format.
pub fn read(path: &Path) -> Result<Backup, BackupError> {
    let damaged = |reason: String| BackupError::Damaged { path: path.to_owned(), reason };
    let size = std::fs::metadata(path)?.len();
    if size > MAX_BACKUP_BYTES {
        return Err(damaged(format!(
            "{size} bytes is larger than any backup ({MAX_BACKUP_BYTES})"
        )));
    }
    decode(&std::fs::read(path)?).map_err(damaged)
}

fn decode(bytes: &[u8]) -> Result<Backup, String> {
    let (body, digest) = bytes
        .split_at_checked(bytes.len().checked_sub(DIGEST_BYTES).ok_or("it is too short")?)
        .ok_or("it is too short")?;
    let computed = ring::digest::digest(&ring::digest::SHA256, body);
    if computed.as_ref() != digest {
        return Err("its checksum does not match: the file is damaged or incomplete".into());
    }
    let rest = body.strip_prefix(MAGIC).ok_or("it does not start with PICKETBK")?;
    let (version, rest) = rest.split_at_checked(4).ok_or("it is too short")?;
    let version = u32::from_le_bytes(version.try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version} is not {FORMAT_VERSION}; use the Picket that wrote it"
        ));
    }
    let (length, rest) = rest.split_at_checked(4).ok_or("it is too short")?;
    let length = u32::from_le_bytes(length.try_into().expect("4 bytes")) as usize;
    if length > MAX_META_BYTES {
        return Err("its metadata is too large".into());
    }
    let (meta, machine) = rest.split_at_checked(length).ok_or("it is truncated")?;
    let meta: BackupMeta =
        serde_json::from_slice(meta).map_err(|error| format!("bad metadata: {error}"))?;
    let machine = StateMachine::restore(machine).map_err(|error| error.to_string())?;
    if machine.revision() != meta.revision {
        return Err("its metadata does not match its state".into());
    }
    Ok(Backup { meta, machine, digest: crate::auth::hex(computed.as_ref()) })
}

/// The node id in the restore position's leader id: no node may have it
/// ([`crate::server::start`] refuses it), so no log a node writes can sort equal to a restore.
pub const RESTORE_LEADER: NodeId = NodeId::MAX;

/// The log position a restored state sits at, the same on every node restored from the same
/// backup: term 0, index 0, leader [`RESTORE_LEADER`]. It sorts above the first entry of any
/// cluster formed without a restore (openraft's `initialize` writes term 0, index 0 under the
/// forming node's own id), so a peer started by mistake without `--restore` can win no vote
/// from a restored node, and is sent the restored state as a snapshot instead of serving an
/// empty one; and below every entry a leader writes (term 1 or later).
#[must_use]
pub fn restore_log_id() -> LogId {
    use openraft::vote::RaftLeaderIdExt;
    type LeaderId = <crate::raft_types::TypeConfig as openraft::RaftTypeConfig>::LeaderId;
    LogId::new(LeaderId::new_committed(0, RESTORE_LEADER), 0)
}

/// How to restore.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreOptions {
    /// Keep the backup's sessions, grants and waits. Off by default: a client of the old cluster
    /// may have released or lost a grant after the backup, and a restored grant it does not
    /// know of would be a ghost holder. Off, every lock starts free.
    pub keep_sessions: bool,
    /// Start above this token too: the highest token any fence has admitted, when the backup
    /// was restored before and that cluster went on granting (or when in doubt).
    pub above_token: Option<u64>,
}

/// The membership a restored cluster starts with: `peers`, all voters.
#[must_use]
pub fn restored_membership(peers: &BTreeMap<NodeId, Member>) -> StoredMembership {
    let voters: BTreeSet<NodeId> = peers.keys().copied().collect();
    let membership = openraft::Membership::new(vec![voters], peers.clone())
        .expect("a non-empty peer list is a valid membership");
    StoredMembership::new(Some(restore_log_id()), membership)
}

#[derive(Serialize, Deserialize)]
struct Marker {
    digest: String,
    backup_revision: u64,
    first_revision: u64,
    /// Whether the backup's sessions were kept (absent in markers written before it was
    /// recorded).
    #[serde(default)]
    keep_sessions: Option<bool>,
}

impl Marker {
    /// See [`restore_identity`].
    fn identity(&self) -> String {
        let digest = self.digest.get(..16).unwrap_or(&self.digest);
        let epoch = self.first_revision >> RESTORE_EPOCH_SHIFT;
        let sessions = match self.keep_sessions {
            Some(true) => "keep",
            Some(false) => "end",
            None => "?",
        };
        format!("{digest}.e{epoch}.{sessions}")
    }
}

/// Refuses a start without `--restore` on a data directory whose restore was cut short (the
/// marker is written before the state; a node that has the marker and no log did not finish):
/// started anyway it held nothing, and formed a cluster of its own from epoch 0.
///
/// # Errors
/// [`BackupError::CutShort`].
pub fn check_not_cut_short(data_dir: &Path, has_log: bool) -> Result<(), BackupError> {
    if !has_log && data_dir.join(RESTORED_MARKER).exists() {
        return Err(BackupError::CutShort { path: data_dir.to_owned() });
    }
    Ok(())
}

/// What restore `data_dir` holds, if it was restored (`None` for a node that started empty,
/// or joined and was sent its state): the backup's digest (its first 16 hex digits), the
/// restore epoch, and whether the sessions were kept, as `DIGEST.eEPOCH.keep|end` (`?` for a
/// part not recorded). Nodes restored alike hold the same state at the same log position; a
/// peer restored otherwise must not replicate to them (see [`same_restore`]).
///
/// # Errors
/// The marker cannot be read.
pub fn restore_identity(data_dir: &Path) -> io::Result<Option<String>> {
    match std::fs::read(data_dir.join(RESTORED_MARKER)) {
        Ok(bytes) => {
            let marker: Marker = serde_json::from_slice(&bytes)
                .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
            Ok(Some(marker.identity()))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Whether nodes restored as `ours` and `theirs` ([`restore_identity`]) restored alike: the same
/// backup, epoch and sessions, a part one of them did not record matching any. Raft cannot
/// tell them apart (every restore sits at the same log position), and nodes restored from
/// different backups, or with different `--restore-above` or `--restore-sessions`, would go
/// on from different states: their tokens could go down across a failover.
#[must_use]
pub fn same_restore(ours: &str, theirs: &str) -> bool {
    let (mut ours, mut theirs) = (ours.split('.'), theirs.split('.'));
    loop {
        match (ours.next(), theirs.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == b || a == "?" || b == "?" => {}
            _ => return false,
        }
    }
}

/// What a node must do with `--restore` on its data directory.
#[derive(Debug)]
pub enum RestorePlan {
    /// Write the restored state: the snapshot, then the log's start.
    Write(Box<StateMachine>),
    /// The directory was restored from this very backup already (a restart with the same
    /// flags): start as usual.
    AlreadyDone,
}

/// Decides how to restore `backup` into `data_dir`, and records the intent (a marker naming the
/// backup, synced) before anything is written, so a restore that a crash interrupted is redone
/// on the next start, and a restart with the same `--restore` keeps what the node did since.
///
/// # Errors
/// [`BackupError::NotEmpty`], [`BackupError::OtherBackup`], I/O errors, and a backup whose
/// epoch cannot grow.
pub fn plan(
    data_dir: &Path,
    backup: Backup,
    options: &RestoreOptions,
    has_log: bool,
) -> Result<RestorePlan, BackupError> {
    let marker_path = data_dir.join(RESTORED_MARKER);
    match std::fs::read(&marker_path) {
        Ok(bytes) => {
            let marker: Marker = serde_json::from_slice(&bytes)
                .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
            if marker.digest != backup.digest {
                return Err(BackupError::OtherBackup {
                    path: data_dir.to_owned(),
                    found: marker.digest,
                });
            }
            if has_log {
                check_same_options(data_dir, &marker, &backup, options)?;
                return Ok(RestorePlan::AlreadyDone);
            }
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            if has_log || data_dir.join(crate::state_machine::SNAPSHOT_FILE).exists() {
                return Err(BackupError::NotEmpty { path: data_dir.to_owned() });
            }
        }
        Err(error) => return Err(error.into()),
    }
    let backup_revision = backup.machine.revision();
    let epoch = restore_epoch(&backup, options);
    let last = u64::MAX >> RESTORE_EPOCH_SHIFT;
    let machine =
        if options.keep_sessions { backup.machine } else { backup.machine.without_sessions() };
    let machine = machine.into_epoch(epoch).ok_or_else(|| BackupError::NoEpochLeft {
        epoch,
        last,
        why: match options.above_token {
            Some(token) if epoch > last && (token >> RESTORE_EPOCH_SHIFT) + 1 == epoch => {
                format!(
                    "--restore-above {token} is above every token a restore can start over: \
                     give the highest token a fence has admitted"
                )
            }
            _ => "the backup's cluster was restored that many times: no restore of it can \
                  issue tokens above its own"
                .to_owned(),
        },
    })?;
    let marker = Marker {
        digest: backup.digest,
        backup_revision,
        first_revision: machine.revision() + 1,
        keep_sessions: Some(options.keep_sessions),
    };
    write_synced(&marker_path, &serde_json::to_vec(&marker).expect("serializes"))?;
    Ok(RestorePlan::Write(Box::new(machine)))
}

/// The restore epoch a restore of `backup` with `options` starts: the one after the backup's,
/// or after `--restore-above`'s, whichever is higher.
fn restore_epoch(backup: &Backup, options: &RestoreOptions) -> u64 {
    let above = options.above_token.map_or(0, |token| (token >> RESTORE_EPOCH_SHIFT) + 1);
    (backup.machine.restore_epoch() + 1).max(above)
}

/// Refuses a restart with `--restore` options that would have restored another state than
/// the first restore wrote: a higher `--restore-above` (the operator learned of higher tokens
/// and believes the node now starts above them) or another `--restore-sessions`. Starting as
/// if nothing differed left tokens below what the operator asked for.
fn check_same_options(
    data_dir: &Path,
    marker: &Marker,
    backup: &Backup,
    options: &RestoreOptions,
) -> Result<(), BackupError> {
    let restored_epoch = marker.first_revision >> RESTORE_EPOCH_SHIFT;
    let asked_epoch = restore_epoch(backup, options);
    if asked_epoch > restored_epoch {
        return Err(BackupError::OtherOptions {
            path: data_dir.to_owned(),
            detail: format!(
                "in restore epoch {restored_epoch}, and --restore-above now asks for epoch \
                 {asked_epoch}: its tokens would not start above the token given"
            ),
        });
    }
    if let Some(kept) = marker.keep_sessions
        && kept != options.keep_sessions
    {
        let (then, now) = if kept { ("keep", "end") } else { ("end", "keep") };
        return Err(BackupError::OtherOptions {
            path: data_dir.to_owned(),
            detail: format!("with --restore-sessions {then}, not {now}"),
        });
    }
    Ok(())
}

/// Writes `bytes` to `path` so that a crash or power cut at any moment leaves either the old
/// file or the whole new one: a temporary file, synced, renamed over, and the directory synced.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temporary = path.with_extension("tmp");
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(path.parent().expect("a file in a directory"))?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use picket_core::{Command, Input, Limits};

    fn machine_with_sessions(count: usize) -> StateMachine {
        let mut machine = StateMachine::new(Limits::default());
        for _ in 0..count {
            let command = Command::OpenSession { ttl_ms: 10_000, lock_delay_ms: 0, owner: None };
            assert!(machine.apply(&Input::new(1, command)).result.is_ok());
        }
        machine
    }

    fn keep() -> RestoreOptions {
        RestoreOptions { keep_sessions: true, above_token: None }
    }

    #[test]
    fn by_default_a_restore_ends_every_session_and_may_start_above_a_given_token() {
        let dir = tempfile::tempdir().expect("a directory");
        let machine = machine_with_sessions(2);
        let bytes = encode(&meta(&machine), &machine.snapshot());
        let options = RestoreOptions { keep_sessions: false, above_token: Some((3 << 48) + 5) };
        let RestorePlan::Write(restored) =
            plan(dir.path(), decode(&bytes).expect("decodes"), &options, false).expect("plans")
        else {
            panic!("a fresh directory is restored");
        };
        assert_eq!(restored.session_count(), 0);
        assert_eq!(restored.restore_epoch(), 4, "above the given token's epoch");
        assert_eq!(restored.revision(), 4 << 48);
    }

    fn meta(machine: &StateMachine) -> BackupMeta {
        BackupMeta {
            revision: machine.revision(),
            log_index: 7,
            node_id: 1,
            taken_unix_ms: 0,
            sessions: machine.session_count(),
            locks: machine.lock_count(),
        }
    }

    #[test]
    fn a_backup_round_trips_and_any_damage_is_refused() {
        let machine = machine_with_sessions(3);
        let bytes = encode(&meta(&machine), &machine.snapshot());
        let backup = decode(&bytes).expect("decodes");
        assert_eq!(backup.meta, meta(&machine));
        assert_eq!(backup.machine.snapshot(), machine.snapshot());
        for at in [0, 9, 20, bytes.len() / 2, bytes.len() - 1] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            assert!(decode(&damaged).is_err(), "a flipped bit at {at} is refused");
        }
        assert!(decode(&bytes[..bytes.len() - 1]).is_err(), "a truncated backup is refused");
        assert!(decode(&[]).is_err());
    }

    #[test]
    fn a_restore_starts_the_next_epoch_once_and_a_restart_keeps_it() {
        let dir = tempfile::tempdir().expect("a directory");
        let machine = machine_with_sessions(2);
        let bytes = encode(&meta(&machine), &machine.snapshot());
        let RestorePlan::Write(restored) =
            plan(dir.path(), decode(&bytes).expect("decodes"), &keep(), false).expect("plans")
        else {
            panic!("a fresh directory is restored");
        };
        assert_eq!(restored.restore_epoch(), 1);
        assert_eq!(restored.revision(), 1 << 48);
        assert_eq!(restored.session_count(), 2);
        // Interrupted before the log was written: the same backup is restored again.
        let again =
            plan(dir.path(), decode(&bytes).expect("decodes"), &keep(), false).expect("plans");
        assert!(matches!(again, RestorePlan::Write(_)));
        // Once the node has a log, a restart with the same flag keeps it.
        let kept =
            plan(dir.path(), decode(&bytes).expect("decodes"), &keep(), true).expect("plans");
        assert!(matches!(kept, RestorePlan::AlreadyDone));
        let other = machine_with_sessions(3);
        let other = encode(&meta(&other), &other.snapshot());
        let refused = plan(dir.path(), decode(&other).expect("decodes"), &keep(), true);
        assert!(matches!(refused, Err(BackupError::OtherBackup { .. })), "{refused:?}");
    }

    /// Regression: a restart with the same backup and a higher `--restore-above`, or another
    /// `--restore-sessions`, started as if nothing differed, its tokens below the token the
    /// operator had just given.
    #[test]
    fn a_restart_refuses_options_that_would_have_restored_another_state() {
        let dir = tempfile::tempdir().expect("a directory");
        let machine = machine_with_sessions(2);
        let bytes = encode(&meta(&machine), &machine.snapshot());
        let restore = |options: &RestoreOptions, has_log| {
            plan(dir.path(), decode(&bytes).expect("decodes"), options, has_log)
        };
        let above = |token| RestoreOptions { keep_sessions: true, above_token: Some(token) };
        assert!(matches!(restore(&above(5 << 48), false), Ok(RestorePlan::Write(_))), "epoch 6");
        let higher = restore(&above(6 << 48), true);
        let Err(BackupError::OtherOptions { detail, .. }) = &higher else {
            panic!("a higher --restore-above is refused: {higher:?}");
        };
        assert!(detail.contains("epoch 6") && detail.contains("epoch 7"), "{detail}");
        for same_or_lower in [above(5 << 48), above(1), keep()] {
            let kept = restore(&same_or_lower, true);
            assert!(matches!(kept, Ok(RestorePlan::AlreadyDone)), "{same_or_lower:?}: {kept:?}");
        }
        let ended = RestoreOptions { keep_sessions: false, above_token: Some(5 << 48) };
        let refused = restore(&ended, true);
        assert!(matches!(refused, Err(BackupError::OtherOptions { .. })), "{refused:?}");
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("--restore-sessions keep, not end"), "{message}");
    }

    #[test]
    fn nodes_restored_alike_match_and_any_difference_parts_them() {
        let backup = |count| {
            let machine = machine_with_sessions(count);
            encode(&meta(&machine), &machine.snapshot())
        };
        let (one, other) = (backup(1), backup(2));
        let identity = |bytes: &[u8], options: &RestoreOptions| {
            let dir = tempfile::tempdir().expect("a directory");
            plan(dir.path(), decode(bytes).expect("decodes"), options, false).expect("plans");
            restore_identity(dir.path()).expect("reads").expect("restored")
        };
        let ended = RestoreOptions::default();
        let base = identity(&one, &ended);
        assert!(base.ends_with(".e1.end"), "{base}");
        assert!(same_restore(&base, &identity(&one, &ended)), "the same backup and options");
        let above = RestoreOptions { keep_sessions: false, above_token: Some(5 << 48) };
        for (differs, what) in [
            (identity(&other, &ended), "another backup"),
            (identity(&one, &above), "--restore-above"),
            (identity(&one, &keep()), "--restore-sessions"),
        ] {
            assert!(!same_restore(&base, &differs), "{what}: {base} and {differs}");
        }
        let unrecorded = base.replace(".end", ".?");
        assert!(same_restore(&base, &unrecorded) && same_restore(&unrecorded, &base));
        assert!(!same_restore(&base, &format!("{base}.more")));
        let empty = tempfile::tempdir().expect("a directory");
        assert_eq!(restore_identity(empty.path()).expect("reads"), None, "never restored");
    }

    #[test]
    fn a_restore_past_the_last_epoch_says_which_flag_to_change() {
        let dir = tempfile::tempdir().expect("a directory");
        let machine = machine_with_sessions(1);
        let bytes = encode(&meta(&machine), &machine.snapshot());
        let options = RestoreOptions { keep_sessions: false, above_token: Some(u64::MAX) };
        let refused = plan(dir.path(), decode(&bytes).expect("decodes"), &options, false);
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("epoch 65536, past the last one (65535)"), "{message}");
        assert!(message.contains("--restore-above 18446744073709551615"), "{message}");
    }

    #[test]
    fn a_restore_cut_short_is_not_started_without_its_backup() {
        let dir = tempfile::tempdir().expect("a directory");
        assert!(check_not_cut_short(dir.path(), false).is_ok(), "never restored");
        let machine = machine_with_sessions(1);
        let bytes = encode(&meta(&machine), &machine.snapshot());
        plan(dir.path(), decode(&bytes).expect("decodes"), &keep(), false).expect("plans");
        let refused = check_not_cut_short(dir.path(), false);
        assert!(matches!(refused, Err(BackupError::CutShort { .. })), "{refused:?}");
        assert!(check_not_cut_short(dir.path(), true).is_ok(), "a finished restore starts");
    }

    #[test]
    fn a_directory_with_a_log_and_no_marker_is_not_restored_into() {
        let dir = tempfile::tempdir().expect("a directory");
        let machine = machine_with_sessions(1);
        let bytes = encode(&meta(&machine), &machine.snapshot());
        let refused = plan(dir.path(), decode(&bytes).expect("decodes"), &keep(), true);
        assert!(matches!(refused, Err(BackupError::NotEmpty { .. })), "{refused:?}");
    }
}
