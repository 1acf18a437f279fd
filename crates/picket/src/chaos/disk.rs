//! Full disks for the harness: each node's data directory is a small tmpfs of its own, which
//! the nemesis fills with one file; the node must stop (never acknowledge a write it could not
//! make durable) and, once the file is gone and it is started again, recover from what it had
//! made durable.
//!
//! Needs root (`mount`). tmpfs ignores fsync, so this tests running out of space, not losing
//! unsynced writes.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The size of each node's data file system: room for a few WAL segments and snapshots.
const DISK_BYTES: u64 = 64 << 20;

/// The name of the file that fills a disk.
const FILLER: &str = "filler";

/// The source name of each run's mounts; the harness's process id follows, so that the mounts
/// of a run whose harness was killed can be found and removed.
const SOURCE_PREFIX: &str = "picket_chaos_";

/// The run's mounted data directories. Dropping it unmounts them.
#[derive(Debug)]
pub struct Disks {
    mounted: Vec<PathBuf>,
}

impl Disks {
    /// No disks yet; the mounts of earlier runs whose harness is gone are removed.
    pub fn new() -> Self {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        for line in mounts.lines() {
            let mut fields = line.split_whitespace();
            let (Some(source), Some(path)) = (fields.next(), fields.next()) else { continue };
            let Some(pid) = source.strip_prefix(SOURCE_PREFIX) else { continue };
            if Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            tracing::info!(path, "unmounting a data disk left by an earlier run");
            let _ = Command::new("umount").arg("-l").arg(path).status();
        }
        Self { mounted: Vec::new() }
    }

    /// Mounts a tmpfs of its own at `dir` (created).
    ///
    /// # Errors
    /// When `mount` fails (not root, say).
    pub fn mount(&mut self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={DISK_BYTES}")])
            .arg(format!("{SOURCE_PREFIX}{}", std::process::id()))
            .arg(dir)
            .output()
            .context("cannot run mount")?;
        if !output.status.success() {
            bail!(
                "cannot mount a tmpfs at {} (full-disk faults need root): {}",
                dir.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        self.mounted.push(dir.to_owned());
        Ok(())
    }

    /// Fills the file system at `dir` to the last byte; returns how many bytes that took.
    ///
    /// # Errors
    /// When the filler cannot be created.
    pub fn fill(dir: &Path) -> anyhow::Result<u64> {
        let stats = rustix::fs::statvfs(dir).context("cannot read the disk's free space")?;
        let free = stats.f_bavail.saturating_mul(stats.f_frsize);
        let path = dir.join(FILLER);
        let file = std::fs::File::create(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        // What fallocate cannot take (another writer raced it) is taken by writing.
        if rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, free).is_err() {
            use std::io::Write;
            let block = vec![0_u8; 1 << 16];
            let mut writer = &file;
            while writer.write_all(&block).is_ok() {}
        }
        Ok(std::fs::metadata(&path).map(|metadata| metadata.len()).unwrap_or(0))
    }

    /// Removes the filler from the file system at `dir`.
    ///
    /// # Errors
    /// When it cannot be removed.
    pub fn free(dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(FILLER);
        std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        for dir in self.mounted.drain(..) {
            // Lazily: a process that outlived the run must not keep the mount.
            let unmounted = Command::new("umount").arg("-l").arg(&dir).status();
            if !unmounted.is_ok_and(|status| status.success()) {
                tracing::warn!(dir = %dir.display(), "cannot unmount a node's data disk");
            }
        }
    }
}
