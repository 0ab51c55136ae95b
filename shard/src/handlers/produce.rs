//! Produce: validate each partition's batches on the owning shard, append, and for acks=all
//! answer only after the group-commit fsync that covers the write.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use kaas_storage::AppendOutcome;
use kaas_wire::batch::verify_produced_record_set;
use kaas_wire::kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kaas_wire::kafka_protocol::messages::{ProduceRequest, ProduceResponse};

use super::{dispatch_per_partition, resolve_topic, EffectGate};
use crate::catalog::TopicMeta;
use crate::errors;
use crate::shard::Shard;

/// A partition's share of a produce request: topic, partition index, record set.
type PartitionWork = (Arc<TopicMeta>, i32, Bytes);

#[derive(Clone)]
struct PartResult {
    error_code: i16,
    base_offset: i64,
    log_start_offset: i64,
    log_append_time_ms: i64,
    /// Positions of the records that caused `error_code` (v8+; INVALID_RECORD).
    record_errors: Vec<i32>,
    error_message: Option<String>,
}

impl PartResult {
    fn error(code: i16) -> Self {
        PartResult {
            error_code: code,
            base_offset: -1,
            log_start_offset: -1,
            log_append_time_ms: -1,
            record_errors: Vec::new(),
            error_message: None,
        }
    }
}

/// What a Produce gets: its response, or for acks=0 nothing, or — when an acks=0 write was
/// refused — a closed connection, as Kafka's `KafkaApis` closes it: the client has no answer to
/// read the error from, and only a broken connection makes it refresh its metadata (after a
/// leader moved, an acks=0 producer would otherwise go on sending to a broker that drops
/// everything until its next periodic refresh, five minutes by default).
pub enum Answer {
    Respond(ProduceResponse),
    Silent,
    Close,
}

