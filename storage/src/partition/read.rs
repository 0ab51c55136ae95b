//! The read path: batches by offset from the segments' mappings, long-poll signals, lookups by
//! timestamp and by leader epoch.

use super::*;

/// The longest span of batch headers `PartitionLog::read` reads into the page cache whole
/// before reading (with the default `index.interval.bytes` of 4 KiB a span is a few KiB). A
/// longer one — a batch of a MiB or more, or sparse marks — is walked header by header
/// instead, so that only the pages the lookup reads are read.
const HEADER_PREFETCH_MAX_BYTES: u64 = 1 << 20;

impl PartitionLog {
    /// Reads whole batches starting with the one that contains `offset`, up to `max_bytes`
    /// (at least one batch even if it is larger, as Kafka does, so a consumer always
    /// progresses). Reads stop at a segment boundary.
    ///
    /// Sealed segments are served from a memory mapping without copying: the returned bytes
    /// are a slice of the mapped file, and the connection writes them straight to the socket.
    /// A sealed segment is never truncated or rewritten in place (retention unlinks it, and the
    /// mapping stays valid until the last reader drops it), so the mapping cannot SIGBUS. The
    /// active segment is mapped up to its current length and remapped as it grows
    /// (`Segment::mapped_upto`).
    ///
    /// The batch is found through the sparse index (a binary search over its marks, then a
    /// walk over at most one `index.interval.bytes` of batch headers in the mapping), and the
    /// extent up to `max_bytes` likewise, so a read touches a bounded number of headers
    /// whatever the batch size or the fetch size.
    pub async fn read(&self, offset: i64, max_bytes: usize) -> Result<ReadOutcome, StorageError> {
        let bound = self.log_end_offset();
        self.headers_into_cache(offset, max_bytes, bound).await;
        self.read_below(offset, max_bytes, bound)
    }

    /// [`Self::read`] for consumers: only what is below the high watermark. An offset between
    /// the high watermark and the log end reads nothing (as in Kafka), beyond the end it is
    /// out of range.
    pub async fn read_visible(
        &self,
        offset: i64,
        max_bytes: usize,
    ) -> Result<ReadOutcome, StorageError> {
        let bound = self.high_watermark();
        self.headers_into_cache(offset, max_bytes, bound).await;
        self.read_below(offset, max_bytes, bound)
    }

    /// Brings the batch headers that `read_below` is about to read through the mapping into
    /// the page cache, from the shard's blocking thread, when they are not there yet: a page
    /// fault on the shard's thread would stall every partition of the shard for the disk (a
    /// consumer reading history stalled acks=1 produce for seconds on a slow volume). The
    /// index names beforehand where the lookups read ([`BatchIndex::find_span`],
    /// [`BatchIndex::end_span`]); the record sets themselves are sent with `sendfile`, which
    /// reads them off the shard as well (`shard::conn`). A page evicted again in between is
    /// left to the fault.
    async fn headers_into_cache(&self, offset: i64, max_bytes: usize, bound: i64) {
        let (cold, long): (Vec<Bytes>, Vec<Bytes>) = {
            let st = self.state.borrow();
            let hw = bound.min(st.log_end_offset);
            if offset < st.log_start_offset || offset >= hw {
                return;
            }
            // The segment `read_below` reads first (a later one only after a compacted gap).
            let Some((seg, sealed)) = st.segments_from(offset).next() else {
                return;
            };
            let Ok(Some(data)) = seg.data(sealed) else {
                return;
            };
            let len = data.len() as u64;
            let Some(found) = seg.index.find_span(offset, len) else {
                return;
            };
            let mut spans = vec![seg.index.end_span(&found, max_bytes as u64, len), found];
            if seg.index.last().is_some_and(|l| l.last_offset >= hw) {
                spans.extend(seg.index.find_span(hw, len));
            }
            // A long span is walked off the shard whether or not it is cached: asking the
            // page cache about all of it would cost more than the walk.
            let (short, long): (Vec<_>, Vec<_>) = spans
                .into_iter()
                .filter(|r| !r.is_empty())
                .map(|r| data.slice(r.start as usize..r.end as usize))
                .partition(|b| b.len() as u64 <= HEADER_PREFETCH_MAX_BYTES);
            let cold = short
                .into_iter()
                .filter(|b| !crate::resident::in_page_cache(b))
                .collect();
            (cold, long)
        };
        if !cold.is_empty() || !long.is_empty() {
            crate::resident::off_shard(move || {
                cold.iter().for_each(crate::resident::read_into_cache);
                // Every span starts at a batch (a mark): walking its headers to the end reads
                // each through the mapping, faulting its page in on this thread, not the
                // shard's. `black_box` keeps the optimizer from dropping a walk whose result
                // nobody uses.
                for span in &long {
                    crate::index::scan(span, 0, |e| {
                        std::hint::black_box(e);
                        false
                    });
                }
            })
            .await;
        }
    }

