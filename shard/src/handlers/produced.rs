//! What a produced record set must be before it is stored, beyond its batch headers: checked
//! once per partition on the owning shard, before the append takes its place in the log.
//!
//! - No control batch (only a transaction coordinator writes those: a client's would hide its
//!   records from every consumer) and no transactional batch (kaas has no transactions, so
//!   nothing would ever commit or abort it, and read_committed consumers would wait on it).
//! - Records that parse, as many as the header claims, filling the batch (see
//!   `kaas_wire::records`); a compressed batch is decompressed for that, as Kafka's
//!   `LogValidator` does. A batch that does not parse would be stored and stop every consumer
//!   of the partition at it.
//! - On a compacted topic, a key on every record.
//! - With CreateTime, every record's timestamp within the topic's window (Kafka checks each
//!   record, not only the header's first and newest).
//! - A topic whose `compression.type` names a codec (or `uncompressed`) stores every batch that
//!   way: a batch the producer compressed otherwise is rebuilt, as Kafka's `LogValidator`
//!   recompresses, and checked against `max.message.bytes` as stored.
//! - The header's newest timestamp is the newest record's: ListOffsets by time, the time index
//!   and time retention read it, so a producer that states it wrongly (or sets the
//!   LogAppendTime bit on a CreateTime topic) has it corrected and the CRC sealed again, as
//!   Kafka's `setMaxTimestamp` does. Only such a batch is copied; a correct one is stored from
//!   the request's bytes.

use std::cell::RefCell;

use bytes::Bytes;
use kaas_wire::batch::{self, BatchHeader};

use crate::errors;
use crate::handlers::groups::coordinator::TRANSACTIONS_UNSUPPORTED;
use crate::topic_config::ProduceRules;

/// Why a record set is refused: the Kafka error, the message for the client, and the positions
/// of the records at fault (over the record set, Produce v8+'s `record_errors`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: i16,
    pub message: String,
    pub record_errors: Vec<i32>,
}

/// Past this, a shard's decompression buffer is let go after use, so one large batch does not
/// keep its size in memory for the shard's life.
const KEEP_SCRATCH_BYTES: usize = 1 << 20;

