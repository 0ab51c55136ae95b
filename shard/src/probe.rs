//! Per-shard metrics and liveness. Each probe has one writer (its shard) and is read by the
//! control thread; everything is a relaxed atomic, so nothing on the hot path takes a lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use kaas_wire::kafka_protocol::messages::ApiKey;

/// Number of API keys we count (Kafka's keys are below this).
pub const API_KEYS: usize = 96;
/// Request versions counted per API (`0..API_VERSIONS`); every version kaas serves is below it.
pub const API_VERSIONS: usize = 20;
// Every version served gets a counter of its own (a newer one would be counted as the last).
const _: () = {
    let apis = kaas_wire::versions::SUPPORTED_APIS;
    let mut i = 0;
    while i < apis.len() {
        assert!((apis[i].2 as usize) < API_VERSIONS);
        i += 1;
    }
};

pub use kaas_storage::stats::{LatencyProbe, StorageStats, LATENCY_BUCKETS_US};

/// The phases of a request [`ShardProbe::request_phases`] times.
pub const PHASES: [&str; 3] = ["queue", "process", "send"];
/// Indexes into [`PHASES`].
pub const QUEUE: usize = 0;
pub const PROCESS: usize = 1;
pub const SEND: usize = 2;
/// Error-code slots per API in [`ShardProbe::response_errors`]: Kafka 4.4's codes end below.
pub const ERROR_CODES: usize = 160;

/// What one shard reports about itself.
pub struct ShardProbe {
    /// Advanced by the shard's own timer every 100 ms: the control thread calls a shard alive
    /// while this keeps moving.
    pub alive_ticks: AtomicU64,
    pub listener_bound: AtomicBool,
    pub stopped: AtomicBool,
    /// Requests by API and version (Kafka's RequestsPerSec has a version tag too): which
    /// protocol versions clients actually use. A row's sum is the API's request count.
    pub request_versions: Box<[[AtomicU64; API_VERSIONS]; API_KEYS]>,
    pub request_errors: [AtomicU64; API_KEYS],
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub partitions_open: AtomicU64,
    /// Segment files the open logs hold, and how many idle logs were closed to stay within
    /// the shard's budget (`--max-open-log-files`).
    pub log_files_open: AtomicU64,
    pub logs_evicted: AtomicU64,
    /// Every request's time by API and [`PHASES`] (Kafka's RequestMetrics): waiting behind
    /// the connection's previous request, being handled, then waiting for earlier responses
    /// and being written.
    pub request_phases: Box<[[LatencyProbe; PHASES.len()]; API_KEYS]>,
    /// Error codes in responses by API: `[api][code]` for codes `0..ERROR_CODES` (the last
    /// slot also counts any larger code), `UNKNOWN_SERVER_ERROR` (-1) at index 0, which NONE
    /// never takes.
    pub response_errors: Box<[[AtomicU64; ERROR_CODES]; API_KEYS]>,
    /// Bytes and records in, bytes out, by topic.
    pub topics: TopicTraffic,
    /// The log engine's syncs, rolls, retention and compaction on this shard (installed as
    /// the shard thread's `kaas_storage::stats`).
    pub storage: Arc<StorageStats>,
    /// The offsets of the partitions this shard leads and the groups it coordinates, as the
    /// shard last published them (once a second, see [`Published`]).
    pub published: Published,
}

/// One partition's offsets on the shard that leads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub topic: Arc<str>,
    /// The topic's id: offsets kept for a closed log must not outlive the topic they were
    /// read from (a topic deleted and created again under the same name starts at 0).
    pub topic_id: uuid::Uuid,
    pub partition: i32,
    pub log_start: i64,
    /// The high watermark: the end of what consumers can read, which lag is measured from.
    pub high_watermark: i64,
}