/// `gate` lets the connection's next Produce go
/// once every partition's append is queued on its owner, and anything else once this request
/// is answered (see `crate::conn`).
#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
pub async fn produce(
    shard: &Rc<Shard>,
    req: ProduceRequest,
    version: i16,
    mut gate: EffectGate,
) -> Answer {
    let acks = req.acks;
    if !matches!(acks, -1..=1) {
        let responses = req
            .topic_data
            .iter()
            .map(|t| {
                TopicProduceResponse::default()
                    .with_name(t.name.clone())
                    .with_topic_id(t.topic_id)
                    .with_partition_responses(
                        t.partition_data
                            .iter()
                            .map(|p| {
                                part_response(
                                    p.index,
                                    &PartResult::error(errors::INVALID_REQUIRED_ACKS),
                                    version,
                                )
                            })
                            .collect(),
                    )
            })
            .collect();
        return Answer::Respond(ProduceResponse::default().with_responses(responses));
    }
    // (topic index, partition index) → either an early error or work for an owner shard.
    let mut slots: Vec<(usize, i32, Option<PartResult>)> = Vec::new();
    let mut work: Vec<(usize, PartitionWork)> = Vec::new();
    let mut work_slot: Vec<usize> = Vec::new();
    // v13 names topics by id (KIP-516), and an id names a topic that exists: no auto-creation,
    // and an id the catalog does not know is UNKNOWN_TOPIC_ID, on which clients refresh
    // their metadata (as Kafka's brokers answer).
    let snapshot = (version >= 13).then(|| shard.catalog.snapshot());
    for (ti, topic) in req.topic_data.iter().enumerate() {
        let meta = match &snapshot {
            Some(s) => s
                .by_id(topic.topic_id)
                .cloned()
                .ok_or(errors::UNKNOWN_TOPIC_ID),
            None => resolve_topic(shard, topic.name.as_str(), true),
        };
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
    // The effect: every partition's append, on its owning shard. Each takes its place in its
    // partition's append order as it reaches the owner (`crate::turns`)...
    let appending = dispatch_per_partition(shard, work, move |s, (meta, partition, records)| {
        produce_partition(s, meta, partition, records, acks)
    })
    .await;
    // ...so the connection's next Produce may be dispatched now: its appends queue behind
    // these. Any other request waits until this one returns (the gate is dropped then).
    gate.release_order();
    // An owning shard that stopped before answering may have stored an acks=all write without
    // confirming its sync: REQUEST_TIMED_OUT (outcome unknown, retriable), not an answer that
    // says nothing was stored.
    let lost = if acks == -1 {
        errors::REQUEST_TIMED_OUT
    } else {
        errors::NOT_LEADER_OR_FOLLOWER
    };
    let results = appending.results(PartResult::error(lost)).await;
    for (slot, r) in work_slot.into_iter().zip(results) {
        slots[slot].2 = Some(r);
    }
    if acks == 0 {
        let refused = slots
            .iter()
            .any(|(_, _, r)| r.as_ref().is_none_or(|r| r.error_code != errors::NONE));
        return if refused {
            Answer::Close
        } else {
            Answer::Silent
        };
    }
    let mut responses: Vec<TopicProduceResponse> = req
        .topic_data
        .iter()
        .map(|t| {
            TopicProduceResponse::default()
                .with_name(t.name.clone())
                .with_topic_id(t.topic_id)
        })
        .collect();
    for (ti, partition, r) in slots {
        let r = r.unwrap_or_else(|| PartResult::error(errors::NOT_LEADER_OR_FOLLOWER));
        responses[ti]
            .partition_responses
            .push(part_response(partition, &r, version));
    }
    Answer::Respond(ProduceResponse::default().with_responses(responses))
}

fn part_response(index: i32, r: &PartResult, version: i16) -> PartitionProduceResponse {
    let resp = PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(r.error_code)
        .with_base_offset(r.base_offset)
        .with_log_append_time_ms(r.log_append_time_ms)
        .with_log_start_offset(r.log_start_offset);
    if version < 8 {
        return resp;
    }
    resp.with_record_errors(
        r.record_errors
            .iter()
            .map(|&i| {
                BatchIndexAndErrorMessage::default()
                    .with_batch_index(i)
                    .with_batch_index_error_message(r.error_message.as_deref().map(str_bytes))
            })
            .collect(),
    )
    .with_error_message(r.error_message.as_deref().map(str_bytes))
}

fn str_bytes(v: &str) -> kaas_wire::kafka_protocol::protocol::StrBytes {
    kaas_wire::kafka_protocol::protocol::StrBytes::from_string(v.to_string())
}

/// Runs on the shard that owns the partition, called as the request's message arrives there:
/// takes the append's place in the partition's order at once, and returns the append, which
/// waits for its turn (see `crate::turns`).
///
/// An acks=all write waits for the sync that covers it here too, after giving its turn back,
/// so one message each way carries the whole request. (It used to come back after the append
/// and go out again for the sync, so that the connection could go on meanwhile; a following
/// Produce no longer needs that, and any other request may as well wait, as Kafka's own
/// network layer makes it wait for the whole response.)
fn produce_partition(
    shard: Rc<Shard>,
    meta: Arc<TopicMeta>,
    partition: i32,
    records: Bytes,
    acks: i16,
) -> impl std::future::Future<Output = PartResult> {
    let turn = shard.append_turns.take((meta.id, partition));
    async move {
        turn.ready().await;
        append_partition(shard, meta, partition, records, acks, turn).await
    }
}

/// Validate and append, in the partition's turn; the turn is given back once the append is
/// done (or refused). acks=all is then answered by [`acknowledge_when_durable`] once the write
/// is durable.
#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
async fn append_partition(
    shard: Rc<Shard>,
    meta: Arc<TopicMeta>,
    partition: i32,
    records: Bytes,
    acks: i16,
    turn: crate::turns::Turn<(uuid::Uuid, i32)>,
) -> PartResult {
    let refuse = PartResult::error;
    let headers = match verify_produced_record_set(&records) {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!(topic = %meta.name, partition, error = %e, "refusing produced batch");
            return refuse(errors::batch(&e));
        }
    };
    // An idempotent batch refused below before anything of it is stored leaves a gap in its
    // producer's sequence; the next batch must not be answered OUT_OF_ORDER for it (see
    // crate::refused).
    let sequence = headers
        .iter()
        .find(|h| h.producer_id >= 0 && h.base_sequence >= 0)
        .map(|h| {
            (
                (meta.id, partition, h.producer_id),
                h.producer_epoch,
                h.base_sequence,
                h.last_sequence(),
            )
        });
    let note_unstored = |code: i16| {
        if let Some((key, epoch, first, _)) = sequence {
            shard
                .refused
                .borrow_mut()
                .note(key, epoch, first, code, std::time::Instant::now());
        }
    };
    let refuse_unstored = |code: i16| {
        note_unstored(code);
        refuse(code)
    };
    let rules = shard.produce_rules(&meta);
    if headers
        .iter()
        .any(|h| h.total_len() > rules.max_batch_bytes)
    {
        return refuse(errors::MESSAGE_TOO_LARGE);
    }
    let (records, headers) = match super::produced::check(
        records,
        headers,
        &rules,
        now_ms(),
        // Named only in a refusal's message: formatted then, not for every append.
        &format_args!("{}-{partition}", meta.name),
    ) {
        Ok(checked) => checked,
        Err(refusal) => {
            tracing::debug!(topic = %meta.name, partition, code = refusal.code, message = %refusal.message, "refusing produced records");
            // Kafka answers a record refused on validation with the partition's log start
            // offset (its `processFailedRecord`); -1 only where this broker does not serve it.
            let log_start_offset = match shard.partition(&meta, partition).await {
                Ok(log) => log.log_start_offset(),
                Err(_) => -1,
            };
            return PartResult {
                record_errors: refusal.record_errors,
                error_message: Some(refusal.message),
                log_start_offset,
                ..PartResult::error(refusal.code)
            };
        }
    };
    if let Some(free) = shard.admission.disk.below_floor() {
        // The space below the floor is kept for the broker's metadata (see crate::disk).
        shard.admission.disk.refused.fetch_add(1, Ordering::Relaxed);
        let floor = shard.admission.disk.min_free();
        crate::ratelog::limited("produce refused: volume nearly full", |suppressed| {
            tracing::error!(
                data_dir = %shard.config.data_dir.display(),
                free_bytes = free,
                min_free_bytes = floor,
                suppressed,
                "the data volume is nearly full: produce is refused with KAFKA_STORAGE_ERROR \
                 until free space is above --min-free-bytes again; free space by deleting \
                 topics or records, lowering retention, or growing the volume"
            )
        });
        note_unstored(errors::KAFKA_STORAGE_ERROR);
        return PartResult {
            error_message: Some(format!(
                "The data volume of broker {} has {free} bytes free, below its \
                 --min-free-bytes of {floor}: produce is refused until space is freed",
                shard.config.broker_id
            )),
            ..PartResult::error(errors::KAFKA_STORAGE_ERROR)
        };
    }
    let log_append_time_ms = rules.log_append_time.then(now_ms);
    // Cluster mode: only the leader writes, and only while its write fence is open (see
    // kaas_control::handover); both are checked again before acknowledging.
    let Some(term) = shard.cluster.fence_term() else {
        return refuse_unstored(errors::NOT_LEADER_OR_FOLLOWER);
    };
    if !shard.serves(&meta.name, partition) {
        return refuse_unstored(errors::NOT_LEADER_OR_FOLLOWER);
    }
    let log = match shard.partition(&meta, partition).await {
        Ok(l) => l,
        Err(e) => {
            // Closed: deleted or moved while this request waited; the client is told to
            // refresh its metadata, and nothing failed that the person on call must hear about.
            if !matches!(e, kaas_storage::StorageError::Closed) {
                tracing::error!(topic = %meta.name, partition, error = %e, "cannot open partition for produce");
            }
            return refuse_unstored(errors::storage(&e));
        }
    };
    let appended = log
        .append_at(&records, &headers, log.leader_epoch(), log_append_time_ms)
        .await;
    if let Err(kaas_storage::StorageError::OutOfOrderSequence {
        got,
        expected,
        after_offset,
        ..
    }) = &appended
    {
        if let Some(code) = gap_answer(&shard, sequence, *expected, *got, *after_offset) {
            return gap_refusal(&shard, code, *expected, *got);
        }
    }
    let outcome = match appended {
        Ok(o) => o,
        Err(e) => {
            if matches!(e, kaas_storage::StorageError::Io { .. }) {
                // Once per interval: a full or failing disk fails every append.
                crate::ratelog::limited("append failed", |suppressed| {
                    tracing::error!(topic = %meta.name, partition, error = %e, suppressed,
                        "append failed; producers get KAFKA_STORAGE_ERROR and retry (check the \
                         data volume: free space, errors in the kernel log)");
                });
            }
            return refuse(errors::storage(&e));
        }
    };
    if let Some((key, epoch, first, last)) = sequence {
        shard.refused.borrow_mut().stored(key, epoch, first, last);
    }
    let base_offset = match outcome {
        AppendOutcome::Appended { base_offset, .. } => {
            shard.admission.disk.note_written(records.len() as u64);
            let traffic = shard.probe.topic(&shard.catalog, &meta.name);
            traffic
                .bytes_in
                .fetch_add(records.len() as u64, Ordering::Relaxed);
            let n: i64 = headers
                .iter()
                .map(|h| i64::from(h.record_count.max(0)))
                .sum();
            traffic
                .records_in
                .fetch_add(n.unsigned_abs(), Ordering::Relaxed);
            base_offset
        }
        AppendOutcome::Duplicate { base_offset, .. } => base_offset,
    };
    let result = PartResult {
        error_code: errors::NONE,
        base_offset,
        log_start_offset: log.log_start_offset(),
        log_append_time_ms: log_append_time_ms.unwrap_or(-1),
        ..PartResult::error(errors::NONE)
    };
    // The effect is done: the partition's next append may go ahead while this one is answered.
    drop(turn);
    let end_offset = outcome.end_offset();
    if acks == -1 {
        // Still on the owning shard: wait here for the sync that covers the write. The handle
        // is let go: whether the write may be acknowledged is judged by the log that serves
        // this generation then, or by what its close kept (`acknowledge_when_durable`).
        let generation = log.generation();
        drop(log);
        return acknowledge_when_durable(
            shard,
            meta,
            partition,
            result,
            end_offset,
            (generation, term),
        )
        .await;
    }
    may_acknowledge(&shard, &meta, partition, &log, result, end_offset, term).await
}

