//! The topic catalog: names, IDs, partition counts and config overrides of every topic.
//!
//! Shared by all shards. Reads are lock-free (`ArcSwap` snapshot, RCU style): the hot path
//! loads a snapshot and never blocks. Changes (admin requests only) are serialized by a mutex
//! and, across processes, by an `flock` on `__meta/catalog.lock`: in cluster mode every broker
//! of the shared volume may create or delete topics, so a change re-reads the files under the
//! lock, applies itself, persists with tmp + fsync + rename, and then publishes a new snapshot.
//! Other brokers pick the change up through [`Catalog::reload`] (the control thread calls it
//! every second). Partition data
//! lives in `<data>/<topic>~<topic id>/<partition>/`, so a topic deleted and created again
//! under the same name can never see the old data. Because other brokers see a deletion only
//! at their next reload, a deleted name is taken again only after a reuse delay
//! ([`Catalog::set_name_reuse_delay`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use uuid::Uuid;

use crate::topic_config;

/// One topic.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TopicMeta {
    pub name: String,
    pub id: Uuid,
    pub partitions: i32,
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
    /// Partitions an operator reassigned (AlterPartitionReassignments), partition → broker id:
    /// the controller holds each on its broker while that broker is alive (cluster mode).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pinned_leaders: BTreeMap<i32, i32>,
}

impl TopicMeta {
    /// The directory holding partition `partition`'s log.
    pub fn partition_dir(&self, data_dir: &Path, partition: i32) -> PathBuf {
        data_dir.join(self.dir_name()).join(partition.to_string())
    }

    /// The name of the topic's directory under the data directory ([`topic_dir_name`]).
    pub fn dir_name(&self) -> String {
        topic_dir_name(&self.name, self.id)
    }
}

/// `<name>~<topic id>`, with the name cut so the whole fits one file name (255 bytes on ext4,
/// XFS and most others): a Kafka topic name may have 249 characters, and with the 33 of
/// `~<id>` a name longer than 222 made a directory no file system would create. The id alone
/// keeps the directory unique; the name is there for the operator. (Topic names are ASCII, so
/// cutting at a byte is cutting at a character.)
pub fn topic_dir_name(name: &str, id: Uuid) -> String {
    let cut = &name[..name.len().min(MAX_DIR_NAME_BYTES - TOPIC_ID_SUFFIX_BYTES)];
    format!("{cut}~{}", id.simple())
}

/// The longest file name Linux file systems take (`NAME_MAX`).
const MAX_DIR_NAME_BYTES: usize = 255;
/// `~` and the 32 hex digits of a topic id.
const TOPIC_ID_SUFFIX_BYTES: usize = 33;

/// A snapshot of all topics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopicTable {
    /// Read freely; change through [`TopicTable::insert`] and [`TopicTable::remove`], which
    /// keep the id index right.
    pub topics: BTreeMap<String, Arc<TopicMeta>>,
    /// Names deleted lately → when (Unix ms), so that the name is not reused before every
    /// broker has seen the deletion (see [`Catalog::set_name_reuse_delay`]); pruned after
    /// [`DELETED_NAMES_KEPT_MS`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deleted: BTreeMap<String, u64>,
    /// Topic id → name, built on the first lookup by id (Fetch v13+, Produce v13, the offset
    /// APIs' v10 name topics by id on every request).
    #[serde(skip)]
    ids: IdIndex,
}

impl TopicTable {
    pub fn get(&self, name: &str) -> Option<&Arc<TopicMeta>> {
        self.topics.get(name)
    }

    /// Adds or replaces a topic.
    pub fn insert(&mut self, meta: Arc<TopicMeta>) {
        self.ids = IdIndex::default();
        self.topics.insert(meta.name.clone(), meta);
    }

    /// Removes a topic.
    pub fn remove(&mut self, name: &str) -> Option<Arc<TopicMeta>> {
        self.ids = IdIndex::default();
        self.topics.remove(name)
    }

    /// The topic `id` names. The index maps to names and the answer is read from `topics`, so
    /// an entry replaced since (grown, reconfigured) is current; one the index does not know
    /// or names wrongly (a table changed after its first lookup by id) is found by a scan.
    pub fn by_id(&self, id: Uuid) -> Option<&Arc<TopicMeta>> {
        let index = self.ids.0.get_or_init(|| {
            self.topics
                .values()
                .map(|t| (t.id, t.name.clone()))
                .collect()
        });
        let scan = || self.topics.values().find(|t| t.id == id);
        match index.get(&id) {
            Some(name) => self.topics.get(name).filter(|t| t.id == id).or_else(scan),
            // Unknown to a complete index: no such topic (a client's stale or made-up id
            // costs no scan).
            None if index.len() == self.topics.len() => None,
            None => scan(),
        }
    }
}

/// [`TopicTable::by_id`]'s index: derived from the topics, so it takes no part in equality,
/// and a copy starts empty.
#[derive(Debug, Default)]
struct IdIndex(std::sync::OnceLock<HashMap<Uuid, String>>);

impl PartialEq for IdIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Clone for IdIndex {
    fn clone(&self) -> Self {
        IdIndex::default()
    }
}

