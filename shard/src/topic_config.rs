//! Topic configuration: Kafka's names, types, defaults and validation, in one table.

use std::collections::BTreeMap;

use kaas_storage::LogConfig;

/// Kafka's config types as DescribeConfigs v3+ reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Long = 5,
    Double = 6,
    List = 7,
    /// Described as sensitive: without its value.
    Password = 9,
}

/// One topic config we understand.
pub struct ConfigDef {
    pub name: &'static str,
    pub default: &'static str,
    pub kind: ConfigType,
    pub doc: &'static str,
    /// Allowed values for enumerations; empty for numbers.
    pub one_of: &'static [&'static str],
    pub min: i64,
}

/// The topic configs kaas knows, with Kafka's defaults.
pub const TOPIC_CONFIGS: &[ConfigDef] = &[
    ConfigDef {
        name: "cleanup.policy",
        default: "delete",
        kind: ConfigType::List,
        doc: "delete, compact, or both",
        one_of: &["delete", "compact", "compact,delete", "delete,compact"],
        min: 0,
    },
    ConfigDef {
        name: "compression.type",
        default: "producer",
        kind: ConfigType::String,
        doc: "Final compression type for the topic: producer keeps each batch as the producer compressed it; another value stores every batch with that codec, recompressing on produce as Kafka does",
        one_of: &["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"],
        min: 0,
    },
    ConfigDef {
        name: "delete.retention.ms",
        default: "86400000",
        kind: ConfigType::Long,
        doc: "How long tombstones are kept on compacted topics",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "flush.messages",
        default: "9223372036854775807",
        kind: ConfigType::Long,
        doc: "Force fsync after this many messages (acks=1 data)",
        one_of: &[],
        min: 1,
    },
    ConfigDef {
        name: "flush.ms",
        // Kafka leaves acks=0/1 data to the OS by default; kaas bounds how long it may stay
        // only in the page cache.
        default: "1000",
        kind: ConfigType::Long,
        doc: "Data written with acks=0/1 is fsynced within this many milliseconds (acks=all is fsynced before it is acknowledged)",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "index.interval.bytes",
        default: "4096",
        kind: ConfigType::Int,
        doc: "Bytes of log between entries of the sparse offset and time index",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "max.message.bytes",
        default: "1048588",
        kind: ConfigType::Int,
        doc: "Largest record batch accepted",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "message.timestamp.type",
        default: "CreateTime",
        kind: ConfigType::String,
        doc: "CreateTime or LogAppendTime",
        one_of: &["CreateTime", "LogAppendTime"],
        min: 0,
    },
    ConfigDef {
        name: "min.cleanable.dirty.ratio",
        default: "0.5",
        kind: ConfigType::Double,
        doc: "Dirty ratio that triggers compaction",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "min.compaction.lag.ms",
        default: "0",
        kind: ConfigType::Long,
        doc: "Minimum age before a record may be compacted",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "min.insync.replicas",
        default: "1",
        kind: ConfigType::Int,
        doc: "Accepted for compatibility; kaas keeps one copy on shared storage",
        one_of: &[],
        min: 1,
    },
    ConfigDef {
        name: "retention.bytes",
        default: "-1",
        kind: ConfigType::Long,
        doc: "Maximum partition size before old segments are deleted",
        one_of: &[],
        min: -1,
    },
    ConfigDef {
        name: "retention.ms",
        default: "604800000",
        kind: ConfigType::Long,
        doc: "Maximum age before old segments are deleted",
        one_of: &[],
        min: -1,
    },
    ConfigDef {
        name: "segment.bytes",
        default: "1073741824",
        kind: ConfigType::Int,
        doc: "Segment file size",
        one_of: &[],
        // Kafka 4's minimum (KIP-1030): each segment holds a file descriptor while its log is
        // open, and 100-byte segments ran a broker out of them within a minute of produce.
        min: 1024 * 1024,
    },
    ConfigDef {
        name: "segment.ms",
        default: "604800000",
        kind: ConfigType::Long,
        doc: "Roll a segment after this long",
        one_of: &[],
        min: 1,
    },
    ConfigDef {
        name: "unclean.leader.election.enable",
        default: "false",
        kind: ConfigType::Boolean,
        doc: "Accepted for compatibility",
        one_of: &[],
        min: 0,
    },
    // Kafka's other topic configs: accepted so that every tool and client that sets them
    // works, documented as having no effect (DescribeConfigs shows the doc).
    ConfigDef {
        name: "compression.gzip.level",
        default: "-1",
        kind: ConfigType::Int,
        doc: "Accepted, no effect: a batch recompressed for compression.type uses the codec's default level",
        one_of: &[],
        min: -1,
    },
    ConfigDef {
        name: "compression.lz4.level",
        default: "9",
        kind: ConfigType::Int,
        doc: "Accepted, no effect: a batch recompressed for compression.type uses the codec's default level",
        one_of: &[],
        min: 1,
    },
    ConfigDef {
        name: "compression.zstd.level",
        default: "3",
        kind: ConfigType::Int,
        doc: "Accepted, no effect: a batch recompressed for compression.type uses the codec's default level",
        one_of: &[],
        min: -131072,
    },
    ConfigDef {
        name: "errors.deadletterqueue.group.enable",
        default: "false",
        kind: ConfigType::Boolean,
        doc: "Accepted, no effect: kaas serves no Kafka Streams groups, whose dead-letter queues this enables",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "file.delete.delay.ms",
        default: "60000",
        kind: ConfigType::Long,
        doc: "Accepted, no effect: kaas unlinks deleted segments at once (open fetches keep their mapping)",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "follower.replication.throttled.replicas",
        default: "",
        kind: ConfigType::List,
        doc: "Accepted, no effect: kaas keeps one copy on a shared volume, there are no followers",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "leader.replication.throttled.replicas",
        default: "",
        kind: ConfigType::List,
        doc: "Accepted, no effect: kaas keeps one copy on a shared volume, there are no followers",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "local.retention.bytes",
        default: "-2",
        kind: ConfigType::Long,
        doc: "Accepted, no effect: kaas has no tiered storage",
        one_of: &[],
        min: -2,
    },
    ConfigDef {
        name: "local.retention.ms",
        default: "-2",
        kind: ConfigType::Long,
        doc: "Accepted, no effect: kaas has no tiered storage",
        one_of: &[],
        min: -2,
    },
    ConfigDef {
        name: "max.compaction.lag.ms",
        default: "9223372036854775807",
        kind: ConfigType::Long,
        doc: "Accepted, no effect: compaction runs on the dirty ratio and min.compaction.lag.ms",
        one_of: &[],
        min: 1,
    },
    ConfigDef {
        name: "max.decompressed.message.bytes",
        default: "2147483639",
        kind: ConfigType::Int,
        doc: "Accepted, no effect: kaas stores batches as sent and does not bound their decompressed size",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "message.timestamp.after.max.ms",
        // Kafka 4's default (KIP-1030): a producer clock an hour ahead is refused, not
        // stored where it would hold back time-based retention and ListOffsets by time.
        default: "3600000",
        kind: ConfigType::Long,
        doc: "A batch whose newest CreateTime is more than this far ahead of the broker's clock is refused with INVALID_TIMESTAMP",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "message.timestamp.before.max.ms",
        default: "9223372036854775807",
        kind: ConfigType::Long,
        doc: "A batch whose first CreateTime is more than this far behind the broker's clock is refused with INVALID_TIMESTAMP",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "preallocate",
        default: "false",
        kind: ConfigType::Boolean,
        doc: "Accepted, no effect: --sync-scope decides how segments are preallocated",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "remote.copy.lag.bytes",
        default: "-1",
        kind: ConfigType::Long,
        doc: "Accepted, no effect: kaas has no tiered storage",
        one_of: &[],
        min: -1,
    },
    ConfigDef {
        name: "remote.copy.lag.ms",
        default: "0",
        kind: ConfigType::Long,
        doc: "Accepted, no effect: kaas has no tiered storage",
        one_of: &[],
        min: -1,
    },
    ConfigDef {
        name: "remote.log.copy.disable",
        default: "false",
        kind: ConfigType::Boolean,
        doc: "Accepted, no effect: kaas has no tiered storage",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "remote.log.delete.on.disable",
        default: "false",
        kind: ConfigType::Boolean,
        doc: "Accepted, no effect: kaas has no tiered storage",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "remote.storage.enable",
        default: "false",
        kind: ConfigType::Boolean,
        doc: "Accepted, no effect: kaas has no tiered storage",
        one_of: &[],
        min: 0,
    },
    ConfigDef {
        name: "segment.index.bytes",
        default: "10485760",
        kind: ConfigType::Int,
        doc: "Accepted, no effect: kaas sizes its sparse index by index.interval.bytes",
        one_of: &[],
        min: 4,
    },
    ConfigDef {
        name: "segment.jitter.ms",
        default: "0",
        kind: ConfigType::Long,
        doc: "Accepted, no effect: segments roll at segment.ms exactly",
        one_of: &[],
        min: 0,
    },
];

