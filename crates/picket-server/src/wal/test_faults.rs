//! Storage faults for the fault harness (`picket chaos run`), switched on by environment
//! variables, and only in builds with the `mutations` feature, which only the picket crate's
//! dev-dependencies enable: a release build never has them.
//!
//! - `PICKET_TEST_SYNCED_MARK=1`: after every sync the flusher notes how far the log is durable
//!   in [`SYNCED_MARK_FILE`] beside the segments: the segment's file name and the end of its
//!   synced bytes, one fixed-width line rewritten in place. `kill -9` keeps the page cache, so
//!   it hides a write that was acknowledged before its sync; a power cut does not. After killing
//!   the node, the harness erases everything the mark does not cover (the bytes after it, and
//!   any newer segment), which is what a power cut would lose.
//! - `PICKET_TEST_FAIL_SYNC=PATH`: while a file exists at `PATH`, every sync fails with `EIO`
//!   after its batch's bytes were written, as a disk that fails to flush does. The log must
//!   stop for good without acknowledging the batch: after a failed `fsync` Linux may have
//!   dropped the dirty pages, so a later `fsync` that succeeds proves nothing (PostgreSQL's
//!   "fsyncgate"). The harness then erases what the synced mark does not cover.
//! - `PICKET_MUTATION=wal_acknowledges_before_sync`: a deliberate bug for the harness to catch:
//!   the flusher writes a batch and acknowledges it, and syncs at most once every
//!   [`ACKNOWLEDGED_SYNC_INTERVAL`] (Redis's `appendfsync everysec`).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The mark's file name, in the WAL's directory.
pub(super) const SYNCED_MARK_FILE: &str = "synced-mark.test";

/// How often the `wal_acknowledges_before_sync` mutation syncs.
const ACKNOWLEDGED_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// The storage faults one log runs with.
#[derive(Debug, Default)]
pub(super) struct TestFaults {
    /// Where the synced mark goes, when the harness asked for it.
    synced_mark: Option<File>,
    /// While a file exists here, syncs fail.
    fail_sync_while: Option<std::path::PathBuf>,
    /// The `wal_acknowledges_before_sync` mutation.
    pub(super) acknowledge_before_sync: bool,
    /// When that mutation last synced.
    last_sync: Mutex<Option<Instant>>,
}

impl TestFaults {
    /// The faults the environment asks for, for a log in `dir`.
    ///
    /// # Errors
    /// When the mark's file cannot be created.
    pub(super) fn from_env(dir: &Path) -> io::Result<Self> {
        #[cfg(feature = "mutations")]
        {
            let synced_mark = if std::env::var_os("PICKET_TEST_SYNCED_MARK").is_some() {
                tracing::warn!(
                    "noting the log's synced end for a power-loss test (PICKET_TEST_SYNCED_MARK)"
                );
                Some(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .truncate(false)
                        .write(true)
                        .open(dir.join(SYNCED_MARK_FILE))?,
                )
            } else {
                None
            };
            let fail_sync_while =
                std::env::var_os("PICKET_TEST_FAIL_SYNC").map(std::path::PathBuf::from);
            if let Some(path) = &fail_sync_while {
                tracing::warn!(
                    path = %path.display(),
                    "syncs fail while this file exists, for a storage fault test (PICKET_TEST_FAIL_SYNC)"
                );
            }
            let acknowledge_before_sync = crate::mutation::is_on("wal_acknowledges_before_sync");
            Ok(Self {
                synced_mark,
                fail_sync_while,
                acknowledge_before_sync,
                last_sync: Mutex::default(),
            })
        }
        #[cfg(not(feature = "mutations"))]
        {
            let _ = dir;
            Ok(Self::default())
        }
    }

    /// Faults whose syncs fail while a file exists at `path`, noting the synced end in `dir`
    /// (for unit tests).
    #[cfg(test)]
    pub(super) fn failing_syncs_while(dir: &Path, path: std::path::PathBuf) -> io::Result<Self> {
        let mark = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(SYNCED_MARK_FILE))?;
        Ok(Self { synced_mark: Some(mark), fail_sync_while: Some(path), ..Self::default() })
    }

    /// For the `wal_acknowledges_before_sync` mutation: whether a second has passed since its
    /// last sync (which this one then is).
    pub(super) fn sync_is_due(&self) -> bool {
        let mut last = self.last_sync.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let due = last.is_none_or(|at| at.elapsed() >= ACKNOWLEDGED_SYNC_INTERVAL);
        if due {
            *last = Some(Instant::now());
        }
        due
    }

    /// Called before each sync: fails it, as a disk that cannot flush would, while the file
    /// `PICKET_TEST_FAIL_SYNC` names exists.
    ///
    /// # Errors
    /// `EIO` while that file exists.
    pub(super) fn before_sync(&self) -> io::Result<()> {
        match &self.fail_sync_while {
            Some(path) if path.exists() => {
                const EIO: i32 = 5;
                Err(io::Error::from_raw_os_error(EIO))
            }
            _ => Ok(()),
        }
    }

    /// Notes that `segment` is durable up to byte `end`.
    ///
    /// # Errors
    /// When the mark cannot be written.
    pub(super) fn note_synced(&self, segment: &Path, end: u64) -> io::Result<()> {
        let Some(mark) = &self.synced_mark else { return Ok(()) };
        let name = segment.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        // One write of a fixed-width line: a process killed between two marks leaves one whole.
        mark.write_all_at(format_mark(name, end).as_bytes(), 0)
    }
}

