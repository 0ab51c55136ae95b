//! Log compaction (`cleanup.policy=compact`): keep the latest record of every key.
//!
//! The record-level work is pure and lives here: walking the records of a magic-2 batch
//! (decompressing it first when it is compressed), and rebuilding a batch from the records it
//! keeps. A rebuilt batch keeps its base offset, last offset delta, timestamps, attributes and
//! producer fields, so every surviving record keeps its offset (gaps are allowed, as in Kafka)
//! and consumers and producers see nothing else change; a compressed batch is compressed again
//! with its own codec. `PartitionLog::compact` does the IO around it.
//!
//! Transactional control batches are always kept. A compressed batch that cannot be
//! decompressed, or whose records would take more than [`MAX_DECOMPRESSED_BYTES`], is kept
//! whole and its keys take no part (conservative: nothing it holds is dropped, and it makes
//! nothing else obsolete).

use kaas_wire::batch::{self, BatchHeader, BATCH_HEADER_LEN};
use kaas_wire::varint::read_varint;

use crate::codec::{assemble_batch, Codec};

/// What the cleaning planner needs of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSummary {
    pub base_offset: i64,
    pub size: u64,
    /// The newest record timestamp in the segment, if it holds any.
    pub newest_timestamp: Option<i64>,
}

/// The topic configs that decide whether a run is worth it.
#[derive(Debug, Clone, Copy)]
pub struct CleaningRules {
    pub now_ms: i64,
    /// `min.compaction.lag.ms`: a record stays uncompacted at least this long.
    pub min_compaction_lag_ms: i64,
    /// `min.cleanable.dirty.ratio`: the dirty share of the cleanable bytes that starts a run.
    pub min_cleanable_dirty_ratio: f64,
}

/// What one compaction run covers, as positions in the segment list it was planned from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleaningPlan {
    /// Segments before this one may be rewritten. Never the active (last) segment.
    pub first_uncleanable: usize,
    /// The first segment past the cleaner checkpoint: keys are collected from here on.
    pub first_dirty: usize,
    /// The checkpoint once this run is done: the base offset of the first uncleanable segment.
    pub new_checkpoint: i64,
}

/// Plans a compaction run from the segment list alone (no IO). `segments` is the log in
/// order, the active segment last; `checkpoint` is where the last run stopped (always a
/// segment boundary).
///
/// The cleanable segments are the sealed ones before the first that holds a record newer
/// than `min.compaction.lag.ms`; those ending at or before the checkpoint are clean, the rest
/// dirty. `None` — nothing is read — unless something is dirty and the dirty share of the
/// cleanable bytes reaches `min.cleanable.dirty.ratio`.
pub fn plan_cleaning(
    segments: &[SegmentSummary],
    checkpoint: i64,
    rules: &CleaningRules,
) -> Option<CleaningPlan> {
    let last = segments.len().checked_sub(1)?;
    let lag_bound = rules.now_ms.saturating_sub(rules.min_compaction_lag_ms);
    let first_uncleanable = segments[..last]
        .iter()
        .position(|s| s.newest_timestamp.unwrap_or(i64::MIN) > lag_bound)
        .unwrap_or(last);
    let ends_by_checkpoint = |k: usize| segments[k + 1].base_offset <= checkpoint;
    let (mut clean_bytes, mut dirty_bytes) = (0u64, 0u64);
    for (k, seg) in segments[..first_uncleanable].iter().enumerate() {
        if ends_by_checkpoint(k) {
            clean_bytes += seg.size;
        } else {
            dirty_bytes += seg.size;
        }
    }
    let ratio = dirty_bytes as f64 / (clean_bytes + dirty_bytes).max(1) as f64;
    if dirty_bytes == 0 || ratio < rules.min_cleanable_dirty_ratio {
        return None;
    }
    let plan = CleaningPlan {
        first_uncleanable,
        first_dirty: (0..first_uncleanable)
            .find(|&k| !ends_by_checkpoint(k))
            .unwrap_or(first_uncleanable),
        new_checkpoint: segments[first_uncleanable].base_offset,
    };
    debug_assert!(plan.first_dirty < plan.first_uncleanable && plan.first_uncleanable <= last);
    Some(plan)
}

/// The most bytes one compressed batch may decompress to for compaction to read it. Batches
/// come from producers; this bounds what a small, highly compressed batch can make us allocate.
pub const MAX_DECOMPRESSED_BYTES: usize = 64 * 1024 * 1024;

/// One record inside a batch, as slices of the batch bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    /// A tombstone (null value) marks its key deleted.
    pub is_tombstone: bool,
    /// The whole record, including its length prefix, exactly as stored.
    pub bytes: &'a [u8],
}