/// Configs Kafka defines as internal: accepted and stored, never listed among a topic's
/// configs (CreateTopics' answer, DescribeConfigs of every config).
pub const INTERNAL_CONFIGS: &[ConfigDef] = &[ConfigDef {
    name: "internal.segment.bytes",
    default: "",
    kind: ConfigType::Int,
    doc: "segment.bytes below its 1 MiB minimum, for tests only (Kafka's own name for it)",
    one_of: &[],
    min: 14,
}];

pub fn lookup(name: &str) -> Option<&'static ConfigDef> {
    TOPIC_CONFIGS
        .iter()
        .chain(INTERNAL_CONFIGS)
        .find(|d| d.name == name)
}

/// Topic configs Kafka 4.0 removed (KIP-724 and the message format v0/v1 removal): refused in
/// a new setting as Kafka 4 refuses them. A topic that already has one (set through an earlier
/// kaas) keeps working, and drops it at its next config change (`Catalog::set_topic_configs`).
pub const REMOVED_IN_KAFKA_4: &[&str] = &[
    "message.downconversion.enable",
    "message.timestamp.difference.max.ms",
];

/// Why a config value was refused (becomes INVALID_CONFIG with this message).
pub fn validate(name: &str, value: &str) -> Result<(), String> {
    if REMOVED_IN_KAFKA_4.contains(&name) {
        return Err(format!(
            "Unknown topic config name: {name} (Kafka 4.0 removed it; kaas follows Kafka 4)"
        ));
    }
    let def = lookup(name).ok_or_else(|| format!("Unknown topic config name: {name}"))?;
    match def.kind {
        ConfigType::Int | ConfigType::Long => {
            let v: i64 = value.parse().map_err(|_| {
                format!("Invalid value {value} for configuration {name}: not a number")
            })?;
            if def.kind == ConfigType::Int && i32::try_from(v).is_err() {
                return Err(format!(
                    "Invalid value {value} for configuration {name}: out of range for an int"
                ));
            }
            if v < def.min {
                return Err(format!(
                    "Invalid value {value} for configuration {name}: must be at least {}",
                    def.min
                ));
            }
        }
        ConfigType::Double => {
            let v = value.parse::<f64>().map_err(|_| {
                format!("Invalid value {value} for configuration {name}: not a number")
            })?;
            // The one double Kafka has here is a ratio.
            if !(0.0..=1.0).contains(&v) {
                return Err(format!(
                    "Invalid value {value} for configuration {name}: Value must be in [0,1]"
                ));
            }
        }
        ConfigType::Boolean => {
            if !matches!(value, "true" | "false") {
                return Err(format!(
                    "Invalid value {value} for configuration {name}: expected true or false"
                ));
            }
        }
        ConfigType::String | ConfigType::List | ConfigType::Password => {
            if !def.one_of.is_empty() && !def.one_of.contains(&value) {
                return Err(format!(
                    "Invalid value {value} for configuration {name}: expected one of {:?}",
                    def.one_of
                ));
            }
        }
    }
    Ok(())
}

