//! ListOffsets, OffsetForLeaderEpoch and InitProducerId.

use std::rc::Rc;
use std::sync::Arc;

use kaas_wire::kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kaas_wire::kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kaas_wire::kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ListOffsetsRequest, ListOffsetsResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, ProducerId,
};

use super::check_epoch;
use super::per_topic_partition;
use crate::catalog::TopicMeta;
use crate::errors;
use crate::shard::Shard;

/// ListOffsets special timestamps (Kafka's `ListOffsetsRequest`).
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;
/// The newest offset in tiered storage (v9, KIP-1005) and the oldest not yet uploaded to it
/// (v11, KIP-1023). kaas has no tiered storage: both answer offset -1, as Kafka does for a
/// topic without remote storage.
const LATEST_TIERED: i64 = -5;
const EARLIEST_PENDING_UPLOAD: i64 = -6;

/// The first ListOffsets version that may ask for a special timestamp; an older request asking
/// for it gets UNSUPPORTED_VERSION for that partition, as from Kafka's brokers.
fn first_version_of(timestamp: i64) -> i16 {
    match timestamp {
        MAX_TIMESTAMP => 7,
        EARLIEST_LOCAL => 8,
        LATEST_TIERED => 9,
        EARLIEST_PENDING_UPLOAD => 11,
        _ => 0,
    }
}

#[derive(Clone)]
struct OffsetAnswer {
    error_code: i16,
    timestamp: i64,
    offset: i64,
    leader_epoch: i32,
}

impl OffsetAnswer {
    fn error(code: i16) -> Self {
        OffsetAnswer {
            error_code: code,
            timestamp: -1,
            offset: -1,
            leader_epoch: -1,
        }
    }
}

