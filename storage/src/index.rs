//! The in-memory batch index of one segment, sparse as Kafka's is: one mark per
//! `index.interval.bytes` of log (the first batch always, then the first batch starting at
//! least that many bytes after the previous mark), each mark 16 bytes. A lookup binary-searches
//! the marks and then scans forward over the batch headers in the segment's bytes (61-byte
//! peeks, no record is read), at most one interval plus one batch.
//!
//! Beside the marks the index keeps what is needed without a scan: the last batch (where the
//! next append goes, the segment's next offset), the newest timestamp and the first batch that
//! carries it (retention, ListOffsets MAX_TIMESTAMP), and the runs of leader epochs
//! (OffsetForLeaderEpoch). Each mark also carries the largest timestamp of the batches before
//! it (a sparse time index), so a timestamp lookup scans one interval too.
//!
//! Memory, measured for 1 GiB of log at the default 4096-byte interval: 1 KiB records in
//! 16 KiB batches, 64,740 batches and as many marks, 1.0 MiB (the dense index it replaces
//! held 40 bytes per batch, 2.6 MB); 1 KiB records one per batch, 981,573 batches and 245,394
//! marks, 4.0 MiB (dense: 39 MB).

use std::ops::Range;

use kaas_wire::batch;

/// One batch and where it lives in its segment file: what is pushed on append and recovery,
/// and what a lookup returns (read back from the batch's header).
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

    /// The batch whose header starts at `position` of `segment` (the segment's bytes, up to its
    /// size: whole, verified batches), or `None` past the end.
    pub fn at(segment: &[u8], position: u64) -> Option<BatchEntry> {
        let h = batch::peek_header(segment.get(position as usize..)?).ok()?;
        Some(BatchEntry {
            base_offset: h.base_offset,
            last_offset: h.last_offset(),
            position,
            len: h.total_len() as u32,
            max_timestamp: h.max_timestamp,
            leader_epoch: h.partition_leader_epoch,
        })
    }
}

/// One sparse mark. Relative offset and position fit in 32 bits because a segment is rolled
/// before it could outgrow them (`PartitionLog::roll`); a batch that would not fit gets
/// no mark, which only lengthens the scans after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    /// The batch's base offset minus the segment's base offset.
    relative_offset: u32,
    /// The batch's byte position in the segment.
    position: u32,
    /// The largest max timestamp of the batches before this one in the segment.
    max_timestamp_before: i64,
}

/// Bytes of one mark, for memory accounting.
pub const MARK_BYTES: usize = std::mem::size_of::<Mark>();

/// The sparse index of one segment, in offset order.
#[derive(Debug, Clone)]
pub struct BatchIndex {
    /// The segment's base offset: marks are relative to it.
    base_offset: i64,
    /// `index.interval.bytes`: the least distance between two marks.
    interval_bytes: u64,
    marks: Vec<Mark>,
    batches: u64,
    last: Option<BatchEntry>,
    /// The largest max timestamp and the base offset of the first batch carrying it.
    newest: Option<(i64, i64)>,
    /// (leader epoch, base offset of the first batch written at it), one per change.
    epochs: Vec<(i32, i64)>,
}

impl BatchIndex {
    pub fn new(base_offset: i64, interval_bytes: u64) -> BatchIndex {
        BatchIndex {
            base_offset,
            interval_bytes,
            marks: Vec::new(),
            batches: 0,
            last: None,
            newest: None,
            epochs: Vec::new(),
        }
    }

    /// Changes the mark distance for batches pushed from now on.
    pub fn set_interval_bytes(&mut self, interval_bytes: u64) {
        self.interval_bytes = interval_bytes;
    }

    /// Records the batch appended after the last one (contiguous, offsets increasing).
    pub fn push(&mut self, e: BatchEntry) {
        debug_assert!(self
            .last
            .is_none_or(|l| l.last_offset < e.base_offset && l.end_position() == e.position));
        let due = self
            .marks
            .last()
            .is_none_or(|m| e.position.saturating_sub(m.position as u64) >= self.interval_bytes);
        if due {
            let relative = u32::try_from(e.base_offset - self.base_offset);
            if let (Ok(relative_offset), Ok(position)) = (relative, u32::try_from(e.position)) {
                self.marks.push(Mark {
                    relative_offset,
                    position,
                    max_timestamp_before: self.newest.map_or(i64::MIN, |(ts, _)| ts),
                });
            }
        }
        if self.newest.is_none_or(|(ts, _)| e.max_timestamp > ts) {
            self.newest = Some((e.max_timestamp, e.base_offset));
        }
        if self
            .epochs
            .last()
            .is_none_or(|(ep, _)| *ep != e.leader_epoch)
        {
            self.epochs.push((e.leader_epoch, e.base_offset));
        }
        self.batches += 1;
        self.last = Some(e);
    }

