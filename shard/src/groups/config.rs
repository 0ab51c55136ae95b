//! Group coordinator settings, with Kafka's broker config names.
//!
//! Each setting is declared once in [`SETTINGS`]: Kafka name, environment variable, default,
//! allowed range and a doc string. [`GroupConfig::default`] takes the defaults;
//! [`GroupConfig::from_env`] overlays `KAAS_GROUP_*` environment variables so a deployment (and
//! the tests) can change them before the binary grows flags for them.

use super::assignor::RackAwareWeights;

/// One integer setting.
pub struct Setting {
    pub kafka_name: &'static str,
    pub env: &'static str,
    pub default: i64,
    pub min: i64,
    pub max: i64,
    pub doc: &'static str,
}

/// Every integer setting, in one place.
pub const SETTINGS: &[Setting] = &[
    Setting {
        kafka_name: "group.min.session.timeout.ms",
        env: "KAAS_GROUP_MIN_SESSION_TIMEOUT_MS",
        default: 6_000,
        min: 1,
        max: 3_600_000,
        doc: "Smallest session timeout a classic member may ask for in JoinGroup.",
    },
    Setting {
        kafka_name: "group.max.session.timeout.ms",
        env: "KAAS_GROUP_MAX_SESSION_TIMEOUT_MS",
        default: 1_800_000,
        min: 1,
        max: 86_400_000,
        doc: "Largest session timeout a classic member may ask for in JoinGroup.",
    },
    Setting {
        kafka_name: "group.initial.rebalance.delay.ms",
        env: "KAAS_GROUP_INITIAL_REBALANCE_DELAY_MS",
        // Kafka's broker default is 3000; a short delay still lets consumers started together
        // land in one generation without making every first join wait seconds.
        default: 200,
        min: 0,
        max: 300_000,
        doc: "How long the first rebalance of an empty classic group waits for more members \
              (each new member extends it, up to the rebalance timeout).",
    },
    Setting {
        kafka_name: "group.consumer.session.timeout.ms",
        env: "KAAS_GROUP_CONSUMER_SESSION_TIMEOUT_MS",
        default: 45_000,
        min: 1,
        max: 3_600_000,
        doc: "KIP-848 members that send no heartbeat for this long are removed from the group.",
    },
    Setting {
        kafka_name: "group.consumer.heartbeat.interval.ms",
        env: "KAAS_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS",
        default: 5_000,
        min: 1,
        max: 3_600_000,
        doc: "Heartbeat interval the coordinator gives KIP-848 members.",
    },
    Setting {
        kafka_name: "offset.metadata.max.bytes",
        env: "KAAS_GROUP_OFFSET_METADATA_MAX_BYTES",
        default: 4096,
        min: 0,
        max: 1 << 20,
        doc: "Largest metadata string accepted with a committed offset.",
    },
    Setting {
        kafka_name: "offsets.segment.bytes",
        env: "KAAS_GROUP_OFFSETS_SEGMENT_BYTES",
        default: 8 << 20,
        min: 64 << 10,
        max: 1 << 30,
        doc: "Segment size of a group's offset log; the log is rewritten as a snapshot of the \
              live offsets once it holds several segments.",
    },
    Setting {
        kafka_name: "group.consumer.rack.aware.traffic.weight",
        env: "KAAS_GROUP_RACK_AWARE_TRAFFIC_WEIGHT",
        default: 10,
        min: 0,
        max: 1_000_000,
        doc: "rack-aware assignor: cost of one partition read across racks.",
    },
    Setting {
        kafka_name: "group.consumer.rack.aware.overlap.weight",
        env: "KAAS_GROUP_RACK_AWARE_OVERLAP_WEIGHT",
        default: 1,
        min: 0,
        max: 1_000_000,
        doc: "rack-aware assignor: cost of one partition moved from its current owner.",
    },
];

/// The group coordinator's settings as the shards use them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    pub min_session_timeout_ms: i32,
    pub max_session_timeout_ms: i32,
    pub initial_rebalance_delay_ms: u64,
    pub consumer_session_timeout_ms: i32,
    pub consumer_heartbeat_interval_ms: i32,
    pub offset_metadata_max_bytes: usize,
    pub offsets_segment_bytes: u64,
    /// `group.consumer.assignors`' first entry in Kafka: the assignor used when no member asks
    /// for one.
    pub default_assignor: String,
    pub rack_aware_weights: RackAwareWeights,
}

