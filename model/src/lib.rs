//! The cluster's vocabulary, shared by the data plane and the control plane: broker ids,
//! topic-partitions, who leads what (`assignment.json`'s model and its read-only queries), a
//! broker's health, and the hash that places partitions on shards and groups on coordinators.
//!
//! Owns no thread and does no IO: the shards (glommio) read an [`Assignment`] the control
//! thread (tokio, `kaas-control`) accepted and handed over; both compute [`fnv1a_32`] and
//! [`coordinator_for_group`] bit for bit the same. Keeping these here is what lets
//! `kaas-shard` serve Kafka without linking the control plane's Kubernetes, gRPC and TLS
//! stacks.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// A broker's id (`broker.id` / the StatefulSet ordinal), as Kafka clients see it in Metadata.
///
/// A newtype so a broker id is never confused with a partition index or a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BrokerId(pub i32);

impl fmt::Display for BrokerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One partition of one topic: the unit that has a leader.
///
/// Ordered by topic name, then partition, which is the order `assignment.json` lists them in
/// and the order the planner walks them in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TopicPartition {
    /// Topic name.
    pub topic: String,
    /// Partition index within the topic, `0..partition_count`.
    pub partition: i32,
}

impl TopicPartition {
    /// A partition of `topic`.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    /// Kafka's conventional `topic-partition` rendering, for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Partition leadership: every partition and the broker that leads it (what the balancer
/// computes and [`Assignment::partitions`] holds).
pub type LeaderMap = BTreeMap<TopicPartition, BrokerId>;

/// Topic → the leader epoch the controller gave each partition index ([`NO_EPOCH`] where it
/// gave none). See [`Assignment::leader_epochs`].
pub type LeaderEpochs = BTreeMap<String, Vec<i32>>;

/// "No epoch": a partition without an entry in [`Assignment::leader_epochs`].
pub const NO_EPOCH: i32 = -1;

/// Sets a partition's epoch in `epochs`, padding the topic's row with [`NO_EPOCH`].
pub fn set_leader_epoch(epochs: &mut LeaderEpochs, topic: &str, partition: i32, epoch: i32) {
    let Ok(index) = usize::try_from(partition) else {
        return;
    };
    // Looked up before inserting, so a row that exists costs no copy of the name.
    let row = match epochs.get_mut(topic) {
        Some(row) => row,
        None => epochs.entry(topic.to_string()).or_default(),
    };
    if row.len() <= index {
        row.resize(index + 1, NO_EPOCH);
    }
    row[index] = epoch;
}

/// FNV-1a, 32-bit, over `bytes`: the group-coordinator hash. Every broker and the controller
/// must agree on it bit for bit, so it is spelled out here rather than taken from a crate whose
/// output could change.
pub fn fnv1a_32(bytes: &[u8]) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    bytes.iter().fold(OFFSET_BASIS, |hash, &byte| {
        (hash ^ u32::from(byte)).wrapping_mul(PRIME)
    })
}

/// The shard (core) that owns partition `partition` of `topic`: FNV-1a of the topic name, mixed
/// with the partition, over the shard count. Stable across restarts, so a partition always comes
/// back to the same core; consecutive partitions of one topic land on different shards.
pub fn partition_shard(topic: &str, partition: i32, shards: usize) -> usize {
    let mixed = (fnv1a_32(topic.as_bytes()) as u64).wrapping_add(partition as u64);
    (mixed % shards.max(1) as u64) as usize
}

/// The shard (core) that owns consumer group `group_id`: FNV-1a of the id over the shard count,
/// so a group always comes back to the same core and its state needs no cross-shard lock.
pub fn group_shard(group_id: &str, shards: usize) -> usize {
    (fnv1a_32(group_id.as_bytes()) as u64 % shards.max(1) as u64) as usize
}

