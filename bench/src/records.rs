//! Record batches (magic 2) built and walked by hand, without a per-record allocation.
//!
//! Layout of a v2 batch (offsets in bytes from its start):
//! `0` base offset i64, `8` batch length i32 (bytes after this field), `12` partition leader
//! epoch i32, `16` magic i8, `17` CRC-32C u32 of everything from `21` to the end, `21` attributes
//! i16, `23` last offset delta i32, `27` base timestamp i64, `35` max timestamp i64, `43` producer
//! id i64, `51` producer epoch i16, `53` base sequence i32, `57` record count i32, `61` records.
//!
//! Each record value written here starts with the message's intended send time (8 bytes, big
//! endian, nanoseconds on the bench clock), so the end-to-end mode can measure latency on receipt.

use std::io::{Read, Write};

use anyhow::{bail, Context, Result};
use bytes::{BufMut, BytesMut};

use crate::args::Compression;

pub use kaas_wire::batch::BATCH_HEADER_LEN as BATCH_HEADER_BYTES;
use kaas_wire::batch::{
    ATTRIBUTES_OFFSET as OFFSET_ATTRIBUTES, BATCH_LENGTH_OFFSET as OFFSET_BATCH_LENGTH,
    CRC_OFFSET as OFFSET_CRC, LAST_OFFSET_DELTA_OFFSET as OFFSET_LAST_OFFSET_DELTA,
    LOG_OVERHEAD as LOG_OVERHEAD_BYTES, MAGIC_OFFSET as OFFSET_MAGIC,
    RECORD_COUNT_OFFSET as OFFSET_RECORD_COUNT,
};
pub use kaas_wire::varint::{put_varint, varint_len};

/// Reads a zigzag varint from `data` at `*pos`, advancing it (`kaas_wire::varint`'s rules).
pub fn get_varint(data: &[u8], pos: &mut usize) -> Result<i64> {
    kaas_wire::varint::read_varint(data, pos)
        .context("malformed varint: past the end or longer than 10 bytes")
}

