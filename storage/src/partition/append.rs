//! The write path: sequence checks, offsets, the write to the active segment, zero-fill ahead
//! of the data, rolling and sealing segments.

use super::*;

impl PartitionLog {
    /// Appends a produced record set (already verified by `kaas_wire::batch`, one header per
    /// batch in `headers`). Offsets are assigned here, and each batch is stored with its base
    /// offset and leader epoch rewritten: up to `INLINE_WRITE_MAX_BYTES` straight from
    /// `records` (see `write_inline`), larger ones through a copy. Returns when the write has
    /// completed (not yet durable; see [`PartitionLog::wait_durable`]).
    ///
    /// A retried batch from an idempotent producer is not written again: the original offsets
    /// are returned as [`AppendOutcome::Duplicate`].
    pub async fn append(
        self: &Rc<Self>,
        records: &[u8],
        headers: &[BatchHeader],
        epoch: LeaderEpoch,
    ) -> Result<AppendOutcome, StorageError> {
        self.append_at(records, headers, epoch, None).await
    }

    /// [`Self::append`], stamping every batch with `log_append_time_ms` when given (a topic
    /// with `message.timestamp.type=LogAppendTime`; see `batch::set_log_append_time`).
    #[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
    pub async fn append_at(
        self: &Rc<Self>,
        records: &[u8],
        headers: &[BatchHeader],
        epoch: LeaderEpoch,
        log_append_time_ms: Option<i64>,
    ) -> Result<AppendOutcome, StorageError> {
        let _permit = self
            .write_lock
            .acquire_permit(1)
            .await
            .map_err(|_| StorageError::Closed)?;
        if self.closed.get() {
            return Err(StorageError::Closed);
        }
        // Nothing more is written once a sync has failed (see `sync_failure`).
        crate::sync_failure::check(&self.dir)?;
        let current = self.state.borrow().epoch;
        if epoch.0 < current {
            return Err(StorageError::FencedLeaderEpoch {
                got: epoch.0,
                current,
            });
        }
        // Producer checks for every batch before anything is written.
        {
            let st = self.state.borrow();
            for h in headers {
                if let ProducerCheck::Duplicate {
                    base_offset,
                    last_offset,
                } = st.producers.check(h)?
                {
                    if headers.len() == 1 {
                        return Ok(AppendOutcome::Duplicate {
                            base_offset,
                            last_offset,
                        });
                    }
                }
            }
        }
        self.roll(records.len() as u64, false).await?;

        let (base_offset, position, file, path) = {
            let st = self.state.borrow();
            let seg = st
                .segments
                .last()
                .expect("a log always has an active segment");
            (
                st.log_end_offset,
                seg.size,
                seg.file().clone(),
                seg.path.clone(),
            )
        };
        let mut entries = Vec::with_capacity(headers.len());
        let mut at = 0usize;
        let mut next = base_offset;
        for h in headers {
            let len = h.total_len();
            entries.push(BatchEntry {
                base_offset: next,
                last_offset: next + h.last_offset_delta as i64,
                position: position + at as u64,
                len: len as u32,
                max_timestamp: log_append_time_ms.unwrap_or(h.max_timestamp),
                leader_epoch: current,
            });
            next += h.last_offset_delta as i64 + 1;
            at += len;
        }
        let total = at;
        debug_assert_eq!(total, records.len(), "the headers cover the record set");
        // Zeros ahead of the data spare a per-file fdatasync its metadata commit. A syncfs
        // commits the journal once for every partition anyway, and there the zeros only cost
        // a second pass over fresh page-cache pages: measured 2026-11-30, 100 partitions,
        // acks=1 437k msg/s with zeros, 537k without; acks=all the same rate, p99 187 vs 113 ms.
        let zero_fill = self.config.borrow().sync_scope == SyncScope::File;
        if zero_fill {
            self.preallocate(&file, &path, position + total as u64)
                .await?;
        }
        let written = if log_append_time_ms.is_none()
            && total <= INLINE_WRITE_MAX_BYTES
            && headers.len() <= INLINE_WRITE_MAX_BATCHES
        {
            write_inline(&file, records, &entries, current, position).map_err(|e| {
                crate::sync_failure::note_write_error(&path, &e);
                StorageError::io("writing segment", &path, e)
            })?
        } else {
            // Large appends, and LogAppendTime (which rewrites CRC-covered bytes), go through a
            // copy handed to io_uring.
            let mut buf = records.to_vec();
            for e in &entries {
                let from = (e.position - position) as usize;
                batch::set_base_offset(&mut buf[from..], e.base_offset);
                batch::set_partition_leader_epoch(&mut buf[from..], current);
                if let Some(now) = log_append_time_ms {
                    batch::set_log_append_time(&mut buf[from..from + e.len as usize], now);
                }
            }
            file.write_at(buf, position).await.map_err(|e| {
                let e = std::io::Error::from(e);
                crate::sync_failure::note_write_error(&path, &e);
                StorageError::io("writing segment", &path, e)
            })?
        };
        if written != total {
            // A short write (disk full): cut the partial bytes so the file holds whole batches.
            let _ = file.truncate(position).await;
            return Err(StorageError::io(
                "writing segment",
                &path,
                format!("short write: {written} of {total} bytes (is the volume full?)"),
            ));
        }
        {
            let mut st = self.state.borrow_mut();
            for (h, e) in headers.iter().zip(&entries) {
                st.producers.record(
                    h,
                    e.base_offset,
                    log_append_time_ms.unwrap_or(h.max_timestamp),
                );
            }
            let seg = st.segments.last_mut().expect("active segment");
            seg.size += total as u64;
            for e in entries {
                seg.index.push(e);
            }
            st.log_end_offset = next;
        }
        self.appended_bytes
            .set(self.appended_bytes.get() + total as u64);
        self.schedule_flush(next);
        if zero_fill {
            self.fill_ahead(file, path, position + total as u64);
        }
        Ok(AppendOutcome::Appended {
            base_offset,
            last_offset: next - 1,
        })
    }

