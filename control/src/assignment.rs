//! `assignment.json`: the one published answer to "who leads what", its writer and its watcher.
//!
//! The controller writes `<shared>/__cluster/assignment.json` after every recompute; every
//! broker (the controller included) follows it. Metadata, the Produce/Fetch ownership check,
//! FindCoordinator and `/healthz` all read the view accepted here, so there is no second
//! authority to disagree with.
//!
//! - [`Assignment`] is the file's model (SPEC fields: `controller_epoch`,
//!   `assignment_version`, `brokers` with health `alive | draining | dead` — dead rows are kept
//!   because the group-coordinator hash divides by the full registered list — `partitions` →
//!   leader and `consumer_groups` → coordinator).
//! - Its versions are a [`Chain`]: `assignment.<n>.json`, each created exactly once with
//!   compare-and-swap semantics and no lock (see [`crate::chain`]); `assignment.json` is a copy
//!   of the newest for operators. [`claim_epoch`] and [`write_fenced`] are the controller's
//!   two writes; readers take the newest version ([`read_published`]).
//! - [`AssignmentWatcher`] re-reads the newest version every second and whenever
//!   [`AssignmentNotifier::notify`] is called (the heartbeat's ASSIGNMENT_CHANGED push). It
//!   re-opens rather than watching with inotify because the shared volume is NFS in production:
//!   inotify does not see other hosts' writes there, and a renamed file is only seen on the next
//!   `open()`.
//! - [`accept`] is the epoch fence and [`diff`] the takeover plan; both are pure.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::{watch, Notify};

use crate::balancer::{self, coordinator_for_group, BrokerId, TopicPartition};
use crate::chain::{AppendError, Chain};

/// Directory under the shared volume that holds cluster-wide files.
pub const CLUSTER_DIR: &str = "__cluster";

/// A registered broker's health as the controller last judged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Heartbeating, healthy, not draining: may lead partitions and coordinate groups.
    Alive,
    /// Heartbeating but shutting down: its partitions are being moved away.
    Draining,
    /// Not heard from within the timeout (or reporting unhealthy). The row is kept: the
    /// coordinator hash divides by every registered broker, and DescribeCluster reports it fenced.
    Dead,
}

/// One row of `brokers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerEntry {
    /// Broker id.
    pub id: BrokerId,
    /// Advertised Kafka host (what Metadata tells clients).
    pub host: String,
    /// Advertised Kafka port.
    pub port: u16,
    /// Rack (zone), if the broker reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// Health at the time of writing.
    pub health: Health,
}

/// One row of `partitions` in the file: a list, because JSON object keys can only be strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PartitionRow {
    topic: String,
    partition: i32,
    leader: BrokerId,
}

/// The contents of `assignment.json`.
///
/// Not to be confused with [`balancer::Assignment`], the bare partition → leader map that the
/// balancer computes and that [`Assignment::partitions`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The Lease epoch (`leaseTransitions`) of the controller that wrote this file.
    pub controller_epoch: u64,
    /// Rises with every file a controller writes; with the epoch it orders assignments.
    pub assignment_version: u64,
    /// Every broker ever registered, sorted by id, dead rows included.
    pub brokers: Vec<BrokerEntry>,
    /// Partition leadership.
    #[serde(with = "partition_rows")]
    pub partitions: balancer::Assignment,
    /// Consumer group → coordinator, computed with [`coordinator_for_group`].
    #[serde(default)]
    pub consumer_groups: BTreeMap<String, BrokerId>,
    /// Partitions between leaders: taken from `from`, not yet given to `to`, because `from`
    /// has neither confirmed that it stopped acknowledging writes nor been silent long enough
    /// to have stopped on its own (see [`crate::handover`]). They have no leader meanwhile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingMove>,
}

/// A partition on its way from one leader to another (see [`Assignment::pending`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingMove {
    /// Topic.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// The leader that must stop first.
    pub from: BrokerId,
    /// The leader it goes to once `from` has stopped.
    pub to: BrokerId,
    /// `(controller_epoch, assignment_version)` of the first file that took the partition from
    /// `from`: once `from` reports having applied this (or a later) file, it has closed the
    /// partition.
    pub since: (u64, u64),
}

