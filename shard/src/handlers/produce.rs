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

use super::{per_partition, resolve_topic, EffectGate};
use crate::catalog::TopicMeta;
use crate::errors;
use crate::shard::Shard;
use crate::topic_config;

/// A partition's share of a produce request: topic, partition index, record set, and the
/// signal that its append is done (dropped then, or on any earlier return).
type PartitionWork = (Arc<TopicMeta>, i32, Bytes, Appended);

/// Dropped by the owning shard once a partition's append has completed or was refused.
type Appended = futures::channel::oneshot::Sender<()>;

#[derive(Clone)]
struct PartResult {
    error_code: i16,
    base_offset: i64,
    log_start_offset: i64,
    log_append_time_ms: i64,
}

impl PartResult {
    fn error(code: i16) -> Self {
        PartResult {
            error_code: code,
            base_offset: -1,
            log_start_offset: -1,
            log_append_time_ms: -1,
        }
    }
}

/// `None` for acks=0, which gets no response. `gate` opens once every partition's append is
/// done: an acks=all request then waits for its sync while the connection's next request is
/// already served (the order of effects is kept; see `crate::conn`).
pub async fn produce(
    shard: &Rc<Shard>,
    req: ProduceRequest,
    mut gate: EffectGate,
) -> Option<ProduceResponse> {
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
    let mut appends = Vec::new();
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
                    let (appended, done) = futures::channel::oneshot::channel();
                    appends.push(done);
                    work_slot.push(slots.len());
                    work.push((
                        shard.owner_of(&m.name, p.index),
                        (m.clone(), p.index, records, appended),
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
        move |s, (meta, partition, records, appended)| {
            produce_partition(s, meta, partition, records, acks, appended)
        },
        PartResult::error(errors::NOT_LEADER_OR_FOLLOWER),
    );
    let appended = async move {
        // A sender dropped without a send (the common case) resolves its receiver too.
        futures::future::join_all(appends).await;
        gate.release();
    };
    let (results, ()) = futures::join!(results, appended);
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
        .with_log_append_time_ms(r.log_append_time_ms)
        .with_log_start_offset(r.log_start_offset)
}

/// Runs on the shard that owns the partition.
async fn produce_partition(
    shard: Rc<Shard>,
    meta: Arc<TopicMeta>,
    partition: i32,
    records: Bytes,
    acks: i16,
    appended: Appended,
) -> PartResult {
    let headers = match verify_produced_record_set(&records) {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!(topic = %meta.name, partition, error = %e, "refusing produced batch");
            return PartResult::error(errors::batch(&e));
        }
    };
    let rules = topic_config::produce_rules(&meta.configs, &shard.catalog.broker_configs());
    if headers
        .iter()
        .any(|h| h.total_len() > rules.max_batch_bytes)
    {
        return PartResult::error(errors::MESSAGE_TOO_LARGE);
    }
    if rules.keys_required && !all_keyed(&records, &headers) {
        // Kafka refuses the whole batch: a keyless record cannot be compacted.
        return PartResult::error(errors::INVALID_RECORD);
    }
    let log_append_time_ms = rules.log_append_time.then(now_ms);
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
    let outcome = match log
        .append_at(&records, &headers, log.leader_epoch(), log_append_time_ms)
        .await
    {
        Ok(o) => o,
        Err(e) => {
            if matches!(e, kaas_storage::StorageError::Io { .. }) {
                tracing::error!(topic = %meta.name, partition, error = %e, "append failed");
            }
            return PartResult::error(errors::storage(&e));
        }
    };
    // The append's effect is in the log: the connection may dispatch its next request.
    drop(appended);
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
        log_append_time_ms: log_append_time_ms.unwrap_or(-1),
    }
}

/// Whether every record of every batch in `records` has a key (see `produce_rules`).
fn all_keyed(records: &[u8], headers: &[kaas_wire::batch::BatchHeader]) -> bool {
    let mut scratch = Vec::new();
    let mut at = 0;
    headers.iter().all(|h| {
        let batch = &records[at..at + h.total_len()];
        at += h.total_len();
        kaas_storage::all_records_keyed(batch, &mut scratch) == Some(true)
    })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
