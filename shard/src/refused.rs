//! Produce refusals that leave a gap in an idempotent producer's sequence. Pure; one per
//! shard, used by `handlers::produce` on the shard that owns the partition.
//!
//! A client pipelines up to five produce requests per partition on one connection. When this
//! broker refuses the first of them before storing it (the write fence closed, the partition
//! not served yet, the volume below its floor) and the condition has cleared by the time the
//! next one is read, that next batch's sequence no longer follows the stored ones. Kafka's
//! answer to a gap is OUT_OF_ORDER_SEQUENCE_NUMBER, and librdkafka reads it as "the producer
//! must start over": it drains every partition and bumps its producer epoch, renumbering every
//! record in flight — including records on other partitions whose earlier answer was "possibly
//! persisted" (REQUEST_TIMED_OUT). Those that had been stored are then stored again, under the
//! new epoch, where no sequence check can recognise them. The controller-pause fault run
//! stored one record twice that way (`a-3-00217265` at offsets 217265 and 217266, epoch 4
//! sequence 158215 and epoch 5 sequence 0), after partition 7 had been refused with
//! NOT_LEADER_OR_FOLLOWER and its next request answered OUT_OF_ORDER_SEQUENCE_NUMBER.
//!
//! The gap is this broker's own doing, not the client's, so the batch after it gets the same
//! retriable answer as the refused batch: "not stored, send again". The client then resends in
//! order — the refused batch first — and nothing is renumbered.
//!
//! The same gap opens across a leadership change, where this broker cannot see the refusal: a
//! client with requests outstanding on a paused leader waits for them, the old leader refuses
//! the first when it resumes (NOT_LEADER_OR_FOLLOWER), and librdkafka sends the next one to the
//! new leader before resending the first (the third fault run: 14 epoch bumps in 100 pauses,
//! each one "skipped sequence numbers ... caused by previous failed request
//! (NOT_LEADER_FOR_PARTITION)" on another broker). So a hole in the first
//! [`AFTER_TAKE_OVER`] of this broker's leadership is answered NOT_LEADER_OR_FOLLOWER too, if
//! the producer's last stored batch is older than the take-over: the client refreshes its
//! metadata and resends from the first unacknowledged record. A hole after a batch this broker
//! stored, and a batch that goes back before the stored sequence, cannot be a refusal's and
//! get Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER (KafkaJS's produce test sends both to a topic just
//! created). A hole the client itself made (records it expired) is bumped over by the client
//! before it sends, so this costs a genuine hole at most a retry.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use uuid::Uuid;

/// How long a refusal explains later gaps: the default delivery timeout of the Java client
/// and librdkafka (`delivery.timeout.ms` / `message.timeout.ms`), past which a client has
/// given up on the refused records anyway.
pub const REMEMBERED_FOR: Duration = Duration::from_secs(120);

/// Bound on remembered refusals per shard (one per partition and producer at most); past it
/// the oldest is forgotten, which only brings back the OUT_OF_ORDER answer for that producer.
pub const MAX_REMEMBERED: usize = 4096;

/// How long after a take-over a sequence gap is taken for a refusal by the previous leader:
/// the clients' default request timeout (30 s) twice, the longest a client waits for its
/// requests outstanding on the old leader before producing to the new one.
pub const AFTER_TAKE_OVER: Duration = Duration::from_secs(60);

