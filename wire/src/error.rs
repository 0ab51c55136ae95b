//! Errors of the wire layer. The shard maps them to Kafka error codes or a closed connection.

use thiserror::Error;

/// Why bytes from a client could not be turned into a request (or a batch into a valid batch).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    #[error("frame length {len} is negative or zero")]
    BadFrameLength { len: i32 },
    #[error("frame of {len} bytes exceeds the limit of {max} bytes (--max-frame-bytes)")]
    FrameTooLarge { len: usize, max: usize },
    #[error("frame of {len} bytes is too short for a request header")]
    TruncatedHeader { len: usize },
    #[error("unknown API key {api_key}")]
    UnknownApiKey { api_key: i16 },
    #[error("API key {api_key} version {version} is not supported")]
    UnsupportedVersion {
        api_key: i16,
        version: i16,
        correlation_id: i32,
    },
    #[error("malformed request (API key {api_key} v{version}): {reason}")]
    Malformed {
        api_key: i16,
        version: i16,
        reason: String,
    },
    #[error("record batch: {0}")]
    Batch(#[from] BatchError),
}

/// A record batch failed validation. Each maps to CORRUPT_MESSAGE or INVALID_RECORD for the
/// partition; none of them closes the connection.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BatchError {
    #[error("{have} bytes left, too short for a batch header ({need} bytes)")]
    Truncated { have: usize, need: usize },
    #[error("batch length field {len} is out of range (remaining {remaining} bytes)")]
    BadLength { len: i32, remaining: usize },
    #[error("magic {magic} is not supported (only record batch v2)")]
    BadMagic { magic: i8 },
    #[error("CRC-32C mismatch: header says {stored:#010x}, bytes give {computed:#010x}")]
    BadCrc { stored: u32, computed: u32 },
    #[error("record count {count} does not match last offset delta {last_offset_delta}")]
    BadCount { count: i32, last_offset_delta: i32 },
    #[error("empty record set")]
    Empty,
}