    pub(super) fn read_below(
        &self,
        offset: i64,
        max_bytes: usize,
        bound: i64,
    ) -> Result<ReadOutcome, StorageError> {
        let st = self.state.borrow();
        let (end, start) = (st.log_end_offset, st.log_start_offset);
        let hw = bound.min(end);
        if offset < start || offset > end {
            return Err(StorageError::OffsetOutOfRange {
                offset,
                log_start: start,
                log_end: end,
            });
        }
        let outcome = |records: Bytes| ReadOutcome {
            records,
            high_watermark: hw,
            log_start_offset: start,
        };
        if offset >= hw {
            return Ok(outcome(Bytes::new()));
        }
        for (seg, sealed) in st.segments_from(offset) {
            let Some(data) = seg.data(sealed)? else {
                continue;
            };
            let Some(first) = seg.index.find(&data, offset) else {
                continue;
            };
            // Whole batches from there while they fit in `max_bytes` (at least one), none at or
            // past the bound (which is always a batch boundary: a write's end).
            let from = first.position as usize;
            let mut limit = first.position.saturating_add(max_bytes as u64);
            if seg.index.last().is_some_and(|l| l.last_offset >= hw) {
                if let Some(b) = seg.index.find(&data, hw) {
                    limit = limit.min(b.position);
                }
            }
            let end = seg.index.end_within(&data, first.end_position(), limit) as usize;
            seg.note_read(from, end);
            return Ok(outcome(data.slice(from..end)));
        }
        Ok(outcome(Bytes::new()))
    }

    /// Waits until the high watermark passes `offset` or `timeout` elapses.
    /// A signal for a long poll that does not hold the log: `None` if there is data past
    /// `offset` already; otherwise a receiver that completes when there is (or with an error
    /// when the log is closed first — then the caller looks again).
    pub fn data_signal(&self, offset: i64) -> Option<futures::channel::oneshot::Receiver<()>> {
        if self.high_watermark() > offset {
            return None;
        }
        let (tx, rx) = futures::channel::oneshot::channel();
        self.data_waiters.borrow_mut().push(tx);
        Some(rx)
    }

    /// Returns once there is data past `offset`, or after `timeout`.
    pub async fn wait_for_data(&self, offset: i64, timeout: Duration) {
        let Some(rx) = self.data_signal(offset) else {
            return;
        };
        future::or(
            async {
                let _ = rx.await;
            },
            async {
                glommio::timer::sleep(timeout).await;
            },
        )
        .await;
    }

    /// ListOffsets by timestamp: the first record whose timestamp is at or after `timestamp`.
    /// The batch index finds the batch (its max timestamp is the first to reach the target);
    /// the batch's records (decompressed if need be) then give the exact offset.
    pub async fn offset_for_timestamp(
        &self,
        timestamp: i64,
    ) -> Result<Option<TimestampLookup>, StorageError> {
        let start = self.log_start_offset();
        let Some((e, bytes)) = self.find_batch(
            |index| index.newest_timestamp() >= Some(timestamp),
            |index, data| index.find_timestamp(data, timestamp),
        )?
        else {
            return Ok(None);
        };
        let mut scratch = Vec::new();
        // In a LogAppendTime batch every record has the batch's time, which reached the
        // target: the first record is the answer (below), not the first whose own timestamp,
        // one no consumer sees, does.
        let exact = (!stamped_on_append(&bytes))
            .then(|| compaction::records_in(&bytes, &mut scratch))
            .flatten()
            .and_then(|recs| {
                recs.into_iter()
                    .find(|r| r.timestamp >= timestamp && r.offset >= start)
                    .map(|r| (r.offset, r.timestamp))
            });
        Ok(Some(match exact {
            Some((offset, timestamp)) => TimestampLookup {
                offset,
                timestamp,
                leader_epoch: e.leader_epoch,
            },
            None => TimestampLookup {
                offset: e.base_offset.max(start),
                timestamp: e.max_timestamp,
                leader_epoch: e.leader_epoch,
            },
        }))
    }