    pub fn last(&self) -> Option<&BatchEntry> {
        self.last.as_ref()
    }
    pub fn batch_count(&self) -> u64 {
        self.batches
    }
    pub fn mark_count(&self) -> usize {
        self.marks.len()
    }
    /// Heap bytes held (marks and epoch runs, at their capacity).
    pub fn heap_bytes(&self) -> usize {
        self.marks.capacity() * MARK_BYTES
            + self.epochs.capacity() * std::mem::size_of::<(i32, i64)>()
    }
    /// The largest max timestamp of any batch (`None` when empty).
    pub fn newest_timestamp(&self) -> Option<i64> {
        self.newest.map(|(ts, _)| ts)
    }
    /// (largest max timestamp, base offset of the first batch carrying it).
    pub fn newest(&self) -> Option<(i64, i64)> {
        self.newest
    }
    /// (leader epoch, first offset) runs, in offset order.
    pub fn epochs(&self) -> &[(i32, i64)] {
        &self.epochs
    }

    /// The first batch whose last offset is at or after `offset`. `segment` is the segment's
    /// bytes up to its size.
    pub fn find(&self, segment: &[u8], offset: i64) -> Option<BatchEntry> {
        if self.last?.last_offset < offset {
            return None;
        }
        scan(segment, self.mark_at_or_before(offset).1, |e| {
            e.last_offset >= offset
        })
    }

    /// Where a lookup of `offset` starts: the index of the first mark past it, and the
    /// position of the last mark at or before it (0 without one). The batch holding `offset`
    /// starts at or after that position, and at or before the next mark's.
    fn mark_at_or_before(&self, offset: i64) -> (usize, u64) {
        let relative = offset.saturating_sub(self.base_offset);
        let i = self
            .marks
            .partition_point(|m| (m.relative_offset as i64) <= relative);
        let from = i
            .checked_sub(1)
            .map_or(0, |i| self.marks[i].position as u64);
        (i, from)
    }

    /// The first batch whose max timestamp is at or after `ts`.
    pub fn find_timestamp(&self, segment: &[u8], ts: i64) -> Option<BatchEntry> {
        if self.newest?.0 < ts {
            return None;
        }
        // Every batch before a mark whose predecessors all stay below `ts` is below it too.
        let i = self.marks.partition_point(|m| m.max_timestamp_before < ts);
        let from = i
            .checked_sub(1)
            .map_or(0, |i| self.marks[i].position as u64);
        scan(segment, from, |e| e.max_timestamp >= ts)
    }
}

impl BatchIndex {
    /// The end of the run of whole batches that starts with the batch ending at `first_end`
    /// and ends at or before byte `limit` (at least `first_end`): a fetch's extent. The marks
    /// jump to the last batch start at or before `limit`, so at most one interval of headers
    /// is read whatever the fetch size.
    pub fn end_within(&self, segment: &[u8], first_end: u64, limit: u64) -> u64 {
        let limit = limit.min(segment.len() as u64);
        let mut end = self
            .last_mark_at_or_below(limit)
            .map_or(first_end, |mark| first_end.max(mark));
        // Every batch before a mark ends at or before it, so all up to `end` are whole; walk
        // the length fields from there. A batch starting within LOG_OVERHEAD of the limit
        // cannot fit, so its length is not read (`end_span` relies on it).
        while end + batch::LOG_OVERHEAD as u64 <= limit {
            let Some(len) = segment.get(end as usize + 8..end as usize + 12) else {
                break;
            };
            let len = i32::from_be_bytes(len.try_into().expect("4 bytes"));
            let next = end + batch::LOG_OVERHEAD as u64 + len.max(0) as u64;
            if next > limit {
                break;
            }
            end = next;
        }
        end
    }

