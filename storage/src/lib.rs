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
//! once `wait_durable` for its end offset returns, which happens only after an `fdatasync` of the
//! segment (or a `syncfs` of its filesystem, see [`SyncScope`]) that started after the write
//! completed. One sync serves every waiter whose write completed before it started (group
//! commit); a `syncfs` serves the waiters of every partition on the shard.

pub mod ballast;
mod codec;
pub mod compaction;
pub mod direct;
pub mod divergence;
pub mod epoch_cache;
mod error;
mod fs_sync;
mod index;
mod manifest;
pub mod memory_limit;
mod partition;
mod producer;
pub mod resident;
mod segment;
pub mod stats;
pub mod sync_failure;

pub use codec::Codec;
pub use error::StorageError;
pub use fs_sync::{filesystem_syncs, SyncScope};
pub use manifest::{replace_visible, write_atomically};
pub use partition::{
    AppendOutcome, IndexStats, LogConfig, PartitionLog, ReadOutcome, TimestampLookup,
};
pub use producer::{ActiveProducer, ProducerCheck};
pub use segment::is_legacy_segment_name;

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

/// The highest leader epoch stored in a partition directory (its manifest and its segment
/// names), 0 for a partition never written. A new leader opens the log one above it, so its
/// first write starts a segment no earlier leader can have named.
pub fn stored_leader_epoch(dir: &std::path::Path) -> Result<i32, StorageError> {
    let mut epoch = manifest::Manifest::load(dir)?.map_or(0, |m| m.leader_epoch);
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries.flatten() {
                if let Some((_, e)) = entry
                    .file_name()
                    .to_str()
                    .and_then(segment::parse_segment_file_name)
                {
                    epoch = epoch.max(e);
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StorageError::io("listing", dir, e)),
    }
    Ok(epoch)
}

/// The bytes of the segment files in a partition directory (0 when it does not exist): a
/// partition's size for DescribeLogDirs when its log is not open. Blocking (one directory
/// listing); a closed log's segments hold only data (preallocated space is trimmed at close).
pub fn stored_log_bytes(dir: &std::path::Path) -> Result<u64, StorageError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(StorageError::io("listing", dir, e)),
    };
    Ok(entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(segment::parse_segment_file_name)
                .is_some()
        })
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum())
}

/// Why a produced batch's records were refused (INVALID_RECORD): nothing of the batch is
/// stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProducedRecordsError {
    #[error("compression codec {0} is not one Kafka defines (0-4)")]
    UnknownCodec(i16),
    #[error("the compressed records do not decompress: {0}")]
    Corrupt(String),
    #[error("the records decompress to more than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the records could not be recompressed for the topic's compression.type: {0}")]
    Recompress(String),
    #[error(transparent)]
    Invalid(#[from] kaas_wire::records::InvalidRecords),
}

/// What a topic's `compression.type` makes of a produced batch's records as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredCompression {
    /// `producer` (the default): as the producer sent them.
    AsProduced,
    /// `uncompressed`.
    Uncompressed,
    /// `gzip`, `snappy`, `lz4` or `zstd`.
    With(Codec),
}

impl StoredCompression {
    /// The codec a stored batch has under this setting (`Some(None)`: uncompressed), `None`
    /// for "as produced".
    fn codec(self) -> Option<Option<Codec>> {
        match self {
            StoredCompression::AsProduced => None,
            StoredCompression::Uncompressed => Some(None),
            StoredCompression::With(codec) => Some(Some(codec)),
        }
    }
}

/// Walks the records of a produced batch (see [`kaas_wire::records`]), decompressing a
/// compressed one into `scratch` first, within [`compaction::MAX_DECOMPRESSED_BYTES`]; `each`
/// sees every record in order. `batch` must hold the whole verified batch. When `stored` asks
/// for another codec than the producer's, returns the batch rebuilt with it, as Kafka's
/// `LogValidator` recompresses: the same header but for the codec bits, the length and the
/// CRC.
///
/// # Errors
/// [`ProducedRecordsError`] when the codec is unknown, the body does not decompress (or past
/// the bound), or the records do not parse.
pub fn walk_produced_records<'a>(
    batch: &'a [u8],
    header: &kaas_wire::batch::BatchHeader,
    scratch: &'a mut Vec<u8>,
    stored: StoredCompression,
    each: impl FnMut(kaas_wire::records::RecordView<'a>),
) -> Result<Option<Vec<u8>>, ProducedRecordsError> {
    use codec::CodecError;
    use kaas_wire::batch::BATCH_HEADER_LEN;
    let raw = &batch[BATCH_HEADER_LEN..header.total_len()];
    let produced = Codec::from_attributes(header.attributes)
        .map_err(|_| ProducedRecordsError::UnknownCodec(header.compression()))?;
    let body: &'a [u8] = match produced {
        None => raw,
        Some(codec) => {
            codec
                .decompress(raw, compaction::MAX_DECOMPRESSED_BYTES, scratch)
                .map_err(|e| match e {
                    CodecError::TooLarge { limit } => ProducedRecordsError::TooLarge { limit },
                    CodecError::Corrupt(why) => ProducedRecordsError::Corrupt(why),
                    CodecError::Unknown(c) => ProducedRecordsError::UnknownCodec(c),
                })?;
            scratch
        }
    };
    kaas_wire::records::for_each_record(body, header.record_count, each)?;
    let Some(codec) = stored.codec().filter(|&c| c != produced) else {
        return Ok(None);
    };
    codec::assemble_batch(batch, &[body], codec, header.record_count)
        .map(Some)
        .map_err(|e| ProducedRecordsError::Recompress(format!("{e:?}")))
}

/// (offset, key as UTF-8) of each record of a data batch (decompressed if it is compressed),
/// for tests and tools.
pub fn compaction_records(batch: &[u8]) -> Option<Vec<(i64, String)>> {
    let mut scratch = Vec::new();
    compaction::records_in(batch, &mut scratch).map(|rs| {
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
