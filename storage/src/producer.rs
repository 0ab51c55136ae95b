//! Idempotent-producer state of one partition: per producer id, its epoch and the last five
//! batches it wrote, so a retried batch gets its original offsets back instead of being
//! written twice, and a gap in sequence numbers is refused.

use std::collections::{HashMap, VecDeque};

use kaas_wire::batch::BatchHeader;

use crate::StorageError;

/// How many batches per producer are remembered, as in Kafka (the client's
/// `max.in.flight.requests.per.connection` may not exceed it with idempotence on).
pub const REMEMBERED_BATCHES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct WrittenBatch {
    first_sequence: i32,
    last_sequence: i32,
    base_offset: i64,
    last_offset: i64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<WrittenBatch>,
    /// The newest timestamp of its last batch, as stored (the append time on a LogAppendTime
    /// topic); -1 in snapshots from before it was kept, until the producer writes again.
    #[serde(default = "no_timestamp")]
    last_timestamp: i64,
}

fn no_timestamp() -> i64 {
    -1
}

impl Default for ProducerEntry {
    fn default() -> Self {
        ProducerEntry {
            epoch: 0,
            batches: VecDeque::new(),
            last_timestamp: no_timestamp(),
        }
    }
}

/// The result of checking a batch against the producer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerCheck {
    /// Not from an idempotent producer, or the next batch in sequence: write it.
    Write,
    /// A retry of a batch already written at these offsets: do not write it again.
    Duplicate { base_offset: i64, last_offset: i64 },
}

#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct ProducerStateTable {
    producers: HashMap<i64, ProducerEntry>,
}

fn next_sequence(s: i32) -> i32 {
    if s == i32::MAX {
        0
    } else {
        s + 1
    }
}

/// One idempotent producer as DescribeProducers reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: i64,
    pub epoch: i16,
    /// The sequence of the last record it wrote (-1: none remembered).
    pub last_sequence: i32,
    /// The newest timestamp of the last batch it wrote, as stored (-1: not known).
    pub last_timestamp: i64,
}

impl ProducerStateTable {
    /// Every producer the table remembers, by id.
    pub fn active(&self) -> Vec<ActiveProducer> {
        let mut out: Vec<ActiveProducer> = self
            .producers
            .iter()
            .map(|(id, e)| ActiveProducer {
                producer_id: *id,
                epoch: e.epoch,
                last_sequence: e.batches.back().map_or(-1, |b| b.last_sequence),
                last_timestamp: e.last_timestamp,
            })
            .collect();
        out.sort_by_key(|p| p.producer_id);
        out
    }

    /// Decides what to do with `h` without changing any state.
    pub fn check(&self, h: &BatchHeader) -> Result<ProducerCheck, StorageError> {
        if !h.has_producer_id() || h.base_sequence < 0 {
            return Ok(ProducerCheck::Write);
        }
        let Some(entry) = self.producers.get(&h.producer_id) else {
            // Unknown producer: its state may have aged out with retention, so accept whatever
            // sequence it continues from (Kafka does the same since KIP-360).
            return Ok(ProducerCheck::Write);
        };
        if h.producer_epoch < entry.epoch {
            return Err(StorageError::InvalidProducerEpoch {
                producer_id: h.producer_id,
                got: h.producer_epoch,
                current: entry.epoch,
            });
        }
        if h.producer_epoch > entry.epoch {
            if h.base_sequence != 0 {
                return Err(StorageError::OutOfOrderSequence {
                    producer_id: h.producer_id,
                    got: h.base_sequence,
                    expected: 0,
                    after_offset: entry.batches.back().map(|b| b.last_offset),
                });
            }
            return Ok(ProducerCheck::Write);
        }
        let last_seq = h.last_sequence();
        if let Some(dup) = entry
            .batches
            .iter()
            .find(|b| b.first_sequence == h.base_sequence && b.last_sequence == last_seq)
        {
            return Ok(ProducerCheck::Duplicate {
                base_offset: dup.base_offset,
                last_offset: dup.last_offset,
            });
        }
        let last = entry.batches.back();
        let expected = last
            .map(|b| next_sequence(b.last_sequence))
            .unwrap_or(h.base_sequence);
        if h.base_sequence != expected {
            return Err(StorageError::OutOfOrderSequence {
                producer_id: h.producer_id,
                got: h.base_sequence,
                expected,
                after_offset: last.map(|b| b.last_offset),
            });
        }
        Ok(ProducerCheck::Write)
    }

