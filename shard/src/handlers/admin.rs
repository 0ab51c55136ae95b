//! CreateTopics, DeleteTopics, CreatePartitions and DeleteRecords.

use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kaas_wire::kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kaas_wire::kafka_protocol::messages::create_topics_request::CreatableTopic;
use kaas_wire::kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kaas_wire::kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kaas_wire::kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kaas_wire::kafka_protocol::messages::{
    BrokerId, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
    CreateTopicsResponse, DeleteRecordsRequest, DeleteRecordsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, TopicName,
};
use kaas_wire::kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::{per_partition, per_topic_partition};
use crate::catalog::{CatalogError, TopicMeta};
use crate::errors;
use crate::shard::Shard;
use crate::topic_config::{self, TOPIC_CONFIGS};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// DescribeConfigs/CreateTopics config source codes.
pub const SOURCE_DYNAMIC_TOPIC: i8 = 1;
pub const SOURCE_DEFAULT: i8 = 5;

/// The longest CreateTopics waits for the controller to place what it created.
const PLACEMENT_WAIT_CAP: Duration = Duration::from_secs(30);

pub async fn create_topics(
    shard: &Rc<Shard>,
    req: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let timeout = Duration::from_millis(u64::try_from(req.timeout_ms).unwrap_or(0));
    let mut created = Vec::new();
    let mut results = Vec::with_capacity(req.topics.len());
    let duplicates = repeated(req.topics.iter().map(|t| t.name.as_str().to_string()));
    let mut answered = HashSet::new();
    for t in req.topics {
        let name = t.name.as_str().to_string();
        let duplicate = duplicates.contains(&name);
        if duplicate && !answered.insert(name.clone()) {
            continue; // one answer per name, where it first appears
        }
        let configs: BTreeMap<String, String> = t
            .configs
            .iter()
            .filter_map(|c| Some((c.name.to_string(), c.value.as_ref()?.to_string())))
            .collect();
        let (partitions, rf) = requested_shape(shard, &t);
        let assigned = t.assignments.iter().map(|a| a.broker_ids.as_slice());
        let indexes = t.assignments.iter().map(|a| a.partition_index);
        let outcome = if duplicate {
            Err(CatalogError::DuplicateName)
        } else if let Err(e) = self_consistent(&t) {
            Err(e)
        } else if let Err(e) = known_brokers(shard, assigned) {
            Err(e)
        } else if let Err(e) = consecutive_from_zero(indexes) {
            Err(e)
        } else if req.validate_only {
            shard
                .catalog
                .check_new_topic(&name, partitions, rf, &configs)
                .map(|_| None)
        } else {
            create_after_name_reuse_delay(shard, &name, partitions, rf, &configs)
                .await
                .map(Some)
        };
        let mut r = CreatableTopicResult::default().with_name(t.name.clone());
        match outcome {
            Ok(meta) => {
                // A null message on success, as Kafka's (the codec's default is "").
                r = r.with_error_message(None);
                if let Some(m) = &meta {
                    tracing::info!(topic = %name, partitions, id = %m.id, "created topic");
                    r = r.with_topic_id(m.id);
                    created.push((name.clone(), partitions));
                }
                if version >= 5 {
                    r = r
                        .with_num_partitions(partitions)
                        .with_replication_factor(1)
                        .with_configs(Some(config_entries(&configs)));
                }
            }
            Err(e) => {
                r = r
                    .with_error_code(errors::catalog(&e))
                    .with_error_message(Some(s(&e.to_string())));
                if version >= 5 {
                    r = r.with_num_partitions(-1).with_replication_factor(-1);
                }
            }
        }
        results.push(r);
    }
    wait_placed(
        shard,
        "CreateTopics",
        &created,
        timeout.min(PLACEMENT_WAIT_CAP),
    )
    .await;
    CreateTopicsResponse::default().with_topics(results)
}

/// A CreateTopics entry that contradicts itself, refused as Kafka's controller refuses it
/// rather than one half of it obeyed: explicit assignments with a partition count or
/// replication factor, or a config without a value.
fn self_consistent(t: &CreatableTopic) -> Result<(), CatalogError> {
    if !t.assignments.is_empty() && (t.num_partitions != -1 || t.replication_factor != -1) {
        return Err(CatalogError::InvalidRequest(
            "Both numPartitions or replicationFactor and replicasAssignments were set. Both \
             cannot be used at the same time."
                .into(),
        ));
    }
    let nulls: Vec<&str> = t
        .configs
        .iter()
        .filter(|c| c.value.is_none())
        .map(|c| c.name.as_str())
        .collect();
    if !nulls.is_empty() {
        return Err(CatalogError::InvalidConfig(format!(
            "Null value not supported for topic configs: {}",
            nulls.join(",")
        )));
    }
    Ok(())
}