thread_local! {
    /// Each shard decompresses one batch at a time (the walk never awaits), so one buffer per
    /// shard thread bounds what decompression holds to `MAX_DECOMPRESSED_BYTES` per shard.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Checks `records` (whose batches `headers` describes, already verified) against the rules
/// of its topic, at broker time `now_ms`. Returns the record set to store — `records` itself,
/// or a copy recompressed for the topic's `compression.type` or with corrected newest
/// timestamps — with its headers.
///
/// # Errors
/// A [`Refusal`]: nothing of the record set may be stored.
pub fn check(
    records: Bytes,
    headers: Vec<BatchHeader>,
    rules: &ProduceRules,
    now_ms: i64,
    partition: &dyn std::fmt::Display,
) -> Result<(Bytes, Vec<BatchHeader>), Refusal> {
    refuse_batch_kinds(&headers, partition)?;
    let walked = walk(&records, &headers, rules, now_ms, partition)?;
    if rules.keys_required && !walked.keyless.is_empty() {
        // Kafka refuses the whole batch, naming the keyless records: a keyless record cannot
        // be compacted. librdkafka then fails those with INVALID_RECORD and the others with
        // _INVALID_DIFFERENT_RECORD.
        return Err(Refusal {
            code: errors::INVALID_RECORD,
            message: format!(
                "Compacted topic cannot accept message without key in topic partition {partition}."
            ),
            record_errors: walked.keyless,
        });
    }
    if let (Some(ts), Some((before, after))) = (walked.first_late, rules.create_time_window) {
        // Kafka refuses the batch with this code and text; the client fails its records.
        return Err(Refusal {
            code: errors::INVALID_TIMESTAMP,
            message: format!(
                "Timestamp {ts} of a record in topic partition {partition} is out of range. \
                 The timestamp should be within [{}, {}] (message.timestamp.before.max.ms, \
                 message.timestamp.after.max.ms)",
                now_ms.saturating_sub(before),
                now_ms.saturating_add(after)
            ),
            record_errors: walked.late,
        });
    }
    let (records, headers) = match recompressed(&records, &headers, walked.recompressed) {
        Some(set) => set,
        None => (records, headers),
    };
    // Kafka checks the size of what it stores, after recompression (the produced sizes were
    // checked before the walk, so only a recompressed set can newly exceed it).
    if let Some(h) = headers
        .iter()
        .find(|h| h.total_len() > rules.max_batch_bytes)
    {
        return Err(Refusal {
            code: errors::MESSAGE_TOO_LARGE,
            message: format!(
                "A batch of {} bytes as stored (compression.type of topic partition \
                 {partition}) is larger than max.message.bytes ({})",
                h.total_len(),
                rules.max_batch_bytes
            ),
            record_errors: Vec::new(),
        });
    }
    if rules.log_append_time {
        // The append stamps the broker's time over the header anyway.
        return Ok((records, headers));
    }
    Ok(correct_newest(records, headers, &walked.newest))
}

/// The record set with the batches `converted` holds (by batch index) in place of the
/// producer's (those the topic's `compression.type` recompressed), or `None` when none was.
fn recompressed(
    records: &[u8],
    headers: &[BatchHeader],
    converted: Vec<(usize, Vec<u8>)>,
) -> Option<(Bytes, Vec<BatchHeader>)> {
    if converted.is_empty() {
        return None;
    }
    let mut converted = converted.into_iter().peekable();
    let mut out = Vec::with_capacity(records.len());
    let mut out_headers = Vec::with_capacity(headers.len());
    let mut at = 0;
    for (i, h) in headers.iter().enumerate() {
        let new = converted.next_if(|(j, _)| *j == i).map(|(_, batch)| batch);
        match new {
            Some(batch) => {
                // Built and sealed by us: its header is read, not verified again.
                out_headers.push(batch::peek_header(&batch).expect("a batch assembled whole"));
                out.extend_from_slice(&batch);
            }
            None => {
                out_headers.push(*h);
                out.extend_from_slice(&records[at..at + h.total_len()]);
            }
        }
        at += h.total_len();
    }
    Some((Bytes::from(out), out_headers))
}

/// Control and transactional batches, which no client of kaas may write.
fn refuse_batch_kinds(
    headers: &[BatchHeader],
    partition: &dyn std::fmt::Display,
) -> Result<(), Refusal> {
    if headers.iter().any(BatchHeader::is_control) {
        return Err(Refusal {
            code: errors::INVALID_RECORD,
            message: format!(
                "A client may not write control batches (topic partition {partition})"
            ),
            record_errors: Vec::new(),
        });
    }
    if headers.iter().any(BatchHeader::is_transactional) {
        return Err(Refusal {
            code: errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            message: TRANSACTIONS_UNSUPPORTED.to_owned(),
            record_errors: Vec::new(),
        });
    }
    Ok(())
}

/// What walking a record set's records found; positions are over the whole record set. Each
/// list holds only what needs acting on, so that the usual record set (one batch, correct, as
/// produced) is checked without an allocation.
struct Walked {
    /// Records without a key, collected only where keys are required.
    keyless: Vec<i32>,
    /// CreateTime records outside the topic's window, and the first one's timestamp.
    late: Vec<i32>,
    first_late: Option<i64>,
    /// By batch index, the newest record timestamp of each batch whose header may state
    /// another: one whose header says otherwise, and one rebuilt below.
    newest: Vec<(usize, i64)>,
    /// By batch index, each batch rebuilt with the topic's `compression.type`, where it
    /// differs.
    recompressed: Vec<(usize, Vec<u8>)>,
}

fn walk(
    records: &[u8],
    headers: &[BatchHeader],
    rules: &ProduceRules,
    now_ms: i64,
    partition: &dyn std::fmt::Display,
) -> Result<Walked, Refusal> {
    let mut found = Walked {
        keyless: Vec::new(),
        late: Vec::new(),
        first_late: None,
        newest: Vec::new(),
        recompressed: Vec::new(),
    };
    let mut at = 0;
    let mut first_index = 0i32;
    for (i, h) in headers.iter().enumerate() {
        let bytes = &records[at..at + h.total_len()];
        at += h.total_len();
        let mut max_delta = i64::MIN;
        let walked = SCRATCH.with_borrow_mut(|scratch| {
            let walked =
                kaas_storage::walk_produced_records(bytes, h, scratch, rules.compression, |r| {
                    let index = first_index.saturating_add(r.index);
                    max_delta = max_delta.max(r.timestamp_delta);
                    if rules.keys_required && r.key.is_none() {
                        found.keyless.push(index);
                    }
                    let ts = h.base_timestamp.saturating_add(r.timestamp_delta);
                    if rules.create_time_window.is_some_and(|(before, after)| {
                        ts != NO_TIMESTAMP
                            && (now_ms.saturating_sub(ts) > before
                                || ts.saturating_sub(now_ms) > after)
                    }) {
                        found.first_late.get_or_insert(ts);
                        found.late.push(index);
                    }
                });
            if scratch.capacity() > KEEP_SCRATCH_BYTES {
                *scratch = Vec::new();
            }
            walked
        });
        let converted = walked.map_err(|e| {
            let index = match &e {
                kaas_storage::ProducedRecordsError::Invalid(invalid) => {
                    first_index.saturating_add(invalid.index)
                }
                _ => first_index,
            };
            Refusal {
                code: errors::INVALID_RECORD,
                message: format!("Invalid records in topic partition {partition}: {e}"),
                record_errors: vec![index],
            }
        })?;
        let newest = h.base_timestamp.saturating_add(max_delta);
        if converted.is_some() || header_misstates_newest(h, newest) {
            found.newest.push((i, newest));
        }
        if let Some(batch) = converted {
            found.recompressed.push((i, batch));
        }
        first_index = first_index.saturating_add(h.record_count);
    }
    Ok(found)
}

/// Whether a batch's header states another newest timestamp than its newest record's, or
/// the LogAppendTime bit (which a producer may not set).
fn header_misstates_newest(h: &BatchHeader, newest: i64) -> bool {
    h.max_timestamp != newest || h.is_log_append_time()
}

/// The record set with each batch's stated newest timestamp made its newest record's (and the
/// LogAppendTime bit cleared), copied only when one is wrong. `newest` lists, by batch index,
/// every batch whose header may be wrong (the others are right).
fn correct_newest(
    records: Bytes,
    mut headers: Vec<BatchHeader>,
    newest: &[(usize, i64)],
) -> (Bytes, Vec<BatchHeader>) {
    if !newest
        .iter()
        .any(|&(i, max)| header_misstates_newest(&headers[i], max))
    {
        return (records, headers);
    }
    let mut copy = records.to_vec();
    let mut at = 0;
    let mut newest = newest.iter().peekable();
    for (i, h) in headers.iter_mut().enumerate() {
        let len = h.total_len();
        if let Some(&(_, max)) = newest.next_if(|(j, _)| *j == i) {
            if header_misstates_newest(h, max) {
                batch::set_create_time_max(&mut copy[at..at + len], max);
                *h = batch::peek_header(&copy[at..at + len]).expect("a verified batch, corrected");
            }
        }
        at += len;
    }
    (Bytes::from(copy), headers)
}

/// A record without a timestamp (producers before Kafka 0.10's message format).
const NO_TIMESTAMP: i64 = -1;

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_wire::batch::{build_batch, verify_produced_record_set, BatchSpec};

    const NOW: i64 = 1_800_000_000_000;
    const HOUR: i64 = 3_600_000;

    fn rules() -> ProduceRules {
        ProduceRules {
            max_batch_bytes: 1 << 20,
            keys_required: false,
            log_append_time: false,
            create_time_window: Some((i64::MAX, HOUR)),
            compression: kaas_storage::StoredCompression::AsProduced,
        }
    }

    fn set(batches: &[Vec<u8>]) -> (Bytes, Vec<BatchHeader>) {
        let bytes = Bytes::from(batches.concat());
        let headers = verify_produced_record_set(&bytes).expect("valid batches");
        (bytes, headers)
    }

    fn run(
        batches: &[Vec<u8>],
        rules: &ProduceRules,
    ) -> Result<(Bytes, Vec<BatchHeader>), Refusal> {
        let (bytes, headers) = set(batches);
        check(bytes, headers, rules, NOW, &"t-0")
    }

    fn batch(timestamp: i64, records: &[kaas_wire::batch::RecordKv<'_>]) -> Vec<u8> {
        build_batch(
            BatchSpec {
                timestamp,
                ..BatchSpec::default()
            },
            records,
        )
    }

    /// A batch with record `i` at `timestamp + deltas[i]`, its header's newest timestamp
    /// given as `stated_max`.
    fn with_deltas(timestamp: i64, deltas: &[i64], stated_max: i64) -> Vec<u8> {
        use kaas_wire::varint::put_varint;
        let mut body = Vec::new();
        for (i, d) in deltas.iter().enumerate() {
            let mut rec = vec![0u8];
            put_varint(&mut rec, *d);
            put_varint(&mut rec, i as i64);
            put_varint(&mut rec, 1);
            rec.push(b'k');
            put_varint(&mut rec, 1);
            rec.push(b'v');
            put_varint(&mut rec, 0);
            put_varint(&mut body, rec.len() as i64);
            body.extend_from_slice(&rec);
        }
        let mut b = batch(
            timestamp,
            &vec![(Some(&b"k"[..]), Some(&b"v"[..])); deltas.len()],
        );
        b.truncate(batch::BATCH_HEADER_LEN);
        b.extend_from_slice(&body);
        let len = (b.len() - batch::LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        b[35..43].copy_from_slice(&stated_max.to_be_bytes());
        batch::seal_crc(&mut b);
        b
    }

    #[test]
    fn a_well_formed_set_is_stored_as_it_came() {
        let (bytes, headers) = set(&[batch(NOW, &[(Some(b"k"), Some(b"v")), (None, Some(b"w"))])]);
        let (stored, stored_headers) =
            check(bytes.clone(), headers.clone(), &rules(), NOW, &"t-0").unwrap();
        assert_eq!(stored, bytes);
        assert_eq!(stored.as_ptr(), bytes.as_ptr(), "not copied");
        assert_eq!(stored_headers, headers);
    }

    #[test]
    fn control_and_transactional_batches_are_refused() {
        let control = build_batch(
            BatchSpec {
                attributes: 0x20,
                ..BatchSpec::default()
            },
            &[(None, Some(b"v"))],
        );
        assert_eq!(
            run(&[control], &rules()).unwrap_err().code,
            errors::INVALID_RECORD
        );
        let transactional = build_batch(
            BatchSpec {
                attributes: 0x10,
                producer_id: 7,
                producer_epoch: 0,
                base_sequence: 0,
                ..BatchSpec::default()
            },
            &[(None, Some(b"v"))],
        );
        assert_eq!(
            run(&[transactional], &rules()).unwrap_err().code,
            errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        );
    }

    #[test]
    fn records_that_do_not_parse_are_refused_at_their_position() {
        let good = batch(NOW, &[(None, Some(b"v"))]);
        // Record count 2 with one record inside (last offset delta 1 to match the count).
        let mut lying = batch(NOW, &[(None, Some(b"v"))]);
        lying[23..27].copy_from_slice(&1i32.to_be_bytes());
        lying[57..61].copy_from_slice(&2i32.to_be_bytes());
        batch::seal_crc(&mut lying);
        let refusal = run(&[good.clone(), lying], &rules()).unwrap_err();
        assert_eq!(refusal.code, errors::INVALID_RECORD);
        assert_eq!(
            refusal.record_errors,
            vec![2],
            "second batch's second record: {refusal:?}"
        );
        // Gzip flag on plain records; codec 5.
        for codec in [1i16, 5] {
            let mut b = good.clone();
            b[21..23].copy_from_slice(&codec.to_be_bytes());
            batch::seal_crc(&mut b);
            let refusal = run(&[b], &rules()).unwrap_err();
            assert_eq!(
                refusal.code,
                errors::INVALID_RECORD,
                "codec {codec}: {refusal:?}"
            );
        }
    }

    #[test]
    fn compacted_topics_name_every_keyless_record() {
        let keys = ProduceRules {
            keys_required: true,
            ..rules()
        };
        let refusal = run(
            &[
                batch(NOW, &[(Some(b"k"), Some(b"v")), (None, Some(b"v"))]),
                batch(NOW, &[(None, None)]),
            ],
            &keys,
        )
        .unwrap_err();
        assert_eq!(
            (refusal.code, refusal.record_errors),
            (errors::INVALID_RECORD, vec![1, 2])
        );
    }

    // Kafka 4's defaults: an hour ahead at most, any age behind. Every record is checked,
    // not only the header's first and newest; no timestamp (-1) passes whatever the window.
    #[test]
    fn every_records_timestamp_is_checked_against_the_window() {
        let day = 24 * HOUR;
        let window = ProduceRules {
            create_time_window: Some((day, HOUR)),
            ..rules()
        };
        assert!(run(&[with_deltas(NOW, &[0, 5, HOUR], NOW + HOUR)], &window).is_ok());
        let refusal = run(&[with_deltas(NOW, &[0, -day - 1, 0], NOW)], &window).unwrap_err();
        assert_eq!(
            (refusal.code, refusal.record_errors),
            (errors::INVALID_TIMESTAMP, vec![1])
        );
        let refusal = run(&[with_deltas(NOW, &[0, HOUR + 1], NOW)], &window).unwrap_err();
        assert_eq!(refusal.record_errors, vec![1]);
        assert!(run(&[with_deltas(-1, &[0, 0], -1)], &window).is_ok());
        assert!(
            run(&[with_deltas(0, &[0], 0)], &rules()).is_ok(),
            "old records are kept by default"
        );
    }

    #[test]
    fn a_wrong_newest_timestamp_is_corrected_and_sealed() {
        let wrong = with_deltas(NOW, &[0, 30, 10], NOW + 35_000);
        let right = with_deltas(NOW, &[0, 30, 10], NOW + 30);
        let last = with_deltas(NOW, &[0, 5], NOW + 5);
        let (stored, headers) = run(&[right.clone(), wrong, last.clone()], &rules()).unwrap();
        assert_eq!(headers[1].max_timestamp, NOW + 30);
        let again = verify_produced_record_set(&stored).expect("CRC sealed again");
        assert_eq!(again, headers);
        assert_eq!(&stored[..right.len()], &right[..]);
        assert_eq!(&stored[stored.len() - last.len()..], &last[..]);
        // The LogAppendTime bit on a CreateTime topic is cleared.
        let mut flagged = right.clone();
        flagged[22] |= 0x08;
        batch::seal_crc(&mut flagged);
        let (stored, headers) = run(&[flagged], &rules()).unwrap();
        assert!(!headers[0].is_log_append_time());
        assert_eq!(&stored[..], &right[..]);
    }

    /// A topic's `compression.type` is how its batches are stored: a plain batch is stored
    /// compressed with the topic's codec, and a compressed one, back to `uncompressed`, is the
    /// batch as first produced; `producer` keeps the request's bytes. Checked against
    /// `max.message.bytes` as stored.
    #[test]
    fn a_topics_compression_type_is_how_batches_are_stored() {
        use kaas_storage::{Codec, StoredCompression as S};
        let value = vec![b'a'; 1000];
        let records: Vec<kaas_wire::batch::RecordKv<'_>> = (0..20)
            .map(|_| (Some(&b"k"[..]), Some(&value[..])))
            .collect();
        let plain = batch(NOW, &records);
        let with = |compression| ProduceRules {
            compression,
            ..rules()
        };
        for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
            let (stored, headers) =
                run(std::slice::from_ref(&plain), &with(S::With(codec))).unwrap();
            assert_eq!(headers[0].compression(), codec.attribute());
            assert!(
                stored.len() < plain.len() / 4,
                "{codec:?}: {} bytes",
                stored.len()
            );
            let (again, _) = run(&[stored.to_vec()], &with(S::With(codec))).unwrap();
            assert_eq!(again, stored, "{codec:?}: already so, kept as it came");
            let (back, _) = run(&[stored.to_vec()], &with(S::Uncompressed)).unwrap();
            assert_eq!(&back[..], &plain[..], "{codec:?} back to uncompressed");
            let (kept, _) = run(&[stored.to_vec()], &with(S::AsProduced)).unwrap();
            assert_eq!(kept, stored);
            let small = ProduceRules {
                max_batch_bytes: stored.len() + 100,
                ..with(S::Uncompressed)
            };
            assert_eq!(
                run(&[stored.to_vec()], &small).unwrap_err().code,
                errors::MESSAGE_TOO_LARGE
            );
        }
    }

    /// In a set that mixes batches already in the topic's codec with one that is not, only
    /// that one is rebuilt, in its place; its newest timestamp, misstated by the producer, is
    /// the newest record's in the rebuilt batch.
    #[test]
    fn in_a_mixed_set_only_the_batch_to_recompress_is_rebuilt() {
        use kaas_storage::{Codec, StoredCompression as S};
        let gzip = ProduceRules {
            compression: S::With(Codec::Gzip),
            ..rules()
        };
        let (zipped, _) = run(&[with_deltas(NOW, &[0, 7, 3], NOW + 7)], &gzip).unwrap();
        let zipped = zipped.to_vec();
        let misstated = with_deltas(NOW, &[0, 20, 10], NOW + 99);
        let (stored, headers) = run(&[zipped.clone(), misstated, zipped.clone()], &gzip).unwrap();
        assert_eq!(
            verify_produced_record_set(&stored).expect("sealed"),
            headers
        );
        assert!(headers
            .iter()
            .all(|h| h.compression() == Codec::Gzip.attribute()));
        assert_eq!(headers[1].max_timestamp, NOW + 20);
        assert_eq!(&stored[..zipped.len()], &zipped[..]);
        assert_eq!(&stored[stored.len() - zipped.len()..], &zipped[..]);
    }
}