    /// ListOffsets MAX_TIMESTAMP: the first record carrying the largest timestamp (as Kafka
    /// records it), found inside the batch with the largest max timestamp.
    pub async fn max_timestamp(&self) -> Result<Option<TimestampLookup>, StorageError> {
        let newest = {
            let st = self.state.borrow();
            st.segments
                .iter()
                .filter_map(|s| s.index.newest())
                .max_by_key(|&(ts, base)| (ts, std::cmp::Reverse(base)))
        };
        let Some((_, base)) = newest else {
            return Ok(None);
        };
        let Some((e, bytes)) = self.find_batch(
            |index| index.last().is_some_and(|l| l.last_offset >= base),
            |index, data| index.find(data, base),
        )?
        else {
            return Ok(None);
        };
        if stamped_on_append(&bytes) {
            // Every record carries the batch's time: the first is the first to carry it.
            return Ok(Some(TimestampLookup {
                offset: e.base_offset.max(self.log_start_offset()),
                timestamp: e.max_timestamp,
                leader_epoch: e.leader_epoch,
            }));
        }
        let mut scratch = Vec::new();
        let exact = compaction::records_in(&bytes, &mut scratch)
            .and_then(|recs| recs.into_iter().find(|r| r.timestamp == e.max_timestamp))
            .map(|r| r.offset);
        Ok(Some(TimestampLookup {
            offset: exact.unwrap_or(e.last_offset),
            timestamp: e.max_timestamp,
            leader_epoch: e.leader_epoch,
        }))
    }

    /// The first batch, over the segments in order, that `lookup` finds in a segment's index
    /// and data, with its bytes. Only segments that `may_hold` accepts from their index alone
    /// are mapped.
    pub(super) fn find_batch(
        &self,
        may_hold: impl Fn(&BatchIndex) -> bool,
        lookup: impl Fn(&BatchIndex, &[u8]) -> Option<BatchEntry>,
    ) -> Result<Option<(BatchEntry, Bytes)>, StorageError> {
        let st = self.state.borrow();
        let last = st.segments.len() - 1;
        for (k, seg) in st.segments.iter().enumerate() {
            if !may_hold(&seg.index) {
                continue;
            }
            let Some(data) = seg.data(k < last)? else {
                continue;
            };
            if let Some(e) = lookup(&seg.index, &data) {
                let bytes = data.slice(e.position as usize..e.end_position() as usize);
                return Ok(Some((e, bytes)));
            }
        }
        Ok(None)
    }

    /// OffsetForLeaderEpoch, with the semantics of Kafka's leader-epoch cache (see
    /// [`crate::epoch_cache::end_offset_for`]): `(epoch, end offset)`, or `(-1, -1)`.
    pub fn end_offset_for_epoch(&self, epoch: i32) -> (i32, i64) {
        let st = self.state.borrow();
        let runs = st
            .segments
            .iter()
            .flat_map(|seg| seg.index.epochs().iter().copied());
        crate::epoch_cache::end_offset_for(runs, st.epoch, st.log_end_offset, epoch)
    }
}

/// Whether the stored batch `bytes` was stamped with the broker's append time
/// (`message.timestamp.type=LogAppendTime`).
fn stamped_on_append(bytes: &[u8]) -> bool {
    kaas_wire::batch::peek_header(bytes).is_ok_and(|h| h.is_log_append_time())
}

/// A read-only mapping of the first `len` bytes of a file that may still grow (the active
/// segment). Appends only extend the file and it is never truncated while open, so the mapped
/// prefix stays valid.
pub(super) fn map_prefix(path: &Path, len: u64) -> Result<Option<Bytes>, StorageError> {
    if len == 0 {
        return Ok(None);
    }
    let file = std::fs::File::open(path)
        .map_err(|e| StorageError::io("opening segment for mapping", path, e))?;
    // SAFETY: read-only mapping of bytes that are never modified or truncated while mapped.
    let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(&file) }
        .map_err(|e| StorageError::io("mapping segment", path, e))?;
    Ok(Some(Bytes::from_owner(map)))
}

impl State {
    /// The segments that may hold `offset`, in order, each with whether it is sealed: from the
    /// one whose base is at or below it, those with a batch ending at or after it (compaction
    /// can leave a segment's tail, or a whole segment, without the offsets its name suggests).
    fn segments_from(&self, offset: i64) -> impl Iterator<Item = (&Segment, bool)> {
        let first = self
            .segments
            .partition_point(|s| s.base_offset <= offset)
            .saturating_sub(1);
        let last = self.segments.len() - 1;
        self.segments
            .iter()
            .enumerate()
            .skip(first)
            .filter(move |(_, s)| s.index.last().is_some_and(|l| l.last_offset >= offset))
            .map(move |(k, s)| (s, k < last))
    }
}