/// Broker configs (Kafka's names) that set the default of a topic config, as
/// `kafka-configs --entity-type brokers --entity-default --alter` does in Kafka.
pub const BROKER_DEFAULTS: &[(&str, &str)] = &[
    ("log.retention.ms", "retention.ms"),
    ("log.retention.bytes", "retention.bytes"),
    ("log.segment.bytes", "segment.bytes"),
    ("log.roll.ms", "segment.ms"),
    ("log.cleanup.policy", "cleanup.policy"),
    ("message.max.bytes", "max.message.bytes"),
    ("log.flush.interval.ms", "flush.ms"),
    ("log.flush.interval.messages", "flush.messages"),
    ("compression.type", "compression.type"),
    ("log.cleaner.delete.retention.ms", "delete.retention.ms"),
    ("log.cleaner.min.compaction.lag.ms", "min.compaction.lag.ms"),
    (
        "log.cleaner.min.cleanable.ratio",
        "min.cleanable.dirty.ratio",
    ),
    ("log.index.interval.bytes", "index.interval.bytes"),
    // Kafka's other dynamic broker configs that set a topic config's default. Of these, only
    // `log.message.timestamp.type` (and the timestamp bounds) change what kaas does.
    ("compression.gzip.level", "compression.gzip.level"),
    ("compression.lz4.level", "compression.lz4.level"),
    ("compression.zstd.level", "compression.zstd.level"),
    ("log.segment.delete.delay.ms", "file.delete.delay.ms"),
    ("log.local.retention.bytes", "local.retention.bytes"),
    ("log.local.retention.ms", "local.retention.ms"),
    ("log.cleaner.max.compaction.lag.ms", "max.compaction.lag.ms"),
    (
        "max.decompressed.message.bytes",
        "max.decompressed.message.bytes",
    ),
    (
        "log.message.timestamp.after.max.ms",
        "message.timestamp.after.max.ms",
    ),
    (
        "log.message.timestamp.before.max.ms",
        "message.timestamp.before.max.ms",
    ),
    ("log.message.timestamp.type", "message.timestamp.type"),
    ("min.insync.replicas", "min.insync.replicas"),
    ("log.preallocate", "preallocate"),
    ("log.remote.copy.lag.bytes", "remote.copy.lag.bytes"),
    ("log.remote.copy.lag.ms", "remote.copy.lag.ms"),
    ("log.index.size.max.bytes", "segment.index.bytes"),
    (
        "unclean.leader.election.enable",
        "unclean.leader.election.enable",
    ),
];

/// The topic config a dynamic broker config sets the default of.
pub fn topic_key_for_broker(name: &str) -> Option<&'static str> {
    BROKER_DEFAULTS
        .iter()
        .find(|(b, _)| *b == name)
        .map(|(_, t)| *t)
}

/// The broker config that sets the default of topic config `name` (`log.retention.ms` for
/// `retention.ms`), if one does.
pub fn broker_key_for_topic(name: &str) -> Option<&'static str> {
    BROKER_DEFAULTS
        .iter()
        .find(|(_, t)| *t == name)
        .map(|(b, _)| *b)
}

