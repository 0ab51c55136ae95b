//! One shard: a glommio executor pinned to a core, the partitions it owns, its listener.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use glommio::sync::Semaphore;
use kaas_storage::{LeaderEpoch, PartitionLog, StorageError};
use uuid::Uuid;

use crate::catalog::{Catalog, TopicMeta};
use crate::cluster::ClusterView;
use crate::config::BrokerConfig;
use crate::groups::GroupManager;
use crate::mesh::{Endpoint, Peers};
use crate::probe::ShardProbe;
use crate::topic_config;

/// The shard that owns partition `partition` of `topic`: a stable hash (FNV-1a of the topic
/// name, mixed with the partition) over the shard count. Stable across restarts so a partition
/// always comes back to the same core.
pub fn owner_shard(topic: &str, partition: i32, shards: usize) -> usize {
    kaas_model::partition_shard(topic, partition, shards)
}

/// Removes `topic_dir`, the directory of a topic the catalog no longer lists (its id is never
/// reused, so nothing under it belongs to anyone). Says so on the log when it cannot: the
/// operator then removes it by hand.
pub(crate) fn remove_deleted_topic_dir(topic_dir: &std::path::Path) {
    match std::fs::remove_dir_all(topic_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        // A request opening one of its partitions created files while this removal ran; every
        // open checks the catalog when it ends and removes the directory then.
        Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
            tracing::debug!(dir = %topic_dir.display(), "a deleted topic's directory was written to while it was removed; the open that wrote it removes it")
        }
        Err(e) => {
            tracing::warn!(dir = %topic_dir.display(), error = %e, "a deleted topic's directory could not be removed; remove it by hand")
        }
    }
}

/// A partition slot: the open log, or nothing yet. `opening` makes concurrent first requests
/// for the same partition wait for one open instead of racing two.
struct PartitionSlot {
    log: RefCell<Option<Rc<PartitionLog>>>,
    opening: Semaphore,
    /// When a request last asked for this log: the open-file budget closes the least recently
    /// used idle logs first.
    last_used: std::cell::Cell<std::time::Instant>,
}

/// Cluster mode: when and where this broker took a partition over.
#[derive(Debug, Clone, Copy)]
struct TakenOver {
    /// The leader epoch it took the partition over at: a log the open-file budget closed is
    /// reopened only while the stored epoch is still this one.
    epoch: i32,
    at: std::time::Instant,
    /// The log end offset then: what the previous leaders stored lies before it.
    end_offset: i64,
}

/// State of one shard. Lives on its executor's thread only (`Rc`, `RefCell`); other shards
/// reach it through [`crate::mesh::on_shard`].
pub struct Shard {
    pub id: usize,
    pub nshards: usize,
    pub config: Arc<BrokerConfig>,
    pub catalog: Arc<Catalog>,
    pub probe: Arc<ShardProbe>,
    peers: Peers<Shard>,
    partitions: RefCell<HashMap<(Uuid, i32), Rc<PartitionSlot>>>,
    /// The consumer groups this shard coordinates (see `crate::groups`).
    pub groups: GroupManager,
    /// Who leads what in the cluster, and the write fence (fixed in single-node mode).
    pub cluster: Arc<ClusterView>,
    /// Connection and request-memory admission, shared by every shard.
    pub admission: Arc<crate::admission::Admission>,
    /// Cluster mode: the partitions this shard has taken over and serves, by topic name. Only
    /// [`Shard::take_over`] adds and [`Shard::relinquish`] removes; every partition request
    /// checks it ([`Shard::partition`]).
    serving: RefCell<HashMap<String, std::collections::HashSet<i32>>>,
    /// Logs being closed, by generation, and what the last closes kept (generation, end
    /// offset saved): an acks=all write answered after its partition was handed over is
    /// acknowledged if the close kept it (see [`Shard::kept_on_handover`]).
    closing: RefCell<HashMap<u64, Rc<PartitionLog>>>,
    /// Cluster mode: each served partition's take-over (see [`TakenOver`]).
    taken_epochs: RefCell<HashMap<(Uuid, i32), TakenOver>>,
    /// Logs being opened now (each will hold a descriptor): counted by the open-file budget.
    opening_logs: std::cell::Cell<usize>,
    retired: RefCell<std::collections::VecDeque<(u64, Option<i64>)>>,
    /// Idempotent batches refused before they were stored, whose gap explains the next
    /// batch's sequence (see [`crate::refused`]).
    pub refused: RefCell<crate::refused::RefusedSequences>,
    /// Cluster mode: the leader claims this shard read to report leader epochs in Metadata
    /// (see [`crate::leader_claim`]).
    claims: crate::leader_claim::ClaimCache,
    /// Set when the broker stops (see [`crate::stopping`]).
    pub stopping: crate::stopping::Stopping,
    /// Each partition's queue of appends, in the order their requests arrived here (see
    /// [`crate::turns`]).
    pub append_turns: crate::turns::Turns<(Uuid, i32)>,
    /// The produce rules last resolved, with the topic and the broker configs they came from
    /// (see [`Shard::produce_rules`]).
    produce_rules: RefCell<Option<ResolvedRules>>,
}

