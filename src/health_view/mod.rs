//! The broker's health, readiness and metrics, read from the shards' probes (atomics) on the
//! control thread.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kaas_control::health::HealthSource;
use kaas_shard::catalog::Catalog;
use kaas_shard::config::BrokerConfig;
use kaas_shard::probe::ShardProbe;
use prometheus_client::registry::Registry;

use metrics::fd_usage;

mod metrics;
mod offsets;
mod requests;

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
        // A failed sync stops every write for good (kaas_storage::sync_failure): the broker is
        // not healthy, so a liveness probe restarts it and recovery runs from what is on disk.
        let sync_failed = kaas_storage::sync_failure::failure();
        let all_alive = alive.iter().all(|a| *a) && sync_failed.is_none();
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
            "status": if sync_failed.is_some() { "failed" } else if all_alive { "ok" } else { "degraded" },
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
                "sync_failed": sync_failed,
                "cold_reads": kaas_storage::memory_limit::cold_reads().name(),
                "cold_reads_past_page_cache": kaas_storage::memory_limit::read_past_page_cache(),
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
        } else if let Some(why) = kaas_storage::sync_failure::failure() {
            why.to_string()
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
        self.registry()
    }
}

#[cfg(test)]
mod tests {
    use super::metrics::api_label;
    use super::*;
    use kaas_control::health::MetricsFormat;
    use kaas_wire::versions::SUPPORTED_APIS;

    // A fresh broker's metrics encode in both formats (with prometheus-client's debug checks on)
    // and already hold every family, and a request counter for every API served.
    #[test]
    fn every_family_encodes_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let config = BrokerConfig::for_tests(dir.path().into(), "127.0.0.1:9092".parse().unwrap());
        let disk = kaas_shard::disk::DiskSpace::new(dir.path(), None).unwrap();
        let admission = kaas_shard::admission::Admission::new(config.limits, disk);
        let catalog = Arc::new(Catalog::open(dir.path()).unwrap());
        // A topic's series exist from its creation, at zero (without topics the per-topic
        // families have no series, and prometheus-client then leaves them out).
        catalog
            .create_topic("t", 1, -1, Default::default())
            .unwrap();
        let probes = vec![
            Arc::new(ShardProbe::default()),
            Arc::new(ShardProbe::default()),
        ];
        let view = HealthView::new(Arc::new(config), catalog, probes, admission);
        let classic = MetricsFormat::PrometheusText
            .encode(&view.metrics())
            .unwrap();
        let open = MetricsFormat::OpenMetrics.encode(&view.metrics()).unwrap();
        assert_eq!(classic.matches("# TYPE ").count(), 55, "{classic}");
        assert_eq!(open.matches("# TYPE ").count(), 55, "{open}");
        // A single node is its own controller and only broker, its fence open.
        for series in [
            "kaas_controller_active 1\n",
            "kaas_controller_id 0\n",
            "kaas_write_fence_open 1\n",
            "kaas_partitions_offline 0\n",
            "kaas_brokers{state=\"alive\"} 1\n",
            "kaas_brokers{state=\"dead\"} 0\n",
            "kaas_topic_records_in_total{topic=\"t\"} 0\n",
        ] {
            assert!(classic.contains(series), "{series} missing from {classic}");
        }
        for family in [
            "# TYPE process_cpu_seconds_total counter",
            "# TYPE process_resident_memory_bytes gauge",
            "# TYPE process_start_time_seconds gauge",
        ] {
            assert!(classic.contains(family), "{family} missing from {classic}");
        }
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
