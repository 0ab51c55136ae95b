//! One segment file: `<base offset, 20 digits>.<leader epoch, 10 digits>.log`, holding record
//! batches back to back exactly as they go over the wire, so a Fetch can send file bytes as
//! they are.
//!
//! The name starts as Kafka's does (`<20-digit base offset>.log`), so Kafka's own tools read a
//! kaas segment (`kafka-dump-log` takes the base offset from the name up to the first dot). The
//! leader epoch stays in the name because two leaders of a shared volume may each have written
//! a segment at the same base offset, and recovery tells them apart by it (`divergence`).
//! Versions before this one wrote `<base>-<epoch>.log`; they are still read, and renamed when
//! the partition is next opened (`migrate_legacy_names`).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Weak;

use bytes::Bytes;
use std::rc::Rc;
use std::time::Instant;

use glommio::io::{BufferedFile, OpenOptions};
use kaas_wire::batch;

use crate::index::{BatchEntry, BatchIndex};
use crate::producer::ProducerStateTable;
use crate::resident;
use crate::StorageError;

/// How much of a segment recovery reads per IO.
const SCAN_CHUNK_BYTES: usize = 4 * 1024 * 1024;

pub fn segment_file_name(base_offset: i64, epoch: i32) -> String {
    format!("{base_offset:020}.{epoch:010}.log")
}

/// Parses a segment file name, in today's form or the legacy `<base>-<epoch>.log`, into (base
/// offset, leader epoch).
pub fn parse_segment_file_name(name: &str) -> Option<(i64, i32)> {
    let stem = name.strip_suffix(".log")?;
    let (base, epoch) = stem.split_once('.').or_else(|| stem.split_once('-'))?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(base) || !all_digits(epoch) {
        return None;
    }
    Some((base.parse().ok()?, epoch.parse().ok()?))
}

/// Whether `name` is a segment under the name versions before Kafka-style names wrote.
pub fn is_legacy_segment_name(name: &str) -> bool {
    parse_segment_file_name(name).is_some() && name.as_bytes().get(20) == Some(&b'-')
}

/// Renames the legacy-named segments of a partition directory (and their saved indexes) to
/// today's names, index first: a crash between the two renames leaves a legacy-named segment
/// whose index already has its new name, which the next open finishes. Returns how many
/// segments were renamed; the caller makes the renames durable (one directory fsync).
/// Blocking (directory operations).
pub fn migrate_legacy_names(dir: &Path) -> Result<usize, StorageError> {
    let mut renamed = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| StorageError::io("listing", dir, e))? {
        let entry = entry.map_err(|e| StorageError::io("listing", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_legacy_segment_name(name) {
            continue;
        }
        let (base, epoch) = parse_segment_file_name(name).expect("checked above");
        let old = entry.path();
        let new = dir.join(segment_file_name(base, epoch));
        let (old_index, new_index) = (
            crate::index::file::path_for(&old),
            crate::index::file::path_for(&new),
        );
        match std::fs::rename(&old_index, &new_index) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StorageError::io("renaming index", &old_index, e)),
        }
        match std::fs::rename(&old, &new) {
            Ok(()) => renamed += 1,
            // Renamed meanwhile by another broker of the shared volume opening it too.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StorageError::io("renaming segment", &old, e)),
        }
    }
    Ok(renamed)
}

pub struct Segment {
    pub base_offset: i64,
    pub epoch: i32,
    /// Shared, not copied: every append names it for its errors.
    pub path: Rc<Path>,
    /// Private: replacing it must revoke `sendable` first ([`Segment::replace_file`]).
    file: Rc<BufferedFile>,
    /// Bytes of whole, verified batches; the next append goes here.
    pub size: u64,
    pub index: BatchIndex,
    /// When this segment was created or opened, for `segment.ms` rolls.
    pub opened_at: Instant,
    /// The file memory-mapped (the whole file once sealed, made on the first read then), and
    /// the handle reads report the ranges they touch with (`resident`).
    pub map: std::cell::RefCell<Option<(Bytes, Weak<memmap2::Mmap>)>>,
    /// The file's length: data plus zeros written ahead of it (see `PartitionLog::preallocate`).
    pub allocated: std::cell::Cell<u64>,
    /// `file`'s descriptor as the connections' `sendfile` of mapped slices may use it; revoked
    /// before `file` can be closed ([`Segment::replace_file`], drop).
    sendable: resident::SendableFd,
}

