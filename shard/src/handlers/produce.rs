//! Produce: validate each partition's batches on the owning shard, append, and for acks=all
//! answer only after the group-commit fsync that covers the write.

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use kaas_storage::AppendOutcome;
use kaas_wire::batch::verify_produced_record_set;
use kaas_wire::kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, TopicProduceResponse,
};
use kaas_wire::kafka_protocol::messages::{ProduceRequest, ProduceResponse};

use super::{per_partition, resolve_topic};
use crate::catalog::TopicMeta;
use crate::errors;
use crate::shard::Shard;
use crate::topic_config;

/// A partition's share of a produce request: topic, partition index, record set.
type PartitionWork = (Arc<TopicMeta>, i32, Bytes);

#[derive(Clone)]
struct PartResult {
    error_code: i16,
    base_offset: i64,
    log_start_offset: i64,
}

impl PartResult {
    fn error(code: i16) -> Self {
        PartResult {
            error_code: code,
            base_offset: -1,
            log_start_offset: -1,
        }
    }
}

/// `None` for acks=0, which gets no response.
pub async fn produce(shard: &Rc<Shard>, req: ProduceRequest) -> Option<ProduceResponse> {
    let acks = req.acks;
    if !matches!(acks, -1..=1) {
        let responses = req
            .topic_data
            .iter()
            .map(|t| {
                TopicProduceResponse::default()
                    .with_name(t.name.clone())
                    .with_partition_responses(
                        t.partition_data
                            .iter()
                            .map(|p| {
                                part_response(
                                    p.index,
                                    &PartResult::error(errors::INVALID_REQUIRED_ACKS),
                                )
                            })
                            .collect(),
                    )
            })
            .collect();
        return Some(ProduceResponse::default().with_responses(responses));
    }
    // (topic index, partition index) → either an early error or work for an owner shard.
    let mut slots: Vec<(usize, i32, Option<PartResult>)> = Vec::new();
    let mut work: Vec<(usize, PartitionWork)> = Vec::new();
    let mut work_slot: Vec<usize> = Vec::new();
    for (ti, topic) in req.topic_data.iter().enumerate() {
        let meta = resolve_topic(shard, topic.name.as_str(), true);
        for p in &topic.partition_data {
            let early = match &meta {
                Err(code) => Some(PartResult::error(*code)),
                Ok(m) if p.index < 0 || p.index >= m.partitions => {
                    Some(PartResult::error(errors::UNKNOWN_TOPIC_OR_PARTITION))
                }
                Ok(m) => {
                    let records = p.records.clone().unwrap_or_default();
                    work_slot.push(slots.len());
                    work.push((
                        shard.owner_of(&m.name, p.index),
                        (m.clone(), p.index, records),
                    ));
                    None
                }
            };
            slots.push((ti, p.index, early));
        }
    }
    let results = per_partition(
        shard,
        work,
        move |s, (meta, partition, records)| produce_partition(s, meta, partition, records, acks),
        PartResult::error(errors::NOT_LEADER_OR_FOLLOWER),
    )
    .await;
    for (slot, r) in work_slot.into_iter().zip(results) {
        slots[slot].2 = Some(r);
    }
    if acks == 0 {
        return None;
    }
    let mut responses: Vec<TopicProduceResponse> = req
        .topic_data
        .iter()
        .map(|t| TopicProduceResponse::default().with_name(t.name.clone()))
        .collect();
    for (ti, partition, r) in slots {
        let r = r.unwrap_or_else(|| PartResult::error(errors::NOT_LEADER_OR_FOLLOWER));
        responses[ti]
            .partition_responses
            .push(part_response(partition, &r));
    }
    Some(ProduceResponse::default().with_responses(responses))
}

fn part_response(index: i32, r: &PartResult) -> PartitionProduceResponse {
    PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(r.error_code)
        .with_base_offset(r.base_offset)
        .with_log_append_time_ms(-1)
        .with_log_start_offset(r.log_start_offset)
}

/// Runs on the shard that owns the partition.
async fn produce_partition(
    shard: Rc<Shard>,
    meta: Arc<TopicMeta>,
    partition: i32,
    records: Bytes,
    acks: i16,
) -> PartResult {
    let headers = match verify_produced_record_set(&records) {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!(topic = %meta.name, partition, error = %e, "refusing produced batch");
            return PartResult::error(errors::batch(&e));
        }
    };
    let max = topic_config::max_message_bytes(&meta.configs, &shard.catalog.broker_configs());
    if headers.iter().any(|h| h.total_len() > max) {
        return PartResult::error(errors::MESSAGE_TOO_LARGE);
    }
    // Cluster mode: only the leader writes, and only while its write fence is open (see
    // kaas_control::handover); both are checked again before acknowledging.
    if !shard.serves(&meta.name, partition) || !shard.cluster.may_acknowledge() {
        return PartResult::error(errors::NOT_LEADER_OR_FOLLOWER);
    }
    let log = match shard.partition(&meta, partition).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(topic = %meta.name, partition, error = %e, "cannot open partition for produce");
            return PartResult::error(errors::storage(&e));
        }
    };
    let outcome = match log.append(&records, &headers, log.leader_epoch()).await {
        Ok(o) => o,
        Err(e) => {
            if matches!(e, kaas_storage::StorageError::Io { .. }) {
                tracing::error!(topic = %meta.name, partition, error = %e, "append failed");
            }
            return PartResult::error(errors::storage(&e));
        }
    };
    if acks == -1 {
        if let Err(e) = log.wait_durable(outcome.end_offset()).await {
            tracing::error!(topic = %meta.name, partition, error = %e, "fsync failed; acks=all produce not acknowledged");
            return PartResult::error(errors::storage(&e));
        }
    }
    if !shard.cluster.may_acknowledge() {
        // The fence closed while the write was in flight: a new leader may already have
        // recovered the log without it, so it must not be acknowledged. The producer retries
        // on the new leader (idempotence removes the copy if this one did land).
        return PartResult::error(errors::NOT_LEADER_OR_FOLLOWER);
    }
    let base_offset = match outcome {
        AppendOutcome::Appended { base_offset, .. }
        | AppendOutcome::Duplicate { base_offset, .. } => base_offset,
    };
    PartResult {
        error_code: errors::NONE,
        base_offset,
        log_start_offset: log.log_start_offset(),
    }
}