/// (partition count, replication factor) a CreateTopics entry asks for. Explicit assignments
/// decide the partition count; replicas beyond one are refused later.
fn requested_shape(shard: &Shard, t: &CreatableTopic) -> (i32, i16) {
    if !t.assignments.is_empty() {
        let rf = t
            .assignments
            .iter()
            .map(|a| a.broker_ids.len())
            .max()
            .unwrap_or(1) as i16;
        (t.assignments.len() as i32, rf)
    } else if t.num_partitions == -1 {
        (shard.config.num_partitions, t.replication_factor)
    } else {
        (t.num_partitions, t.replication_factor)
    }
}

/// The names (or ids) a request lists more than once. Kafka refuses every entry of such a name
/// with INVALID_REQUEST ("Duplicate topic name.") and acts on none of them, rather than
/// performing the first and failing the second (kafka-go's suite checks it for CreateTopics):
/// the client asked for two things at once about one topic, and which one wins is not theirs
/// to guess.
fn repeated<T: Eq + std::hash::Hash + Clone>(items: impl Iterator<Item = T>) -> HashSet<T> {
    let mut seen = HashSet::new();
    items.filter(|i| !seen.insert(i.clone())).collect()
}

/// An explicit replica assignment may name only brokers of the cluster, as Kafka requires
/// (kaas then places the partition itself: it keeps one copy, led by whichever broker the
/// controller picks). A made-up id was accepted silently.
fn known_brokers<'a>(
    shard: &Shard,
    mut assigned: impl Iterator<Item = &'a [BrokerId]>,
) -> Result<(), CatalogError> {
    let brokers = shard.cluster.brokers();
    let known = |id: &BrokerId| brokers.iter().any(|b| b.id == id.0);
    match assigned.find_map(|ids| ids.iter().find(|id| !known(id))) {
        Some(id) => Err(CatalogError::InvalidReplicaAssignment(format!(
            "The replica assignment names broker {}, which is not in the cluster (brokers: {:?})",
            id.0,
            brokers.iter().map(|b| b.id).collect::<Vec<_>>()
        ))),
        None => Ok(()),
    }
}

/// An explicit assignment names partitions 0, 1, ... n-1, each once, as Kafka requires; a
/// gap (`{0, 2}`) was renumbered silently, so partition 2 of the request became partition 1.
fn consecutive_from_zero(indexes: impl Iterator<Item = i32>) -> Result<(), CatalogError> {
    let mut seen: Vec<i32> = indexes.collect();
    seen.sort_unstable();
    if seen
        .iter()
        .enumerate()
        .all(|(i, &p)| i64::from(p) == i as i64)
    {
        return Ok(());
    }
    Err(CatalogError::InvalidReplicaAssignment(format!(
        "The replica assignment names partitions {seen:?}; they must be 0 to n-1, each once"
    )))
}

/// Waits (at most `timeout`, the request's own) until the controller has placed every topic
/// in `names` with at least its partition count, as Kafka's ZooKeeper-era brokers held
/// CreateTopics and CreatePartitions until the new partitions had leaders: a client that
/// produces right after the call returned then finds leaders in Metadata instead of
/// LEADER_NOT_AVAILABLE. On a single node partitions are placed at once. A time-out still
/// answers success: the partitions exist, and their leaders follow within a round.
async fn wait_placed(shard: &Shard, what: &str, names: &[(String, i32)], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while names
        .iter()
        .any(|(n, count)| !shard.cluster.placed_partitions(n, *count))
    {
        if Instant::now() >= deadline {
            tracing::info!(
                topics = ?names,
                timeout_ms = timeout.as_millis() as u64,
                "{what} answered before the controller placed every new partition"
            );
            return;
        }
        glommio::timer::sleep(Duration::from_millis(20)).await;
    }
}

fn config_entries(overrides: &BTreeMap<String, String>) -> Vec<CreatableTopicConfigs> {
    TOPIC_CONFIGS
        .iter()
        .map(|d| {
            let (value, source) = match overrides.get(d.name) {
                Some(v) => (v.as_str(), SOURCE_DYNAMIC_TOPIC),
                None => (d.default, SOURCE_DEFAULT),
            };
            CreatableTopicConfigs::default()
                .with_name(s(d.name))
                .with_value(Some(s(value)))
                .with_config_source(source)
        })
        .collect()
}