/// The mark's line: the segment's file name (20 characters) and the synced end (16 hex digits).
pub(super) fn format_mark(segment_name: &str, end: u64) -> String {
    format!("{segment_name:>20} {end:016x}\n")
}

/// Reads a mark's line back: the segment's file name and the synced end.
fn parse_mark(line: &str) -> Option<(String, u64)> {
    let (name, end) = line.trim_end().rsplit_once(' ')?;
    Some((name.trim().to_owned(), u64::from_str_radix(end, 16).ok()?))
}

/// Erases from the log in `dir` what a power cut would have lost: of the bytes written after
/// the synced mark, all but the first `keep_permille` thousandths (zeroed, as the preallocated
/// space reads: a cut inside a frame leaves it torn), and every segment newer than the marked
/// one (its name was never synced either). A disk may have written any prefix of what was not
/// synced when the power went, so 0 loses all of it (what `kill -9` hides), 1000 keeps all of
/// it, and anything between tears the tail. Run on a log whose process was killed. Returns how
/// many bytes were erased, or `None` without a mark (the node's build has no test storage
/// faults, or it never started), when nothing is erased.
///
/// # Errors
/// When the log cannot be read or written.
pub fn erase_unsynced(dir: &Path, keep_permille: u16) -> io::Result<Option<u64>> {
    let line = match std::fs::read_to_string(dir.join(SYNCED_MARK_FILE)) {
        Ok(line) => line,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let Some((marked, end)) = parse_mark(&line) else {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a bad mark: {line:?}")));
    };
    let mut erased = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Segment names are fixed-width hexadecimal, so they sort as their generations do.
        if name.ends_with(super::SEGMENT_SUFFIX) && name > marked {
            erased += entry.metadata()?.len();
            std::fs::remove_file(entry.path())?;
        }
    }
    let path = dir.join(&marked);
    let written_end = written_end(&path, end)?;
    let unsynced = written_end.saturating_sub(end);
    let kept = unsynced.saturating_mul(u64::from(keep_permille.min(1000))) / 1000;
    erased += zero_between(&path, end + kept, written_end)?;
    Ok(Some(erased))
}

/// The end of the written (non-zero) bytes of `path`, looking from `from` on.
fn written_end(path: &Path, from: u64) -> io::Result<u64> {
    let file = std::fs::File::open(path)?;
    let length = file.metadata()?.len();
    let mut buffer = vec![0_u8; 1 << 20];
    let (mut offset, mut written_end) = (from, from);
    while offset < length {
        let chunk = usize::try_from((length - offset).min(buffer.len() as u64)).unwrap_or(0);
        file.read_exact_at(&mut buffer[..chunk], offset)?;
        // Records are JSON behind a length and a checksum, never a megabyte of zeros: the first
        // all-zero chunk is past everything written.
        let Some(last) = buffer[..chunk].iter().rposition(|byte| *byte != 0) else { break };
        written_end = offset + last as u64 + 1;
        offset += chunk as u64;
    }
    Ok(written_end)
}

/// Zeroes the bytes of `path` from `start` to `end`; returns how many it zeroed.
fn zero_between(path: &Path, start: u64, end: u64) -> io::Result<u64> {
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    let zeros = vec![0_u8; 1 << 20];
    let mut offset = start;
    while offset < end {
        let chunk = usize::try_from((end - offset).min(zeros.len() as u64)).unwrap_or(0);
        file.write_all_at(&zeros[..chunk], offset)?;
        offset += chunk as u64;
    }
    file.sync_data()?;
    Ok(end.saturating_sub(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_reads_back_as_written_and_keeps_its_width() {
        let line = format_mark("0000000000000003.wal", 0x1234);
        assert_eq!(parse_mark(&line), Some(("0000000000000003.wal".to_owned(), 0x1234)));
        assert_eq!(line.len(), format_mark("0000000000000004.wal", u64::MAX).len());
        assert_eq!(parse_mark("nonsense"), None);
    }
}
