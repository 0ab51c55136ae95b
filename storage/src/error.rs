//! Errors of the log engine. The shard's single error mapping turns them into Kafka codes.

use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error, Clone)]
pub enum StorageError {
    /// A disk operation failed. The partition answers KAFKA_STORAGE_ERROR until reopened.
    #[error("{op} {path}: {detail}")]
    Io {
        op: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("offset {offset} is outside the log [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start: i64,
        log_end: i64,
    },
    #[error("append stamped with leader epoch {got} but the partition is at epoch {current}")]
    FencedLeaderEpoch { got: i32, current: i32 },
    #[error("producer {producer_id} epoch {got} is older than the current epoch {current}")]
    InvalidProducerEpoch {
        producer_id: i64,
        got: i16,
        current: i16,
    },
    #[error("producer {producer_id}: sequence {got} out of order, expected {expected}")]
    OutOfOrderSequence {
        producer_id: i64,
        got: i32,
        expected: i32,
        /// The last offset of the producer's last stored batch, if the table remembers one.
        after_offset: Option<i64>,
    },
    #[error("corrupt data in {path} at byte {position}: {detail}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        detail: String,
    },
    #[error("the partition is closed")]
    Closed,
}

impl StorageError {
    pub(crate) fn io(op: &'static str, path: &std::path::Path, e: impl std::fmt::Display) -> Self {
        StorageError::Io {
            op,
            path: path.to_path_buf(),
            detail: e.to_string(),
        }
    }
}