/// The coordinator of consumer group `group_id`.
///
/// `FNV-1a-32(group id bytes) mod |registered|` indexes the registered brokers sorted by id —
/// the *full* list, dead rows included, so losing one broker moves only the groups it
/// coordinated rather than reshuffling every group. When that broker is not alive, the answer
/// walks forward through the sorted list (wrapping) to the first alive broker, which every
/// caller computes the same way. If none is alive the hashed broker is returned as is, so the
/// answer stays deterministic. `None` only when no broker is registered.
pub fn coordinator_for_group(
    group_id: &str,
    registered: &[BrokerId],
    is_alive: impl Fn(BrokerId) -> bool,
) -> Option<BrokerId> {
    let mut sorted = registered.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.is_empty() {
        return None;
    }
    let start = fnv1a_32(group_id.as_bytes()) as usize % sorted.len();
    (0..sorted.len())
        .map(|k| sorted[(start + k) % sorted.len()])
        .find(|&b| is_alive(b))
        .or(Some(sorted[start]))
}

/// A registered broker's health as the controller last judged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Heartbeating, healthy, not draining: may lead partitions and coordinate groups.
    Alive,
    /// Heartbeating but shutting down: its partitions are being moved away.
    Draining,
    /// Not heard from within the timeout (or reporting unhealthy). The row is kept: the
    /// coordinator hash divides by every registered broker, and DescribeCluster reports it fenced.
    Dead,
}

/// One row of `brokers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerEntry {
    /// Broker id.
    pub id: BrokerId,
    /// Advertised Kafka host (what Metadata tells clients).
    pub host: String,
    /// Advertised Kafka port.
    pub port: u16,
    /// Rack (zone), if the broker reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// Health at the time of writing.
    pub health: Health,
}

/// One row of `partitions` in the file: a list, because JSON object keys can only be strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PartitionRow {
    topic: String,
    partition: i32,
    leader: BrokerId,
}

/// The contents of `assignment.json`.
///
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The Lease epoch (`leaseTransitions`) of the controller that wrote this file.
    pub controller_epoch: u64,
    /// Rises with every file a controller writes; with the epoch it orders assignments.
    pub assignment_version: u64,
    /// Every broker ever registered, sorted by id, dead rows included.
    pub brokers: Vec<BrokerEntry>,
    /// Partition leadership.
    #[serde(with = "partition_rows")]
    pub partitions: LeaderMap,
    /// Consumer group → coordinator, computed with [`coordinator_for_group`].
    #[serde(default)]
    pub consumer_groups: BTreeMap<String, BrokerId>,
    /// Partitions between leaders: taken from `from`, not yet given to `to`, because `from`
    /// has neither confirmed that it stopped acknowledging writes nor been silent long enough
    /// to have stopped on its own (see `kaas_control::handover`). They have no leader meanwhile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingMove>,
    /// The leader epoch of every placed partition (led or pending), raised by the controller
    /// whenever the partition leaves its leader (to none during a handover, or to another
    /// broker), as KRaft's controller does; the leader ending a handover keeps its epoch.
    /// A broker taking a partition over runs it at this epoch, or above it when a stored epoch
    /// already reached it, so the epoch reported from this file before the new leader
    /// published its own is never above the leader's real one. What clients need of it: the
    /// epoch Metadata reports never falls back to -1 (unknown) while leadership moves, which
    /// librdkafka accepts from any broker and which then let a late answer naming the old
    /// leader win (see `kaas_shard::leader_claim`). Absent in files written before it existed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub leader_epochs: LeaderEpochs,
}

/// A partition on its way from one leader to another (see [`Assignment::pending`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingMove {
    /// Topic.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// The leader that must stop first.
    pub from: BrokerId,
    /// The leader it goes to once `from` has stopped.
    pub to: BrokerId,
    /// `(controller_epoch, assignment_version)` of the first file that took the partition from
    /// `from`: once `from` reports having applied this (or a later) file, it has closed the
    /// partition.
    pub since: (u64, u64),
}

impl PendingMove {
    /// The partition.
    pub fn tp(&self) -> TopicPartition {
        TopicPartition::new(self.topic.clone(), self.partition)
    }
}

