//! Server-side partition assignors for the KIP-848 consumer group protocol
//! (`group.remote.assignor`): `uniform`, `range` and `rack-aware`.
//!
//! Pure functions: the group's members and the subscribed topics in, a target assignment out.
//! They run on the shard that owns the group, inside a heartbeat, so they must be fast and
//! deterministic (same input, same output, whatever the order of `members`).
//!
//! - `uniform` (the default) and `rack-aware` share one planner ([`balanced`]): every topic's
//!   partitions are spread within one over its subscribers, member totals are as even as the
//!   subscriptions allow (within one when everyone subscribes to the same topics), and among
//!   those assignments a min-cost flow picks the cheapest. For `uniform` the cost is the number
//!   of partitions moved away from their current owner (so it is as sticky as balance allows);
//!   for `rack-aware` it is seed 004's `traffic × cross-rack reads + overlap × moves` (see
//!   `docs/DESIGN.md`).
//!   Because both solve the same constraints exactly and `uniform` moves as little as possible,
//!   `rack-aware` never reads more partitions across racks than `uniform` does.
//! - `range` ([`range`]) is Kafka's classic per-topic range split, kept for co-partitioning.
//!
//! Every member of `members` appears in the result, with an empty map when it gets nothing.

use std::collections::{BTreeMap, BTreeSet};

mod balanced;
mod flow;
mod range;

use balanced::{crosses, Model, RackMode};

/// One member as the assignor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSpec {
    pub member_id: String,
    /// The member's rack (`client.rack`), if it sent one.
    pub rack: Option<String>,
    /// Topics the member subscribes to (regex subscriptions already resolved to names).
    pub subscribed_topics: BTreeSet<String>,
    /// What the member owns now (its current target assignment): topic -> partitions.
    pub current: BTreeMap<String, BTreeSet<i32>>,
}

/// One subscribed topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    /// For each partition, the racks it can be read from without crossing racks (the rack of
    /// the broker that serves it). Empty when racks are unknown.
    pub partition_racks: Vec<BTreeSet<String>>,
}

/// member id -> topic -> partitions.
pub type GroupAssignment = BTreeMap<String, BTreeMap<String, BTreeSet<i32>>>;

/// Weights of the rack-aware min-cost assignment (broker configs
/// `group.consumer.rack.aware.traffic.weight` / `.overlap.weight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RackAwareWeights {
    pub traffic: u32,
    pub overlap: u32,
}

impl Default for RackAwareWeights {
    fn default() -> Self {
        RackAwareWeights {
            traffic: 10,
            overlap: 1,
        }
    }
}

/// A server-side assignor.
pub trait ServerAssignor {
    fn name(&self) -> &'static str;
    fn assign(
        &self,
        members: &[MemberSpec],
        topics: &BTreeMap<String, TopicSpec>,
    ) -> GroupAssignment;
}

/// The assignor used when a member names none (`group.remote.assignor` unset), as in Kafka.
pub const DEFAULT_ASSIGNOR: &str = UniformAssignor::NAME;

/// Every name [`by_name`] accepts, for config validation and error messages.
pub const ASSIGNOR_NAMES: [&str; 3] = [
    UniformAssignor::NAME,
    RangeAssignor::NAME,
    RackAwareAssignor::NAME,
];

/// Looks an assignor up by the name a client sends in `group.remote.assignor`. The rack-aware
/// weights come from broker config, so the caller passes them in; the other assignors ignore
/// them. Returns `None` for an unknown name (the coordinator answers UNSUPPORTED_ASSIGNOR).
/// The server-side assignors' names, as KIP-848 members and `--group-consumer-assignor` name them.
pub const NAMES: [&str; 3] = [
    UniformAssignor::NAME,
    RangeAssignor::NAME,
    RackAwareAssignor::NAME,
];

pub fn by_name(name: &str, weights: RackAwareWeights) -> Option<Box<dyn ServerAssignor>> {
    match name {
        UniformAssignor::NAME => Some(Box::new(UniformAssignor)),
        RangeAssignor::NAME => Some(Box::new(RangeAssignor)),
        RackAwareAssignor::NAME => Some(Box::new(RackAwareAssignor { weights })),
        _ => None,
    }
}