/// Which producer on which partition: (topic id, partition, producer id).
pub type Key = (Uuid, i32, i64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Refusal {
    epoch: i16,
    first_seq: i32,
    code: i16,
    at: Instant,
}

/// The earliest refused, not yet stored, batch of each (partition, producer).
#[derive(Debug, Default)]
pub struct RefusedSequences {
    refused: HashMap<Key, Refusal>,
}

impl RefusedSequences {
    /// A batch of `key` starting at `first_seq` under `epoch` was refused with `code` before
    /// anything of it was stored. An earlier refused batch of the same epoch stays the one
    /// remembered: the gap starts there.
    pub fn note(&mut self, key: Key, epoch: i16, first_seq: i32, code: i16, now: Instant) {
        if first_seq < 0 {
            return; // not an idempotent batch: no sequence, no gap
        }
        let entry = Refusal {
            epoch,
            first_seq,
            code,
            at: now,
        };
        match self.refused.get_mut(&key) {
            Some(r) if r.epoch == epoch && r.first_seq <= first_seq => r.at = now,
            Some(r) => *r = entry,
            None => {
                if self.refused.len() >= MAX_REMEMBERED {
                    self.forget_oldest(now);
                }
                self.refused.insert(key, entry);
            }
        }
    }

    /// The answer for a batch of `key` at `got` under `epoch` that the log refused as out of
    /// order (it expected `expected`): the refusal's code when a batch this broker refused
    /// lies in the gap, else `None` (a real gap: OUT_OF_ORDER_SEQUENCE_NUMBER).
    pub fn explains(
        &self,
        key: Key,
        epoch: i16,
        expected: i32,
        got: i32,
        now: Instant,
    ) -> Option<i16> {
        let r = self.refused.get(&key)?;
        let in_gap = r.epoch == epoch && expected <= r.first_seq && r.first_seq < got;
        (in_gap && now.saturating_duration_since(r.at) < REMEMBERED_FOR).then_some(r.code)
    }

    /// A batch of `key` covering `first_seq..=last_seq` under `epoch` was stored: a refusal it
    /// covers (the refused batch resent) or precedes (a newer epoch) no longer explains gaps.
    pub fn stored(&mut self, key: Key, epoch: i16, first_seq: i32, last_seq: i32) {
        if self.refused.is_empty() {
            return;
        }
        if let Some(r) = self.refused.get(&key) {
            if r.epoch != epoch || (first_seq <= r.first_seq && r.first_seq <= last_seq) {
                self.refused.remove(&key);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.refused.len()
    }

    pub fn is_empty(&self) -> bool {
        self.refused.is_empty()
    }

    fn forget_oldest(&mut self, now: Instant) {
        self.refused
            .retain(|_, r| now.saturating_duration_since(r.at) < REMEMBERED_FOR);
        if self.refused.len() >= MAX_REMEMBERED {
            if let Some(oldest) = self
                .refused
                .iter()
                .min_by_key(|(_, r)| r.at)
                .map(|(k, _)| *k)
            {
                self.refused.remove(&oldest);
            }
        }
        debug_assert!(self.refused.len() < MAX_REMEMBERED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOT_LEADER: i16 = 6;
    const STORAGE: i16 = 56;

    fn key(p: i32) -> Key {
        (Uuid::nil(), p, 7)
    }

    /// The fault run's case: the refused batch lies in the gap, so the next one is refused
    /// the same way (not OUT_OF_ORDER), until the refused batch itself is stored.
    #[test]
    fn a_gap_left_by_a_refusal_gets_the_refusals_answer() {
        let now = Instant::now();
        let mut r = RefusedSequences::default();
        r.note(key(7), 0, 17294, NOT_LEADER, now);
        assert_eq!(r.explains(key(7), 0, 17294, 17297, now), Some(NOT_LEADER));
        // Another partition, another producer epoch, or a gap before the refusal: real gaps.
        assert_eq!(r.explains(key(8), 0, 17294, 17297, now), None);
        assert_eq!(r.explains(key(7), 1, 17294, 17297, now), None);
        assert_eq!(r.explains(key(7), 0, 17290, 17294, now), None);
        r.stored(key(7), 0, 17294, 17296);
        assert!(r.is_empty());
        assert_eq!(r.explains(key(7), 0, 17294, 17297, now), None);
    }

    /// The earliest refusal is where the gap starts: a later refusal does not move it.
    #[test]
    fn the_earliest_refusal_is_kept() {
        let now = Instant::now();
        let mut r = RefusedSequences::default();
        r.note(key(1), 3, 10, STORAGE, now);
        r.note(key(1), 3, 13, NOT_LEADER, now);
        assert_eq!(r.explains(key(1), 3, 10, 16, now), Some(STORAGE));
        // A bumped epoch starts over.
        r.note(key(1), 4, 0, NOT_LEADER, now);
        assert_eq!(r.explains(key(1), 4, 0, 3, now), Some(NOT_LEADER));
        assert_eq!(r.explains(key(1), 3, 10, 16, now), None);
    }

    /// A refusal explains gaps only while the client could still be resending it.
    #[test]
    fn refusals_expire_and_stay_bounded() {
        let t0 = Instant::now();
        let mut r = RefusedSequences::default();
        r.note(key(0), 0, 5, NOT_LEADER, t0);
        assert_eq!(r.explains(key(0), 0, 5, 9, t0 + REMEMBERED_FOR), None);
        for p in 0..(MAX_REMEMBERED as i32 + 10) {
            r.note(
                key(p),
                0,
                1,
                NOT_LEADER,
                t0 + Duration::from_millis(p as u64),
            );
        }
        assert!(r.len() <= MAX_REMEMBERED);
        let last = MAX_REMEMBERED as i32 + 9;
        let at = t0 + Duration::from_secs(1);
        assert_eq!(r.explains(key(last), 0, 1, 2, at), Some(NOT_LEADER));
    }

    /// Non-idempotent batches (sequence -1) have no sequence to leave a gap in.
    #[test]
    fn batches_without_a_sequence_are_not_remembered() {
        let mut r = RefusedSequences::default();
        r.note(key(0), -1, -1, NOT_LEADER, Instant::now());
        assert!(r.is_empty());
    }
}
