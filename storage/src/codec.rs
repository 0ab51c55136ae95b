//! Record-batch compression codecs, as Kafka frames them (attribute bits 0-2 of a magic-2
//! batch): 1 gzip (a gzip stream), 2 snappy (xerial-framed: the `\x82SNAPPY\0` header, then
//! blocks each prefixed by a 4-byte big-endian length; raw snappy is accepted too, as Kafka's
//! Java reader does), 3 lz4 (the LZ4 frame format, independent 64 KiB blocks, which is what
//! Kafka's Java reader accepts), 4 zstd (a standard zstd frame).
//!
//! Used by compaction, and on produce to check a compressed batch's records and to recompress
//! it for a topic whose `compression.type` names another codec; otherwise the broker stores and
//! serves compressed batches as the producer sent them.
//!
//! Decompression is bounded by the caller's `limit`: batch bodies come from producers, and a
//! few kilobytes of gzip can claim gigabytes, so nothing past the limit is allocated.

use std::io::{Read, Write};

/// A batch with the fields of `header` (a batch's first `BATCH_HEADER_LEN` bytes) around
/// `parts`, the uncompressed bytes of its `record_count` records in order, stored with `codec`
/// (`None`: uncompressed): the codec bits, length, record count and CRC are set to match.
/// What compaction writes of a batch it filtered or emptied, and what a topic's
/// `compression.type` makes of a produced batch.
///
/// # Errors
/// [`CodecError`] when `codec` fails to compress the records.
pub fn assemble_batch(
    header: &[u8],
    parts: &[&[u8]],
    codec: Option<Codec>,
    record_count: i32,
) -> Result<Vec<u8>, CodecError> {
    use kaas_wire::batch::{
        seal_crc, ATTRIBUTES_OFFSET, BATCH_HEADER_LEN, BATCH_LENGTH_OFFSET, LOG_OVERHEAD,
        RECORD_COUNT_OFFSET,
    };
    let body_len: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(BATCH_HEADER_LEN + body_len);
    out.extend_from_slice(&header[..BATCH_HEADER_LEN]);
    match (codec, parts) {
        (None, _) => parts.iter().for_each(|p| out.extend_from_slice(p)),
        (Some(c), [one]) => c.compress(one, &mut out)?,
        (Some(c), _) => c.compress(&parts.concat(), &mut out)?,
    }
    let at = |offset: usize, n: usize| offset..offset + n;
    let attributes = i16::from_be_bytes([header[ATTRIBUTES_OFFSET], header[ATTRIBUTES_OFFSET + 1]]);
    let attributes = (attributes & !0x07) | codec.map_or(0, Codec::attribute);
    out[at(ATTRIBUTES_OFFSET, 2)].copy_from_slice(&attributes.to_be_bytes());
    // Bounded well below i32::MAX: records come from a request or a segment, both bounded.
    let length = (out.len() - LOG_OVERHEAD) as i32;
    out[at(BATCH_LENGTH_OFFSET, 4)].copy_from_slice(&length.to_be_bytes());
    out[at(RECORD_COUNT_OFFSET, 4)].copy_from_slice(&record_count.to_be_bytes());
    seal_crc(&mut out);
    Ok(out)
}

/// A compression codec of a magic-2 batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

/// Why a body could not be decompressed or compressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    /// Attribute bits that name no codec we know.
    Unknown(i16),
    /// The decompressed body would exceed the caller's limit.
    TooLarge { limit: usize },
    /// The compressed bytes are not a valid stream of their codec.
    Corrupt(String),
}

impl Codec {
    /// The codec for a batch's attribute bits 0-2; `Ok(None)` for an uncompressed batch.
    pub fn from_attributes(attributes: i16) -> Result<Option<Codec>, CodecError> {
        match attributes & 0x07 {
            0 => Ok(None),
            1 => Ok(Some(Codec::Gzip)),
            2 => Ok(Some(Codec::Snappy)),
            3 => Ok(Some(Codec::Lz4)),
            4 => Ok(Some(Codec::Zstd)),
            other => Err(CodecError::Unknown(other)),
        }
    }

    /// This codec's attribute bits (0-2) in a batch header.
    pub fn attribute(self) -> i16 {
        match self {
            Codec::Gzip => 1,
            Codec::Snappy => 2,
            Codec::Lz4 => 3,
            Codec::Zstd => 4,
        }
    }

    /// Appends the decompressed form of `compressed` to `out` (cleared first), refusing to
    /// produce more than `limit` bytes.
    pub fn decompress(
        self,
        compressed: &[u8],
        limit: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        out.clear();
        match self {
            Codec::Gzip => read_bounded(flate2::read::MultiGzDecoder::new(compressed), limit, out),
            Codec::Lz4 => read_bounded(lz4_flex::frame::FrameDecoder::new(compressed), limit, out),
            Codec::Zstd => {
                let d = zstd::stream::read::Decoder::with_buffer(compressed).map_err(corrupt)?;
                read_bounded(d, limit, out)
            }
            Codec::Snappy => snappy_decompress(compressed, limit, out),
        }
    }