/// Kafka's other dynamic broker configs (its `DynamicBrokerConfig`): security, thread pools,
/// connection quotas, the log cleaner, metric reporters, replication throttles. kaas has no
/// equivalent of them (no SASL or SSL listener, no thread pools, no replicas: the
/// connection limits are [`CONNECTION_LIMITS`]), so it accepts and stores them as Kafka does,
/// for the tools and tests that set them (librdkafka's 0081 sets
/// `sasl.kerberos.min.time.before.relogin`), DescribeConfigs reports them, and they change
/// nothing. Refusing them made `kafka-configs --alter` scripts written for Kafka fail.
/// With [`BROKER_DEFAULTS`] and [`CONNECTION_LIMITS`] this covers every broker config Kafka
/// 4.4's DescribeConfigs reports as not read-only.
/// (name, type, Kafka 4.4's default: what DescribeConfigs reports while none is set).
pub const BROKER_ACCEPTED_WITHOUT_EFFECT: &[(&str, ConfigType, Option<&str>)] = &[
    ("background.threads", ConfigType::Int, Some("10")),
    ("config.providers", ConfigType::List, Some("")),
    ("cordoned.log.dirs", ConfigType::List, Some("")),
    (
        "errors.deadletterqueue.auto.create.topics.enable",
        ConfigType::Boolean,
        Some("false"),
    ),
    (
        "errors.deadletterqueue.topic.name.prefix",
        ConfigType::String,
        Some("dlq."),
    ),
    (
        "follower.fetch.last.tiered.offset.enable",
        ConfigType::Boolean,
        Some("false"),
    ),
    (
        "follower.replication.throttled.rate",
        ConfigType::Long,
        Some("9223372036854775807"),
    ),
    (
        "group.consumer.assignment.interval.ms",
        ConfigType::Int,
        Some("1000"),
    ),
    (
        "group.coordinator.cached.buffer.max.bytes",
        ConfigType::Int,
        Some("1048588"),
    ),
    (
        "group.share.assignment.interval.ms",
        ConfigType::Int,
        Some("1000"),
    ),
    (
        "group.streams.assignment.interval.ms",
        ConfigType::Int,
        Some("1000"),
    ),
    (
        "leader.replication.throttled.rate",
        ConfigType::Long,
        Some("9223372036854775807"),
    ),
    (
        "listener.security.protocol.map",
        ConfigType::String,
        Some("PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"),
    ),
    ("listeners", ConfigType::String, Some("PLAINTEXT://:9092")),
    ("log.cleaner.backoff.ms", ConfigType::Long, Some("15000")),
    (
        "log.cleaner.dedupe.buffer.size",
        ConfigType::Long,
        Some("134217728"),
    ),
    (
        "log.cleaner.io.buffer.load.factor",
        ConfigType::Double,
        Some("0.9"),
    ),
    (
        "log.cleaner.io.buffer.size",
        ConfigType::Int,
        Some("524288"),
    ),
    (
        "log.cleaner.io.max.bytes.per.second",
        ConfigType::Double,
        Some("1.7976931348623157E308"),
    ),
    ("log.cleaner.threads", ConfigType::Int, Some("1")),
    ("log.roll.jitter.ms", ConfigType::Long, None),
    (
        "max.connection.creation.rate",
        ConfigType::Int,
        Some("2147483647"),
    ),
    (
        "max.connections.per.ip.overrides",
        ConfigType::String,
        Some(""),
    ),
    (
        "metric.reporters",
        ConfigType::List,
        Some("org.apache.kafka.common.metrics.JmxReporter"),
    ),
    ("num.io.threads", ConfigType::Int, Some("8")),
    ("num.network.threads", ConfigType::Int, Some("3")),
    (
        "num.recovery.threads.per.data.dir",
        ConfigType::Int,
        Some("2"),
    ),
    ("num.replica.fetchers", ConfigType::Int, Some("1")),
    (
        "principal.builder.class",
        ConfigType::String,
        Some("org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder"),
    ),
    (
        "producer.id.expiration.ms",
        ConfigType::Int,
        Some("86400000"),
    ),
    ("remote.fetch.max.wait.ms", ConfigType::Int, Some("500")),
    (
        "remote.list.offsets.request.timeout.ms",
        ConfigType::Long,
        Some("30000"),
    ),
    (
        "remote.log.index.file.cache.total.size.bytes",
        ConfigType::Long,
        Some("1073741824"),
    ),
    (
        "remote.log.manager.copier.thread.pool.size",
        ConfigType::Int,
        Some("10"),
    ),
    (
        "remote.log.manager.copy.max.bytes.per.second",
        ConfigType::Long,
        Some("9223372036854775807"),
    ),
    (
        "remote.log.manager.expiration.thread.pool.size",
        ConfigType::Int,
        Some("10"),
    ),
    (
        "remote.log.manager.fetch.max.bytes.per.second",
        ConfigType::Long,
        Some("9223372036854775807"),
    ),
    (
        "remote.log.manager.follower.thread.pool.size",
        ConfigType::Int,
        Some("2"),
    ),
    ("remote.log.reader.threads", ConfigType::Int, Some("10")),
    (
        "replica.alter.log.dirs.io.max.bytes.per.second",
        ConfigType::Long,
        Some("9223372036854775807"),
    ),
    ("sasl.enabled.mechanisms", ConfigType::List, Some("GSSAPI")),
    ("sasl.jaas.config", ConfigType::Password, None),
    (
        "sasl.kerberos.kinit.cmd",
        ConfigType::String,
        Some("/usr/bin/kinit"),
    ),
    (
        "sasl.kerberos.min.time.before.relogin",
        ConfigType::Long,
        Some("60000"),
    ),
    (
        "sasl.kerberos.principal.to.local.rules",
        ConfigType::List,
        Some("DEFAULT"),
    ),
    ("sasl.kerberos.service.name", ConfigType::String, None),
    (
        "sasl.kerberos.ticket.renew.jitter",
        ConfigType::Double,
        Some("0.05"),
    ),
    (
        "sasl.kerberos.ticket.renew.window.factor",
        ConfigType::Double,
        Some("0.8"),
    ),
    (
        "sasl.login.refresh.buffer.seconds",
        ConfigType::Int,
        Some("300"),
    ),
    (
        "sasl.login.refresh.min.period.seconds",
        ConfigType::Int,
        Some("60"),
    ),
    (
        "sasl.login.refresh.window.factor",
        ConfigType::Double,
        Some("0.8"),
    ),
    (
        "sasl.login.refresh.window.jitter",
        ConfigType::Double,
        Some("0.05"),
    ),
    (
        "sasl.mechanism.inter.broker.protocol",
        ConfigType::String,
        Some("GSSAPI"),
    ),
    (
        "share.coordinator.cached.buffer.max.bytes",
        ConfigType::Int,
        Some("1048588"),
    ),
    ("ssl.cipher.suites", ConfigType::List, None),
    ("ssl.client.auth", ConfigType::String, Some("none")),
    (
        "ssl.enabled.protocols",
        ConfigType::List,
        Some("TLSv1.2,TLSv1.3"),
    ),
    (
        "ssl.endpoint.identification.algorithm",
        ConfigType::String,
        Some("https"),
    ),
    ("ssl.engine.factory.class", ConfigType::String, None),
    ("ssl.key.password", ConfigType::Password, None),
    (
        "ssl.keymanager.algorithm",
        ConfigType::String,
        Some("SunX509"),
    ),
    ("ssl.keystore.certificate.chain", ConfigType::String, None),
    ("ssl.keystore.key", ConfigType::Password, None),
    ("ssl.keystore.location", ConfigType::String, None),
    ("ssl.keystore.password", ConfigType::Password, None),
    ("ssl.keystore.type", ConfigType::String, Some("JKS")),
    ("ssl.protocol", ConfigType::String, Some("TLSv1.3")),
    ("ssl.provider", ConfigType::String, None),
    ("ssl.secure.random.implementation", ConfigType::String, None),
    (
        "ssl.trustmanager.algorithm",
        ConfigType::String,
        Some("PKIX"),
    ),
    ("ssl.truststore.certificates", ConfigType::String, None),
    ("ssl.truststore.location", ConfigType::String, None),
    ("ssl.truststore.password", ConfigType::Password, None),
    ("ssl.truststore.type", ConfigType::String, Some("JKS")),
    (
        "transaction.partition.verification.enable",
        ConfigType::Boolean,
        Some("true"),
    ),
];

