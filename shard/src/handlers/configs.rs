//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics and the broker.
//!
//! Topic configs use Kafka's names and defaults (`topic_config`). Broker settings from flags
//! and environment are reported read-only; the broker configs that set topic defaults
//! (`log.retention.ms`, `log.segment.bytes`, ... see `topic_config::BROKER_DEFAULTS`) can be
//! changed at run time and are stored with the topic catalog, as are `max.connections` and
//! `max.connections.per.ip`; Kafka's other dynamic broker configs are accepted and stored
//! without effect (`topic_config::BROKER_ACCEPTED_WITHOUT_EFFECT`). As in Kafka, a broker
//! config Kafka defines as static is refused (`kafka_static_broker_configs`), and a name Kafka
//! does not define is stored and described back as sensitive, without its value. A broker's own
//! dynamic configs (`--entity-name <id>`) sit above the cluster-wide ones (`--entity-default`),
//! which sit above the static ones (`--broker-config`).

use std::collections::BTreeMap;
use std::rc::Rc;

use kaas_wire::kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kaas_wire::kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest,
    AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kaas_wire::kafka_protocol::protocol::StrBytes;

use super::admin::{broadcast_topic_config, SOURCE_DEFAULT};
use crate::catalog::{BrokerScope, CatalogError};
use crate::errors;
use crate::groups::config::GROUP_SETTINGS;
use crate::shard::Shard;
use crate::topic_config::{self, ConfigType, TOPIC_CONFIGS};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const RESOURCE_GROUP: i8 = 32;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DYNAMIC_GROUP: i8 = 8;

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A config request naming topics another broker created moments ago waits for this broker
/// to know them, as Metadata does (`metadata::catch_up`); other resources need nothing.
async fn catch_up_on_topics<'a>(
    shard: &Shard,
    resources: impl Iterator<Item = (i8, &'a StrBytes)> + Clone,
) {
    let topics = resources.filter_map(|(kind, name)| (kind == RESOURCE_TOPIC).then_some(name));
    super::metadata::catch_up(shard, topics.map(|n| n.as_str())).await;
}

