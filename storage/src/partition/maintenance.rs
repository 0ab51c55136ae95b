//! Background maintenance: retention, DeleteRecords and compaction (planned by
//! `compaction::plan_cleaning`, done here).

use super::*;

impl PartitionLog {
    /// Deletes sealed segments past `retention.ms` / `retention.bytes` (when the cleanup
    /// policy includes `delete`) and moves the log start offset past them. Returns how many
    /// segments were removed.
    ///
    /// An active segment that is past retention itself, with every record in it below the
    /// high watermark, is rolled first, as Kafka's `UnifiedLog` rolls it to delete it: it is
    /// sealed, and deleted by this pass or (once its producer snapshot is stored, see
    /// `removable`) the next. Otherwise the last segment of an idle topic outlived its
    /// retention forever, and lowering `retention.ms` to empty a topic, a common operator's
    /// step, deleted nothing of a topic written to less than once a segment.
    pub async fn enforce_retention(self: &Rc<Self>, now_ms: i64) -> Result<usize, StorageError> {
        let cfg = self.config.borrow().clone();
        let retains = cfg.delete_enabled && (cfg.retention_ms >= 0 || cfg.retention_bytes >= 0);
        let below_start = {
            let st = self.state.borrow();
            st.segments.len() > 1 && st.segments[1].base_offset <= st.log_start_offset
        };
        if !retains && !below_start {
            return Ok(0);
        }
        let _permit = self
            .write_lock
            .acquire_permit(1)
            .await
            .map_err(|_| StorageError::Closed)?;
        if retains && self.active_segment_retired(&cfg, now_ms) {
            self.roll(0, true).await?;
        }
        let (removed, manifest) = {
            let mut st = self.state.borrow_mut();
            let mut total: i64 = st.segments.iter().map(|s| s.size as i64).sum();
            let mut n = 0;
            while st.segments.len() - n > 1 && self.removable(&st, n) {
                let seg = &st.segments[n];
                let newest = seg.index.newest_timestamp().unwrap_or(i64::MIN);
                let expired = retains
                    && cfg.retention_ms >= 0
                    && newest < now_ms.saturating_sub(cfg.retention_ms);
                let oversized = retains
                    && cfg.retention_bytes >= 0
                    && total - seg.size as i64 >= cfg.retention_bytes;
                // Left behind by DeleteRecords while its seal was pending.
                let unreachable = st.segments[n + 1].base_offset <= st.log_start_offset;
                if !(expired || oversized || unreachable) {
                    break;
                }
                total -= seg.size as i64;
                n += 1;
            }
            if n == 0 {
                return Ok(0);
            }
            let removed: Vec<Segment> = st.segments.drain(..n).collect();
            let first = st
                .segments
                .first()
                .expect("the active segment remains")
                .base_offset;
            st.log_start_offset = st.log_start_offset.max(first);
            (
                removed,
                Manifest {
                    leader_epoch: st.epoch,
                    log_start_offset: st.log_start_offset,
                },
            )
        };
        // The manifest moves the log start first; unlinking after it is safe, and a reader
        // still holding a removed segment's mapping keeps reading it (an unlinked file's pages
        // stay valid). The manifest's two fsyncs and the unlinks run on the blocking-thread
        // pool: done on the shard's thread, a retention pass over a thousand partitions
        // stalled every request on the shard (p99.9 880 ms with 4 MiB segments).
        let dir = self.dir.clone();
        let paths: Vec<PathBuf> = removed.iter().map(|s| s.path.to_path_buf()).collect();
        let stored = manifest.clone();
        glommio::executor()
            .spawn_blocking(move || {
                stored.store(&dir)?;
                for path in &paths {
                    let _ = std::fs::remove_file(path);
                    let _ = std::fs::remove_file(index::file::path_for(path));
                }
                Ok::<(), StorageError>(())
            })
            .await?;
        tracing::info!(dir = %self.dir.display(), segments = removed.len(), log_start_offset = manifest.log_start_offset, "retention deleted old segments");
        crate::stats::add(|s| &s.retention_segments_deleted, removed.len() as u64);
        crate::stats::add(
            |s| &s.retention_bytes_reclaimed,
            removed.iter().map(|s| s.size).sum(),
        );
        Ok(removed.len())
    }

