//! What the log engine did, for `/metrics`: group-commit syncs (count, latency, bytes made
//! durable), segment rolls, retention and compaction with the bytes they reclaimed.
//!
//! One [`StorageStats`] per shard. The shard installs it on its own thread at start
//! ([`install`]); every partition log on that thread counts into it, and the control thread
//! reads it through the shard's probe. Relaxed atomics with one writer, as for the rest of the
//! shard's probe: nothing on the append or sync path takes a lock. A thread that installed
//! nothing (a storage test) counts into a default it never reads.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Upper bounds of the latency histogram buckets, in microseconds.
pub const LATENCY_BUCKETS_US: [u64; 16] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 10_000_000,
];

/// A fixed-bucket latency histogram (Prometheus style: cumulative on export).
pub struct LatencyProbe {
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Default for LatencyProbe {
    fn default() -> Self {
        LatencyProbe {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

impl LatencyProbe {
    pub fn record_us(&self, us: u64) {
        let i = LATENCY_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the time since `start`.
    pub fn record_since(&self, start: std::time::Instant) {
        self.record_us(u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX));
    }

    /// (per-bucket counts, not cumulative; sum in µs; count).
    pub fn read(&self) -> (Vec<u64>, u64, u64) {
        (
            self.buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            self.sum_us.load(Ordering::Relaxed),
            self.count.load(Ordering::Relaxed),
        )
    }
}

/// One shard's log-engine counters.
#[derive(Default)]
pub struct StorageStats {
    /// Group-commit syncs run: one `fdatasync` of a segment (file scope) or one `syncfs`
    /// shared by the shard's partitions (filesystem scope).
    pub syncs: AtomicU64,
    /// Syncs that failed (the waiting acks=all writes were answered with an error).
    pub sync_errors: AtomicU64,
    /// How long each of those syncs took.
    pub sync_latency: LatencyProbe,
    /// Bytes of record batches made durable by the syncs; divided by `syncs`, the bytes one
    /// sync carries (the group commit's batching).
    pub synced_bytes: AtomicU64,
    /// Active segments sealed and replaced by a new one (size, age, or a new leader epoch).
    pub segment_rolls: AtomicU64,
    /// Segments deleted by retention (time, size, or below a DeleteRecords start).
    pub retention_segments_deleted: AtomicU64,
    pub retention_bytes_reclaimed: AtomicU64,
    /// Compaction passes that rewrote at least one segment, and the bytes they removed.
    pub compactions: AtomicU64,
    pub compaction_bytes_reclaimed: AtomicU64,
}

impl StorageStats {
    pub fn get(&self, counter: impl Fn(&Self) -> &AtomicU64) -> u64 {
        counter(self).load(Ordering::Relaxed)
    }
}

thread_local! {
    static STATS: RefCell<Arc<StorageStats>> = RefCell::new(Arc::new(StorageStats::default()));
}

/// Makes `stats` the counters of every partition log on this thread (the shard, at start).
pub fn install(stats: Arc<StorageStats>) {
    STATS.with(|s| *s.borrow_mut() = stats);
}

/// Adds `n` to one of this thread's counters.
pub(crate) fn add(counter: impl Fn(&StorageStats) -> &AtomicU64, n: u64) {
    STATS.with(|s| counter(&s.borrow()).fetch_add(n, Ordering::Relaxed));
}

/// Counts one group-commit sync that started at `started`.
pub(crate) fn counted_sync(started: std::time::Instant, ok: bool) {
    STATS.with(|s| {
        let s = s.borrow();
        s.syncs.fetch_add(1, Ordering::Relaxed);
        s.sync_latency.record_since(started);
        if !ok {
            s.sync_errors.fetch_add(1, Ordering::Relaxed);
        }
    });
}