    /// Makes sure the active segment's file extends past `end` with zeros already written.
    /// Used in the file sync scope only (see `append`).
    ///
    /// Why zeros and not `fallocate`: an fdatasync after a write that grows the file (or turns
    /// an unwritten extent into a written one) must also commit metadata through the journal;
    /// a write over blocks already written commits only data. Measured here with 64 KiB writes:
    /// appending ~180-220 fdatasyncs/s, fallocated space about the same, zero-filled space
    /// ~280-410. So the active segment is filled with zeros a step ahead of its data
    /// (one metadata commit per step instead of per write). The zeros are cut off when the
    /// segment is sealed or closed, and recovery drops them after a crash.
    ///
    /// Appends call it only when they would run past the zeros; normally the next step has
    /// already been written in the background by [`Self::fill_ahead`]. Written inline, the
    /// steps of many partitions filling at the same rate came due together and stalled every
    /// one of them at once (acks=1 p99 of 1–2 s at 100 partitions).
    pub(super) async fn preallocate(
        &self,
        file: &glommio::io::BufferedFile,
        path: &Path,
        end: u64,
    ) -> Result<(), StorageError> {
        let ready = {
            let st = self.state.borrow();
            let seg = st.segments.last().expect("active segment");
            end <= seg.allocated.get().max(seg.size)
        };
        if ready {
            // The common case: zeros are already there; do not queue behind a background fill.
            return Ok(());
        }
        let _fill = self
            .fill_lock
            .acquire_permit(1)
            .await
            .map_err(|_| StorageError::Closed)?;
        let (allocated, size, cap) = {
            let st = self.state.borrow();
            let seg = st.segments.last().expect("active segment");
            if self.closed.get() || *seg.path != *path {
                // Closed, or rolled since this fill was asked for: nothing to fill.
                return Ok(());
            }
            (
                seg.allocated.get().max(seg.size),
                seg.size,
                self.config.borrow().segment_bytes,
            )
        };
        if end <= allocated {
            return Ok(());
        }
        // The step grows with what the segment already holds, so thousands of quiet
        // partitions do not each reserve megabytes of zeros.
        let step = size.clamp(PREALLOCATE_MIN_BYTES, PREALLOCATE_MAX_BYTES);
        let target = end.max((allocated + step).min(cap.max(end)));
        let zeros = vec![0u8; (target - allocated) as usize];
        let n = zeros.len();
        let written = file
            .write_at(zeros, allocated)
            .await
            .map_err(|e| StorageError::io("preallocating segment", path, e))?;
        let st = self.state.borrow();
        st.segments
            .last()
            .expect("active segment")
            .allocated
            .set(allocated + written.min(n) as u64);
        Ok(())
    }