fn bytes_field<'a>(b: &'a [u8], at: &mut usize) -> Option<Option<&'a [u8]>> {
    let len = read_varint(b, at)?;
    if len < 0 {
        return Some(None);
    }
    let end = at.checked_add(len as usize)?;
    let s = b.get(*at..end)?;
    *at = end;
    Some(Some(s))
}

/// The records of any data batch, compressed or not: a compressed batch is decompressed into
/// `scratch` (reused between calls) and the records borrow from it. `None` for a control
/// batch, an unknown codec, a body that does not decompress within
/// [`MAX_DECOMPRESSED_BYTES`], or records that do not parse; such a batch is kept whole.
pub fn records_in<'a>(
    batch_bytes: &'a [u8],
    scratch: &'a mut Vec<u8>,
) -> Option<Vec<RecordRef<'a>>> {
    let h = batch::peek_header(batch_bytes).ok()?;
    if h.is_control() {
        return None;
    }
    let raw = batch_bytes.get(BATCH_HEADER_LEN..h.total_len())?;
    let body: &'a [u8] = match Codec::from_attributes(h.attributes).ok()? {
        None => raw,
        Some(codec) => {
            codec
                .decompress(raw, MAX_DECOMPRESSED_BYTES, scratch)
                .ok()?;
            scratch
        }
    };
    parse_records(&h, body)
}

/// Walks the records of an (uncompressed) batch body.
fn parse_records<'a>(h: &BatchHeader, body: &'a [u8]) -> Option<Vec<RecordRef<'a>>> {
    let mut out = Vec::with_capacity(h.record_count.clamp(0, 4096) as usize);
    let mut at = 0;
    while at < body.len() {
        let start = at;
        let len = read_varint(body, &mut at)?;
        if len < 0 {
            return None;
        }
        let end = at.checked_add(len as usize)?;
        let rec = body.get(at..end)?;
        let mut r = 0;
        r += 1; // attributes
        let ts_delta = read_varint(rec, &mut r)?;
        let offset_delta = read_varint(rec, &mut r)?;
        let key = bytes_field(rec, &mut r)?;
        let value = bytes_field(rec, &mut r)?;
        out.push(RecordRef {
            offset: h.base_offset + offset_delta,
            timestamp: h.base_timestamp + ts_delta,
            key,
            is_tombstone: value.is_none(),
            bytes: &body[start..end],
        });
        at = end;
    }
    (out.len() == h.record_count as usize).then_some(out)
}

/// A 128-bit digest of a key for the offset map (two independent 64-bit FNV-1a variants), so
/// the map holds 16 bytes per key whatever the key size, with a negligible collision chance.
pub fn key_digest(key: &[u8]) -> u128 {
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x6c62_272e_07bb_0142;
    for &x in key {
        a = (a ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3);
        b = (b ^ (x as u64).rotate_left(5))
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(13);
    }
    ((a as u128) << 64) | b as u128
}

/// The batch rebuilt from the records `keep` accepts: same header fields, fewer records, a new
/// length and CRC; a compressed batch's kept records are compressed again with its codec.
/// `Kept::All` when every record stays (or a compressed batch could not be rebuilt),
/// `Kept::None` when none does.
pub enum Kept {
    All,
    None,
    Some(Vec<u8>),
}

