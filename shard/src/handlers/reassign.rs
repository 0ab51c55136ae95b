//! AlterPartitionReassignments and ListPartitionReassignments (`kafka-reassign-partitions`,
//! Cruise Control, UIs).
//!
//! Each partition has one copy, on the volume every broker of a cluster shares, and that copy's
//! replica is its leader. So a reassignment names exactly one broker, and moving the partition
//! there moves its leadership and copies nothing: the controller's next file hands it over, which
//! takes a round and a take-over (seconds), whatever the partition's size.
//!
//! A reassignment is a pin in the topic catalog (`TopicMeta::pinned_leaders`): the controller
//! holds the partition on that broker while it is alive, and the balancer places the others
//! around it (`kaas_control::balancer`). Like a replica assignment in Kafka, it stays after the
//! move has completed — until the partition is reassigned again, the reassignment is cancelled
//! (null replicas, `kafka-reassign-partitions --cancel`), or the topic is deleted. Because the pin
//! lives in the catalog on the shared volume, any broker can take the request, and it survives a
//! controller failover.
//!
//! A reassignment is in progress (ListPartitionReassignments) while the partition's leader is
//! not its pinned broker: `replicas` is the pinned broker and the current leader,
//! `adding_replicas` the pinned broker, `removing_replicas` the current leader (if any).
//!
//! On a single node there is one broker: a reassignment to it completes at once and nothing is
//! stored; any other broker id is refused.

use std::collections::BTreeMap;
use std::rc::Rc;

use kaas_wire::kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kaas_wire::kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kaas_wire::kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName,
};
use kaas_wire::kafka_protocol::protocol::StrBytes;
use kaas_wire::kafka_protocol::ResponseError as E;

use crate::errors;
use crate::shard::Shard;

/// A partition's answer: error code and message.
type Outcome = (i16, Option<String>);

pub fn alter_partition_reassignments(
    shard: &Rc<Shard>,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let alive: Vec<i32> = shard
        .cluster
        .brokers()
        .into_iter()
        .filter(|b| !b.fenced)
        .map(|b| b.id)
        .collect();
    let snapshot = shard.catalog.snapshot();
    let responses = req
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.to_string();
            let meta = snapshot.get(&name);
            // Decide each partition; the valid changes of a topic are stored in one catalog
            // write, and their answers wait for it.
            let mut outcomes: Vec<(i32, Option<Outcome>)> = Vec::new();
            let mut changes: Vec<(i32, Option<i32>)> = Vec::new();
            for p in &t.partitions {
                let i = p.partition_index;
                let decided = match meta {
                    Some(m) if (0..m.partitions).contains(&i) => {
                        let pinned = m.pinned_leaders.get(&i).copied();
                        match decide(shard, &alive, pinned, p.replicas.as_deref()) {
                            Decision::Answer(code, msg) => Some((code, msg)),
                            Decision::Change(to) => {
                                changes.push((i, to));
                                None
                            }
                        }
                    }
                    _ => Some((
                        E::UnknownTopicOrPartition.code(),
                        Some(format!("Topic partition {name}-{i} does not exist.")),
                    )),
                };
                outcomes.push((i, decided));
            }
            let stored: Outcome = if changes.is_empty() {
                (0, None)
            } else {
                match shard.catalog.set_pinned_leaders(&name, &changes) {
                    Ok(_) => {
                        tracing::info!(topic = %name, ?changes, "partition reassignment stored (partition → broker; none cancels)");
                        (0, None)
                    }
                    Err(e) => (errors::catalog(&e), Some(e.to_string())),
                }
            };
            let partitions = outcomes
                .into_iter()
                .map(|(i, decided)| {
                    let (code, message) = decided.unwrap_or_else(|| stored.clone());
                    ReassignablePartitionResponse::default()
                        .with_partition_index(i)
                        .with_error_code(code)
                        .with_error_message(message.map(StrBytes::from_string))
                })
                .collect();
            ReassignableTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    // A null message on success, as Kafka's (the codec's default is "").
    AlterPartitionReassignmentsResponse::default()
        .with_error_message(None)
        .with_allow_replication_factor_change(req.allow_replication_factor_change)
        .with_responses(responses)
}