    /// Records that `h` was written with the given base offset and stored with `max_timestamp`
    /// as its newest timestamp (the append time on a LogAppendTime topic, else the header's).
    pub fn record(&mut self, h: &BatchHeader, base_offset: i64, max_timestamp: i64) {
        if !h.has_producer_id() || h.base_sequence < 0 {
            return;
        }
        let entry = self.producers.entry(h.producer_id).or_default();
        if h.producer_epoch != entry.epoch {
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        entry.last_timestamp = max_timestamp;
        entry.batches.push_back(WrittenBatch {
            first_sequence: h.base_sequence,
            last_sequence: h.last_sequence(),
            base_offset,
            last_offset: base_offset + h.last_offset_delta as i64,
        });
        while entry.batches.len() > REMEMBERED_BATCHES {
            entry.batches.pop_front();
        }
    }
}

/// File holding a partition's producer-state snapshot.
pub const SNAPSHOT_FILE: &str = "producer-state.json";

/// The producer state as of `offset` (every batch below it is reflected), saved at segment rolls
/// and clean shutdowns so that opening a partition replays only the batches after it.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct ProducerSnapshot {
    pub offset: i64,
    /// The leader epoch of the writer (absent in snapshots from before it was recorded): a
    /// snapshot a deposed leader wrote over superseded batches is recognised by it (see
    /// `crate::divergence::snapshot_consistent`).
    #[serde(default)]
    pub epoch: Option<i32>,
    pub table: ProducerStateTable,
}

impl ProducerSnapshot {
    pub fn load(dir: &std::path::Path) -> Option<ProducerSnapshot> {
        serde_json::from_slice(&std::fs::read(dir.join(SNAPSHOT_FILE)).ok()?).ok()
    }

    /// Written tmp + rename but not fsynced: it only saves work. If it is lost or older than
    /// the segments' saved indexes, recovery sees that those segments hold batches the snapshot
    /// lacks and scans them, so a missing snapshot costs time, never correctness.
    pub fn store(&self, dir: &std::path::Path) -> Result<(), StorageError> {
        crate::manifest::replace_visible(
            &dir.join(SNAPSHOT_FILE),
            &serde_json::to_vec(self).expect("snapshot serializes"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_wire::batch::{build_batch, peek_header, BatchSpec};

    fn header(pid: i64, epoch: i16, seq: i32, n: usize) -> BatchHeader {
        let recs: Vec<kaas_wire::batch::RecordKv> =
            (0..n).map(|_| (None, Some(&b"v"[..]))).collect();
        let b = build_batch(
            BatchSpec {
                producer_id: pid,
                producer_epoch: epoch,
                base_sequence: seq,
                ..Default::default()
            },
            &recs,
        );
        peek_header(&b).unwrap()
    }

    // In-order batches are written, a retry of any of the last five returns its offsets, and a
    // gap is refused.
    #[test]
    fn sequence_rules() {
        let mut t = ProducerStateTable::default();
        let mut off = 0;
        for i in 0..7 {
            let h = header(1, 0, i * 2, 2);
            assert_eq!(t.check(&h).unwrap(), ProducerCheck::Write);
            t.record(&h, off, h.max_timestamp);
            off += 2;
        }
        // seq 12..13 was written at offset 12; it is among the last five.
        assert_eq!(
            t.check(&header(1, 0, 12, 2)).unwrap(),
            ProducerCheck::Duplicate {
                base_offset: 12,
                last_offset: 13
            }
        );
        // seq 0..1 has aged out of the window and is not next: out of order.
        assert!(matches!(
            t.check(&header(1, 0, 0, 2)),
            Err(StorageError::OutOfOrderSequence { .. })
        ));
        assert!(matches!(
            t.check(&header(1, 0, 20, 1)),
            Err(StorageError::OutOfOrderSequence {
                expected: 14,
                after_offset: Some(13),
                ..
            })
        ));
        assert_eq!(t.check(&header(1, 0, 14, 1)).unwrap(), ProducerCheck::Write);
    }

    // An older epoch is fenced; a newer epoch must restart at sequence 0.
    #[test]
    fn epochs() {
        let mut t = ProducerStateTable::default();
        let h = header(9, 3, 0, 1);
        t.record(&h, 0, h.max_timestamp);
        assert!(matches!(
            t.check(&header(9, 2, 1, 1)),
            Err(StorageError::InvalidProducerEpoch { .. })
        ));
        assert!(matches!(
            t.check(&header(9, 4, 5, 1)),
            Err(StorageError::OutOfOrderSequence { .. })
        ));
        assert_eq!(t.check(&header(9, 4, 0, 1)).unwrap(), ProducerCheck::Write);
    }

    // DescribeProducers reports the newest timestamp of a producer's last batch as stored; a
    // snapshot written before it was kept loads with -1 (not known), and the field survives a
    // snapshot round trip.
    #[test]
    fn last_timestamp_is_the_stored_one() {
        let mut t = ProducerStateTable::default();
        let h = header(4, 0, 0, 1);
        t.record(&h, 0, 1_700_000_000_123);
        assert_eq!(t.active()[0].last_timestamp, 1_700_000_000_123);
        let again: ProducerStateTable =
            serde_json::from_slice(&serde_json::to_vec(&t).unwrap()).unwrap();
        assert_eq!(again.active()[0].last_timestamp, 1_700_000_000_123);
        let old = br#"{"producers":{"4":{"epoch":0,"batches":[{"first_sequence":0,"last_sequence":0,"base_offset":0,"last_offset":0}]}}}"#;
        let loaded: ProducerStateTable = serde_json::from_slice(old).unwrap();
        assert_eq!(loaded.active()[0].last_timestamp, -1);
        assert_eq!(loaded.active()[0].last_sequence, 0);
    }
}