/// Balanced and sticky: each topic's partitions within one over its subscribers, member totals
/// as even as subscriptions allow, and the fewest partitions moved that achieves that.
#[derive(Debug, Clone, Copy, Default)]
pub struct UniformAssignor;

impl UniformAssignor {
    pub const NAME: &'static str = "uniform";
}

impl ServerAssignor for UniformAssignor {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn assign(
        &self,
        members: &[MemberSpec],
        topics: &BTreeMap<String, TopicSpec>,
    ) -> GroupAssignment {
        // Racks ignored and only moves cost: the same planner as rack-aware, so the two agree
        // on what "balanced" means and rack-aware can be compared against it.
        let moves_only = RackAwareWeights {
            traffic: 0,
            overlap: 1,
        };
        balanced::assign(members, topics, moves_only, RackMode::Ignore)
    }
}

/// Kafka's range assignor, per topic: contiguous ranges in member-id order, first members get
/// one extra; topics with equal partition counts and subscribers are co-partitioned.
#[derive(Debug, Clone, Copy, Default)]
pub struct RangeAssignor;

impl RangeAssignor {
    pub const NAME: &'static str = "range";
}

impl ServerAssignor for RangeAssignor {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn assign(
        &self,
        members: &[MemberSpec],
        topics: &BTreeMap<String, TopicSpec>,
    ) -> GroupAssignment {
        range::assign(members, topics)
    }
}

/// Min-cost rack-aware assignment (seed 004, balanced variant): the same balance as
/// [`UniformAssignor`], and among balanced assignments the one minimising
/// `traffic × cross-rack reads + overlap × moves`, ties broken by fewer moves. With no racks,
/// or everything in one rack, it is exactly as sticky as `uniform`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RackAwareAssignor {
    pub weights: RackAwareWeights,
}

impl RackAwareAssignor {
    pub const NAME: &'static str = "rack-aware";
}

impl ServerAssignor for RackAwareAssignor {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn assign(
        &self,
        members: &[MemberSpec],
        topics: &BTreeMap<String, TopicSpec>,
    ) -> GroupAssignment {
        balanced::assign(members, topics, self.weights, RackMode::Respect)
    }
}

/// What an assignment costs in the rack-aware assignor's terms; for logs, metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AssignmentStats {
    /// Partitions assigned to some member.
    pub assigned: usize,
    /// Assigned partitions whose member has a rack, whose racks are known, and which are not
    /// served from the member's rack.
    pub cross_rack: usize,
    /// Assigned partitions that had a current owner (a member still subscribed to the topic;
    /// the smallest member id if several claim it) and now go to another member.
    pub moved: usize,
}

/// Measures `assignment` against the group it was computed for. Partitions of topics not in
/// `topics` or beyond a topic's partition count are counted as assigned but cost nothing.
pub fn assignment_stats(
    members: &[MemberSpec],
    topics: &BTreeMap<String, TopicSpec>,
    assignment: &GroupAssignment,
) -> AssignmentStats {
    let model = Model::new(members, topics, RackMode::Respect);
    let index: BTreeMap<&str, usize> = model
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.member_id.as_str(), i))
        .collect();
    let by_topic: BTreeMap<&str, usize> = model
        .topics
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name, i))
        .collect();
    let mut stats = AssignmentStats::default();
    for (member, owned) in assignment {
        let m = index.get(member.as_str()).copied();
        let rack = m.and_then(|m| model.member_rack[m]);
        for (topic, partitions) in owned {
            stats.assigned += partitions.len();
            let Some(t) = by_topic.get(topic.as_str()).map(|&t| &model.topics[t]) else {
                continue;
            };
            for &p in partitions {
                let Some(p) = usize::try_from(p).ok().filter(|&p| p < t.racks.len()) else {
                    continue;
                };
                stats.cross_rack += usize::from(crosses(&t.racks[p], rack));
                stats.moved += usize::from(t.owner[p].is_some() && t.owner[p] != m);
            }
        }
    }
    stats
}