/// Kafka's murmur2 hash (`org.apache.kafka.common.utils.Utils.murmur2`), bit for bit, so keyed
/// messages land on the partitions a Java producer would choose.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= (rest[2] as u32) << 16;
    }
    if rest.len() >= 2 {
        h ^= (rest[1] as u32) << 8;
    }
    if !rest.is_empty() {
        h ^= rest[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner gives a key.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    ((murmur2(key) & 0x7fff_ffff) as u32) % partitions
}

/// Accumulates the records of one batch (uncompressed) until it is sealed.
#[derive(Debug, Default)]
pub struct BatchBuilder {
    records: BytesMut,
    count: u32,
    base_timestamp_ms: i64,
    max_timestamp_ms: i64,
    /// Intended send times of the records, for latency on acknowledgement.
    pub stamps_ns: Vec<u64>,
    /// Value plus key bytes, for throughput figures.
    pub payload_bytes: u64,
}

impl BatchBuilder {
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Size the batch would have uncompressed.
    pub fn size_bytes(&self) -> usize {
        BATCH_HEADER_BYTES + self.records.len()
    }

    /// Bytes a record with this key and value size adds.
    pub fn record_size_bytes(&self, key_len: Option<usize>, value_len: usize) -> usize {
        let body = self.record_body_len(0, key_len, value_len);
        varint_len(body as i64) + body
    }

    fn record_body_len(&self, ts_delta: i64, key_len: Option<usize>, value_len: usize) -> usize {
        1 + varint_len(ts_delta)
            + varint_len(self.count as i64)
            + match key_len {
                Some(k) => varint_len(k as i64) + k,
                None => 1,
            }
            + varint_len(value_len as i64)
            + value_len
            + 1
    }

    /// Appends one record. The value is the 8-byte intended send time followed by
    /// `filler[..value_len - 8]`.
    pub fn append(
        &mut self,
        timestamp_ms: i64,
        stamp_ns: u64,
        key: Option<&[u8]>,
        value_len: usize,
        filler: &[u8],
    ) {
        debug_assert!(value_len >= 8 && filler.len() >= value_len - 8);
        if self.count == 0 {
            self.base_timestamp_ms = timestamp_ms;
            self.max_timestamp_ms = timestamp_ms;
        }
        self.max_timestamp_ms = self.max_timestamp_ms.max(timestamp_ms);
        let ts_delta = timestamp_ms - self.base_timestamp_ms;
        let body = self.record_body_len(ts_delta, key.map(<[u8]>::len), value_len);
        self.records.reserve(body + 5);
        put_varint(&mut self.records, body as i64);
        self.records.put_u8(0); // record attributes: unused
        put_varint(&mut self.records, ts_delta);
        put_varint(&mut self.records, self.count as i64);
        match key {
            Some(k) => {
                put_varint(&mut self.records, k.len() as i64);
                self.records.put_slice(k);
            }
            None => put_varint(&mut self.records, -1),
        }
        put_varint(&mut self.records, value_len as i64);
        self.records.put_u64(stamp_ns);
        self.records.put_slice(&filler[..value_len - 8]);
        put_varint(&mut self.records, 0); // no headers
        self.count += 1;
        self.stamps_ns.push(stamp_ns);
        self.payload_bytes += (value_len + key.map_or(0, <[u8]>::len)) as u64;
    }

    /// Writes the finished batch to `out` and resets the builder's records (the stamps are left
    /// for the caller to take).
    pub fn seal(&mut self, out: &mut BytesMut, compression: Compression) -> Result<()> {
        let start = out.len();
        out.reserve(BATCH_HEADER_BYTES + self.records.len());
        out.put_i64(0); // base offset: assigned by the broker
        out.put_i32(0); // batch length, patched below
        out.put_i32(-1); // partition leader epoch
        out.put_i8(2); // magic
        out.put_u32(0); // CRC, patched below
        out.put_i16(compression.attribute_bits()); // CreateTime, not transactional
        out.put_i32(self.count as i32 - 1);
        out.put_i64(self.base_timestamp_ms);
        out.put_i64(self.max_timestamp_ms);
        out.put_i64(-1); // producer id: not idempotent
        out.put_i16(-1);
        out.put_i32(-1);
        out.put_i32(self.count as i32);
        match compression {
            Compression::None => out.put_slice(&self.records),
            Compression::Gzip => {
                let mut w =
                    flate2::write::GzEncoder::new(out.writer(), flate2::Compression::default());
                w.write_all(&self.records)?;
                w.finish()?;
            }
            Compression::Lz4 => {
                let mut w = lz4_flex::frame::FrameEncoder::new(out.writer());
                w.write_all(&self.records)?;
                w.finish()?;
            }
        }
        let batch_len = (out.len() - start - LOG_OVERHEAD_BYTES) as i32;
        out[start + OFFSET_BATCH_LENGTH..start + OFFSET_BATCH_LENGTH + 4]
            .copy_from_slice(&batch_len.to_be_bytes());
        let crc = crc32c::crc32c(&out[start + OFFSET_ATTRIBUTES..]);
        out[start + OFFSET_CRC..start + OFFSET_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        self.records.clear();
        self.count = 0;
        self.payload_bytes = 0;
        Ok(())
    }
}

/// One batch seen through its header, without touching its records.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a> {
    pub bytes: &'a [u8],
}

impl<'a> BatchView<'a> {
    fn i32_at(&self, at: usize) -> i32 {
        i32::from_be_bytes(self.bytes[at..at + 4].try_into().unwrap())
    }

    pub fn base_offset(&self) -> i64 {
        i64::from_be_bytes(self.bytes[0..8].try_into().unwrap())
    }

    pub fn magic(&self) -> i8 {
        self.bytes[OFFSET_MAGIC] as i8
    }

    /// Offset one past the batch's last record: where the next fetch starts.
    pub fn next_offset(&self) -> i64 {
        self.base_offset() + self.i32_at(OFFSET_LAST_OFFSET_DELTA) as i64 + 1
    }

    pub fn record_count(&self) -> u32 {
        self.i32_at(OFFSET_RECORD_COUNT).max(0) as u32
    }

    pub fn compression_bits(&self) -> i16 {
        i16::from_be_bytes(
            self.bytes[OFFSET_ATTRIBUTES..OFFSET_ATTRIBUTES + 2]
                .try_into()
                .unwrap(),
        ) & 0x7
    }

    pub fn is_control(&self) -> bool {
        i16::from_be_bytes(
            self.bytes[OFFSET_ATTRIBUTES..OFFSET_ATTRIBUTES + 2]
                .try_into()
                .unwrap(),
        ) & 0x20
            != 0
    }

    pub fn crc_ok(&self) -> bool {
        let stored = u32::from_be_bytes(self.bytes[OFFSET_CRC..OFFSET_CRC + 4].try_into().unwrap());
        crc32c::crc32c(&self.bytes[OFFSET_ATTRIBUTES..]) == stored
    }

    /// Calls `f` with the intended send time carried in each record value. Decompresses into
    /// `scratch` when the batch is compressed; records whose value is shorter than 8 bytes (not
    /// written by this bench) are skipped.
    pub fn for_each_stamp(&self, scratch: &mut Vec<u8>, mut f: impl FnMut(u64)) -> Result<()> {
        let raw = &self.bytes[BATCH_HEADER_BYTES..];
        let records: &[u8] = match self.compression_bits() {
            0 => raw,
            1 => {
                scratch.clear();
                flate2::read::GzDecoder::new(raw).read_to_end(scratch)?;
                scratch
            }
            3 => {
                scratch.clear();
                lz4_flex::frame::FrameDecoder::new(raw).read_to_end(scratch)?;
                scratch
            }
            other => bail!("compression codec {other} is not supported by kaas-bench"),
        };
        let mut pos = 0;
        for _ in 0..self.record_count() {
            let len = get_varint(records, &mut pos)? as usize;
            let end = pos + len;
            if end > records.len() {
                bail!("record runs past the end of its batch");
            }
            pos += 1; // attributes
            get_varint(records, &mut pos)?; // timestamp delta
            get_varint(records, &mut pos)?; // offset delta
            let key_len = get_varint(records, &mut pos)?;
            if key_len > 0 {
                pos += key_len as usize;
            }
            let value_len = get_varint(records, &mut pos)?;
            if value_len >= 8 && pos + 8 <= end {
                f(u64::from_be_bytes(
                    records[pos..pos + 8].try_into().unwrap(),
                ));
            }
            pos = end;
        }
        Ok(())
    }
}

/// Walks the complete batches of a fetched record set. A partial batch at the end (the broker
/// may cut one at the size limit) is not yielded.
pub fn batches(records: &[u8]) -> impl Iterator<Item = BatchView<'_>> {
    let mut rest = records;
    std::iter::from_fn(move || {
        if rest.len() < BATCH_HEADER_BYTES {
            return None;
        }
        let len = i32::from_be_bytes(rest[8..12].try_into().unwrap());
        if len < (BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES) as i32 {
            return None;
        }
        let total = LOG_OVERHEAD_BYTES + len as usize;
        if rest.len() < total {
            return None;
        }
        let (batch, tail) = rest.split_at(total);
        rest = tail;
        Some(BatchView { bytes: batch })
    })
}