pub fn filter_batch(
    batch_bytes: &[u8],
    recs: &[RecordRef<'_>],
    keep: impl Fn(&RecordRef<'_>) -> bool,
) -> Kept {
    let kept: Vec<&RecordRef<'_>> = recs.iter().filter(|r| keep(r)).collect();
    if kept.len() == recs.len() {
        return Kept::All;
    }
    if kept.is_empty() {
        return Kept::None;
    }
    let attributes = i16::from_be_bytes([batch_bytes[21], batch_bytes[22]]);
    let Ok(codec) = Codec::from_attributes(attributes) else {
        return Kept::All;
    };
    let parts: Vec<&[u8]> = kept.iter().map(|r| r.bytes).collect();
    match assemble_batch(batch_bytes, &parts, codec, kept.len() as i32) {
        Ok(out) => Kept::Some(out),
        Err(_) => Kept::All,
    }
}

/// The header of `batch_bytes` alone, with no records: what compaction leaves of a producer's
/// last batch when all its records are removed, so that the producer's sequence and epoch
/// survive in the log (as Kafka's cleaner does). Offsets, timestamps and producer fields are
/// kept; the codec bits are cleared, as there is nothing to decompress.
pub fn empty_batch(batch_bytes: &[u8]) -> Vec<u8> {
    assemble_batch(batch_bytes, &[], None, 0).expect("nothing to compress")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_wire::batch::{build_batch, verify_batch, BatchSpec};

    /// The records of an uncompressed batch (`None` for a compressed one).
    fn records(b: &[u8]) -> Option<Vec<RecordRef<'_>>> {
        let h = batch::peek_header(b).ok()?;
        if h.compression() != 0 {
            return None;
        }
        super::parse_records(&h, b.get(BATCH_HEADER_LEN..h.total_len())?)
    }

    // Records parse back to their keys, offsets and tombstone flags.
    #[test]
    fn parse_records() {
        let b = build_batch(
            BatchSpec {
                base_offset: 10,
                timestamp: 5,
                ..Default::default()
            },
            &[
                (Some(b"a"), Some(b"1")),
                (None, Some(b"2")),
                (Some(b"b"), None),
            ],
        );
        let rs = records(&b).unwrap();
        assert_eq!(rs.len(), 3);
        assert_eq!(
            (rs[0].offset, rs[0].key, rs[0].is_tombstone),
            (10, Some(&b"a"[..]), false)
        );
        assert_eq!((rs[1].offset, rs[1].key), (11, None));
        assert_eq!((rs[2].offset, rs[2].is_tombstone), (12, true));
    }

    // A filtered batch verifies, keeps its offset span, and holds only the kept records.
    #[test]
    fn filter_keeps_offsets() {
        let b = build_batch(
            BatchSpec {
                base_offset: 100,
                ..Default::default()
            },
            &[
                (Some(b"k1"), Some(b"old")),
                (Some(b"k2"), Some(b"x")),
                (Some(b"k1"), Some(b"new")),
            ],
        );
        let rs = records(&b).unwrap();
        let Kept::Some(nb) = filter_batch(&b, &rs, |r| r.offset != 100) else {
            panic!("expected a rebuilt batch")
        };
        let h = verify_batch(&nb).unwrap();
        assert_eq!(
            (h.base_offset, h.last_offset(), h.record_count),
            (100, 102, 2)
        );
        let kept = records(&nb).unwrap();
        assert_eq!(
            kept.iter().map(|r| r.offset).collect::<Vec<_>>(),
            vec![101, 102]
        );
        assert!(matches!(filter_batch(&b, &rs, |_| true), Kept::All));
        assert!(matches!(filter_batch(&b, &rs, |_| false), Kept::None));
    }

    // A compressed batch's records are read, and the rebuilt batch is compressed with the same
    // codec; an emptied producer batch keeps its header fields and verifies.
    #[test]
    fn compressed_filter_and_empty() {
        let plain = build_batch(
            BatchSpec {
                base_offset: 50,
                producer_id: 3,
                producer_epoch: 1,
                base_sequence: 7,
                ..Default::default()
            },
            &[(Some(b"x"), Some(b"1")), (Some(b"y"), Some(b"2"))],
        );
        let b =
            assemble_batch(&plain, &[&plain[BATCH_HEADER_LEN..]], Some(Codec::Zstd), 2).unwrap();
        assert!(
            records(&b).is_none(),
            "records() reads uncompressed batches only"
        );
        let mut scratch = Vec::new();
        let rs = records_in(&b, &mut scratch).unwrap();
        assert_eq!(rs.iter().map(|r| r.offset).collect::<Vec<_>>(), [50, 51]);
        let Kept::Some(nb) = filter_batch(&b, &rs, |r| r.offset == 51) else {
            panic!("expected a rebuilt batch")
        };
        let h = verify_batch(&nb).unwrap();
        assert_eq!(
            (h.compression(), h.record_count, h.last_offset()),
            (4, 1, 51)
        );
        let mut scratch2 = Vec::new();
        let kept = records_in(&nb, &mut scratch2).unwrap();
        assert_eq!((kept[0].offset, kept[0].key), (51, Some(&b"y"[..])));
        let e = verify_batch(&empty_batch(&b)).unwrap();
        assert_eq!(
            (
                e.record_count,
                e.compression(),
                e.last_offset(),
                e.base_sequence
            ),
            (0, 0, 51, 7)
        );
        assert_eq!(e.total_len(), BATCH_HEADER_LEN);
    }

    // Garbage never panics the record walker.
    #[test]
    fn garbage_is_refused() {
        let mut b = build_batch(BatchSpec::default(), &[(Some(b"key"), Some(b"value"))]);
        let n = b.len();
        for i in 61..n {
            b[i] = 0xff;
            let _ = records(&b);
        }
    }
}