type ResolvedRules = (
    Arc<TopicMeta>,
    Arc<std::collections::BTreeMap<String, String>>,
    topic_config::ProduceRules,
);

/// How many closed logs' outcomes [`Shard::kept_on_handover`] remembers. A write's answer
/// follows its close within a sync; a thousand handovers on one shard in between is plenty.
const RETIRED_LOGS: usize = 1024;

impl Shard {
    pub fn new(
        id: usize,
        config: Arc<BrokerConfig>,
        catalog: Arc<Catalog>,
        probe: Arc<ShardProbe>,
        peers: Peers<Shard>,
        cluster: Arc<ClusterView>,
        admission: Arc<crate::admission::Admission>,
    ) -> Shard {
        // Runs on the shard's thread: its partition logs count into its probe from here on.
        kaas_storage::stats::install(probe.storage.clone());
        let groups = GroupManager::new(
            id,
            config.shards,
            &config.data_dir,
            config.group.clone(),
            cluster.enabled(),
            config.sync_scope,
        );
        Shard {
            id,
            nshards: config.shards,
            groups,
            config,
            catalog,
            probe,
            peers,
            partitions: RefCell::new(HashMap::new()),
            cluster,
            admission,
            serving: RefCell::new(HashMap::new()),
            closing: RefCell::new(HashMap::new()),
            opening_logs: std::cell::Cell::new(0),
            taken_epochs: RefCell::new(HashMap::new()),
            retired: RefCell::new(std::collections::VecDeque::new()),
            refused: RefCell::new(crate::refused::RefusedSequences::default()),
            claims: crate::leader_claim::ClaimCache::default(),
            stopping: crate::stopping::Stopping::default(),
            append_turns: crate::turns::Turns::default(),
            produce_rules: RefCell::new(None),
        }
    }

    /// The produce rules of `meta`'s topic under the broker's configs now. A producer writes
    /// to one topic request after request, so the last answer is kept: resolving the rules
    /// looks up seven configs. A changed topic config comes as a new `TopicMeta`, a changed
    /// broker config as a new map, so comparing the two pointers is enough.
    pub fn produce_rules(&self, meta: &Arc<TopicMeta>) -> topic_config::ProduceRules {
        let broker = self.catalog.effective_broker_configs();
        if let Some((m, b, rules)) = &*self.produce_rules.borrow() {
            if Arc::ptr_eq(m, meta) && Arc::ptr_eq(b, &broker) {
                return *rules;
            }
        }
        let rules = topic_config::produce_rules(&meta.configs, &broker);
        *self.produce_rules.borrow_mut() = Some((meta.clone(), broker, rules));
        rules
    }

    /// Whether the log with `generation` — no longer open: closed since the write, or being
    /// closed — kept every offset below `end_offset` for the next leader: its close synced and
    /// saved them before the partition could be handed on (see `PartitionLog::kept_by_close`).
    pub async fn kept_on_handover(&self, generation: u64, end_offset: i64) -> bool {
        let closing = self.closing.borrow().get(&generation).cloned();
        if let Some(log) = closing {
            return log.kept_by_close(end_offset).await;
        }
        self.retired
            .borrow()
            .iter()
            .rev()
            .find(|(g, _)| *g == generation)
            .is_some_and(|(_, end)| end.is_some_and(|e| end_offset <= e))
    }