/// What a KIP-848 group's subscriptions resolve against (`kaas-groups` knows nothing of the
/// catalog): a snapshot's topics by name, with their ids and partition counts.
impl kaas_groups::consumer::Topics for TopicTable {
    fn topic(&self, name: &str) -> Option<(Uuid, i32)> {
        self.topics.get(name).map(|t| (t.id, t.partitions))
    }
    fn names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        Box::new(self.topics.keys().map(String::as_str))
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CatalogError {
    #[error("Topic '{0}' already exists.")]
    TopicExists(String),
    #[error("Topic '{0}' does not exist.")]
    UnknownTopic(String),
    #[error("{0}")]
    InvalidTopicName(String),
    #[error("{0}")]
    InvalidPartitions(String),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("{0}")]
    InvalidReplicaAssignment(String),
    #[error("{0}")]
    InvalidConfig(String),
    /// A request that contradicts itself (Kafka's INVALID_REQUEST).
    #[error("{0}")]
    InvalidRequest(String),
    /// Broker configs Kafka defines but does not change at run time (Kafka's own message).
    #[error("Cannot update these configs dynamically: [{0}]")]
    NotDynamic(String),
    #[error("storing the catalog in {path}: {detail}")]
    Storage { path: PathBuf, detail: String },
    /// One admin request named the topic more than once (see `handlers::admin`).
    #[error("Duplicate topic name.")]
    DuplicateName,
    #[error("Topic '{name}' was deleted moments ago and can be created again in {wait_ms} ms, once every broker has seen the deletion.")]
    NameRecentlyDeleted { name: String, wait_ms: u64 },
}

/// How long a deleted name is remembered (far past any reuse delay).
pub const DELETED_NAMES_KEPT_MS: u64 = 600_000;

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The names of Kafka's internal topics. kaas has none (group offsets live in per-group logs,
/// and it serves no transactions or share groups), so it does not let a client create an
/// ordinary topic under one of these names, which tools would take for the internal one.
pub const INTERNAL_TOPICS: [&str; 4] = [
    "__consumer_offsets",
    "__transaction_state",
    "__share_group_state",
    "__cluster_metadata",
];

/// Kafka refuses a topic whose name equals an existing one's once `.` and `_` are made the
/// same: the two would share their metric names.
fn collision(table: &TopicTable, name: &str) -> Result<(), CatalogError> {
    if !name.contains(['.', '_']) {
        return Ok(());
    }
    let key = |n: &str| n.replace('.', "_");
    let mine = key(name);
    match table.topics.keys().find(|other| key(other) == mine) {
        Some(other) => Err(CatalogError::InvalidTopicName(format!(
            "Topic '{name}' collides with existing topic: {other}"
        ))),
        None => Ok(()),
    }
}

/// Kafka's topic name rules: 1..=249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), CatalogError> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(CatalogError::InvalidTopicName(format!(
            "Topic name '{name}' is illegal"
        )));
    }
    if name.len() > 249 {
        return Err(CatalogError::InvalidTopicName(format!(
            "Topic name is longer than 249 characters: {}",
            name.len()
        )));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(CatalogError::InvalidTopicName(format!("Topic name '{name}' contains characters other than ASCII alphanumerics, '.', '_' and '-'")));
    }
    Ok(())
}

/// Upper bound on partitions per topic, so a typo cannot create a million directories.
pub const MAX_PARTITIONS_PER_TOPIC: i32 = 100_000;

/// Producer ids are handed out from blocks reserved on disk, so ids stay unique across restarts
/// without an fsync per InitProducerId.
const PRODUCER_ID_BLOCK: i64 = 1000;

#[derive(Debug, Serialize, Deserialize)]
struct ClusterMeta {
    cluster_id: String,
    #[serde(default)]
    producer_id_limit: i64,
}

/// Which dynamic broker configs an AlterConfigs changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerScope {
    /// The cluster-wide defaults (`--entity-default`, an empty resource name).
    Default,
    /// One broker's own (`--entity-name <id>`).
    Broker(i32),
}

/// Every broker's own dynamic configs, by broker id (a string: JSON object keys).
type BrokerConfigsById = BTreeMap<String, BTreeMap<String, String>>;

/// The file of [`BrokerConfigsById`] under `__meta/`.
const BROKER_CONFIGS_BY_ID: &str = "broker-configs-by-id.json";

pub struct Catalog {
    dir: PathBuf,
    table: ArcSwap<TopicTable>,
    admin: Mutex<ClusterMeta>,
    next_producer_id: AtomicI64,
    cluster_id: String,
    /// Dynamic broker configs (Kafka's names, e.g. `log.retention.ms`), set through
    /// AlterConfigs on the broker resource; they are the defaults of topic configs.
    broker_configs: ArcSwap<BTreeMap<String, String>>,
    /// Broker configs given at start (`--broker-config`), beneath the dynamic ones.
    static_broker_configs: ArcSwap<BTreeMap<String, String>>,
    /// This broker's own dynamic configs (`kafka-configs --entity-name <id>`), above the
    /// cluster-wide ones: `broker-configs-by-id.json` holds every broker's, by id, so on a
    /// shared volume one broker's override applies to that broker only, as in Kafka.
    own_broker_configs: ArcSwap<BTreeMap<String, String>>,
    /// Whose entry of `broker-configs-by-id.json` is [`Catalog::own_broker_configs`]; unset
    /// (no broker's own configs apply) until [`Catalog::set_broker_id`].
    broker_id: OnceLock<i32>,
    /// The static configs overlaid with the cluster-wide dynamic ones, then with this
    /// broker's own: what the broker runs with.
    effective_broker_configs: ArcSwap<BTreeMap<String, String>>,
    /// Per-group configs (Kafka 4's GROUP resource, e.g. `consumer.session.timeout.ms`), by
    /// group id; see `groups::config::GROUP_SETTINGS`.
    group_configs: ArcSwap<GroupConfigs>,
    /// The bytes of `topics.json` at the last [`Catalog::reload`]: an unchanged file is not
    /// parsed again (the reload runs every second on every broker of a cluster).
    reloaded_topics: Mutex<Vec<u8>>,
    /// `topics.json`'s identity when this catalog last read or wrote it (see
    /// [`Catalog::topics_changed_on_disk`]).
    topics_stamp: Mutex<Option<FileStamp>>,
    /// See [`Catalog::set_name_reuse_delay`].
    name_reuse_delay_ms: AtomicU64,
}

