//! The emergency ballast: space reserved on the data volume, in a file, and given up the moment
//! a metadata write finds the volume full (the idea of CockroachDB's emergency ballast).
//!
//! The free-space floor (`--min-free-bytes`) keeps produce from filling the volume, but another
//! process sharing the disk can still fill it to the last byte. Then the writes that let an
//! operator recover — the catalog change of a DeleteTopics, a manifest, a committed offset —
//! would fail for want of a few kilobytes. [`write_atomically`](crate::write_atomically)
//! therefore releases the ballast on `ENOSPC` and tries once more; the ballast is re-armed once
//! the volume has room again ([`rearm_if_room`]).
//!
//! One ballast per process (a broker has one data volume), in a global: the metadata writers
//! are free functions all over the code, and threading a handle to each would buy nothing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

struct Ballast {
    path: PathBuf,
    bytes: u64,
    /// Whether the file currently holds its space.
    armed: bool,
}

static BALLAST: Mutex<Option<Ballast>> = Mutex::new(None);

/// The ballast's size for a volume of `volume_bytes`: 1% of it, between 64 KiB and 8 MiB (a
/// catalog of tens of thousands of partitions is a few MiB).
pub fn size_for(volume_bytes: u64) -> u64 {
    (volume_bytes / 100).clamp(64 << 10, 8 << 20)
}

/// Keeps a ballast of `bytes` at `path`. An existing one is kept as it is; a missing one is
/// written only when `free_bytes` leaves room for it twice over (start-up on a full disk must
/// not fail, nor take the last bytes).
pub fn install(path: &Path, bytes: u64, free_bytes: u64) -> std::io::Result<()> {
    let armed = std::fs::metadata(path).is_ok_and(|m| m.len() >= bytes);
    *BALLAST.lock().unwrap_or_else(|p| p.into_inner()) = Some(Ballast {
        path: path.to_path_buf(),
        bytes,
        armed,
    });
    if !armed {
        rearm_if_room(free_bytes)?;
    }
    Ok(())
}

/// Gives the ballast's space back to the volume. Returns whether any was freed.
pub fn release() -> bool {
    let mut b = BALLAST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(b) = b.as_mut() else {
        return false;
    };
    if !b.armed {
        return false;
    }
    b.armed = false;
    match std::fs::remove_file(&b.path) {
        Ok(()) => {
            tracing::error!(path = %b.path.display(), bytes = b.bytes,
                "the data volume is full: released the emergency ballast so that metadata \
                 writes can finish; free space on the volume (delete topics or records, lower \
                 retention, or grow it), and the ballast is restored once there is room");
            true
        }
        Err(e) => {
            tracing::error!(path = %b.path.display(), error = %e, "could not release the emergency ballast");
            false
        }
    }
}

/// Writes the ballast again if it was released and `free_bytes` leaves room for it twice.
pub fn rearm_if_room(free_bytes: u64) -> std::io::Result<()> {
    let mut guard = BALLAST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(b) = guard.as_mut() else {
        return Ok(());
    };
    if b.armed || free_bytes < b.bytes.saturating_mul(2) {
        return Ok(());
    }
    let tmp = b.path.with_extension("tmp");
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        let zeros = vec![0u8; 64 << 10];
        let mut left = b.bytes;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            f.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, &b.path)
    })();
    match written {
        Ok(()) => {
            b.armed = true;
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Whether the ballast holds its space now (for `/healthz`).
pub fn armed() -> bool {
    BALLAST
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|b| b.armed)
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the ballast is process-global.
    #[test]
    fn installs_releases_and_rearms() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ballast");
        install(&path, 128 << 10, 0).unwrap();
        assert!(
            !armed() && !path.exists(),
            "no room: nothing written at install"
        );
        rearm_if_room(1 << 30).unwrap();
        assert!(armed());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 128 << 10);
        assert!(release());
        assert!(!path.exists() && !release());
        rearm_if_room(100 << 10).unwrap();
        assert!(!armed(), "re-armed only with room for it twice");
        rearm_if_room(1 << 30).unwrap();
        assert!(armed());
        assert_eq!(size_for(64 << 20), (64 << 20) / 100);
        assert_eq!(size_for(1 << 40), 8 << 20);
    }
}
