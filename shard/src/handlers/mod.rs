//! Request handlers: one module per group of APIs, all returning typed responses that the
//! connection encodes. Work on partitions runs on the shard that owns each partition
//! ([`per_partition`]); everything else runs on the connection's shard.

mod admin;
mod configs;
mod describe;
mod elect;
mod error_counts;
mod features;
mod fetch;
pub(crate) mod groups;
mod log_dirs;
mod metadata;
mod offsets;
mod produce;
mod produced;
mod reassign;

use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use kaas_wire::codec::{encode_response, Request};
use kaas_wire::fetch_frame::{encode_fetch_response, ResponseFrame};
use kaas_wire::kafka_protocol::messages::{ApiVersionsResponse, RequestKind, ResponseKind};
use kaas_wire::versions;

/// The `authorized_operations` fields (Metadata, DescribeCluster, DescribeTopicPartitions,
/// DescribeGroups, ConsumerGroupDescribe). kaas has no authorizer, and Kafka without one grants
/// every operation a resource type supports, so that is what a client asking gets: bit `n` set
/// for AclOperation code `n` (READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8,
/// CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12), the sets of
/// Kafka 4.4's `AclEntry.supportedOperations` (a group's include its configs, which KIP-848
/// made alterable). Not asked for: i32::MIN, as Kafka encodes it.
pub(crate) mod authorized {
    const fn bits(ops: &[u8]) -> i32 {
        let mut v = 0;
        let mut i = 0;
        while i < ops.len() {
            v |= 1 << ops[i];
            i += 1;
        }
        v
    }
    pub const OMITTED: i32 = i32::MIN;
    pub const TOPIC: i32 = bits(&[3, 4, 5, 6, 7, 8, 10, 11]);
    pub const CLUSTER: i32 = bits(&[5, 7, 8, 9, 10, 11, 12]);
    pub const GROUP: i32 = bits(&[3, 6, 8, 10, 11]);

    /// `all` if the request asked for the operations, else [`OMITTED`].
    pub fn operations(asked: bool, all: i32) -> i32 {
        if asked {
            all
        } else {
            OMITTED
        }
    }
}

use std::cell::Cell;
use std::task::{Context, Poll, Waker};

use futures::future::LocalBoxFuture;

use crate::catalog::TopicMeta;
use crate::errors;
use crate::mesh::dispatch;
use crate::shard::Shard;

/// Held by a request while it is served; dropping it, when the handler returns, lets the
/// connection dispatch its next request (see `crate::conn`).
///
/// A Produce opens it in two steps: once its appends are queued in order on their owning
/// shards ([`EffectGate::release_order`]), the connection's next *Produce* may be dispatched —
/// its appends queue behind these (`crate::turns`); any other request still waits until the
/// Produce is answered, so that what it reads includes the appends.
pub struct EffectGate {
    state: Rc<GateState>,
}

/// What a request's handler and its connection share about the request's effects: one
/// allocation per request, on the shard both run on.
#[derive(Default)]
struct GateState {
    ordered: Cell<bool>,
    done: Cell<bool>,
    /// The connection's task, waiting for a step to open.
    waiting: Cell<Option<Waker>>,
}

/// The connection's side of an [`EffectGate`]: whether each step has opened.
#[derive(Clone)]
pub struct Effects {
    state: Rc<GateState>,
}

impl EffectGate {
    /// A gate and the connection's view of it.
    pub fn new() -> (EffectGate, Effects) {
        let state = Rc::new(GateState::default());
        (
            EffectGate {
                state: state.clone(),
            },
            Effects { state },
        )
    }

    /// The request's appends are queued in order on their owners: the connection may dispatch
    /// its next Produce now.
    pub fn release_order(&mut self) {
        if !self.state.ordered.replace(true) {
            self.state.wake();
        }
    }
}

impl Drop for EffectGate {
    /// The request is done (or abandoned): the connection may dispatch its next request,
    /// whatever it is.
    fn drop(&mut self) {
        self.state.ordered.set(true);
        self.state.done.set(true);
        self.state.wake();
    }
}

impl GateState {
    fn wake(&self) {
        if let Some(waker) = self.waiting.take() {
            waker.wake();
        }
    }

