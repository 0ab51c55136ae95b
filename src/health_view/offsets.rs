//! The per-partition and per-group families: each led partition's start and end offsets, each
//! coordinated group's committed offsets, members and rebalances, and the groups by state.
//!
//! Consumer lag is the difference of two of them: a partition's end offset (published by the
//! broker that leads it) minus a group's committed offset (published by the group's
//! coordinator). In a cluster those are often different brokers, so the broker does not
//! subtract; Prometheus does, across brokers (the chart's `kaas:group_partition_lag` rule):
//!
//! ```text
//! max by (topic, partition) (kaas_partition_end_offset)
//!   - on (topic, partition) group_right
//! max by (group, topic, partition) (kaas_group_committed_offset)
//! ```

use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::HealthView;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    topic: String,
    partition: i32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupPartitionLabels {
    group: String,
    topic: String,
    partition: i32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
    group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupStateLabels {
    r#type: &'static str,
    state: &'static str,
}

/// Kafka's state names by group type, so `kaas_groups` has every series from the start.
const GROUP_STATES: [(&str, &[&str]); 2] = [
    (
        "classic",
        &[
            "Empty",
            "PreparingRebalance",
            "CompletingRebalance",
            "Stable",
            "Dead",
        ],
    ),
    (
        "consumer",
        &["Empty", "Assigning", "Reconciling", "Stable", "Dead"],
    ),
];

/// The series limit was reached once: said in the log once, not at every scrape.
static LIMIT_LOGGED: AtomicBool = AtomicBool::new(false);

/// What is left of `--metrics-partition-series-limit` at one scrape.
struct SeriesBudget {
    left: usize,
    omitted: u64,
}

impl SeriesBudget {
    fn new(limit: usize) -> Self {
        SeriesBudget {
            left: limit,
            omitted: 0,
        }
    }

    /// Whether `n` more series fit; counts them as omitted if not.
    fn take(&mut self, n: usize) -> bool {
        if self.left >= n {
            self.left -= n;
            true
        } else {
            self.omitted += n as u64;
            false
        }
    }
}

impl HealthView {
    /// Partition series and group series each get `--metrics-partition-series-limit`, so
    /// thousands of led partitions cannot push every committed offset (and with them the lag
    /// rule) out; each shard applies the same limits to what it publishes, and the broker-wide
    /// ones apply here.
    pub(super) fn register_offsets(&self, registry: &mut Registry) {
        let limit = self.config.metrics_partition_series_limit;
        let mut partitions = SeriesBudget::new(limit);
        let mut groups = SeriesBudget::new(limit);
        self.register_partition_offsets(registry, &mut partitions);
        self.register_groups(registry, &mut groups);
        let omitted = partitions.omitted
            + groups.omitted
            + self
                .probes
                .iter()
                .map(|p| p.published.omitted.load(Ordering::Relaxed))
                .sum::<u64>();
        if omitted > 0 && limit > 0 && !LIMIT_LOGGED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                limit,
                "more per-partition series than --metrics-partition-series-limit: some partition offsets and committed offsets are left out of /metrics (counted in kaas_metrics_partition_series_omitted); raise the limit if Prometheus can take them"
            );
        }
        registry.register(
            "kaas_metrics_partition_series_omitted",
            "Per-partition series left out by --metrics-partition-series-limit",
            prometheus_client::metrics::gauge::ConstGauge::new(omitted as i64),
        );
    }

    fn register_partition_offsets(&self, registry: &mut Registry, budget: &mut SeriesBudget) {
        let start = Family::<PartitionLabels, Gauge>::default();
        let end = Family::<PartitionLabels, Gauge>::default();
        for probe in &self.probes {
            for p in probe.published.partitions.load().iter() {
                if budget.take(2) {
                    let labels = PartitionLabels {
                        topic: p.topic.to_string(),
                        partition: p.partition,
                    };
                    start.get_or_create(&labels).set(p.log_start);
                    end.get_or_create(&labels).set(p.high_watermark);
                }
            }
        }
        registry.register(
            "kaas_partition_start_offset",
            "A led partition's log start offset",
            start,
        );
        registry.register(
            "kaas_partition_end_offset",
            "A led partition's high watermark: the end of what consumers can read",
            end,
        );
    }

    fn register_groups(&self, registry: &mut Registry, budget: &mut SeriesBudget) {
        let committed = Family::<GroupPartitionLabels, Gauge>::default();
        let members = Family::<GroupLabels, Gauge>::default();
        let rebalances = Family::<GroupLabels, Counter>::default();
        let by_state = Family::<GroupStateLabels, Gauge>::default();
        for (r#type, states) in GROUP_STATES {
            for state in states {
                let _ = by_state.get_or_create(&GroupStateLabels { r#type, state });
            }
        }
        for probe in &self.probes {
            for g in probe.published.groups.load().iter() {
                by_state
                    .get_or_create(&GroupStateLabels {
                        r#type: g.group_type,
                        state: g.state,
                    })
                    .inc();
                if !budget.take(2 + g.committed.len()) {
                    continue;
                }
                let labels = GroupLabels {
                    group: g.group.clone(),
                };
                members.get_or_create(&labels).set(g.members as i64);
                rebalances.get_or_create(&labels).inc_by(g.rebalances);
                for (topic, partition, offset) in &g.committed {
                    committed
                        .get_or_create(&GroupPartitionLabels {
                            group: g.group.clone(),
                            topic: topic.clone(),
                            partition: *partition,
                        })
                        .set(*offset);
                }
            }
        }
        registry.register(
            "kaas_group_committed_offset",
            "A group's committed offset for a partition (lag: the partition's end offset minus \
             this)",
            committed,
        );
        registry.register(
            "kaas_group_members",
            "Members of a group this broker coordinates",
            members,
        );
        registry.register(
            "kaas_group_rebalances",
            "Rebalances of a group since its coordinator loaded it (classic generation or \
             KIP-848 group epoch)",
            rebalances,
        );
        registry.register(
            "kaas_groups",
            "Groups this broker coordinates, by type and Kafka state",
            by_state,
        );
    }
}
