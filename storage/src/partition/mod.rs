//! [`PartitionLog`]: one partition's log, owned by one shard.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures_lite::future;
use glommio::sync::Semaphore;
use kaas_wire::batch::{self, BatchHeader};

use crate::compaction;
use crate::divergence::{self, SegmentFate};
use crate::fs_sync::SyncScope;
use crate::index::{self, BatchEntry, BatchIndex};
use crate::manifest::Manifest;
use crate::producer::{ProducerCheck, ProducerSnapshot, ProducerStateTable};
use crate::segment::{parse_segment_file_name, Segment};
use crate::{LeaderEpoch, StorageError};

mod append;
mod close;
mod durability;
mod maintenance;
mod open;
mod read;

use durability::fsync_slot;
use maintenance::load_cleaner_checkpoint;
use read::map_prefix;

/// How far ahead of the data the active segment is zero-filled (see `preallocate`): the
/// segment's current size, between these bounds. The cap was 8 MiB: with a hundred partitions
/// filling at the same rate, their 8 MiB zero writes came due together and held io_uring's
/// workers long enough to stall every append on the shard (acks=1, 100 partitions: p99
/// 0.9–1.8 s, whole seconds at ~1,000 msg/s). Measured on 2026-11-30 with a 1 MiB cap: p99
/// 187–206 ms at 415–444 MB/s; with 64 KiB: 134–152 ms, but zeros that far ahead no longer
/// spare 256 KiB batches the metadata commit.
const PREALLOCATE_MIN_BYTES: u64 = 64 * 1024;
const PREALLOCATE_MAX_BYTES: u64 = 1024 * 1024;

type Waiter = futures::channel::oneshot::Sender<Result<(), StorageError>>;

/// Per-partition log settings (Kafka's topic config names in the comments).
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// `segment.bytes`: roll the active segment when an append would take it past this.
    pub segment_bytes: u64,
    /// `segment.ms`: roll the active segment when it is older than this.
    pub segment_ms: u64,
    /// `retention.ms`: sealed segments whose newest record is older than this are deleted;
    /// negative keeps them forever.
    pub retention_ms: i64,
    /// `retention.bytes`: oldest sealed segments are deleted while the log is larger than
    /// this; negative means no limit.
    pub retention_bytes: i64,
    /// Whether `cleanup.policy` includes `delete` (retention applies only then).
    pub delete_enabled: bool,
    /// Whether `cleanup.policy` includes `compact`.
    pub compact_enabled: bool,
    /// `delete.retention.ms`: tombstones older than this are dropped by compaction.
    pub delete_retention_ms: i64,
    /// `min.compaction.lag.ms`: segments with records newer than this are not compacted.
    pub min_compaction_lag_ms: i64,
    /// `index.interval.bytes`: the batch index keeps one mark per this many bytes of log; a
    /// lookup scans batch headers forward from the nearest mark.
    pub index_interval_bytes: u64,
    /// `min.cleanable.dirty.ratio` (0.0 to 1.0, Kafka's default 0.5): compaction runs only when
    /// the bytes written since the last cleaning (the dirty section, from the cleaner
    /// checkpoint to the first segment that may not be cleaned yet) make up at least this
    /// share of the cleanable log.
    pub min_cleanable_dirty_ratio: f64,
    /// `flush.ms`: data not yet fsynced (acks=0/1 writes) is fsynced within this long.
    pub flush_ms: u64,
    /// `flush.messages`: fsync once this many messages are not yet durable.
    pub flush_messages: u64,
    /// An fsync that has not completed after this long fails its waiters with a storage error
    /// instead of holding their requests forever.
    pub fsync_timeout_ms: u64,
    /// What one group-commit sync covers: this partition's file, or the whole filesystem
    /// (one `syncfs` for every partition of the shard; see `crate::fs_sync`).
    pub sync_scope: SyncScope,
    /// The most segments the log rolls to for `segment.bytes` and `segment.ms`. Each segment
    /// holds a file descriptor while the log is open, so one partition rolling on every batch
    /// (`segment.ms=1`) would take them all; past this many the active segment grows instead,
    /// until retention or compaction removes old ones. Rolls the log needs for itself (a new
    /// leader epoch, a segment at its 4 GiB or 2^31-offset limit) happen regardless.
    pub max_segments: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1024 * 1024 * 1024,
            segment_ms: 7 * 24 * 3600 * 1000,
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            delete_enabled: true,
            compact_enabled: false,
            delete_retention_ms: 24 * 3600 * 1000,
            min_compaction_lag_ms: 0,
            min_cleanable_dirty_ratio: 0.5,
            index_interval_bytes: 4096,
            flush_ms: 1000,
            flush_messages: u64::MAX,
            fsync_timeout_ms: 30_000,
            sync_scope: SyncScope::default(),
            max_segments: 10_000,
        }
    }
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Written at these offsets; durable once `wait_durable(last_offset + 1)` returns.
    Appended { base_offset: i64, last_offset: i64 },
    /// A producer retry of a batch already in the log at these offsets; nothing was written.
    Duplicate { base_offset: i64, last_offset: i64 },
}

