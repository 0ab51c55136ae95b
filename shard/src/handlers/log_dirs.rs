//! DescribeLogDirs (`kafka-log-dirs`, UIs, Cruise Control): the one log directory this broker
//! writes, its volume's total and usable bytes, and the size of each partition it hosts —
//! every partition on a single node, the partitions it leads in cluster mode (kaas keeps one
//! copy, on the shared volume, written by its leader). Sizes are the segments' bytes: the open
//! log's own count, or the segment files of a log that is not open (read on the blocking
//! pool). Unknown topics and partitions are left out, as Kafka does.

use std::rc::Rc;
use std::sync::Arc;

use kaas_wire::kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kaas_wire::kafka_protocol::messages::{
    DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName,
};
use kaas_wire::kafka_protocol::protocol::StrBytes;

use super::per_partition;
use crate::catalog::TopicMeta;
use crate::errors;
use crate::shard::Shard;

pub async fn describe_log_dirs(
    shard: &Rc<Shard>,
    req: DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    let snapshot = shard.catalog.snapshot();
    let wanted: Vec<(Arc<TopicMeta>, Vec<i32>)> = match &req.topics {
        // null: every partition.
        None => snapshot
            .topics
            .values()
            .map(|t| (t.clone(), (0..t.partitions).collect()))
            .collect(),
        Some(topics) => topics
            .iter()
            .filter_map(|t| {
                let meta = snapshot.get(t.topic.as_str())?.clone();
                let ps = t
                    .partitions
                    .iter()
                    .copied()
                    .filter(|p| (0..meta.partitions).contains(p))
                    .collect();
                Some((meta, ps))
            })
            .collect(),
    };
    let hosted = |t: &TopicMeta, p: i32| {
        !shard.cluster.enabled() || shard.cluster.leader(&t.name, p) == Some(shard.cluster.me())
    };
    let mut items = Vec::new();
    for (t, ps) in &wanted {
        for &p in ps {
            if hosted(t, p) {
                items.push((shard.owner_of(&t.name, p), (t.clone(), p)));
            }
        }
    }
    let keys: Vec<(String, i32)> = items
        .iter()
        .map(|(_, (t, p))| (t.name.clone(), *p))
        .collect();
    let sizes = per_partition(shard, items, |s, (t, p)| partition_size(s, t, p), -1).await;

    let mut topics: Vec<DescribeLogDirsTopic> = Vec::new();
    for ((name, p), size) in keys.into_iter().zip(sizes) {
        if size < 0 {
            continue; // its size could not be read: left out, as Kafka leaves out what it lacks
        }
        if topics.last().is_none_or(|t| t.name.0.as_str() != name) {
            topics.push(
                DescribeLogDirsTopic::default().with_name(TopicName(StrBytes::from_string(name))),
            );
        }
        let t = topics.last_mut().expect("pushed");
        t.partitions.push(
            DescribeLogDirsPartition::default()
                .with_partition_index(p)
                .with_partition_size(size)
                .with_offset_lag(0)
                .with_is_future_key(false),
        );
    }
    let disk = &shard.admission.disk;
    let dir = shard
        .config
        .data_dir
        .canonicalize()
        .unwrap_or_else(|_| shard.config.data_dir.clone());
    DescribeLogDirsResponse::default().with_results(vec![DescribeLogDirsResult::default()
        .with_error_code(errors::NONE)
        .with_log_dir(StrBytes::from_string(dir.display().to_string()))
        .with_topics(topics)
        .with_total_bytes(disk.total() as i64)
        .with_usable_bytes(disk.free() as i64)])
}

/// On the owning shard: the open log's size, or its segment files' bytes; -1 if unreadable.
async fn partition_size(shard: Rc<Shard>, t: Arc<TopicMeta>, p: i32) -> i64 {
    if let Some(log) = shard.open_partition(t.id, p) {
        return log.size_bytes() as i64;
    }
    let dir = t.partition_dir(&shard.config.data_dir, p);
    let listed = glommio::executor()
        .spawn_blocking(move || kaas_storage::stored_log_bytes(&dir))
        .await;
    match listed {
        Ok(bytes) => bytes as i64,
        Err(e) => {
            tracing::warn!(topic = %t.name, partition = p, error = %e, "DescribeLogDirs: could not size a partition's segments");
            -1
        }
    }
}