/// A file's identity: inode, length, modification time. Every catalog write replaces its
/// file (a temporary file renamed over it: a new inode), so two stamps differ when the file
/// was written in between — unless a freed inode number came back with the same length within
/// one tick of the filesystem's clock. A hint, then: [`Catalog::reload`] still compares bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp(u64, u64, i64, i64);

fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(FileStamp(m.ino(), m.len(), m.mtime(), m.mtime_nsec()))
}

/// Group id → that group's config overrides.
pub type GroupConfigs = BTreeMap<String, BTreeMap<String, String>>;

fn store_json<T: Serialize>(path: &Path, value: &T) -> Result<(), CatalogError> {
    let bytes = serde_json::to_vec_pretty(value).expect("catalog serializes");
    kaas_storage::write_atomically(path, &bytes).map_err(|e| storage_error(path, e))
}

fn storage_error(path: &Path, e: impl std::fmt::Display) -> CatalogError {
    CatalogError::Storage {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

/// A catalog file's bytes; `None` when it does not exist yet.
fn read_bytes(path: &Path) -> Result<Option<Vec<u8>>, CatalogError> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(storage_error(path, e)),
    }
}

/// Reads a JSON file of the catalog; `None` when it does not exist yet.
fn load_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, CatalogError> {
    read_bytes(path)?
        .map(|b| serde_json::from_slice(&b).map_err(|e| storage_error(path, e)))
        .transpose()
}

/// An exclusive `flock` on `__meta/catalog.lock`, held while a change reads, modifies and
/// writes the catalog files, so brokers sharing the volume never lose each other's changes.
/// Released when dropped (and by the kernel if the process dies).
struct FileLock(std::fs::File);

impl FileLock {
    fn take(dir: &Path) -> Result<FileLock, CatalogError> {
        let path = dir.join("catalog.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| storage_error(&path, e))?;
        file.lock().map_err(|e| storage_error(&path, e))?;
        Ok(FileLock(file))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Closing the file would release it too; unlocking first says so explicitly.
        let _ = self.0.unlock();
    }
}

impl Catalog {
    /// Loads (or initialises) the catalog under `<data_dir>/__meta/`.
    pub fn open(data_dir: &Path) -> Result<Catalog, CatalogError> {
        let dir = data_dir.join("__meta");
        kaas_durable::create_dir_all(&dir).map_err(|e| storage_error(&dir, e))?;
        let _lock = FileLock::take(&dir)?;
        let topics_path = dir.join("topics.json");
        let table: TopicTable = load_json(&topics_path)?.unwrap_or_default();
        let cluster_path = dir.join("cluster.json");
        let meta: ClusterMeta = match load_json(&cluster_path)? {
            Some(meta) => meta,
            None => {
                let meta = ClusterMeta {
                    cluster_id: base64_uuid(Uuid::new_v4()),
                    producer_id_limit: 0,
                };
                store_json(&cluster_path, &meta)?;
                meta
            }
        };
        // Everything below the stored limit may have been handed out before a crash (or by
        // another broker of the volume), so the first InitProducerId reserves the next block
        // (`allocate_producer_id`). Not here: a start must write nothing it does not need, or
        // a broker on a full disk could not start to let the operator delete topics.
        let next = meta.producer_id_limit;
        let cluster_id = meta.cluster_id.clone();
        let broker_configs: BTreeMap<String, String> =
            load_json(&dir.join("broker-configs.json"))?.unwrap_or_default();
        let group_configs: GroupConfigs =
            load_json(&dir.join("group-configs.json"))?.unwrap_or_default();
        Ok(Catalog {
            effective_broker_configs: ArcSwap::from_pointee(broker_configs.clone()),
            static_broker_configs: ArcSwap::from_pointee(BTreeMap::new()),
            own_broker_configs: ArcSwap::from_pointee(BTreeMap::new()),
            broker_id: OnceLock::new(),
            broker_configs: ArcSwap::from_pointee(broker_configs),
            group_configs: ArcSwap::from_pointee(group_configs),
            dir,
            table: ArcSwap::from_pointee(table),
            admin: Mutex::new(meta),
            next_producer_id: AtomicI64::new(next),
            cluster_id,
            reloaded_topics: Mutex::new(Vec::new()),
            topics_stamp: Mutex::new(stamp(&topics_path)),
            name_reuse_delay_ms: AtomicU64::new(0),
        })
    }

