//! The broker's health, readiness and metrics, read from the shards' probes (atomics) on the
//! control thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kaas_control::health::HealthSource;
use kaas_shard::catalog::Catalog;
use kaas_shard::config::BrokerConfig;
use kaas_shard::probe::{api_name, LatencyProbe, ShardProbe, API_KEYS, LATENCY_BUCKETS_US};
use kaas_wire::versions::SUPPORTED_APIS;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

/// A shard whose tick has not moved for this long is reported dead.
const SHARD_STALL: Duration = Duration::from_secs(2);

/// What cluster mode adds to the health view (set once cluster mode has started).
pub struct ClusterHealth {
    pub view: Arc<kaas_shard::cluster::ClusterView>,
    pub status: tokio::sync::watch::Receiver<kaas_control::heartbeat::LocalStatus>,
    pub assignment: tokio::sync::watch::Receiver<Option<Arc<kaas_control::assignment::Assignment>>>,
    pub leadership: tokio::sync::watch::Receiver<kaas_control::lease::Leadership>,
}

pub struct HealthView {
    /// Cluster mode's state, once started.
    pub cluster: std::sync::OnceLock<ClusterHealth>,
    config: Arc<BrokerConfig>,
    catalog: Arc<Catalog>,
    probes: Vec<Arc<ShardProbe>>,
    admission: Arc<kaas_shard::admission::Admission>,
    /// Last tick seen per shard and when it was seen (control thread only).
    last_ticks: Mutex<Vec<(u64, Instant)>>,
    started: Instant,
}

impl HealthView {
    pub fn new(
        config: Arc<BrokerConfig>,
        catalog: Arc<Catalog>,
        probes: Vec<Arc<ShardProbe>>,
        admission: Arc<kaas_shard::admission::Admission>,
    ) -> Self {
        let now = Instant::now();
        let last_ticks = Mutex::new(
            probes
                .iter()
                .map(|p| (p.alive_ticks.load(Ordering::Relaxed), now))
                .collect(),
        );
        HealthView {
            cluster: std::sync::OnceLock::new(),
            config,
            catalog,
            probes,
            admission,
            last_ticks,
            started: now,
        }
    }

    fn shards_alive(&self) -> Vec<bool> {
        let now = Instant::now();
        let mut last = self.last_ticks.lock().unwrap_or_else(|p| p.into_inner());
        self.probes
            .iter()
            .zip(last.iter_mut())
            .map(|(p, (tick, seen))| {
                let t = p.alive_ticks.load(Ordering::Relaxed);
                if t != *tick {
                    *tick = t;
                    *seen = now;
                }
                !p.stopped.load(Ordering::Relaxed) && now.duration_since(*seen) < SHARD_STALL
            })
            .collect()
    }

    fn view(&self) -> (bool, bool, serde_json::Value) {
        let alive = self.shards_alive();
        let bound = self
            .probes
            .iter()
            .all(|p| p.listener_bound.load(Ordering::Relaxed));
        let all_alive = alive.iter().all(|a| *a);
        let snapshot = self.catalog.snapshot();
        let partitions: i64 = snapshot.topics.values().map(|t| t.partitions as i64).sum();
        let (open_fds, fd_limit) = fd_usage();
        let shards: Vec<_> = self
            .probes
            .iter()
            .enumerate()
            .map(|(i, p)| {
                serde_json::json!({
                    "id": i,
                    "alive": alive[i],
                    "listener_bound": p.listener_bound.load(Ordering::Relaxed),
                    "connections": p.connections_open.load(Ordering::Relaxed),
                    "partitions_open": p.partitions_open.load(Ordering::Relaxed),
                })
            })
            .collect();
        let mut body = serde_json::json!({
            "status": if all_alive { "ok" } else { "degraded" },
            "version": env!("CARGO_PKG_VERSION"),
            "mode": "single-node",
            "broker_id": self.config.broker_id,
            "cluster_id": self.catalog.cluster_id(),
            "listener": self.config.listen.to_string(),
            "uptime_s": self.started.elapsed().as_secs(),
            "topics": snapshot.topics.len(),
            "partitions": partitions,
            "partitions_led": partitions,
            "shards": shards,
            "limits": {
                "open_fds": open_fds,
                "fd_limit": fd_limit,
                "connections_open": self.admission.open(),
                "max_connections": self.admission.limits().connections,
                "max_connections_per_ip": self.admission.limits().connections_per_ip,
                "request_memory_bytes": self.admission.reserved(),
                "queued_max_request_bytes": self.admission.limits().request_bytes,
                "log_files_open": self.probes.iter().map(|p| p.log_files_open.load(Ordering::Relaxed)).sum::<u64>(),
                "max_open_log_files": self.config.open_log_files_per_shard * self.probes.len(),
                "logs_evicted": self.probes.iter().map(|p| p.logs_evicted.load(Ordering::Relaxed)).sum::<u64>(),
            },
            "storage": {
                "data_dir": self.config.data_dir.display().to_string(),
                "free_bytes": self.admission.disk.free(),
                "size_bytes": self.admission.disk.total(),
                "min_free_bytes": self.admission.disk.min_free(),
                "produce_refused": self.admission.disk.below_floor().is_some(),
                "produce_refused_total": self.admission.disk.refused.load(Ordering::Relaxed),
                "ballast_armed": kaas_storage::ballast::armed(),
            },
        });
        let mut serving = true;
        if let Some(c) = self.cluster.get() {
            let assignment = c.assignment.borrow().clone();
            let status = c.status.borrow().clone();
            let leadership = c.leadership.borrow().clone();
            serving = crate::cluster::serving_all_assigned(
                assignment.as_deref(),
                &status,
                self.config.broker_id,
            );
            body["mode"] = "cluster".into();
            body["partitions_led"] = status.partitions.len().into();
            body["cluster"] =
                crate::cluster::health_json(&c.view, assignment.as_deref(), &status, &leadership);
        }
        (all_alive, all_alive && bound && serving, body)
    }
}