    /// The position of the last mark at or below byte `position`, if any.
    fn last_mark_at_or_below(&self, position: u64) -> Option<u64> {
        let i = self
            .marks
            .partition_point(|m| (m.position as u64) <= position);
        i.checked_sub(1).map(|i| self.marks[i].position as u64)
    }

    /// The bytes of a segment of `len` bytes that [`Self::find`] reads for `offset`: from the
    /// last mark at or before it to the end of the header of the batch at the next mark (the
    /// batch holding `offset` starts at that mark or before it). `None` when the index alone
    /// says that nothing holds `offset`. A read needs these in the page cache not to wait for
    /// the disk (`PartitionLog::read`).
    pub fn find_span(&self, offset: i64, len: u64) -> Option<Range<u64>> {
        if self.last?.last_offset < offset {
            return None;
        }
        let (i, from) = self.mark_at_or_before(offset);
        let upto = self
            .marks
            .get(i)
            .map_or(len, |m| m.position as u64 + batch::BATCH_HEADER_LEN as u64);
        Some(from.min(len)..upto.min(len))
    }

    /// The bytes that [`Self::end_within`] reads for a fetch of `max_bytes` from the batch
    /// that `find` finds in `found` (its [`Self::find_span`]), whichever batch that is: the
    /// limit lies between `found.start + max_bytes` and `found.end + max_bytes`, and the walk
    /// starts at the last mark at or before it (or later) and reads below it.
    pub fn end_span(&self, found: &Range<u64>, max_bytes: u64, len: u64) -> Range<u64> {
        let low = found.start.saturating_add(max_bytes).min(len);
        let high = found.end.saturating_add(max_bytes).min(len);
        let mark = self.last_mark_at_or_below(low).unwrap_or(0);
        found.start.max(mark).min(high)..high
    }
}

/// The first batch at or after byte `from` that `hit` accepts, reading headers only.
pub fn scan(segment: &[u8], from: u64, hit: impl Fn(&BatchEntry) -> bool) -> Option<BatchEntry> {
    let mut position = from;
    loop {
        let e = BatchEntry::at(segment, position)?;
        if hit(&e) {
            return Some(e);
        }
        position = e.end_position();
    }
}

/// Index files: a segment's batch index saved beside it when the segment is sealed (rolled, or
/// at a clean shutdown), so that opening a partition reads a small file instead of scanning
/// the segment. They are a cache: never fsynced on the hot path, checked against the segment's
/// length when loaded, and rebuilt by scanning whenever they are missing or do not match.
/// Version 2 holds the sparse marks; a version 1 file (one entry per batch) is not read, so the
/// segment is scanned once and the file rewritten when it is next sealed.
pub mod file {
    use super::{BatchEntry, BatchIndex, Mark};
    use std::path::{Path, PathBuf};

    const MAGIC: &[u8; 8] = b"KAASIDX2";
    /// Magic, base offset, batch count, last batch (40), newest (16), epoch and mark counts.
    const FIXED_BYTES: usize = 8 + 8 + 8 + 40 + 16 + 8 + 8;
    const EPOCH_BYTES: usize = 4 + 8;
    const MARK_BYTES: usize = 4 + 4 + 8;

    /// `00000000000000000000.0000000000.log` → `00000000000000000000.0000000000.index`.
    pub fn path_for(segment: &Path) -> PathBuf {
        segment.with_extension("index")
    }