    /// Re-reads the catalog files and publishes what other brokers of the shared volume
    /// changed. Returns whether anything changed (topics or broker configs). Cheap when
    /// nothing did: two reads, and the topics are parsed only when their file changed.
    pub fn reload(&self) -> Result<bool, CatalogError> {
        let _guard = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.dir.join("topics.json");
        // Taken before the read: a write in between makes the stamp older than the bytes,
        // which at worst costs one more refresh, never a missed change.
        let before = stamp(&path);
        let bytes = read_bytes(&path)?.unwrap_or_default();
        let mut seen = self
            .reloaded_topics
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut changed = false;
        if *seen != bytes {
            let table: TopicTable = if bytes.is_empty() {
                TopicTable::default()
            } else {
                serde_json::from_slice(&bytes).map_err(|e| storage_error(&path, e))?
            };
            changed = *self.table.load_full() != table;
            if changed {
                self.table.store(Arc::new(table));
            }
            *seen = bytes;
        }
        *self.topics_stamp.lock().unwrap_or_else(|p| p.into_inner()) = before;
        let configs: BTreeMap<String, String> =
            load_json(&self.dir.join("broker-configs.json"))?.unwrap_or_default();
        let own = self.load_own_broker_configs()?;
        let configs_changed = *self.broker_configs.load_full() != configs
            || *self.own_broker_configs.load_full() != own;
        if configs_changed {
            self.broker_configs.store(Arc::new(configs));
            self.own_broker_configs.store(Arc::new(own));
            self.recompute_effective();
        }
        let groups: GroupConfigs =
            load_json(&self.dir.join("group-configs.json"))?.unwrap_or_default();
        let groups_changed = *self.group_configs.load_full() != groups;
        if groups_changed {
            self.group_configs.store(Arc::new(groups));
        }
        Ok(changed || configs_changed || groups_changed)
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The current topics. Lock-free.
    pub fn snapshot(&self) -> Arc<TopicTable> {
        self.table.load_full()
    }

    /// Applies `change` to a copy of the table, persists it, publishes it. Admin path only.
    fn update<R>(
        &self,
        change: impl FnOnce(&mut TopicTable) -> Result<R, CatalogError>,
    ) -> Result<R, CatalogError> {
        let _guard = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        let _lock = FileLock::take(&self.dir)?;
        // Another broker of the volume may have changed the file since our last reload.
        let mut table: TopicTable = load_json(&self.dir.join("topics.json"))?.unwrap_or_default();
        let r = change(&mut table)?;
        let path = self.dir.join("topics.json");
        store_json(&path, &table)?;
        self.table.store(Arc::new(table));
        *self.topics_stamp.lock().unwrap_or_else(|p| p.into_inner()) = stamp(&path);
        Ok(r)
    }

    /// Whether `topics.json` on the volume was written since this catalog last read or wrote
    /// it: another broker of the cluster created, grew or deleted a topic that this broker
    /// has not seen yet. One `stat`.
    pub fn topics_changed_on_disk(&self) -> bool {
        let now = stamp(&self.dir.join("topics.json"));
        *self.topics_stamp.lock().unwrap_or_else(|p| p.into_inner()) != now
    }

    /// Checks a topic creation without performing it (CreateTopics validate_only uses it too).
    pub fn check_new_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: &BTreeMap<String, String>,
    ) -> Result<(), CatalogError> {
        validate_topic_name(name)?;
        if INTERNAL_TOPICS.contains(&name) {
            return Err(CatalogError::InvalidTopicName(format!(
                "Topic name '{name}' is reserved for Kafka's internal topic; kaas keeps consumer \
                 group offsets and coordinator state outside topics, and does not create it"
            )));
        }
        let snapshot = self.snapshot();
        if snapshot.get(name).is_some() {
            return Err(CatalogError::TopicExists(name.to_string()));
        }
        collision(&snapshot, name)?;
        if !(1..=MAX_PARTITIONS_PER_TOPIC).contains(&partitions) {
            return Err(CatalogError::InvalidPartitions(format!("Number of partitions must be between 1 and {MAX_PARTITIONS_PER_TOPIC}, got {partitions}.")));
        }
        if replication_factor != 1 && replication_factor != -1 {
            return Err(CatalogError::InvalidReplicationFactor(format!(
                "Replication factor {replication_factor} is not supported: kaas keeps exactly one copy of each partition, on its data volume (in cluster mode every broker shares that volume, so leadership moves without copying data, and acks=all waits for fsync). Use replication factor 1 or -1; for more copies, replicate the volume."
            )));
        }
        for (k, v) in configs {
            topic_config::validate(k, v).map_err(CatalogError::InvalidConfig)?;
        }
        Ok(())
    }

    /// Cluster mode: a deleted topic's name is not taken again for `delay` (a few catalog
    /// reload intervals). Until another broker reloads the catalog it still resolves the name
    /// to the deleted topic, and it leads that topic's partitions by name: a producer told of
    /// the new topic would have its records written into the deleted one's files, acknowledged,
    /// and gone (a 3-broker cluster lost 573–600 of 600 acknowledged records that way when a
    /// topic was deleted and created again within a second). CreateTopics waits the rest of the
    /// delay out; auto-creation answers UNKNOWN_TOPIC_OR_PARTITION meanwhile, and clients retry.
    pub fn set_name_reuse_delay(&self, delay: std::time::Duration) {
        self.name_reuse_delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: BTreeMap<String, String>,
    ) -> Result<Arc<TopicMeta>, CatalogError> {
        match self.check_new_topic(name, partitions, replication_factor, &configs) {
            Err(CatalogError::TopicExists(_)) => {
                // This broker's view may predate another broker's deletion of the name.
                self.reload()?;
                self.check_new_topic(name, partitions, replication_factor, &configs)?;
            }
            checked => checked?,
        }
        let delay = self.name_reuse_delay_ms.load(Ordering::Relaxed);
        self.update(|t| {
            if t.topics.contains_key(name) {
                return Err(CatalogError::TopicExists(name.to_string()));
            }
            collision(t, name)?;
            if let Some(&at) = t.deleted.get(name) {
                let age = unix_ms().saturating_sub(at);
                if age < delay {
                    return Err(CatalogError::NameRecentlyDeleted {
                        name: name.to_string(),
                        wait_ms: delay - age,
                    });
                }
            }
            t.deleted.remove(name);
            let meta = Arc::new(TopicMeta {
                name: name.to_string(),
                id: Uuid::new_v4(),
                partitions,
                configs,
                pinned_leaders: BTreeMap::new(),
            });
            t.insert(meta.clone());
            Ok(meta)
        })
    }

    pub fn delete_topic(&self, name: &str) -> Result<Arc<TopicMeta>, CatalogError> {
        self.update(|t| {
            let meta = t
                .remove(name)
                .ok_or_else(|| CatalogError::UnknownTopic(name.to_string()))?;
            let now = unix_ms();
            t.deleted
                .retain(|_, at| now.saturating_sub(*at) < DELETED_NAMES_KEPT_MS);
            t.deleted.insert(name.to_string(), now);
            Ok(meta)
        })
    }