    /// Starts writing the next step of zeros in the background once less than half a step is
    /// left ahead of `end` (the end of the data just appended), so appends rarely wait for one.
    /// The fill writes only past the region appends may use, and appends that do run past it
    /// wait for the fill through [`Self::preallocate`].
    pub(super) fn fill_ahead(
        self: &Rc<Self>,
        file: Rc<glommio::io::BufferedFile>,
        path: Rc<Path>,
        end: u64,
    ) {
        let (allocated, size) = {
            let st = self.state.borrow();
            let seg = st.segments.last().expect("active segment");
            (seg.allocated.get().max(seg.size), seg.size)
        };
        let step = size.clamp(PREALLOCATE_MIN_BYTES, PREALLOCATE_MAX_BYTES);
        if self.filling.get() || allocated.saturating_sub(end) >= step / 2 {
            return;
        }
        self.filling.set(true);
        let log = self.clone();
        glommio::spawn_local(async move {
            if let Err(e) = log.preallocate(&file, &path, allocated + 1).await {
                // Not fatal: the next append fills inline and reports the error if it persists.
                tracing::warn!(path = %path.display(), error = %e, "writing zeros ahead of the active segment failed");
            }
            log.filling.set(false);
        })
        .detach();
    }

    /// Cuts the zeros written ahead of the active segment's data (before it is sealed or
    /// closed), so a sealed file is exactly its batches.
    pub(super) async fn trim_preallocation(&self) -> Result<(), StorageError> {
        let _fill = self
            .fill_lock
            .acquire_permit(1)
            .await
            .map_err(|_| StorageError::Closed)?;
        let (file, path, size, allocated) = {
            let st = self.state.borrow();
            let seg = st.segments.last().expect("active segment");
            (
                seg.file().clone(),
                seg.path.clone(),
                seg.size,
                seg.allocated.get(),
            )
        };
        if allocated > size {
            file.truncate(size)
                .await
                .map_err(|e| StorageError::io("trimming segment", &path, e))?;
            let st = self.state.borrow();
            st.segments
                .last()
                .expect("active segment")
                .allocated
                .set(size);
        }
        Ok(())
    }

