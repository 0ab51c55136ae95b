//! Record-batch (magic 2) header peeks.
//!
//! The broker stores and serves batches as the producer sent them: it reads the fixed 61-byte
//! batch header, verifies the CRC-32C, and rewrites the base offset and leader epoch in place
//! (the records inside are checked once on produce, by [`crate::records`]). Every length is checked against the bytes actually present before it is used, so a
//! lying length field can neither read out of bounds nor make us allocate.
//!
//! Layout (big-endian), from Kafka's `DefaultRecordBatch`:
//! ```text
//!  0 base_offset i64          | 27 base_timestamp i64
//!  8 batch_length i32         | 35 max_timestamp i64
//! 12 partition_leader_epoch   | 43 producer_id i64
//! 16 magic i8                 | 51 producer_epoch i16
//! 17 crc u32 (CRC-32C of 21..)| 53 base_sequence i32
//! 21 attributes i16           | 57 record_count i32
//! 23 last_offset_delta i32    | 61 records...
//! ```

use crate::error::BatchError;
use crate::varint::put_varint;

/// Bytes in a batch header, up to and including the record count.
pub const BATCH_HEADER_LEN: usize = 61;
/// `batch_length` counts the bytes after itself; these 12 bytes come before.
pub const LOG_OVERHEAD: usize = 12;
/// Where the header's fields start (the table above); builders outside this crate use them too.
pub const BATCH_LENGTH_OFFSET: usize = 8;
pub const PARTITION_LEADER_EPOCH_OFFSET: usize = 12;
pub const MAGIC_OFFSET: usize = 16;
pub const CRC_OFFSET: usize = 17;
/// The CRC-32C covers the batch from here to its end.
pub const ATTRIBUTES_OFFSET: usize = 21;
pub const LAST_OFFSET_DELTA_OFFSET: usize = 23;
pub const RECORD_COUNT_OFFSET: usize = 57;

/// Attribute bits.
const COMPRESSION_MASK: i16 = 0x07;
const TRANSACTIONAL_FLAG: i16 = 0x10;
const CONTROL_FLAG: i16 = 0x20;

/// The fixed header of one record batch, as read from the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    /// Total bytes of this batch including the offset and length fields.
    pub fn total_len(&self) -> usize {
        LOG_OVERHEAD + self.batch_length as usize
    }
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }
    pub fn compression(&self) -> i16 {
        self.attributes & COMPRESSION_MASK
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_FLAG != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_FLAG != 0
    }
    /// Stamped with the broker's append time: every record's timestamp is the batch's newest
    /// (`max_timestamp`), whatever the record itself carries.
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & LOG_APPEND_TIME_FLAG != 0
    }
    /// Whether the batch came from an idempotent (or transactional) producer.
    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }
    /// The sequence number of the last record, wrapping as Kafka's does at i32::MAX.
    pub fn last_sequence(&self) -> i32 {
        if self.base_sequence < 0 {
            return self.base_sequence;
        }
        let last = self.base_sequence as i64 + self.last_offset_delta as i64;
        if last > i32::MAX as i64 {
            (last - i32::MAX as i64 - 1) as i32
        } else {
            last as i32
        }
    }
}

fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(x)
}

/// Reads the header of the batch at the start of `bytes`, checking only that the header is
/// present and that `batch_length` fits in what remains. CRC and magic are not checked.
pub fn peek_header(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    if bytes.len() < BATCH_HEADER_LEN {
        return Err(BatchError::Truncated {
            have: bytes.len(),
            need: BATCH_HEADER_LEN,
        });
    }
    let batch_length = i32_at(bytes, 8);
    let remaining = bytes.len() - LOG_OVERHEAD;
    if batch_length < (BATCH_HEADER_LEN - LOG_OVERHEAD) as i32 || batch_length as usize > remaining
    {
        return Err(BatchError::BadLength {
            len: batch_length,
            remaining,
        });
    }
    Ok(BatchHeader {
        base_offset: i64_at(bytes, 0),
        batch_length,
        partition_leader_epoch: i32_at(bytes, PARTITION_LEADER_EPOCH_OFFSET),
        magic: bytes[MAGIC_OFFSET] as i8,
        crc: u32::from_be_bytes([bytes[17], bytes[18], bytes[19], bytes[20]]),
        attributes: i16_at(bytes, ATTRIBUTES_OFFSET),
        last_offset_delta: i32_at(bytes, 23),
        base_timestamp: i64_at(bytes, 27),
        max_timestamp: i64_at(bytes, 35),
        producer_id: i64_at(bytes, 43),
        producer_epoch: i16_at(bytes, 51),
        base_sequence: i32_at(bytes, 53),
        record_count: i32_at(bytes, 57),
    })
}

