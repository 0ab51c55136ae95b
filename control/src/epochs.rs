//! Leader epochs, owned by the controller. Pure.
//!
//! Every `assignment.json` carries each placed partition's leader epoch
//! ([`Assignment::leader_epochs`]). The controller raises it whenever the partition leaves its
//! leader — to none (a [`crate::handover`] move in progress) or straight to another broker —
//! and keeps it otherwise; the leader that ends a handover keeps the handover's epoch (see
//! [`next_epochs`]). KRaft's controller raises it the same way. Brokers report it in Metadata
//! until the new leader has published the epoch it took the partition over at, and a
//! take-over runs at this epoch unless a stored epoch already reached it (then one above
//! that; see `Shard::take_over`).
//!
//! Why clients need it: before, a broker reported epoch -1 ("unknown") for a partition in
//! handover and for one whose new leader had not yet published its claim. librdkafka accepts
//! -1 from anyone and it replaces the epoch it cached, so a late answer from a broker still on
//! the previous file, naming the old leader at the old epoch, was accepted after it. That
//! could park the partition with the client's connection to a broker that had stopped. With
//! an epoch that rises at every change, that late answer is older than what the client holds
//! and is ignored, as Kafka clients ignore outdated metadata.
//!
//! The invariant that keeps this safe: **an epoch this file gives a partition is never above
//! the epoch its leader will really run at.** A client ignores leaders whose epoch is below
//! the one it cached, so an epoch reported too high would hide the real leader from it for
//! good; one reported too low is merely ignored. The take-over rule above gives
//! `real ≥ assigned`. Raising past the published claims ([`raise_past_claims`]) keeps the
//! assigned epochs in step with epochs that take-overs outside the controller's count
//! (a broker restarted under an unchanged file takes its partitions over again) have raised.

use std::collections::BTreeSet;

use kaas_model::{set_leader_epoch, NO_EPOCH};

use crate::assignment::{Assignment, LeaderEpochs};
use crate::balancer::{BrokerId, TopicPartition};

/// The epochs of the file the controller is about to write (`next`'s partitions and pending
/// moves decided), from the file before it:
/// - a partition whose leader is the same (the same broker, or still none) keeps its epoch;
/// - a partition leaving its leader — to none (a handover) or straight to another broker —
///   gets one above its previous epoch (1 for a partition new to the files, as its first
///   take-over stores epoch 1);
/// - a partition given a leader after none keeps the epoch its move got. No client is sent to
///   "none", so sharing that epoch misleads nobody, and the next leader's epoch is then one
///   above the old leader's, which is exactly what a take-over computes from the stored
///   epochs — so a broker that predates controller epochs runs at the epoch reported for it.
///
/// A partition the previous file led without an epoch (written before epochs existed) keeps
/// having none until its leader changes.
///
/// Runs in every controller round (five a second) over every partition: it walks `next`'s
/// own maps and looks the previous file up by key, building nothing per partition but the
/// handful of pending moves' keys.
pub fn next_epochs(previous: Option<&Assignment>, next: &Assignment) -> LeaderEpochs {
    let was_pending: BTreeSet<(&str, i32)> = previous
        .map(|p| {
            p.pending
                .iter()
                .map(|m| (m.topic.as_str(), m.partition))
                .collect()
        })
        .unwrap_or_default();
    // Who led `tp` in the previous file: a broker, none (in handover), or unplaced (`None`).
    let before = |tp: &TopicPartition| -> Option<Option<BrokerId>> {
        let p = previous?;
        match p.partitions.get(tp) {
            Some(l) => Some(Some(*l)),
            None => was_pending
                .contains(&(tp.topic.as_str(), tp.partition))
                .then_some(None),
        }
    };
    let mut out = LeaderEpochs::new();
    let mut put = |tp: &TopicPartition, now: Option<BrokerId>| {
        let before_epoch = previous.and_then(|p| p.leader_epoch(&tp.topic, tp.partition));
        let keep = match before(tp) {
            Some(was) => was == now || (was.is_none() && now.is_some()),
            None => false,
        };
        let epoch = if keep {
            before_epoch
        } else {
            Some(before_epoch.map_or(1, |e| e.saturating_add(1)))
        };
        if let Some(e) = epoch {
            set_leader_epoch(&mut out, &tp.topic, tp.partition, e);
        }
    };
    for (tp, l) in &next.partitions {
        put(tp, Some(*l));
    }
    for m in &next.pending {
        put(&m.tp(), None);
    }
    out
}

/// At most this many claims are read for one file. Each is a small file on the shared volume
/// (a network filesystem in production), read before the file is written: a failover moving
/// tens of thousands of partitions must not wait for as many reads. The partitions past it
/// keep the epoch [`next_epochs`] gave them, which is still never above the real one.
pub const MAX_CLAIMS_READ: usize = 2_048;