/// A fixed pseudo-random payload of uppercase letters, like Kafka's ProducerPerformance uses,
/// so compression ratios are comparable between the two tools.
pub fn filler(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'A' + (x % 26) as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_wire::kafka_protocol::records::RecordBatchDecoder;

    /// Our murmur2 matches the values in Kafka's own UtilsTest.
    #[test]
    fn murmur2_matches_kafka() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (input, want) in cases {
            assert_eq!(murmur2(input), want, "{:?}", std::str::from_utf8(input));
        }
    }

    /// Varints round-trip and their length function agrees with the encoder.
    #[test]
    fn varint_round_trip() {
        for v in [
            0i64,
            1,
            -1,
            63,
            -64,
            64,
            300,
            -300,
            i32::MAX as i64,
            i64::MIN,
            i64::MAX,
        ] {
            let mut b = BytesMut::new();
            put_varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
            let mut pos = 0;
            assert_eq!(get_varint(&b, &mut pos).unwrap(), v);
            assert_eq!(pos, b.len());
        }
    }

    fn build(compression: Compression, keyed: bool) -> (BytesMut, Vec<u64>) {
        let fill = filler(200, 7);
        let mut b = BatchBuilder::default();
        for i in 0..5u64 {
            let key = format!("key-{i}");
            b.append(
                1_700_000_000_000 + i as i64,
                1000 + i,
                keyed.then_some(key.as_bytes()),
                100,
                &fill,
            );
        }
        let stamps = std::mem::take(&mut b.stamps_ns);
        let mut out = BytesMut::new();
        b.seal(&mut out, compression).unwrap();
        assert!(b.is_empty());
        (out, stamps)
    }

    /// A sealed batch decodes with the kafka-protocol crate's decoder (an independent reading of
    /// the format, CRC checked), with every codec we offer.
    #[test]
    fn sealed_batches_decode_with_kafka_protocol() {
        for compression in [Compression::None, Compression::Gzip, Compression::Lz4] {
            for keyed in [false, true] {
                let (out, _) = build(compression, keyed);
                let mut bytes = out.clone().freeze();
                let set = RecordBatchDecoder::decode_with_custom_compression(
                    &mut bytes,
                    Some(|buf: &mut bytes::Bytes, c| {
                        let mut v = Vec::new();
                        match c {
                            kaas_wire::kafka_protocol::records::Compression::None => {
                                v.extend_from_slice(buf)
                            }
                            kaas_wire::kafka_protocol::records::Compression::Gzip => {
                                flate2::read::GzDecoder::new(&buf[..]).read_to_end(&mut v)?;
                            }
                            kaas_wire::kafka_protocol::records::Compression::Lz4 => {
                                lz4_flex::frame::FrameDecoder::new(&buf[..]).read_to_end(&mut v)?;
                            }
                            other => anyhow::bail!("unexpected {other:?}"),
                        }
                        Ok(bytes::Bytes::from(v))
                    }),
                )
                .unwrap();
                assert_eq!(set.records.len(), 5, "{compression:?}");
                for (i, r) in set.records.iter().enumerate() {
                    assert_eq!(r.offset, i as i64);
                    assert_eq!(r.timestamp, 1_700_000_000_000 + i as i64);
                    let v = r.value.as_ref().unwrap();
                    assert_eq!(v.len(), 100);
                    assert_eq!(
                        u64::from_be_bytes(v[..8].try_into().unwrap()),
                        1000 + i as u64
                    );
                    assert_eq!(
                        r.key.as_deref(),
                        keyed
                            .then(|| format!("key-{i}"))
                            .as_deref()
                            .map(str::as_bytes)
                    );
                }
            }
        }
    }

    /// The header walker counts records, finds the next offset and reads the stamps back,
    /// and stops before a truncated trailing batch.
    #[test]
    fn walker_counts_and_stamps() {
        for compression in [Compression::None, Compression::Gzip, Compression::Lz4] {
            let (one, stamps) = build(compression, true);
            let mut set = BytesMut::new();
            set.extend_from_slice(&one);
            // Second batch at base offset 5.
            let mut second = one.clone();
            second[0..8].copy_from_slice(&5i64.to_be_bytes());
            set.extend_from_slice(&second);
            // A truncated third batch.
            set.extend_from_slice(&one[..one.len() - 3]);
            let views: Vec<_> = batches(&set).collect();
            assert_eq!(views.len(), 2);
            assert_eq!(views[0].record_count(), 5);
            assert_eq!(views[0].next_offset(), 5);
            assert_eq!(views[1].next_offset(), 10);
            assert!(views[0].crc_ok());
            assert_eq!(views[0].magic(), 2);
            assert!(!views[0].is_control());
            let mut got = Vec::new();
            let mut scratch = Vec::new();
            views[1]
                .for_each_stamp(&mut scratch, |s| got.push(s))
                .unwrap();
            assert_eq!(got, stamps);
        }
    }

    /// The size estimate used for batch filling equals the bytes actually appended.
    #[test]
    fn record_size_estimate_is_exact() {
        let fill = filler(2000, 1);
        let mut b = BatchBuilder::default();
        let mut expected = BATCH_HEADER_BYTES;
        for i in 0..3 {
            let key = b"some-key";
            expected += b.record_size_bytes(Some(key.len()), 1024);
            b.append(i, 0, Some(key), 1024, &fill);
        }
        assert_eq!(b.size_bytes(), expected);
    }

    /// Keys spread over all partitions roughly evenly.
    #[test]
    fn keys_spread_over_partitions() {
        let mut counts = [0u32; 10];
        for k in 0..10_000u64 {
            counts[partition_for_key(format!("{k:016}").as_bytes(), 10) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800 && c < 1200), "{counts:?}");
    }
}