pub async fn delete_topics(
    shard: &Rc<Shard>,
    req: DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    // v0–5 name topics in `topic_names`; v6 in `topics` by name or id.
    let wanted: Vec<(Option<String>, Uuid)> = if version >= 6 {
        req.topics
            .iter()
            .map(|t| (t.name.as_ref().map(|n| n.as_str().to_string()), t.topic_id))
            .collect()
    } else {
        req.topic_names
            .iter()
            .map(|n| (Some(n.as_str().to_string()), Uuid::nil()))
            .collect()
    };
    let mut responses = Vec::with_capacity(wanted.len());
    let duplicate_names = repeated(wanted.iter().filter_map(|(n, _)| n.clone()));
    let duplicate_ids = repeated(wanted.iter().map(|(_, id)| *id).filter(|id| !id.is_nil()));
    let (mut answered_names, mut answered_ids) = (HashSet::new(), HashSet::new());
    for (name, id) in wanted {
        if name.is_some() && !id.is_nil() {
            // Which one would be meant is the client's mistake to fix, not a guess to make
            // (kaas deleted the topic the name gave); Kafka's answer.
            responses.push(
                DeletableTopicResult::default()
                    .with_name(name.map(|n| TopicName(s(&n))))
                    .with_topic_id(id)
                    .with_error_code(errors::INVALID_REQUEST)
                    .with_error_message(Some(s(
                        "You may not specify both topic name and topic id.",
                    ))),
            );
            continue;
        }
        let duplicate = match &name {
            Some(n) if duplicate_names.contains(n) => Some((
                answered_names.insert(n.clone()),
                CatalogError::DuplicateName.to_string(),
            )),
            None if duplicate_ids.contains(&id) => {
                Some((answered_ids.insert(id), "Duplicate topic id.".to_string()))
            }
            _ => None,
        };
        if let Some((first, message)) = duplicate {
            if first {
                responses.push(
                    DeletableTopicResult::default()
                        .with_name(name.map(|n| TopicName(s(&n))))
                        .with_topic_id(id)
                        .with_error_code(errors::INVALID_REQUEST)
                        .with_error_message(Some(s(&message))),
                );
            }
            continue;
        }
        let snapshot = shard.catalog.snapshot();
        let name = match name {
            Some(n) => Some(n),
            None => snapshot.by_id(id).map(|t| t.name.clone()),
        };
        let mut r = DeletableTopicResult::default().with_topic_id(id);
        let Some(name) = name else {
            responses.push(r.with_error_code(errors::UNKNOWN_TOPIC_ID));
            continue;
        };
        r = r.with_name(Some(TopicName(s(&name))));
        match delete_topic(shard, &name).await {
            Ok(meta) => responses.push(r.with_topic_id(meta.id)),
            Err(e) => responses.push(
                r.with_error_code(errors::catalog(&e))
                    .with_error_message(Some(s(&e.to_string()))),
            ),
        }
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

/// Creates a topic, first waiting out the name's reuse delay if it was deleted moments ago
/// (cluster mode; see `Catalog::set_name_reuse_delay`).
async fn create_after_name_reuse_delay(
    shard: &Rc<Shard>,
    name: &str,
    partitions: i32,
    rf: i16,
    configs: &BTreeMap<String, String>,
) -> Result<Arc<TopicMeta>, CatalogError> {
    let mut waited = false;
    loop {
        match shard
            .catalog
            .create_topic(name, partitions, rf, configs.clone())
        {
            // Once: the delay is a few seconds, and it runs from the deletion.
            Err(CatalogError::NameRecentlyDeleted { wait_ms, .. }) if !waited => {
                waited = true;
                tracing::info!(topic = %name, wait_ms, "topic name deleted moments ago: creating it once every broker has seen the deletion");
                glommio::timer::sleep(Duration::from_millis(wait_ms)).await;
            }
            r => return r,
        }
    }
}

/// Removes a topic from the catalog, closes its partitions on every shard, then deletes its
/// directory. The catalog goes first: once it no longer lists the topic no new request can open
/// a partition of it, and a crash before the directory is gone leaves only an orphan directory
/// that no topic id points to.
async fn delete_topic(shard: &Rc<Shard>, name: &str) -> Result<Arc<TopicMeta>, CatalogError> {
    let meta = shard.catalog.delete_topic(name)?;
    let id = meta.id;
    let everyone = (0..shard.nshards).map(|i| (i, ())).collect();
    per_partition(
        shard,
        everyone,
        move |s, ()| async move { s.close_topic(id).await },
        (),
    )
    .await;
    crate::shard::remove_deleted_topic_dir(&shard.config.data_dir.join(meta.dir_name()));
    tracing::info!(topic = name, id = %meta.id, "deleted topic");
    Ok(meta)
}

pub async fn create_partitions(
    shard: &Rc<Shard>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut grown = Vec::new();
    let duplicates = repeated(req.topics.iter().map(|t| t.name.clone()));
    let mut answered = HashSet::new();
    let results = req
        .topics
        .iter()
        .filter(|t| !duplicates.contains(&t.name) || answered.insert(t.name.clone()))
        .map(|t| {
            let r = CreatePartitionsTopicResult::default().with_name(t.name.clone());
            let assigned = t
                .assignments
                .iter()
                .flatten()
                .map(|a| a.broker_ids.as_slice());
            let once = if duplicates.contains(&t.name) {
                Err(CatalogError::DuplicateName)
            } else {
                Ok(())
            };
            match once
                .and_then(|()| assignments_cover_the_new_partitions(shard, t))
                .and_then(|()| known_brokers(shard, assigned))
                .and_then(|()| {
                    shard
                        .catalog
                        .set_partition_count(t.name.as_str(), t.count, req.validate_only)
                }) {
                Ok(_) => {
                    if !req.validate_only {
                        grown.push((t.name.to_string(), t.count));
                    }
                    r
                }
                Err(e) => r
                    .with_error_code(errors::catalog(&e))
                    .with_error_message(Some(s(&e.to_string()))),
            }
        })
        .collect();
    let timeout = Duration::from_millis(u64::try_from(req.timeout_ms).unwrap_or(0));
    wait_placed(
        shard,
        "CreatePartitions",
        &grown,
        timeout.min(PLACEMENT_WAIT_CAP),
    )
    .await;
    CreatePartitionsResponse::default().with_results(results)
}

/// CreatePartitions with assignments must give one for each new partition, as Kafka's
/// controller requires (kaas placed the partitions it had no assignment for anyway).
fn assignments_cover_the_new_partitions(
    shard: &Shard,
    t: &kaas_wire::kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic,
) -> Result<(), CatalogError> {
    let catalog = shard.catalog.snapshot();
    let (Some(assignments), Some(topic)) = (&t.assignments, catalog.get(&t.name)) else {
        return Ok(());
    };
    let adding = i64::from(t.count) - i64::from(topic.partitions);
    if adding > 0 && assignments.len() as i64 != adding {
        return Err(CatalogError::InvalidReplicaAssignment(format!(
            "Attempted to add {adding} additional partitions, but only {} assignments were \
             given.",
            assignments.len()
        )));
    }
    Ok(())
}

#[derive(Clone)]
struct Deleted {
    error_code: i16,
    low_watermark: i64,
}

/// DeleteRecords for one partition, on its owning shard.
async fn delete_on_owner(s: Rc<Shard>, m: Arc<TopicMeta>, p: i32, offset: i64) -> Deleted {
    // As Kafka: records are deleted only where the cleanup policy includes `delete`;
    // a compact-only topic keeps every key's latest record until compaction replaces it.
    let broker = s.catalog.effective_broker_configs();
    if !topic_config::log_config(&m.configs, &broker).delete_enabled {
        return Deleted {
            error_code: errors::POLICY_VIOLATION,
            low_watermark: -1,
        };
    }
    let log = match s.partition(&m, p).await {
        Ok(l) => l,
        Err(e) => {
            return Deleted {
                error_code: errors::storage(&e),
                low_watermark: -1,
            }
        }
    };
    // -1 means "up to the high watermark", as in Kafka.
    let target = if offset == -1 {
        log.high_watermark()
    } else {
        offset
    };
    match log.delete_records_before(target).await {
        Ok(low) => Deleted {
            error_code: errors::NONE,
            low_watermark: low,
        },
        Err(e) => Deleted {
            error_code: errors::storage(&e),
            low_watermark: -1,
        },
    }
}

pub async fn delete_records(shard: &Rc<Shard>, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let wanted = req
        .topics
        .iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.partitions
                    .iter()
                    .map(|p| (p.partition_index, p.offset))
                    .collect(),
            )
        })
        .collect();
    let unknown = Deleted {
        error_code: errors::UNKNOWN_TOPIC_OR_PARTITION,
        low_watermark: -1,
    };
    let answers = per_topic_partition(
        shard,
        wanted,
        delete_on_owner,
        unknown,
        Deleted {
            error_code: errors::NOT_LEADER_OR_FOLLOWER,
            low_watermark: -1,
        },
    )
    .await;
    let topics = req
        .topics
        .iter()
        .zip(answers)
        .map(|(t, ans)| {
            DeleteRecordsTopicResult::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .zip(ans)
                        .map(|(p, a)| {
                            DeleteRecordsPartitionResult::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(a.error_code)
                                .with_low_watermark(a.low_watermark)
                        })
                        .collect(),
                )
        })
        .collect();
    DeleteRecordsResponse::default().with_topics(topics)
}

/// Tells every shard a topic's configs changed so open logs pick up segment settings.
pub async fn broadcast_topic_config(shard: &Rc<Shard>, meta: Arc<TopicMeta>) {
    let everyone = (0..shard.nshards).map(|i| (i, meta.clone())).collect();
    per_partition(
        shard,
        everyone,
        |s, m: Arc<TopicMeta>| async move { s.apply_topic_config(&m) },
        (),
    )
    .await;
}