impl HealthSource for HealthView {
    fn healthz(&self) -> (bool, String) {
        let (alive, _, body) = self.view();
        (alive, body.to_string())
    }

    fn readyz(&self) -> (bool, String) {
        let (_, ready, body) = self.view();
        let bound = self
            .probes
            .iter()
            .all(|p| p.listener_bound.load(Ordering::Relaxed));
        let reason = if ready {
            "serving".to_string()
        } else if !bound {
            "Kafka listener not bound on every shard".to_string()
        } else if body["status"] != "ok" {
            "a shard is not alive".to_string()
        } else {
            "not yet serving every partition assigned to this broker".to_string()
        };
        (
            ready,
            serde_json::json!({ "ready": ready, "reason": reason, "shards": body["shards"] })
                .to_string(),
        )
    }

    fn metrics(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register(
            "kaas_build",
            "The broker's version, as a label of a series that is always 1",
            Info::new([("version", env!("CARGO_PKG_VERSION"))]),
        );
        self.register_requests(&mut registry);
        self.register_traffic(&mut registry);
        self.register_admission(&mut registry);
        self.register_shards(&mut registry);
        registry
    }
}

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
struct ShardLabels {
    shard: usize,
}

fn api_label(key: usize) -> &'static str {
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
    /// `f` summed over the shards.
    fn sum(&self, f: impl Fn(&ShardProbe) -> &AtomicU64) -> u64 {
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
            let n = self.sum(|p| &p.requests[key]);
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
        registry.register_with_unit(
            "kaas_produce_latency",
            "Produce request latency, receipt to response (acks=all includes the fsync)",
            Unit::Seconds,
            LatencyHistogram::read(self.probes.iter().map(|p| &p.produce_latency)),
        );
        registry.register_with_unit(
            "kaas_fetch_latency",
            "Fetch request latency, including long-poll waiting",
            Unit::Seconds,
            LatencyHistogram::read(self.probes.iter().map(|p| &p.fetch_latency)),
        );
    }
}

/// A latency histogram summed over the shards' probes as read at one scrape. Its count is the
/// sum of its buckets (not the probes' own count, read at another instant), so the `+Inf`
/// bucket and `_count` always agree.
#[derive(Debug)]
struct LatencyHistogram {
    sum_seconds: f64,
    count: u64,
    /// (upper bound in seconds, observations in this bucket alone), ending with `+Inf`.
    buckets: Vec<(f64, u64)>,
}

impl LatencyHistogram {
    fn read<'a>(probes: impl Iterator<Item = &'a LatencyProbe>) -> Self {
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
fn fd_usage() -> (u64, u64) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_control::health::MetricsFormat;

    // A fresh broker's metrics encode in both formats (with prometheus-client's debug checks on)
    // and already hold every family, and a request counter for every API served.
    #[test]
    fn every_family_encodes_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let config = BrokerConfig::for_tests(dir.path().into(), "127.0.0.1:9092".parse().unwrap());
        let disk = kaas_shard::disk::DiskSpace::new(dir.path(), None).unwrap();
        let admission = kaas_shard::admission::Admission::new(config.limits, disk);
        let catalog = Arc::new(Catalog::open(dir.path()).unwrap());
        let probes = vec![
            Arc::new(ShardProbe::default()),
            Arc::new(ShardProbe::default()),
        ];
        let view = HealthView::new(Arc::new(config), catalog, probes, admission);
        let classic = MetricsFormat::PrometheusText
            .encode(&view.metrics())
            .unwrap();
        let open = MetricsFormat::OpenMetrics.encode(&view.metrics()).unwrap();
        assert_eq!(classic.matches("# TYPE ").count(), 27, "{classic}");
        assert_eq!(open.matches("# TYPE ").count(), 27, "{open}");
        assert!(open.ends_with("# EOF\n"));
        for (key, _, _) in SUPPORTED_APIS {
            let series = format!(
                "kaas_requests_total{{api=\"{}\",api_key=\"{}\"}} 0\n",
                api_label(*key as usize),
                *key as i16
            );
            assert!(classic.contains(&series), "{series} missing");
        }
        assert!(
            classic.contains("kaas_shard_alive{shard=\"1\"}"),
            "{classic}"
        );
    }
}