fn get(values: &[(&'static str, i64)], kafka_name: &str) -> i64 {
    values
        .iter()
        .find(|(k, _)| *k == kafka_name)
        .map(|(_, v)| *v)
        .expect("every setting is declared in SETTINGS")
}

impl GroupConfig {
    fn from_values(values: &[(&'static str, i64)], default_assignor: String) -> GroupConfig {
        GroupConfig {
            min_session_timeout_ms: get(values, "group.min.session.timeout.ms") as i32,
            max_session_timeout_ms: get(values, "group.max.session.timeout.ms") as i32,
            initial_rebalance_delay_ms: get(values, "group.initial.rebalance.delay.ms") as u64,
            consumer_session_timeout_ms: get(values, "group.consumer.session.timeout.ms") as i32,
            consumer_heartbeat_interval_ms: get(values, "group.consumer.heartbeat.interval.ms")
                as i32,
            offset_metadata_max_bytes: get(values, "offset.metadata.max.bytes") as usize,
            offsets_segment_bytes: get(values, "offsets.segment.bytes") as u64,
            default_assignor,
            rack_aware_weights: RackAwareWeights {
                traffic: get(values, "group.consumer.rack.aware.traffic.weight") as u32,
                overlap: get(values, "group.consumer.rack.aware.overlap.weight") as u32,
            },
        }
    }

    /// Defaults overlaid with `KAAS_GROUP_*` environment variables. A value that does not
    /// parse or is out of range is ignored with a warning, so a typo cannot stop the broker.
    pub fn from_env() -> GroupConfig {
        let lookup = |name: &str| std::env::var(name).ok();
        Self::from_lookup(lookup)
    }

    /// Like [`GroupConfig::from_env`] with an explicit lookup (tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> GroupConfig {
        let values: Vec<(&'static str, i64)> = SETTINGS
            .iter()
            .map(|s| {
                let v = match lookup(s.env).map(|v| v.trim().parse::<i64>()) {
                    Some(Ok(v)) if (s.min..=s.max).contains(&v) => v,
                    Some(_) => {
                        tracing::warn!(
                            setting = s.kafka_name,
                            env = s.env,
                            min = s.min,
                            max = s.max,
                            "ignoring an invalid value; using the default {}",
                            s.default
                        );
                        s.default
                    }
                    None => s.default,
                };
                (s.kafka_name, v)
            })
            .collect();
        let assignor = lookup("KAAS_GROUP_CONSUMER_ASSIGNOR")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "uniform".to_string());
        Self::from_values(&values, assignor)
    }
}

impl Default for GroupConfig {
    fn default() -> Self {
        let values: Vec<(&'static str, i64)> =
            SETTINGS.iter().map(|s| (s.kafka_name, s.default)).collect();
        Self::from_values(&values, "uniform".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Defaults are Kafka's where Kafka's make sense here, and every default is inside its range.
    #[test]
    fn defaults_in_range() {
        for s in SETTINGS {
            assert!((s.min..=s.max).contains(&s.default), "{}", s.kafka_name);
        }
        let c = GroupConfig::default();
        assert_eq!(c.consumer_session_timeout_ms, 45_000);
        assert_eq!(c.consumer_heartbeat_interval_ms, 5_000);
        assert_eq!(c.default_assignor, "uniform");
    }

    // Environment overrides apply when valid and are ignored when out of range.
    #[test]
    fn overrides() {
        let c = GroupConfig::from_lookup(|k| match k {
            "KAAS_GROUP_INITIAL_REBALANCE_DELAY_MS" => Some("0".into()),
            "KAAS_GROUP_CONSUMER_SESSION_TIMEOUT_MS" => Some("-5".into()),
            "KAAS_GROUP_CONSUMER_ASSIGNOR" => Some("range".into()),
            _ => None,
        });
        assert_eq!(c.initial_rebalance_delay_ms, 0);
        assert_eq!(c.consumer_session_timeout_ms, 45_000);
        assert_eq!(c.default_assignor, "range");
    }
}