/// Reads and verifies the batch at the start of `bytes`: length, magic 2 and CRC-32C.
/// This is the check recovery uses; it accepts compacted batches (gaps in offsets).
pub fn verify_batch(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    let h = peek_header(bytes)?;
    if h.magic != 2 {
        return Err(BatchError::BadMagic { magic: h.magic });
    }
    let computed = crc32c::crc32c(&bytes[ATTRIBUTES_OFFSET..h.total_len()]);
    if computed != h.crc {
        return Err(BatchError::BadCrc {
            stored: h.crc,
            computed,
        });
    }
    Ok(h)
}

/// Verifies a batch arriving from a producer: everything [`verify_batch`] checks, plus a record
/// count that matches the offset delta (a producer never sends gaps).
pub fn verify_produced_batch(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    let h = verify_batch(bytes)?;
    if h.record_count < 1 || h.last_offset_delta != h.record_count - 1 {
        return Err(BatchError::BadCount {
            count: h.record_count,
            last_offset_delta: h.last_offset_delta,
        });
    }
    Ok(h)
}

/// Verifies every batch of a produced record set and returns their headers. An empty set or any
/// trailing partial batch is an error: a producer sends whole batches.
pub fn verify_produced_record_set(bytes: &[u8]) -> Result<Vec<BatchHeader>, BatchError> {
    if bytes.is_empty() {
        return Err(BatchError::Empty);
    }
    let mut headers = Vec::with_capacity(1);
    let mut at = 0;
    while at < bytes.len() {
        let h = verify_produced_batch(&bytes[at..])?;
        at += h.total_len();
        headers.push(h);
    }
    Ok(headers)
}

