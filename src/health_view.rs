//! The broker's health, readiness and metrics, read from the shards' probes (atomics) on the
//! control thread.

use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kaas_control::health::HealthSource;
use kaas_shard::catalog::Catalog;
use kaas_shard::config::BrokerConfig;
use kaas_shard::probe::{api_name, LatencyProbe, ShardProbe, API_KEYS, LATENCY_BUCKETS_US};

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

    fn metrics(&self) -> String {
        let mut out = String::new();
        let sum =
            |f: &dyn Fn(&ShardProbe) -> u64| -> u64 { self.probes.iter().map(|p| f(p)).sum() };
        let _ = writeln!(out, "# HELP kaas_requests_total Kafka requests received, by API.\n# TYPE kaas_requests_total counter");
        for key in 0..API_KEYS {
            let n = sum(&|p| p.requests[key].load(Ordering::Relaxed));
            if n > 0 {
                let _ = writeln!(
                    out,
                    "kaas_requests_total{{api=\"{}\",api_key=\"{key}\"}} {n}",
                    api_name(key as i16).unwrap_or("Other")
                );
            }
        }
        let _ = writeln!(out, "# HELP kaas_request_errors_total Requests that could not be answered, by API.\n# TYPE kaas_request_errors_total counter");
        for key in 0..API_KEYS {
            let n = sum(&|p| p.request_errors[key].load(Ordering::Relaxed));
            if n > 0 {
                let _ = writeln!(
                    out,
                    "kaas_request_errors_total{{api=\"{}\"}} {n}",
                    api_name(key as i16).unwrap_or("Other")
                );
            }
        }
        let counters: [(&str, &str, u64); 6] = [
            (
                "kaas_logs_evicted_total",
                "Idle partition logs closed to stay within the open-file budget (reopened on use).",
                sum(&|p| p.logs_evicted.load(Ordering::Relaxed)),
            ),
            (
                "kaas_bytes_in_total",
                "Bytes of Kafka requests received.",
                sum(&|p| p.bytes_in.load(Ordering::Relaxed)),
            ),
            (
                "kaas_bytes_out_total",
                "Bytes of Kafka responses sent.",
                sum(&|p| p.bytes_out.load(Ordering::Relaxed)),
            ),
            (
                "kaas_protocol_errors_total",
                "Connections closed for malformed, oversized or unsupported requests.",
                sum(&|p| p.protocol_errors.load(Ordering::Relaxed)),
            ),
            (
                "kaas_connections_total",
                "Connections accepted.",
                sum(&|p| p.connections_total.load(Ordering::Relaxed)),
            ),
            (
                "kaas_errors_total",
                "Requests that failed inside the broker.",
                self.probes
                    .iter()
                    .map(|p| {
                        p.request_errors
                            .iter()
                            .map(|c| c.load(Ordering::Relaxed))
                            .sum::<u64>()
                    })
                    .sum(),
            ),
        ];
        let a = &self.admission;
        let _ = writeln!(
            out,
            "# HELP kaas_connections_closed_total Connections the broker closed or refused, by reason.\n# TYPE kaas_connections_closed_total counter"
        );
        for (reason, counter) in [
            ("idle", &a.closed_idle),
            ("request_stalled", &a.closed_slow),
            ("max_connections_per_ip", &a.refused_per_ip),
        ] {
            let _ = writeln!(
                out,
                "kaas_connections_closed_total{{reason=\"{reason}\"}} {}",
                counter.load(Ordering::Relaxed)
            );
        }
        let (open_fds, fd_limit) = fd_usage();
        let disk = &a.disk;
        let admission_series: [(&str, &str, &str, u64); 11] = [
            ("kaas_data_dir_free_bytes", "gauge", "Free bytes of the data directory's volume (as an unprivileged writer sees them).", disk.free()),
            ("kaas_data_dir_size_bytes", "gauge", "Size of the data directory's volume.", disk.total()),
            ("kaas_min_free_bytes", "gauge", "--min-free-bytes: below it, produce is refused with KAFKA_STORAGE_ERROR.", disk.min_free()),
            ("kaas_produce_refused_disk_full_total", "counter", "Partitions of produce requests refused because the data volume was below --min-free-bytes.", disk.refused.load(Ordering::Relaxed)),
            ("kaas_open_fds", "gauge", "File descriptors the broker has open (connections, partition logs, io_uring, ...).", open_fds),
            ("kaas_fd_limit", "gauge", "The broker's open-file limit (raised to the hard limit at start).", fd_limit),
            ("kaas_heartbeat_refused_total", "counter", "Heartbeat streams and messages refused for a missing or bad signature (cluster mode).", kaas_control::heartbeat::auth::REFUSED.load(Ordering::Relaxed)),
            (
                "kaas_request_memory_bytes",
                "gauge",
                "Bytes of request bodies reserved now (broker-wide).",
                a.reserved() as u64,
            ),
            (
                "kaas_request_memory_limit_bytes",
                "gauge",
                "--queued-max-request-bytes.",
                a.limits().request_bytes as u64,
            ),
            (
                "kaas_request_memory_waits_total",
                "counter",
                "Times a connection stopped reading because the request memory budget was used up.",
                a.memory_waits.load(Ordering::Relaxed),
            ),
            (
                "kaas_accept_paused_total",
                "counter",
                "Times accepting paused because --max-connections were open.",
                a.accept_paused.load(Ordering::Relaxed),
            ),
        ];
        for (name, kind, help, v) in admission_series {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let gauges: [(&str, &str, u64); 3] = [
            (
                "kaas_connections_open",
                "Open client connections.",
                sum(&|p| p.connections_open.load(Ordering::Relaxed)),
            ),
            (
                "kaas_partitions_open",
                "Partition logs open on the shards.",
                sum(&|p| p.partitions_open.load(Ordering::Relaxed)),
            ),
            (
                "kaas_log_files_open",
                "Segment files the open partition logs hold (within --max-open-log-files).",
                sum(&|p| p.log_files_open.load(Ordering::Relaxed)),
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let alive = self.shards_alive();
        let _ = writeln!(out, "# HELP kaas_shard_alive 1 while the shard's executor is making progress.\n# TYPE kaas_shard_alive gauge");
        for (i, a) in alive.iter().enumerate() {
            let _ = writeln!(out, "kaas_shard_alive{{shard=\"{i}\"}} {}", *a as u8);
        }
        histogram(
            &mut out,
            "kaas_produce_latency_seconds",
            "Produce request latency, receipt to response (acks=all includes the fsync).",
            self.probes.iter().map(|p| &p.produce_latency),
        );
        histogram(
            &mut out,
            "kaas_fetch_latency_seconds",
            "Fetch request latency, including long-poll waiting.",
            self.probes.iter().map(|p| &p.fetch_latency),
        );
        out
    }
}

fn histogram<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    probes: impl Iterator<Item = &'a LatencyProbe>,
) {
    let mut buckets = vec![0u64; LATENCY_BUCKETS_US.len() + 1];
    let (mut sum_us, mut count) = (0u64, 0u64);
    for p in probes {
        let (b, s, c) = p.read();
        for (acc, x) in buckets.iter_mut().zip(b) {
            *acc += x;
        }
        sum_us += s;
        count += c;
    }
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0;
    for (i, le) in LATENCY_BUCKETS_US.iter().enumerate() {
        cumulative += buckets[i];
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"{}\"}} {cumulative}",
            *le as f64 / 1e6
        );
    }
    cumulative += buckets[LATENCY_BUCKETS_US.len()];
    let _ = writeln!(
        out,
        "{name}_bucket{{le=\"+Inf\"}} {cumulative}\n{name}_sum {}\n{name}_count {count}",
        sum_us as f64 / 1e6
    );
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
