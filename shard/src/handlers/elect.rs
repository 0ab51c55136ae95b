//! ElectLeaders (`kafka-leader-election`, Cruise Control, UIs).
//!
//! Each partition has one copy — on the shared volume in a cluster — so its one replica is its
//! leader and therefore always its preferred replica; an unclean election has no other replica
//! to choose either. A partition with a leader is answered ELECTION_NOT_NEEDED, as Kafka answers
//! a partition whose preferred replica already leads. One without a leader right now is being
//! moved by the controller (a handover takes seconds, and no request makes it faster): it is
//! answered PREFERRED_LEADER_NOT_AVAILABLE with a message that says so, and the tool can retry.
//! A request for every partition (null topics) leaves ELECTION_NOT_NEEDED out, as Kafka's
//! controller does, so `--all-topic-partitions` lists only what it could not elect.

use std::rc::Rc;

use kaas_wire::kafka_protocol::messages::elect_leaders_response::{
    PartitionResult, ReplicaElectionResult,
};
use kaas_wire::kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kaas_wire::kafka_protocol::protocol::StrBytes;
use kaas_wire::kafka_protocol::ResponseError as E;

use crate::catalog::TopicMeta;
use crate::errors;
use crate::shard::Shard;

/// Kafka's election types: 0 preferred, 1 unclean.
const ELECTION_TYPES: std::ops::RangeInclusive<i8> = 0..=1;

pub fn elect_leaders(shard: &Rc<Shard>, req: ElectLeadersRequest) -> ElectLeadersResponse {
    let snapshot = shard.catalog.snapshot();
    // Null asks for every partition, as `--all-topic-partitions` does.
    let all = req.topic_partitions.is_none();
    let wanted: Vec<(String, Vec<i32>)> = match &req.topic_partitions {
        Some(topics) => topics
            .iter()
            .map(|t| (t.topic.to_string(), t.partitions.clone()))
            .collect(),
        None => snapshot
            .topics
            .values()
            .map(|t| (t.name.clone(), (0..t.partitions).collect()))
            .collect(),
    };
    let results = wanted
        .into_iter()
        .map(|(topic, partitions)| {
            let meta = snapshot.get(&topic).map(|m| &**m);
            let partition_result: Vec<PartitionResult> = partitions
                .into_iter()
                .map(|p| (p, outcome(shard, req.election_type, &topic, meta, p)))
                .filter(|(_, (code, _))| !(all && *code == E::ElectionNotNeeded.code()))
                .map(|(p, (code, message))| {
                    PartitionResult::default()
                        .with_partition_id(p)
                        .with_error_code(code)
                        .with_error_message(Some(StrBytes::from_string(message)))
                })
                .collect();
            ReplicaElectionResult::default()
                .with_topic(TopicName(StrBytes::from_string(topic)))
                .with_partition_result(partition_result)
        })
        .filter(|t| !t.partition_result.is_empty())
        .collect();
    ElectLeadersResponse::default().with_replica_election_results(results)
}

/// One partition's answer: its error code and the message that explains it.
fn outcome(
    shard: &Shard,
    election_type: i8,
    topic: &str,
    meta: Option<&TopicMeta>,
    p: i32,
) -> (i16, String) {
    if !ELECTION_TYPES.contains(&election_type) {
        (
            errors::INVALID_REQUEST,
            format!("unknown election type {election_type}"),
        )
    } else if !meta.is_some_and(|m| (0..m.partitions).contains(&p)) {
        (
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("{topic}-{p} does not exist"),
        )
    } else if shard.cluster.leader(topic, p).is_some() {
        (
            E::ElectionNotNeeded.code(),
            "its only replica leads it: kaas keeps one copy of each partition".to_string(),
        )
    } else {
        (
            E::PreferredLeaderNotAvailable.code(),
            "the controller is moving this partition to another broker; it is led again \
             within seconds"
                .to_string(),
        )
    }
}
