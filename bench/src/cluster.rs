//! Cluster view: brokers, the topic's partitions and their leaders, topic creation and
//! ListOffsets. Everything here happens before or after the measured window.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use kaas_wire::kafka_protocol::messages::create_topics_request::{
    CreatableTopic, CreatableTopicConfig,
};
use kaas_wire::kafka_protocol::messages::list_offsets_request::{
    ListOffsetsPartition, ListOffsetsTopic,
};
use kaas_wire::kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kaas_wire::kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, ListOffsetsRequest, MetadataRequest, TopicName,
};
use kaas_wire::kafka_protocol::protocol::StrBytes;
use kaas_wire::kafka_protocol::ResponseError;

use crate::client::Connection;

/// Highest versions the bench asks for. Produce and Fetch go up to the versions that address
/// topics by id (13), which the bench supports, so a broker is exercised on its newest path.
pub const PRODUCE_VERSION_CAP: i16 = 13;
pub const FETCH_VERSION_CAP: i16 = 17;
pub const METADATA_VERSION_CAP: i16 = 12;
pub const LIST_OFFSETS_VERSION_CAP: i16 = 9;
pub const CREATE_TOPICS_VERSION_CAP: i16 = 7;

const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const LEADER_NOT_AVAILABLE: i16 = 5;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const TOPIC_ALREADY_EXISTS: i16 = 36;

/// ListOffsets timestamps with special meaning.
pub const LATEST_TIMESTAMP: i64 = -1;
pub const EARLIEST_TIMESTAMP: i64 = -2;

#[derive(Debug, Clone)]
pub struct PartitionInfo {
    pub index: i32,
    pub leader: i32,
}

/// The topic as the metadata described it.
#[derive(Debug, Clone)]
pub struct TopicInfo {
    pub name: String,
    pub id: uuid::Uuid,
    pub partitions: Vec<PartitionInfo>,
}

/// How to create the topic when it is missing: partitions, replication factor, configs.
pub type TopicSpec<'a> = (i32, i16, &'a [(String, String)]);

/// Where the brokers are and who leads each partition.
pub struct Cluster {
    pub bootstrap: Arc<Connection>,
    pub brokers: HashMap<i32, String>,
    pub topic: TopicInfo,
    pub client_id: String,
}

fn describe(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        Some(e) => format!("{e:?} ({code})"),
        None => format!("error {code}"),
    }
}