/// The retriable answer for a sequence gap this broker or the previous leader left by refusing
/// a batch unstored, or `None` for a gap the client made (see [`crate::refused`]). A refusal
/// only ever leaves a hole (`got` past `expected`); a batch that goes back before the stored
/// sequence gets Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER even just after a take-over, as does a
/// hole after a batch this broker stored since it took over (`after_offset`: where the
/// producer's last stored batch ends).
fn gap_answer(
    shard: &Shard,
    sequence: Option<(crate::refused::Key, i16, i32, i32)>,
    expected: i32,
    got: i32,
    after_offset: Option<i64>,
) -> Option<i16> {
    let (key, epoch, ..) = sequence?;
    if !sequence_skips_ahead(expected, got) {
        return None;
    }
    let ours =
        shard
            .refused
            .borrow()
            .explains(key, epoch, expected, got, std::time::Instant::now());
    ours.or_else(|| {
        shard
            .gap_may_predate_take_over(key.0, key.1, crate::refused::AFTER_TAKE_OVER, after_offset)
            .then_some(errors::NOT_LEADER_OR_FOLLOWER)
    })
}

/// Whether a batch starting at sequence `got` leaves a hole after `expected`, the sequence
/// the stored batches call for. Sequences wrap from `i32::MAX` to 0, as Kafka's do, so "ahead"
/// is the shorter way round.
fn sequence_skips_ahead(expected: i32, got: i32) -> bool {
    let ahead = i64::from(got) - i64::from(expected);
    let ahead = ahead.rem_euclid(1_i64 << 31);
    ahead != 0 && ahead < 1_i64 << 30
}

