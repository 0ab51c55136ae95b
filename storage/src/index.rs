//! The in-memory batch index of one segment: one entry per batch, rebuilt from the file on open
//! and never written to disk, so there is nothing to fsync or to get out of step with the log.

/// Where one batch lives in its segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEntry {
    pub base_offset: i64,
    pub last_offset: i64,
    /// Byte position of the batch in the segment file.
    pub position: u64,
    pub len: u32,
    pub max_timestamp: i64,
    pub leader_epoch: i32,
}

impl BatchEntry {
    pub fn end_position(&self) -> u64 {
        self.position + self.len as u64
    }
}

/// Batches of one segment in offset order.
#[derive(Debug, Default, Clone)]
pub struct BatchIndex {
    entries: Vec<BatchEntry>,
}

impl BatchIndex {
    pub fn push(&mut self, e: BatchEntry) {
        debug_assert!(self
            .entries
            .last()
            .is_none_or(|l| l.last_offset < e.base_offset));
        self.entries.push(e);
    }
    pub fn entries(&self) -> &[BatchEntry] {
        &self.entries
    }
    pub fn last(&self) -> Option<&BatchEntry> {
        self.entries.last()
    }
    /// Index of the first batch whose last offset is at or after `offset`.
    pub fn find(&self, offset: i64) -> usize {
        self.entries.partition_point(|e| e.last_offset < offset)
    }
    /// Index of the first batch whose max timestamp is at or after `ts`.
    pub fn find_timestamp(&self, ts: i64) -> Option<usize> {
        self.entries.iter().position(|e| e.max_timestamp >= ts)
    }
    /// The largest max timestamp of any batch (`None` when empty).
    pub fn newest_timestamp(&self) -> Option<i64> {
        self.entries.iter().map(|e| e.max_timestamp).max()
    }
    pub fn max_timestamp(&self) -> Option<&BatchEntry> {
        self.entries
            .iter()
            .max_by_key(|e| (e.max_timestamp, std::cmp::Reverse(e.base_offset)))
    }
}

/// Index files: a segment's batch index saved beside it when the segment is sealed (rolled, or
/// at a clean shutdown), so that opening a partition reads a small file instead of scanning
/// the segment. They are a cache: never fsynced on the hot path, checked against the segment's
/// length when loaded, and rebuilt by scanning whenever they are missing or do not match.
pub mod file {
    use super::{BatchEntry, BatchIndex};
    use std::path::{Path, PathBuf};

    const MAGIC: &[u8; 8] = b"KAASIDX1";
    const ENTRY_BYTES: usize = 8 + 8 + 8 + 4 + 8 + 4;

    /// `00000000000000000000-0000000000.log` → `00000000000000000000-0000000000.index`.
    pub fn path_for(segment: &Path) -> PathBuf {
        segment.with_extension("index")
    }

    pub fn encode(index: &BatchIndex) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + index.entries.len() * ENTRY_BYTES);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(index.entries.len() as u64).to_le_bytes());
        for e in &index.entries {
            out.extend_from_slice(&e.base_offset.to_le_bytes());
            out.extend_from_slice(&e.last_offset.to_le_bytes());
            out.extend_from_slice(&e.position.to_le_bytes());
            out.extend_from_slice(&e.len.to_le_bytes());
            out.extend_from_slice(&e.max_timestamp.to_le_bytes());
            out.extend_from_slice(&e.leader_epoch.to_le_bytes());
        }
        out
    }

    /// Parses an index file; `None` if it is not a complete, well-formed index.
    pub fn decode(bytes: &[u8]) -> Option<BatchIndex> {
        if bytes.len() < 16 || &bytes[..8] != MAGIC {
            return None;
        }
        let n = u64::from_le_bytes(bytes[8..16].try_into().ok()?) as usize;
        if bytes.len() != 16 + n.checked_mul(ENTRY_BYTES)? {
            return None;
        }
        let mut index = BatchIndex::default();
        let mut prev_last = i64::MIN;
        let mut prev_end = 0u64;
        for chunk in bytes[16..].chunks_exact(ENTRY_BYTES) {
            let i64_at =
                |at: usize| i64::from_le_bytes(chunk[at..at + 8].try_into().expect("8 bytes"));
            let e = BatchEntry {
                base_offset: i64_at(0),
                last_offset: i64_at(8),
                position: u64::from_le_bytes(chunk[16..24].try_into().expect("8 bytes")),
                len: u32::from_le_bytes(chunk[24..28].try_into().expect("4 bytes")),
                max_timestamp: i64_at(28),
                leader_epoch: i32::from_le_bytes(chunk[36..40].try_into().expect("4 bytes")),
            };
            // Entries must be contiguous and increasing, or the file is not trusted.
            if e.base_offset <= prev_last || e.last_offset < e.base_offset || e.position != prev_end
            {
                return None;
            }
            prev_last = e.last_offset;
            prev_end = e.end_position();
            index.entries.push(e);
        }
        Some(index)
    }

    /// Writes the index beside its segment. Not fsynced: a lost index is rebuilt by a scan.
    pub fn save(segment: &Path, index: &BatchIndex) {
        let path = path_for(segment);
        let tmp = path.with_extension("index.tmp");
        if std::fs::write(&tmp, encode(index))
            .and_then(|_| std::fs::rename(&tmp, &path))
            .is_err()
        {
            tracing::warn!(path = %path.display(), "could not write segment index; it will be rebuilt by scanning on next open");
        }
    }

    /// Loads the index of a segment whose data is `segment_len` bytes long, if it matches.
    pub fn load(segment: &Path, segment_len: u64) -> Option<BatchIndex> {
        let index = decode(&std::fs::read(path_for(segment)).ok()?)?;
        let end = index.last().map(|e| e.end_position()).unwrap_or(0);
        (end == segment_len).then_some(index)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        // An index survives encode/decode; truncated or reordered files are refused.
        #[test]
        fn round_trip_and_refusal() {
            let mut idx = BatchIndex::default();
            idx.push(BatchEntry {
                base_offset: 0,
                last_offset: 4,
                position: 0,
                len: 100,
                max_timestamp: 7,
                leader_epoch: 0,
            });
            idx.push(BatchEntry {
                base_offset: 5,
                last_offset: 5,
                position: 100,
                len: 80,
                max_timestamp: 9,
                leader_epoch: 1,
            });
            let bytes = encode(&idx);
            assert_eq!(decode(&bytes).unwrap().entries(), idx.entries());
            assert!(decode(&bytes[..bytes.len() - 1]).is_none());
            let mut bad = idx.clone();
            bad.entries.swap(0, 1);
            assert!(decode(&encode(&bad)).is_none());
        }
    }
}