    /// Grows a topic to `total` partitions (never shrinks, as Kafka).
    pub fn set_partition_count(
        &self,
        name: &str,
        total: i32,
        validate_only: bool,
    ) -> Result<Arc<TopicMeta>, CatalogError> {
        let check = |t: &TopicTable| -> Result<Arc<TopicMeta>, CatalogError> {
            let cur = t
                .get(name)
                .ok_or_else(|| CatalogError::UnknownTopic(name.to_string()))?;
            // Kafka's two messages: the same count is not "higher".
            if total == cur.partitions {
                return Err(CatalogError::InvalidPartitions(format!(
                    "Topic already has {total} partition(s)."
                )));
            }
            if total < cur.partitions {
                return Err(CatalogError::InvalidPartitions(format!("Topic currently has {} partitions, which is higher than the requested {total}.", cur.partitions)));
            }
            if total > MAX_PARTITIONS_PER_TOPIC {
                return Err(CatalogError::InvalidPartitions(format!(
                    "Number of partitions must be at most {MAX_PARTITIONS_PER_TOPIC}"
                )));
            }
            Ok(Arc::new(TopicMeta {
                partitions: total,
                ..(**cur).clone()
            }))
        };
        if validate_only {
            return check(&self.snapshot());
        }
        self.update(|t| {
            let meta = check(t)?;
            t.insert(meta.clone());
            Ok(meta)
        })
    }