    fn poll_open(&self, step: &Cell<bool>, cx: &mut Context<'_>) -> Poll<()> {
        if step.get() {
            return Poll::Ready(());
        }
        self.waiting.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

impl Effects {
    /// Resolves once the request's effects are queued in order (or it is done).
    pub async fn ordered(&self) {
        std::future::poll_fn(|cx| self.state.poll_open(&self.state.ordered, cx)).await;
    }

    /// Resolves once the request is done.
    pub async fn done(&self) {
        std::future::poll_fn(|cx| self.state.poll_open(&self.state.done, cx)).await;
    }

    pub fn is_done(&self) -> bool {
        self.state.done.get()
    }
}

/// ApiVersions: every range we serve, unless a v5 client names another cluster or broker
/// than this one (KIP-1242: its metadata is stale, say after the addresses were reused).
/// Kafka 4.4 answers that with REBOOTSTRAP_REQUIRED and no API list, on which the Java client
/// fetches its metadata from the bootstrap servers again; a cluster id without a node id, or
/// the reverse, is INVALID_REQUEST.
fn api_versions(
    shard: &Shard,
    expected: Option<&kaas_wire::beyond::ExpectedBroker>,
    version: i16,
) -> ApiVersionsResponse {
    if let Some(e) = expected {
        let refused = match (&e.cluster_id, e.node_id) {
            (None, -1) => None,
            (None, _) | (Some(_), -1) => Some(errors::INVALID_REQUEST),
            (Some(cluster), node) => (cluster != shard.catalog.cluster_id()
                || node != shard.cluster.me())
            .then_some(errors::REBOOTSTRAP_REQUIRED),
        };
        if let Some(code) = refused {
            tracing::debug!(
                ?expected,
                code,
                "ApiVersions v5 names another cluster or broker"
            );
            return ApiVersionsResponse::default().with_error_code(code);
        }
    }
    versions::api_versions_response(errors::NONE, version)
}

/// What the connection does after a request.
pub enum Reply {
    Send(ResponseFrame),
    /// acks=0: no response is due.
    Silent,
    /// Nothing can be answered (a refused acks=0 write, a response that could not be
    /// encoded): the connection is closed, so the client notices at once instead of waiting
    /// for a response that never comes.
    Close,
}

/// Serves one request and encodes its response.
/// `gate` opens when this returns (a Produce lets a following Produce go earlier, see [`EffectGate`]).
/// `client_host` is the connection's peer as Kafka names it in group descriptions
/// (`/127.0.0.1`).
///
/// Every request runs as its own task (`conn::read_loop`), and spawning moves the task's future
/// several times before it first runs; a future is as large as the largest state it can be
/// in. With every handler inline that was 13.5 KB, for the group APIs' sake, and its copies
/// were 6% of a broker's CPU under a producer sending one batch per request (librdkafka's
/// sticky partitioner). So every handler but Produce's is awaited through a box: the task
/// holds a pointer to its state, allocated only when that API is asked for (a test keeps the
/// future within 4 KiB; it is 1.6 KB: Produce's state and the request).
#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
pub async fn handle(
    shard: &Rc<Shard>,
    request: Request,
    gate: EffectGate,
    client_host: &str,
) -> Reply {
    let version = request.version();
    let correlation_id = request.correlation_id();
    let api_key = request.api_key;
    let response = match request.body {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(api_versions(
            shard,
            request.expected_broker.as_ref(),
            version,
        )),
        RequestKind::Metadata(r) => {
            ResponseKind::Metadata(Box::pin(metadata::metadata(shard, r, version)).await)
        }
        RequestKind::DescribeCluster(r) => {
            ResponseKind::DescribeCluster(metadata::describe_cluster(shard, r))
        }
        RequestKind::DescribeTopicPartitions(r) => ResponseKind::DescribeTopicPartitions(
            Box::pin(metadata::describe_topic_partitions(shard, r)).await,
        ),
        RequestKind::Produce(r) => match produce::produce(shard, r, version, gate).await {
            produce::Answer::Respond(r) => ResponseKind::Produce(r),
            produce::Answer::Silent => return Reply::Silent,
            produce::Answer::Close => return Reply::Close,
        },
        RequestKind::Fetch(r) => {
            // Framed by hand so record bytes go to the socket without being copied.
            let out = Box::pin(fetch::fetch(shard, r, version)).await;
            error_counts::each_in_fetch(&out, |code| {
                shard.probe.count_response_error(api_key as i16, code);
            });
            return Reply::Send(encode_fetch_response(correlation_id, version, &out));
        }
        RequestKind::ListOffsets(r) => {
            ResponseKind::ListOffsets(Box::pin(offsets::list_offsets(shard, r, version)).await)
        }
        RequestKind::OffsetForLeaderEpoch(r) => ResponseKind::OffsetForLeaderEpoch(
            Box::pin(offsets::offset_for_leader_epoch(shard, r)).await,
        ),
        RequestKind::InitProducerId(r) => {
            ResponseKind::InitProducerId(offsets::init_producer_id(shard, r))
        }
        RequestKind::CreateTopics(r) => {
            ResponseKind::CreateTopics(Box::pin(admin::create_topics(shard, r, version)).await)
        }
        RequestKind::DeleteTopics(r) => {
            ResponseKind::DeleteTopics(Box::pin(admin::delete_topics(shard, r, version)).await)
        }
        RequestKind::CreatePartitions(r) => {
            ResponseKind::CreatePartitions(Box::pin(admin::create_partitions(shard, r)).await)
        }
        RequestKind::DeleteRecords(r) => {
            ResponseKind::DeleteRecords(Box::pin(admin::delete_records(shard, r)).await)
        }
        RequestKind::DescribeLogDirs(r) => {
            ResponseKind::DescribeLogDirs(Box::pin(log_dirs::describe_log_dirs(shard, r)).await)
        }
        RequestKind::DescribeProducers(r) => {
            ResponseKind::DescribeProducers(Box::pin(describe::describe_producers(shard, r)).await)
        }
        RequestKind::DescribeClientQuotas(r) => {
            ResponseKind::DescribeClientQuotas(describe::describe_client_quotas(r))
        }
        RequestKind::DescribeUserScramCredentials(r) => {
            ResponseKind::DescribeUserScramCredentials(describe::describe_user_scram_credentials(r))
        }
        RequestKind::ListTransactions(r) => {
            ResponseKind::ListTransactions(describe::list_transactions(r))
        }
        RequestKind::ElectLeaders(r) => ResponseKind::ElectLeaders(elect::elect_leaders(shard, r)),
        RequestKind::UpdateFeatures(r) => {
            ResponseKind::UpdateFeatures(features::update_features(&r, version))
        }
        RequestKind::ListPartitionReassignments(r) => ResponseKind::ListPartitionReassignments(
            reassign::list_partition_reassignments(shard, r),
        ),
        RequestKind::AlterPartitionReassignments(r) => ResponseKind::AlterPartitionReassignments(
            reassign::alter_partition_reassignments(shard, r),
        ),
        RequestKind::DescribeConfigs(r) => {
            ResponseKind::DescribeConfigs(Box::pin(configs::describe_configs(shard, r)).await)
        }
        RequestKind::AlterConfigs(r) => {
            ResponseKind::AlterConfigs(Box::pin(configs::alter_configs(shard, r)).await)
        }
        RequestKind::IncrementalAlterConfigs(r) => ResponseKind::IncrementalAlterConfigs(
            Box::pin(configs::incremental_alter_configs(shard, r)).await,
        ),
        RequestKind::FindCoordinator(r) => {
            ResponseKind::FindCoordinator(groups::find_coordinator(shard, r, version))
        }
        RequestKind::JoinGroup(r) => {
            let client_id = client_id_of(&request.header);
            let client = (client_id, client_host.to_string());
            ResponseKind::JoinGroup(Box::pin(groups::join_group(shard, r, version, client)).await)
        }
        RequestKind::SyncGroup(r) => {
            ResponseKind::SyncGroup(Box::pin(groups::sync_group(shard, r, version)).await)
        }
        RequestKind::Heartbeat(r) => {
            ResponseKind::Heartbeat(Box::pin(groups::heartbeat(shard, r)).await)
        }
        RequestKind::LeaveGroup(r) => {
            ResponseKind::LeaveGroup(Box::pin(groups::leave_group(shard, r, version)).await)
        }
        RequestKind::OffsetCommit(r) => {
            ResponseKind::OffsetCommit(Box::pin(groups::offset_commit(shard, r, version)).await)
        }
        RequestKind::OffsetFetch(r) => {
            ResponseKind::OffsetFetch(Box::pin(groups::offset_fetch(shard, r, version)).await)
        }
        RequestKind::OffsetDelete(r) => {
            ResponseKind::OffsetDelete(Box::pin(groups::offset_delete(shard, r)).await)
        }
        RequestKind::ListGroups(r) => {
            ResponseKind::ListGroups(Box::pin(groups::list_groups(shard, r, version)).await)
        }
        RequestKind::DescribeGroups(r) => {
            ResponseKind::DescribeGroups(Box::pin(groups::describe_groups(shard, r, version)).await)
        }
        RequestKind::DeleteGroups(r) => {
            ResponseKind::DeleteGroups(Box::pin(groups::delete_groups(shard, r)).await)
        }
        RequestKind::ConsumerGroupHeartbeat(r) => {
            let client_id = client_id_of(&request.header);
            ResponseKind::ConsumerGroupHeartbeat(
                Box::pin(groups::consumer_group_heartbeat(
                    shard,
                    r,
                    version,
                    (client_id, client_host.to_string()),
                ))
                .await,
            )
        }
        RequestKind::ConsumerGroupDescribe(r) => ResponseKind::ConsumerGroupDescribe(
            Box::pin(groups::consumer_group_describe(shard, r, version)).await,
        ),
        other => {
            // Unreachable while the decoder refuses unsupported APIs; kept as a safe answer.
            tracing::error!(api = ?api_key, "decoded a request with no handler: {other:?}");
            shard.probe.count_error(api_key as i16);
            return Reply::Close;
        }
    };
    error_counts::each(&response, |code| {
        shard.probe.count_response_error(api_key as i16, code);
    });
    match encode_response(correlation_id, api_key, version, &response) {
        Ok(bytes) => Reply::Send(ResponseFrame::single(bytes)),
        Err(e) => {
            tracing::error!(api = ?api_key, version, error = %e, "could not encode a response; closing the connection");
            shard.probe.count_error(api_key as i16);
            Reply::Close
        }
    }
}

/// Checks a client's `current_leader_epoch` against ours, as Kafka's `Partition` does: an
/// older epoch is FENCED_LEADER_EPOCH (the client refreshes its metadata and validates its
/// position), a newer one UNKNOWN_LEADER_EPOCH (this broker is behind), and -1 skips the check.
pub(crate) fn check_epoch(current: i32, ours: i32) -> Result<(), i16> {
    if current < 0 || current == ours {
        Ok(())
    } else if current < ours {
        Err(errors::FENCED_LEADER_EPOCH)
    } else {
        Err(errors::UNKNOWN_LEADER_EPOCH)
    }
}

/// The client id from a request header ("" when absent), for group members' descriptions.
fn client_id_of(header: &kaas_wire::kafka_protocol::messages::RequestHeader) -> String {
    header
        .client_id
        .as_ref()
        .map(|c| c.to_string())
        .unwrap_or_default()
}

/// Looks a topic up, creating it when auto-creation is on and the caller allows it.
/// Errors are Kafka codes for the caller's per-topic answer.
pub(crate) fn resolve_topic(
    shard: &Shard,
    name: &str,
    allow_create: bool,
) -> Result<Arc<TopicMeta>, i16> {
    if let Some(t) = shard.catalog.snapshot().get(name) {
        return Ok(t.clone());
    }
    if let Err(e) = crate::catalog::validate_topic_name(name) {
        // A name no topic can have, as Kafka answers it (not "unknown": a client that retries
        // UNKNOWN_TOPIC_OR_PARTITION would wait for a topic that can never exist).
        return Err(errors::catalog(&e));
    }
    if !(allow_create && shard.config.auto_create_topics) {
        return Err(errors::UNKNOWN_TOPIC_OR_PARTITION);
    }
    match shard
        .catalog
        .create_topic(name, shard.config.num_partitions, -1, Default::default())
    {
        Ok(t) => {
            tracing::info!(
                topic = name,
                partitions = t.partitions,
                "auto-created topic"
            );
            Ok(t)
        }
        Err(crate::catalog::CatalogError::TopicExists(_)) => shard
            .catalog
            .snapshot()
            .get(name)
            .cloned()
            .ok_or(errors::UNKNOWN_TOPIC_OR_PARTITION),
        Err(e) => Err(errors::catalog(&e)),
    }
}

/// The partition-addressed request pattern (ListOffsets, OffsetForLeaderEpoch,
/// DeleteRecords, ...): `topics` lists, per topic name, each partition's index and arguments.
/// Known partitions run `f` on their owning shard; unknown topics or partitions answer
/// `unknown` without a hop. Answers come back per topic, per partition, in request order.
pub(crate) async fn per_topic_partition<A, R, F, Fut>(
    shard: &Rc<Shard>,
    topics: Vec<(String, Vec<(i32, A)>)>,
    f: F,
    unknown: R,
    lost: R,
) -> Vec<Vec<R>>
where
    A: Send + 'static,
    R: Send + Clone + 'static,
    F: Fn(Rc<Shard>, Arc<TopicMeta>, i32, A) -> Fut + Send + Clone + 'static,
    Fut: Future<Output = R> + 'static,
{
    let snapshot = shard.catalog.snapshot();
    let mut answers: Vec<Vec<R>> = Vec::with_capacity(topics.len());
    let mut items = Vec::new();
    let mut slots = Vec::new();
    for (ti, (name, partitions)) in topics.into_iter().enumerate() {
        let meta = snapshot.get(&name).cloned();
        let mut row = Vec::with_capacity(partitions.len());
        for (pi, (partition, args)) in partitions.into_iter().enumerate() {
            if let Some(m) = meta
                .as_ref()
                .filter(|m| (0..m.partitions).contains(&partition))
            {
                slots.push((ti, pi));
                items.push((
                    shard.owner_of(&m.name, partition),
                    (m.clone(), partition, args),
                ));
            }
            row.push(unknown.clone());
        }
        answers.push(row);
    }
    let results = per_partition(shard, items, move |s, (m, p, a)| f(s, m, p, a), lost).await;
    for ((ti, pi), r) in slots.into_iter().zip(results) {
        answers[ti][pi] = r;
    }
    answers
}

/// How many items of one request run at once on one shard. Bounded so that a request over
/// thousands of partitions (a wide Fetch) opens their logs a few at a time and lets each go
/// idle after its read, instead of holding them all open at once past the open-file budget.
const CONCURRENT_ITEMS_PER_SHARD: usize = 64;

/// Runs `f` for every item on the shard that owns it: items for one shard go in one message,
/// and run there, up to [`CONCURRENT_ITEMS_PER_SHARD`] at a time. Results come back in input
/// order; an item whose shard is gone (shutting down) gets `lost`.
pub(crate) async fn per_partition<I, R, F, Fut>(
    shard: &Rc<Shard>,
    items: Vec<(usize, I)>,
    f: F,
    lost: R,
) -> Vec<R>
where
    I: Send + 'static,
    R: Send + Clone + 'static,
    F: Fn(Rc<Shard>, I) -> Fut + Send + Clone + 'static,
    Fut: Future<Output = R> + 'static,
{
    dispatch_per_partition(shard, items, f)
        .await
        .results(lost)
        .await
}

/// [`per_partition`]'s first half: returns once every owning shard has its items queued. `f`
/// is called for each item synchronously as its message reaches the owner (here, before this
/// returns), in item order, and after the items of every message this shard dispatched to
/// that owner before (`mesh::dispatch`); only the futures it returns run later.
pub(crate) async fn dispatch_per_partition<I, R, F, Fut>(
    shard: &Rc<Shard>,
    items: Vec<(usize, I)>,
    f: F,
) -> Dispatched<R>
where
    I: Send + 'static,
    R: Send + 'static,
    F: Fn(Rc<Shard>, I) -> Fut + Send + Clone + 'static,
    Fut: Future<Output = R> + 'static,
{
    let n = items.len();
    if n == 1 {
        // One partition, as every request of librdkafka's sticky partitioner carries: no
        // grouping, no per-item box and no stream to run one future (a dozen allocations per
        // request; bench/README.md, twenty-third session).
        // The item's future is boxed where it is made: a produce's is about 2.8 KB, and
        // returned through `dispatch` and wrapped again it was copied four times per request
        // (`memmove` under this function was 0.7% of a broker's samples at acks=all).
        let (target, item) = items.into_iter().next().expect("one item");
        let reply = dispatch(
            shard,
            target,
            move |s: Rc<Shard>| -> LocalBoxFuture<'static, R> { Box::pin(f(s, item)) },
        )
        .await;
        return Dispatched::One(reply);
    }
    let mut groups: Vec<Vec<(usize, I)>> = (0..shard.nshards).map(|_| Vec::new()).collect();
    for (i, (target, item)) in items.into_iter().enumerate() {
        groups[target].push((i, item));
    }
    let mut calls = Vec::new();
    // One owner at a time: each send completes before the next starts, so the order of this
    // shard's messages to each owner is the order of dispatch.
    for (target, group) in groups.into_iter().enumerate() {
        if group.is_empty() {
            continue;
        }
        let f = f.clone();
        let indices: Vec<usize> = group.iter().map(|(i, _)| *i).collect();
        let reply = dispatch(shard, target, move |s: Rc<Shard>| {
            // Each item's future is boxed on its own: a hundred of them side by side pass the
            // allocator's mmap threshold (main.rs), and a buffer that large was mapped, faulted
            // in page by page and unmapped for every request — about 5% of the broker's CPU in
            // a 100-partition produce (page faults under this collect, and the copies of the
            // futures into it and out of it again).
            let work: Vec<_> = group
                .into_iter()
                .map(|(i, item)| {
                    let fut = Box::pin(f(s.clone(), item));
                    async move { (i, fut.await) }
                })
                .collect();
            async move {
                use futures::StreamExt;
                futures::stream::iter(work)
                    .buffer_unordered(CONCURRENT_ITEMS_PER_SHARD)
                    .collect::<Vec<_>>()
                    .await
            }
        })
        .await;
        let results: ShardResults<R> = Box::pin(async move { reply?.get().await });
        calls.push((indices, results));
    }
    Dispatched::Many { n, calls }
}

/// One owner's results, by item index; `None` when that shard is gone.
type ShardResults<R> = LocalBoxFuture<'static, Option<Vec<(usize, R)>>>;

/// Items queued on their owning shards by [`dispatch_per_partition`], their results to come.
pub(crate) enum Dispatched<R> {
    /// A single item's result to come (`None` when its shard is gone).
    One(Option<crate::mesh::Reply<R, LocalBoxFuture<'static, R>>>),
    Many {
        n: usize,
        /// Per owner: the indices of its items, and their results.
        calls: Vec<(Vec<usize>, ShardResults<R>)>,
    },
}

impl<R: Clone> Dispatched<R> {
    /// Every item's result, in input order; `lost` for an item whose shard is gone.
    pub(crate) async fn results(self, lost: R) -> Vec<R> {
        let (n, calls) = match self {
            Dispatched::One(Some(reply)) => return vec![reply.get().await.unwrap_or(lost)],
            Dispatched::One(None) => return vec![lost],
            Dispatched::Many { n, calls } => (n, calls),
        };
        let calls = calls
            .into_iter()
            .map(|(indices, results)| async move { (indices, results.await) });
        let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
        for (indices, results) in futures::future::join_all(calls).await {
            match results {
                Some(rs) => {
                    for (i, r) in rs {
                        out[i] = Some(r);
                    }
                }
                None => {
                    for i in indices {
                        out[i] = Some(lost.clone());
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| lost.clone()))
            .collect()
    }
}

#[cfg(test)]
mod effect_gate_tests {
    use super::*;
    use futures::FutureExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Count(AtomicUsize);
    impl futures::task::ArcWake for Count {
        fn wake_by_ref(arc: &Arc<Self>) {
            arc.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    // A Produce opens the order step first (the connection may send the next Produce) and the
    // done step when it returns; the waiting connection is woken each time; a gate dropped
    // without releasing (an abandoned request) opens both.
    #[test]
    fn the_order_step_opens_before_the_done_step_and_a_dropped_gate_opens_both() {
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = futures::task::waker(woken.clone());
        let mut cx = Context::from_waker(&waker);

        let (mut gate, effects) = EffectGate::new();
        let mut ordered = std::pin::pin!(effects.ordered());
        assert!(ordered.as_mut().poll(&mut cx).is_pending());
        gate.release_order();
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(ordered.as_mut().poll(&mut cx).is_ready());
        let mut done = std::pin::pin!(effects.done());
        assert!(done.as_mut().poll(&mut cx).is_pending());
        assert!(!effects.is_done());
        drop(gate);
        assert_eq!(woken.0.load(Ordering::SeqCst), 2);
        assert!(done.as_mut().poll(&mut cx).is_ready());
        assert!(effects.is_done());

        let (gate, effects) = EffectGate::new();
        drop(gate);
        assert!(effects.ordered().now_or_never().is_some());
        assert!(effects.done().now_or_never().is_some());
    }
}

#[cfg(test)]
mod future_size_tests {
    use super::*;

    /// The most a [`handle`] future may take.
    const HANDLE_FUTURE_MAX_BYTES: usize = 4 * 1024;

    fn future_size<'a, Fut>(_: fn(&'a Rc<Shard>, Request, EffectGate, &'a str) -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// A handler awaited inline in `handle` makes every request's task as large as that
    /// handler's state, moved several times per request (see `handle`).
    #[test]
    fn a_request_task_does_not_carry_every_handler_state() {
        let size = future_size(handle);
        assert!(
            size <= HANDLE_FUTURE_MAX_BYTES,
            "handle's future is {size} bytes: await the handler that grew it through Box::pin"
        );
    }
}