impl Drop for Segment {
    fn drop(&mut self) {
        // `file` may be closed from here on (this was the last handle, or the log's tasks drop
        // theirs soon): no `sendfile` from it may start after this.
        resident::revoke(&self.sendable, Box::new(self.file.clone()));
    }
}

impl Segment {
    pub async fn create(
        dir: &Path,
        base_offset: i64,
        epoch: i32,
        index_interval_bytes: u64,
        sync_name: bool,
    ) -> Result<Segment, StorageError> {
        let path = dir.join(segment_file_name(base_offset, epoch));
        // Never over an existing file: in cluster mode that name may be another leader's
        // segment (two brokers that picked the same epoch), and truncating it would destroy
        // acknowledged writes. The second creator's append fails instead.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .buffered_open(&path)
            .await
            .map_err(|e| StorageError::io("creating segment", &path, e))?;
        // The new name must survive a crash before anything in the file is acknowledged; the
        // caller may leave that to a later syncfs of the filesystem (`sync_name` false). The
        // directory fsync runs on the blocking-thread pool so that only this partition waits
        // for it: on the shard's thread, a thousand partitions rolling 4 MiB segments stalled
        // every request on the shard.
        if sync_name {
            let d = dir.to_path_buf();
            glommio::executor()
                .spawn_blocking(move || sync_dir(&d))
                .await?;
        }
        Ok(Segment {
            base_offset,
            epoch,
            path: path.into(),
            sendable: resident::sendable(file.as_raw_fd()),
            file: Rc::new(file),
            size: 0,
            index: BatchIndex::new(base_offset, index_interval_bytes),
            opened_at: Instant::now(),
            map: Default::default(),
            allocated: Default::default(),
        })
    }

