//! Durability: `wait_durable` and the group-commit flusher that serves it.

use super::*;

impl PartitionLog {
    /// Returns once every offset below `end_offset` is durable. One fdatasync serves all waiters
    /// whose writes completed before it started (group commit).
    pub async fn wait_durable(self: &Rc<Self>, end_offset: i64) -> Result<(), StorageError> {
        let (rx, start) = {
            let mut fl = self.flush.borrow_mut();
            if fl.durable_end >= end_offset {
                return Ok(());
            }
            crate::sync_failure::check(&self.dir)?;
            let (tx, rx) = futures::channel::oneshot::channel();
            fl.waiters.push((end_offset, tx));
            let start = !fl.syncing;
            fl.syncing = true;
            (rx, start)
        };
        if start {
            // Spawned with `flush` released: glommio polls a new task at once, and a sync
            // that fails before its first await would find `flush` still borrowed.
            let me = self.clone();
            glommio::spawn_local(async move { me.sync_loop().await }).detach();
        }
        // Watchdog: a hung fsync fails the requests waiting on it (the client retries or
        // reports KAFKA_STORAGE_ERROR) instead of holding them forever. The fsync itself keeps
        // running; later waiters are served when it returns.
        let timeout = Duration::from_millis(self.config.borrow().fsync_timeout_ms);
        let path = self.dir.clone();
        future::or(
            async { rx.await.unwrap_or(Err(StorageError::Closed)) },
            async move {
                glommio::timer::sleep(timeout).await;
                Err(StorageError::io(
                    "fsync",
                    &path,
                    format!(
                        "fdatasync did not complete within {} ms; the disk may be failing",
                        timeout.as_millis()
                    ),
                ))
            },
        )
        .await
    }

    /// Makes sure data written without an acks=all waiter reaches disk: at once when
    /// `flush.messages` are pending, otherwise within `flush.ms`.
    pub(super) fn schedule_flush(self: &Rc<Self>, end: i64) {
        let (flush_ms, flush_messages) = {
            let c = self.config.borrow();
            (c.flush_ms, c.flush_messages)
        };
        let mut fl = self.flush.borrow_mut();
        let pending = (end - fl.durable_end).max(0) as u64;
        if pending >= flush_messages {
            drop(fl);
            let me = self.clone();
            glommio::spawn_local(async move {
                let _ = me.wait_durable(end).await;
            })
            .detach();
            return;
        }
        if fl.timer_armed || flush_ms == u64::MAX {
            return;
        }
        fl.timer_armed = true;
        drop(fl);
        let me = self.clone();
        glommio::spawn_local(async move {
            glommio::timer::sleep(Duration::from_millis(flush_ms)).await;
            me.flush.borrow_mut().timer_armed = false;
            if me.closed.get() {
                return;
            }
            let end = me.log_end_offset();
            if let Err(e) = me.wait_durable(end).await {
                // After a failed sync every partition's flush fails the same way, and that
                // was said once already (`sync_failure`).
                if crate::sync_failure::failure().is_none() {
                    tracing::error!(dir = %me.dir.display(), error = %e, "periodic flush failed");
                }
            }
        })
        .detach();
    }

    pub(super) async fn sync_loop(self: Rc<Self>) {
        loop {
            // The target is captured with the file before the fsync starts: only writes that
            // completed by now are covered by it.
            let (target, file, path) = {
                let st = self.state.borrow();
                let seg = st.segments.last().expect("active segment");
                (st.log_end_offset, seg.file().clone(), seg.path.clone())
            };
            let appended = self.appended_bytes.get();
            let scope = self.config.borrow().sync_scope;
            let result = match scope {
                SyncScope::File => {
                    let _slot = fsync_slot().await;
                    let started = std::time::Instant::now();
                    let result = crate::sync_failure::fdatasync_segment(&file, &path).await;
                    crate::stats::counted_sync(started, result.is_ok());
                    result
                }
                // Counted where the one syncfs for the shard's partitions runs.
                SyncScope::Filesystem => crate::fs_sync::sync_filesystem(&self.dir).await,
            };
            let mut fl = self.flush.borrow_mut();
            if let Err(e) = crate::sync_failure::check(&self.dir) {
                // A sync failed (this one or another partition's): nothing more becomes
                // durable, so every waiter fails now instead of waiting for a sync that would
                // prove nothing.
                for (_, w) in std::mem::take(&mut fl.waiters) {
                    let _ = w.send(Err(e.clone()));
                }
                fl.syncing = false;
                return;
            }
            if result.is_ok() {
                fl.durable_end = fl.durable_end.max(target);
                let synced = self.synced_bytes.get();
                if appended > synced {
                    self.synced_bytes.set(appended);
                    crate::stats::add(|s| &s.synced_bytes, appended - synced);
                }
            }
            // Nothing is durable that was not written (the target was read from the log end).
            debug_assert!(
                fl.durable_end <= self.state.borrow().log_end_offset,
                "durable end {} past the log end {}",
                fl.durable_end,
                self.state.borrow().log_end_offset
            );
            let durable = fl.durable_end;
            let waiters = std::mem::take(&mut fl.waiters);
            for (end, w) in waiters {
                if end <= durable {
                    let _ = w.send(Ok(()));
                } else if end <= target {
                    let _ = w.send(result.clone());
                } else {
                    fl.waiters.push((end, w));
                }
            }
            if fl.waiters.is_empty() {
                fl.syncing = false;
                return;
            }
        }
    }
}

/// How many group-commit fdatasyncs one shard runs at once.
///
/// io_uring runs every fdatasync — and every buffered write that would block — on the ring's
/// bounded io-wq workers (a handful per CPU). When the periodic flush of a hundred partitions
/// came due together, their fdatasyncs took every worker for as long as the disk needed to
/// write the page cache out, and every append on the shard queued behind them: acks=1 p99 of
/// 1–2 s, with whole seconds of near-zero throughput. Capping the fsyncs in flight leaves
/// workers for the writes; the disk stays busy with what is in flight.
pub(super) const FSYNC_SLOTS_PER_SHARD: usize = 2;

/// Waits for one of this shard's fsync slots (see [`FSYNC_SLOTS_PER_SHARD`]).
pub(super) async fn fsync_slot() -> Option<glommio::sync::StaticPermit> {
    thread_local! {
        static SLOTS: Rc<Semaphore> = Rc::new(Semaphore::new(FSYNC_SLOTS_PER_SHARD as u64));
    }
    let slots = SLOTS.with(Rc::clone);
    // The semaphore is never closed; a failure would only mean no limit.
    slots.acquire_static_permit(1).await.ok()
}