    /// Whether the active segment holds records, all below the high watermark, and is past
    /// retention as a sealed one would be: its newest record older than `retention.ms`, or
    /// `retention.bytes` 0 (the size rule keeps the newest segments that fit, and the active
    /// one is the newest).
    fn active_segment_retired(&self, cfg: &LogConfig, now_ms: i64) -> bool {
        let st = self.state.borrow();
        let active = st.segments.last().expect("active segment");
        if active.size == 0 || self.high_watermark() < st.log_end_offset {
            return false;
        }
        let newest = active.index.newest_timestamp().unwrap_or(i64::MIN);
        (cfg.retention_ms >= 0 && newest < now_ms.saturating_sub(cfg.retention_ms))
            || cfg.retention_bytes == 0
    }

    /// DeleteRecords: moves the log start offset up to `offset` (never down, never past the
    /// high watermark) and drops segments wholly below it. Returns the new log start offset.
    pub async fn delete_records_before(&self, offset: i64) -> Result<i64, StorageError> {
        let _permit = self
            .write_lock
            .acquire_permit(1)
            .await
            .map_err(|_| StorageError::Closed)?;
        let (new_start, removed, epoch) = {
            let mut st = self.state.borrow_mut();
            if offset > st.log_end_offset || offset < 0 {
                return Err(StorageError::OffsetOutOfRange {
                    offset,
                    log_start: st.log_start_offset,
                    log_end: st.log_end_offset,
                });
            }
            let new_start = offset.max(st.log_start_offset);
            st.log_start_offset = new_start;
            let mut removed = Vec::new();
            // A segment not yet removable stays on disk below the log start; a later
            // retention pass removes it.
            while st.segments.len() > 1
                && st.segments[1].base_offset <= new_start
                && self.removable(&st, 0)
            {
                removed.push(st.segments.remove(0));
            }
            (new_start, removed, st.epoch)
        };
        Manifest {
            leader_epoch: epoch,
            log_start_offset: new_start,
        }
        .store(&self.dir)?;
        for seg in removed {
            // The manifest already says these offsets are gone; unlinking is safe after it.
            let _ = std::fs::remove_file(&seg.path);
        }
        Ok(new_start)
    }