    /// The leader epoch clients should see for a partition `leader` leads (cluster mode):
    /// this shard's own log's or take-over's epoch when it leads the partition, and otherwise
    /// the leader's published claim (see [`crate::leader_claim`]); -1 when not known.
    pub fn reported_leader_epoch(&self, topic: &TopicMeta, partition: i32, leader: i32) -> i32 {
        if leader == self.cluster.me() && self.owner_of(&topic.name, partition) == self.id {
            if let Some(log) = self.open_partition(topic.id, partition) {
                return log.leader_epoch().0;
            }
            if let Some(t) = self.taken_epochs.borrow().get(&(topic.id, partition)) {
                return t.epoch;
            }
        }
        let dir = topic.partition_dir(&self.config.data_dir, partition);
        let claimed = self.claims.epoch(topic.id, partition, leader, &dir);
        crate::leader_claim::reported_epoch_with_assigned(
            claimed,
            self.cluster.assigned_epoch(&topic.name, partition),
        )
    }

    /// Cluster mode: whether a hole in a producer's sequence on `partition` may be the
    /// previous leader's doing (see `crate::refused`): this broker took the partition over less
    /// than `window` ago, and the producer's last stored batch, ending at `after_offset`, was
    /// stored before that. A batch this broker stored since was the client's next in sequence,
    /// so nothing before it is outstanding on the old leader and a hole after it is the
    /// client's own (Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER).
    pub fn gap_may_predate_take_over(
        &self,
        topic_id: Uuid,
        partition: i32,
        window: std::time::Duration,
        after_offset: Option<i64>,
    ) -> bool {
        self.taken_epochs
            .borrow()
            .get(&(topic_id, partition))
            .is_some_and(|t| {
                t.at.elapsed() < window && after_offset.is_none_or(|o| o < t.end_offset)
            })
    }

    /// Whether this shard serves `topic`/`partition` now: always in single-node mode; in
    /// cluster mode only between its take-over and its relinquish.
    pub fn serves(&self, topic: &str, partition: i32) -> bool {
        !self.cluster.enabled()
            || self
                .serving
                .borrow()
                .get(topic)
                .is_some_and(|s| s.contains(&partition))
    }

    /// Cluster mode: a request for a partition this broker is about to lead waits (up to
    /// [`crate::cluster::CATCH_UP`]) for the take-over, instead of being answered
    /// NOT_LEADER_OR_FOLLOWER. The controller's file reaches every broker within milliseconds,
    /// and each takes its partitions over after applying it, so another broker's Metadata can
    /// name this one as a new topic's leader a few milliseconds before this one serves it:
    /// librdkafka's offsetsForTimes() sent ListOffsets there and does not retry that error
    /// (its test 0054_offset_time failed on a cluster). Waits only while this broker's view
    /// names it the leader, or names no leader yet (the file placing the partition not
    /// applied); a partition another broker leads is answered at once.
    pub async fn await_take_over(&self, topic: &str, partition: i32) {
        let taking_over = || {
            !self.serves(topic, partition)
                && self
                    .cluster
                    .leader(topic, partition)
                    .is_none_or(|l| l == self.cluster.me())
        };
        self.cluster.catch_up(taking_over).await;
    }

    /// Cluster mode: becomes the leader of a partition. The log is opened and recovered (every
    /// write the previous leader acknowledged was fsynced before it stopped), the leader epoch
    /// is raised past every epoch stored, so the first write starts a new segment named by it,
    /// and only then does the partition enter the serving set.
    pub async fn take_over(&self, topic_name: &str, partition: i32) -> Result<(), String> {
        let Some(topic) = self.catalog.snapshot().get(topic_name).cloned() else {
            return Err(format!("topic {topic_name} is not in the catalog"));
        };
        if !(0..topic.partitions).contains(&partition) {
            return Err(format!(
                "{topic_name} has {} partitions, not {partition}",
                topic.partitions
            ));
        }
        // A handle left from an earlier leadership would hold a stale view of the files.
        self.close_partition(topic.id, partition).await;
        let dir = topic.partition_dir(&self.config.data_dir, partition);
        let stored = kaas_storage::stored_leader_epoch(&dir).map_err(|e| e.to_string())?;
        // Above every stored epoch (the fence against an older leader's writes), and at least
        // the epoch the controller gave this leadership, which brokers report until the claim
        // below is published: an epoch reported before must never exceed the real one.
        let assigned = self
            .cluster
            .assigned_epoch(topic_name, partition)
            .unwrap_or(0);
        let epoch = stored.saturating_add(1).max(assigned);
        let log = self
            .open_log(&topic, partition, LeaderEpoch(epoch))
            .await
            .map_err(|e| e.to_string())?;
        tracing::debug!(
            shard = self.id,
            topic = topic_name,
            partition,
            epoch = log.leader_epoch().0,
            log_end_offset = log.log_end_offset(),
            generation = log.generation(),
            "took over"
        );
        self.taken_epochs.borrow_mut().insert(
            (topic.id, partition),
            TakenOver {
                epoch: log.leader_epoch().0,
                at: std::time::Instant::now(),
                end_offset: log.log_end_offset(),
            },
        );
        // Before serving, so that no client learns of this leadership (Metadata names the
        // leader from the assignment) from a broker that would report another epoch for it.
        let claim = crate::leader_claim::LeaderClaim {
            broker: self.cluster.me(),
            epoch: log.leader_epoch().0,
        };
        if let Err(e) = crate::leader_claim::publish(&dir, claim) {
            // Not fatal: the other brokers then report the epoch as unknown (-1), as clients
            // allow; this broker reports it from the log.
            tracing::warn!(topic = topic_name, partition, dir = %dir.display(), error = %e, "could not publish the leader epoch claim; other brokers will report the epoch as unknown");
        }
        // Many take-overs at once open their logs together, before any of them is idle: make
        // room now that this one is open (it reopens on its first use if it is closed).
        drop(log);
        self.stay_within_open_file_budget().await;
        self.serving
            .borrow_mut()
            .entry(topic_name.to_string())
            .or_default()
            .insert(partition);
        Ok(())
    }

