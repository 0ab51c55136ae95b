//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics and the broker.
//!
//! Topic configs use Kafka's names and defaults (`topic_config`). Broker settings come from
//! flags and environment at start and are reported read-only; changing one is refused with a
//! message naming the flag, since kaas has no dynamic broker config store yet.

use std::collections::BTreeMap;
use std::rc::Rc;

use kaas_wire::kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kaas_wire::kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest,
    AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kaas_wire::kafka_protocol::protocol::StrBytes;

use super::admin::{broadcast_topic_config, SOURCE_DEFAULT, SOURCE_DYNAMIC_TOPIC};
use crate::catalog::CatalogError;
use crate::errors;
use crate::shard::Shard;
use crate::topic_config::{self, ConfigType, TOPIC_CONFIGS};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const SOURCE_STATIC_BROKER: i8 = 4;

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

pub fn describe_configs(shard: &Rc<Shard>, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let snapshot = shard.catalog.snapshot();
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
            match r.resource_type {
                RESOURCE_TOPIC => match snapshot.get(r.resource_name.as_str()) {
                    None => base
                        .with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION)
                        .with_error_message(Some(s(&format!(
                            "Topic '{}' does not exist.",
                            r.resource_name.as_str()
                        )))),
                    Some(t) => base.with_configs(
                        TOPIC_CONFIGS
                            .iter()
                            .filter(|d| wanted(d.name))
                            .map(|d| {
                                let (value, source) = match t.configs.get(d.name) {
                                    Some(v) => (v.as_str(), SOURCE_DYNAMIC_TOPIC),
                                    None => (d.default, SOURCE_DEFAULT),
                                };
                                entry(
                                    d.name,
                                    value,
                                    source,
                                    d.kind,
                                    false,
                                    req.include_documentation.then_some(d.doc),
                                )
                            })
                            .collect(),
                    ),
                },
                RESOURCE_BROKER => {
                    let id = r.resource_name.as_str();
                    if !id.is_empty() && id != shard.config.broker_id.to_string() {
                        return base
                            .with_error_code(errors::INVALID_REQUEST)
                            .with_error_message(Some(s(&format!(
                                "Broker {id} is not this broker ({})",
                                shard.config.broker_id
                            ))));
                    }
                    base.with_configs(
                        broker_configs(shard)
                            .into_iter()
                            .filter(|(n, _, _)| wanted(n))
                            .map(|(n, v, k)| entry(n, &v, SOURCE_STATIC_BROKER, k, true, None))
                            .collect(),
                    )
                }
                other => base
                    .with_error_code(errors::INVALID_REQUEST)
                    .with_error_message(Some(s(&format!(
                        "Resource type {other} is not supported"
                    )))),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
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
        (
            "log.segment.bytes",
            topic_config::lookup("segment.bytes")
                .map(|d| d.default)
                .unwrap_or_default()
                .into(),
            ConfigType::Int,
        ),
        (
            "log.retention.ms",
            topic_config::lookup("retention.ms")
                .map(|d| d.default)
                .unwrap_or_default()
                .into(),
            ConfigType::Long,
        ),
        (
            "message.max.bytes",
            topic_config::lookup("max.message.bytes")
                .map(|d| d.default)
                .unwrap_or_default()
                .into(),
            ConfigType::Int,
        ),
    ]
}

fn broker_refusal(shard: &Shard) -> (i16, String) {
    (
        errors::INVALID_CONFIG,
        format!("Broker {} settings are static in kaas: set them with command-line flags or KAAS_* environment variables and restart (see kaas --help)", shard.config.broker_id),
    )
}

/// AlterConfigs (legacy): the given set replaces all of a topic's overrides.
pub async fn alter_configs(shard: &Rc<Shard>, req: AlterConfigsRequest) -> AlterConfigsResponse {
    let mut responses = Vec::new();
    for r in &req.resources {
        let result: Result<(), (i16, String)> = match r.resource_type {
            RESOURCE_TOPIC => {
                let configs: BTreeMap<String, String> = r
                    .configs
                    .iter()
                    .filter_map(|c| {
                        c.value
                            .as_ref()
                            .map(|v| (c.name.as_str().to_string(), v.as_str().to_string()))
                    })
                    .collect();
                apply(shard, r.resource_name.as_str(), configs, req.validate_only).await
            }
            RESOURCE_BROKER => Err(broker_refusal(shard)),
            other => Err((
                errors::INVALID_REQUEST,
                format!("Resource type {other} is not supported"),
            )),
        };
        let (code, msg) = match result {
            Ok(()) => (errors::NONE, None),
            Err((c, m)) => (c, Some(s(&m))),
        };
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

/// IncrementalAlterConfigs: SET, DELETE, APPEND and SUBTRACT per key.
pub async fn incremental_alter_configs(
    shard: &Rc<Shard>,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut responses = Vec::new();
    for r in &req.resources {
        let result: Result<(), (i16, String)> = match r.resource_type {
            RESOURCE_TOPIC => match shard.catalog.snapshot().get(r.resource_name.as_str()) {
                None => Err((
                    errors::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("Topic '{}' does not exist.", r.resource_name.as_str()),
                )),
                Some(t) => {
                    let mut configs = t.configs.clone();
                    let mut bad = None;
                    for c in &r.configs {
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
                                let current = topic_config::effective(&configs, &name)
                                    .unwrap_or("")
                                    .to_string();
                                let mut items: Vec<String> = current
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
                                bad = Some((
                                    errors::INVALID_REQUEST,
                                    format!("Unknown config operation {op}"),
                                ))
                            }
                        }
                    }
                    match bad {
                        Some(e) => Err(e),
                        None => {
                            apply(shard, r.resource_name.as_str(), configs, req.validate_only).await
                        }
                    }
                }
            },
            RESOURCE_BROKER => Err(broker_refusal(shard)),
            other => Err((
                errors::INVALID_REQUEST,
                format!("Resource type {other} is not supported"),
            )),
        };
        let (code, msg) = match result {
            Ok(()) => (errors::NONE, None),
            Err((c, m)) => (c, Some(s(&m))),
        };
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