/// Overwrites the base offset of the batch at the start of `bytes`. The CRC does not cover it.
pub fn set_base_offset(bytes: &mut [u8], base_offset: i64) {
    bytes[0..8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Overwrites the partition leader epoch of the batch at the start of `bytes` (not CRC-covered).
pub fn set_partition_leader_epoch(bytes: &mut [u8], epoch: i32) {
    bytes[PARTITION_LEADER_EPOCH_OFFSET..PARTITION_LEADER_EPOCH_OFFSET + 4]
        .copy_from_slice(&epoch.to_be_bytes());
}

/// The timestamp-type attribute bit: set, every record's timestamp is the batch's max
/// timestamp, which the broker set when it appended the batch (LogAppendTime).
pub const LOG_APPEND_TIME_FLAG: i16 = 0x08;
const MAX_TIMESTAMP_OFFSET: usize = 35;

/// Stamps the batch at the start of `bytes` with the broker's append time, as Kafka does for a
/// topic with `message.timestamp.type=LogAppendTime`: the timestamp-type bit and the max
/// timestamp are set and the CRC is recomputed (it covers the attributes onward). Records are
/// not touched, so a compressed batch needs no recompression. `bytes` must hold the whole
/// verified batch.
pub fn set_log_append_time(bytes: &mut [u8], now_ms: i64) {
    let attributes = i16::from_be_bytes([bytes[ATTRIBUTES_OFFSET], bytes[ATTRIBUTES_OFFSET + 1]]);
    bytes[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2]
        .copy_from_slice(&(attributes | LOG_APPEND_TIME_FLAG).to_be_bytes());
    bytes[MAX_TIMESTAMP_OFFSET..MAX_TIMESTAMP_OFFSET + 8].copy_from_slice(&now_ms.to_be_bytes());
    seal_crc(bytes);
}

/// Corrects the newest timestamp of the CreateTime batch at the start of `bytes` to `max`
/// (its newest record's), clearing the LogAppendTime bit a producer may have set, and seals
/// the CRC again. `bytes` must hold the whole verified batch.
pub fn set_create_time_max(bytes: &mut [u8], max: i64) {
    let attributes = i16::from_be_bytes([bytes[ATTRIBUTES_OFFSET], bytes[ATTRIBUTES_OFFSET + 1]]);
    bytes[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2]
        .copy_from_slice(&(attributes & !LOG_APPEND_TIME_FLAG).to_be_bytes());
    bytes[MAX_TIMESTAMP_OFFSET..MAX_TIMESTAMP_OFFSET + 8].copy_from_slice(&max.to_be_bytes());
    seal_crc(bytes);
}

/// Recomputes and stores the CRC of the batch at the start of `bytes` (tools that build
/// batches, and LogAppendTime stamping).
pub fn seal_crc(bytes: &mut [u8]) {
    let len = LOG_OVERHEAD + i32_at(bytes, 8) as usize;
    let crc = crc32c::crc32c(&bytes[ATTRIBUTES_OFFSET..len]);
    bytes[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Fields for [`build_batch`].
#[derive(Debug, Clone, Copy)]
pub struct BatchSpec {
    pub base_offset: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub timestamp: i64,
    pub attributes: i16,
}

impl Default for BatchSpec {
    fn default() -> Self {
        BatchSpec {
            base_offset: 0,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            timestamp: 0,
            attributes: 0,
        }
    }
}

/// One record for [`build_batch`]: optional key, optional value (None is a tombstone).
pub type RecordKv<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// Builds an uncompressed magic-2 batch of `(key, value)` records with a valid CRC. For tests,
/// tools and the benchmark; the broker itself never builds batches from records.
pub fn build_batch(spec: BatchSpec, records: &[RecordKv<'_>]) -> Vec<u8> {
    let mut body = Vec::new();
    for (i, (key, value)) in records.iter().enumerate() {
        let mut rec = Vec::new();
        rec.push(0u8); // record attributes
        put_varint(&mut rec, 0); // timestamp delta
        put_varint(&mut rec, i as i64); // offset delta
        match key {
            Some(k) => {
                put_varint(&mut rec, k.len() as i64);
                rec.extend_from_slice(k);
            }
            None => put_varint(&mut rec, -1),
        }
        match value {
            Some(v) => {
                put_varint(&mut rec, v.len() as i64);
                rec.extend_from_slice(v);
            }
            None => put_varint(&mut rec, -1),
        }
        put_varint(&mut rec, 0); // headers
        put_varint(&mut body, rec.len() as i64);
        body.extend_from_slice(&rec);
    }
    let n = records.len() as i32;
    let mut b = Vec::with_capacity(BATCH_HEADER_LEN + body.len());
    b.extend_from_slice(&spec.base_offset.to_be_bytes());
    b.extend_from_slice(&((BATCH_HEADER_LEN - LOG_OVERHEAD + body.len()) as i32).to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.push(2);
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&spec.attributes.to_be_bytes());
    b.extend_from_slice(&(n - 1).to_be_bytes());
    b.extend_from_slice(&spec.timestamp.to_be_bytes());
    b.extend_from_slice(&spec.timestamp.to_be_bytes());
    b.extend_from_slice(&spec.producer_id.to_be_bytes());
    b.extend_from_slice(&spec.producer_epoch.to_be_bytes());
    b.extend_from_slice(&spec.base_sequence.to_be_bytes());
    b.extend_from_slice(&n.to_be_bytes());
    b.extend_from_slice(&body);
    seal_crc(&mut b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // A batch we build verifies, and its header reads back what we put in.
    #[test]
    fn build_then_verify() {
        let spec = BatchSpec {
            base_offset: 7,
            producer_id: 42,
            producer_epoch: 1,
            base_sequence: 5,
            timestamp: 1000,
            attributes: 0,
        };
        let b = build_batch(spec, &[(Some(b"k"), Some(b"v1")), (None, Some(b"v2"))]);
        let h = verify_produced_batch(&b).unwrap();
        assert_eq!(h.base_offset, 7);
        assert_eq!(h.record_count, 2);
        assert_eq!(h.last_offset(), 8);
        assert_eq!(h.producer_id, 42);
        assert_eq!(h.last_sequence(), 6);
        assert_eq!(h.total_len(), b.len());
    }

    // LogAppendTime stamping sets the type bit and max timestamp and leaves a valid CRC.
    #[test]
    fn log_append_time_stamp_verifies() {
        let mut b = build_batch(
            BatchSpec {
                timestamp: 5,
                attributes: 2, // snappy bit: left as it is
                ..BatchSpec::default()
            },
            &[(None, Some(b"x"))],
        );
        set_log_append_time(&mut b, 1_700_000_000_000);
        let h = verify_batch(&b).unwrap();
        assert_eq!(h.max_timestamp, 1_700_000_000_000);
        assert_eq!(h.attributes, 2 | LOG_APPEND_TIME_FLAG);
        assert_eq!(h.base_timestamp, 5);
    }

    // Rewriting the base offset and leader epoch keeps the CRC valid (they are outside it).
    #[test]
    fn rewrite_keeps_crc() {
        let mut b = build_batch(BatchSpec::default(), &[(None, Some(b"x"))]);
        set_base_offset(&mut b, 1234);
        set_partition_leader_epoch(&mut b, 9);
        let h = verify_batch(&b).unwrap();
        assert_eq!(h.base_offset, 1234);
        assert_eq!(h.partition_leader_epoch, 9);
    }

    // A flipped bit in the CRC-covered region is caught.
    #[test]
    fn bad_crc() {
        let mut b = build_batch(BatchSpec::default(), &[(None, Some(b"hello"))]);
        let last = b.len() - 1;
        b[last] ^= 1;
        assert!(matches!(verify_batch(&b), Err(BatchError::BadCrc { .. })));
    }

    // Magic other than 2 is refused.
    #[test]
    fn bad_magic() {
        let mut b = build_batch(BatchSpec::default(), &[(None, Some(b"hello"))]);
        b[16] = 1;
        assert_eq!(verify_batch(&b), Err(BatchError::BadMagic { magic: 1 }));
    }

    // A record set is split into its batches; a trailing partial batch is an error.
    #[test]
    fn record_sets() {
        let a = build_batch(BatchSpec::default(), &[(None, Some(b"a"))]);
        let c = build_batch(
            BatchSpec::default(),
            &[(None, Some(b"b")), (None, Some(b"c"))],
        );
        let mut set = a.clone();
        set.extend_from_slice(&c);
        let hs = verify_produced_record_set(&set).unwrap();
        assert_eq!(hs.len(), 2);
        assert_eq!(hs[1].record_count, 2);
        set.extend_from_slice(&a[..20]);
        assert!(verify_produced_record_set(&set).is_err());
        assert_eq!(verify_produced_record_set(&[]), Err(BatchError::Empty));
    }

    proptest! {
        // Arbitrary bytes never panic the peeks, and any accepted header lies within the input.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(h) = peek_header(&bytes) {
                prop_assert!(h.total_len() <= bytes.len());
            }
            let _ = verify_batch(&bytes);
            let _ = verify_produced_record_set(&bytes);
        }

        // Any single-byte corruption of the CRC-covered region is detected.
        #[test]
        fn corruption_detected(pos in 21usize..80, flip in 1u8..=255) {
            let mut b = build_batch(BatchSpec::default(), &[(Some(b"key"), Some(b"value-value-value"))]);
            let pos = pos.min(b.len() - 1);
            b[pos] ^= flip;
            prop_assert!(verify_batch(&b).is_err());
        }
    }
}