    /// Cluster mode: stops leading a partition. It leaves the serving set first, so no new
    /// request is accepted; closing then waits for the appends in flight, fsyncs, and persists
    /// the producer state, so the next leader finds every acknowledged write.
    pub async fn relinquish(&self, topic_name: &str, partition: i32) {
        if let Some(set) = self.serving.borrow_mut().get_mut(topic_name) {
            set.remove(&partition);
        }
        let ids: Vec<Uuid> = {
            let map = self.partitions.borrow();
            map.keys()
                .filter(|(_, p)| *p == partition)
                .map(|(id, _)| *id)
                .collect()
        };
        let snapshot = self.catalog.snapshot();
        // The topic may be gone from the catalog already (deleted): go by id then.
        let named = |id: &Uuid| snapshot.by_id(*id).is_none_or(|t| t.name == topic_name);
        self.taken_epochs
            .borrow_mut()
            .retain(|(id, p), _| *p != partition || !named(id));
        for id in ids {
            if named(&id) {
                self.close_partition(id, partition).await;
            }
        }
    }

    /// Cluster mode: keeps serving a partition only through a log that is still current. A
    /// broker that applies a file which does not follow the one it applied before may have
    /// missed files that moved the partition away and back; if another broker took it over
    /// meanwhile (its take-over raised the stored epoch past this log's), this log's view of
    /// the partition's end is stale, so the partition is relinquished and taken over again.
    /// The same when the accepted assignment gives the partition a higher leader epoch than
    /// this log runs at (moved to none and back in files not applied here): the leader must
    /// run at the epoch every broker reports.
    pub async fn revalidate(&self, topic_name: &str, partition: i32) -> Result<(), String> {
        let Some(topic) = self.catalog.snapshot().get(topic_name).cloned() else {
            return Ok(());
        };
        // A log the open-file budget closed is judged by the epoch it was taken over at.
        let ours = match self.open_partition(topic.id, partition) {
            Some(log) => log.leader_epoch().0,
            None => match self.taken_epochs.borrow().get(&(topic.id, partition)) {
                Some(t) => t.epoch,
                None => return Ok(()),
            },
        };
        let dir = topic.partition_dir(&self.config.data_dir, partition);
        let stored = kaas_storage::stored_leader_epoch(&dir).map_err(|e| e.to_string())?;
        if stored > ours {
            tracing::warn!(
                topic = topic_name,
                partition,
                stored_epoch = stored,
                our_epoch = ours,
                "another broker led this partition since it was opened here: reopening it"
            );
        } else if let Some(assigned) = self
            .cluster
            .assigned_epoch(topic_name, partition)
            .filter(|a| *a > ours)
        {
            // The controller moved it to none and back in files this broker did not see, and
            // every broker now reports the new epoch: a client holding it would be refused
            // (UNKNOWN_LEADER_EPOCH) by a leader still at the old one.
            tracing::info!(
                topic = topic_name,
                partition,
                assigned_epoch = assigned,
                our_epoch = ours,
                "the assignment raised this partition's leader epoch in files not applied here: reopening it at that epoch"
            );
        } else {
            return Ok(());
        }
        self.relinquish(topic_name, partition).await;
        self.take_over(topic_name, partition).await
    }

