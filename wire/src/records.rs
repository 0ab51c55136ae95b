//! The records inside a produced batch, walked and checked as Kafka's `DefaultRecord.readFrom`
//! reads them.
//!
//! The header and CRC checks of [`crate::batch`] prove only that the bytes arrived as the
//! producer sent them. A batch whose records do not parse (a count that lies, a length that
//! runs past its record, a negative header count, bytes left over) would be stored and then
//! stop every consumer of the partition at it: librdkafka stops delivering without an error,
//! kafka-python raises `CorruptRecordError`. So a produced batch's records are walked once,
//! uncompressed (the caller decompresses), before anything of it is stored; the walk also gives
//! what the broker checks per record (keys on a compacted topic, timestamps) and the true
//! maximum timestamp.
//!
//! Record layout (zig-zag varints):
//! ```text
//! length | attributes i8 | timestamp delta | offset delta | key length, key (-1: null)
//!        | value length, value (-1: null) | header count, then per header:
//!        | key length (>= 0), key | value length, value (-1: null)
//! ```

use crate::varint::read_varint;

/// One record, borrowed from the batch body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// Its position in the batch (0 for the first).
    pub index: i32,
    pub timestamp_delta: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// Why a batch's records were refused: the position of the first record that is wrong (the
/// record count when the records end early or bytes follow the last), and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record {index}: {reason}")]
pub struct InvalidRecords {
    pub index: i32,
    pub reason: String,
}

/// Walks the `count` records of an uncompressed batch body, calling `each` for every record
/// in order, and checks that they fill the body exactly. A record's offset delta must be its
/// position: a producer numbers its records from 0, and the stored batch is read that way by
/// every consumer (Kafka checks it for compressed batches; for all here, since a wrong delta
/// makes consumers see offsets the log never assigned).
///
/// # Errors
/// [`InvalidRecords`] for the first record that does not parse, a record that does not use
/// exactly its length, too few records, or bytes after the last.
pub fn for_each_record<'a>(
    body: &'a [u8],
    count: i32,
    mut each: impl FnMut(RecordView<'a>),
) -> Result<(), InvalidRecords> {
    let mut at = 0;
    for index in 0..count.max(0) {
        let bad = |reason: &str| InvalidRecords {
            index,
            reason: reason.to_owned(),
        };
        if at == body.len() {
            return Err(bad(&format!(
                "the batch claims {count} records and holds {index}"
            )));
        }
        let len = read_varint(body, &mut at).ok_or_else(|| bad("truncated record length"))?;
        let len = usize::try_from(len).map_err(|_| bad("negative record length"))?;
        let record = at
            .checked_add(len)
            .and_then(|end| body.get(at..end))
            .ok_or_else(|| bad("record length runs past the batch"))?;
        at += len;
        let view = read_record(record, index).map_err(bad)?;
        each(view);
    }
    if at != body.len() {
        return Err(InvalidRecords {
            index: count,
            reason: format!(
                "{} bytes follow the last of the {count} records the batch claims",
                body.len() - at
            ),
        });
    }
    Ok(())
}

/// Reads one record's body (after its length), which it must fill exactly.
fn read_record(record: &[u8], index: i32) -> Result<RecordView<'_>, &'static str> {
    let mut at = 1; // attributes: unused in magic 2
    if record.is_empty() {
        return Err("empty record");
    }
    let timestamp_delta = read_varint(record, &mut at).ok_or("truncated timestamp delta")?;
    let offset_delta = read_varint(record, &mut at).ok_or("truncated offset delta")?;
    if offset_delta != i64::from(index) {
        return Err("offset delta is not the record's position in the batch");
    }
    let key = bytes_field(record, &mut at).ok_or("key runs past the record")?;
    let value = bytes_field(record, &mut at).ok_or("value runs past the record")?;
    let headers = read_varint(record, &mut at).ok_or("truncated header count")?;
    if headers < 0 {
        return Err("negative header count");
    }
    for _ in 0..headers {
        match bytes_field(record, &mut at) {
            Some(Some(_)) => {}
            Some(None) => return Err("negative header key length"),
            None => return Err("header key runs past the record"),
        }
        bytes_field(record, &mut at).ok_or("header value runs past the record")?;
    }
    if at != record.len() {
        return Err("the record's fields do not fill its length");
    }
    Ok(RecordView {
        index,
        timestamp_delta,
        key,
        value,
    })
}