impl PendingMove {
    /// The partition.
    pub fn tp(&self) -> TopicPartition {
        TopicPartition::new(self.topic.clone(), self.partition)
    }
}

/// Serializes the partition map as a sorted list of `{topic, partition, leader}` rows and
/// refuses a file that lists a partition twice (that file was not written by a controller).
mod partition_rows {
    use super::*;
    use serde::de::Error as _;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(map: &balancer::Assignment, s: S) -> Result<S::Ok, S::Error> {
        let rows: Vec<PartitionRow> = map
            .iter()
            .map(|(tp, leader)| PartitionRow {
                topic: tp.topic.clone(),
                partition: tp.partition,
                leader: *leader,
            })
            .collect();
        rows.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<balancer::Assignment, D::Error> {
        let rows = Vec::<PartitionRow>::deserialize(d)?;
        let mut map = balancer::Assignment::new();
        for row in rows {
            let tp = TopicPartition::new(row.topic, row.partition);
            if map.insert(tp.clone(), row.leader).is_some() {
                return Err(D::Error::custom(format!("partition {tp} listed twice")));
            }
        }
        Ok(map)
    }
}

impl Assignment {
    /// Builds a file's contents: sorts the broker rows and computes every listed group's
    /// coordinator over the full broker list (only `Alive` brokers coordinate).
    pub fn new(
        controller_epoch: u64,
        assignment_version: u64,
        mut brokers: Vec<BrokerEntry>,
        partitions: balancer::Assignment,
        groups: impl IntoIterator<Item = String>,
    ) -> Self {
        brokers.sort_by_key(|b| b.id);
        brokers.dedup_by_key(|b| b.id);
        let mut out = Self {
            controller_epoch,
            assignment_version,
            brokers,
            partitions,
            consumer_groups: BTreeMap::new(),
            pending: Vec::new(),
        };
        out.consumer_groups = groups
            .into_iter()
            .filter_map(|g| out.coordinator(&g).map(|c| (g, c)))
            .collect();
        out
    }

    /// `(controller_epoch, assignment_version)`: the order in which assignments supersede each
    /// other. A higher epoch wins whatever its version, because a new controller may not have
    /// seen the last version its predecessor wrote.
    pub fn order_key(&self) -> (u64, u64) {
        (self.controller_epoch, self.assignment_version)
    }

    /// The leader of a partition, if the partition exists.
    pub fn leader(&self, tp: &TopicPartition) -> Option<BrokerId> {
        self.partitions.get(tp).copied()
    }

    /// The broker row for `id`.
    pub fn broker(&self, id: BrokerId) -> Option<&BrokerEntry> {
        self.brokers.iter().find(|b| b.id == id)
    }

    /// Partitions led by `me`, in order.
    pub fn led_by(&self, me: BrokerId) -> impl Iterator<Item = &TopicPartition> {
        self.partitions
            .iter()
            .filter(move |(_, l)| **l == me)
            .map(|(tp, _)| tp)
    }

    /// The coordinator of `group`: the listed one, or — for a group the controller did not know
    /// when it wrote the file — the same hash over the same broker rows, so every broker gives
    /// the same answer without waiting for a recompute.
    pub fn coordinator(&self, group: &str) -> Option<BrokerId> {
        if let Some(c) = self.consumer_groups.get(group) {
            return Some(*c);
        }
        let ids: Vec<BrokerId> = self.brokers.iter().map(|b| b.id).collect();
        coordinator_for_group(group, &ids, |id| {
            self.broker(id).is_some_and(|b| b.health == Health::Alive)
        })
    }

    /// Parses a file's bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The file's bytes (pretty-printed: operators read this file).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("assignment serializes");
        out.push(b'\n');
        out
    }
}

/// The versions of `assignment.json` in `<shared>/__cluster/`.
pub fn assignment_chain(shared_dir: &Path) -> Chain {
    Chain::new(shared_dir.join(CLUSTER_DIR), CHAIN_STEM)
}

const CHAIN_STEM: &str = "assignment";

/// The newest published assignment and its place in the chain.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// Its version in the [`Chain`] (not the `assignment_version`: a deposed controller and
    /// its successor can write the same `assignment_version`, never the same `seq`).
    pub seq: u64,
    /// The file.
    pub assignment: Assignment,
}