    /// Replaces a topic's config overrides after validating every entry.
    pub fn set_topic_configs(
        &self,
        name: &str,
        mut configs: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<Arc<TopicMeta>, CatalogError> {
        // A config Kafka 4 removed, carried over from the topic's current ones, is dropped;
        // set anew, it is refused below.
        if let Some(current) = self.snapshot().get(name) {
            configs.retain(|k, v| {
                !(topic_config::REMOVED_IN_KAFKA_4.contains(&k.as_str())
                    && current.configs.get(k) == Some(v))
            });
        }
        for (k, v) in &configs {
            topic_config::validate(k, v).map_err(CatalogError::InvalidConfig)?;
        }
        let build = |t: &TopicTable| -> Result<Arc<TopicMeta>, CatalogError> {
            let cur = t
                .get(name)
                .ok_or_else(|| CatalogError::UnknownTopic(name.to_string()))?;
            Ok(Arc::new(TopicMeta {
                configs: configs.clone(),
                ..(**cur).clone()
            }))
        };
        if validate_only {
            return build(&self.snapshot());
        }
        self.update(|t| {
            let meta = build(t)?;
            t.insert(meta.clone());
            Ok(meta)
        })
    }

    /// Pins (`Some(broker)`) or unpins (`None`) partitions of topic `name`, all or none:
    /// an unknown topic or a partition it does not have fails the whole change.
    pub fn set_pinned_leaders(
        &self,
        name: &str,
        changes: &[(i32, Option<i32>)],
    ) -> Result<Arc<TopicMeta>, CatalogError> {
        self.update(|t| {
            let cur = t
                .get(name)
                .ok_or_else(|| CatalogError::UnknownTopic(name.to_string()))?;
            let mut pins = cur.pinned_leaders.clone();
            for &(partition, broker) in changes {
                if !(0..cur.partitions).contains(&partition) {
                    return Err(CatalogError::UnknownTopic(format!("{name}-{partition}")));
                }
                match broker {
                    Some(b) => pins.insert(partition, b),
                    None => pins.remove(&partition),
                };
            }
            let meta = Arc::new(TopicMeta {
                pinned_leaders: pins,
                ..(**cur).clone()
            });
            t.insert(meta.clone());
            Ok(meta)
        })
    }

    /// The cluster-wide dynamic broker configs (`kafka-configs --entity-default`). Lock-free.
    pub fn broker_configs(&self) -> Arc<BTreeMap<String, String>> {
        self.broker_configs.load_full()
    }

    /// This broker's own dynamic configs (`kafka-configs --entity-name <id>`). Lock-free.
    pub fn own_broker_configs(&self) -> Arc<BTreeMap<String, String>> {
        self.own_broker_configs.load_full()
    }

    /// Says which broker this catalog serves (at start, before any shard runs), and loads
    /// that broker's own dynamic configs.
    pub fn set_broker_id(&self, id: i32) -> Result<(), CatalogError> {
        let first = self.broker_id.set(id).is_ok();
        assert!(
            first || self.broker_id.get() == Some(&id),
            "a catalog serves one broker"
        );
        self.own_broker_configs
            .store(Arc::new(self.load_own_broker_configs()?));
        self.recompute_effective();
        Ok(())
    }

    fn load_own_broker_configs(&self) -> Result<BTreeMap<String, String>, CatalogError> {
        let Some(id) = self.broker_id.get() else {
            return Ok(BTreeMap::new());
        };
        let mut all: BrokerConfigsById =
            load_json(&self.dir.join(BROKER_CONFIGS_BY_ID))?.unwrap_or_default();
        Ok(all.remove(&id.to_string()).unwrap_or_default())
    }

    /// The broker configs given at start (`--broker-config`). Lock-free.
    pub fn static_broker_configs(&self) -> Arc<BTreeMap<String, String>> {
        self.static_broker_configs.load_full()
    }

    /// What the broker runs with: the static configs, each overridden by a dynamic one of the
    /// same name, as Kafka layers server.properties beneath its dynamic configs. Lock-free.
    pub fn effective_broker_configs(&self) -> Arc<BTreeMap<String, String>> {
        self.effective_broker_configs.load_full()
    }

    /// Sets the static layer (at start, before any shard runs), after validating every entry
    /// as kafka-configs would.
    pub fn set_static_broker_configs(
        &self,
        configs: BTreeMap<String, String>,
    ) -> Result<(), CatalogError> {
        for (k, v) in &configs {
            topic_config::validate_broker(k, v).map_err(CatalogError::InvalidConfig)?;
        }
        self.static_broker_configs.store(Arc::new(configs));
        self.recompute_effective();
        Ok(())
    }

    fn recompute_effective(&self) {
        let mut all = (*self.static_broker_configs.load_full()).clone();
        for layer in [
            self.broker_configs.load_full(),
            self.own_broker_configs.load_full(),
        ] {
            all.extend(layer.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        self.effective_broker_configs.store(Arc::new(all));
    }

    /// Replaces the dynamic broker configs of `scope` after validating every entry: the
    /// cluster-wide defaults, or one broker's own (an empty map removes that broker's entry).
    pub fn set_broker_configs(
        &self,
        scope: BrokerScope,
        configs: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<(), CatalogError> {
        // A static name already stored with the same value (`advertised.listeners`, which an
        // earlier kaas accepted) is not a change: refusing it would block every later change
        // to the scope until it was deleted. (A broker alters only its own entry, whose
        // stored copy is in memory; `handlers::configs::this_broker`.)
        let stored = match scope {
            BrokerScope::Default => self.broker_configs(),
            BrokerScope::Broker(_) => self.own_broker_configs(),
        };
        let fixed: Vec<&str> = configs
            .iter()
            .filter(|(k, v)| {
                crate::kafka_static_broker_configs::is_static(k) && stored.get(*k) != Some(*v)
            })
            .map(|(k, _)| k.as_str())
            .collect();
        if !fixed.is_empty() {
            return Err(CatalogError::NotDynamic(fixed.join(", ")));
        }
        for (k, v) in &configs {
            topic_config::validate_dynamic_broker(k, v).map_err(CatalogError::InvalidConfig)?;
        }
        if validate_only {
            return Ok(());
        }
        let _guard = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        let _lock = FileLock::take(&self.dir)?;
        match scope {
            BrokerScope::Default => {
                store_json(&self.dir.join("broker-configs.json"), &configs)?;
                self.broker_configs.store(Arc::new(configs));
            }
            BrokerScope::Broker(id) => {
                // Read from the volume under the lock: other brokers keep their entries here.
                let path = self.dir.join(BROKER_CONFIGS_BY_ID);
                let mut all: BrokerConfigsById = load_json(&path)?.unwrap_or_default();
                if configs.is_empty() {
                    all.remove(&id.to_string());
                } else {
                    all.insert(id.to_string(), configs.clone());
                }
                store_json(&path, &all)?;
                if self.broker_id.get() == Some(&id) {
                    self.own_broker_configs.store(Arc::new(configs));
                }
            }
        }
        self.recompute_effective();
        Ok(())
    }

    /// Every group's config overrides. Lock-free.
    pub fn group_configs(&self) -> Arc<GroupConfigs> {
        self.group_configs.load_full()
    }

    /// Replaces group `group`'s config overrides (an empty map removes them). The caller has
    /// checked them (`groups::config::validate_group_setting`): the catalog stores group
    /// configs, the group coordinator owns what they mean.
    pub fn set_group_configs(
        &self,
        group: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<(), CatalogError> {
        let _guard = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        let _lock = FileLock::take(&self.dir)?;
        // Read from the volume, not the snapshot: another broker may have changed another group.
        let path = self.dir.join("group-configs.json");
        let mut all: GroupConfigs = load_json(&path)?.unwrap_or_default();
        if configs.is_empty() {
            all.remove(group);
        } else {
            all.insert(group.to_string(), configs);
        }
        store_json(&path, &all)?;
        self.group_configs.store(Arc::new(all));
        Ok(())
    }

    /// A fresh producer id for InitProducerId. Lock-free except when a block runs out.
    pub fn allocate_producer_id(&self) -> Result<i64, CatalogError> {
        // Under the mutex throughout: a block change must not interleave with another id, and
        // InitProducerId is rare enough not to need anything lock-free.
        let mut meta = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        let id = self.next_producer_id.load(Ordering::Relaxed);
        if id < meta.producer_id_limit {
            self.next_producer_id.store(id + 1, Ordering::Relaxed);
            return Ok(id);
        }
        // This block is used up: reserve the next free one on the volume, which another broker
        // may have advanced meanwhile.
        let _lock = FileLock::take(&self.dir)?;
        let path = self.dir.join("cluster.json");
        let stored: Option<ClusterMeta> = load_json(&path)?;
        let start = stored
            .map_or(0, |m| m.producer_id_limit)
            .max(meta.producer_id_limit);
        meta.producer_id_limit = start + PRODUCER_ID_BLOCK;
        store_json(&path, &*meta)?;
        self.next_producer_id.store(start + 1, Ordering::Relaxed);
        Ok(start)
    }
}

/// Kafka's cluster ids are URL-safe base64 of 16 random bytes, 22 characters.
fn base64_uuid(id: Uuid) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = id.as_bytes();
    let mut out = String::with_capacity(22);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &b in bytes {
        acc = (acc << 8) | b as u32;
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Topics survive a reopen, names are validated, and deleted names can be created again
    // with a new id (so a new directory).
    #[test]
    fn persist_and_validate() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(dir.path()).unwrap();
        let a = c.create_topic("orders", 3, 1, BTreeMap::new()).unwrap();
        assert_eq!(
            c.create_topic("orders", 3, 1, BTreeMap::new()),
            Err(CatalogError::TopicExists("orders".into()))
        );
        assert!(matches!(
            c.create_topic("bad/name", 1, 1, BTreeMap::new()),
            Err(CatalogError::InvalidTopicName(_))
        ));
        assert!(matches!(
            c.create_topic("x", 1, 3, BTreeMap::new()),
            Err(CatalogError::InvalidReplicationFactor(_))
        ));
        let cid = c.cluster_id().to_string();
        assert_eq!(cid.len(), 22);
        let p1 = c.allocate_producer_id().unwrap();
        drop(c);
        let c = Catalog::open(dir.path()).unwrap();
        assert_eq!(c.cluster_id(), cid);
        assert_eq!(c.snapshot().get("orders").unwrap().id, a.id);
        assert!(c.allocate_producer_id().unwrap() > p1);
        c.delete_topic("orders").unwrap();
        let b = c.create_topic("orders", 1, -1, BTreeMap::new()).unwrap();
        assert_ne!(a.id, b.id);
        assert_ne!(
            a.partition_dir(dir.path(), 0),
            b.partition_dir(dir.path(), 0)
        );
    }

    // As Kafka: names that differ only in `.` against `_` collide, and the internal topics'
    // names are not taken by ordinary topics (kaas created `__consumer_offsets` as a plain
    // topic, which tools then took for Kafka's).
    #[test]
    fn colliding_and_internal_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(dir.path()).unwrap();
        c.create_topic("orders.eu", 1, -1, BTreeMap::new()).unwrap();
        for name in ["orders_eu", "orders.eu"] {
            let e = c.create_topic(name, 1, -1, BTreeMap::new()).unwrap_err();
            assert!(
                matches!(
                    e,
                    CatalogError::InvalidTopicName(_) | CatalogError::TopicExists(_)
                ),
                "{name}: {e}"
            );
        }
        let e = c
            .create_topic("orders_eu", 1, -1, BTreeMap::new())
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Topic 'orders_eu' collides with existing topic: orders.eu"
        );
        c.create_topic("orders-eu", 1, -1, BTreeMap::new()).unwrap();
        c.create_topic("orders_us", 1, -1, BTreeMap::new()).unwrap();
        for name in INTERNAL_TOPICS {
            let e = c.create_topic(name, 1, -1, BTreeMap::new()).unwrap_err();
            assert!(
                matches!(e, CatalogError::InvalidTopicName(_)),
                "{name}: {e}"
            );
        }
        assert!(c.snapshot().get("__consumer_offsets").is_none());
    }

    // Kafka allows 249-character names; with `~<id>` appended such a directory name was
    // longer than NAME_MAX, so the topic was created and every write to it then failed with
    // "File name too long". Every legal name now gets a directory the file system takes, and
    // names that share their first 222 characters still get different directories.
    #[test]
    fn the_longest_legal_topic_names_get_directories() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(dir.path()).unwrap();
        let short = "s".repeat(222);
        let t = c.create_topic(&short, 1, -1, BTreeMap::new()).unwrap();
        assert_eq!(
            topic_dir_name(&t.name, t.id),
            format!("{short}~{}", t.id.simple()),
            "names that fit keep the directory they always had"
        );
        let mut dirs = std::collections::BTreeSet::new();
        for tail in ["a", "b"] {
            let name = format!("{}{tail}", "x".repeat(248));
            validate_topic_name(&name).unwrap();
            let t = c.create_topic(&name, 1, -1, BTreeMap::new()).unwrap();
            let p = t.partition_dir(dir.path(), 0);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("00000000000000000000.0000000000.log"), b"").unwrap();
            let top = p.parent().unwrap().file_name().unwrap().len();
            assert_eq!(top, 255, "{name}: the directory name is NAME_MAX long");
            dirs.insert(p);
        }
        assert_eq!(
            dirs.len(),
            2,
            "names sharing a prefix get different directories"
        );
    }

