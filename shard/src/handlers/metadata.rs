//! Metadata, DescribeCluster and DescribeTopicPartitions, read from the cluster view: in
//! single-node mode this broker leads every partition; in cluster mode the accepted
//! `assignment.json` says who leads what, and every registered broker is listed.

use std::rc::Rc;
use std::sync::Arc;

use kaas_wire::kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kaas_wire::kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kaas_wire::kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kaas_wire::kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse, MetadataRequest, MetadataResponse, TopicName,
};
use kaas_wire::kafka_protocol::protocol::StrBytes;

use super::resolve_topic;
use crate::catalog::{validate_topic_name, TopicMeta};
use crate::errors;
use crate::shard::Shard;

use super::authorized;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn topic_name(v: &str) -> TopicName {
    TopicName(s(v))
}

pub async fn metadata(shard: &Rc<Shard>, req: MetadataRequest, version: i16) -> MetadataResponse {
    let brokers = shard
        .cluster
        .brokers()
        .into_iter()
        .map(|b| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(b.id))
                .with_host(s(&b.host))
                .with_port(i32::from(b.port))
                .with_rack(b.rack.as_deref().map(s))
        })
        .collect();
    // v0: an empty list means all topics; v1+: null means all, empty means none.
    let all = match &req.topics {
        None => true,
        Some(t) => t.is_empty() && version == 0,
    };
    let mut topics = Vec::new();
    if all {
        for t in shard.catalog.snapshot().topics.values() {
            topics.push(topic_response(shard, t));
        }
    } else {
        let asked = req.topics.as_deref().unwrap_or_default();
        catch_up(
            shard,
            asked
                .iter()
                .filter_map(|t| t.name.as_deref())
                .map(|n| n.as_str()),
        )
        .await;
        let snapshot = shard.catalog.snapshot();
        let allow_create = version < 4 || req.allow_auto_topic_creation;
        for rt in req.topics.unwrap_or_default() {
            let name = match (&rt.name, rt.topic_id.is_nil()) {
                (Some(n), _) => n.as_str().to_string(),
                (None, false) => match snapshot.by_id(rt.topic_id) {
                    Some(t) => t.name.clone(),
                    None => {
                        topics.push(
                            MetadataResponseTopic::default()
                                .with_error_code(errors::UNKNOWN_TOPIC_ID)
                                .with_topic_id(rt.topic_id)
                                .with_topic_authorized_operations(authorized::OMITTED),
                        );
                        continue;
                    }
                },
                (None, true) => continue,
            };
            if let Err(e) = validate_topic_name(&name) {
                topics.push(error_topic(&name, errors::catalog(&e)));
                continue;
            }
            // Kafka's internal topics are not here (see catalog::INTERNAL_TOPICS): asking for
            // one is answered "unknown", not with an auto-created ordinary topic.
            let allow_create =
                allow_create && !crate::catalog::INTERNAL_TOPICS.contains(&name.as_str());
            match resolve_topic(shard, &name, allow_create) {
                Ok(t) => topics.push(topic_response(shard, &t)),
                Err(code) => topics.push(error_topic(&name, code)),
            }
        }
    }
    if version >= 8 && req.include_topic_authorized_operations {
        for t in topics.iter_mut().filter(|t| t.error_code == errors::NONE) {
            t.topic_authorized_operations = authorized::TOPIC;
        }
    }
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(s(shard.catalog.cluster_id())))
        .with_controller_id(BrokerId(shard.cluster.controller()))
        .with_topics(topics)
        .with_cluster_authorized_operations(authorized::operations(
            (8..=10).contains(&version) && req.include_cluster_authorized_operations,
            authorized::CLUSTER,
        ))
}

