//! The metric families `/metrics` serves, built from the shards' probes at each scrape.

use super::HealthView;
use kaas_shard::probe::{
    api_name, LatencyProbe, ShardProbe, StorageStats, API_KEYS, API_VERSIONS, LATENCY_BUCKETS_US,
    PROCESS,
};
use kaas_wire::kafka_protocol::messages::ApiKey;
use kaas_wire::versions::SUPPORTED_APIS;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

// The metric families, rebuilt from the shards' atomics at every scrape (a few dozen small
// allocations, on the control thread). prometheus-client names a counter family without its
// `_total` and a family with a unit without the unit's suffix; the encodings add them, so the
// samples read `kaas_requests_total`, `kaas_data_dir_free_bytes`, `kaas_produce_latency_seconds_*`.
// Every family is present from the start, at zero rather than absent.

/// A request's API: Kafka's name and key.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiLabels {
    api: &'static str,
    api_key: i16,
}

/// A request's API and version.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiVersionLabels {
    api: &'static str,
    version: i16,
}

/// A request error's API, by Kafka's name only.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiNameLabels {
    api: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabels {
    topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabels {
    shard: usize,
}

pub(super) fn api_label(key: usize) -> &'static str {
    i16::try_from(key)
        .ok()
        .and_then(api_name)
        .unwrap_or("Other")
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    registry.register(name, help, ConstCounter::new(value));
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    registry.register(name, help, ConstGauge::new(value));
}

fn bytes_gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    registry.register_with_unit(name, help, Unit::Bytes, ConstGauge::new(value));
}

