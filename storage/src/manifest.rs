//! A partition's manifest: the facts that cannot be derived from the segments.
//!
//! Written tmp + fsync + rename + directory fsync, so a crash leaves either the old or the new
//! manifest, never a torn one. The leader epoch in it never goes down: [`Manifest::store`] is
//! only called with an epoch at least the stored one (checked by the caller, `PartitionLog`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::StorageError;

pub const MANIFEST_FILE: &str = "manifest.json";

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    /// Stored as `epoch` since segments have Kafka-style names (`segment`). Versions before
    /// that require `leader_epoch`, so they refuse a partition this version has opened (a
    /// corrupt-manifest error) instead of overlooking its renamed segments and writing over
    /// their offsets. Read under either name.
    #[serde(rename = "epoch", alias = "leader_epoch")]
    pub leader_epoch: i32,
    pub log_start_offset: i64,
}

fn path(dir: &Path) -> PathBuf {
    dir.join(MANIFEST_FILE)
}

impl Manifest {
    pub fn load(dir: &Path) -> Result<Option<Manifest>, StorageError> {
        let p = path(dir);
        match std::fs::read(&p) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| StorageError::Corrupt {
                        path: p,
                        position: 0,
                        detail: e.to_string(),
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::io("reading", &p, e)),
        }
    }

    /// Replaces the manifest so that other processes see it at once (tmp + rename), without
    /// waiting for the disk. A take-over claims its raised leader epoch this way before it
    /// serves, so that a broker taking the partition over next picks a higher epoch even if no
    /// write happened in between; durability is not needed for that (a power cut stops the
    /// claimant as well), and the first write under the epoch stores the manifest durably.
    pub fn store_visible(&self, dir: &Path) -> Result<(), StorageError> {
        replace_visible(
            &path(dir),
            &serde_json::to_vec_pretty(self).expect("manifest serializes"),
        )
    }

    /// Durably replaces the manifest. Blocking: a manifest is small and written only on open,
    /// takeover, DeleteRecords and close, never per append.
    pub fn store(&self, dir: &Path) -> Result<(), StorageError> {
        write_atomically(
            &path(dir),
            &serde_json::to_vec_pretty(self).expect("manifest serializes"),
        )
    }
}

/// A temporary name beside `target`, unique per write: in cluster mode two brokers (a deposed
/// leader and its successor) may be replacing the same file at once, and the process id does
/// not tell them apart (each is process 1 of its container; `kaas_durable::unique_suffix`).
fn tmp_path(target: &Path) -> PathBuf {
    target.with_extension(format!("tmp.{}", kaas_durable::unique_suffix()))
}

/// tmp + rename, no fsync: other processes see the file wholly old or wholly new at once; after
/// a crash it may be either, or missing. For files that only save work or claim an epoch.
pub fn replace_visible(target: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let tmp = tmp_path(target);
    std::fs::write(&tmp, bytes).map_err(|e| StorageError::io("writing", &tmp, e))?;
    std::fs::rename(&tmp, target).map_err(|e| StorageError::io("renaming into", target, e))
}

/// tmp + fsync + rename + fsync(dir): the file is either wholly old or wholly new after a crash.
/// On a full volume the emergency ballast is released and the write tried once more (see
/// [`crate::ballast`]); a failed attempt leaves no temporary file behind.
pub fn write_atomically(target: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let tmp = tmp_path(target);
    match kaas_durable::replace_file(target, &tmp, bytes) {
        Err(f)
            if f.error.kind() == std::io::ErrorKind::StorageFull && crate::ballast::release() =>
        {
            kaas_durable::replace_file(target, &tmp, bytes)
                .map_err(|f| StorageError::io(f.op, &f.path, f.error))
        }
        r => r.map_err(|f| StorageError::io(f.op, &f.path, f.error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves: brokers replacing one file at once (a deposed leader and its successor, each
    // process 1 of its container — threads of one process here) all succeed and leave one
    // writer's whole contents, never a mix. With the temporary name taken from the process
    // id they wrote into one temporary file and renamed it from under each other.
    #[test]
    fn concurrent_replacements_leave_one_whole_file() {
        const WRITERS: usize = 4;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("leader.json");
        let contents: Vec<Vec<u8>> = (0..WRITERS)
            .map(|w| vec![b'a' + w as u8; 64 << 10])
            .collect();
        for round in 0..50 {
            let start = std::sync::Arc::new(std::sync::Barrier::new(WRITERS));
            let threads: Vec<_> = contents
                .iter()
                .cloned()
                .enumerate()
                .map(|(w, bytes)| {
                    let (target, start) = (target.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        if w % 2 == 0 {
                            write_atomically(&target, &bytes)
                        } else {
                            replace_visible(&target, &bytes)
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("round {round}: {e}"));
            }
            let got = std::fs::read(&target).unwrap();
            assert!(
                contents.contains(&got),
                "round {round}: the file mixes writers"
            );
        }
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "temporary files left behind");
    }
}