    pub fn encode(index: &BatchIndex) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            FIXED_BYTES + index.epochs.len() * EPOCH_BYTES + index.marks.len() * MARK_BYTES,
        );
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&index.base_offset.to_le_bytes());
        out.extend_from_slice(&index.batches.to_le_bytes());
        let last = index.last.unwrap_or(BatchEntry {
            base_offset: 0,
            last_offset: 0,
            position: 0,
            len: 0,
            max_timestamp: 0,
            leader_epoch: 0,
        });
        out.extend_from_slice(&last.base_offset.to_le_bytes());
        out.extend_from_slice(&last.last_offset.to_le_bytes());
        out.extend_from_slice(&last.position.to_le_bytes());
        out.extend_from_slice(&last.len.to_le_bytes());
        out.extend_from_slice(&last.max_timestamp.to_le_bytes());
        out.extend_from_slice(&last.leader_epoch.to_le_bytes());
        let (ts, at) = index.newest.unwrap_or((0, 0));
        out.extend_from_slice(&ts.to_le_bytes());
        out.extend_from_slice(&at.to_le_bytes());
        out.extend_from_slice(&(index.epochs.len() as u64).to_le_bytes());
        out.extend_from_slice(&(index.marks.len() as u64).to_le_bytes());
        for (epoch, offset) in &index.epochs {
            out.extend_from_slice(&epoch.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        for m in &index.marks {
            out.extend_from_slice(&m.relative_offset.to_le_bytes());
            out.extend_from_slice(&m.position.to_le_bytes());
            out.extend_from_slice(&m.max_timestamp_before.to_le_bytes());
        }
        out
    }

    /// Reads little-endian fields in order, refusing to run past the end.
    struct Reader<'a>(&'a [u8]);
    impl Reader<'_> {
        fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
            let (head, rest) = self.0.split_first_chunk::<N>()?;
            self.0 = rest;
            Some(*head)
        }
        fn i64(&mut self) -> Option<i64> {
            self.take().map(i64::from_le_bytes)
        }
        fn u64(&mut self) -> Option<u64> {
            self.take().map(u64::from_le_bytes)
        }
        fn i32(&mut self) -> Option<i32> {
            self.take().map(i32::from_le_bytes)
        }
        fn u32(&mut self) -> Option<u32> {
            self.take().map(u32::from_le_bytes)
        }
    }

    /// Parses an index file; `None` if it is not a complete, well-formed version 2 index.
    /// `interval_bytes` applies to batches pushed after loading.
    pub fn decode(bytes: &[u8], interval_bytes: u64) -> Option<BatchIndex> {
        let mut r = Reader(bytes.strip_prefix(MAGIC)?);
        let base_offset = r.i64()?;
        let batches = r.u64()?;
        let last = BatchEntry {
            base_offset: r.i64()?,
            last_offset: r.i64()?,
            position: r.u64()?,
            len: r.u32()?,
            max_timestamp: r.i64()?,
            leader_epoch: r.i32()?,
        };
        let newest = (r.i64()?, r.i64()?);
        let n_epochs = r.u64()? as usize;
        let n_marks = r.u64()? as usize;
        let body = n_epochs
            .checked_mul(EPOCH_BYTES)?
            .checked_add(n_marks.checked_mul(MARK_BYTES)?)?;
        if r.0.len() != body {
            return None;
        }
        let mut index = BatchIndex::new(base_offset, interval_bytes);
        if batches == 0 {
            return (n_epochs == 0 && n_marks == 0).then_some(index);
        }
        for _ in 0..n_epochs {
            index.epochs.push((r.i32()?, r.i64()?));
        }
        for _ in 0..n_marks {
            index.marks.push(Mark {
                relative_offset: r.u32()?,
                position: r.u32()?,
                max_timestamp_before: r.i64()?,
            });
        }
        // Everything must be ordered and inside the segment, or the file is not trusted.
        let marks_ok = index.marks.first().is_some_and(|m| m.position == 0)
            && index.marks.windows(2).all(|w| {
                w[0].relative_offset < w[1].relative_offset
                    && w[0].position < w[1].position
                    && w[0].max_timestamp_before <= w[1].max_timestamp_before
            })
            && index.marks.last().is_some_and(|m| {
                m.position as u64 <= last.position
                    && base_offset + m.relative_offset as i64 <= last.base_offset
            });
        let epochs_ok = index.epochs.first().is_some_and(|e| e.1 >= base_offset)
            && index.epochs.windows(2).all(|w| w[0].1 < w[1].1)
            && index.epochs.last().is_some_and(|e| e.1 <= last.base_offset);
        let last_ok = last.base_offset >= base_offset
            && last.last_offset >= last.base_offset
            && newest.0 >= last.max_timestamp
            && (base_offset..=last.base_offset).contains(&newest.1)
            && batches >= n_marks as u64;
        if !(marks_ok && epochs_ok && last_ok) {
            return None;
        }
        index.batches = batches;
        index.last = Some(last);
        index.newest = Some(newest);
        Some(index)
    }

    /// Writes the index beside its segment. Not fsynced: a lost index is rebuilt by a scan.
    pub fn save(segment: &Path, index: &BatchIndex) {
        save_encoded(segment, &encode(index));
    }

    /// [`save`] of an index already encoded (so the file IO can run off the shard's thread).
    pub fn save_encoded(segment: &Path, bytes: &[u8]) {
        let path = path_for(segment);
        // Unique per write: two brokers may seal the same segment at once (a deposed leader
        // and its successor), and one temporary file written by both is a mix of two indexes.
        let tmp = path.with_extension(format!("index.tmp.{}", kaas_durable::unique_suffix()));
        if std::fs::write(&tmp, bytes)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .is_err()
        {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(path = %path.display(), "could not write segment index; it will be rebuilt by scanning on next open");
        }
    }

    /// Loads the index of a segment whose data is `segment_len` bytes long, if it matches.
    pub fn load(segment: &Path, segment_len: u64, interval_bytes: u64) -> Option<BatchIndex> {
        let index = decode(&std::fs::read(path_for(segment)).ok()?, interval_bytes)?;
        let end = index.last().map(|e| e.end_position()).unwrap_or(0);
        (end == segment_len).then_some(index)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn entry(base_offset: i64, last_offset: i64, position: u64, len: u32) -> BatchEntry {
            BatchEntry {
                base_offset,
                last_offset,
                position,
                len,
                max_timestamp: base_offset * 10,
                leader_epoch: (base_offset / 10) as i32,
            }
        }

        // An index survives encode/decode; truncated, version 1 and disordered files are
        // refused.
        #[test]
        fn round_trip_and_refusal() {
            let mut idx = BatchIndex::new(100, 250);
            let mut pos = 0;
            for b in 0..40 {
                idx.push(entry(100 + b * 2, 101 + b * 2, pos, 100));
                pos += 100;
            }
            assert_eq!(
                idx.mark_count(),
                14,
                "one mark per 250 bytes: every third batch"
            );
            let bytes = encode(&idx);
            let back = decode(&bytes, 250).unwrap();
            assert_eq!(back.marks, idx.marks);
            assert_eq!(back.epochs, idx.epochs);
            assert_eq!(
                (back.last, back.newest, back.batches),
                (idx.last, idx.newest, idx.batches)
            );
            assert!(decode(&bytes[..bytes.len() - 1], 250).is_none());
            let mut v1 = bytes.clone();
            v1[7] = b'1';
            assert!(decode(&v1, 250).is_none());
            let mut bad = idx.clone();
            bad.marks.swap(1, 2);
            assert!(decode(&encode(&bad), 250).is_none());
            let empty = BatchIndex::new(7, 4096);
            assert_eq!(decode(&encode(&empty), 4096).unwrap().last(), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_wire::batch::{build_batch, BatchSpec};

    /// `segment` with every byte outside `keep` overwritten.
    fn poisoned(segment: &[u8], keep: &[&Range<u64>]) -> Vec<u8> {
        let mut p = vec![0xA5; segment.len()];
        for r in keep {
            let r = r.start as usize..r.end as usize;
            p[r.clone()].copy_from_slice(&segment[r]);
        }
        p
    }

    const BASE: i64 = 1000;

    /// 200 batches of 1-4 records from offset BASE, with gaps between their offsets as
    /// compaction leaves them: the segment bytes, every batch's entry, and the offset after.
    fn sample_segment() -> (Vec<u8>, Vec<BatchEntry>, i64) {
        let mut segment = Vec::new();
        let mut dense = Vec::new();
        let mut next = BASE;
        for b in 0..200i64 {
            let n = 1 + (b % 4) as usize;
            let value = vec![b'x'; (b * 37 % 300) as usize];
            let recs: Vec<batch::RecordKv> = (0..n).map(|_| (None, Some(&value[..]))).collect();
            // Timestamps go up and down, as producers' clocks do.
            let ts = 5000 + (b * 7919 % 211) * 3;
            let mut bytes = build_batch(
                BatchSpec {
                    base_offset: next,
                    timestamp: ts,
                    ..Default::default()
                },
                &recs,
            );
            batch::set_partition_leader_epoch(&mut bytes, (b / 50) as i32);
            let e = BatchEntry::at(&bytes, 0).unwrap();
            dense.push(BatchEntry {
                position: segment.len() as u64,
                ..e
            });
            segment.extend_from_slice(&bytes);
            // Gaps between batches, as compaction leaves them.
            next += n as i64 + (b % 3);
        }
        (segment, dense, next)
    }

    /// Mark distances (`index.interval.bytes`) the lookups are checked with: a mark at every
    /// batch, every few batches, and only the first.
    const MARK_DISTANCES: [u64; 5] = [0, 1, 500, 4096, 1 << 30];

    fn indexed(dense: &[BatchEntry], interval: u64) -> BatchIndex {
        let mut idx = BatchIndex::new(BASE, interval);
        for e in dense {
            idx.push(*e);
        }
        idx
    }

    // Every offset and every timestamp is found by mark + header scan, exactly as a dense
    // search over all batches finds it, for several mark distances.
    #[test]
    fn sparse_lookups_match_dense() {
        let (segment, dense, next) = sample_segment();
        let base = BASE;
        for interval in MARK_DISTANCES {
            let idx = indexed(&dense, interval);
            if interval >= 1 << 30 {
                assert_eq!(idx.mark_count(), 1);
            }
            for offset in base - 2..next + 2 {
                let want = dense.iter().find(|e| e.last_offset >= offset).copied();
                assert_eq!(idx.find(&segment, offset), want, "offset {offset}");
            }
            for ts in 4990..5700 {
                let want = dense.iter().find(|e| e.max_timestamp >= ts).copied();
                assert_eq!(idx.find_timestamp(&segment, ts), want, "ts {ts}");
            }
            // A fetch's extent: whole batches from the first while they fit (at least one).
            for (i, first) in dense.iter().enumerate() {
                for max_bytes in [0u64, 100, 333, 4096, 9000, 1 << 20] {
                    let limit = first.position + max_bytes;
                    let want = dense[i + 1..]
                        .iter()
                        .take_while(|e| e.end_position() <= limit)
                        .last()
                        .map_or(first.end_position(), |e| e.end_position());
                    let got = idx.end_within(&segment, first.end_position(), limit);
                    assert_eq!(got, want, "interval {interval} batch {i} max {max_bytes}");
                }
            }
            let newest = dense.iter().map(|e| e.max_timestamp).max().unwrap();
            let first = dense.iter().find(|e| e.max_timestamp == newest).unwrap();
            assert_eq!(idx.newest(), Some((newest, first.base_offset)));
            assert_eq!(idx.epochs().len(), 4);
            assert_eq!(idx.last(), dense.last());
        }
    }

    // What a read's lookups read lies within the spans the index names beforehand, so that the
    // read path can bring them into the page cache first: with every other byte overwritten
    // they answer the same, for several mark distances.
    #[test]
    fn lookups_read_only_the_spans_the_index_names() {
        let (segment, dense, next) = sample_segment();
        let len = segment.len() as u64;
        for interval in MARK_DISTANCES {
            let idx = indexed(&dense, interval);
            for offset in (BASE - 2..next + 2).step_by(11) {
                let Some(found) = idx.find_span(offset, len) else {
                    assert_eq!(idx.find(&segment, offset), None, "offset {offset}");
                    continue;
                };
                let first = idx.find(&segment, offset);
                let p = poisoned(&segment, &[&found]);
                assert_eq!(
                    idx.find(&p, offset),
                    first,
                    "interval {interval} offset {offset}"
                );
                let Some(first) = first else { continue };
                // A high watermark a few offsets on cuts the extent at its batch.
                let hw = offset + 7;
                let hw_span = idx.find_span(hw, len);
                for max_bytes in [0u64, 100, 4096, 9000] {
                    let end = idx.end_span(&found, max_bytes, len);
                    let limit = first.position + max_bytes;
                    let p = poisoned(&segment, &[&found, &end]);
                    assert_eq!(
                        idx.end_within(&p, first.end_position(), limit),
                        idx.end_within(&segment, first.end_position(), limit),
                        "interval {interval} offset {offset} max {max_bytes}"
                    );
                    let (Some(hw_span), Some(cut)) = (&hw_span, idx.find(&segment, hw)) else {
                        continue;
                    };
                    let p = poisoned(&segment, &[&found, &end, hw_span]);
                    assert_eq!(idx.find(&p, hw), Some(cut));
                    let limit = limit.min(cut.position);
                    assert_eq!(
                        idx.end_within(&p, first.end_position(), limit),
                        idx.end_within(&segment, first.end_position(), limit),
                        "interval {interval} offset {offset} max {max_bytes} cut at {hw}"
                    );
                }
            }
        }
    }
}