pub async fn describe_configs(
    shard: &Rc<Shard>,
    req: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let named = req
        .resources
        .iter()
        .map(|r| (r.resource_type, &r.resource_name));
    catch_up_on_topics(shard, named).await;
    let results = req
        .resources
        .iter()
        .map(|r| {
            let keys: Option<Vec<&str>> = r
                .configuration_keys
                .as_ref()
                .map(|k| k.iter().map(|x| x.as_str()).collect());
            let wanted = |name: &str| keys.as_ref().is_none_or(|k| k.contains(&name));
            let base = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let name = r.resource_name.as_str();
            let described = match r.resource_type {
                RESOURCE_TOPIC => describe_topic(shard, &req, name, &wanted),
                RESOURCE_BROKER => describe_broker(shard, &req, name, &wanted),
                RESOURCE_GROUP => Ok(describe_group(shard, &req, name, &wanted)),
                other => Err((
                    errors::INVALID_REQUEST,
                    format!("Resource type {other} is not supported"),
                )),
            };
            match described {
                Ok(mut configs) => {
                    // Named configs come back in the order asked for (Kafka's order is its
                    // hash map's; KafkaJS's createTopics test reads two by position).
                    if let Some(k) = &keys {
                        configs.sort_by_key(|c| k.iter().position(|n| *n == c.name.as_str()));
                    }
                    base.with_configs(configs)
                }
                Err((code, message)) => base
                    .with_error_code(code)
                    .with_error_message(Some(s(&message))),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

/// A topic's configs: each with its effective value and source, and (when asked) every layer
/// that sets it.
fn describe_topic(
    shard: &Shard,
    req: &DescribeConfigsRequest,
    topic: &str,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<DescribeConfigsResourceResult>, (i16, String)> {
    let snapshot = shard.catalog.snapshot();
    let Some(t) = snapshot.get(topic) else {
        // A name no topic can have is Kafka's INVALID_TOPIC_EXCEPTION, not "does not exist".
        if let Err(e) = crate::catalog::validate_topic_name(topic) {
            return Err((errors::catalog(&e), e.to_string()));
        }
        return Err((
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("Topic '{topic}' does not exist."),
        ));
    };
    let (own, default, static_) = (
        shard.catalog.own_broker_configs(),
        shard.catalog.broker_configs(),
        shard.catalog.static_broker_configs(),
    );
    let layers = topic_config::BrokerLayers {
        own: &own,
        default: &default,
        static_: &static_,
    };
    Ok(TOPIC_CONFIGS
        .iter()
        .filter(|d| wanted(d.name))
        .map(|d| {
            let (value, source) = topic_config::resolve_layered(&t.configs, &layers, d.name)
                .map(|(v, src)| (v, src as i8))
                .unwrap_or((d.default, SOURCE_DEFAULT));
            let e = entry(
                d.name,
                value,
                source,
                d.kind,
                false,
                req.include_documentation.then_some(d.doc),
            );
            // Asked for from v1 on, where the field exists.
            if !req.include_synonyms {
                return e;
            }
            e.with_synonyms(
                topic_config::synonyms(&t.configs, &layers, d.name)
                    .into_iter()
                    .map(|(n, v, src)| {
                        DescribeConfigsSynonym::default()
                            .with_name(s(n))
                            .with_value(Some(s(v)))
                            .with_source(src as i8)
                    })
                    .collect(),
            )
        })
        .collect())
}

/// The broker's configs. The default entity (an empty name) lists the cluster-wide dynamic
/// configs only, as Kafka does. This broker lists its own dynamic configs
/// (DYNAMIC_BROKER_CONFIG), the cluster-wide ones it does not override
/// (DYNAMIC_DEFAULT_BROKER_CONFIG), then its static settings.
fn describe_broker(
    shard: &Shard,
    req: &DescribeConfigsRequest,
    id: &str,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<DescribeConfigsResourceResult>, (i16, String)> {
    this_broker(shard, id)?;
    let own = shard.catalog.own_broker_configs();
    let default = shard.catalog.broker_configs();
    let static_ = shard.catalog.static_broker_configs();
    let layers: Vec<(&BTreeMap<String, String>, topic_config::Source)> = if id.is_empty() {
        vec![(&default, topic_config::Source::DynamicBrokerDefault)]
    } else {
        vec![
            (&own, topic_config::Source::DynamicBroker),
            (&default, topic_config::Source::DynamicBrokerDefault),
        ]
    };
    let mut listed = std::collections::BTreeSet::new();
    let mut configs = Vec::new();
    for (layer, source) in layers {
        let fresh: BTreeMap<String, String> = layer
            .iter()
            .filter(|(n, _)| wanted(n) && !listed.contains(n.as_str()))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        configs.extend(dynamic_entries(&fresh, source, req.include_documentation));
        listed.extend(fresh.into_keys());
    }
    if id.is_empty() {
        if req.include_synonyms {
            add_broker_synonyms(&mut configs, &default, None);
        }
        return Ok(configs);
    }
    let (flags, defaults) = (broker_configs(shard), broker_defaults(shard));
    let doc = |name: &str| broker_doc(req.include_documentation, name);
    // `--broker-config` at start, where no dynamic config replaces it.
    for (n, v) in static_.iter() {
        if wanted(n) && listed.insert(n.clone()) {
            configs.push(broker_entry(
                n,
                v,
                SOURCE_STATIC_BROKER,
                true,
                doc(n).as_deref(),
            ));
        }
    }
    for (n, v, k) in &flags {
        if wanted(n) && listed.insert(n.to_string()) {
            configs.push(entry(n, v, SOURCE_STATIC_BROKER, *k, true, None));
        }
    }
    // Everything else kaas knows at its default, as Kafka lists every broker config (most of
    // them DEFAULT_CONFIG): `kafka-configs --describe --all`, and tools that read one config
    // by name before they change it (sarama's suite reads `log.cleaner.backoff.ms`).
    for (n, v, source) in &defaults {
        if wanted(n) && listed.insert(n.to_string()) {
            let value = v.as_deref().unwrap_or("");
            let e = broker_entry(n, value, *source, false, doc(n).as_deref());
            // Kafka's null default has no value (a password has none already).
            configs.push(if v.is_none() { e.with_value(None) } else { e });
        }
    }
    if req.include_synonyms {
        let this = ThisBroker {
            own: &own,
            static_: &static_,
            flags: &flags,
            defaults: &defaults,
        };
        add_broker_synonyms(&mut configs, &default, Some(&this));
    }
    Ok(configs)
}

/// The layers of this broker's configs below the cluster-wide dynamic defaults, as
/// [`describe_broker`] lists them.
struct ThisBroker<'a> {
    own: &'a BTreeMap<String, String>,
    static_: &'a BTreeMap<String, String>,
    flags: &'a [(&'static str, String, ConfigType)],
    defaults: &'a [(&'static str, Option<String>, i8)],
}

/// Kafka's synonyms of each broker config entry (`ConfigHelper.configSynonyms`): every layer
/// that sets it, highest first (this broker's dynamic config, the cluster-wide dynamic
/// default, the static setting, the built-in default), a sensitive one without its value. The
/// default entity (`this` None) has only the cluster-wide layer, as in Kafka. Tools show the
/// chain to say where a value comes from (`kafka-configs --describe --all`); it was always
/// empty (found with KafkaJS).
fn add_broker_synonyms(
    configs: &mut [DescribeConfigsResourceResult],
    dynamic_default: &BTreeMap<String, String>,
    this: Option<&ThisBroker>,
) {
    use topic_config::Source;
    for e in configs {
        let name: &str = &e.name;
        let mut chain: Vec<(&str, &str, Source)> = Vec::new();
        let own = this.and_then(|b| b.own.get(name));
        chain.extend(own.map(|v| (name, v.as_str(), Source::DynamicBroker)));
        let cluster = dynamic_default.get(name);
        chain.extend(cluster.map(|v| (name, v.as_str(), Source::DynamicBrokerDefault)));
        if let Some(b) = this {
            let flag = || b.flags.iter().find(|(n, ..)| *n == name).map(|(_, v, _)| v);
            let static_ = b.static_.get(name).or_else(flag).or_else(|| {
                b.defaults
                    .iter()
                    .find(|(n, _, src)| *n == name && *src == SOURCE_STATIC_BROKER)
                    .and_then(|(_, v, _)| v.as_ref())
            });
            chain.extend(static_.map(|v| (name, v.as_str(), Source::StaticBroker)));
            let builtin = b
                .defaults
                .iter()
                .find(|(n, _, src)| *n == name && *src == SOURCE_DEFAULT)
                .and_then(|(_, v, _)| v.as_deref());
            let listed = match name {
                // No default of their own in Kafka: they fall back to their `.hours` forms,
                // which Kafka lists after the layers that set the config itself, and not at
                // all when none does (it drops the synonyms before the config's own name).
                "log.retention.ms" => (!chain.is_empty()).then_some(("log.retention.hours", "168")),
                "log.roll.ms" => (!chain.is_empty()).then_some(("log.roll.hours", "168")),
                _ => builtin.map(|v| (name, v)),
            };
            chain.extend(listed.map(|(n, v)| (n, v, Source::Default)));
        }
        let synonyms = chain
            .into_iter()
            .map(|(n, v, source)| {
                DescribeConfigsSynonym::default()
                    .with_name(s(n))
                    .with_value((!e.is_sensitive).then(|| s(v)))
                    .with_source(source as i8)
            })
            .collect();
        e.synonyms = synonyms;
    }
}

/// The dynamic broker configs nobody set (name, value, source; a `None` value is Kafka's null):
/// the topic defaults at the topic configs' defaults, the connection limits at their flags
/// (STATIC_BROKER_CONFIG, as the other flags are reported), and the configs accepted without
/// effect at Kafka's defaults.
fn broker_defaults(shard: &Shard) -> Vec<(&'static str, Option<String>, i8)> {
    let limits = &shard.config.limits;
    let topic_defaults = topic_config::BROKER_DEFAULTS.iter().map(|(b, t)| {
        let d = topic_config::lookup(t).map(|d| d.default.to_string());
        (*b, d, SOURCE_DEFAULT)
    });
    let connection_limits = topic_config::CONNECTION_LIMITS
        .into_iter()
        .zip([limits.connections, limits.connections_per_ip])
        .map(|(n, v)| (n, Some(v.to_string()), SOURCE_STATIC_BROKER));
    let without_effect = topic_config::BROKER_ACCEPTED_WITHOUT_EFFECT
        .iter()
        .map(|(n, _, d)| (*n, d.map(str::to_string), SOURCE_DEFAULT));
    topic_defaults
        .chain(connection_limits)
        .chain(without_effect)
        .collect()
}

/// What a dynamic broker config does in kaas, for DescribeConfigs' documentation (when
/// `asked`).
fn broker_doc(asked: bool, name: &str) -> Option<String> {
    if !asked {
        return None;
    }
    if let Some(topic) = topic_config::topic_key_for_broker(name) {
        let what = topic_config::lookup(topic).map_or("", |d| d.doc);
        return Some(format!(
            "The default of topic config {topic} for topics that do not set it: {what}"
        ));
    }
    if topic_config::CONNECTION_LIMITS.contains(&name) {
        return Some(
            "Set at run time; replaces the flag of the same name for new connections.".into(),
        );
    }
    topic_config::accepted_without_effect(name).map(|_| {
        "A Kafka dynamic broker config that kaas accepts and stores for compatibility; it has \
         no effect in kaas."
            .into()
    })
}

/// Every group config, for a group that exists or not (as Kafka: the configs of a group id
/// can be set before its first member joins).
fn describe_group(
    shard: &Shard,
    req: &DescribeConfigsRequest,
    group: &str,
    wanted: &dyn Fn(&str) -> bool,
) -> Vec<DescribeConfigsResourceResult> {
    let all = shard.catalog.group_configs();
    let overrides = all.get(group);
    let cfg = &shard.groups.config;
    GROUP_SETTINGS
        .iter()
        .filter(|g| wanted(g.name))
        .filter_map(|g| {
            let (v, set) = cfg.group_value(g.name, overrides)?;
            Some(entry(
                g.name,
                &v.to_string(),
                if set {
                    SOURCE_DYNAMIC_GROUP
                } else {
                    SOURCE_DEFAULT
                },
                ConfigType::Int,
                false,
                req.include_documentation.then(|| g.broker_setting().doc),
            ))
        })
        .collect()
}

/// Refuses a broker resource naming another broker: each broker describes and alters its own
/// configs (admin clients send a broker's resource to that broker); the empty name is the
/// cluster-wide default entity.
fn this_broker(shard: &Shard, id: &str) -> Result<(), (i16, String)> {
    if id.is_empty() || id == shard.config.broker_id.to_string() {
        return Ok(());
    }
    Err((
        errors::INVALID_REQUEST,
        format!(
            "Broker {id} is not this broker ({})",
            shard.config.broker_id
        ),
    ))
}

/// The description entries of one layer of dynamic broker configs: the topic defaults first,
/// in Kafka's order, then the connection limits and the Kafka configs kaas stores without
/// effect (sensitive ones without their value, as Kafka reports them).
fn dynamic_entries(
    layer: &BTreeMap<String, String>,
    source: topic_config::Source,
    include_documentation: bool,
) -> Vec<DescribeConfigsResourceResult> {
    let source = source as i8;
    let doc = |name: &str| broker_doc(include_documentation, name);
    let mut out: Vec<_> = topic_config::BROKER_DEFAULTS
        .iter()
        .filter_map(|(n, _)| {
            layer
                .get(*n)
                .map(|v| broker_entry(n, v, source, false, doc(n).as_deref()))
        })
        .collect();
    out.extend(layer.iter().filter_map(|(n, v)| {
        if topic_config::topic_key_for_broker(n).is_some() {
            return None; // listed above
        }
        if !topic_config::is_known_broker_config(n) {
            return Some(unknown_entry(n, source));
        }
        Some(broker_entry(n, v, source, false, doc(n).as_deref()))
    }));
    out
}

/// A stored broker config kaas does not know, described as Kafka 4.4 describes a name it does
/// not define: sensitive, without its value, read-only, of type UNKNOWN (0).
fn unknown_entry(name: &str, source: i8) -> DescribeConfigsResourceResult {
    DescribeConfigsResourceResult::default()
        .with_name(s(name))
        .with_value(None)
        .with_read_only(true)
        .with_is_sensitive(true)
        .with_config_source(source)
        .with_config_type(0)
}

fn entry(
    name: &str,
    value: &str,
    source: i8,
    kind: ConfigType,
    read_only: bool,
    doc: Option<&str>,
) -> DescribeConfigsResourceResult {
    DescribeConfigsResourceResult::default()
        .with_name(s(name))
        .with_value(Some(s(value)))
        .with_read_only(read_only)
        .with_config_source(source)
        .with_config_type(kind as i8)
        .with_documentation(doc.map(s))
}

/// A broker config's description entry, typed by [`broker_kind`]; a password is reported
/// without its value and marked sensitive, as Kafka does.
fn broker_entry(
    name: &str,
    value: &str,
    source: i8,
    read_only: bool,
    doc: Option<&str>,
) -> DescribeConfigsResourceResult {
    let kind = broker_kind(name);
    let e = entry(name, value, source, kind, read_only, doc);
    if kind == ConfigType::Password {
        e.with_value(None).with_is_sensitive(true)
    } else {
        e
    }
}

/// The type of broker config `name`, for its description.
fn broker_kind(name: &str) -> ConfigType {
    if let Some(t) = topic_config::topic_key_for_broker(name) {
        return topic_config::lookup(t).map_or(ConfigType::String, |d| d.kind);
    }
    if topic_config::CONNECTION_LIMITS.contains(&name) {
        return ConfigType::Int;
    }
    topic_config::accepted_without_effect(name).unwrap_or(ConfigType::String)
}

/// The broker's settings under Kafka's names, as set by flags.
fn broker_configs(shard: &Shard) -> Vec<(&'static str, String, ConfigType)> {
    let c = &shard.config;
    vec![
        ("broker.id", c.broker_id.to_string(), ConfigType::Int),
        ("node.id", c.broker_id.to_string(), ConfigType::Int),
        (
            "advertised.listeners",
            format!("PLAINTEXT://{}:{}", c.advertised_host, c.advertised_port),
            ConfigType::String,
        ),
        (
            "listeners",
            format!("PLAINTEXT://{}", c.listen),
            ConfigType::String,
        ),
        (
            "log.dirs",
            c.data_dir.display().to_string(),
            ConfigType::String,
        ),
        (
            "num.partitions",
            c.num_partitions.to_string(),
            ConfigType::Int,
        ),
        (
            "auto.create.topics.enable",
            c.auto_create_topics.to_string(),
            ConfigType::Boolean,
        ),
        (
            "socket.request.max.bytes",
            c.max_frame_bytes.to_string(),
            ConfigType::Int,
        ),
        ("default.replication.factor", "1".into(), ConfigType::Int),
    ]
}

/// Changes the dynamic broker configs (`--entity-type brokers`, for the default entity or this
/// broker's id) and re-applies every topic's effective configs on every shard.
async fn apply_broker(
    shard: &Rc<Shard>,
    resource_name: &str,
    configs: BTreeMap<String, String>,
    validate_only: bool,
) -> Result<(), (i16, String)> {
    this_broker(shard, resource_name)?;
    let scope = if resource_name.is_empty() {
        BrokerScope::Default
    } else {
        BrokerScope::Broker(shard.config.broker_id)
    };
    shard
        .catalog
        .set_broker_configs(scope, configs.clone(), validate_only)
        .map_err(|e| (errors::catalog(&e), e.to_string()))?;
    if !validate_only {
        tracing::info!(?scope, ?configs, "altered dynamic broker configs");
        let everyone = (0..shard.nshards).map(|i| (i, ())).collect();
        super::per_partition(
            shard,
            everyone,
            |s, ()| async move { s.apply_dynamic_configs() },
            (),
        )
        .await;
    }
    Ok(())
}

/// Replaces a group's configs. They take effect at the group's next heartbeat on this broker
/// (and within the catalog reload, about a second, on the others of a cluster).
fn apply_group(
    shard: &Rc<Shard>,
    group: &str,
    configs: BTreeMap<String, String>,
    validate_only: bool,
) -> Result<(), (i16, String)> {
    if group.is_empty() {
        return Err((errors::INVALID_GROUP_ID, "The group id is empty".into()));
    }
    let refuse = |e: CatalogError| (errors::catalog(&e), e.to_string());
    shard
        .groups
        .config
        .validate_group_configs(&configs)
        .map_err(|m| refuse(CatalogError::InvalidConfig(m)))?;
    if validate_only {
        return Ok(());
    }
    shard
        .catalog
        .set_group_configs(group, configs.clone())
        .map_err(refuse)?;
    tracing::info!(group, ?configs, "altered group configs");
    Ok(())
}

/// AlterConfigs (legacy): the given set replaces all of a topic's overrides.
pub async fn alter_configs(shard: &Rc<Shard>, req: AlterConfigsRequest) -> AlterConfigsResponse {
    let named = req
        .resources
        .iter()
        .map(|r| (r.resource_type, &r.resource_name));
    catch_up_on_topics(shard, named).await;
    let mut responses = Vec::new();
    for r in &req.resources {
        // AlterConfigs replaces the whole set: entries without a value are dropped.
        let configs: BTreeMap<String, String> = r
            .configs
            .iter()
            .filter_map(|c| {
                c.value
                    .as_ref()
                    .map(|v| (c.name.as_str().to_string(), v.as_str().to_string()))
            })
            .collect();
        let result: Result<(), (i16, String)> = match r.resource_type {
            RESOURCE_TOPIC => {
                apply(shard, r.resource_name.as_str(), configs, req.validate_only).await
            }
            RESOURCE_BROKER => {
                apply_broker(shard, r.resource_name.as_str(), configs, req.validate_only).await
            }
            RESOURCE_GROUP => {
                apply_group(shard, r.resource_name.as_str(), configs, req.validate_only)
            }
            other => Err(unsupported_resource(other)),
        };
        let (code, msg) = outcome(result);
        responses.push(
            alter_configs_response::AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(msg)
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone()),
        );
    }
    AlterConfigsResponse::default().with_responses(responses)
}