    /// Opens an existing segment, rebuilding its index and the producer state from its batches,
    /// verifying each batch's length, magic and CRC-32C. The file is truncated at the first byte
    /// that is not part of a valid batch (a torn write from a crash), and `truncated` tells
    /// whether that happened. Only batches at or after `replay_from` are recorded into
    /// `producers` (the producer snapshot already reflects the ones before).
    ///
    /// Batches at or after `end_before` were superseded by a newer leader epoch (see
    /// `crate::divergence`) and are cut too, without counting as corruption: the segment that
    /// supersedes them follows.
    #[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
    pub async fn open_and_recover(
        path: PathBuf,
        base_offset: i64,
        epoch: i32,
        producers: &mut ProducerStateTable,
        replay_from: i64,
        index_interval_bytes: u64,
        end_before: Option<i64>,
    ) -> Result<(Segment, bool), StorageError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .buffered_open(&path)
            .await
            .map_err(|e| StorageError::io("opening segment", &path, e))?;
        let file_len = file
            .file_size()
            .await
            .map_err(|e| StorageError::io("sizing segment", &path, e))?;
        let mut index = BatchIndex::new(base_offset, index_interval_bytes);
        let mut next_offset = base_offset;
        let mut pos: u64 = 0;
        let mut superseded = false;
        'scan: while pos < file_len {
            let chunk = file
                .read_at(pos, ((file_len - pos) as usize).min(SCAN_CHUNK_BYTES))
                .await
                .map_err(|e| StorageError::io("reading segment", &path, e))?;
            let mut at = 0usize;
            while at < chunk.len() {
                let rest = &chunk[at..];
                if rest.len() < batch::LOG_OVERHEAD {
                    break; // read on from here (or stop below if nothing was consumed)
                }
                let len = i32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]);
                if len < (batch::BATCH_HEADER_LEN - batch::LOG_OVERHEAD) as i32 {
                    break 'scan;
                }
                let total = batch::LOG_OVERHEAD + len as usize;
                if total as u64 > file_len - (pos + at as u64) {
                    break 'scan; // torn: the batch runs past the end of the file
                }
                let whole;
                let bytes: &[u8] = if total <= rest.len() {
                    &rest[..total]
                } else if at == 0 {
                    // A single batch larger than a chunk: read exactly it.
                    whole = file
                        .read_at(pos, total)
                        .await
                        .map_err(|e| StorageError::io("reading segment", &path, e))?;
                    &whole
                } else {
                    break; // the batch continues past this chunk: read on from its start
                };
                let Ok(h) = batch::verify_batch(bytes) else {
                    break 'scan;
                };
                if h.base_offset < next_offset {
                    break 'scan; // offsets only grow; anything else is garbage
                }
                if end_before.is_some_and(|end| h.last_offset() >= end) {
                    superseded = true;
                    break 'scan;
                }
                index.push(BatchEntry {
                    base_offset: h.base_offset,
                    last_offset: h.last_offset(),
                    position: pos + at as u64,
                    len: total as u32,
                    max_timestamp: h.max_timestamp,
                    leader_epoch: h.partition_leader_epoch,
                });
                if h.base_offset >= replay_from {
                    producers.record(&h, h.base_offset, h.max_timestamp);
                }
                next_offset = h.last_offset() + 1;
                at += total;
            }
            if at == 0 {
                break;
            }
            pos += at as u64;
        }
        let valid = index.last().map(|e| e.end_position()).unwrap_or(0);
        let truncated = valid < file_len;
        if truncated {
            if superseded {
                tracing::warn!(path = %path.display(), valid_bytes = valid, file_bytes = file_len, end_before = end_before.unwrap_or(-1), "cutting a deposed leader's batches that a newer leader epoch superseded (never acknowledged)");
            } else if tail_is_zeros(&file, valid, file_len).await {
                // Zeros written ahead of the data (preallocation) after an unclean stop.
                tracing::debug!(path = %path.display(), valid_bytes = valid, file_bytes = file_len, "dropping preallocated space after the last batch");
            } else {
                tracing::warn!(path = %path.display(), valid_bytes = valid, file_bytes = file_len, "truncating torn or corrupt tail of segment");
            }
            file.truncate(valid)
                .await
                .map_err(|e| StorageError::io("truncating segment", &path, e))?;
            file.fdatasync()
                .await
                .map_err(|e| StorageError::io("fsyncing segment", &path, e))?;
        }
        Ok((
            Segment {
                base_offset,
                epoch,
                path: path.into(),
                sendable: resident::sendable(file.as_raw_fd()),
                file: Rc::new(file),
                size: valid,
                index,
                opened_at: Instant::now(),
                map: Default::default(),
                allocated: std::cell::Cell::new(valid),
            },
            truncated && !superseded,
        ))
    }

    /// Opens a segment using a saved index instead of scanning it (see `index::file`).
    pub async fn open_indexed(
        path: PathBuf,
        base_offset: i64,
        epoch: i32,
        index: BatchIndex,
    ) -> Result<Segment, StorageError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .buffered_open(&path)
            .await
            .map_err(|e| StorageError::io("opening segment", &path, e))?;
        let size = index.last().map(|e| e.end_position()).unwrap_or(0);
        Ok(Segment {
            base_offset,
            epoch,
            path: path.into(),
            sendable: resident::sendable(file.as_raw_fd()),
            file: Rc::new(file),
            size,
            index,
            opened_at: Instant::now(),
            map: Default::default(),
            allocated: std::cell::Cell::new(size),
        })
    }

    /// The sealed segment's bytes as one zero-copy `Bytes` over a read-only memory mapping,
    /// mapped on first use. Only for sealed segments: the file must not grow or shrink while
    /// mapped (see `PartitionLog::read`).
    pub fn mapped(&self) -> Result<Option<Bytes>, StorageError> {
        // A mapping made while the segment was active may be shorter than its final size.
        if let Some((m, _)) = self.map.borrow().as_ref() {
            if m.len() as u64 >= self.size {
                return Ok(Some(m.clone()));
            }
        }
        if self.size == 0 {
            return Ok(None);
        }
        // SAFETY: sealed segments are never modified in place while kaas runs; the mapping is
        // read-only and only the first `size` bytes (whole, verified batches) are ever sliced.
        let (bytes, handle) = unsafe { resident::map_file(&self.path, self.size, &self.sendable)? };
        *self.map.borrow_mut() = Some((bytes.clone(), handle));
        Ok(Some(bytes))
    }

    /// The active segment's bytes up to at least `end`, as a zero-copy `Bytes` over a mapping
    /// of the file's current length (data plus the zeros written ahead of it). The mapping is
    /// remade when a read needs bytes past it. Safe while the segment is active: appends only
    /// extend the file, and the only truncation (trimming the zeros when the segment is sealed)
    /// removes bytes past the data, which are never sliced.
    pub fn mapped_upto(&self, end: u64) -> Result<Option<Bytes>, StorageError> {
        if let Some((m, _)) = self.map.borrow().as_ref() {
            if m.len() as u64 >= end {
                return Ok(Some(m.clone()));
            }
        }
        let len = self.size.max(self.allocated.get());
        if len == 0 || len < end {
            return Ok(None);
        }
        // SAFETY: read-only mapping of bytes that exist in the file and are never truncated
        // while mapped (see above); only whole batches below `size` are ever sliced.
        let (bytes, handle) = unsafe { resident::map_file(&self.path, len, &self.sendable)? };
        *self.map.borrow_mut() = Some((bytes.clone(), handle));
        Ok(Some(bytes))
    }

    /// The segment's open file.
    pub fn file(&self) -> &Rc<BufferedFile> {
        &self.file
    }

    /// Replaces the segment's file (a cleaned copy renamed over it): mappings of the old file
    /// are dropped, and slices of them still in flight are no longer sent from its descriptor.
    pub fn replace_file(&mut self, file: BufferedFile) {
        resident::revoke(&self.sendable, Box::new(self.file.clone()));
        self.sendable = resident::sendable(file.as_raw_fd());
        self.file = Rc::new(file);
        *self.map.borrow_mut() = None;
    }

    /// Reports that a read sliced `[from, to)` of this segment's mapping, so that what reads
    /// leave resident stays within the shard's budget (`resident`).
    pub fn note_read(&self, from: usize, to: usize) {
        if let Some((_, handle)) = self.map.borrow().as_ref() {
            resident::touched(handle, from, to);
        }
    }

    /// The segment's data (whole, verified batches up to `size`) from its memory mapping:
    /// [`Segment::mapped`] when sealed, [`Segment::mapped_upto`] when active. `None` when empty.
    pub fn data(&self, sealed: bool) -> Result<Option<Bytes>, StorageError> {
        let map = if sealed {
            self.mapped()?
        } else {
            self.mapped_upto(self.size)?
        };
        Ok(map.map(|m| m.slice(..self.size as usize)))
    }

    /// The offset after the last batch in this segment (its base offset when empty).
    pub fn next_offset(&self) -> i64 {
        self.index
            .last()
            .map(|e| e.last_offset + 1)
            .unwrap_or(self.base_offset)
    }
}