    // Cluster mode: a broker tells that another changed the topics since it last read them
    // (Metadata then refreshes its view before answering a topic it does not know), and stops
    // telling once it read them or wrote them itself.
    #[test]
    fn a_topic_change_by_another_broker_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let here = Catalog::open(dir.path()).unwrap();
        let there = Catalog::open(dir.path()).unwrap();
        assert!(!here.topics_changed_on_disk());
        there.create_topic("t", 1, 1, BTreeMap::new()).unwrap();
        assert!(here.topics_changed_on_disk());
        assert!(!there.topics_changed_on_disk(), "its own write");
        here.reload().unwrap();
        assert!(!here.topics_changed_on_disk());
        here.create_topic("u", 1, 1, BTreeMap::new()).unwrap();
        assert!(!here.topics_changed_on_disk());
        assert!(there.topics_changed_on_disk());
    }

    // Cluster mode: a name deleted on one broker is not taken again, on any broker of the
    // volume, until the reuse delay has passed; a broker whose view still lists the deleted
    // topic is not told it exists. Other names are unaffected.
    #[test]
    fn a_deleted_name_waits_out_the_reuse_delay_on_every_broker() {
        let dir = tempfile::tempdir().unwrap();
        let here = Catalog::open(dir.path()).unwrap();
        let there = Catalog::open(dir.path()).unwrap();
        for c in [&here, &there] {
            c.set_name_reuse_delay(std::time::Duration::from_millis(400));
        }
        here.create_topic("t", 1, 1, BTreeMap::new()).unwrap();
        there.reload().unwrap();
        here.delete_topic("t").unwrap();
        // `there` has not reloaded: its view still lists the topic.
        assert!(there.snapshot().get("t").is_some());
        match there.create_topic("t", 1, 1, BTreeMap::new()) {
            Err(CatalogError::NameRecentlyDeleted { wait_ms, .. }) => {
                assert!(wait_ms > 0 && wait_ms <= 400, "{wait_ms}");
            }
            other => panic!("created at once: {other:?}"),
        }
        assert!(here.create_topic("other", 1, 1, BTreeMap::new()).is_ok());
        std::thread::sleep(std::time::Duration::from_millis(450));
        let again = there.create_topic("t", 1, 1, BTreeMap::new()).unwrap();
        here.reload().unwrap();
        assert_eq!(here.snapshot().get("t").unwrap().id, again.id);
        assert!(!here.snapshot().deleted.contains_key("t"));
        // Single node (no delay): at once, as before.
        let single = Catalog::open(dir.path()).unwrap();
        single.delete_topic("t").unwrap();
        assert!(single.create_topic("t", 1, 1, BTreeMap::new()).is_ok());
    }