pub async fn list_offsets(
    shard: &Rc<Shard>,
    req: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let wanted = req
        .topics
        .iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.partitions
                    .iter()
                    .map(|p| (p.partition_index, (p.timestamp, p.current_leader_epoch)))
                    .collect(),
            )
        })
        .collect();
    let asked = req.topics.iter().map(|t| t.name.as_str());
    super::metadata::catch_up(shard, asked).await;
    let answers = per_topic_partition(
        shard,
        wanted,
        move |s, m, p, (ts, epoch)| async move {
            if version < first_version_of(ts) {
                return OffsetAnswer::error(errors::UNSUPPORTED_VERSION);
            }
            lookup(s, m, p, ts, epoch).await
        },
        OffsetAnswer::error(errors::UNKNOWN_TOPIC_OR_PARTITION),
        OffsetAnswer::error(errors::NOT_LEADER_OR_FOLLOWER),
    )
    .await;
    let topics = req
        .topics
        .iter()
        .zip(answers)
        .map(|(t, ans)| {
            ListOffsetsTopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .zip(ans)
                        .map(|(p, a)| {
                            ListOffsetsPartitionResponse::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(a.error_code)
                                .with_timestamp(a.timestamp)
                                .with_offset(a.offset)
                                // The field exists from v4; an older client must not be sent one.
                                .with_leader_epoch(if version >= 4 { a.leader_epoch } else { -1 })
                        })
                        .collect(),
                )
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

async fn lookup(
    shard: Rc<Shard>,
    meta: Arc<TopicMeta>,
    partition: i32,
    timestamp: i64,
    current_epoch: i32,
) -> OffsetAnswer {
    shard.await_take_over(&meta.name, partition).await;
    let log = match shard.partition(&meta, partition).await {
        Ok(l) => l,
        Err(e) => return OffsetAnswer::error(errors::storage(&e)),
    };
    let epoch = log.leader_epoch().0;
    if let Err(code) = check_epoch(current_epoch, epoch) {
        return OffsetAnswer::error(code);
    }
    let at = |offset: i64| OffsetAnswer {
        error_code: errors::NONE,
        timestamp: -1,
        offset,
        leader_epoch: epoch,
    };
    match timestamp {
        LATEST => at(log.high_watermark()),
        EARLIEST | EARLIEST_LOCAL => at(log.log_start_offset()),
        MAX_TIMESTAMP => found(log.max_timestamp().await),
        LATEST_TIERED | EARLIEST_PENDING_UPLOAD => found(Ok(None)),
        ts if ts >= 0 => found(log.offset_for_timestamp(ts).await),
        _ => OffsetAnswer::error(errors::INVALID_REQUEST),
    }
}

/// A timestamp lookup's answer: the record found, offset -1 when none qualifies.
fn found(
    r: Result<Option<kaas_storage::TimestampLookup>, kaas_storage::StorageError>,
) -> OffsetAnswer {
    match r {
        Ok(Some(l)) => OffsetAnswer {
            error_code: errors::NONE,
            timestamp: l.timestamp,
            offset: l.offset,
            leader_epoch: l.leader_epoch,
        },
        Ok(None) => OffsetAnswer {
            error_code: errors::NONE,
            timestamp: -1,
            offset: -1,
            leader_epoch: -1,
        },
        Err(e) => OffsetAnswer::error(errors::storage(&e)),
    }
}

#[derive(Clone)]
struct EpochAnswer {
    error_code: i16,
    leader_epoch: i32,
    end_offset: i64,
}

impl EpochAnswer {
    fn error(code: i16) -> Self {
        EpochAnswer {
            error_code: code,
            leader_epoch: -1,
            end_offset: -1,
        }
    }
}

/// One partition's OffsetForLeaderEpoch answer, on the shard that owns it.
async fn epoch_answer(
    s: Rc<Shard>,
    m: Arc<TopicMeta>,
    p: i32,
    current: i32,
    wanted: i32,
) -> EpochAnswer {
    let log = match s.partition(&m, p).await {
        Ok(l) => l,
        Err(e) => return EpochAnswer::error(errors::storage(&e)),
    };
    if let Err(code) = check_epoch(current, log.leader_epoch().0) {
        return EpochAnswer::error(code);
    }
    let (leader_epoch, end_offset) = log.end_offset_for_epoch(wanted);
    tracing::debug!(
        shard = s.id,
        topic = %m.name,
        partition = p,
        current,
        wanted,
        our_epoch = log.leader_epoch().0,
        log_end_offset = log.log_end_offset(),
        generation = log.generation(),
        leader_epoch,
        end_offset,
        "OffsetForLeaderEpoch answered"
    );
    EpochAnswer {
        error_code: errors::NONE,
        leader_epoch,
        end_offset,
    }
}

pub async fn offset_for_leader_epoch(
    shard: &Rc<Shard>,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let wanted = req
        .topics
        .iter()
        .map(|t| {
            (
                t.topic.to_string(),
                t.partitions
                    .iter()
                    .map(|p| (p.partition, (p.current_leader_epoch, p.leader_epoch)))
                    .collect(),
            )
        })
        .collect();
    let unknown = EpochAnswer::error(errors::UNKNOWN_TOPIC_OR_PARTITION);
    let answers = per_topic_partition(
        shard,
        wanted,
        |s, m, p, (current, wanted)| epoch_answer(s, m, p, current, wanted),
        unknown,
        EpochAnswer::error(errors::NOT_LEADER_OR_FOLLOWER),
    )
    .await;
    let topics = req
        .topics
        .iter()
        .zip(answers)
        .map(|(t, ans)| {
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .zip(ans)
                        .map(|(p, a)| {
                            EpochEndOffset::default()
                                .with_partition(p.partition)
                                .with_error_code(a.error_code)
                                .with_leader_epoch(a.leader_epoch)
                                .with_end_offset(a.end_offset)
                        })
                        .collect(),
                )
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

/// Idempotent producers get a fresh id (or, when they present their current id and epoch, the
/// same id with the epoch bumped, KIP-360). Transactions are not served yet: a transactional id
/// gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which clients treat as fatal at once (they
/// retried UNSUPPORTED_VERSION until their timeout); FindCoordinator for a transaction says why.
pub fn init_producer_id(shard: &Rc<Shard>, req: InitProducerIdRequest) -> InitProducerIdResponse {
    if req.transactional_id.is_some() {
        return InitProducerIdResponse::default()
            .with_error_code(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    if req.producer_id.0 >= 0 && req.producer_epoch >= 0 && req.producer_epoch < i16::MAX - 1 {
        return InitProducerIdResponse::default()
            .with_producer_id(req.producer_id)
            .with_producer_epoch(req.producer_epoch + 1);
    }
    match shard.catalog.allocate_producer_id() {
        Ok(id) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(0),
        Err(e) => {
            tracing::error!(error = %e, "cannot allocate a producer id");
            InitProducerIdResponse::default()
                .with_error_code(errors::catalog(&e))
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
        }
    }
}