/// Kafka's dynamic connection limits, which kaas applies at run time in place of
/// `--max-connections` and `--max-connections-per-ip` (deleting one goes back to the flag).
pub const CONNECTION_LIMITS: [&str; 2] = ["max.connections", "max.connections.per.ip"];

/// The dynamic (`max.connections`, `max.connections.per.ip`) set in `broker`, if any.
pub fn connection_limits(broker: &BTreeMap<String, String>) -> (Option<usize>, Option<usize>) {
    let get = |k: &str| broker.get(k).and_then(|v| v.parse::<usize>().ok());
    (get(CONNECTION_LIMITS[0]), get(CONNECTION_LIMITS[1]))
}

/// The type of a dynamic broker config kaas accepts without effect, if `name` is one.
pub fn accepted_without_effect(name: &str) -> Option<ConfigType> {
    BROKER_ACCEPTED_WITHOUT_EFFECT
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, k, _)| *k)
}

/// Validates a dynamic broker config: one that sets a topic default by that topic config's
/// rules, one accepted without effect by its type.
pub fn validate_broker(name: &str, value: &str) -> Result<(), String> {
    if let Some(kind) = accepted_without_effect(name) {
        return validate_type(name, value, kind);
    }
    if CONNECTION_LIMITS.contains(&name) {
        return match value.parse::<i32>() {
            Ok(n) if n >= 1 => Ok(()),
            _ => Err(format!(
                "Invalid value {value} for configuration {name}: expected an int of at least 1"
            )),
        };
    }
    let topic_key = topic_key_for_broker(name).ok_or_else(|| {
        format!("Unknown broker config {name}: kaas changes topic defaults ({}) and the connection limits at run time, and accepts Kafka's other dynamic broker configs without effect", BROKER_DEFAULTS.iter().map(|(b, _)| *b).collect::<Vec<_>>().join(", "))
    })?;
    validate(topic_key, value).map_err(|e| e.replace(topic_key, name))
}

