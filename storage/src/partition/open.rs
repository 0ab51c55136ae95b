//! Opening a partition: recovery (which segments to scan, the divergence rule for two leaders'
//! files), the producer state it starts from, and the new segment a take-over begins.

use super::*;

impl PartitionLog {
    /// Opens (creating if needed) the partition in `dir`, recovering every segment: each batch
    /// is verified and the log is cut at the first invalid byte before any write is accepted.
    /// `epoch` is the leader epoch to serve at; the stored epoch never goes down, and a higher
    /// one starts a new segment before the first write.
    #[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
    pub async fn open(
        dir: PathBuf,
        config: LogConfig,
        epoch: LeaderEpoch,
    ) -> Result<Rc<PartitionLog>, StorageError> {
        // After a failed sync the page cache may hold batches that never reached the disk, and
        // recovery would read them back as valid: nothing is opened until a restart.
        crate::sync_failure::check(&dir)?;
        // Durably: the topic's and the partition's directory entries are fsynced into their
        // parents, or a power cut can take every fsynced segment inside with them.
        kaas_durable::create_dir_all(&dir)
            .map_err(|e| StorageError::io("creating partition directory", &dir, e))?;
        let stored = Manifest::load(&dir)?;
        let had_manifest = stored.is_some();
        let manifest = stored.unwrap_or_default();
        if had_manifest && legacy_names_present(&dir)? {
            // The manifest is rewritten first, under the key older versions do not read, so
            // that no older broker sharing the volume can open the partition once a segment
            // has its new name (see `Manifest::leader_epoch`).
            manifest.store(&dir)?;
            let renamed = crate::segment::migrate_legacy_names(&dir)?;
            crate::segment::sync_dir(&dir)?;
            tracing::info!(dir = %dir.display(), renamed, "renamed segments to Kafka-style names (<base offset>.<leader epoch>.log)");
        }
        let mut names: Vec<(i64, i32, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| StorageError::io("listing", &dir, e))? {
            let entry = entry.map_err(|e| StorageError::io("listing", &dir, e))?;
            let name = entry.file_name();
            if let Some((base, ep)) = name.to_str().and_then(parse_segment_file_name) {
                names.push((base, ep, entry.path()));
            }
        }
        names.sort();
        // Two leaders may have written this directory (a deposed one after its last fence
        // check): from a higher epoch's first offset on, only that epoch's data is the log.
        let keys: Vec<(i64, i32)> = names.iter().map(|(b, e, _)| (*b, *e)).collect();
        let fates = divergence::plan(&keys);
        // Producer state comes from the last snapshot plus the batches after it; without a
        // snapshot (or with one that holds a deposed leader's superseded batches) every
        // segment is replayed.
        let snapshot = ProducerSnapshot::load(&dir)
            .filter(|s| {
                let epoch = s.epoch.unwrap_or_else(|| {
                    // Written before snapshots carried their epoch: the epoch of the segment
                    // they end in, which is what they were consistent with then.
                    keys.iter()
                        .filter(|(b, _)| *b < s.offset)
                        .map(|(_, e)| *e)
                        .max()
                        .unwrap_or(i32::MAX)
                });
                let ok = divergence::snapshot_consistent(&keys, s.offset, epoch);
                if !ok {
                    tracing::warn!(dir = %dir.display(), offset = s.offset, epoch, "producer-state snapshot holds batches a newer leader epoch superseded; replaying the log instead");
                }
                ok
            })
            .unwrap_or(ProducerSnapshot {
                offset: i64::MIN,
                epoch: None,
                table: ProducerStateTable::default(),
            });
        let replay_from = snapshot.offset;
        let mut producers = snapshot.table;
        let mut segments: Vec<Segment> = Vec::new();
        let mut cut = false;
        for ((base, ep, path), fate) in names.into_iter().zip(fates) {
            let end_before = match fate {
                SegmentFate::Keep { end_before } => end_before,
                SegmentFate::Remove => {
                    tracing::warn!(path = %path.display(), "removing a segment a deposed leader wrote after a newer leader epoch began (never acknowledged)");
                    std::fs::remove_file(&path)
                        .map_err(|e| StorageError::io("removing segment", &path, e))?;
                    let _ = std::fs::remove_file(index::file::path_for(&path));
                    continue;
                }
            };
            if cut {
                // Everything after a corrupt point is unreachable: offsets must be contiguous.
                tracing::warn!(path = %path.display(), "removing segment that follows a truncated one");
                std::fs::remove_file(&path)
                    .map_err(|e| StorageError::io("removing segment", &path, e))?;
                let _ = std::fs::remove_file(index::file::path_for(&path));
                continue;
            }
            // A sealed segment (or the active one after a clean shutdown) with a matching saved
            // index needs no scan, unless it holds batches the producer snapshot lacks. The
            // active segment after a crash is always scanned and verified.
            let len = std::fs::metadata(&path)
                .map_err(|e| StorageError::io("sizing segment", &path, e))?
                .len();
            // The active segment's index exists only if it was written at a clean shutdown
            // after the last open (every open deletes it), and it must match the file's length.
            let saved = index::file::load(&path, len, config.index_interval_bytes);
            let covered = |idx: &BatchIndex| {
                idx.last().is_none_or(|e| {
                    e.last_offset < replay_from && end_before.is_none_or(|end| e.last_offset < end)
                })
            };
            match saved {
                Some(idx) if covered(&idx) => {
                    segments.push(Segment::open_indexed(path, base, ep, idx).await?)
                }
                _ => {
                    let (seg, corrupt) = Segment::open_and_recover(
                        path,
                        base,
                        ep,
                        &mut producers,
                        replay_from,
                        config.index_interval_bytes,
                        end_before,
                    )
                    .await?;
                    cut = corrupt;
                    segments.push(seg);
                }
            }
        }
        if let Some(active) = segments.last() {
            // The active segment's saved index goes stale with the first append.
            let _ = std::fs::remove_file(index::file::path_for(&active.path));
        }
        let stored_epoch = manifest
            .leader_epoch
            .max(segments.last().map(|s| s.epoch).unwrap_or(0));
        let epoch = epoch.0.max(stored_epoch);
        let log_end_offset = segments
            .last()
            .map(|s| s.next_offset())
            .unwrap_or(manifest.log_start_offset);
        let log_start_offset = manifest.log_start_offset.min(log_end_offset).max(
            segments
                .first()
                .map(|s| s.base_offset)
                .unwrap_or(0)
                .min(manifest.log_start_offset),
        );
        if segments.is_empty() {
            segments.push(
                Segment::create(
                    &dir,
                    log_end_offset,
                    epoch,
                    config.index_interval_bytes,
                    true,
                )
                .await?,
            );
        }
        // Written durably only when something changed: an fsync per partition would make
        // opening thousands of partitions take seconds. A raised epoch alone (a cluster
        // take-over raises it for every partition it opens) is only made visible, not synced;
        // the first append under it rolls to a segment named by it and stores the manifest
        // durably then (see `roll`).
        if !had_manifest || log_start_offset != manifest.log_start_offset {
            Manifest {
                leader_epoch: epoch,
                log_start_offset,
            }
            .store(&dir)?;
        } else if epoch > stored_epoch {
            // A take-over's raised epoch is claimed before anything is served, so that two
            // brokers can never write under the same epoch (see `Manifest::store_visible`).
            Manifest {
                leader_epoch: epoch,
                log_start_offset,
            }
            .store_visible(&dir)?;
        }
        let cleaner_checkpoint = load_cleaner_checkpoint(&dir);
        Ok(Rc::new(PartitionLog {
            dir,
            config: RefCell::new(config),
            state: RefCell::new(State {
                segments,
                log_start_offset,
                log_end_offset,
                producers,
                epoch,
            }),
            flush: RefCell::new(Flush {
                durable_end: log_end_offset,
                syncing: false,
                waiters: Vec::new(),
                timer_armed: false,
            }),
            write_lock: Semaphore::new(1),
            fill_lock: Semaphore::new(1),
            filling: Cell::new(false),
            snapshot_stored: Cell::new(replay_from),
            seal_lock: Semaphore::new(1),
            data_waiters: RefCell::new(Vec::new()),
            high_watermark: Cell::new(log_end_offset),
            appended_bytes: Cell::new(0),
            synced_bytes: Cell::new(0),
            closed: Cell::new(false),
            cleaner_checkpoint: Cell::new(cleaner_checkpoint),
            generation: GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            closed_end: Cell::new(None),
            close_started: Cell::new(false),
            close_finished: Semaphore::new(0),
            segment_cap_reported: Cell::new(false),
        }))
    }
}

/// Whether `dir` holds a segment under the name versions before Kafka-style names wrote.
fn legacy_names_present(dir: &std::path::Path) -> Result<bool, StorageError> {
    for entry in std::fs::read_dir(dir).map_err(|e| StorageError::io("listing", dir, e))? {
        let entry = entry.map_err(|e| StorageError::io("listing", dir, e))?;
        if entry
            .file_name()
            .to_str()
            .is_some_and(crate::segment::is_legacy_segment_name)
        {
            return Ok(true);
        }
    }
    Ok(false)
}