/// Serializes the partition map as a sorted list of `{topic, partition, leader}` rows and
/// refuses a file that lists a partition twice (that file was not written by a controller).
mod partition_rows {
    use super::*;
    use serde::de::Error as _;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(map: &LeaderMap, s: S) -> Result<S::Ok, S::Error> {
        let rows: Vec<PartitionRow> = map
            .iter()
            .map(|(tp, leader)| PartitionRow {
                topic: tp.topic.clone(),
                partition: tp.partition,
                leader: *leader,
            })
            .collect();
        rows.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<LeaderMap, D::Error> {
        let rows = Vec::<PartitionRow>::deserialize(d)?;
        let mut map = LeaderMap::new();
        for row in rows {
            let tp = TopicPartition::new(row.topic, row.partition);
            if map.insert(tp.clone(), row.leader).is_some() {
                return Err(D::Error::custom(format!("partition {tp} listed twice")));
            }
        }
        Ok(map)
    }
}

impl Assignment {
    /// Builds a file's contents: sorts the broker rows and computes every listed group's
    /// coordinator over the full broker list (only `Alive` brokers coordinate).
    pub fn new(
        controller_epoch: u64,
        assignment_version: u64,
        mut brokers: Vec<BrokerEntry>,
        partitions: LeaderMap,
        groups: impl IntoIterator<Item = String>,
    ) -> Self {
        brokers.sort_by_key(|b| b.id);
        brokers.dedup_by_key(|b| b.id);
        let mut out = Self {
            controller_epoch,
            assignment_version,
            brokers,
            partitions,
            consumer_groups: BTreeMap::new(),
            pending: Vec::new(),
            leader_epochs: LeaderEpochs::new(),
        };
        out.consumer_groups = groups
            .into_iter()
            .filter_map(|g| out.coordinator(&g).map(|c| (g, c)))
            .collect();
        out
    }

    /// `(controller_epoch, assignment_version)`: the order in which assignments supersede each
    /// other. A higher epoch wins whatever its version, because a new controller may not have
    /// seen the last version its predecessor wrote.
    pub fn order_key(&self) -> (u64, u64) {
        (self.controller_epoch, self.assignment_version)
    }

    /// The leader of a partition, if the partition exists.
    pub fn leader(&self, tp: &TopicPartition) -> Option<BrokerId> {
        self.partitions.get(tp).copied()
    }

    /// The leader epoch the controller gave a partition, if it gave one (see
    /// [`Assignment::leader_epochs`]).
    pub fn leader_epoch(&self, topic: &str, partition: i32) -> Option<i32> {
        let index = usize::try_from(partition).ok()?;
        self.leader_epochs
            .get(topic)
            .and_then(|row| row.get(index))
            .copied()
            .filter(|e| *e > NO_EPOCH)
    }

    /// Sets a partition's leader epoch in [`Assignment::leader_epochs`].
    pub fn set_leader_epoch(&mut self, topic: &str, partition: i32, epoch: i32) {
        set_leader_epoch(&mut self.leader_epochs, topic, partition, epoch);
    }

    /// The broker row for `id`.
    pub fn broker(&self, id: BrokerId) -> Option<&BrokerEntry> {
        self.brokers.iter().find(|b| b.id == id)
    }

    /// Partitions led by `me`, in order.
    pub fn led_by(&self, me: BrokerId) -> impl Iterator<Item = &TopicPartition> {
        self.partitions
            .iter()
            .filter(move |(_, l)| **l == me)
            .map(|(tp, _)| tp)
    }

    /// The coordinator of `group`: the listed one, or — for a group the controller did not know
    /// when it wrote the file — the same hash over the same broker rows, so every broker gives
    /// the same answer without waiting for a recompute.
    pub fn coordinator(&self, group: &str) -> Option<BrokerId> {
        if let Some(c) = self.consumer_groups.get(group) {
            return Some(*c);
        }
        let ids: Vec<BrokerId> = self.brokers.iter().map(|b| b.id).collect();
        coordinator_for_group(group, &ids, |id| {
            self.broker(id).is_some_and(|b| b.health == Health::Alive)
        })
    }