/// Cluster mode: a topic another broker created moments ago reaches this broker with the
/// controller's next assignment, which each broker applies when the controller's push arrives
/// — milliseconds apart, and the creating broker answers CreateTopics as soon as it applied
/// it. So before answering a request that names topics (Metadata, DescribeTopicPartitions,
/// the config APIs, ListOffsets), the view is given time ([`ClusterView::catch_up`]) to show
/// every topic asked for placed when one is known here but not placed yet, or unknown while
/// the topics on the volume changed since this broker read them. A client that created a
/// topic through one broker then finds it at any other right after (kafka-python's admin
/// asked a second broker 6 ms after the creation and was told "unknown": that broker applied
/// the placing assignment 16 ms after the first; the Java admin's describeTopics and
/// describeConfigs go to any broker, and fail on "unknown" without retrying). A name that
/// does not exist costs one `stat` when nothing changed, and stops the wait once this broker
/// has read what changed.
///
/// [`ClusterView::catch_up`]: crate::cluster::ClusterView::catch_up
pub(crate) async fn catch_up<'a>(shard: &Shard, asked: impl Iterator<Item = &'a str> + Clone) {
    if !shard.cluster.enabled() {
        return;
    }
    // Some name known here but not placed yet, or unknown while the volume has topic changes
    // this broker has not read.
    let behind = || {
        let snapshot = shard.catalog.snapshot();
        let (unknown, unplaced) = asked
            .clone()
            .fold((false, false), |(unknown, unplaced), n| {
                let known = snapshot.get(n).is_some();
                (
                    unknown || !known,
                    unplaced || (known && !shard.cluster.placed(n)),
                )
            });
        unplaced || (unknown && shard.catalog.topics_changed_on_disk())
    };
    shard.cluster.catch_up(behind).await;
}

fn error_topic(name: &str, code: i16) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_error_code(code)
        .with_name(Some(topic_name(name)))
        .with_topic_authorized_operations(authorized::OMITTED)
}

fn topic_response(shard: &Shard, t: &Arc<TopicMeta>) -> MetadataResponseTopic {
    // Created but not yet placed by the controller (cluster mode: auto-created on this broker
    // or created on another since the last assignment file): Kafka's answer to a topic still
    // being created, a retriable topic error without partitions. Partitions with no leader
    // would let a producer pick one and start its delivery timer before any broker serves it.
    if !shard.cluster.placed(&t.name) {
        return MetadataResponseTopic::default()
            .with_error_code(errors::LEADER_NOT_AVAILABLE)
            .with_name(Some(topic_name(&t.name)))
            .with_topic_id(t.id)
            .with_topic_authorized_operations(authorized::OMITTED);
    }
    let partitions = (0..t.partitions)
        .map(|p| {
            let (leader, epoch, error) = leadership(shard, t, p);
            MetadataResponsePartition::default()
                .with_error_code(error)
                .with_partition_index(p)
                .with_leader_id(leader)
                .with_leader_epoch(epoch)
                .with_replica_nodes(vec![leader])
                .with_isr_nodes(vec![leader])
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(topic_name(&t.name)))
        .with_topic_id(t.id)
        .with_partitions(partitions)
        .with_topic_authorized_operations(authorized::OMITTED)
}

/// (leader, leader epoch, error) of a partition as clients should see it. A partition with no
/// leader (cluster mode, during a handover) is LEADER_NOT_AVAILABLE, which clients retry.
fn leadership(shard: &Shard, t: &TopicMeta, partition: i32) -> (BrokerId, i32, i16) {
    match shard.cluster.leader(&t.name, partition) {
        Some(leader) => (
            BrokerId(leader),
            leader_epoch(shard, t, partition, leader),
            errors::NONE,
        ),
        // In handover: no leader, at the epoch the controller raised for it (KRaft reports a
        // leaderless partition the same way). Never -1 where the file gives one: librdkafka
        // takes -1 from anyone and would then accept a late answer naming the old leader.
        None => (
            BrokerId(-1),
            shard
                .cluster
                .assigned_epoch(&t.name, partition)
                .unwrap_or(-1),
            errors::LEADER_NOT_AVAILABLE,
        ),
    }
}

/// The leader epoch a client should see. In cluster mode every broker reports the epoch the
/// leader took the partition over at, as Kafka's brokers do (see `kaas_shard::leader_claim`:
/// an epoch that differed by the broker asked made librdkafka see false truncations). In
/// single-node mode an open log on this shard knows its exact epoch, and partitions not
/// opened yet are at 0.
fn leader_epoch(shard: &Shard, t: &TopicMeta, partition: i32, leader: i32) -> i32 {
    if shard.cluster.enabled() {
        return shard.reported_leader_epoch(t, partition, leader);
    }
    if shard.owner_of(&t.name, partition) == shard.id {
        if let Some(log) = shard.open_partition(t.id, partition) {
            return log.leader_epoch().0;
        }
    }
    0
}

/// KIP-919's endpoint types: what a DescribeCluster v1+ asks to be described.
const BROKER_ENDPOINTS: i8 = 1;
const CONTROLLER_ENDPOINTS: i8 = 2;

pub fn describe_cluster(shard: &Rc<Shard>, req: DescribeClusterRequest) -> DescribeClusterResponse {
    // A kaas listener is a broker's (the controller has no endpoint of its own). Kafka's
    // brokers refuse the other types, and an admin client that asked for controllers must
    // not take the brokers for them (v0 has no field: it reads as brokers).
    let refused = match req.endpoint_type {
        BROKER_ENDPOINTS => None,
        CONTROLLER_ENDPOINTS => Some((
            errors::MISMATCHED_ENDPOINT_TYPE,
            "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of \
             type CONTROLLER"
                .to_string(),
        )),
        other => Some((
            errors::UNSUPPORTED_ENDPOINT_TYPE,
            format!("Unsupported endpoint type {other}"),
        )),
    };
    if let Some((code, message)) = refused {
        return DescribeClusterResponse::default()
            .with_error_code(code)
            .with_error_message(Some(s(&message)));
    }
    let brokers = shard
        .cluster
        .brokers()
        .into_iter()
        .map(|b| {
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(b.id))
                .with_host(s(&b.host))
                .with_port(i32::from(b.port))
                .with_rack(b.rack.as_deref().map(s))
                .with_is_fenced(b.fenced)
        })
        .collect();
    DescribeClusterResponse::default()
        .with_endpoint_type(req.endpoint_type)
        .with_cluster_id(s(shard.catalog.cluster_id()))
        .with_controller_id(BrokerId(shard.cluster.controller()))
        .with_brokers(brokers)
        .with_cluster_authorized_operations(authorized::operations(
            req.include_cluster_authorized_operations,
            authorized::CLUSTER,
        ))
}