    /// Starts a new segment when the active one is full or old, or was written at an older
    /// leader epoch, or (`retire`: retention deletes it) whenever it holds anything.
    ///
    /// A rolled segment is sealed (its saved index and the producer snapshot as of its end,
    /// which let the next open skip scanning it) only once its bytes are on disk: a saved index
    /// over bytes a crash lost would be trusted, and a snapshot counting lost batches would
    /// answer a producer's retry of them as a duplicate.
    ///
    /// In the file sync scope the old segment is fsynced and sealed before the new one starts,
    /// so durability waiters never depend on a file the flusher no longer watches. In the
    /// filesystem scope every syncfs covers the old segment anyway, so the append goes on at
    /// once and the fsync and seal follow in the background; retention then keeps a segment
    /// until a snapshot past it is stored (see `removable`). Inline, the fsync stalled every
    /// request touching a rolling partition: 1,000 partitions with 4 MiB segments, acks=1
    /// p99 406 ms / p99.9 1,024 ms, against 123–275 / 435–540 ms in the background.
    #[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
    pub(super) async fn roll(
        self: &Rc<Self>,
        incoming: u64,
        retire: bool,
    ) -> Result<(), StorageError> {
        let (need, epoch_changed, old_file, old_path, next, epoch) = {
            let st = self.state.borrow();
            let cfg = self.config.borrow();
            let seg = st.segments.last().expect("active segment");
            // Past 4 GiB or 2^31 offsets the index's 32-bit relative marks would not fit (a
            // batch adds fewer than 2^31 offsets, so the segment stays under 2^32).
            let at_limit = seg.size > 0
                && (seg.size + incoming > u64::from(u32::MAX)
                    || st.log_end_offset - seg.base_offset > i64::from(i32::MAX));
            let configured = seg.size > 0
                && (seg.size + incoming > cfg.segment_bytes
                    || seg.opened_at.elapsed() > Duration::from_millis(cfg.segment_ms));
            let epoch_changed = seg.epoch < st.epoch;
            let capped = configured && st.segments.len() >= cfg.max_segments;
            if capped && !self.segment_cap_reported.replace(true) {
                tracing::warn!(
                    dir = %self.dir.display(),
                    segments = st.segments.len(),
                    segment_bytes = cfg.segment_bytes,
                    segment_ms = cfg.segment_ms,
                    "partition has as many segment files as one log may hold open (a share of --max-open-log-files): its active segment grows past segment.bytes/segment.ms until retention or compaction removes old segments; raise segment.bytes or segment.ms for this topic"
                );
            }
            (
                at_limit || epoch_changed || (configured && !capped) || (retire && seg.size > 0),
                epoch_changed,
                seg.file().clone(),
                seg.path.clone(),
                st.log_end_offset,
                st.epoch,
            )
        };
        if !need {
            return Ok(());
        }
        self.trim_preallocation().await?;
        let snapshot = ProducerSnapshot {
            offset: next,
            epoch: Some(self.state.borrow().epoch),
            table: self.state.borrow().producers.clone(),
        };
        let scope = self.config.borrow().sync_scope;
        if scope == SyncScope::File {
            crate::sync_failure::fdatasync_segment(&old_file, &old_path).await?;
            self.seal(&old_path, snapshot).await?;
        } else {
            // Weak: a log dropped or closed before the fsync returns is not sealed (`close`
            // stores the newest snapshot itself; a dropped log's files may have a new owner).
            let log = Rc::downgrade(self);
            glommio::spawn_local(async move {
                let synced = {
                    let _slot = fsync_slot().await;
                    crate::sync_failure::fdatasync_segment(&old_file, &old_path).await
                };
                let Some(log) = log.upgrade() else {
                    return;
                };
                let sealed = match synced {
                    Ok(()) => log.seal(&old_path, snapshot).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = sealed {
                    // Not fatal: a segment without its saved index is scanned and verified at
                    // the next open, and retention waits for a newer snapshot.
                    tracing::warn!(path = %old_path.display(), error = %e, "sealing a rolled segment failed");
                }
            })
            .detach();
        }
        if epoch_changed {
            // The first write under a new leader epoch: record the epoch before the segment
            // named by it exists, so the manifest never lags a segment name.
            let log_start_offset = self.state.borrow().log_start_offset;
            Manifest {
                leader_epoch: epoch,
                log_start_offset,
            }
            .store(&self.dir)?;
        }
        let interval = self.config.borrow().index_interval_bytes;
        // In the filesystem scope the syncfs that makes the first acks=all write in the new
        // segment durable commits its name too.
        let sync_name = scope == SyncScope::File;
        let seg = Segment::create(&self.dir, next, epoch, interval, sync_name).await?;
        let mut st = self.state.borrow_mut();
        if st.segments.last().is_some_and(|s| s.size == 0) {
            // An empty segment (the epoch changed before anything was written) is replaced.
            let empty = st.segments.pop().expect("checked");
            let _ = std::fs::remove_file(&empty.path);
        }
        // Segments are contiguous: each starts where the log ended when it was rolled.
        debug_assert!(
            seg.base_offset == st.log_end_offset
                && st
                    .segments
                    .last()
                    .is_none_or(|l| l.base_offset < seg.base_offset),
            "segment base {} rolled at log end {}",
            seg.base_offset,
            st.log_end_offset
        );
        st.segments.push(seg);
        drop(st);
        crate::stats::add(|s| &s.segment_rolls, 1);
        if scope == SyncScope::File {
            let mut fl = self.flush.borrow_mut();
            fl.durable_end = fl.durable_end.max(next);
        }
        Ok(())
    }

    /// Saves a rolled segment's index (if it is still part of the log) and the producer
    /// snapshot taken when it was rolled; called once the segment's bytes are on disk. The
    /// file writes and renames run on the blocking-thread pool: on the shard's thread, a
    /// thousand partitions rolling 4 MiB segments stalled every request on the shard.
    pub(super) async fn seal(
        &self,
        path: &Path,
        snapshot: ProducerSnapshot,
    ) -> Result<(), StorageError> {
        let _turn = self
            .seal_lock
            .acquire_permit(1)
            .await
            .map_err(|_| StorageError::Closed)?;
        if self.closed.get() {
            // `close` stored the newest snapshot; the segment is scanned at the next open.
            return Ok(());
        }
        let index = {
            let st = self.state.borrow();
            st.segments
                .iter()
                .find(|s| *s.path == *path && s.size > 0)
                .map(|seg| index::file::encode(&seg.index))
        };
        let newer = snapshot.offset >= self.snapshot_stored.get();
        let offset = snapshot.offset;
        let (segment, dir) = (path.to_path_buf(), self.dir.clone());
        glommio::executor()
            .spawn_blocking(move || {
                if let Some(bytes) = index {
                    index::file::save_encoded(&segment, &bytes);
                }
                if newer {
                    snapshot.store(&dir)?;
                }
                Ok::<(), StorageError>(())
            })
            .await?;
        if newer {
            self.snapshot_stored
                .set(self.snapshot_stored.get().max(offset));
        }
        Ok(())
    }

    /// Whether sealed segment `n` may be deleted: the stored producer snapshot must already
    /// cover it. Otherwise a crash would replay producer state from an older snapshot through
    /// a log that no longer holds the batches in between, and an idempotent producer's next
    /// batch would be refused as out of sequence. (A snapshot is stored when the segment after
    /// it was rolled; in the filesystem sync scope that happens in the background.)
    pub(super) fn removable(&self, st: &State, n: usize) -> bool {
        st.segments
            .get(n + 1)
            .is_some_and(|next| next.base_offset <= self.snapshot_stored.get())
    }

    /// Stores a producer snapshot unless a newer one is already stored.
    pub(super) fn store_snapshot(&self, snapshot: &ProducerSnapshot) -> Result<(), StorageError> {
        if snapshot.offset < self.snapshot_stored.get() {
            return Ok(());
        }
        snapshot.store(&self.dir)?;
        self.snapshot_stored.set(snapshot.offset);
        Ok(())
    }
}

/// Appends up to this size are written inline (see [`write_inline`]); larger ones go through
/// io_uring, where a long copy does not hold the shard.
const INLINE_WRITE_MAX_BYTES: usize = 256 << 10;

/// Two iovecs per batch; Linux takes at most 1024 per call.
const INLINE_WRITE_MAX_BATCHES: usize = 512;

/// Writes the produced batches to the segment at `position` with one `pwritev` on the shard's
/// thread, straight from the request's bytes: each batch's first 16 bytes (base offset, length,
/// partition leader epoch — none covered by the CRC) come from a small rewritten copy, the rest
/// from the request as it arrived.
///
/// Why not io_uring here: an ext4 buffered write is punted by io_uring to an io-wq worker
/// thread, and for the small batches clients send to many partitions that hand-off (a worker
/// wake-up and two context switches per append) cost more than the copy into the page cache
/// itself — a third of the broker's CPU went to io-wq workers (profile in bench/README.md).
/// The cost of writing inline is that the shard waits for the copy into the page cache (at
/// most `INLINE_WRITE_MAX_BYTES`), and, when the kernel throttles writers because too much of
/// memory is dirty (`balance_dirty_pages`) or the journal is busy, for that too: every
/// partition on the shard then waits, where io_uring would have parked only this write in a
/// worker. Under such pressure the disk bounds throughput either way; the measured gain
/// without it decided (bench/README.md).
fn write_inline(
    file: &glommio::io::BufferedFile,
    records: &[u8],
    entries: &[BatchEntry],
    epoch: i32,
    position: u64,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    const HEAD: usize = 16;
    // A client's request usually carries one batch per partition: its rewritten heads and
    // iovecs live on the stack, not in two allocations per append.
    const ON_STACK: usize = 4;
    let first = entries.first().map_or(position, |e| e.position);
    let (mut heads_here, mut heads_away) = ([[0u8; HEAD]; ON_STACK], Vec::new());
    let heads = slots(&mut heads_here, &mut heads_away, entries.len());
    for (e, head) in entries.iter().zip(heads.iter_mut()) {
        let at = (e.position - first) as usize;
        head.copy_from_slice(&records[at..at + HEAD]);
        batch::set_base_offset(head, e.base_offset);
        batch::set_partition_leader_epoch(head, epoch);
    }
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let (mut iov_here, mut iov_away) = ([empty; 2 * ON_STACK], Vec::new());
    let iov = slots(&mut iov_here, &mut iov_away, 2 * entries.len());
    for ((e, head), pair) in entries
        .iter()
        .zip(heads.iter())
        .zip(iov.chunks_exact_mut(2))
    {
        let at = (e.position - first) as usize;
        let body = &records[at + HEAD..at + e.len as usize];
        pair[0] = libc::iovec {
            iov_base: head.as_ptr() as *mut libc::c_void,
            iov_len: HEAD,
        };
        pair[1] = libc::iovec {
            iov_base: body.as_ptr() as *mut libc::c_void,
            iov_len: body.len(),
        };
    }
    let mut done = 0usize;
    let total: usize = entries.iter().map(|e| e.len as usize).sum();
    // What is still to write: the iovecs from `next` on, the first of them advanced past
    // what a short write took.
    let mut next = 0usize;
    // A regular file writes all of it unless the volume is full or a signal interrupts; an
    // interrupted call is retried from where it stopped.
    while done < total {
        let rest = &iov[next..];
        // SAFETY: every iovec points into `heads` or `records`, both alive for the call; the
        // fd is the segment's, open for writing.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                rest.as_ptr(),
                rest.len() as libc::c_int,
                (position + done as u64) as libc::off_t,
            )
        };
        match n {
            n if n > 0 => {
                done += n as usize;
                advance(iov, &mut next, n as usize);
            }
            0 => break,
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                if done == 0 {
                    return Err(e);
                }
                break;
            }
        }
    }
    Ok(done)
}