/// One consumer group on the shard that coordinates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSample {
    pub group: String,
    /// `classic` or `consumer` (KIP-848).
    pub group_type: &'static str,
    /// Kafka's state name (Stable, Empty, PreparingRebalance, ...).
    pub state: &'static str,
    pub members: u64,
    /// See `GroupKind::rebalances`.
    pub rebalances: u64,
    /// (topic, partition, committed offset).
    pub committed: Vec<(String, i32, i64)>,
}

/// What a shard publishes for the scrape that it cannot keep in counters: its partitions'
/// offsets and its groups. The shard rebuilds both once a second and swaps them in whole
/// (one allocation per second, not one per commit or append); the control thread reads
/// whatever was published last, so a series may lag its partition by up to a second.
#[derive(Default)]
pub struct Published {
    pub partitions: ArcSwap<Vec<PartitionOffsets>>,
    pub groups: ArcSwap<Vec<GroupSample>>,
    /// Series the shard left out of what it published, past `--metrics-partition-series-limit`.
    pub omitted: AtomicU64,
}

/// One topic's traffic through one shard (Kafka's BrokerTopicMetrics: BytesIn, MessagesIn,
/// BytesOut).
#[derive(Debug, Default)]
pub struct TopicCounters {
    /// Bytes of record batches appended (duplicates of an idempotent retry not counted).
    pub bytes_in: AtomicU64,
    /// Records appended.
    pub records_in: AtomicU64,
    /// Bytes of record batches sent in Fetch responses.
    pub bytes_out: AtomicU64,
}

/// Per-topic counters, lock-free on both sides: the shard is the only writer of its map (a new
/// topic swaps in a copy with it added, rare), the control thread reads a snapshot.
#[derive(Default)]
pub struct TopicTraffic {
    map: ArcSwap<HashMap<Arc<str>, Arc<TopicCounters>>>,
}

impl TopicTraffic {
    /// The counters of `topic`, added on its first use. Called only by the owning shard's
    /// thread. `live` says which topics still exist: adding one drops the counters of deleted
    /// topics, so topics created and deleted in a loop cannot grow the map.
    pub fn of(&self, topic: &str, live: impl Fn(&str) -> bool) -> Arc<TopicCounters> {
        let current = self.map.load();
        if let Some(c) = current.get(topic) {
            return c.clone();
        }
        let mut next: HashMap<Arc<str>, Arc<TopicCounters>> = current
            .iter()
            .filter(|(t, _)| live(t))
            .map(|(t, c)| (t.clone(), c.clone()))
            .collect();
        let counters = Arc::new(TopicCounters::default());
        next.insert(Arc::from(topic), counters.clone());
        self.map.store(Arc::new(next));
        counters
    }

    /// The counters as they stand, by topic.
    pub fn snapshot(&self) -> Arc<HashMap<Arc<str>, Arc<TopicCounters>>> {
        self.map.load_full()
    }
}

impl Default for ShardProbe {
    fn default() -> Self {
        ShardProbe {
            alive_ticks: AtomicU64::new(0),
            listener_bound: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            request_versions: Box::new(std::array::from_fn(|_| {
                std::array::from_fn(|_| AtomicU64::new(0))
            })),
            request_errors: std::array::from_fn(|_| AtomicU64::new(0)),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            partitions_open: AtomicU64::new(0),
            log_files_open: AtomicU64::new(0),
            logs_evicted: AtomicU64::new(0),
            request_phases: Box::new(std::array::from_fn(|_| Default::default())),
            response_errors: Box::new(std::array::from_fn(|_| {
                std::array::from_fn(|_| AtomicU64::new(0))
            })),
            topics: TopicTraffic::default(),
            storage: Arc::default(),
            published: Published::default(),
        }
    }
}

impl ShardProbe {
    /// `topic`'s counters on this shard (see [`TopicTraffic::of`]).
    pub fn topic(&self, catalog: &crate::catalog::Catalog, topic: &str) -> Arc<TopicCounters> {
        self.topics
            .of(topic, |t| catalog.snapshot().get(t).is_some())
    }