#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
pub async fn describe_topic_partitions(
    shard: &Rc<Shard>,
    req: DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    catch_up(shard, req.topics.iter().map(|t| t.name.as_str())).await;
    let snapshot = shard.catalog.snapshot();
    let names: Vec<String> = if req.topics.is_empty() {
        snapshot.topics.keys().cloned().collect()
    } else {
        let mut v: Vec<String> = req
            .topics
            .iter()
            .map(|t| t.name.as_str().to_string())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let limit = if req.response_partition_limit <= 0 {
        2000
    } else {
        req.response_partition_limit as usize
    };
    let (cursor_topic, cursor_partition) = match &req.cursor {
        Some(c) => (Some(c.topic_name.as_str().to_string()), c.partition_index),
        None => (None, 0),
    };
    let mut budget = limit;
    let mut topics = Vec::new();
    let mut next_cursor = None;
    for name in names {
        if let Some(ct) = &cursor_topic {
            if &name < ct {
                continue;
            }
        }
        let Some(t) = snapshot.get(&name) else {
            topics.push(
                DescribeTopicPartitionsResponseTopic::default()
                    .with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION)
                    .with_name(Some(topic_name(&name)))
                    .with_topic_authorized_operations(authorized::OMITTED),
            );
            continue;
        };
        let start = if cursor_topic.as_deref() == Some(name.as_str()) {
            cursor_partition.max(0)
        } else {
            0
        };
        let mut partitions = Vec::new();
        for p in start..t.partitions {
            if budget == 0 {
                next_cursor = Some(
                    Cursor::default()
                        .with_topic_name(topic_name(&name))
                        .with_partition_index(p),
                );
                break;
            }
            budget -= 1;
            let (leader, epoch, error) = leadership(shard, t, p);
            partitions.push(
                DescribeTopicPartitionsResponsePartition::default()
                    .with_error_code(error)
                    .with_partition_index(p)
                    .with_leader_id(leader)
                    .with_leader_epoch(epoch)
                    .with_replica_nodes(vec![leader])
                    .with_isr_nodes(vec![leader])
                    .with_eligible_leader_replicas(Some(vec![]))
                    .with_last_known_elr(Some(vec![])),
            );
        }
        topics.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(topic_name(&name)))
                .with_topic_id(t.id)
                .with_partitions(partitions)
                // The request has no flag: Kafka always fills it in.
                .with_topic_authorized_operations(authorized::TOPIC),
        );
        if next_cursor.is_some() {
            break;
        }
    }
    DescribeTopicPartitionsResponse::default()
        .with_topics(topics)
        .with_next_cursor(next_cursor)
}
