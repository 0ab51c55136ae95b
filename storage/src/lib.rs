//! The per-partition log engine.
//!
//! Owns: a partition's directory of segments, its manifest, its in-memory batch index, its
//! producer-state table (idempotence) and its group-commit flusher. Runs on the shard that owns
//! the partition (one glommio executor, one core); nothing here is `Send`, and nothing here is
//! shared between shards. File IO goes through glommio, so it is submitted on the shard's
//! io_uring.
//!
//! Durability contract, enforced in [`PartitionLog::append`] and [`PartitionLog::wait_durable`]:
//! an append returns once its bytes are written to the segment file (page cache); it is durable
//! once `wait_durable` for its end offset returns, which happens only after an `fdatasync` that
//! started after the write completed. One fdatasync serves every waiter whose write completed
//! before it started (group commit).

mod compaction;
mod error;
mod index;
mod manifest;
mod partition;
mod producer;
mod segment;

pub use error::StorageError;
pub use manifest::write_atomically;
pub use partition::{AppendOutcome, LogConfig, PartitionLog, ReadOutcome, TimestampLookup};
pub use producer::ProducerCheck;

/// An offset in a partition's log.
pub type Offset = i64;

/// A partition leader epoch. Raised on every takeover; an append stamped with an older epoch
/// is refused.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct LeaderEpoch(pub i32);

/// (offset, key as UTF-8) of each record of an uncompressed batch, for tests and tools.
pub fn compaction_records(batch: &[u8]) -> Option<Vec<(i64, String)>> {
    compaction::records(batch).map(|rs| {
        rs.into_iter()
            .map(|r| {
                (
                    r.offset,
                    String::from_utf8_lossy(r.key.unwrap_or_default()).into_owned(),
                )
            })
            .collect()
    })
}