    // Proves: opening an existing catalog writes nothing (a broker on a full disk must start),
    // and producer ids stay unique across reopens all the same.
    #[test]
    fn reopening_writes_nothing_and_ids_stay_unique() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(dir.path()).unwrap();
        let first = c.allocate_producer_id().unwrap();
        drop(c);
        let meta = dir.path().join("__meta");
        let before: Vec<_> = std::fs::read_dir(&meta)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.metadata().unwrap().modified().unwrap())
            })
            .collect();
        let bytes = std::fs::read(meta.join("cluster.json")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let c = Catalog::open(dir.path()).unwrap();
        let mut after: Vec<_> = std::fs::read_dir(&meta)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.metadata().unwrap().modified().unwrap())
            })
            .collect();
        let mut before = before;
        before.sort();
        after.sort();
        assert_eq!(before, after, "opening the catalog changed __meta");
        assert_eq!(std::fs::read(meta.join("cluster.json")).unwrap(), bytes);
        let second = c.allocate_producer_id().unwrap();
        assert!(second > first, "{second} after {first}");
    }

    // A config Kafka cannot change at run time is refused, but one stored by an earlier
    // version that accepted it does not block the other changes of its scope.
    #[test]
    fn a_static_kafka_config_is_refused_unless_it_is_already_stored() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(dir.path()).unwrap();
        c.set_broker_id(0).unwrap();
        let listeners = (
            "advertised.listeners".to_string(),
            "PLAINTEXT://a:9092".to_string(),
        );
        let refused = c.set_broker_configs(
            BrokerScope::Broker(0),
            BTreeMap::from([listeners.clone()]),
            false,
        );
        assert_eq!(
            refused,
            Err(CatalogError::NotDynamic("advertised.listeners".into()))
        );
        // As an earlier kaas stored it.
        let path = dir.path().join("__meta").join(BROKER_CONFIGS_BY_ID);
        let stored = BTreeMap::from([("0".to_string(), BTreeMap::from([listeners.clone()]))]);
        store_json(&path, &stored).unwrap();
        let c = Catalog::open(dir.path()).unwrap();
        c.set_broker_id(0).unwrap();
        let more = BTreeMap::from([
            listeners.clone(),
            ("log.retention.ms".to_string(), "1000".to_string()),
        ]);
        c.set_broker_configs(BrokerScope::Broker(0), more, false)
            .expect("an unchanged stored value is not a change");
        let changed = BTreeMap::from([(listeners.0.clone(), "PLAINTEXT://b:9092".to_string())]);
        assert!(c
            .set_broker_configs(BrokerScope::Broker(0), changed, false)
            .is_err());
    }

    // A broker's own dynamic config (`--entity-name 0`) applies to that broker only, above the
    // cluster-wide default, and removing it leaves the default in place. It used to be stored
    // as the default itself: on a shared volume it applied to every broker, and deleting it
    // from one entity deleted it from both.
    #[test]
    fn a_brokers_own_configs_sit_above_the_cluster_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let zero = Catalog::open(dir.path()).unwrap();
        let one = Catalog::open(dir.path()).unwrap();
        zero.set_broker_id(0).unwrap();
        one.set_broker_id(1).unwrap();
        let map = |v: &str| BTreeMap::from([("log.retention.ms".to_string(), v.to_string())]);
        let retention = |c: &Catalog| {
            c.effective_broker_configs()
                .get("log.retention.ms")
                .cloned()
        };
        zero.set_broker_configs(BrokerScope::Default, map("1000"), false)
            .unwrap();
        zero.set_broker_configs(BrokerScope::Broker(0), map("2000"), false)
            .unwrap();
        one.reload().unwrap();
        assert_eq!(retention(&zero).as_deref(), Some("2000"));
        assert_eq!(
            retention(&one).as_deref(),
            Some("1000"),
            "broker 0's own config stays its own"
        );
        assert_eq!(*zero.broker_configs(), map("1000"));
        one.set_broker_configs(BrokerScope::Broker(1), map("3000"), false)
            .unwrap();
        zero.set_broker_configs(BrokerScope::Broker(0), BTreeMap::new(), false)
            .unwrap();
        one.reload().unwrap();
        assert_eq!(
            retention(&zero).as_deref(),
            Some("1000"),
            "the default is left in place"
        );
        assert_eq!(
            retention(&one).as_deref(),
            Some("3000"),
            "broker 1's entry survives broker 0's removal"
        );
        // A restart loads its own entry.
        let again = Catalog::open(dir.path()).unwrap();
        again.set_broker_id(1).unwrap();
        assert_eq!(retention(&again).as_deref(), Some("3000"));
    }

    // Kafka 4 removed two topic configs. Set anew they are refused, as Kafka 4 refuses them; a
    // topic that has one from an earlier kaas keeps taking config changes and drops it.
    #[test]
    fn configs_kafka_4_removed_are_refused_and_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(dir.path()).unwrap();
        c.create_topic("t", 1, -1, BTreeMap::new()).unwrap();
        let legacy = BTreeMap::from([(
            "message.timestamp.difference.max.ms".to_string(),
            "1000".to_string(),
        )]);
        let e = c.set_topic_configs("t", legacy.clone(), false).unwrap_err();
        assert!(e.to_string().contains("Kafka 4.0 removed it"), "{e}");
        // As an earlier kaas stored it.
        let path = dir.path().join("__meta").join("topics.json");
        let mut doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let text = doc.to_string().replace(
            "\"configs\":{}",
            "\"configs\":{\"message.timestamp.difference.max.ms\":\"1000\"}",
        );
        doc = serde_json::from_str(&text).unwrap();
        std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
        let c = Catalog::open(dir.path()).unwrap();
        assert_eq!(c.snapshot().get("t").unwrap().configs, legacy);
        let mut next = legacy;
        next.insert("retention.ms".into(), "5000".into());
        let t = c.set_topic_configs("t", next, false).unwrap();
        assert_eq!(
            t.configs,
            BTreeMap::from([("retention.ms".to_string(), "5000".to_string())])
        );
    }
}