/// The newest version: `Ok(None)` when no controller has written one yet. An `assignment.json`
/// left by an older kaas (no versions beside it) is read as version 0.
pub fn read_published(chain: &Chain) -> Result<Option<Published>, ReadError> {
    let head = chain
        .read_head(|_| Some(0))
        .map_err(|source| ReadError::Io {
            path: chain.mirror_path(),
            source,
        })?;
    head.map(|h| {
        Assignment::from_json(&h.bytes)
            .map(|assignment| Published {
                seq: h.seq,
                assignment,
            })
            .map_err(|source| ReadError::Corrupt {
                path: chain.entry_path(h.seq),
                source,
            })
    })
    .transpose()
}

/// Why a controller's write did not happen.
#[derive(Debug, Error)]
pub enum FenceError {
    /// A controller with a higher epoch has written: this one is deposed.
    #[error("assignment.json was written by controller epoch {claimed}, above ours ({ours})")]
    Deposed { claimed: u64, ours: u64 },
    /// Someone wrote since the version this write was decided from: claim again.
    #[error("assignment.json changed since it was read (written by another controller)")]
    Conflict,
    /// The files could not be used, or the newest is not a valid assignment.
    #[error("{0}")]
    Io(String),
}

impl From<AppendError> for FenceError {
    fn from(e: AppendError) -> Self {
        match e {
            AppendError::Conflict => FenceError::Conflict,
            AppendError::Io(e) => FenceError::Io(e.to_string()),
        }
    }
}