fn unsupported_resource(resource_type: i8) -> (i16, String) {
    (
        errors::INVALID_REQUEST,
        format!("Resource type {resource_type} is not supported"),
    )
}

/// A resource's result as the (error code, error message) pair both alter responses carry.
fn outcome(result: Result<(), (i16, String)>) -> (i16, Option<StrBytes>) {
    match result {
        Ok(()) => (errors::NONE, None),
        Err((c, m)) => (c, Some(s(&m))),
    }
}

/// IncrementalAlterConfigs: SET, DELETE, APPEND and SUBTRACT per key.
pub async fn incremental_alter_configs(
    shard: &Rc<Shard>,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let named = req
        .resources
        .iter()
        .map(|r| (r.resource_type, &r.resource_name));
    catch_up_on_topics(shard, named).await;
    let mut responses = Vec::new();
    for r in &req.resources {
        let result: Result<(), (i16, String)> = match r.resource_type {
            RESOURCE_TOPIC => match shard.catalog.snapshot().get(r.resource_name.as_str()) {
                None => Err((
                    errors::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("Topic '{}' does not exist.", r.resource_name.as_str()),
                )),
                Some(t) => match apply_ops(&t.configs, &r.configs, |m, name| {
                    topic_config::effective(m, name).unwrap_or("").to_string()
                }) {
                    Ok(configs) => {
                        apply(shard, r.resource_name.as_str(), configs, req.validate_only).await
                    }
                    Err(e) => Err(e),
                },
            },
            RESOURCE_BROKER => {
                // A broker's own configs sit above the cluster-wide ones.
                let (current, beneath) = if r.resource_name.is_empty() {
                    (shard.catalog.broker_configs(), Default::default())
                } else {
                    (
                        shard.catalog.own_broker_configs(),
                        shard.catalog.broker_configs(),
                    )
                };
                // APPEND and SUBTRACT start from the effective value, the default included, as
                // in Kafka: APPEND compact to log.cleanup.policy gives "delete,compact", and
                // SUBTRACT compact then "delete" (starting from nothing left the broker's
                // default at "compact" for every later topic: librdkafka's 0081 then 0086).
                match apply_ops(&current, &r.configs, |m, name| {
                    m.get(name)
                        .or_else(|| beneath.get(name))
                        .cloned()
                        .unwrap_or_else(|| {
                            topic_config::topic_key_for_broker(name)
                                .and_then(topic_config::lookup)
                                .map(|d| d.default.to_string())
                                .unwrap_or_default()
                        })
                }) {
                    Ok(configs) => {
                        apply_broker(shard, r.resource_name.as_str(), configs, req.validate_only)
                            .await
                    }
                    Err(e) => Err(e),
                }
            }
            RESOURCE_GROUP => {
                let all = shard.catalog.group_configs();
                let current = all
                    .get(r.resource_name.as_str())
                    .cloned()
                    .unwrap_or_default();
                match apply_ops(&current, &r.configs, |m, name| {
                    m.get(name).cloned().unwrap_or_default()
                }) {
                    Ok(configs) => {
                        apply_group(shard, r.resource_name.as_str(), configs, req.validate_only)
                    }
                    Err(e) => Err(e),
                }
            }
            other => Err(unsupported_resource(other)),
        };
        let (code, msg) = outcome(result);
        responses.push(
            incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(msg)
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone()),
        );
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

/// Applies IncrementalAlterConfigs operations to a config map. APPEND and SUBTRACT work on
/// comma-separated lists, starting from the current effective value (`current_of`).
fn apply_ops(
    current: &BTreeMap<String, String>,
    ops: &[kaas_wire::kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig],
    current_of: impl Fn(&BTreeMap<String, String>, &str) -> String,
) -> Result<BTreeMap<String, String>, (i16, String)> {
    let mut seen = std::collections::HashSet::new();
    if let Some(twice) = ops.iter().find(|c| !seen.insert(c.name.as_str())) {
        // Which operation would win is the client's mistake to fix; Kafka's answer.
        return Err((
            errors::INVALID_REQUEST,
            format!(
                "Error due to duplicate config keys: {} is named more than once",
                twice.name.as_str()
            ),
        ));
    }
    let mut configs = current.clone();
    for c in ops {
        let name = c.name.as_str().to_string();
        let value = c
            .value
            .as_ref()
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        match c.config_operation {
            OP_SET => {
                configs.insert(name, value);
            }
            OP_DELETE => {
                configs.remove(&name);
            }
            OP_APPEND | OP_SUBTRACT => {
                let now = current_of(&configs, &name);
                let mut items: Vec<String> = now
                    .split(',')
                    .filter(|x| !x.is_empty())
                    .map(|x| x.to_string())
                    .collect();
                for v in value.split(',').filter(|x| !x.is_empty()) {
                    if c.config_operation == OP_APPEND {
                        if !items.iter().any(|i| i == v) {
                            items.push(v.to_string());
                        }
                    } else {
                        items.retain(|i| i != v);
                    }
                }
                configs.insert(name, items.join(","));
            }
            op => {
                return Err((
                    errors::INVALID_REQUEST,
                    format!("Unknown config operation {op}"),
                ))
            }
        }
    }
    Ok(configs)
}

async fn apply(
    shard: &Rc<Shard>,
    topic: &str,
    configs: BTreeMap<String, String>,
    validate_only: bool,
) -> Result<(), (i16, String)> {
    match shard
        .catalog
        .set_topic_configs(topic, configs, validate_only)
    {
        Ok(meta) => {
            if !validate_only {
                tracing::info!(topic, configs = ?meta.configs, "altered topic configs");
                broadcast_topic_config(shard, meta).await;
            }
            Ok(())
        }
        Err(e @ CatalogError::UnknownTopic(_)) => {
            Err((errors::UNKNOWN_TOPIC_OR_PARTITION, e.to_string()))
        }
        Err(e) => Err((errors::catalog(&e), e.to_string())),
    }
}