impl Cluster {
    /// Connects to the bootstrap broker, creates the topic when it is missing (when `create` is
    /// set), and waits (bounded) until every partition has a leader.
    pub async fn discover(
        bootstrap: &str,
        client_id: &str,
        topic: &str,
        create: Option<TopicSpec<'_>>,
    ) -> Result<Cluster> {
        let conn = Arc::new(Connection::connect(bootstrap, client_id, 4).await?);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut created = false;
        loop {
            let (brokers, topic_info, err) = metadata(&conn, topic).await?;
            match (err, &topic_info) {
                (0, Some(t))
                    if !t.partitions.is_empty() && t.partitions.iter().all(|p| p.leader >= 0) =>
                {
                    for p in &t.partitions {
                        if !brokers.contains_key(&p.leader) {
                            bail!(
                                "partition {} leader {} is not among the brokers",
                                p.index,
                                p.leader
                            );
                        }
                    }
                    if let Some((n, _, _)) = create {
                        if !created && n != t.partitions.len() as i32 {
                            eprintln!(
                                "note: topic {topic} exists with {} partitions (asked for {n}); using it as it is",
                                t.partitions.len()
                            );
                        }
                    }
                    let cluster = Cluster {
                        bootstrap: conn,
                        brokers,
                        topic: topic_info.unwrap(),
                        client_id: client_id.to_string(),
                    };
                    // Every leader answers for its partitions before any load is sent.
                    cluster
                        .list_offsets(LATEST_TIMESTAMP)
                        .await
                        .with_context(|| format!("waiting for topic {topic} to be served"))?;
                    return Ok(cluster);
                }
                (UNKNOWN_TOPIC_OR_PARTITION, _) if !created => {
                    let Some((partitions, rf, configs)) = create else {
                        bail!("topic {topic} does not exist");
                    };
                    create_topic(&conn, topic, partitions, rf, configs).await?;
                    created = true;
                }
                (0 | UNKNOWN_TOPIC_OR_PARTITION | LEADER_NOT_AVAILABLE, _) => {}
                (code, _) => bail!("metadata for topic {topic}: {}", describe(code)),
            }
            if Instant::now() > deadline {
                bail!("topic {topic}: partitions still without leaders after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn partition_count(&self) -> usize {
        self.topic.partitions.len()
    }

    pub fn leader_of(&self, partition: i32) -> i32 {
        self.topic.partitions[partition as usize].leader
    }

    /// Opens one connection per broker that leads any of `partitions`.
    pub async fn connect_leaders(
        &self,
        partitions: &[i32],
        max_in_flight: usize,
    ) -> Result<HashMap<i32, Arc<Connection>>> {
        let mut conns = HashMap::new();
        for &p in partitions {
            let leader = self.leader_of(p);
            if let std::collections::hash_map::Entry::Vacant(e) = conns.entry(leader) {
                let addr = &self.brokers[&leader];
                let c = Connection::connect(addr, &self.client_id, max_in_flight)
                    .await
                    .with_context(|| format!("connecting to broker {leader} at {addr}"))?;
                e.insert(Arc::new(c));
            }
        }
        Ok(conns)
    }

    /// Offsets of every partition at `timestamp` (LATEST_TIMESTAMP or EARLIEST_TIMESTAMP),
    /// asked of each partition's leader. A broker may name a leader in its metadata before that
    /// leader serves the partition (Kafka does, just after CreateTopics), so retriable errors
    /// are retried for up to 60 s.
    pub async fn list_offsets(&self, timestamp: i64) -> Result<BTreeMap<i32, i64>> {
        let all: Vec<i32> = self.topic.partitions.iter().map(|p| p.index).collect();
        let conns = self.connect_leaders(&all, 1).await?;
        let mut by_leader: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for &p in &all {
            by_leader.entry(self.leader_of(p)).or_default().push(p);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut out = BTreeMap::new();
        loop {
            let mut last_error = None;
            for (leader, parts) in &by_leader {
                let mut req = ListOffsetsRequest::default();
                req.replica_id = BrokerId(-1);
                let mut t = ListOffsetsTopic::default();
                t.name = TopicName(StrBytes::from_string(self.topic.name.clone()));
                for p in parts.iter().filter(|p| !out.contains_key(*p)) {
                    let mut lp = ListOffsetsPartition::default();
                    lp.partition_index = *p;
                    lp.current_leader_epoch = -1;
                    lp.timestamp = timestamp;
                    t.partitions.push(lp);
                }
                if t.partitions.is_empty() {
                    continue;
                }
                req.topics.push(t);
                let (resp, _) = conns[leader].call(&req, LIST_OFFSETS_VERSION_CAP).await?;
                for t in resp.topics {
                    for p in t.partitions {
                        if p.error_code == 0 {
                            out.insert(p.partition_index, p.offset);
                        } else if is_retriable(p.error_code) {
                            last_error = Some((p.partition_index, p.error_code));
                        } else {
                            bail!(
                                "ListOffsets partition {}: {}",
                                p.partition_index,
                                describe(p.error_code)
                            );
                        }
                    }
                }
            }
            if out.len() == all.len() {
                return Ok(out);
            }
            if Instant::now() > deadline {
                let detail = last_error
                    .map(|(p, c)| format!(" (partition {p}: {})", describe(c)))
                    .unwrap_or_default();
                bail!(
                    "ListOffsets answered {} of {} partitions after 60 s{detail}",
                    out.len(),
                    all.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Errors that mean "not yet": leadership or the partition itself is still being set up.
fn is_retriable(code: i16) -> bool {
    matches!(
        code,
        UNKNOWN_TOPIC_OR_PARTITION | LEADER_NOT_AVAILABLE | NOT_LEADER_OR_FOLLOWER | 7 | 9
    )
}

type MetadataAnswer = (HashMap<i32, String>, Option<TopicInfo>, i16);

async fn metadata(conn: &Connection, topic: &str) -> Result<MetadataAnswer> {
    let mut req = MetadataRequest::default();
    let mut t = MetadataRequestTopic::default();
    t.name = Some(TopicName(StrBytes::from_string(topic.to_string())));
    req.topics = Some(vec![t]);
    req.allow_auto_topic_creation = false;
    let (resp, _) = conn.call(&req, METADATA_VERSION_CAP).await?;
    let brokers = resp
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port)))
        .collect();
    let Some(mt) = resp.topics.into_iter().next() else {
        bail!("metadata response has no topic entry");
    };
    if mt.error_code != 0 {
        return Ok((brokers, None, mt.error_code));
    }
    let mut partitions: Vec<PartitionInfo> = mt
        .partitions
        .iter()
        .map(|p| PartitionInfo {
            index: p.partition_index,
            leader: if p.error_code == 0 || p.error_code == 9 {
                p.leader_id.0
            } else {
                -1
            },
        })
        .collect();
    partitions.sort_by_key(|p| p.index);
    for (i, p) in partitions.iter().enumerate() {
        if p.index != i as i32 {
            bail!("metadata lists partitions that are not 0..n: {partitions:?}");
        }
    }
    Ok((
        brokers,
        Some(TopicInfo {
            name: topic.to_string(),
            id: mt.topic_id,
            partitions,
        }),
        0,
    ))
}

async fn create_topic(
    conn: &Connection,
    topic: &str,
    partitions: i32,
    replication_factor: i16,
    configs: &[(String, String)],
) -> Result<()> {
    let mut req = CreateTopicsRequest::default();
    req.timeout_ms = 30_000;
    let mut t = CreatableTopic::default();
    t.name = TopicName(StrBytes::from_string(topic.to_string()));
    t.num_partitions = partitions;
    t.replication_factor = replication_factor;
    for (k, v) in configs {
        let mut c = CreatableTopicConfig::default();
        c.name = StrBytes::from_string(k.clone());
        c.value = Some(StrBytes::from_string(v.clone()));
        t.configs.push(c);
    }
    req.topics.push(t);
    let (resp, _) = conn.call(&req, CREATE_TOPICS_VERSION_CAP).await?;
    for r in resp.topics {
        if r.error_code != 0 && r.error_code != TOPIC_ALREADY_EXISTS {
            bail!(
                "CreateTopics {topic}: {}{}",
                describe(r.error_code),
                r.error_message
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            );
        }
    }
    eprintln!("created topic {topic} with {partitions} partitions");
    Ok(())
}