/// A new controller at `epoch` takes `assignment.json` over: it republishes the newest file it
/// knows — the chain's head, or `known` (what its own watcher accepted) if that is newer by
/// (epoch, version) — under its own epoch, as the next version of the chain.
///
/// The claim is a write, not a read, because the write is what fences: a deposed controller
/// frozen with a file it computed earlier finishes its append after that file's base, which
/// now exists, so its write is refused ([`FenceError::Conflict`], then [`FenceError::Deposed`]
/// when it claims again). A deposed write that landed first is the head, and is read and
/// carried forward here. Either way this term's first file is based on every file that ever
/// took effect, which is what [`crate::heartbeat::AckFloor`]'s term floor relies on.
/// The republished file moves nothing: it differs from its base only in epoch and version.
///
/// Returns the file now in force (`None` when nothing was ever written: there is then nothing
/// to carry forward, and the term's first real write is the claim).
pub fn claim_epoch(
    chain: &Chain,
    epoch: u64,
    known: Option<&Assignment>,
) -> Result<Option<Published>, FenceError> {
    for _ in 0..16 {
        let (head_seq, head) = match read_published(chain) {
            Ok(Some(p)) => (Some(p.seq), Some(p.assignment)),
            Ok(None) => (None, None),
            // A garbage head is skipped over when something newer is known (a torn or forged
            // file must not stop the cluster); with nothing to carry forward it is an error.
            Err(ReadError::Corrupt { .. }) if known.is_some() => (
                chain
                    .versions()
                    .map_err(|e| FenceError::Io(e.to_string()))?
                    .last()
                    .copied(),
                None,
            ),
            Err(e) => return Err(FenceError::Io(e.to_string())),
        };
        if let Some(h) = &head {
            if h.controller_epoch > epoch {
                return Err(FenceError::Deposed {
                    claimed: h.controller_epoch,
                    ours: epoch,
                });
            }
        }
        let Some(base) = [head.as_ref(), known]
            .into_iter()
            .flatten()
            .max_by_key(|a| a.order_key())
        else {
            return Ok(None);
        };
        if base.controller_epoch == epoch && head.as_ref() == Some(base) {
            // Already ours (a claim again after our own write).
            return Ok(Some(Published {
                seq: head_seq.expect("a head was read"),
                assignment: base.clone(),
            }));
        }
        let mut next = base.clone();
        next.controller_epoch = epoch;
        next.assignment_version = base.assignment_version + 1;
        match chain.append(head_seq, &next.to_json()) {
            Ok(seq) => {
                return Ok(Some(Published {
                    seq,
                    assignment: next,
                }))
            }
            Err(AppendError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(FenceError::Io(
        "assignment.json keeps changing under the claim".into(),
    ))
}

/// Publishes `assignment` as the version after `base` (the `seq` of the file it was computed
/// from, as returned by [`claim_epoch`] or the previous write). [`FenceError::Conflict`] if
/// anyone wrote in between: the caller claims again. Durable when it returns.
pub fn write_fenced(
    chain: &Chain,
    base: Option<u64>,
    assignment: &Assignment,
) -> Result<u64, FenceError> {
    Ok(chain.append(base, &assignment.to_json())?)
}

/// Appends `assignment` after whatever is newest, unconditionally (retrying conflicts): for
/// tests and tools standing in for a controller, never for a controller.
pub fn publish(chain: &Chain, assignment: &Assignment) -> io::Result<u64> {
    loop {
        let head = chain.versions()?.last().copied();
        match chain.append(head, &assignment.to_json()) {
            Ok(seq) => return Ok(seq),
            Err(AppendError::Conflict) => continue,
            Err(AppendError::Io(e)) => return Err(e),
        }
    }
}

/// Why a read of `assignment.json` produced no assignment.
#[derive(Debug, Error)]
pub enum ReadError {
    /// Opening or reading failed (other than the file not existing yet).
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The bytes are not a valid assignment: torn, truncated or foreign. The caller keeps its
    /// last good assignment.
    #[error("{path} is not a valid assignment: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
}

/// What a broker does with an assignment it just read. See [`accept`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Newer than anything accepted and written by a current controller: apply it.
    Accept,
    /// Same `(epoch, version)` as the current assignment: nothing to do.
    Unchanged,
    /// Written by a controller whose epoch is below the Lease epoch this broker knows: a
    /// deposed controller. Ignore it.
    StaleEpoch {
        /// The file's `controller_epoch`.
        candidate: u64,
        /// The Lease epoch known to this broker.
        lease_epoch: u64,
    },
    /// Older `(epoch, version)` than the assignment already accepted. Ignore it.
    Older {
        /// The accepted assignment's `(epoch, version)`.
        current: (u64, u64),
        /// The file's `(epoch, version)`.
        candidate: (u64, u64),
    },
}

impl Decision {
    /// Whether the candidate should be applied.
    pub fn is_accept(&self) -> bool {
        matches!(self, Decision::Accept)
    }
}

/// The epoch fence: whether a broker holding `current` should apply `candidate`.
///
/// - **Reject a `controller_epoch` below `lease_epoch`.** The Lease epoch rises exactly when the
///   controller changes, so a file stamped with a lower epoch was written by a controller that
///   has since been replaced — typically one that was paused (GC, SIGSTOP) past its Lease and
///   finished a write after waking. Applying it would roll leadership back to a plan the new
///   controller has already superseded, and two brokers could both believe they lead a
///   partition. The election module stops a holder from *starting* actions after its deadline;
///   this rule catches the one write it may still *finish*.
/// - **Never go back** to a lower `(controller_epoch, assignment_version)` than the one already
///   accepted, even when the Lease epoch this broker knows is stale itself: the accepted file
///   proves its epoch existed, and an older file seen later can only be a stale read (NFS
///   attribute caches) or a late write by a deposed controller.
/// - Equal keys are [`Decision::Unchanged`]: one controller never writes two different files
///   with the same version, so re-reading the same key is just the poll seeing the same file.
/// - Otherwise accept. A new controller's first file may carry a *lower* version than its
///   predecessor's last; the higher epoch alone makes it newer.
pub fn accept(current: Option<&Assignment>, candidate: &Assignment, lease_epoch: u64) -> Decision {
    if candidate.controller_epoch < lease_epoch {
        return Decision::StaleEpoch {
            candidate: candidate.controller_epoch,
            lease_epoch,
        };
    }
    if let Some(current) = current {
        let (cur, cand) = (current.order_key(), candidate.order_key());
        if cand < cur {
            return Decision::Older {
                current: cur,
                candidate: cand,
            };
        }
        if cand == cur {
            return Decision::Unchanged;
        }
    }
    Decision::Accept
}

/// What changes for broker `me` when it moves from `old` to `new`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// Partitions `me` leads in `new` but not in `old`: open, recover, raise the leader epoch,
    /// start a new segment, then serve. Sorted.
    pub take_over: Vec<TopicPartition>,
    /// Partitions `me` led in `old` but not in `new` (moved or deleted): stop acknowledging,
    /// persist manifest and producer state, close. Sorted.
    pub relinquish: Vec<TopicPartition>,
}

impl Diff {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.take_over.is_empty() && self.relinquish.is_empty()
    }
}