impl AppendOutcome {
    pub fn base_offset(&self) -> i64 {
        match self {
            AppendOutcome::Appended { base_offset, .. }
            | AppendOutcome::Duplicate { base_offset, .. } => *base_offset,
        }
    }
    pub fn end_offset(&self) -> i64 {
        match self {
            AppendOutcome::Appended { last_offset, .. }
            | AppendOutcome::Duplicate { last_offset, .. } => *last_offset + 1,
        }
    }
}

/// What a read returns: whole batches, and the partition's offsets at the time of the read.
#[derive(Debug, Clone)]
pub struct ReadOutcome {
    pub records: Bytes,
    pub high_watermark: i64,
    pub log_start_offset: i64,
}

/// How big a partition's batch index is (see `index.rs`: one mark per `index.interval.bytes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Batches in the log.
    pub batches: u64,
    /// Index marks held in memory.
    pub marks: u64,
    /// Heap bytes the marks (and epoch runs) take.
    pub heap_bytes: u64,
}

/// Answer to a ListOffsets-by-timestamp lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampLookup {
    pub offset: i64,
    pub timestamp: i64,
    pub leader_epoch: i32,
}

struct State {
    segments: Vec<Segment>,
    log_start_offset: i64,
    /// Offset after the last batch whose write has completed.
    log_end_offset: i64,
    producers: ProducerStateTable,
    epoch: i32,
}

struct Flush {
    /// Every offset below this is on disk (fdatasync returned after its write completed).
    durable_end: i64,
    syncing: bool,
    waiters: Vec<(i64, Waiter)>,
    /// A `flush.ms` timer is pending for data that no acks=all request is waiting on.
    timer_armed: bool,
}

/// One partition's log. Lives on the shard that owns the partition (it is `!Send`).
///
/// Appends are serialized by `write_lock` so that offsets, file positions and producer
/// sequence checks stay in one order; reads and fsyncs run beside them.
pub struct PartitionLog {
    dir: PathBuf,
    config: RefCell<LogConfig>,
    state: RefCell<State>,
    flush: RefCell<Flush>,
    write_lock: Semaphore,
    /// One zero-fill of the active segment at a time (see [`PartitionLog::preallocate`]);
    /// trimming waits for it, so no fill lands after a segment was sealed or closed.
    fill_lock: Semaphore,
    /// A background fill has been started and not finished.
    filling: Cell<bool>,
    /// The offset of the newest producer snapshot stored, so a background seal that finishes
    /// late never replaces a newer snapshot (see `roll`).
    snapshot_stored: Cell<i64>,
    /// One seal (or the final snapshot of `close`) at a time, so snapshots land in order.
    seal_lock: Semaphore,
    /// Woken whenever the log end offset moves, for Fetch long-polls.
    data_waiters: RefCell<Vec<futures::channel::oneshot::Sender<()>>>,
    /// What consumers may read: the end of the last write that was acknowledged (or would
    /// have been: see [`Self::advance_high_watermark`]). Everything recovered at open counts.
    high_watermark: Cell<i64>,
    /// Bytes of batches this log has written since it was opened, and how many of them the
    /// last successful sync covered (for `stats::StorageStats::synced_bytes`).
    appended_bytes: Cell<u64>,
    synced_bytes: Cell<u64>,
    closed: Cell<bool>,
    /// The cleaner checkpoint: every segment below this offset has been compacted, so its keys
    /// are unique among themselves (persisted in `cleaner-checkpoint`).
    cleaner_checkpoint: Cell<i64>,
    /// See [`PartitionLog::generation`].
    generation: u64,
    /// Set by a [`PartitionLog::close`] that synced and saved this log's state for the next
    /// leader: its end offset then. See [`PartitionLog::kept_by_close`].
    closed_end: Cell<Option<i64>>,
    /// [`PartitionLog::close`] has begun; `close_finished` is closed when it returns (a
    /// semaphore that never has permits: waiting on it ends when it is closed).
    close_started: Cell<bool>,
    close_finished: Semaphore,
    /// The log has said once that it stopped rolling at `LogConfig::max_segments`.
    segment_cap_reported: Cell<bool>,
}