impl HealthView {
    /// Every family, built afresh from the probes.
    pub(super) fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register(
            "kaas_build",
            "The broker's version, as a label of a series that is always 1",
            Info::new([("version", env!("CARGO_PKG_VERSION"))]),
        );
        self.register_requests(&mut registry);
        self.register_request_detail(&mut registry);
        self.register_traffic(&mut registry);
        self.register_topics(&mut registry);
        self.register_admission(&mut registry);
        self.register_shards(&mut registry);
        self.register_storage(&mut registry);
        self.register_offsets(&mut registry);
        self.register_cluster(&mut registry);
        register_process(&mut registry, self.started);
        registry
    }

    /// `f` summed over the shards.
    pub(super) fn sum(&self, f: impl Fn(&ShardProbe) -> &AtomicU64) -> u64 {
        self.probes
            .iter()
            .map(|p| f(p).load(Ordering::Relaxed))
            .sum()
    }

    /// Requests and request errors by API. Every API the broker serves has its series from the
    /// start; one it does not serve appears once a client has sent it.
    fn register_requests(&self, registry: &mut Registry) {
        let requests = Family::<ApiLabels, Counter>::default();
        let errors = Family::<ApiNameLabels, Counter>::default();
        let mut errors_total = 0;
        for key in 0..API_KEYS {
            let served = SUPPORTED_APIS.iter().any(|(k, _, _)| *k as usize == key);
            let api = api_label(key);
            let n: u64 = (0..API_VERSIONS)
                .map(|v| self.sum(|p| &p.request_versions[key][v]))
                .sum();
            if served || n > 0 {
                let labels = ApiLabels {
                    api,
                    api_key: key as i16,
                };
                requests.get_or_create(&labels).inc_by(n);
            }
            let n = self.sum(|p| &p.request_errors[key]);
            if served || n > 0 {
                errors.get_or_create(&ApiNameLabels { api }).inc_by(n);
            }
            errors_total += n;
        }
        registry.register("kaas_requests", "Kafka requests received, by API", requests);
        // By version only where a client sent that version: every (API, version) pair from
        // the start would be some 400 series of zeros.
        let versions = Family::<ApiVersionLabels, Counter>::default();
        for key in 0..API_KEYS {
            for version in 0..API_VERSIONS {
                let n = self.sum(|p| &p.request_versions[key][version]);
                if n > 0 {
                    versions
                        .get_or_create(&ApiVersionLabels {
                            api: api_label(key),
                            version: version as i16,
                        })
                        .inc_by(n);
                }
            }
        }
        registry.register(
            "kaas_request_versions",
            "Kafka requests received, by API and protocol version (a series appears once a client has sent that version)",
            versions,
        );
        registry.register(
            "kaas_request_errors",
            "Requests that could not be answered, by API",
            errors,
        );
        counter(
            registry,
            "kaas_errors",
            "Requests that failed inside the broker",
            errors_total,
        );
    }

    /// Bytes, connections and partition logs, summed over the shards.
    fn register_traffic(&self, registry: &mut Registry) {
        let counters = [
            (
                "kaas_logs_evicted",
                "Idle partition logs closed to stay within the open-file budget (reopened on use)",
                self.sum(|p| &p.logs_evicted),
            ),
            (
                "kaas_bytes_in",
                "Bytes of Kafka requests received",
                self.sum(|p| &p.bytes_in),
            ),
            (
                "kaas_bytes_out",
                "Bytes of Kafka responses sent",
                self.sum(|p| &p.bytes_out),
            ),
            (
                "kaas_protocol_errors",
                "Connections closed for malformed, oversized or unsupported requests",
                self.sum(|p| &p.protocol_errors),
            ),
            (
                "kaas_connections",
                "Connections accepted",
                self.sum(|p| &p.connections_total),
            ),
        ];
        for (name, help, value) in counters {
            counter(registry, name, help, value);
        }
        let gauges = [
            (
                "kaas_connections_open",
                "Open client connections",
                self.sum(|p| &p.connections_open),
            ),
            (
                "kaas_partitions_open",
                "Partition logs open on the shards",
                self.sum(|p| &p.partitions_open),
            ),
            (
                "kaas_log_files_open",
                "Segment files the open partition logs hold (within --max-open-log-files)",
                self.sum(|p| &p.log_files_open),
            ),
        ];
        for (name, help, value) in gauges {
            gauge(registry, name, help, value);
        }
        let a = &self.admission;
        let closed = Family::<ReasonLabels, Counter>::default();
        for (reason, n) in [
            ("idle", &a.closed_idle),
            ("request_stalled", &a.closed_slow),
            ("max_connections_per_ip", &a.refused_per_ip),
        ] {
            closed
                .get_or_create(&ReasonLabels { reason })
                .inc_by(n.load(Ordering::Relaxed));
        }
        registry.register(
            "kaas_connections_closed",
            "Connections the broker closed or refused, by reason",
            closed,
        );
    }

    /// The data volume, file descriptors, request memory and admission refusals.
    fn register_admission(&self, registry: &mut Registry) {
        let a = &self.admission;
        let disk = &a.disk;
        let (open_fds, fd_limit) = fd_usage();
        let bytes = [
            (
                "kaas_data_dir_free",
                "Free bytes of the data directory's volume (as an unprivileged writer sees them)",
                disk.free(),
            ),
            (
                "kaas_data_dir_size",
                "Size of the data directory's volume",
                disk.total(),
            ),
            (
                "kaas_min_free",
                "--min-free-bytes: below it, produce is refused with KAFKA_STORAGE_ERROR",
                disk.min_free(),
            ),
            (
                "kaas_request_memory",
                "Bytes of request bodies reserved now (broker-wide)",
                a.reserved() as u64,
            ),
            (
                "kaas_request_memory_limit",
                "--queued-max-request-bytes",
                a.limits().request_bytes as u64,
            ),
        ];
        for (name, help, value) in bytes {
            bytes_gauge(registry, name, help, value);
        }
        gauge(
            registry,
            "kaas_open_fds",
            "File descriptors the broker has open (connections, partition logs, io_uring, ...)",
            open_fds,
        );
        gauge(
            registry,
            "kaas_fd_limit",
            "The broker's open-file limit (raised to the hard limit at start)",
            fd_limit,
        );
        let counters = [
            (
                "kaas_produce_refused_disk_full",
                "Partitions of produce requests refused because the data volume was below \
                 --min-free-bytes",
                &disk.refused,
            ),
            (
                "kaas_heartbeat_refused",
                "Heartbeat streams and messages refused for a missing or bad signature \
                 (cluster mode)",
                &kaas_control::heartbeat::auth::REFUSED,
            ),
            (
                "kaas_request_memory_waits",
                "Times a connection stopped reading because the request memory budget was \
                 used up",
                &a.memory_waits,
            ),
            (
                "kaas_accept_paused",
                "Times accepting paused because --max-connections were open",
                &a.accept_paused,
            ),
        ];
        for (name, help, value) in counters {
            counter(registry, name, help, value.load(Ordering::Relaxed));
        }
    }

    /// Shard liveness and the produce and fetch latency histograms.
    fn register_shards(&self, registry: &mut Registry) {
        let alive = Family::<ShardLabels, Gauge>::default();
        for (shard, a) in self.shards_alive().into_iter().enumerate() {
            alive
                .get_or_create(&ShardLabels { shard })
                .set(i64::from(a));
        }
        registry.register(
            "kaas_shard_alive",
            "1 while the shard's executor is making progress",
            alive,
        );
        // The process phase of `kaas_request_duration_seconds`, under the names dashboards
        // and alerts used before the phases existed.
        let process = |api: ApiKey| {
            LatencyHistogram::read(
                self.probes
                    .iter()
                    .map(move |p| &p.request_phases[api as usize][PROCESS]),
            )
        };
        registry.register_with_unit(
            "kaas_produce_latency",
            "Produce request latency, receipt to response (acks=all includes the fsync)",
            Unit::Seconds,
            process(ApiKey::Produce),
        );
        registry.register_with_unit(
            "kaas_fetch_latency",
            "Fetch request latency, including long-poll waiting",
            Unit::Seconds,
            process(ApiKey::Fetch),
        );
    }

    /// The log engine: group-commit syncs, segment rolls, retention and compaction.
    fn register_storage(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "kaas_log_sync_duration",
            "Group-commit sync latency: one fdatasync (--sync-scope file) or one syncfs shared \
             by a shard's partitions (filesystem)",
            Unit::Seconds,
            LatencyHistogram::read(self.probes.iter().map(|p| &p.storage.sync_latency)),
        );
        for (name, help, unit, field) in STORAGE_COUNTERS {
            let total = self.probes.iter().map(|p| p.storage.get(field)).sum();
            match unit {
                Some(unit) => {
                    registry.register_with_unit(name, help, unit, ConstCounter::new(total))
                }
                None => counter(registry, name, help, total),
            }
        }
    }
}