/// Whether kaas knows dynamic broker config `name`: one that sets a topic default, a
/// connection limit, or one of Kafka's it accepts without effect.
pub fn is_known_broker_config(name: &str) -> bool {
    topic_key_for_broker(name).is_some()
        || CONNECTION_LIMITS.contains(&name)
        || accepted_without_effect(name).is_some()
}

/// Validates a config set through AlterConfigs or IncrementalAlterConfigs: one kaas knows
/// by [`validate_broker`]; one Kafka defines but cannot change at run time is refused by the
/// caller (`kafka_static_broker_configs`, INVALID_REQUEST); any other name is accepted, as
/// Kafka accepts and stores a name it does not define (and describes it back as sensitive,
/// without its value). Refusing such names failed KafkaJS's "alter broker configs" test,
/// which sets `cleanup.policy` on a broker.
pub fn validate_dynamic_broker(name: &str, value: &str) -> Result<(), String> {
    if is_known_broker_config(name) {
        validate_broker(name, value)
    } else {
        Ok(())
    }
}

/// A value's syntax by its type alone (no ranges: Kafka's own ranges for the settings kaas
/// accepts without effect do not matter here).
fn validate_type(name: &str, value: &str, kind: ConfigType) -> Result<(), String> {
    let ok = match kind {
        ConfigType::Int => value.parse::<i32>().is_ok(),
        ConfigType::Long => value.parse::<i64>().is_ok(),
        ConfigType::Double => value.parse::<f64>().is_ok(),
        ConfigType::Boolean => matches!(value, "true" | "false"),
        ConfigType::String | ConfigType::List | ConfigType::Password => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "Invalid value {value} for configuration {name}: expected {}",
            match kind {
                ConfigType::Int => "an int",
                ConfigType::Long => "a long",
                ConfigType::Double => "a number",
                _ => "true or false",
            }
        ))
    }
}

/// Where a topic config's effective value comes from (DescribeConfigs `config_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Topic = 1,
    /// This broker's own dynamic config (`kafka-configs --entity-name <id>`).
    DynamicBroker = 2,
    DynamicBrokerDefault = 3,
    /// `--broker-config` at start (Kafka's server.properties).
    StaticBroker = 4,
    Default = 5,
}

/// The broker's layers of topic defaults, highest first: its own dynamic configs, the
/// cluster-wide dynamic defaults, its static configs (`--broker-config`).
pub struct BrokerLayers<'a> {
    pub own: &'a BTreeMap<String, String>,
    pub default: &'a BTreeMap<String, String>,
    pub static_: &'a BTreeMap<String, String>,
}

/// As [`resolve`], through every broker layer, as Kafka layers them: the topic's override,
/// this broker's dynamic config, the cluster-wide dynamic default, the static config, the
/// built-in default; each reported with its source.
pub fn resolve_layered<'a>(
    topic: &'a BTreeMap<String, String>,
    broker: &BrokerLayers<'a>,
    name: &'a str,
) -> Option<(&'a str, Source)> {
    set_layers(topic, broker, name)
        .into_iter()
        .next()
        .map(|(_, v, source)| (v, source))
        .or_else(|| lookup(name).map(|d| (d.default, Source::Default)))
}

/// Every layer that sets topic config `name`, highest first, as DescribeConfigs lists its
/// synonyms: the topic's own value, then the broker config of each broker layer that has one,
/// then the built-in default under the name Kafka lists it by ([`default_synonym`]).
pub fn synonyms<'a>(
    topic: &'a BTreeMap<String, String>,
    broker: &BrokerLayers<'a>,
    name: &'a str,
) -> Vec<(&'a str, &'a str, Source)> {
    let mut out = set_layers(topic, broker, name);
    if let (Some(d), Some(listed_as)) = (lookup(name), default_synonym(name)) {
        out.push((listed_as, d.default, Source::Default));
    }
    out
}

/// The layers that set topic config `name`, highest first, without the built-in default.
fn set_layers<'a>(
    topic: &'a BTreeMap<String, String>,
    broker: &BrokerLayers<'a>,
    name: &'a str,
) -> Vec<(&'a str, &'a str, Source)> {
    let mut out = Vec::new();
    if let Some(v) = topic.get(name) {
        out.push((name, v.as_str(), Source::Topic));
    }
    if let Some(b) = broker_key_for_topic(name) {
        for (layer, source) in [
            (broker.own, Source::DynamicBroker),
            (broker.default, Source::DynamicBrokerDefault),
            (broker.static_, Source::StaticBroker),
        ] {
            if let Some(v) = layer.get(b) {
                out.push((b, v.as_str(), source));
            }
        }
    }
    out
}