/// A length-prefixed byte field: `Some(None)` for a negative length (null), `None` when it
/// runs past the end.
fn bytes_field<'a>(b: &'a [u8], at: &mut usize) -> Option<Option<&'a [u8]>> {
    let len = read_varint(b, at)?;
    let Ok(len) = usize::try_from(len) else {
        return Some(None);
    };
    let end = at.checked_add(len)?;
    let s = b.get(*at..end)?;
    *at = end;
    Some(Some(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{build_batch, BatchSpec, RecordKv, BATCH_HEADER_LEN};
    use crate::varint::put_varint;
    use proptest::prelude::*;

    fn body(records: &[RecordKv<'_>]) -> Vec<u8> {
        build_batch(BatchSpec::default(), records)[BATCH_HEADER_LEN..].to_vec()
    }

    /// Each record's key and value, owned.
    type Walked = Vec<(Option<Vec<u8>>, Option<Vec<u8>>)>;

    fn walk(body: &[u8], count: i32) -> Result<Walked, i32> {
        let mut seen = Vec::new();
        for_each_record(body, count, |r| {
            seen.push((r.key.map(<[u8]>::to_vec), r.value.map(<[u8]>::to_vec)));
        })
        .map(|()| seen)
        .map_err(|e| e.index)
    }

    /// One record from its fields, for malformed cases.
    fn record(fields: &[i64], tail: &[u8]) -> Vec<u8> {
        let mut inner = vec![0u8];
        for f in fields {
            put_varint(&mut inner, *f);
        }
        inner.extend_from_slice(tail);
        let mut out = Vec::new();
        put_varint(&mut out, inner.len() as i64);
        out.extend_from_slice(&inner);
        out
    }

    #[test]
    fn a_well_formed_batch_walks_every_record() {
        let b = body(&[(Some(&b"k"[..]), Some(&b"v"[..])), (None, None)]);
        assert_eq!(
            walk(&b, 2),
            Ok(vec![
                (Some(b"k".to_vec()), Some(b"v".to_vec())),
                (None, None)
            ])
        );
    }

    #[test]
    fn a_count_that_lies_or_bytes_left_over_are_refused() {
        let one = body(&[(None, Some(&b"v"[..]))]);
        assert_eq!(walk(&one, 2), Err(1), "count 2, one record");
        assert_eq!(walk(&one, 0), Err(0), "count 0, one record");
        let mut extra = one.clone();
        extra.push(0);
        assert_eq!(walk(&extra, 1), Err(1), "a byte after the last record");
    }

    #[test]
    fn malformed_records_are_refused_with_their_position() {
        let good = record(&[0, 0, -1, -1, 0], b"");
        // The second record's fields: timestamp delta, offset delta, key length, value
        // length, header count (then header fields); then bytes after them.
        assert_eq!(
            walk(&[good.clone(), record(&[0, 1, -1, -1, 0], b"")].concat(), 2).map(|r| r.len()),
            Ok(2)
        );
        for (fields, tail, why) in [
            (
                &[0, 5, -1, -1, 0][..],
                &b""[..],
                "offset delta 5 for record 1",
            ),
            (&[0, 1, 5, 1], &b"ab"[..], "key longer than the record"),
            (&[0, 1, -1, -1, -1], &b""[..], "negative header count"),
            (&[0, 1, -1, -1, 1, -1, -1], &b""[..], "null header key"),
            (
                &[0, 1, -1, -1, 2, 1],
                &b"k\x00"[..],
                "second header missing",
            ),
            (&[0, 1, -1, -1, 0], &b"junk"[..], "bytes after the headers"),
        ] {
            let mut b = good.clone();
            b.extend_from_slice(&record(fields, tail));
            assert_eq!(walk(&b, 2), Err(1), "{why}");
        }
        let mut runs_past = good.clone();
        put_varint(&mut runs_past, 100);
        runs_past.push(0);
        assert_eq!(walk(&runs_past, 2), Err(1), "length past the batch");
        assert_eq!(walk(&[0x80], 1), Err(0), "truncated length");
        assert_eq!(walk(&[0x01], 1), Err(0), "negative length");
        assert_eq!(walk(&[0x00], 1), Err(0), "empty record");
    }

    proptest! {
        /// Every batch the builder makes walks back to its records.
        #[test]
        fn built_batches_walk_back(records in prop::collection::vec(
            (prop::option::of(prop::collection::vec(any::<u8>(), 0..20)),
             prop::option::of(prop::collection::vec(any::<u8>(), 0..40))), 1..20)) {
            let kvs: Vec<RecordKv<'_>> = records
                .iter()
                .map(|(k, v)| (k.as_deref(), v.as_deref()))
                .collect();
            let b = body(&kvs);
            prop_assert_eq!(walk(&b, records.len() as i32), Ok(records));
        }

        /// Arbitrary bytes under any count: refused or walked, never a panic or a read past.
        #[test]
        fn arbitrary_bodies_never_panic(b in prop::collection::vec(any::<u8>(), 0..300), count in -2i32..50) {
            let _ = walk(&b, count);
        }
    }
}