/// The log engine's counters: (family, help, unit, the `StorageStats` field summed over the
/// shards).
type StorageCounter = (
    &'static str,
    &'static str,
    Option<Unit>,
    fn(&StorageStats) -> &AtomicU64,
);
const STORAGE_COUNTERS: [StorageCounter; 8] = [
    ("kaas_log_syncs", "Group-commit syncs run", None, |s| {
        &s.syncs
    }),
    (
        "kaas_log_sync_errors",
        "Group-commit syncs that failed (their acks=all writes were refused)",
        None,
        |s| &s.sync_errors,
    ),
    (
        "kaas_log_synced",
        "Bytes of record batches made durable by group-commit syncs (divide by \
         kaas_log_syncs_total for the bytes one sync carries)",
        Some(Unit::Bytes),
        |s| &s.synced_bytes,
    ),
    (
        "kaas_log_segment_rolls",
        "Active segments sealed and replaced (size, age or a new leader epoch)",
        None,
        |s| &s.segment_rolls,
    ),
    (
        "kaas_log_retention_deleted_segments",
        "Segments deleted by retention (retention.ms, retention.bytes, or below a \
         DeleteRecords start)",
        None,
        |s| &s.retention_segments_deleted,
    ),
    (
        "kaas_log_retention_reclaimed",
        "Bytes freed by retention",
        Some(Unit::Bytes),
        |s| &s.retention_bytes_reclaimed,
    ),
    (
        "kaas_log_compactions",
        "Compaction passes that rewrote at least one segment",
        None,
        |s| &s.compactions,
    ),
    (
        "kaas_log_compaction_reclaimed",
        "Bytes freed by compaction",
        Some(Unit::Bytes),
        |s| &s.compaction_bytes_reclaimed,
    ),
];

/// The cluster's control state as this broker sees it: what `/healthz` says under `cluster`,
/// as series an alert can watch. A single node reports itself as the one live broker and the
/// controller, its fence always open, so the same alerts hold for both modes.
struct ControlState {
    controller_active: bool,
    controller_id: i64,
    lease_epoch: u64,
    assignment_version: u64,
    partitions_led: u64,
    pending: u64,
    /// Partitions of the catalog the accepted assignment gives no leader (in handover, or
    /// created since): Kafka's OfflinePartitionsCount, here from every broker's view.
    offline: u64,
    fence_open: bool,
    draining: bool,
    /// Brokers by state: alive, draining, dead.
    brokers: [u64; 3],
}

