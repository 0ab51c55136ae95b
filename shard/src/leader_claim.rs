//! Cluster mode: the leader epoch of a partition as every broker reports it.
//!
//! Kafka's brokers all answer Metadata with the partition's current leader epoch, and clients
//! depend on it: librdkafka caches the epoch Metadata gives it, sends it as
//! `current_leader_epoch` in Fetch and OffsetForLeaderEpoch, and validates its position when
//! the epoch rises. kaas decides a partition's epoch at take-over (one above every stored
//! epoch, see `Shard::take_over`), so only the leader knows it; other brokers used to answer
//! -1. A client then flipped between -1 and the real epoch with every Metadata answer, each
//! flip started a new offset validation while the previous one was on the wire, and librdkafka
//! compared an answer meant for one position with a later one: a false "log truncation" for a
//! consumer with `auto.offset.reset=error` after a controller pause (issue 12).
//!
//! So the leader publishes its claim — broker id and epoch — as `leader.json` in the
//! partition's directory on the shared volume, right after its take-over claimed the epoch in
//! the manifest and before it serves. Any broker (or another shard of the leader) reports the
//! claim's epoch while the claim names the leader the accepted assignment names; a claim by
//! anyone else (the take-over has not published yet, or a previous leader's) is not this
//! leader's epoch, and the answer is -1 ("unknown"), as before. The file is replaced
//! tmp + rename without fsync: it only informs Metadata, and a claim lost in a power cut is
//! written again by the next take-over.
//!
//! Until the new leader has published, brokers report the epoch the controller gave the
//! leadership in `assignment.json` (`kaas_control::epochs`), which the take-over runs at or
//! above; -1 only for files written before controllers gave epochs. Reporting -1 during every
//! move let librdkafka (which accepts -1 from anyone and caches it) take a late answer naming
//! the old leader afterwards, and park the partition with a broker that had stopped.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const CLAIM_FILE: &str = "leader.json";

/// How long a read claim is trusted before it is read again. Claims change only at
/// take-overs, which come with a new assignment (and so a new leader the cache is checked
/// against); the expiry covers the one case that keeps the leader: a broker that leads a
/// partition, loses it to a take-over that failed before publishing, and takes it back.
const TRUSTED_FOR: Duration = Duration::from_secs(2);

/// Past this many cached claims, the expired ones are dropped before another is added.
const MAX_CACHED: usize = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderClaim {
    pub broker: i32,
    pub epoch: i32,
}

/// The epoch to report for a partition `leader` leads, given the claim read from its
/// directory: the claim's epoch if the claim is that leader's, -1 ("unknown") otherwise.
pub fn reported_epoch(claim: Option<LeaderClaim>, leader: i32) -> i32 {
    match claim {
        Some(c) if c.broker == leader && c.epoch >= 0 => c.epoch,
        _ => -1,
    }
}

/// The epoch to report for a partition whose leader's claim gave `claimed` (-1: not the
/// leader's claim, or none) when the accepted assignment gives it `assigned`: the higher of
/// the two. The assigned epoch covers the time before the new leader publishes (the
/// take-over runs at least at it); a claim above it is the leader's own, real epoch, or one
/// from its previous leadership, which its take-over also exceeds. Either way the answer is
/// never above the epoch the leader runs at. Files from before controllers gave epochs: the
/// claim alone, as before.
pub fn reported_epoch_with_assigned(claimed: i32, assigned: Option<i32>) -> i32 {
    assigned.map_or(claimed, |a| a.max(claimed))
}

/// Publishes `claim` for the partition in `dir` (tmp + rename, as a take-over claims its
/// epoch in the manifest: readers see the old or the new claim, never a torn one).
pub fn publish(dir: &Path, claim: LeaderClaim) -> Result<(), kaas_storage::StorageError> {
    kaas_storage::replace_visible(
        &dir.join(CLAIM_FILE),
        &serde_json::to_vec(&claim).expect("a claim serializes"),
    )
}

/// The claim published in `dir`, if any can be read.
pub fn read(dir: &Path) -> Option<LeaderClaim> {
    let bytes = std::fs::read(dir.join(CLAIM_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// One shard's recently read claims, so that a Metadata request for many partitions reads
/// each partition's file at most once per [`TRUSTED_FOR`] and leader.
#[derive(Default)]
pub struct ClaimCache {
    read: RefCell<HashMap<(Uuid, i32), (LeaderClaim, Instant)>>,
}

impl ClaimCache {
    /// The epoch of the partition `(topic_id, partition)` in `dir`, which `leader` leads.
    pub fn epoch(&self, topic_id: Uuid, partition: i32, leader: i32, dir: &Path) -> i32 {
        let key = (topic_id, partition);
        if let Some((claim, at)) = self.read.borrow().get(&key) {
            if claim.broker == leader && at.elapsed() < TRUSTED_FOR {
                return claim.epoch;
            }
        }
        let claim = read(dir);
        let epoch = reported_epoch(claim, leader);
        let mut cache = self.read.borrow_mut();
        match claim {
            // Only the current leader's claim is kept: another's is re-read until it changes.
            Some(c) if epoch >= 0 => {
                if cache.len() >= MAX_CACHED {
                    // Deleted topics' partitions would otherwise stay forever.
                    cache.retain(|_, (_, at)| at.elapsed() < TRUSTED_FOR);
                }
                cache.insert(key, (c, Instant::now()));
            }
            _ => {
                cache.remove(&key);
            }
        }
        epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why: a claim is reported only for the broker that made it; the previous leader's
    /// claim must never be passed off as the new leader's epoch.
    #[test]
    fn only_the_leaders_own_claim_is_reported() {
        let c = LeaderClaim {
            broker: 1,
            epoch: 7,
        };
        assert_eq!(reported_epoch(Some(c), 1), 7);
        assert_eq!(reported_epoch(Some(c), 2), -1);
        assert_eq!(reported_epoch(None, 1), -1);
    }

    /// Why: the file round-trips, and a claim replaced by a take-over is what the cache
    /// reports once the assignment names the new leader.
    #[test]
    fn cache_follows_the_leader_named_by_the_assignment() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ClaimCache::default();
        let id = Uuid::from_u128(1);
        assert_eq!(cache.epoch(id, 0, 1, dir.path()), -1, "no claim yet");
        publish(
            dir.path(),
            LeaderClaim {
                broker: 1,
                epoch: 3,
            },
        )
        .unwrap();
        assert_eq!(cache.epoch(id, 0, 1, dir.path()), 3);
        // The assignment moves the partition to broker 2 before 2 published its claim.
        assert_eq!(cache.epoch(id, 0, 2, dir.path()), -1);
        publish(
            dir.path(),
            LeaderClaim {
                broker: 2,
                epoch: 4,
            },
        )
        .unwrap();
        assert_eq!(cache.epoch(id, 0, 2, dir.path()), 4);
        assert_eq!(read(dir.path()).map(|c| c.epoch), Some(4));
    }

    /// Why: before the new leader publishes, the assignment's epoch is what brokers know; a
    /// claim above it is the leader's real epoch (or an older leadership's, still not above
    /// the real one), and with no assigned epoch the claim alone is the answer, as before.
    #[test]
    fn the_higher_of_claim_and_assignment_is_reported() {
        assert_eq!(reported_epoch_with_assigned(-1, Some(5)), 5);
        assert_eq!(reported_epoch_with_assigned(3, Some(5)), 5);
        assert_eq!(reported_epoch_with_assigned(7, Some(5)), 7);
        assert_eq!(reported_epoch_with_assigned(7, None), 7);
        assert_eq!(reported_epoch_with_assigned(-1, None), -1);
    }
}