/// The name under which DescribeConfigs lists topic config `name`'s built-in default among
/// its synonyms, as Kafka 4.4 does: the broker config that sets that default, or none.
/// `retention.ms` and `segment.ms` have none: Kafka's `log.retention.ms` and `log.roll.ms` have
/// no default of their own (they fall back to their `.hours` forms), and clients compare
/// (KafkaJS's DescribeConfigs test). Nor do the configs no broker config sets
/// (`segment.jitter.ms`, `remote.storage.enable`, ...).
pub fn default_synonym(name: &str) -> Option<&'static str> {
    if matches!(name, "retention.ms" | "segment.ms") {
        return None;
    }
    broker_key_for_topic(name)
}

/// The effective value of topic config `name`: the topic's override, else the broker's
/// dynamic default for it, else the built-in default.
pub fn resolve<'a>(
    topic: &'a BTreeMap<String, String>,
    broker: &'a BTreeMap<String, String>,
    name: &str,
) -> Option<(&'a str, Source)> {
    if let Some(v) = topic.get(name) {
        return Some((v.as_str(), Source::Topic));
    }
    if let Some(b) = broker_key_for_topic(name) {
        if let Some(v) = broker.get(b) {
            return Some((v.as_str(), Source::DynamicBrokerDefault));
        }
    }
    lookup(name).map(|d| (d.default, Source::Default))
}

/// The effective value of `name` for a topic with overrides `overrides`.
pub fn effective<'a>(overrides: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    overrides
        .get(name)
        .map(|s| s.as_str())
        .or_else(|| lookup(name).map(|d| d.default))
}

/// The log engine settings a topic's configs imply, with the broker's dynamic defaults.
pub fn log_config(
    topic: &BTreeMap<String, String>,
    broker: &BTreeMap<String, String>,
) -> LogConfig {
    let get = |name: &str| resolve(topic, broker, name).map(|(v, _)| v).unwrap_or("");
    let number = |name: &str| get(name).parse::<i64>().unwrap_or(0);
    let policy = get("cleanup.policy");
    LogConfig {
        segment_bytes: topic
            .get("internal.segment.bytes")
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or_else(|| number("segment.bytes"))
            .max(14) as u64,
        segment_ms: number("segment.ms").max(1) as u64,
        retention_ms: number("retention.ms"),
        retention_bytes: number("retention.bytes"),
        delete_enabled: policy.split(',').any(|p| p.trim() == "delete"),
        compact_enabled: policy.split(',').any(|p| p.trim() == "compact"),
        delete_retention_ms: number("delete.retention.ms"),
        min_compaction_lag_ms: number("min.compaction.lag.ms"),
        flush_ms: number("flush.ms").max(0) as u64,
        flush_messages: number("flush.messages").max(1) as u64,
        min_cleanable_dirty_ratio: get("min.cleanable.dirty.ratio")
            .parse::<f64>()
            .unwrap_or(0.5)
            .clamp(0.0, 1.0),
        index_interval_bytes: number("index.interval.bytes").max(0) as u64,
        ..LogConfig::default()
    }
}

/// What a topic's configs ask of every produced batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceRules {
    /// The largest batch accepted (`max.message.bytes`).
    pub max_batch_bytes: usize,
    /// `cleanup.policy` includes `compact`: every record needs a key.
    pub keys_required: bool,
    /// `message.timestamp.type=LogAppendTime`: the broker stamps its time.
    pub log_append_time: bool,
    /// With CreateTime, how far (ms) a batch's timestamps may lie behind and ahead of the
    /// broker's clock (`message.timestamp.before.max.ms`, `message.timestamp.after.max.ms`).
    pub create_time_window: Option<(i64, i64)>,
    /// `compression.type`: the codec stored batches have.
    pub compression: kaas_storage::StoredCompression,
}

/// The produce-time rules of a topic with overrides `topic`, over the broker's defaults.
pub fn produce_rules(
    topic: &BTreeMap<String, String>,
    broker: &BTreeMap<String, String>,
) -> ProduceRules {
    let get = |name: &str| resolve(topic, broker, name).map(|(v, _)| v).unwrap_or("");
    let log_append_time = get("message.timestamp.type") == "LogAppendTime";
    ProduceRules {
        max_batch_bytes: max_message_bytes(topic, broker),
        keys_required: get("cleanup.policy")
            .split(',')
            .any(|p| p.trim() == "compact"),
        log_append_time,
        compression: stored_compression(get("compression.type")),
        create_time_window: (!log_append_time).then(|| {
            let ms = |name: &str| get(name).parse::<i64>().unwrap_or(i64::MAX).max(0);
            (
                ms("message.timestamp.before.max.ms"),
                ms("message.timestamp.after.max.ms"),
            )
        }),
    }
}

/// `compression.type` as the append applies it (anything else is refused when set).
fn stored_compression(value: &str) -> kaas_storage::StoredCompression {
    use kaas_storage::{Codec, StoredCompression as S};
    match value {
        "uncompressed" => S::Uncompressed,
        "gzip" => S::With(Codec::Gzip),
        "snappy" => S::With(Codec::Snappy),
        "lz4" => S::With(Codec::Lz4),
        "zstd" => S::With(Codec::Zstd),
        _ => S::AsProduced,
    }
}