/// The answer for an idempotent batch whose sequence gap a refusal left ([`gap_answer`]'s
/// `code`): retriable, so that the client resends the refused batch first, instead of
/// OUT_OF_ORDER_SEQUENCE_NUMBER, after which librdkafka bumps its producer epoch and renumbers
/// (and may store twice) what it has in flight.
fn gap_refusal(shard: &Shard, code: i16, expected: i32, got: i32) -> PartResult {
    PartResult {
        error_message: Some(format!(
            "sequence {got} does not follow {}: a batch before it was refused unstored by \
             broker {} or by the partition's previous leader (leadership or free space \
             changed); resend from sequence {expected}",
            expected - 1,
            shard.config.broker_id
        )),
        ..PartResult::error(code)
    }
}

/// Runs on the owning shard: answers an acks=all write once the sync covering it completed.
async fn acknowledge_when_durable(
    shard: Rc<Shard>,
    meta: Arc<TopicMeta>,
    partition: i32,
    result: PartResult,
    end_offset: i64,
    (generation, term): (u64, u64),
) -> PartResult {
    let log = shard
        .open_partition(meta.id, partition)
        .filter(|l| l.generation() == generation);
    if let Some(log) = log {
        match log.wait_durable(end_offset).await {
            Ok(()) => {
                return may_acknowledge(&shard, &meta, partition, &log, result, end_offset, term)
                    .await
            }
            Err(e) if !log.is_closed() => {
                // Once per interval: a failed sync fails every acks=all request after it.
                crate::ratelog::limited("fsync failed", |suppressed| {
                    tracing::error!(topic = %meta.name, partition, error = %e, suppressed,
                        "fsync failed; acks=all produce not acknowledged");
                });
                return PartResult::error(errors::storage(&e));
            }
            // Closed while waiting: whether its close kept the write decides, below.
            Err(_) => {}
        }
    }
    // Relinquished since the append (and perhaps taken over again, with a new log).
    let kept = shard.kept_on_handover(generation, end_offset).await;
    let held = shard.cluster.fence_held_since(term);
    if kept && held {
        return result;
    }
    tracing::debug!(topic = %meta.name, partition, end_offset, kept, held, "not acknowledging a write: relinquished since, and its close did not keep it or the fence closed");
    fate_unknown(&shard, &meta.name, partition)
}