    pub fn count_request(&self, api_key: i16, version: i16) {
        let slot = usize::try_from(version).map_or(0, |v| v.min(API_VERSIONS - 1));
        if let Some(row) = self.request_versions.get(api_key as usize) {
            row[slot].fetch_add(1, Ordering::Relaxed);
        }
    }
    /// Counts one error code of a response to `api_key` (NONE is not an error).
    pub fn count_response_error(&self, api_key: i16, code: i16) {
        let slot = match code {
            0 => return,
            -1 => 0,
            c => usize::try_from(c).map_or(0, |c| c.min(ERROR_CODES - 1)),
        };
        if let Some(row) = self.response_errors.get(api_key as usize) {
            row[slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a request's `phase` (an index into [`PHASES`]) for `api_key`.
    pub fn record_phase(&self, api_key: i16, phase: usize, since: std::time::Instant) {
        if let Some(row) = self.request_phases.get(api_key as usize) {
            row[phase].record_since(since);
        }
    }

    pub fn count_error(&self, api_key: i16) {
        if let Some(c) = self.request_errors.get(api_key as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Kafka's name for an API key, for metric labels and logs.
pub fn api_name(key: i16) -> Option<&'static str> {
    let key = ApiKey::try_from(key).ok()?;
    Some(match key {
        ApiKey::Produce => "Produce",
        ApiKey::Fetch => "Fetch",
        ApiKey::ListOffsets => "ListOffsets",
        ApiKey::Metadata => "Metadata",
        ApiKey::ApiVersions => "ApiVersions",
        ApiKey::CreateTopics => "CreateTopics",
        ApiKey::DeleteTopics => "DeleteTopics",
        ApiKey::InitProducerId => "InitProducerId",
        ApiKey::DescribeConfigs => "DescribeConfigs",
        ApiKey::AlterConfigs => "AlterConfigs",
        ApiKey::CreatePartitions => "CreatePartitions",
        ApiKey::DeleteRecords => "DeleteRecords",
        ApiKey::OffsetForLeaderEpoch => "OffsetForLeaderEpoch",
        ApiKey::IncrementalAlterConfigs => "IncrementalAlterConfigs",
        ApiKey::DescribeCluster => "DescribeCluster",
        ApiKey::DescribeTopicPartitions => "DescribeTopicPartitions",
        ApiKey::FindCoordinator => "FindCoordinator",
        ApiKey::JoinGroup => "JoinGroup",
        ApiKey::SyncGroup => "SyncGroup",
        ApiKey::Heartbeat => "Heartbeat",
        ApiKey::LeaveGroup => "LeaveGroup",
        ApiKey::OffsetCommit => "OffsetCommit",
        ApiKey::OffsetFetch => "OffsetFetch",
        ApiKey::ListGroups => "ListGroups",
        ApiKey::DescribeGroups => "DescribeGroups",
        ApiKey::DeleteGroups => "DeleteGroups",
        ApiKey::OffsetDelete => "OffsetDelete",
        ApiKey::ConsumerGroupHeartbeat => "ConsumerGroupHeartbeat",
        ApiKey::ConsumerGroupDescribe => "ConsumerGroupDescribe",
        ApiKey::DescribeLogDirs => "DescribeLogDirs",
        ApiKey::DescribeProducers => "DescribeProducers",
        ApiKey::DescribeClientQuotas => "DescribeClientQuotas",
        ApiKey::DescribeUserScramCredentials => "DescribeUserScramCredentials",
        ApiKey::ListTransactions => "ListTransactions",
        ApiKey::ListPartitionReassignments => "ListPartitionReassignments",
        ApiKey::AlterPartitionReassignments => "AlterPartitionReassignments",
        ApiKey::ElectLeaders => "ElectLeaders",
        ApiKey::UpdateFeatures => "UpdateFeatures",
        _ => "Other",
    })
}