/// `max.message.bytes` for the topic.
pub fn max_message_bytes(
    topic: &BTreeMap<String, String>,
    broker: &BTreeMap<String, String>,
) -> usize {
    resolve(topic, broker, "max.message.bytes")
        .and_then(|(v, _)| v.parse::<i64>().ok())
        .unwrap_or(0)
        .max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    // Kafka's layering: the topic's own value, then this broker's dynamic config, then the
    // dynamic broker default, then the static one (server.properties here: --broker-config),
    // then the built-in default; each reported with its source.
    #[test]
    fn static_broker_configs_sit_beneath_the_dynamic_ones() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let none = map(&[]);
        let statics = map(&[("log.retention.ms", "1000"), ("log.segment.bytes", "2000")]);
        let dynamic = map(&[("log.retention.ms", "3000")]);
        let topic = map(&[("segment.bytes", "4000")]);
        let got = |t, d, name| {
            let layers = BrokerLayers {
                own: &none,
                default: d,
                static_: &statics,
            };
            resolve_layered(t, &layers, name)
        };
        assert_eq!(
            got(&none, &none, "retention.ms"),
            Some(("1000", Source::StaticBroker))
        );
        let own = map(&[("log.retention.ms", "5000")]);
        let layers = BrokerLayers {
            own: &own,
            default: &dynamic,
            static_: &statics,
        };
        assert_eq!(
            resolve_layered(&none, &layers, "retention.ms"),
            Some(("5000", Source::DynamicBroker))
        );
        let topic_retention = map(&[("retention.ms", "6000")]);
        let listed: Vec<(&str, &str, Source)> = synonyms(&topic_retention, &layers, "retention.ms");
        assert_eq!(
            listed,
            vec![
                ("retention.ms", "6000", Source::Topic),
                ("log.retention.ms", "5000", Source::DynamicBroker),
                ("log.retention.ms", "3000", Source::DynamicBrokerDefault),
                ("log.retention.ms", "1000", Source::StaticBroker),
            ],
            "every layer, highest first: the first is the effective value; Kafka's \
             log.retention.ms has no default of its own to list"
        );
        assert_eq!(
            got(&none, &none, "retention.ms"),
            Some(("1000", Source::StaticBroker))
        );

        assert_eq!(
            synonyms(&none, &layers, "cleanup.policy"),
            vec![("log.cleanup.policy", "delete", Source::Default)]
        );
        assert_eq!(
            got(&none, &dynamic, "retention.ms"),
            Some(("3000", Source::DynamicBrokerDefault))
        );
        assert_eq!(
            got(&topic, &dynamic, "segment.bytes"),
            Some(("4000", Source::Topic))
        );
        assert_eq!(
            got(&none, &dynamic, "segment.bytes"),
            Some(("2000", Source::StaticBroker))
        );
        assert_eq!(
            got(&none, &none, "cleanup.policy").map(|(_, s)| s),
            Some(Source::Default)
        );
    }

    // A built-in default is listed among the synonyms under Kafka's name for it, or not at
    // all where Kafka lists none; it resolves either way.
    #[test]
    fn defaults_are_listed_as_kafka_lists_them() {
        let none = BTreeMap::new();
        let bare = BrokerLayers {
            own: &none,
            default: &none,
            static_: &none,
        };
        assert_eq!(
            resolve_layered(&none, &bare, "retention.ms"),
            Some(("604800000", Source::Default)),
            "the built-in default resolves although it is not listed"
        );
        assert!(synonyms(&none, &bare, "retention.ms").is_empty());
        assert_eq!(
            synonyms(&none, &bare, "file.delete.delay.ms"),
            vec![("log.segment.delete.delay.ms", "60000", Source::Default)],
            "named as Kafka names it"
        );
        assert!(synonyms(&none, &bare, "segment.jitter.ms").is_empty());
        for (broker, topic) in BROKER_DEFAULTS {
            assert!(
                lookup(topic).is_some(),
                "{broker} sets {topic}, which is not a topic config kaas knows"
            );
        }
    }

    // Every default validates against its own definition.
    #[test]
    fn defaults_are_valid() {
        for d in TOPIC_CONFIGS {
            validate(d.name, d.default).unwrap_or_else(|e| panic!("{}: {e}", d.name));
        }
    }

    // Unknown names, bad numbers and bad enumerations are refused with a reason.
    #[test]
    fn refusals() {
        assert!(validate("no.such.config", "1").is_err());
        assert!(validate("retention.ms", "soon").is_err());
        assert!(validate("segment.bytes", "3").is_err());
        // Kafka 4's minimum; below it only under the internal name tests use.
        assert!(validate("segment.bytes", "1048575").is_err());
        assert!(validate("segment.bytes", "1048576").is_ok());
        assert!(validate("internal.segment.bytes", "100").is_ok());
        let internal = BTreeMap::from([("internal.segment.bytes".into(), "100".into())]);
        assert_eq!(log_config(&internal, &BTreeMap::new()).segment_bytes, 100);
        assert!(validate("cleanup.policy", "shred").is_err());
        assert!(validate("cleanup.policy", "compact").is_ok());
    }
}