    async fn close_partition(&self, topic_id: Uuid, partition: i32) {
        let slot = self.partitions.borrow_mut().remove(&(topic_id, partition));
        let Some(slot) = slot else { return };
        let log = slot.log.borrow_mut().take();
        if let Some(log) = log {
            self.closing
                .borrow_mut()
                .insert(log.generation(), log.clone());
            let closed = log.close().await;
            tracing::debug!(shard = self.id, dir = %log.dir().display(), epoch = log.leader_epoch().0, generation = log.generation(), closed_end = ?log.closed_end(), "closed");
            self.closing.borrow_mut().remove(&log.generation());
            {
                let mut retired = self.retired.borrow_mut();
                retired.push_back((log.generation(), log.closed_end()));
                if retired.len() > RETIRED_LOGS {
                    retired.pop_front();
                }
            }
            if let Err(e) = closed {
                if kaas_storage::sync_failure::failure().is_some() {
                    // Every close fails after a failed sync, which was reported once already.
                    tracing::debug!(shard = self.id, dir = %log.dir().display(), error = %e, "closing a partition after a failed sync");
                } else if self.catalog.snapshot().by_id(topic_id).is_none() {
                    // Its topic was deleted: the delete, or an open that found the topic gone
                    // (see `open_log`), removed the directory under this close. Nothing is
                    // lost. (Whether the directory exists says nothing then: another open
                    // may be creating it again, to remove it when it ends.)
                    tracing::debug!(shard = self.id, dir = %log.dir().display(), error = %e, "closing a partition of a deleted topic");
                } else if log.dir().exists() {
                    tracing::error!(shard = self.id, dir = %log.dir().display(), error = %e, "closing a partition failed; the next open recovers it from its log");
                } else {
                    // Its topic was deleted (by another broker) while it closed: nothing is lost.
                    tracing::debug!(shard = self.id, dir = %log.dir().display(), error = %e, "partition directory removed while closing");
                }
            }
            self.probe
                .partitions_open
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            self.count_open_files();
        }
    }

    pub fn peers(&self) -> &Peers<Shard> {
        &self.peers
    }

    pub fn owner_of(&self, topic: &str, partition: i32) -> usize {
        owner_shard(topic, partition, self.nshards)
    }

    /// The open log of a partition this shard owns, opening (and recovering) it on first use.
    pub async fn partition(
        &self,
        topic: &TopicMeta,
        partition: i32,
    ) -> Result<Rc<PartitionLog>, StorageError> {
        debug_assert_eq!(
            self.owner_of(&topic.name, partition),
            self.id,
            "partition served by the wrong shard"
        );
        if !self.serves(&topic.name, partition) {
            // Cluster mode, and another broker leads it (or nobody, during a handover).
            return Err(StorageError::Closed);
        }
        if !self.cluster.may_acknowledge() {
            // Cluster mode with the write fence closed: this broker cannot know that its view
            // of who leads what is current — it may even have "taken over" by a deposed
            // controller's file — and another broker may be leading the partition. So it
            // serves nothing, reads included: a stale leader answering Fetch or
            // OffsetForLeaderEpoch from a log view without the real leader's records makes
            // consumers see a truncation (librdkafka then resets or, with
            // auto.offset.reset=error, stops). Clients retry on NOT_LEADER_OR_FOLLOWER.
            return Err(StorageError::Closed);
        }
        if self.cluster.enabled() && self.open_partition(topic.id, partition).is_none() {
            // Reopening a log the open-file budget closed: only at the epoch this broker took
            // it over at. A different stored epoch means another broker led it since (a move
            // this broker has not applied yet); opening then would write under its epoch.
            let taken = self
                .taken_epochs
                .borrow()
                .get(&(topic.id, partition))
                .map(|t| t.epoch);
            match taken {
                Some(taken) => {
                    let dir = topic.partition_dir(&self.config.data_dir, partition);
                    let stored = kaas_storage::stored_leader_epoch(&dir)?;
                    if stored != taken {
                        tracing::warn!(shard = self.id, topic = %topic.name, partition, stored_epoch = stored, our_epoch = taken, "not reopening a partition another broker led since this one took it over; waiting for the assignment that moves it");
                        return Err(StorageError::Closed);
                    }
                }
                None => {
                    // Served by name but never taken over under this topic's id: the topic was
                    // deleted and created again under the same name while every file this
                    // broker applied kept it the leader. Opened as it was, the log would run
                    // at epoch 0, unclaimed, below the epoch every other broker reports (the
                    // assignment's), and clients holding that epoch would be refused for good.
                    tracing::info!(shard = self.id, topic = %topic.name, partition, "taking over a partition of a topic created again under the same name");
                    if let Err(e) = self.take_over(&topic.name, partition).await {
                        tracing::warn!(shard = self.id, topic = %topic.name, partition, error = %e, "could not take over a partition of a re-created topic");
                        return Err(StorageError::Closed);
                    }
                }
            }
        }
        self.open_log(topic, partition, LeaderEpoch(0)).await
    }

