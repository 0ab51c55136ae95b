//! Group coordinator settings, with Kafka's broker config names.
//!
//! Each setting is declared once in [`SETTINGS`]: Kafka name, environment variable, default,
//! allowed range and a doc string. The binary turns every entry into a typed flag
//! (`--group-min-session-timeout-ms`, env `KAAS_GROUP_MIN_SESSION_TIMEOUT_MS`, range-checked
//! at start like every other flag) and builds the [`GroupConfig`] with
//! [`GroupConfig::from_values`]; [`GroupConfig::default`] takes the defaults.

use crate::assignor::RackAwareWeights;

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
        kafka_name: "group.consumer.min.session.timeout.ms",
        env: "KAAS_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS",
        default: 45_000,
        min: 1,
        max: 3_600_000,
        doc: "Smallest consumer.session.timeout.ms a group config may set.",
    },
    Setting {
        kafka_name: "group.consumer.max.session.timeout.ms",
        env: "KAAS_GROUP_CONSUMER_MAX_SESSION_TIMEOUT_MS",
        default: 60_000,
        min: 1,
        max: 3_600_000,
        doc: "Largest consumer.session.timeout.ms a group config may set.",
    },
    Setting {
        kafka_name: "group.consumer.min.heartbeat.interval.ms",
        env: "KAAS_GROUP_CONSUMER_MIN_HEARTBEAT_INTERVAL_MS",
        default: 5_000,
        min: 1,
        max: 3_600_000,
        doc: "Smallest consumer.heartbeat.interval.ms a group config may set.",
    },
    Setting {
        kafka_name: "group.consumer.max.heartbeat.interval.ms",
        env: "KAAS_GROUP_CONSUMER_MAX_HEARTBEAT_INTERVAL_MS",
        default: 15_000,
        min: 1,
        max: 3_600_000,
        doc: "Largest consumer.heartbeat.interval.ms a group config may set.",
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
        kafka_name: "offsets.retention.check.interval.ms",
        env: "KAAS_GROUP_OFFSETS_RETENTION_CHECK_INTERVAL_MS",
        default: 600_000,
        min: 1,
        max: 86_400_000,
        doc: "A group with no members and no committed offsets is deleted (its directory \
              removed) this long after it emptied; Kafka removes such a group at its next \
              check of this interval.",
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

/// One of Kafka 4's group configs (the GROUP config resource): its per-group name, the broker
/// setting of [`SETTINGS`] it overrides for that group (whose range it keeps), and the field of
/// [`GroupConfig`] it sets.
pub struct GroupSetting {
    pub name: &'static str,
    pub broker: &'static str,
    get: fn(&GroupConfig) -> i64,
    set: fn(&mut GroupConfig, i64),
}

/// Every group config. The rack-aware weights are kaas's own: so is the assignor.
pub const GROUP_SETTINGS: &[GroupSetting] = &[
    GroupSetting {
        name: "consumer.session.timeout.ms",
        broker: "group.consumer.session.timeout.ms",
        get: |c| c.consumer_session_timeout_ms as i64,
        set: |c, v| c.consumer_session_timeout_ms = v as i32,
    },
    GroupSetting {
        name: "consumer.heartbeat.interval.ms",
        broker: "group.consumer.heartbeat.interval.ms",
        get: |c| c.consumer_heartbeat_interval_ms as i64,
        set: |c, v| c.consumer_heartbeat_interval_ms = v as i32,
    },
    GroupSetting {
        name: "consumer.rack.aware.traffic.weight",
        broker: "group.consumer.rack.aware.traffic.weight",
        get: |c| c.rack_aware_weights.traffic as i64,
        set: |c, v| c.rack_aware_weights.traffic = v as u32,
    },
    GroupSetting {
        name: "consumer.rack.aware.overlap.weight",
        broker: "group.consumer.rack.aware.overlap.weight",
        get: |c| c.rack_aware_weights.overlap as i64,
        set: |c, v| c.rack_aware_weights.overlap = v as u32,
    },
];

impl GroupSetting {
    /// The broker setting this overrides (its range and doc).
    pub fn broker_setting(&self) -> &'static Setting {
        SETTINGS
            .iter()
            .find(|s| s.kafka_name == self.broker)
            .expect("every group setting overrides a declared broker setting")
    }
}

/// The group config called `name`, if there is one.
pub fn group_setting(name: &str) -> Option<&'static GroupSetting> {
    GROUP_SETTINGS.iter().find(|g| g.name == name)
}