/// Raises the epoch of every partition whose epoch `next` changed from `previous` past the
/// epoch last published for it (`claimed`, read from the partition's `leader.json`; at most
/// [`MAX_CLAIMS_READ`] of them): a take-over the controller did not count (a restarted broker
/// taking its partitions again under an unchanged file) may have run the partition above the
/// controller's count, and the next leader's epoch must exceed it, or the old and the new
/// leader would be reported at the same epoch. Returns how many epochs were raised.
pub fn raise_past_claims(
    previous: Option<&Assignment>,
    next: &mut Assignment,
    claimed: impl Fn(&TopicPartition) -> Option<i32>,
) -> usize {
    // Only the changed partitions' names are copied: the file may hold 100,000 partitions.
    let changed: Vec<(TopicPartition, i32)> = next
        .leader_epochs
        .iter()
        .flat_map(|(topic, row)| {
            row.iter().enumerate().filter_map(move |(p, &e)| {
                let p = i32::try_from(p).ok()?;
                let unchanged = previous.and_then(|prev| prev.leader_epoch(topic, p)) == Some(e);
                (e > NO_EPOCH && !unchanged).then(|| (TopicPartition::new(topic.clone(), p), e))
            })
        })
        .take(MAX_CLAIMS_READ)
        .collect();
    let mut raised = 0;
    for (tp, e) in changed {
        if let Some(c) = claimed(&tp).filter(|c| *c >= e) {
            next.set_leader_epoch(&tp.topic, tp.partition, c.saturating_add(1));
            raised += 1;
        }
    }
    raised
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignment::PendingMove;

    fn file(leaders: &[(i32, i32)], pending: &[(i32, i32, i32)]) -> Assignment {
        let mut a = Assignment::new(
            1,
            1,
            Vec::new(),
            leaders
                .iter()
                .map(|(p, l)| (TopicPartition::new("t", *p), BrokerId(*l)))
                .collect(),
            [],
        );
        a.pending = pending
            .iter()
            .map(|(p, from, to)| PendingMove {
                topic: "t".into(),
                partition: *p,
                from: BrokerId(*from),
                to: BrokerId(*to),
                since: (1, 1),
            })
            .collect();
        a
    }

    fn epochs_of(a: &Assignment, n: i32) -> Vec<Option<i32>> {
        (0..n).map(|p| a.leader_epoch("t", p)).collect()
    }

    /// Why: the epoch must rise whenever a partition leaves its leader, and only then, or a
    /// client could not tell a new leadership from an old one; the leader that ends a handover
    /// keeps the handover's epoch, as a take-over from the stored epochs would compute it.
    #[test]
    fn an_epoch_rises_when_a_partition_leaves_its_leader_and_only_then() {
        let mut first = file(&[(0, 1), (1, 2)], &[]);
        first.leader_epochs = next_epochs(None, &first);
        assert_eq!(epochs_of(&first, 2), [Some(1), Some(1)]);

        // Partition 0 leaves broker 1 (in handover), partition 1 stays.
        let mut second = file(&[(1, 2)], &[(0, 1, 3)]);
        second.leader_epochs = next_epochs(Some(&first), &second);
        assert_eq!(epochs_of(&second, 2), [Some(2), Some(1)]);

        // Still in handover, now towards another broker: no change of leader.
        let mut third = file(&[(1, 2)], &[(0, 1, 2)]);
        third.leader_epochs = next_epochs(Some(&second), &third);
        assert_eq!(epochs_of(&third, 2), [Some(2), Some(1)]);

        // Given to broker 2: the handover's epoch.
        let mut fourth = file(&[(0, 2), (1, 2)], &[]);
        fourth.leader_epochs = next_epochs(Some(&third), &fourth);
        assert_eq!(epochs_of(&fourth, 2), [Some(2), Some(1)]);

        // Straight from broker 2 to broker 3 (its old leader was gone): raised.
        let mut fifth = file(&[(0, 3), (1, 2)], &[]);
        fifth.leader_epochs = next_epochs(Some(&fourth), &fifth);
        assert_eq!(epochs_of(&fifth, 2), [Some(3), Some(1)]);
    }

    /// Why: a file written before epochs existed names leaders without them; inventing one for
    /// an unchanged leader could report less than the leader runs at while pretending to know.
    #[test]
    fn leaders_unchanged_since_a_file_without_epochs_get_none() {
        let old = file(&[(0, 1), (1, 2)], &[]);
        let mut next = file(&[(0, 1), (1, 3)], &[]);
        next.leader_epochs = next_epochs(Some(&old), &next);
        assert_eq!(epochs_of(&next, 2), [None, Some(1)]);
    }

    /// Why: a broker restarted under an unchanged file took its partition over again, above
    /// the controller's count; the next leader must be given an epoch above that one.
    #[test]
    fn a_changed_epoch_is_raised_past_the_published_claim() {
        let mut first = file(&[(0, 1), (1, 1)], &[]);
        first.leader_epochs = next_epochs(None, &first);
        let mut next = file(&[(0, 2), (1, 1)], &[]);
        next.leader_epochs = next_epochs(Some(&first), &next);
        assert_eq!(epochs_of(&next, 2), [Some(2), Some(1)]);
        let raised = raise_past_claims(Some(&first), &mut next, |_| Some(4));
        assert_eq!(
            raised, 1,
            "only the partition whose leader changed is raised"
        );
        assert_eq!(epochs_of(&next, 2), [Some(5), Some(1)]);
        // A claim below the new epoch changes nothing.
        let mut again = file(&[(0, 2), (1, 1)], &[]);
        again.leader_epochs = next_epochs(Some(&first), &again);
        assert_eq!(raise_past_claims(Some(&first), &mut again, |_| Some(1)), 0);
        assert_eq!(epochs_of(&again, 2), [Some(2), Some(1)]);
    }

    /// Why: the claims are files on a network volume, read before a failover's file is
    /// written; a mass move reads a bounded number of them.
    #[test]
    fn a_mass_move_reads_a_bounded_number_of_claims() {
        let n = (MAX_CLAIMS_READ + 500) as i32;
        let leaders: Vec<(i32, i32)> = (0..n).map(|p| (p, 2)).collect();
        let mut next = file(&leaders, &[]);
        next.leader_epochs = next_epochs(None, &next);
        let reads = std::cell::Cell::new(0);
        let raised = raise_past_claims(None, &mut next, |_| {
            reads.set(reads.get() + 1);
            Some(9)
        });
        assert_eq!((raised, reads.get()), (MAX_CLAIMS_READ, MAX_CLAIMS_READ));
    }
}