    /// The partition's log, opened (and recovered) at `epoch` unless it is open already;
    /// concurrent callers wait for one open instead of racing two.
    async fn open_log(
        &self,
        topic: &TopicMeta,
        partition: i32,
        epoch: LeaderEpoch,
    ) -> Result<Rc<PartitionLog>, StorageError> {
        let key = (topic.id, partition);
        let slot = self
            .partitions
            .borrow_mut()
            .entry(key)
            .or_insert_with(|| {
                Rc::new(PartitionSlot {
                    log: RefCell::new(None),
                    opening: Semaphore::new(1),
                    last_used: std::cell::Cell::new(std::time::Instant::now()),
                })
            })
            .clone();
        slot.last_used.set(std::time::Instant::now());
        if let Some(log) = slot.log.borrow().as_ref() {
            return Ok(log.clone());
        }
        let _permit = slot
            .opening
            .acquire_permit(1)
            .await
            .map_err(|_| StorageError::Closed)?;
        if let Some(log) = slot.log.borrow().as_ref() {
            return Ok(log.clone());
        }
        if self.catalog.snapshot().by_id(topic.id).is_none() {
            // Deleted while this request waited for another's open of the same log (which
            // then found the topic gone and kept nothing): opening again would only create
            // the deleted topic's directory anew.
            return Err(StorageError::Closed);
        }
        // Room first: the log about to open needs at least one descriptor (and so does every
        // other open under way).
        self.opening_logs.set(self.opening_logs.get() + 1);
        self.make_room_for_open_files(key, self.opening_logs.get())
            .await;
        let dir = topic.partition_dir(&self.config.data_dir, partition);
        let opened = PartitionLog::open(dir, self.log_config(topic), epoch).await;
        self.opening_logs.set(self.opening_logs.get() - 1);
        if self.catalog.snapshot().by_id(topic.id).is_none() {
            // The topic was deleted while this open ran (or the caller's view of it predates
            // the delete: a produce request that looked the topic up before it, a background
            // pass's snapshot). Its close already passed this slot by, so a log kept now would
            // hold the deleted files' descriptors and space for the broker's life (a full-disk
            // test found 48 MiB pinned that way). And the delete may have removed the topic's
            // directory before this open created it again (kafka-go's suite left seven such
            // directories, segments included): no topic id points to it any more, so nothing
            // else would ever remove it. A topic id is never reused, so whatever is under its
            // directory now belongs to no one.
            self.partitions.borrow_mut().remove(&key);
            if let Ok(log) = &opened {
                if let Err(e) = log.close().await {
                    tracing::debug!(shard = self.id, topic = %topic.name, partition, error = %e, "closing the log of a topic deleted while it opened");
                }
            }
            remove_deleted_topic_dir(&self.config.data_dir.join(topic.dir_name()));
            return Err(StorageError::Closed);
        }
        let log = opened?;
        *slot.log.borrow_mut() = Some(log.clone());
        self.probe
            .partitions_open
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.count_open_files();
        Ok(log)
    }

    /// Closes the least recently used idle logs until the shard's open segment files fit its
    /// budget.
    pub async fn stay_within_open_file_budget(&self) {
        self.make_room_for_open_files((Uuid::nil(), -1), 0).await;
    }