/// `n` slots: the first of `here` when they fit, else `away` grown to `n` copies of `here`'s
/// first.
fn slots<'a, T: Copy, const N: usize>(
    here: &'a mut [T; N],
    away: &'a mut Vec<T>,
    n: usize,
) -> &'a mut [T] {
    if n <= N {
        return &mut here[..n];
    }
    away.resize(n, here[0]);
    away
}

/// Moves past `took` bytes written from `iov[*next..]`: the iovecs written whole are left
/// behind, and the first one left is advanced past what was written of it.
fn advance(iov: &mut [libc::iovec], next: &mut usize, mut took: usize) {
    while *next < iov.len() && took >= iov[*next].iov_len {
        took -= iov[*next].iov_len;
        *next += 1;
    }
    if took > 0 {
        let part = &mut iov[*next];
        debug_assert!(took < part.iov_len, "wrote no more than was given");
        part.iov_base = (part.iov_base as usize + took) as *mut libc::c_void;
        part.iov_len -= took;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // However a write is cut short, what is left to write is exactly the bytes after
        // those written, in order.
        #[test]
        fn a_short_write_leaves_exactly_the_rest(
            lens in proptest::collection::vec(0usize..40, 1..12),
            cuts in proptest::collection::vec(1usize..60, 0..20),
        ) {
            let parts: Vec<Vec<u8>> = lens
                .iter()
                .scan(0u8, |b, &n| Some((0..n).map(|_| { *b = b.wrapping_add(1); *b }).collect()))
                .collect();
            let whole: Vec<u8> = parts.concat();
            let mut iov: Vec<libc::iovec> = parts
                .iter()
                .map(|p| libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() })
                .collect();
            let (mut next, mut written) = (0usize, 0usize);
            for cut in cuts {
                let took = cut.min(whole.len() - written);
                advance(&mut iov, &mut next, took);
                written += took;
                let rest: Vec<u8> = iov[next..]
                    .iter()
                    // SAFETY: each iovec points into `parts`, alive here, within its length.
                    .flat_map(|v| unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) }.to_vec())
                    .collect();
                prop_assert_eq!(&rest[..], &whole[written..]);
            }
        }
    }
}