    /// Parses a file's bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The file's bytes (pretty-printed: operators read this file).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("assignment serializes");
        out.push(b'\n');
        out
    }
}

/// What a broker does with an assignment it just read. See [`accept`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Newer than anything accepted and written by a current controller: apply it.
    Accept,
    /// Same `(epoch, version)` as the current assignment: nothing to do.
    Unchanged,
    /// Written by a controller whose epoch is below the Lease epoch this broker knows: a
    /// deposed controller. Ignore it.
    StaleEpoch {
        /// The file's `controller_epoch`.
        candidate: u64,
        /// The Lease epoch known to this broker.
        lease_epoch: u64,
    },
    /// Older `(epoch, version)` than the assignment already accepted. Ignore it.
    Older {
        /// The accepted assignment's `(epoch, version)`.
        current: (u64, u64),
        /// The file's `(epoch, version)`.
        candidate: (u64, u64),
    },
}

impl Decision {
    /// Whether the candidate should be applied.
    pub fn is_accept(&self) -> bool {
        matches!(self, Decision::Accept)
    }
}

/// The epoch fence: whether a broker holding `current` should apply `candidate`.
///
/// - **Reject a `controller_epoch` below `lease_epoch`.** The Lease epoch rises exactly when the
///   controller changes, so a file stamped with a lower epoch was written by a controller that
///   has since been replaced — typically one that was paused (GC, SIGSTOP) past its Lease and
///   finished a write after waking. Applying it would roll leadership back to a plan the new
///   controller has already superseded, and two brokers could both believe they lead a
///   partition. The election module stops a holder from *starting* actions after its deadline;
///   this rule catches the one write it may still *finish*.
/// - **Never go back** to a lower `(controller_epoch, assignment_version)` than the one already
///   accepted, even when the Lease epoch this broker knows is stale itself: the accepted file
///   proves its epoch existed, and an older file seen later can only be a stale read (NFS
///   attribute caches) or a late write by a deposed controller.
/// - Equal keys are [`Decision::Unchanged`]: one controller never writes two different files
///   with the same version, so re-reading the same key is just the poll seeing the same file.
/// - Otherwise accept. A new controller's first file may carry a *lower* version than its
///   predecessor's last; the higher epoch alone makes it newer.
pub fn accept(current: Option<&Assignment>, candidate: &Assignment, lease_epoch: u64) -> Decision {
    if candidate.controller_epoch < lease_epoch {
        return Decision::StaleEpoch {
            candidate: candidate.controller_epoch,
            lease_epoch,
        };
    }
    if let Some(current) = current {
        let (cur, cand) = (current.order_key(), candidate.order_key());
        if cand < cur {
            return Decision::Older {
                current: cur,
                candidate: cand,
            };
        }
        if cand == cur {
            return Decision::Unchanged;
        }
    }
    Decision::Accept
}

/// What changes for broker `me` when it moves from `old` to `new`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// Partitions `me` leads in `new` but not in `old`: open, recover, raise the leader epoch,
    /// start a new segment, then serve. Sorted.
    pub take_over: Vec<TopicPartition>,
    /// Partitions `me` led in `old` but not in `new` (moved or deleted): stop acknowledging,
    /// persist manifest and producer state, close. Sorted.
    pub relinquish: Vec<TopicPartition>,
}

impl Diff {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.take_over.is_empty() && self.relinquish.is_empty()
    }
}

/// The partitions `me` must take over and relinquish going from `old` (none before the first
/// accepted assignment) to `new`. Only partitions whose leadership changed for `me` appear, so
/// the work of applying an assignment is proportional to what moved, not to the partition count.
pub fn diff(old: Option<&Assignment>, new: &Assignment, me: BrokerId) -> Diff {
    let before: BTreeSet<&TopicPartition> = old.map(|a| a.led_by(me).collect()).unwrap_or_default();
    let after: BTreeSet<&TopicPartition> = new.led_by(me).collect();
    Diff {
        take_over: after.difference(&before).map(|tp| (*tp).clone()).collect(),
        relinquish: before.difference(&after).map(|tp| (*tp).clone()).collect(),
    }
}