/// The partitions `me` must take over and relinquish going from `old` (none before the first
/// accepted assignment) to `new`. Only partitions whose leadership changed for `me` appear, so
/// the work of applying an assignment is proportional to what moved, not to the partition count.
pub fn diff(old: Option<&Assignment>, new: &Assignment, me: BrokerId) -> Diff {
    let before: BTreeSet<&TopicPartition> = old.map(|a| a.led_by(me).collect()).unwrap_or_default();
    let after: BTreeSet<&TopicPartition> = new.led_by(me).collect();
    Diff {
        take_over: after.difference(&before).map(|tp| (*tp).clone()).collect(),
        relinquish: before.difference(&after).map(|tp| (*tp).clone()).collect(),
    }
}

/// Wakes an [`AssignmentWatcher`] for an immediate re-read. Cheap to clone; the heartbeat client
/// calls it on ASSIGNMENT_CHANGED.
#[derive(Debug, Clone)]
pub struct AssignmentNotifier(Arc<Notify>);

impl AssignmentNotifier {
    /// Re-read the file now instead of at the next poll. Calls made while a read is in progress
    /// cause one more read afterwards, so a push is never lost.
    pub fn notify(&self) {
        self.0.notify_one();
    }
}

/// Follows `assignment.json`: polls every `poll_interval` (1 s by default) and on
/// [`AssignmentNotifier::notify`], fences each candidate with [`accept`], and publishes every
/// accepted assignment through a `watch` channel.
///
/// A missing, unreadable, torn or stale file never replaces the last accepted assignment.
#[derive(Debug)]
pub struct AssignmentWatcher {
    chain: Chain,
    poll_interval: Duration,
    notify: Arc<Notify>,
    lease_epoch: Arc<AtomicU64>,
    tx: watch::Sender<Option<Arc<Assignment>>>,
    /// The bytes of the last read, so an unchanged file is not parsed again every second.
    last_bytes: Option<Vec<u8>>,
}

/// The default poll period (SPEC: 1 s; the heartbeat push is the fast path).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

impl AssignmentWatcher {
    /// A watcher of `chain` (see [`assignment_chain`]); nothing is read until
    /// [`Self::poll_once`] or [`Self::run`].
    pub fn new(chain: Chain, poll_interval: Duration) -> Self {
        Self {
            chain,
            poll_interval,
            notify: Arc::new(Notify::new()),
            lease_epoch: Arc::new(AtomicU64::new(0)),
            tx: watch::channel(None).0,
            last_bytes: None,
        }
    }

    /// A handle that triggers an immediate re-read.
    pub fn notifier(&self) -> AssignmentNotifier {
        AssignmentNotifier(self.notify.clone())
    }

    /// A handle to raise the Lease epoch the fence compares against.
    pub fn lease_epoch(&self) -> LeaseEpoch {
        LeaseEpoch(self.lease_epoch.clone())
    }

    /// Every accepted assignment (`None` until the first one).
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Assignment>>> {
        self.tx.subscribe()
    }

    /// The last accepted assignment.
    pub fn current(&self) -> Option<Arc<Assignment>> {
        self.tx.borrow().clone()
    }