impl HealthView {
    fn control_state(&self) -> ControlState {
        let snapshot = self.catalog.snapshot();
        let partitions: u64 = snapshot
            .topics
            .values()
            .map(|t| u64::try_from(t.partitions).unwrap_or(0))
            .sum();
        let Some(c) = self.cluster.get() else {
            return ControlState {
                controller_active: true,
                controller_id: i64::from(self.config.broker_id),
                lease_epoch: 0,
                assignment_version: 0,
                partitions_led: partitions,
                pending: 0,
                offline: 0,
                fence_open: true,
                draining: false,
                brokers: [1, 0, 0],
            };
        };
        let assignment = c.assignment.borrow().clone();
        let leadership = c.leadership.borrow().clone();
        let led_in_file = assignment.as_ref().map_or(0, |a| {
            a.partitions
                .keys()
                .filter(|tp| {
                    snapshot
                        .get(&tp.topic)
                        .is_some_and(|t| (0..t.partitions).contains(&tp.partition))
                })
                .count() as u64
        });
        let mut brokers = [0u64; 3];
        for b in assignment.iter().flat_map(|a| &a.brokers) {
            brokers[match b.health {
                kaas_control::assignment::Health::Alive => 0,
                kaas_control::assignment::Health::Draining => 1,
                kaas_control::assignment::Health::Dead => 2,
            }] += 1;
        }
        ControlState {
            controller_active: leadership.leads_now(),
            controller_id: i64::from(c.view.controller()),
            lease_epoch: leadership.epoch,
            assignment_version: assignment.as_ref().map_or(0, |a| a.assignment_version),
            partitions_led: c.status.borrow().partitions.len() as u64,
            pending: assignment.as_ref().map_or(0, |a| a.pending.len() as u64),
            offline: partitions.saturating_sub(led_in_file),
            fence_open: c.view.may_acknowledge(),
            draining: c.view.draining(),
            brokers,
        }
    }

    /// Bytes and records in and bytes out by topic, summed over the shards: every topic of
    /// the catalog has its series, at zero until it has traffic through this broker.
    fn register_topics(&self, registry: &mut Registry) {
        let snapshot = self.catalog.snapshot();
        let mut sums: std::collections::BTreeMap<&str, [u64; 3]> = snapshot
            .topics
            .keys()
            .map(|t| (t.as_str(), [0; 3]))
            .collect();
        let shards: Vec<_> = self.probes.iter().map(|p| p.topics.snapshot()).collect();
        for map in &shards {
            for (topic, c) in map.iter() {
                if let Some(sum) = sums.get_mut(&**topic) {
                    sum[0] += c.bytes_in.load(Ordering::Relaxed);
                    sum[1] += c.records_in.load(Ordering::Relaxed);
                    sum[2] += c.bytes_out.load(Ordering::Relaxed);
                }
            }
        }
        let families: [_; 3] = std::array::from_fn(|_| Family::<TopicLabels, Counter>::default());
        for (topic, sum) in sums {
            for (family, n) in families.iter().zip(sum) {
                family
                    .get_or_create(&TopicLabels {
                        topic: topic.to_string(),
                    })
                    .inc_by(n);
            }
        }
        let [bytes_in, records_in, bytes_out] = families;
        registry.register(
            "kaas_topic_bytes_in",
            "Bytes of record batches appended, by topic (Kafka's BytesInPerSec)",
            bytes_in,
        );
        registry.register(
            "kaas_topic_records_in",
            "Records appended, by topic (Kafka's MessagesInPerSec)",
            records_in,
        );
        registry.register(
            "kaas_topic_bytes_out",
            "Bytes of record batches sent to consumers, by topic (Kafka's BytesOutPerSec)",
            bytes_out,
        );
    }