/// Whether the bytes `[from, to)` of `file` are all zero (preallocated, never written).
async fn tail_is_zeros(file: &BufferedFile, from: u64, to: u64) -> bool {
    let mut pos = from;
    while pos < to {
        let n = ((to - pos) as usize).min(SCAN_CHUNK_BYTES);
        match file.read_at(pos, n).await {
            Ok(chunk) if !chunk.is_empty() && chunk.iter().all(|b| *b == 0) => {
                pos += chunk.len() as u64
            }
            _ => return false,
        }
    }
    true
}

/// fsync a directory so that entries created or renamed in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    kaas_durable::sync_dir(dir).map_err(|e| StorageError::io("fsyncing directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Segment names sort by offset and parse back to what was written.
    #[test]
    fn names_round_trip() {
        let n = segment_file_name(123, 4);
        assert_eq!(n, "00000000000000000123.0000000004.log");
        assert_eq!(parse_segment_file_name(&n), Some((123, 4)));
        assert!(!is_legacy_segment_name(&n));
        assert_eq!(parse_segment_file_name("manifest.json"), None);
        assert_eq!(
            parse_segment_file_name("00000000000000000123.0000000004.index"),
            None
        );
        assert_eq!(parse_segment_file_name("00000000000000000123.log"), None);
        assert_eq!(
            parse_segment_file_name("0000000000000000012x.0000000004.log"),
            None
        );
        assert!(segment_file_name(9, 0) < segment_file_name(10, 0));
    }

    // What versions before Kafka-style names wrote still parses, and is renamed with its index.
    #[test]
    fn legacy_names_are_read_and_migrated() {
        let legacy = "00000000000000000123-0000000004.log";
        assert_eq!(parse_segment_file_name(legacy), Some((123, 4)));
        assert!(is_legacy_segment_name(legacy));
        let dir = std::env::temp_dir().join(format!("kaas-seg-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(legacy), b"batches").unwrap();
        std::fs::write(dir.join("00000000000000000123-0000000004.index"), b"idx").unwrap();
        std::fs::write(dir.join("00000000000000000200-0000000005.log"), b"more").unwrap();
        std::fs::write(dir.join("00000000000000000300.0000000006.log"), b"new").unwrap();
        assert_eq!(migrate_legacy_names(&dir).unwrap(), 2);
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "00000000000000000123.0000000004.index",
                "00000000000000000123.0000000004.log",
                "00000000000000000200.0000000005.log",
                "00000000000000000300.0000000006.log",
            ]
        );
        assert_eq!(
            std::fs::read(dir.join("00000000000000000123.0000000004.log")).unwrap(),
            b"batches"
        );
        assert_eq!(migrate_legacy_names(&dir).unwrap(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