    /// Appends the compressed form of `raw` to `out`.
    pub fn compress(self, raw: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        match self {
            Codec::Gzip => {
                let mut w = flate2::write::GzEncoder::new(out, flate2::Compression::default());
                w.write_all(raw).map_err(corrupt)?;
                w.finish().map_err(corrupt)?;
            }
            Codec::Lz4 => {
                let info = lz4_flex::frame::FrameInfo::new()
                    .block_size(lz4_flex::frame::BlockSize::Max64KB)
                    .block_mode(lz4_flex::frame::BlockMode::Independent);
                let mut w = lz4_flex::frame::FrameEncoder::with_frame_info(info, out);
                w.write_all(raw).map_err(corrupt)?;
                w.finish().map_err(corrupt)?;
            }
            Codec::Zstd => {
                // Level 3: zstd's default, and what Kafka's Java producer uses.
                let mut w = zstd::stream::write::Encoder::new(out, 3).map_err(corrupt)?;
                w.write_all(raw).map_err(corrupt)?;
                w.finish().map_err(corrupt)?;
            }
            Codec::Snappy => snappy_compress(raw, out)?,
        }
        Ok(())
    }
}

fn corrupt(e: impl std::fmt::Display) -> CodecError {
    CodecError::Corrupt(e.to_string())
}

/// Reads `r` to its end into `out`, failing once it yields more than `limit` bytes.
fn read_bounded(r: impl Read, limit: usize, out: &mut Vec<u8>) -> Result<(), CodecError> {
    let n = r.take(limit as u64 + 1).read_to_end(out).map_err(corrupt)?;
    if n > limit {
        return Err(CodecError::TooLarge { limit });
    }
    Ok(())
}

/// xerial's stream header: magic, then version 1 and minimum compatible version 1.
const XERIAL_HEADER: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
/// The block size xerial's (and so Kafka's Java) snappy writer uses.
const XERIAL_BLOCK_BYTES: usize = 32 * 1024;

fn snappy_block(block: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), CodecError> {
    let n = snap::raw::decompress_len(block).map_err(corrupt)?;
    if n > limit.saturating_sub(out.len()) {
        return Err(CodecError::TooLarge { limit });
    }
    let at = out.len();
    out.resize(at + n, 0);
    let written = snap::raw::Decoder::new()
        .decompress(block, &mut out[at..])
        .map_err(corrupt)?;
    out.truncate(at + written);
    Ok(())
}

fn snappy_decompress(compressed: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), CodecError> {
    // Only the 8-byte magic is checked: the version fields that follow vary between writers.
    let Some(mut rest) = compressed
        .strip_prefix(&XERIAL_HEADER[..8])
        .and_then(|r| r.get(8..))
    else {
        return snappy_block(compressed, limit, out);
    };
    while !rest.is_empty() {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(CodecError::Corrupt("truncated xerial block length".into()));
        };
        let len = u32::from_be_bytes(*len) as usize;
        let Some(block) = tail.get(..len) else {
            return Err(CodecError::Corrupt(
                "xerial block runs past the batch".into(),
            ));
        };
        snappy_block(block, limit, out)?;
        rest = &tail[len..];
    }
    Ok(())
}

fn snappy_compress(raw: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
    out.extend_from_slice(XERIAL_HEADER);
    let mut enc = snap::raw::Encoder::new();
    for block in raw.chunks(XERIAL_BLOCK_BYTES) {
        let len_at = out.len();
        out.extend_from_slice(&[0; 4]);
        let at = out.len();
        out.resize(at + snap::raw::max_compress_len(block.len()), 0);
        let n = enc.compress(block, &mut out[at..]).map_err(corrupt)?;
        out.truncate(at + n);
        out[len_at..at].copy_from_slice(&(n as u32).to_be_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Codec; 4] = [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd];

    // Every codec round-trips, including an empty body and one spanning many blocks.
    #[test]
    fn round_trip() {
        let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for codec in ALL {
            for raw in [&b""[..], b"hello hello hello", &big] {
                let mut c = Vec::new();
                codec.compress(raw, &mut c).unwrap();
                let mut d = Vec::new();
                codec.decompress(&c, 1 << 20, &mut d).unwrap();
                assert_eq!(d, raw, "{codec:?}");
            }
        }
    }

    // A body that decompresses past the limit is refused, not allocated.
    #[test]
    fn limit_is_enforced() {
        let zeros = vec![0u8; 1 << 20];
        for codec in ALL {
            let mut c = Vec::new();
            codec.compress(&zeros, &mut c).unwrap();
            let mut d = Vec::new();
            assert_eq!(
                codec.decompress(&c, 1000, &mut d),
                Err(CodecError::TooLarge { limit: 1000 }),
                "{codec:?}"
            );
            assert!(d.len() <= 1 << 16, "{codec:?} allocated {}", d.len());
        }
    }

    // Raw (unframed) snappy is read as Kafka's Java reader does.
    #[test]
    fn raw_snappy_accepted() {
        let raw = b"raw snappy, no xerial framing".repeat(10);
        let c = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
        let mut d = Vec::new();
        Codec::Snappy.decompress(&c, 1 << 20, &mut d).unwrap();
        assert_eq!(d, raw);
    }

    // Garbage never panics any decoder.
    #[test]
    fn garbage_is_refused() {
        for codec in ALL {
            for n in 0..64u8 {
                let junk: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37) ^ n).collect();
                let _ = codec.decompress(&junk, 1 << 16, &mut Vec::new());
            }
            let mut c = Vec::new();
            codec.compress(b"some data some data", &mut c).unwrap();
            for cut in 0..c.len() {
                let _ = codec.decompress(&c[..cut], 1 << 16, &mut Vec::new());
            }
        }
    }
}
