//! Broker configuration as the shards see it (built by the binary from flags/environment).

use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything a shard needs to know about the broker it is part of. Immutable after start.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub broker_id: i32,
    pub listen: SocketAddr,
    pub advertised_host: String,
    pub advertised_port: u16,
    pub data_dir: PathBuf,
    pub shards: usize,
    pub auto_create_topics: bool,
    pub num_partitions: i32,
    pub max_frame_bytes: usize,
    /// Bytes of io_uring buffer memory per shard (counts against RLIMIT_MEMLOCK).
    pub io_memory_bytes: usize,
    /// How often each shard applies retention to the partitions it owns.
    pub retention_check_interval_ms: u64,
    /// What a group-commit sync covers (`--sync-scope`): one partition's segment, or the data
    /// directory's whole filesystem, shared by every partition of the shard.
    pub sync_scope: kaas_storage::SyncScope,
    /// Connection and request-memory limits (see [`crate::admission`]).
    pub limits: crate::admission::Limits,
    /// A connection with no request for this long is closed (`connections.max.idle.ms`).
    pub connections_max_idle_ms: u64,
    /// A request body must keep arriving: each 64 KiB of it (or its rest) within this long,
    /// or the connection is closed.
    pub request_progress_timeout_ms: u64,
    /// Segment files each shard keeps open at most (`--max-open-log-files` split over the
    /// shards): past it, the least recently used idle partition logs are closed, and reopened
    /// on their next use (a closed log's saved index and producer state make that quick).
    pub open_log_files_per_shard: usize,
    /// Produce is refused while the data volume has less free space than this
    /// (`--min-free-bytes`; None: 5% of the volume, at most 1 GiB; see [`crate::disk`]).
    pub min_free_bytes: Option<u64>,
    /// The group coordinator's settings (`--group-*` flags).
    pub group: crate::groups::config::GroupConfig,
    /// Broker configs under Kafka's names given at start (`--broker-config KEY=VALUE`, like
    /// Kafka's server.properties): the topic defaults (`log.retention.ms`, ...) and connection
    /// limits beneath what kafka-configs sets at run time (see [`crate::catalog::Catalog`]).
    pub static_broker_configs: std::collections::BTreeMap<String, String>,
    /// At most this many per-partition series on `/metrics` (partition offsets and group
    /// committed offsets, `--metrics-partition-series-limit`); 0 publishes none.
    pub metrics_partition_series_limit: usize,
}

impl BrokerConfig {
    /// A configuration for tests: loopback, given data dir, two shards.
    pub fn for_tests(data_dir: PathBuf, listen: SocketAddr) -> Self {
        BrokerConfig {
            static_broker_configs: Default::default(),
            broker_id: 0,
            listen,
            advertised_host: listen.ip().to_string(),
            advertised_port: listen.port(),
            data_dir,
            shards: 2,
            auto_create_topics: true,
            num_partitions: 1,
            max_frame_bytes: kaas_wire::frame::DEFAULT_MAX_FRAME_BYTES,
            io_memory_bytes: 2 << 20,
            retention_check_interval_ms: 30_000,
            sync_scope: kaas_storage::SyncScope::default(),
            limits: crate::admission::Limits {
                request_bytes: 256 << 20,
                connections: 10_000,
                connections_per_ip: 10_000,
            },
            connections_max_idle_ms: 600_000,
            request_progress_timeout_ms: 30_000,
            open_log_files_per_shard: 10_000,
            min_free_bytes: Some(0),
            group: Default::default(),
            metrics_partition_series_limit: 10_000,
        }
    }
}