/// Marks a [`PartitionLog::close`] finished however it ends (returned, failed or dropped).
struct CloseFinished<'a>(&'a Semaphore);

impl Drop for CloseFinished<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Source of [`PartitionLog::generation`].
static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl PartitionLog {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A number no other log opened by this process has: tells a log apart from a later one of
    /// the same partition (closed and opened again, e.g. relinquished and taken over).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether [`Self::close`] (or `abandon`) ran: this handle's term as leader is over.
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// File descriptors this log holds: one per segment file (indexes are read whole, not
    /// kept open). What the shard's open-file budget counts.
    pub fn open_files(&self) -> usize {
        self.state.borrow().segments.len()
    }

    pub fn log_end_offset(&self) -> i64 {
        self.state.borrow().log_end_offset
    }

    /// What consumers may read up to (exclusive).
    ///
    /// A single-copy log needs a high watermark all the same, in cluster mode: a write that
    /// failed its last check before acknowledgement (the write fence closed, the partition was
    /// relinquished) may be cut when the next leader takes the partition over (the divergence
    /// rule, `crate::divergence`), and a consumer that had read it would then see the log
    /// truncated below its position — librdkafka reports "Partition log truncation detected"
    /// and, with its default `auto.offset.reset`, moves on. So records become readable only
    /// once a write ending at or after them passed that check ([`Self::advance_high_watermark`]),
    /// which also means, for acks=all, after their sync.
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark.get()
    }

    /// Records that a write ending at `end_offset` passed the check before its acknowledgement:
    /// everything below it may be read. Wakes waiting fetches.
    pub fn advance_high_watermark(&self, end_offset: i64) {
        let end = end_offset.min(self.log_end_offset());
        if end > self.high_watermark.get() {
            self.high_watermark.set(end);
            for w in self.data_waiters.borrow_mut().drain(..) {
                let _ = w.send(());
            }
        }
    }

    /// The idempotent producers this partition remembers (DescribeProducers).
    pub fn active_producers(&self) -> Vec<crate::ActiveProducer> {
        self.state.borrow().producers.active()
    }

    pub fn log_start_offset(&self) -> i64 {
        self.state.borrow().log_start_offset
    }

    pub fn leader_epoch(&self) -> LeaderEpoch {
        LeaderEpoch(self.state.borrow().epoch)
    }

    pub fn size_bytes(&self) -> u64 {
        self.state.borrow().segments.iter().map(|s| s.size).sum()
    }

    /// The batch index's size over all segments, for probes and tests.
    pub fn index_stats(&self) -> IndexStats {
        let st = self.state.borrow();
        let mut stats = IndexStats::default();
        for seg in &st.segments {
            stats.batches += seg.index.batch_count();
            stats.marks += seg.index.mark_count() as u64;
            stats.heap_bytes += seg.index.heap_bytes() as u64;
        }
        stats
    }

    pub fn set_config(&self, config: LogConfig) {
        if let Some(active) = self.state.borrow_mut().segments.last_mut() {
            active.index.set_interval_bytes(config.index_interval_bytes);
        }
        *self.config.borrow_mut() = config;
    }
}
