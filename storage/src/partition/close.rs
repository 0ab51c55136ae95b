//! Closing a partition: what its close keeps for the next leader, and removal.

use super::*;

impl PartitionLog {
    /// Flushes and records a clean shutdown. Later appends fail with [`StorageError::Closed`].
    pub async fn close(&self) -> Result<(), StorageError> {
        // Set before the first await: a caller that stopped serving the partition and then
        // called this has made `kept_by_close` wait for the outcome.
        self.close_started.set(true);
        let _finished = CloseFinished(&self.close_finished);
        let _permit = self
            .write_lock
            .acquire_permit(1)
            .await
            .map_err(|_| StorageError::Closed)?;
        if self.closed.replace(true) {
            return Ok(());
        }
        let (file, path) = {
            let st = self.state.borrow();
            let seg = st.segments.last().expect("active segment");
            (seg.file().clone(), seg.path.clone())
        };
        self.trim_preallocation().await?;
        if !self.dir.exists() {
            // The topic was deleted while the log was open: nothing left to make durable.
            return Ok(());
        }
        if self.config.borrow().sync_scope == SyncScope::File {
            crate::sync_failure::fdatasync_segment(&file, &path).await?;
        } else {
            // Also covers segments rolled but not yet sealed, which the snapshot below counts.
            crate::fs_sync::sync_filesystem(&self.dir).await?;
        }
        let _turn = self
            .seal_lock
            .acquire_permit(1)
            .await
            .map_err(|_| StorageError::Closed)?;
        // Nothing to save over a newer leader's files (cluster mode: this broker was deposed
        // and another one took the partition over at a higher epoch).
        let epoch = self.state.borrow().epoch;
        if crate::stored_leader_epoch(&self.dir).is_ok_and(|stored| stored > epoch) {
            tracing::warn!(dir = %self.dir.display(), epoch, "not saving index and producer state on close: a newer leader epoch owns this partition");
            return Ok(());
        }
        let snapshot = {
            let st = self.state.borrow();
            let active = st.segments.last().expect("active segment");
            index::file::save(&active.path, &active.index);
            ProducerSnapshot {
                offset: st.log_end_offset,
                epoch: Some(st.epoch),
                table: st.producers.clone(),
            }
        };
        self.store_snapshot(&snapshot)?;
        self.closed_end.set(Some(snapshot.offset));
        // No manifest write: nothing in it changed, and a clean shutdown is recognised by the
        // active segment's saved index (deleted again on every open).
        Ok(())
    }

    /// Whether every offset below `end_offset` is in the state a finished [`Self::close`]
    /// synced and saved for the next leader (waits for a close in progress). A write that
    /// completed before its partition was handed over in order is then kept by the next
    /// leader, so it may still be acknowledged (cluster mode, with the fence held throughout;
    /// see `shard::handlers::produce`). Refusing it instead told librdkafka the write was
    /// not persisted, and an epoch bump then sent the records again under new sequence
    /// numbers: stored twice.
    pub async fn kept_by_close(&self, end_offset: i64) -> bool {
        if !self.close_started.get() {
            return false;
        }
        // Ends (with an error) once the close has finished and closed the semaphore. Not the
        // write lock: glommio's semaphore lets a new caller take a released permit before
        // the waiter it woke, so a close queued for it could still come second.
        let _ = self.close_finished.acquire_permit(1).await;
        self.closed_end.get().is_some_and(|end| end_offset <= end)
    }

    /// The end offset a finished [`Self::close`] saved, if it did (no waiting).
    pub fn closed_end(&self) -> Option<i64> {
        self.closed_end.get()
    }

    /// Stops this handle from touching its directory again, without syncing or saving
    /// anything: what a crash leaves behind. For tests that reopen a log in the same process,
    /// so that background work still holding the old handle (a pending seal) stays out.
    pub fn abandon(&self) {
        self.closed.set(true);
        self.write_lock.close();
    }

    /// Closes the log and removes its directory (DeleteTopics).
    pub async fn remove(&self) -> Result<(), StorageError> {
        self.closed.set(true);
        self.write_lock.close();
        std::fs::remove_dir_all(&self.dir)
            .map_err(|e| StorageError::io("removing partition directory", &self.dir, e))
    }
}