    /// Closes the least recently used idle logs of this shard until their segment files plus
    /// `room` fit the shard's budget (`BrokerConfig::open_log_files_per_shard`). A log is idle
    /// when nothing but the shard holds it (no request, long poll or background pass in it);
    /// `keep` is never closed. Closing syncs and saves the log's index and producer state, so
    /// its next use reopens it without a recovery scan. With more busy logs than the budget
    /// allows, it is exceeded rather than refusing service.
    async fn make_room_for_open_files(&self, keep: (Uuid, i32), room: usize) {
        let budget = self.config.open_log_files_per_shard;
        loop {
            let (open, victim) = {
                let map = self.partitions.borrow();
                let mut open = 0usize;
                let mut victim: Option<((Uuid, i32), std::time::Instant)> = None;
                for (k, slot) in map.iter() {
                    let Some(log) = slot.log.borrow().clone() else {
                        continue;
                    };
                    open += log.open_files();
                    // Two references: the slot's and the clone just taken.
                    let idle = Rc::strong_count(&log) == 2;
                    if *k != keep && idle && victim.is_none_or(|(_, t)| slot.last_used.get() < t) {
                        victim = Some((*k, slot.last_used.get()));
                    }
                }
                (open, victim)
            };
            if open + room <= budget {
                return;
            }
            let Some(((id, partition), _)) = victim else {
                if open >= budget {
                    crate::ratelog::limited("open-log-budget", |suppressed| {
                        tracing::warn!(shard = self.id, open, budget, suppressed, "every open partition log is busy, so the open-file budget is exceeded until some go idle; raise --max-open-log-files (and `ulimit -n`) if this persists");
                    });
                }
                return;
            };
            self.close_partition(id, partition).await;
            self.probe
                .logs_evicted
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Publishes how many segment files this shard's open logs hold (for /metrics).
    fn count_open_files(&self) {
        let open: usize = self
            .partitions
            .borrow()
            .values()
            .filter_map(|s| s.log.borrow().as_ref().map(|l| l.open_files()))
            .sum();
        self.probe
            .log_files_open
            .store(open as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// The open log of a partition if it is already open (no IO).
    pub fn open_partition(&self, topic_id: Uuid, partition: i32) -> Option<Rc<PartitionLog>> {
        self.partitions
            .borrow()
            .get(&(topic_id, partition))
            .and_then(|s| s.log.borrow().clone())
    }

    /// The log engine settings of a topic's partitions: its configs over the broker's dynamic
    /// defaults, and the broker's sync scope. One log may hold half the shard's open-file
    /// budget in segments, so a partition rolling on every batch leaves the rest to the others.
    fn log_config(&self, topic: &TopicMeta) -> kaas_storage::LogConfig {
        kaas_storage::LogConfig {
            sync_scope: self.config.sync_scope,
            max_segments: (self.config.open_log_files_per_shard / 2).max(8),
            ..topic_config::log_config(&topic.configs, &self.catalog.effective_broker_configs())
        }
    }

    /// Applies the dynamic broker configs after they changed: the connection limits (shared by
    /// every shard; each applying them is harmless), and every topic's effective configs to the
    /// open logs on this shard.
    pub fn apply_dynamic_configs(&self) {
        let (connections, per_ip) =
            topic_config::connection_limits(&self.catalog.effective_broker_configs());
        self.admission.set_connection_limits(connections, per_ip);
        for topic in self.catalog.snapshot().topics.values() {
            self.apply_topic_config(topic);
        }
    }

    /// Applies a topic's new configs to its open logs on this shard.
    pub fn apply_topic_config(&self, topic: &TopicMeta) {
        let cfg = self.log_config(topic);
        for ((id, _), slot) in self.partitions.borrow().iter() {
            if *id == topic.id {
                if let Some(log) = slot.log.borrow().as_ref() {
                    log.set_config(cfg.clone());
                }
            }
        }
    }

    /// Publishes for `/metrics` what this shard cannot keep in counters: the offsets of the
    /// partitions it leads and the groups it coordinates, and how many series the limit left
    /// out (see [`crate::probe::Published`]).
    pub fn publish_for_metrics(&self) {
        // Rolls add segment files to open logs between their opens and closes.
        self.count_open_files();
        let published = &self.probe.published;
        let partitions_omitted = self.publish_partition_offsets();
        let (groups, groups_omitted) = self
            .groups
            .samples(self.config.metrics_partition_series_limit);
        if **published.groups.load() != groups {
            published.groups.store(Arc::new(groups));
        }
        published.omitted.store(
            partitions_omitted + groups_omitted,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Publishes the offsets of the partitions this shard leads: read from the open logs; a partition whose log the
    /// open-file budget closed keeps the offsets last published while this shard still leads
    /// it (nothing was written since: a write would have reopened it). At most
    /// `--metrics-partition-series-limit` series (two per partition); returns how many were
    /// left out.
    fn publish_partition_offsets(&self) -> u64 {
        use crate::probe::PartitionOffsets;
        let entries = self.config.metrics_partition_series_limit / 2;
        let previous = self.probe.published.partitions.load();
        let snapshot = self.catalog.snapshot();
        let mut out: Vec<PartitionOffsets> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut omitted = 0u64;
        for ((id, p), slot) in self.partitions.borrow().iter() {
            let (Some(topic), Some(log)) = (snapshot.by_id(*id), slot.log.borrow().clone()) else {
                continue;
            };
            if !self.serves(&topic.name, *p) {
                continue;
            }
            seen.insert((topic.id, *p));
            if out.len() >= entries {
                omitted += 2;
                continue;
            }
            out.push(PartitionOffsets {
                topic: Arc::from(topic.name.as_str()),
                topic_id: topic.id,
                partition: *p,
                log_start: log.log_start_offset(),
                high_watermark: log.high_watermark(),
            });
        }
        for old in previous.iter() {
            let led = snapshot
                .get(&old.topic)
                .is_some_and(|t| t.id == old.topic_id && old.partition < t.partitions)
                && self.owner_of(&old.topic, old.partition) == self.id
                && self.serves(&old.topic, old.partition);
            if led && !seen.contains(&(old.topic_id, old.partition)) {
                if out.len() < entries {
                    out.push(old.clone());
                } else {
                    omitted += 2;
                }
            }
        }
        out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        if out != **previous {
            self.probe.published.partitions.store(Arc::new(out));
        }
        omitted
    }

    /// Closes every open partition of a topic on this shard (DeleteTopics); the caller removes
    /// the directory once all shards have done so.
    pub async fn close_topic(&self, topic_id: Uuid) {
        let partitions: Vec<i32> = self
            .partitions
            .borrow()
            .keys()
            .filter(|(id, _)| *id == topic_id)
            .map(|(_, p)| *p)
            .collect();
        for p in partitions {
            self.close_partition(topic_id, p).await;
        }
    }

    /// Closes the open logs of topics the catalog no longer lists: another broker deleted them
    /// (the broker that handles DeleteTopics closes its own before removing the files). Then
    /// removes their directories: a log this broker opened from a view older than the delete
    /// may have created its directory again after the deleting broker removed it.
    pub async fn close_deleted_topics(&self) {
        let snapshot = self.catalog.snapshot();
        // Per deleted topic, its directory as any of its open logs names it (a slot still
        // opening names none, and must not hide one that does).
        let mut gone: HashMap<Uuid, Option<std::path::PathBuf>> = HashMap::new();
        for ((id, _), slot) in self.partitions.borrow().iter() {
            if snapshot.by_id(*id).is_some() {
                continue;
            }
            let dir = gone.entry(*id).or_default();
            if dir.is_none() {
                *dir = slot
                    .log
                    .borrow()
                    .as_ref()
                    .and_then(|l| l.dir().parent().map(Into::into));
            }
        }
        for (id, topic_dir) in gone {
            self.close_topic(id).await;
            if let Some(dir) = topic_dir {
                remove_deleted_topic_dir(&dir);
            }
        }
    }

    /// Clean shutdown: every open partition is fsynced and its manifest written.
    pub async fn close_all(&self) {
        let slots: Vec<Rc<PartitionSlot>> = self
            .partitions
            .borrow_mut()
            .drain()
            .map(|(_, s)| s)
            .collect();
        // Concurrently: each close waits on its own fdatasync, and io_uring runs them together.
        let closes = slots.into_iter().filter_map(|slot| slot.log.borrow_mut().take()).map(|log| async move {
            match log.close().await {
                // Every close fails after a failed sync, which was reported once already.
                Err(e) if kaas_storage::sync_failure::failure().is_some() => {
                    tracing::debug!(shard = self.id, dir = %log.dir().display(), error = %e, "closing a partition after a failed sync");
                }
                Err(e) => {
                    tracing::error!(shard = self.id, dir = %log.dir().display(), error = %e, "closing partition failed; it will be recovered from its log on next start");
                }
                Ok(()) => {}
            }
        });
        futures::future::join_all(closes).await;
    }
}

impl Endpoint for Shard {
    fn shard_id(&self) -> usize {
        self.id
    }
    fn peers(&self) -> &Peers<Self> {
        Shard::peers(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Ownership is stable, in range, and spreads a topic's partitions over the shards.
    #[test]
    fn ownership_spreads() {
        let mut counts = [0usize; 4];
        for p in 0..400 {
            let s = owner_shard("orders", p, 4);
            assert_eq!(s, owner_shard("orders", p, 4));
            counts[s] += 1;
        }
        assert!(counts.iter().all(|c| *c == 100), "{counts:?}");
        assert_eq!(owner_shard("x", 3, 1), 0);
    }
}
