//! Read-only admin APIs that tools and UIs call (kafka-transactions describe-producers and list,
//! kafka-configs --entity-type clients/users, kafka-reassign-partitions --list, AKHQ, Kafka-UI):
//! DescribeProducers from each partition's idempotent-producer state, and the empty answers of
//! what kaas has none of — client quotas, SCRAM credentials, transactions (none is ever
//! started: a transactional producer is refused at FindCoordinator), ongoing reassignments (a
//! leader move copies no data, so none is ever in progress).

use std::rc::Rc;
use std::sync::Arc;

use kaas_wire::kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kaas_wire::kafka_protocol::messages::describe_user_scram_credentials_response::DescribeUserScramCredentialsResult;
use kaas_wire::kafka_protocol::messages::{
    DescribeClientQuotasRequest, DescribeClientQuotasResponse, DescribeProducersRequest,
    DescribeProducersResponse, DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse, ListTransactionsRequest, ListTransactionsResponse,
    ProducerId,
};
use kaas_wire::kafka_protocol::protocol::StrBytes;

use super::per_topic_partition;
use crate::catalog::TopicMeta;
use crate::errors;
use crate::shard::Shard;

/// A partition's answer: an error code, or its producers.
type Producers = Result<Vec<kaas_storage::ActiveProducer>, i16>;

pub async fn describe_producers(
    shard: &Rc<Shard>,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let wanted: Vec<(String, Vec<(i32, ())>)> = req
        .topics
        .iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.partition_indexes.iter().map(|p| (*p, ())).collect(),
            )
        })
        .collect();
    let answers: Vec<Vec<Producers>> = per_topic_partition(
        shard,
        wanted,
        |s, m, p, ()| producers_of(s, m, p),
        Err(errors::UNKNOWN_TOPIC_OR_PARTITION),
        Err(errors::NOT_LEADER_OR_FOLLOWER),
    )
    .await;
    let topics = req
        .topics
        .iter()
        .zip(answers)
        .map(|(t, ans)| {
            let partitions = t
                .partition_indexes
                .iter()
                .zip(ans)
                .map(|(p, a)| {
                    let r = PartitionResponse::default().with_partition_index(*p);
                    match a {
                        Ok(ps) => r.with_active_producers(
                            ps.into_iter()
                                .map(|p| {
                                    // kaas serves no transactions: those fields are -1,
                                    // as Kafka reports them for a producer without.
                                    ProducerState::default()
                                        .with_producer_id(ProducerId(p.producer_id))
                                        .with_producer_epoch(i32::from(p.epoch))
                                        .with_last_sequence(p.last_sequence)
                                        .with_last_timestamp(p.last_timestamp)
                                        .with_coordinator_epoch(-1)
                                        .with_current_txn_start_offset(-1)
                                })
                                .collect(),
                        ),
                        Err(code) => r.with_error_code(code),
                    }
                })
                .collect();
            TopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}

/// On the owning shard: the producers the partition's log remembers.
async fn producers_of(shard: Rc<Shard>, meta: Arc<TopicMeta>, partition: i32) -> Producers {
    match shard.partition(&meta, partition).await {
        Ok(log) => Ok(log.active_producers()),
        Err(e) => Err(errors::storage(&e)),
    }
}

/// No quotas are configured (kaas enforces none): an empty list of entities.
pub fn describe_client_quotas(_req: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse {
    DescribeClientQuotasResponse::default().with_entries(Some(Vec::new()))
}

/// No SCRAM users exist (kaas serves no SASL): every user asked for is RESOURCE_NOT_FOUND, with
/// Kafka's message; asking for all gets an empty list.
pub fn describe_user_scram_credentials(
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let results = req
        .users
        .unwrap_or_default()
        .into_iter()
        .map(|u| {
            DescribeUserScramCredentialsResult::default()
                .with_user(u.name)
                .with_error_code(errors::RESOURCE_NOT_FOUND)
                .with_error_message(Some(StrBytes::from_static_str(
                    "Attempt to describe a user credential that does not exist",
                )))
        })
        .collect();
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

/// Transaction states a ListTransactions filter may name (Kafka's `TransactionState`); any other
/// filter is echoed back as unknown, as Kafka does.
const TRANSACTION_STATES: &[&str] = &[
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
];

/// No transaction exists (kaas serves none): an empty list, with Kafka's checks of the filters —
/// unknown state names are listed back, and a transactional-id pattern (v2) that is not a
/// regular expression is INVALID_REGULAR_EXPRESSION.
pub fn list_transactions(req: ListTransactionsRequest) -> ListTransactionsResponse {
    // Kafka reads the filters as a set: an unknown name repeated is listed back once.
    let mut unknown: Vec<StrBytes> = Vec::new();
    for s in req.state_filters {
        if !TRANSACTION_STATES.contains(&s.as_str()) && !unknown.contains(&s) {
            unknown.push(s);
        }
    }
    let resp = ListTransactionsResponse::default()
        .with_unknown_state_filters(unknown)
        .with_transaction_states(Vec::new());
    match req.transactional_id_pattern.as_deref() {
        Some(p) if !p.is_empty() && regex::Regex::new(p).is_err() => {
            resp.with_error_code(errors::INVALID_REGULAR_EXPRESSION)
        }
        _ => resp,
    }
}