/// Checks one group config on its own: a known name, an integer within its broker setting's
/// range ([`GroupConfig::validate_group_configs`] checks a group's configs together).
pub fn validate_group_setting(name: &str, value: &str) -> Result<(), String> {
    let s = group_setting(name)
        .ok_or_else(|| {
            format!(
                "Unknown group config name: {name}. Group configs are: {}",
                GROUP_SETTINGS
                    .iter()
                    .map(|g| g.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?
        .broker_setting();
    match value.trim().parse::<i64>() {
        Ok(v) if (s.min..=s.max).contains(&v) => Ok(()),
        _ => Err(format!(
            "Invalid value {value} for configuration {name}: expected an integer in [{}, {}]",
            s.min, s.max
        )),
    }
}

/// The group coordinator's settings as the shards use them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    pub min_session_timeout_ms: i32,
    pub max_session_timeout_ms: i32,
    pub initial_rebalance_delay_ms: u64,
    pub consumer_session_timeout_ms: i32,
    pub consumer_heartbeat_interval_ms: i32,
    /// The range a group's `consumer.session.timeout.ms` may take (Kafka's
    /// `group.consumer.{min,max}.session.timeout.ms`).
    pub consumer_session_timeout_range_ms: (i32, i32),
    /// The range a group's `consumer.heartbeat.interval.ms` may take.
    pub consumer_heartbeat_interval_range_ms: (i32, i32),
    pub offset_metadata_max_bytes: usize,
    pub offsets_segment_bytes: u64,
    /// `offsets.retention.check.interval.ms`: how long an empty group without offsets stays.
    pub empty_group_retention_ms: u64,
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
    /// The settings from `(kafka_name, value)` pairs covering every entry of [`SETTINGS`] (the
    /// binary's flags, which checked the ranges) and the default assignor's name.
    pub fn from_values(values: &[(&'static str, i64)], default_assignor: String) -> GroupConfig {
        GroupConfig {
            min_session_timeout_ms: get(values, "group.min.session.timeout.ms") as i32,
            max_session_timeout_ms: get(values, "group.max.session.timeout.ms") as i32,
            initial_rebalance_delay_ms: get(values, "group.initial.rebalance.delay.ms") as u64,
            consumer_session_timeout_ms: get(values, "group.consumer.session.timeout.ms") as i32,
            consumer_heartbeat_interval_ms: get(values, "group.consumer.heartbeat.interval.ms")
                as i32,
            consumer_session_timeout_range_ms: (
                get(values, "group.consumer.min.session.timeout.ms") as i32,
                get(values, "group.consumer.max.session.timeout.ms") as i32,
            ),
            consumer_heartbeat_interval_range_ms: (
                get(values, "group.consumer.min.heartbeat.interval.ms") as i32,
                get(values, "group.consumer.max.heartbeat.interval.ms") as i32,
            ),
            offset_metadata_max_bytes: get(values, "offset.metadata.max.bytes") as usize,
            offsets_segment_bytes: get(values, "offsets.segment.bytes") as u64,
            empty_group_retention_ms: get(values, "offsets.retention.check.interval.ms") as u64,
            default_assignor,
            rack_aware_weights: RackAwareWeights {
                traffic: get(values, "group.consumer.rack.aware.traffic.weight") as u32,
                overlap: get(values, "group.consumer.rack.aware.overlap.weight") as u32,
            },
        }
    }

    /// Checks a group's configs as a whole, as Kafka's `GroupConfig` does: each a known name
    /// with an integer value in range — the session timeout and heartbeat interval within this
    /// broker's `group.consumer.{min,max}.*` — and the heartbeat interval below the session
    /// timeout it leaves the group with. A member of a group that broke these was fenced at
    /// every heartbeat (a session timeout of 1 ms), with nothing telling the user why.
    pub fn validate_group_configs(
        &self,
        configs: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), String> {
        for (name, value) in configs {
            validate_group_setting(name, value)?;
            let range = match name.as_str() {
                "consumer.session.timeout.ms" => self.consumer_session_timeout_range_ms,
                "consumer.heartbeat.interval.ms" => self.consumer_heartbeat_interval_range_ms,
                _ => continue,
            };
            let v: i64 = value
                .trim()
                .parse()
                .map_err(|_| format!("{name}: {value}"))?;
            if !(i64::from(range.0)..=i64::from(range.1)).contains(&v) {
                return Err(format!(
                    "{name} must be in the range {} to {} inclusive (group.consumer.min/max \
                     settings of the broker)",
                    range.0, range.1
                ));
            }
        }
        let c = self.for_group(Some(configs));
        if c.consumer_heartbeat_interval_ms >= c.consumer_session_timeout_ms {
            return Err(format!(
                "consumer.heartbeat.interval.ms ({}) must be less than \
                 consumer.session.timeout.ms ({})",
                c.consumer_heartbeat_interval_ms, c.consumer_session_timeout_ms
            ));
        }
        Ok(())
    }

    /// How long an empty group without offsets is kept.
    pub fn empty_group_retention(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.empty_group_retention_ms)
    }

    /// These settings with one group's overrides (Kafka's group configs) applied. Values were
    /// validated when stored; one that no longer parses is ignored.
    pub fn for_group(
        &self,
        overrides: Option<&std::collections::BTreeMap<String, String>>,
    ) -> GroupConfig {
        let mut c = self.clone();
        for (name, value) in overrides.into_iter().flatten() {
            if let (Some(g), Ok(v)) = (group_setting(name), value.trim().parse::<i64>()) {
                (g.set)(&mut c, v);
            }
        }
        c
    }

    /// The effective value of group config `name` under `overrides`, and whether the group
    /// sets it (DescribeConfigs); None for a name that is not a group config.
    pub fn group_value(
        &self,
        name: &str,
        overrides: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Option<(i64, bool)> {
        let g = group_setting(name)?;
        Some((
            (g.get)(&self.for_group(overrides)),
            overrides.is_some_and(|o| o.contains_key(name)),
        ))
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

    // Values given for the settings are the ones used.
    #[test]
    fn from_values() {
        let values: Vec<(&'static str, i64)> = SETTINGS
            .iter()
            .map(|s| {
                (
                    s.kafka_name,
                    if s.kafka_name == "group.initial.rebalance.delay.ms" {
                        0
                    } else {
                        s.default
                    },
                )
            })
            .collect();
        let c = GroupConfig::from_values(&values, "range".into());
        assert_eq!(c.initial_rebalance_delay_ms, 0);
        assert_eq!(c.consumer_session_timeout_ms, 45_000);
        assert_eq!(c.default_assignor, "range");
    }

    // A group's configs override the broker's settings for that group only, within the broker
    // setting's range; unknown names are refused.
    #[test]
    fn group_configs() {
        let broker = GroupConfig::default();
        let mut o = std::collections::BTreeMap::new();
        o.insert(
            "consumer.session.timeout.ms".to_string(),
            "60000".to_string(),
        );
        o.insert(
            "consumer.rack.aware.traffic.weight".to_string(),
            "1000".to_string(),
        );
        let c = broker.for_group(Some(&o));
        assert_eq!(c.consumer_session_timeout_ms, 60_000);
        assert_eq!(c.rack_aware_weights.traffic, 1000);
        assert_eq!(
            c.consumer_heartbeat_interval_ms,
            broker.consumer_heartbeat_interval_ms
        );
        assert_eq!(
            broker.group_value("consumer.session.timeout.ms", Some(&o)),
            Some((60_000, true))
        );
        assert_eq!(
            broker.group_value("consumer.session.timeout.ms", None),
            Some((45_000, false))
        );
        assert_eq!(broker.group_value("session.timeout.ms", None), None);
        assert!(validate_group_setting("consumer.heartbeat.interval.ms", "5000").is_ok());
        assert!(validate_group_setting("consumer.heartbeat.interval.ms", "0").is_err());
        assert!(validate_group_setting("consumer.heartbeat.interval.ms", "x").is_err());
        assert!(validate_group_setting("share.session.timeout.ms", "45000").is_err());
    }

    // Kafka's checks of a group's configs: the session timeout and heartbeat interval within
    // the broker's group.consumer.{min,max} settings, and the interval below the timeout.
    #[test]
    fn group_configs_are_checked_together() {
        let broker = GroupConfig::default();
        let check = |pairs: &[(&str, &str)]| {
            let m: std::collections::BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            broker.validate_group_configs(&m)
        };
        assert_eq!(check(&[("consumer.session.timeout.ms", "50000")]), Ok(()));
        assert_eq!(
            check(&[
                ("consumer.session.timeout.ms", "60000"),
                ("consumer.heartbeat.interval.ms", "15000")
            ]),
            Ok(())
        );
        for bad in [
            &[("consumer.session.timeout.ms", "1")][..],
            &[("consumer.session.timeout.ms", "60001")],
            &[("consumer.heartbeat.interval.ms", "100")],
            &[("consumer.heartbeat.interval.ms", "60000")],
            &[("consumer.session.timeout.ms", "abc")],
            &[("no.such.config", "1")],
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
        // In range each, but the interval not below the timeout (a broker whose ranges overlap).
        let wide = GroupConfig {
            consumer_heartbeat_interval_range_ms: (5_000, 60_000),
            ..GroupConfig::default()
        };
        let m = [(
            "consumer.heartbeat.interval.ms".to_string(),
            "50000".to_string(),
        )]
        .into();
        assert!(wide.validate_group_configs(&m).is_err());
    }
}