    /// Compacts sealed segments (`cleanup.policy` with `compact`): keeps the latest record of
    /// every key, drops tombstones older than `delete.retention.ms`, leaves segments holding
    /// records newer than `min.compaction.lag.ms` alone, and never touches the active segment.
    /// Compressed batches are decompressed, filtered the same way and compressed again with
    /// their codec. A batch that loses every record is dropped, unless it is its producer's
    /// last, which stays as an empty header so the producer's sequence survives.
    ///
    /// Appends are not blocked: cleaned copies are written beside the segments without the
    /// write lock, which is taken only to swap each copy in (rename over the old file, which
    /// readers holding its mapping keep reading until they drop it). Returns the number of
    /// segments rewritten.
    #[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
    pub async fn compact(&self, now_ms: i64) -> Result<usize, StorageError> {
        let cfg = self.config.borrow().clone();
        if !cfg.compact_enabled || self.closed.get() {
            return Ok(0);
        }
        // 0. Plan from the segment list alone (no IO); nothing is read unless it is worth it.
        let plan = {
            let st = self.state.borrow();
            let summaries: Vec<compaction::SegmentSummary> = st
                .segments
                .iter()
                .map(|s| compaction::SegmentSummary {
                    base_offset: s.base_offset,
                    size: s.size,
                    newest_timestamp: s.index.newest_timestamp(),
                })
                .collect();
            let rules = compaction::CleaningRules {
                now_ms,
                min_compaction_lag_ms: cfg.min_compaction_lag_ms,
                min_cleanable_dirty_ratio: cfg.min_cleanable_dirty_ratio,
            };
            match compaction::plan_cleaning(&summaries, self.cleaner_checkpoint.get(), &rules) {
                Some(plan) => plan,
                None => return Ok(0),
            }
        };
        // 1. Map every segment: the cleanable ones are rewritten; keys are collected from the
        //    dirty ones onwards (the active segment included: a newer value there makes older
        //    ones obsolete). The clean section's keys are unique among themselves already, so
        //    it is only filtered against the map, never read into it.
        let mut views: Vec<(i64, u64, Bytes, bool, i64)> = Vec::new(); // base, size, bytes, cleanable, newest ts
        let mut first_keyed_view = 0;
        {
            let st = self.state.borrow();
            let last = st.segments.len() - 1;
            for (k, seg) in st.segments.iter().enumerate() {
                let bytes = if k < last {
                    seg.mapped()?
                } else {
                    map_prefix(&seg.path, seg.size)?
                };
                if k < plan.first_dirty {
                    first_keyed_view = views.len() + usize::from(bytes.is_some());
                }
                let newest = seg.index.newest_timestamp().unwrap_or(i64::MIN);
                if let Some(bytes) = bytes {
                    views.push((
                        seg.base_offset,
                        seg.size,
                        bytes,
                        k < plan.first_uncleanable,
                        newest,
                    ));
                }
            }
        }
        // The latest offset of every key, and the last batch of every producer (kept, emptied
        // if need be, so that its sequence survives in the log).
        let mut latest: std::collections::HashMap<u128, i64> = std::collections::HashMap::new();
        let mut producer_last: std::collections::HashMap<i64, i64> =
            std::collections::HashMap::new();
        let mut scratch = Vec::new();
        for (v, (_, _, bytes, _, _)) in views.iter().enumerate() {
            let mut at = 0;
            while at < bytes.len() {
                let Ok(h) = batch::peek_header(&bytes[at..]) else {
                    break;
                };
                if h.has_producer_id() {
                    producer_last.insert(h.producer_id, h.last_offset());
                }
                if v < first_keyed_view {
                    // Clean section: only the producers (from the header) are needed.
                    at += h.total_len();
                    continue;
                }
                if let Some(recs) =
                    compaction::records_in(&bytes[at..at + h.total_len()], &mut scratch)
                {
                    for r in recs {
                        if let Some(k) = r.key {
                            latest.insert(compaction::key_digest(k), r.offset);
                        }
                    }
                }
                at += h.total_len();
                glommio::yield_if_needed().await;
            }
        }
        // 2. Rewrite each cleanable segment that loses records.
        let tombstone_horizon = now_ms.saturating_sub(cfg.delete_retention_ms);
        let mut rewritten = 0;
        let mut reclaimed = 0u64;
        for (base, size, bytes, cleanable, newest) in views {
            if !cleanable {
                continue;
            }
            let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
            let mut index = BatchIndex::new(base, cfg.index_interval_bytes);
            let mut at = 0;
            let mut changed = false;
            while at < bytes.len() {
                let Ok(h) = batch::peek_header(&bytes[at..]) else {
                    break;
                };
                let whole = &bytes[at..at + h.total_len()];
                at += h.total_len();
                glommio::yield_if_needed().await;
                let kept: std::borrow::Cow<[u8]> = match compaction::records_in(whole, &mut scratch)
                {
                    None => whole.into(),
                    Some(recs) => {
                        // A producer's last batch stays, if only as an empty header, so that
                        // the producer's sequence and epoch are still in the log after a
                        // restart without a producer snapshot (as Kafka's cleaner does).
                        let producers_last = h.has_producer_id()
                            && producer_last.get(&h.producer_id) == Some(&h.last_offset());
                        if recs.is_empty() && !producers_last {
                            // Emptied earlier for its producer, which has written since.
                            changed = true;
                            continue;
                        }
                        // A key missing from the map was not written since the checkpoint.
                        let keep = |r: &compaction::RecordRef<'_>| match r.key {
                            None => true,
                            Some(k) => {
                                latest
                                    .get(&compaction::key_digest(k))
                                    .is_none_or(|o| *o == r.offset)
                                    && !(r.is_tombstone && newest < tombstone_horizon)
                            }
                        };
                        match compaction::filter_batch(whole, &recs, keep) {
                            compaction::Kept::All => whole.into(),
                            compaction::Kept::None => {
                                changed = true;
                                if !producers_last {
                                    continue;
                                }
                                compaction::empty_batch(whole).into()
                            }
                            compaction::Kept::Some(b) => {
                                changed = true;
                                b.into()
                            }
                        }
                    }
                };
                index.push(BatchEntry {
                    base_offset: h.base_offset,
                    last_offset: h.last_offset(),
                    position: out.len() as u64,
                    len: kept.len() as u32,
                    max_timestamp: h.max_timestamp,
                    leader_epoch: h.partition_leader_epoch,
                });
                out.extend_from_slice(&kept);
            }
            let cleaned = out.len() as u64;
            if changed && self.swap_cleaned(base, size, out, index).await? {
                rewritten += 1;
                reclaimed += size.saturating_sub(cleaned);
            }
        }
        // Everything before the first uncleanable segment is clean now. Recorded only after
        // the rewrites above were swapped in, so a crash before this costs a re-cleaning, never
        // a skipped one.
        self.cleaner_checkpoint.set(plan.new_checkpoint);
        crate::manifest::write_atomically(
            &self.dir.join(CLEANER_CHECKPOINT_FILE),
            format!("{}\n", plan.new_checkpoint).as_bytes(),
        )?;
        if rewritten > 0 {
            tracing::info!(dir = %self.dir.display(), segments = rewritten, bytes_reclaimed = reclaimed, "compacted");
            crate::stats::add(|s| &s.compactions, 1);
            crate::stats::add(|s| &s.compaction_bytes_reclaimed, reclaimed);
        }
        Ok(rewritten)
    }

    /// Writes a cleaned copy of segment `base` and swaps it in, if the segment is still there
    /// with the size it had when it was read.
    pub(super) async fn swap_cleaned(
        &self,
        base: i64,
        size: u64,
        bytes: Vec<u8>,
        index: BatchIndex,
    ) -> Result<bool, StorageError> {
        let path = {
            let st = self.state.borrow();
            match st.segments.iter().find(|s| s.base_offset == base) {
                Some(s) => s.path.clone(),
                None => return Ok(false),
            }
        };
        let tmp = path.with_extension("cleaned");
        let file = glommio::io::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .buffered_open(&tmp)
            .await
            .map_err(|e| StorageError::io("creating cleaned segment", &tmp, e))?;
        let len = bytes.len();
        if len > 0 {
            let n = file
                .write_at(bytes, 0)
                .await
                .map_err(|e| StorageError::io("writing cleaned segment", &tmp, e))?;
            if n != len {
                let _ = std::fs::remove_file(&tmp);
                return Err(StorageError::io(
                    "writing cleaned segment",
                    &tmp,
                    format!("short write: {n} of {len} bytes (is the volume full?)"),
                ));
            }
        }
        file.fdatasync()
            .await
            .map_err(|e| StorageError::io("fsyncing cleaned segment", &tmp, e))?;
        let _permit = self
            .write_lock
            .acquire_permit(1)
            .await
            .map_err(|_| StorageError::Closed)?;
        let mut st = self.state.borrow_mut();
        let last = st.segments.len() - 1;
        let Some(k) = st.segments.iter().position(|s| s.base_offset == base) else {
            let _ = std::fs::remove_file(&tmp);
            return Ok(false);
        };
        if k == last || st.segments[k].size != size {
            let _ = std::fs::remove_file(&tmp);
            return Ok(false);
        }
        // Rename over the old file: readers holding its mapping keep the old inode; new reads
        // see the cleaned one. The directory fsync makes the swap survive a crash. The old
        // index goes first, so a crash in between leaves none rather than a stale one.
        let _ = std::fs::remove_file(index::file::path_for(&path));
        std::fs::rename(&tmp, &path)
            .map_err(|e| StorageError::io("renaming cleaned segment", &path, e))?;
        crate::segment::sync_dir(&self.dir)?;
        index::file::save(&path, &index);
        let seg = &mut st.segments[k];
        seg.replace_file(file);
        seg.size = len as u64;
        seg.index = index;
        Ok(true)
    }
}

/// Where compaction stopped last time (see `PartitionLog::cleaner_checkpoint`).
pub(super) const CLEANER_CHECKPOINT_FILE: &str = "cleaner-checkpoint";

/// The persisted cleaner checkpoint; 0 (nothing clean) when missing or unreadable, which costs a
/// full cleaning, never a wrong one.
pub(super) fn load_cleaner_checkpoint(dir: &Path) -> i64 {
    std::fs::read_to_string(dir.join(CLEANER_CHECKPOINT_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}