/// The answer for a write that was stored here but cannot be acknowledged, because it is not
/// provably kept: the next leader may have recovered it, or cut it. REQUEST_TIMED_OUT is the
/// code Kafka clients read as "possibly persisted" (Kafka answers it when an acks=all write
/// could not be confirmed in time): they retry under the same producer sequence, and the next
/// leader either returns the stored offset (idempotence) or appends the records once.
/// NOT_LEADER_OR_FOLLOWER would say "not persisted", and librdkafka may then renumber the
/// records after an epoch bump: the paused-controller fault run stored records twice that way
/// (3 values in 40 pauses), each one a write its deposed leader had stored before the pause and
/// refused after it.
fn fate_unknown(shard: &Shard, topic: &str, partition: i32) -> PartResult {
    PartResult {
        error_message: Some(format!(
            "broker {} stored this write to {topic}-{partition} but cannot confirm that the \
             partition's next leader keeps it (leadership moved while it was in flight): retry; \
             an idempotent producer's retry returns the stored offset if it was kept",
            shard.config.broker_id
        )),
        ..PartResult::error(errors::REQUEST_TIMED_OUT)
    }
}

/// The last check before a success goes out, after the write (and for acks=all its sync).
/// A write that passes it can no longer be cut by a take-over, so consumers may read it: the
/// high watermark moves to its end (see `PartitionLog::high_watermark`).
///
/// The fence must have stayed open since the write was checked (`term`): had it closed, the
/// controller may have handed the partition away by time, and a new leader may have recovered
/// the log without this write — even if a later acknowledgement of this broker's status
/// reopened the fence since. Then the answer is "fate unknown" ([`fate_unknown`]) and the
/// producer retries on the new leader (idempotence removes the copy if this one did land).
///
/// A partition relinquished while the write was in flight was handed over in order: its close
/// waited for the write, synced it and saved the state the next leader starts from, so the
/// write is kept and is acknowledged. Refusing it told librdkafka (NOT_LEADER_OR_FOLLOWER
/// means "not persisted" to it) that it could renumber the records after an epoch bump, and
/// they were stored twice (the controller-pause fault run, 11 records in 100 pauses).
async fn may_acknowledge(
    shard: &Shard,
    meta: &TopicMeta,
    partition: i32,
    log: &kaas_storage::PartitionLog,
    result: PartResult,
    end_offset: i64,
    term: u64,
) -> PartResult {
    if !shard.cluster.fence_held_since(term) {
        tracing::debug!(topic = %meta.name, partition, end_offset, "not acknowledging a write: the fence closed since it was checked");
        return fate_unknown(shard, &meta.name, partition);
    }
    if shard.serves(&meta.name, partition) && !log.is_closed() {
        log.advance_high_watermark(end_offset);
        return result;
    }
    if log.kept_by_close(end_offset).await && shard.cluster.fence_held_since(term) {
        return result;
    }
    tracing::debug!(topic = %meta.name, partition, end_offset, closed_end = ?log.closed_end(), "not acknowledging a write: relinquished, and the close did not keep it");
    fate_unknown(shard, &meta.name, partition)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sequence_past_the_expected_one_skips_ahead() {
        assert!(sequence_skips_ahead(3, 10));
        assert!(sequence_skips_ahead(3, 4));
        assert!(
            !sequence_skips_ahead(3, 3),
            "the expected sequence is no gap"
        );
        assert!(
            !sequence_skips_ahead(3, 1),
            "a rewind is not a hole a refusal left"
        );
        assert!(!sequence_skips_ahead(3, 0));
        // Sequences wrap from i32::MAX to 0.
        assert!(sequence_skips_ahead(i32::MAX - 1, 2));
        assert!(!sequence_skips_ahead(5, i32::MAX - 2));
        assert!(!sequence_skips_ahead(0, i32::MAX));
    }
}