    /// The control state's families (see [`ControlState`]).
    fn register_cluster(&self, registry: &mut Registry) {
        let s = self.control_state();
        let gauges = [
            (
                "kaas_controller_active",
                "1 on the broker that is the controller now (Kafka's ActiveControllerCount: \
                 summed over the brokers it must be 1)",
                u64::from(s.controller_active),
            ),
            (
                "kaas_lease_epoch",
                "The controller Lease's epoch as this broker last read it (0 on a single node)",
                s.lease_epoch,
            ),
            (
                "kaas_assignment_version",
                "Version of the accepted assignment.json (0 on a single node)",
                s.assignment_version,
            ),
            (
                "kaas_partitions_led",
                "Partitions this broker leads and serves",
                s.partitions_led,
            ),
            (
                "kaas_partitions_pending_handover",
                "Partitions between leaders in the accepted assignment, led by no broker meanwhile",
                s.pending,
            ),
            (
                "kaas_partitions_offline",
                "Partitions with no leader in the accepted assignment (Kafka's \
                 OfflinePartitionsCount): in handover, or created and not yet placed",
                s.offline,
            ),
            (
                "kaas_write_fence_open",
                "1 while this broker may acknowledge writes (its controller acknowledged its \
                 heartbeat within the fence); 0: produce is answered NOT_LEADER_OR_FOLLOWER",
                u64::from(s.fence_open),
            ),
            (
                "kaas_draining",
                "1 once this broker received SIGTERM and is handing its partitions away",
                u64::from(s.draining),
            ),
        ];
        for (name, help, value) in gauges {
            gauge(registry, name, help, value);
        }
        registry.register(
            "kaas_controller_id",
            "The controller's broker id as this broker sees it (-1: not known yet)",
            ConstGauge::new(s.controller_id),
        );
        let brokers = Family::<StateLabels, Gauge>::default();
        for (state, n) in ["alive", "draining", "dead"].into_iter().zip(s.brokers) {
            brokers
                .get_or_create(&StateLabels { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        registry.register(
            "kaas_brokers",
            "Brokers of the accepted assignment by state (a single node counts itself alive)",
            brokers,
        );
    }
}

/// The standard process families (`process_*`, as every Prometheus client library exports
/// them): CPU time, resident memory, start time, from /proc/self.
fn register_process(registry: &mut Registry, started: Instant) {
    let (cpu_seconds, rss_bytes) = proc_self_stat().unwrap_or((0.0, 0));
    registry.register_with_unit(
        "process_cpu",
        "Total user and system CPU time spent",
        Unit::Seconds,
        ConstCounter::new(cpu_seconds),
    );
    registry.register_with_unit(
        "process_resident_memory",
        "Resident memory size",
        Unit::Bytes,
        ConstGauge::new(i64::try_from(rss_bytes).unwrap_or(i64::MAX)),
    );
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_sub(started.elapsed());
    registry.register_with_unit(
        "process_start_time",
        "Start time of the process since the Unix epoch",
        Unit::Seconds,
        ConstGauge::new(start.as_secs_f64()),
    );
}

/// (CPU seconds, resident bytes) from /proc/self/stat: utime and stime in clock ticks (fields
/// 14 and 15), rss in pages (field 24). The fields after the command name, which may hold
/// spaces and parentheses, are counted from its last `)`.
fn proc_self_stat() -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // fields[0] is field 3 (state)
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let rss_pages: u64 = fields.get(21)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions; it only reads configuration values.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    let page = u64::try_from(page).unwrap_or(4096);
    Some(((utime + stime) as f64 / ticks, rss_pages * page))
}

/// A latency histogram summed over the shards' probes as read at one scrape. Its count is the
/// sum of its buckets (not the probes' own count, read at another instant), so the `+Inf`
/// bucket and `_count` always agree.
#[derive(Debug)]
pub(super) struct LatencyHistogram {
    sum_seconds: f64,
    pub(super) count: u64,
    /// (upper bound in seconds, observations in this bucket alone), ending with `+Inf`.
    buckets: Vec<(f64, u64)>,
}

impl LatencyHistogram {
    pub(super) fn read<'a>(probes: impl Iterator<Item = &'a LatencyProbe>) -> Self {
        let mut counts = [0u64; LATENCY_BUCKETS_US.len() + 1];
        let mut sum_us = 0u64;
        for p in probes {
            let (buckets, s, _) = p.read();
            for (acc, x) in counts.iter_mut().zip(buckets) {
                *acc += x;
            }
            sum_us += s;
        }
        let bounds = LATENCY_BUCKETS_US
            .iter()
            .map(|us| *us as f64 / 1e6)
            .chain([f64::INFINITY]);
        LatencyHistogram {
            sum_seconds: sum_us as f64 / 1e6,
            count: counts.iter().sum(),
            buckets: bounds.zip(counts).collect(),
        }
    }
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum_seconds, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// (open file descriptors, the soft open-file limit) of this process.
pub(super) fn fd_usage() -> (u64, u64) {
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass and nothing else.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        0
    };
    (open, limit)
}