/// What one partition's request does.
enum Decision {
    /// Answer at once, storing nothing.
    Answer(i16, Option<String>),
    /// Pin the partition to this broker (`None`: remove its pin), then answer.
    Change(Option<i32>),
}

fn decide(
    shard: &Shard,
    alive: &[i32],
    pinned: Option<i32>,
    replicas: Option<&[BrokerId]>,
) -> Decision {
    let Some(replicas) = replicas else {
        // Null replicas: cancel.
        return match pinned {
            Some(_) => Decision::Change(None),
            None => Decision::Answer(
                E::NoReassignmentInProgress.code(),
                Some("No reassignment of this partition is stored.".into()),
            ),
        };
    };
    let wanted: Vec<i32> = replicas.iter().map(|b| b.0).collect();
    let distinct: std::collections::BTreeSet<i32> = wanted.iter().copied().collect();
    if distinct.len() != wanted.len() {
        return Decision::Answer(
            E::InvalidReplicaAssignment.code(),
            Some(format!("Duplicate brokers in the replica list {wanted:?}.")),
        );
    }
    match wanted[..] {
        [] => Decision::Answer(
            E::InvalidReplicaAssignment.code(),
            Some("The replica list is empty.".into()),
        ),
        [to] if !alive.contains(&to) => Decision::Answer(
            E::InvalidReplicaAssignment.code(),
            Some(format!(
                "Replica assignment has brokers that are not alive. Replica list: [{to}], live broker list: {alive:?}"
            )),
        ),
        // A single node leads everything already: nothing to move, nothing to store.
        [_] if !shard.cluster.enabled() => Decision::Answer(0, None),
        [to] => Decision::Change(Some(to)),
        _ => Decision::Answer(
            E::InvalidReplicaAssignment.code(),
            Some(format!(
                "kaas keeps one copy of each partition, on the volume every broker shares, so a reassignment names exactly one broker (the partition's leader); got {wanted:?}. To move leadership, name one broker."
            )),
        ),
    }
}

pub fn list_partition_reassignments(
    shard: &Rc<Shard>,
    req: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    let snapshot = shard.catalog.snapshot();
    // Null asks for every partition.
    let wanted: BTreeMap<String, Option<Vec<i32>>> = match req.topics {
        Some(topics) => topics
            .into_iter()
            .map(|t| (t.name.to_string(), Some(t.partition_indexes)))
            .collect(),
        None => snapshot.topics.keys().map(|n| (n.clone(), None)).collect(),
    };
    let topics = wanted
        .into_iter()
        .filter_map(|(name, partitions)| {
            let meta = snapshot.get(&name)?;
            let ongoing: Vec<OngoingPartitionReassignment> = meta
                .pinned_leaders
                .iter()
                .filter(|(p, _)| partitions.as_ref().is_none_or(|ps| ps.contains(p)))
                .filter_map(|(&p, &to)| {
                    let leader = shard.cluster.leader(&name, p);
                    (leader != Some(to)).then(|| {
                        let removing: Vec<BrokerId> = leader.map(BrokerId).into_iter().collect();
                        OngoingPartitionReassignment::default()
                            .with_partition_index(p)
                            .with_replicas(
                                std::iter::once(BrokerId(to))
                                    .chain(removing.iter().copied())
                                    .collect(),
                            )
                            .with_adding_replicas(vec![BrokerId(to)])
                            .with_removing_replicas(removing)
                    })
                })
                .collect();
            (!ongoing.is_empty()).then(|| {
                OngoingTopicReassignment::default()
                    .with_name(TopicName(StrBytes::from_string(name)))
                    .with_partitions(ongoing)
            })
        })
        .collect();
    ListPartitionReassignmentsResponse::default()
        .with_error_message(None)
        .with_topics(topics)
}