    /// Reads the file once and applies the fence. Returns the decision for the file read, or
    /// `None` when there was nothing to decide (no file, unchanged bytes, unreadable or corrupt
    /// — the latter two are logged).
    pub fn poll_once(&mut self) -> Option<Decision> {
        match read_head_bytes(&self.chain) {
            Ok(Some(bytes)) => self.consider(bytes),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!("assignment watcher: {e}");
                None
            }
        }
    }

    /// Applies the fence to freshly read bytes.
    fn consider(&mut self, bytes: Vec<u8>) -> Option<Decision> {
        if self.last_bytes.as_deref() == Some(bytes.as_slice()) {
            return None;
        }
        let candidate = match Assignment::from_json(&bytes) {
            Ok(a) => a,
            Err(e) => {
                // Torn or foreign bytes: keep the last good assignment. Do not remember these
                // bytes, so the same garbage is logged again rather than silently skipped.
                tracing::warn!(path = %self.chain.mirror_path().display(), "ignoring invalid assignment: {e}");
                return None;
            }
        };
        self.last_bytes = Some(bytes);
        let lease_epoch = self.lease_epoch.load(Ordering::Acquire);
        let current = self.current();
        let decision = accept(current.as_deref(), &candidate, lease_epoch);
        match decision {
            Decision::Accept => {
                let _ = self.tx.send_replace(Some(Arc::new(candidate)));
            }
            Decision::Unchanged => {}
            Decision::StaleEpoch { .. } | Decision::Older { .. } => {
                tracing::warn!(?decision, "rejecting assignment.json");
            }
        }
        Some(decision)
    }

    /// Polls forever: every `poll_interval`, and at once when notified. File IO runs on the
    /// blocking pool, so a slow NFS server never stalls the control thread's other tasks.
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(self.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.notify.notified() => {}
            }
            let chain = self.chain.clone();
            let read = tokio::task::spawn_blocking(move || read_head_bytes(&chain)).await;
            match read {
                Ok(Ok(Some(bytes))) => {
                    self.consider(bytes);
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => tracing::warn!("assignment watcher: {e}"),
                Err(e) => tracing::warn!("assignment watcher read task failed: {e}"),
            }
        }
    }
}

/// The newest version's bytes (the watcher parses them only when they changed).
fn read_head_bytes(chain: &Chain) -> io::Result<Option<Vec<u8>>> {
    Ok(chain.read_head(|_| Some(0))?.map(|h| h.bytes))
}

/// The Lease epoch known to a broker, shared with its [`AssignmentWatcher`].
#[derive(Debug, Clone)]
pub struct LeaseEpoch(Arc<AtomicU64>);

impl LeaseEpoch {
    /// Raises the known epoch to `epoch` (never lowers it: epochs never go backwards, so a lower
    /// report is an old observation). Feed it every Lease read and every controller PING.
    pub fn observe(&self, epoch: u64) {
        self.0.fetch_max(epoch, Ordering::AcqRel);
    }

    /// The highest epoch observed so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker(id: i32, health: Health) -> BrokerEntry {
        BrokerEntry {
            id: BrokerId(id),
            host: format!("kaas-{id}"),
            port: 9092,
            rack: None,
            health,
        }
    }

    fn assignment(epoch: u64, version: u64, leaders: &[(&str, i32, i32)]) -> Assignment {
        let partitions = leaders
            .iter()
            .map(|(t, p, l)| (TopicPartition::new(*t, *p), BrokerId(*l)))
            .collect();
        Assignment::new(
            epoch,
            version,
            vec![broker(0, Health::Alive), broker(1, Health::Dead)],
            partitions,
            ["g".to_string()],
        )
    }

    // The fence rejects epochs below the Lease, never goes back, and lets a new epoch win with a
    // lower version.
    #[test]
    fn accept_fences_by_epoch_then_version() {
        let cur = assignment(3, 10, &[]);
        assert_eq!(accept(None, &cur, 3), Decision::Accept);
        assert!(matches!(
            accept(None, &assignment(2, 99, &[]), 3),
            Decision::StaleEpoch { .. }
        ));
        assert!(matches!(
            accept(Some(&cur), &assignment(3, 9, &[]), 0),
            Decision::Older { .. }
        ));
        assert_eq!(
            accept(Some(&cur), &assignment(3, 10, &[]), 3),
            Decision::Unchanged
        );
        assert_eq!(
            accept(Some(&cur), &assignment(3, 11, &[]), 3),
            Decision::Accept
        );
        assert_eq!(
            accept(Some(&cur), &assignment(4, 1, &[]), 4),
            Decision::Accept
        );
    }

    // Coordinators skip dead rows but keep them in the hash's modulus.
    #[test]
    fn coordinators_use_only_alive_brokers() {
        let a = assignment(1, 1, &[]);
        assert_eq!(a.consumer_groups.get("g"), Some(&BrokerId(0)));
        assert_eq!(a.coordinator("another-group"), Some(BrokerId(0)));
    }
}
