//! Rereading configuration files when they change (TLS certificates, the auth file), without a
//! restart: a look at their modification times and lengths every [`CHECK_EVERY`].

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// How often a node looks for changed files.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

/// What a file looked like: its modification and change times, length and inode. The change
/// time moves on every write and rename, even when a copy keeps the modification time.
type Stamp = Option<(SystemTime, i64, u64, u64)>;

/// A set of files, and what they looked like at the last look.
#[derive(Debug)]
pub(crate) struct WatchedFiles {
    paths: Vec<PathBuf>,
    seen: Mutex<Vec<Stamp>>,
}

impl WatchedFiles {
    /// Watches `paths`, taking their present state as seen.
    pub(crate) fn new(paths: Vec<PathBuf>) -> Self {
        let seen = Mutex::new(stamps(&paths));
        Self { paths, seen }
    }

    /// Whether any file changed (or appeared, or went) since the last call.
    pub(crate) fn changed(&self) -> bool {
        let now = stamps(&self.paths);
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *seen == now {
            return false;
        }
        *seen = now;
        true
    }
}

/// Each file's stamp, or nothing for a file that cannot be read.
fn stamps(paths: &[PathBuf]) -> Vec<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    paths
        .iter()
        .map(|path| {
            let metadata = std::fs::metadata(path).ok()?;
            Some((
                metadata.modified().ok()?,
                metadata.ctime_nsec() + metadata.ctime() * 1_000_000_000,
                metadata.len(),
                metadata.ino(),
            ))
        })
        .collect()
}

/// Calls `reload` every [`CHECK_EVERY`] until `stop` says so.
pub(crate) async fn every_check(
    mut stop: tokio::sync::watch::Receiver<bool>,
    reload: impl Fn() -> bool,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(CHECK_EVERY) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        reload();
    }
}
