//! Free space of the data volume, and the floor below which produce is refused
//! (`--min-free-bytes`, Redpanda's `storage_min_free_bytes`).
//!
//! Why a floor: the broker's own metadata — the topic catalog, committed offsets, producer
//! snapshots, segment manifests, `assignment.json` — must always find room, or an operator
//! whose disk filled up could not even delete a topic to recover. Produce is the one writer
//! that fills a disk, so produce alone stops at the floor (KAFKA_STORAGE_ERROR, which clients
//! retry) and everything else keeps the space below it. Once space is freed (DeleteTopics,
//! DeleteRecords, retention, or the operator), produce resumes on its own.
//!
//! One [`DiskSpace`] is shared by every shard. It is refreshed by `statvfs` at most every
//! [`REFRESH`], by whichever thread asks first (a superblock read, no IO), and appends are
//! subtracted from it as they happen, so the produce path pays two atomic operations.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How stale the free-space figure may be.
pub const REFRESH: Duration = Duration::from_millis(100);

/// The default floor when `--min-free-bytes` is not given: 5% of the volume, at most 1 GiB
/// (a 64 MiB test volume keeps 3.2 MiB; a laptop's disk keeps 1 GiB).
pub fn default_min_free(total_bytes: u64) -> u64 {
    (total_bytes / 20).min(1 << 30)
}

/// The data volume's free space, broker-wide.
#[derive(Debug)]
pub struct DiskSpace {
    dir: PathBuf,
    min_free: u64,
    started: Instant,
    /// Milliseconds after `started` of the last refresh.
    refreshed_ms: AtomicU64,
    refreshing: AtomicBool,
    free: AtomicU64,
    total: AtomicU64,
    /// Produce requests (partitions) refused because free space was below the floor.
    pub refused: AtomicU64,
}

/// Free and total bytes of the filesystem holding `dir`, as an unprivileged writer sees them
/// (`f_bavail`: root's reserved blocks are not counted as free).
pub fn volume_space(dir: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("data directory path holds a NUL byte"))?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `st` a writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok((
        (st.f_bavail as u64).saturating_mul(unit),
        (st.f_blocks as u64).saturating_mul(unit),
    ))
}

impl DiskSpace {
    /// `min_free`: the floor in bytes, or None for [`default_min_free`] of the volume.
    pub fn new(dir: &Path, min_free: Option<u64>) -> std::io::Result<Arc<DiskSpace>> {
        let (free, total) = volume_space(dir)?;
        Ok(Arc::new(DiskSpace {
            dir: dir.to_path_buf(),
            min_free: min_free.unwrap_or_else(|| default_min_free(total)),
            started: Instant::now(),
            refreshed_ms: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
            free: AtomicU64::new(free),
            total: AtomicU64::new(total),
            refused: AtomicU64::new(0),
        }))
    }

    /// Re-reads the volume's free space if the figure is older than [`REFRESH`]. One caller
    /// refreshes; the others use the figure they find.
    fn refresh_if_stale(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        if now.saturating_sub(self.refreshed_ms.load(Ordering::Acquire))
            < REFRESH.as_millis() as u64
            || self.refreshing.swap(true, Ordering::AcqRel)
        {
            return;
        }
        // A failed statvfs keeps the last figure: the volume's writes will report the fault.
        if let Ok((free, total)) = volume_space(&self.dir) {
            self.free.store(free, Ordering::Release);
            self.total.store(total, Ordering::Release);
            // A ballast released on a full volume comes back once there is room above the
            // floor (a no-op while it is in place).
            if let Err(e) = kaas_storage::ballast::rearm_if_room(free.saturating_sub(self.min_free))
            {
                crate::ratelog::limited("ballast rearm failed", |suppressed| {
                    tracing::warn!(error = %e, suppressed, "could not restore the emergency ballast; retrying");
                });
            }
        }
        self.refreshed_ms.store(now, Ordering::Release);
        self.refreshing.store(false, Ordering::Release);
    }

    /// Counts `bytes` just appended against the free space until the next refresh measures
    /// it: at hundreds of MB/s a figure 100 ms old would let a small volume fill before the
    /// floor is seen.
    pub fn note_written(&self, bytes: u64) {
        let _ = self
            .free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| {
                Some(f.saturating_sub(bytes))
            });
    }

    /// Free bytes now (at most [`REFRESH`] old, less what was appended since).
    pub fn free(&self) -> u64 {
        self.refresh_if_stale();
        self.free.load(Ordering::Acquire)
    }

    pub fn total(&self) -> u64 {
        self.refresh_if_stale();
        self.total.load(Ordering::Acquire)
    }

    pub fn min_free(&self) -> u64 {
        self.min_free
    }

    /// Some(free bytes) when a produce must be refused: free space is below the floor.
    pub fn below_floor(&self) -> Option<u64> {
        let free = self.free();
        (free < self.min_free).then_some(free)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default free-space floor scales with small volumes and is capped on large ones.
    #[test]
    fn the_default_floor_is_five_percent_up_to_a_gibibyte() {
        assert_eq!(default_min_free(64 << 20), (64 << 20) / 20);
        assert_eq!(default_min_free(500 << 30), 1 << 30);
    }

    /// Writes are refused before the volume is full, and appends count before the next statvfs.
    #[test]
    fn reads_the_volume_and_refuses_below_the_floor() {
        let dir = std::env::temp_dir();
        let open = DiskSpace::new(&dir, Some(0)).unwrap();
        assert!(open.total() > 0 && open.free() <= open.total());
        assert_eq!(open.below_floor(), None);
        let full = DiskSpace::new(&dir, Some(u64::MAX)).unwrap();
        assert!(full.below_floor().is_some());
        // Appends count against the figure until the next statvfs.
        let free = open.free();
        let floor = DiskSpace::new(&dir, Some(free / 2)).unwrap();
        assert_eq!(floor.below_floor(), None);
        floor.note_written(free - free / 4);
        assert!(floor.below_floor().is_some());
    }
}
