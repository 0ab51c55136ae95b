//! [`GroupManager`]: the groups one shard owns, their membership state and their offsets.
//!
//! Lives on its shard's thread only (`Rc`, `RefCell`). A borrow of a group's state is never
//! held across an `.await`: state machines run to completion between awaits, and waiting
//! (JoinGroup, SyncGroup, durable commits) happens on channels and futures outside the borrow.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use futures::channel::oneshot;
use glommio::sync::Semaphore;

use super::assignor::{self, GroupAssignment, MemberSpec, RackAwareWeights, TopicSpec};
use super::classic::{ClassicGroup, SettledKey, StoredGroup};
use super::offsets::{self, OffsetLog, OffsetRecord, OffsetTable, Replayed, GROUP_ID_FILE};
use super::{owner_shard, GroupConfig, GroupError, GroupKind};
use crate::catalog::TopicTable;

/// One group.
pub struct Group {
    pub id: String,
    pub kind: RefCell<GroupKind>,
    pub offsets: RefCell<OffsetTable>,
    log: RefCell<Option<Rc<OffsetLog>>>,
    log_open: Semaphore,
    /// Set when the group stopped being served here; later commits through a stale handle
    /// (a request that was already past its checks) fail instead of writing.
    gone: Cell<Option<Gone>>,
    /// The membership last written to (or loaded from) the offset log, and its fingerprint:
    /// a classic group whose settled state differs is written again ([`GroupManager::store_settled`]).
    stored: RefCell<Option<StoredGroup>>,
    stored_key: Cell<Option<SettledKey>>,
    /// One membership write at a time, so each sees what the one before it stored.
    store_lock: Semaphore,
    /// Since when the group has had no members and no offsets (while it has a log).
    empty_since: Cell<Option<Instant>>,
}

/// Why a handle to a group no longer takes commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    /// DeleteGroups removed it.
    Deleted,
    /// Cluster mode: another broker coordinates it now and may have its offset log open; this
    /// broker must not open or write that log again.
    Moved,
}

impl Group {
    fn new(id: &str, kind: GroupKind, offsets: OffsetTable, log: Option<Rc<OffsetLog>>) -> Group {
        let stored_key = match &kind {
            GroupKind::Classic(c) => c.settled_key(),
            GroupKind::Consumer(_) => None,
        };
        Group {
            id: id.to_string(),
            kind: RefCell::new(kind),
            offsets: RefCell::new(offsets),
            log: RefCell::new(log),
            log_open: Semaphore::new(1),
            gone: Cell::new(None),
            stored: RefCell::new(None),
            stored_key: Cell::new(stored_key),
            store_lock: Semaphore::new(1),
            empty_since: Cell::new(None),
        }
    }

    /// A group loaded from its offset log: Stable in its stored generation (or Empty), with
    /// every member's session starting now.
    fn loaded(id: &str, initial_delay_ms: u64, replayed: Replayed, log: Rc<OffsetLog>) -> Group {
        let classic = match replayed.group.clone() {
            Some(g) => ClassicGroup::restore(id, initial_delay_ms, g, Instant::now()),
            None => ClassicGroup::new(id, initial_delay_ms),
        };
        let group = Group::new(id, GroupKind::Classic(classic), replayed.offsets, Some(log));
        *group.stored.borrow_mut() = replayed.group;
        group
    }

    /// Whether the group's settled state is newer than what its log holds. A KIP-848 group
    /// stores no membership, but one upgraded from a classic group must not leave that
    /// group's members in the log: a restart would bring them back (holding partitions until
    /// their sessions expire), so it stores an empty classic membership once.
    fn store_behind(&self) -> bool {
        match &*self.kind.borrow() {
            GroupKind::Classic(c) => {
                c.settled_key().is_some() && c.settled_key() != self.stored_key.get()
            }
            GroupKind::Consumer(_) => self
                .stored
                .borrow()
                .as_ref()
                .is_some_and(|g| !g.members.is_empty()),
        }
    }
}

/// Writes a classic group's settled membership to its open offset log when it changed since
/// the last write, and returns once that is durable (see [`GroupManager::store_settled`]). A
/// group without a log stores nothing here.
async fn write_settled(group: &Rc<Group>) -> Result<(), GroupError> {
    if !group.store_behind() {
        return Ok(());
    }
    let _one_at_a_time = group
        .store_lock
        .acquire_permit(1)
        .await
        .map_err(|_| GroupError::CoordinatorNotAvailable("group closed".into()))?;
    let Some(log) = group.log.borrow().clone() else {
        return Ok(());
    };
    refuse_if_gone(group)?;
    if !group.store_behind() {
        return Ok(()); // stored by the write this one waited for
    }
    let (key, stored) = match &*group.kind.borrow() {
        GroupKind::Classic(c) => match (c.settled_key(), c.stored()) {
            (Some(k), Some(g)) if Some(k) != group.stored_key.get() => (k, g),
            _ => return Ok(()), // stored by the write this one waited for, or unsettled again
        },
        GroupKind::Consumer(c) => {
            let empty = StoredGroup {
                generation: c.group_epoch,
                protocol_type: Some("consumer".into()),
                protocol_name: None,
                leader: None,
                members: Vec::new(),
            };
            let key = SettledKey {
                generation: c.group_epoch,
                members: 0,
                ids: 0,
            };
            (key, empty)
        }
    };
    let applied = group.clone();
    let record = stored.clone();
    log.append(&[OffsetRecord::Group(stored)], move || {
        *applied.stored.borrow_mut() = Some(record);
        applied.stored_key.set(Some(key));
    })
    .await
    .map_err(|e| {
        // Retried on every tick while the disk fails: one line per interval.
        crate::ratelog::limited("group membership not stored", |suppressed| {
            tracing::error!(group = %group.id, error = %e, suppressed, "cannot store the group's membership in its offset log (the volume is failing or full); members are told to rejoin, and a restart would make them rejoin too");
        });
        GroupError::CoordinatorNotAvailable(format!("storing group {}: {e}", group.id))
    })
}

/// Kafka's online downgrade: when the last member using the consumer protocol has left a
/// KIP-848 group that still has classic members, the group becomes a classic group at its
/// group epoch, each member holding its target assignment, and rebalances
/// (`kaas_groups::consumer` has the rules). `topic_name` names the topics of the members'
/// assignments, and is called only when the downgrade happens. Returns whether it did.
pub fn downgrade_if_due(
    group_id: &str,
    kind: &mut GroupKind,
    topic_name: &dyn Fn(uuid::Uuid) -> Option<String>,
    initial_delay_ms: u64,
    now: Instant,
) -> bool {
    let GroupKind::Consumer(c) = kind else {
        return false;
    };
    if !c.downgrade_due() {
        return false;
    }
    let stored = c.downgrade(topic_name);
    let members = stored.members.len();
    *kind = GroupKind::Classic(ClassicGroup::downgraded(
        group_id,
        initial_delay_ms,
        stored,
        now,
    ));
    tracing::info!(group = %group_id, members, "the group's last member using the consumer protocol left and classic members remain: the group is a classic group again and rebalances (online downgrade)");
    true
}

/// A row of ListGroups.
#[derive(Debug, Clone)]
pub struct ListedGroup {
    pub group_id: String,
    pub protocol_type: String,
    pub state: &'static str,
    pub group_type: &'static str,
}

pub struct GroupManager {
    shard_id: usize,
    nshards: usize,
    pub config: GroupConfig,
    data_dir: PathBuf,
    root: PathBuf,
    groups: RefCell<HashMap<String, Rc<Group>>>,
    loaded: Cell<bool>,
    load_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    /// Cluster mode: groups live on the shared volume and move between brokers, so a broker
    /// serves a group only while it holds an exclusive `flock` on the group's directory
    /// ([`GroupManager::claim`]), and loads the group from disk when it takes the lock.
    shared_volume: bool,
    /// The group locks held, by group id (cluster mode).
    claims: RefCell<HashMap<String, std::fs::File>>,
    /// How offset commits are made durable: the broker's `--sync-scope`, as for partitions
    /// (a `syncfs` that the data volume does not honour would lose acknowledged commits).
    sync_scope: kaas_storage::SyncScope,
}

/// Refuses a commit through a handle to a group this shard no longer serves.
fn refuse_if_gone(group: &Group) -> Result<(), GroupError> {
    match group.gone.get() {
        None => Ok(()),
        Some(Gone::Deleted) => Err(GroupError::CoordinatorNotAvailable(
            "the group was deleted".into(),
        )),
        Some(Gone::Moved) => Err(moved_away(&group.id)),
    }
}

/// The answer to a request for a group that moved to another broker while it was handled.
fn moved_away(group_id: &str) -> GroupError {
    GroupError::NotCoordinator(format!(
        "this broker no longer coordinates group {group_id}; find its coordinator again"
    ))
}

/// The lock file inside a group's directory (cluster mode).
const CLAIM_FILE: &str = "coordinator.lock";

impl GroupManager {
    pub fn new(
        shard_id: usize,
        nshards: usize,
        data_dir: &Path,
        config: GroupConfig,
        shared_volume: bool,
        sync_scope: kaas_storage::SyncScope,
    ) -> Self {
        GroupManager {
            shared_volume,
            sync_scope,
            claims: RefCell::new(HashMap::new()),
            shard_id,
            nshards,
            config,
            data_dir: data_dir.to_path_buf(),
            root: data_dir.join("__groups"),
            groups: RefCell::new(HashMap::new()),
            loaded: Cell::new(false),
            load_waiters: RefCell::new(Vec::new()),
        }
    }

    /// Whether this shard owns `group_id`.
    pub fn owns(&self, group_id: &str) -> bool {
        owner_shard(group_id, self.nshards) == self.shard_id
    }

    /// Waits until the groups on disk have been loaded (requests that arrive during start-up
    /// must not see an empty coordinator and conclude a group has no offsets).
    pub async fn ready(&self) {
        if self.loaded.get() {
            return;
        }
        let (tx, rx) = oneshot::channel();
        self.load_waiters.borrow_mut().push(tx);
        let _ = rx.await;
    }

    /// Loads every group this shard owns from `<data_dir>/__groups/`: opens its offset log
    /// (recovering it) and replays the offsets and the stored membership. A classic group comes
    /// back in its last stored generation, so its members carry on; KIP-848 groups come back
    /// Empty and their members rejoin.
    pub async fn load(&self) {
        let started = Instant::now();
        let mut loaded = 0usize;
        // Cluster mode loads each group when this broker claims it, never all at start: most
        // groups on the shared volume are coordinated by other brokers.
        let entries = if self.shared_volume {
            Err(std::io::Error::other("cluster mode"))
        } else {
            std::fs::read_dir(&self.root)
        };
        if let Ok(entries) = entries {
            let mut dirs: Vec<PathBuf> = entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .map(|e| e.path())
                .collect();
            dirs.sort();
            for dir in dirs {
                let Ok(raw) = std::fs::read(dir.join(GROUP_ID_FILE)) else {
                    // Created but never committed to (a crash between mkdir and the id file),
                    // or being created right now by another shard that already serves: never
                    // acknowledged anything, so it is skipped, not removed.
                    continue;
                };
                let Ok(group_id) = String::from_utf8(raw) else {
                    continue;
                };
                if !self.owns(&group_id) {
                    continue;
                }
                let name = dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if name.contains(".deleted") {
                    let _ = std::fs::remove_dir_all(&dir);
                    continue;
                }
                match OffsetLog::open(
                    dir.clone(),
                    self.config.offsets_segment_bytes,
                    self.sync_scope,
                )
                .await
                {
                    Ok((log, replayed)) => {
                        let group = Rc::new(Group::loaded(
                            &group_id,
                            self.config.initial_rebalance_delay_ms,
                            replayed,
                            log,
                        ));
                        self.groups.borrow_mut().insert(group_id, group);
                        loaded += 1;
                    }
                    Err(e) => {
                        tracing::error!(group = %group_id, dir = %dir.display(), error = %e, "cannot load the group's offsets; its OffsetFetch answers will be empty until this is fixed");
                    }
                }
            }
        }
        if loaded > 0 {
            tracing::info!(
                shard = self.shard_id,
                groups = loaded,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "loaded consumer groups"
            );
        }
        self.loaded.set(true);
        for w in self.load_waiters.borrow_mut().drain(..) {
            let _ = w.send(());
        }
    }

    /// Cluster mode: makes sure this broker may serve `group_id` — it holds the group's
    /// directory lock, and the group's state was loaded from disk when the lock was taken (so
    /// every offset the previous coordinator acknowledged is seen). A lock still held by the
    /// previous coordinator (it has not yet applied the assignment that moved the group, or it
    /// is paused) answers COORDINATOR_LOAD_IN_PROGRESS, which clients retry. Single-node: no-op.
    pub async fn claim(&self, group_id: &str) -> Result<(), GroupError> {
        if !self.shared_volume || self.claims.borrow().contains_key(group_id) {
            return Ok(());
        }
        let dir = self.root.join(offsets::group_dir_name(group_id));
        let storage = |e: std::io::Error| GroupError::Storage(format!("{}: {e}", dir.display()));
        kaas_durable::create_dir_all(&dir).map_err(storage)?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(CLAIM_FILE))
            .map_err(storage)?;
        if lock.try_lock().is_err() {
            return Err(GroupError::LoadInProgress(format!(
                "group {group_id} is still held by its previous coordinator"
            )));
        }
        if self.claims.borrow().contains_key(group_id) {
            return Ok(()); // claimed concurrently by another request on this shard
        }
        // Any state in memory predates the claim; the disk is the truth now.
        self.groups.borrow_mut().remove(group_id);
        if dir.join(GROUP_ID_FILE).exists() {
            let (log, replayed) = OffsetLog::open(
                dir.clone(),
                self.config.offsets_segment_bytes,
                self.sync_scope,
            )
            .await
            .map_err(|e| GroupError::Storage(e.to_string()))?;
            let group = Rc::new(Group::loaded(
                group_id,
                self.config.initial_rebalance_delay_ms,
                replayed,
                log,
            ));
            self.groups.borrow_mut().insert(group_id.to_string(), group);
        }
        self.claims.borrow_mut().insert(group_id.to_string(), lock);
        tracing::info!(
            shard = self.shard_id,
            group = group_id,
            "now coordinating group"
        );
        Ok(())
    }

    /// [`GroupManager::claim`] for a request that only reads the group (or deletes it): a
    /// group whose directory does not exist was never served by any broker (a claim creates
    /// it first), so there is nothing to load and nothing is created for it — a scan of
    /// unknown group ids leaves no directories behind.
    pub async fn claim_existing(&self, group_id: &str) -> Result<(), GroupError> {
        if self.shared_volume
            && !self.claims.borrow().contains_key(group_id)
            && !self.root.join(offsets::group_dir_name(group_id)).exists()
        {
            return Ok(());
        }
        self.claim(group_id).await
    }

    /// Cluster mode: closes every group this broker no longer coordinates (its offset log is
    /// fsynced and closed first) and releases its lock, so the new coordinator can claim it.
    pub async fn release_unless(&self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self
            .claims
            .borrow()
            .keys()
            .filter(|g| !keep(g))
            .cloned()
            .collect();
        for gid in gone {
            // The claim goes first, the lock last: a request arriving while the log closes
            // finds no claim, fails to take the lock this broker still holds, and is answered
            // COORDINATOR_LOAD_IN_PROGRESS instead of parking in a group nobody ticks.
            let lock = self.claims.borrow_mut().remove(&gid);
            let group = self.groups.borrow_mut().remove(&gid);
            if let Some(group) = group {
                // The next coordinator loads the membership: the latest settled state goes
                // with the group (a generation is stored before it is answered; this catches
                // an emptying the tick has not written yet).
                if let Err(e) = write_settled(&group).await {
                    tracing::warn!(group = %gid, error = %e, "the group's last membership change did not reach its log; its members may rejoin at the next coordinator");
                }
                group.gone.set(Some(Gone::Moved));
                group.kind.borrow_mut().unload(&moved_away(&gid));
                // A commit opening the group's first log finishes first (one that has not
                // started sees `gone`): the log it opened is closed here, before the lock goes.
                let _opening = group.log_open.acquire_permit(1).await;
                let log = group.log.borrow_mut().take();
                if let Some(log) = log {
                    if let Err(e) = log.close().await {
                        tracing::error!(group = %gid, error = %e, "closing the offset log of a group moving away failed; the next coordinator recovers it");
                    }
                }
            }
            drop(lock);
            tracing::info!(shard = self.shard_id, group = %gid, "released group to its new coordinator");
        }
    }

    /// Cluster mode: claims (and so loads) every group on the shared volume that this shard
    /// owns and `coordinates` says this broker coordinates, without waiting for a request. A
    /// group whose consumers are all gone sends none, and unclaimed it would vanish from the
    /// metrics with its committed offsets — exactly when its lag matters. Returns how many are
    /// still held by their previous coordinator (it has not applied the move yet), for a retry.
    pub async fn claim_coordinated(&self, coordinates: impl Fn(&str) -> bool) -> usize {
        if !self.shared_volume {
            return 0;
        }
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return 0;
        };
        let mut held_elsewhere = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_string_lossy().contains(".deleted") {
                continue;
            }
            let Ok(raw) = std::fs::read(entry.path().join(GROUP_ID_FILE)) else {
                continue; // never committed to
            };
            let Ok(group_id) = String::from_utf8(raw) else {
                continue;
            };
            if !self.owns(&group_id)
                || !coordinates(&group_id)
                || self.claims.borrow().contains_key(&group_id)
            {
                continue;
            }
            match self.claim(&group_id).await {
                // The view may have moved the group on while its log was opening: a release
                // that ran meanwhile could not see this claim, so it is given back here.
                Ok(()) if !coordinates(&group_id) => {
                    self.release_unless(|g| g != group_id).await;
                }
                Ok(()) => {}
                Err(GroupError::LoadInProgress(_)) => held_elsewhere += 1,
                Err(e) => {
                    tracing::warn!(group = %group_id, error = %e, "cannot load a group this broker now coordinates; a request for it retries");
                }
            }
        }
        held_elsewhere
    }

    pub fn get(&self, group_id: &str) -> Option<Rc<Group>> {
        self.groups.borrow().get(group_id).cloned()
    }

    /// The group, created empty (classic) when it does not exist.
    pub fn get_or_create(&self, group_id: &str) -> Rc<Group> {
        self.groups
            .borrow_mut()
            .entry(group_id.to_string())
            .or_insert_with(|| {
                Rc::new(Group::new(
                    group_id,
                    GroupKind::Classic(ClassicGroup::new(
                        group_id,
                        self.config.initial_rebalance_delay_ms,
                    )),
                    OffsetTable::new(),
                    None,
                ))
            })
            .clone()
    }

    /// Every group on this shard.
    pub fn list(&self) -> Vec<ListedGroup> {
        let mut out: Vec<ListedGroup> = self
            .groups
            .borrow()
            .values()
            .map(|g| {
                let k = g.kind.borrow();
                ListedGroup {
                    group_id: g.id.clone(),
                    protocol_type: k.protocol_type(),
                    state: k.state_name(),
                    group_type: k.type_name(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        out
    }

    /// The groups this shard coordinates, for `/metrics` (see [`crate::probe::Published`]):
    /// at most `limit` series in all — two per group (members, rebalances), one per committed
    /// offset — so client-chosen group ids cannot grow the scrape without bound. A group with
    /// neither members nor offsets says nothing and is left out. Returns the samples and how
    /// many series were left out.
    pub fn samples(&self, limit: usize) -> (Vec<crate::probe::GroupSample>, u64) {
        let mut left = limit;
        let mut omitted = 0u64;
        let mut out = Vec::new();
        for g in self.groups.borrow().values() {
            let k = g.kind.borrow();
            let offsets = g.offsets.borrow();
            let committed_count: usize = offsets.values().map(BTreeMap::len).sum();
            if k.member_count() == 0 && committed_count == 0 {
                continue;
            }
            if left < 2 {
                omitted += 2 + committed_count as u64;
                continue;
            }
            left -= 2;
            let committed: Vec<(String, i32, i64)> = offsets
                .iter()
                .flat_map(|(t, parts)| parts.iter().map(move |(p, c)| (t.clone(), *p, c.offset)))
                .take(left)
                .collect();
            left -= committed.len();
            omitted += (committed_count - committed.len()) as u64;
            out.push(crate::probe::GroupSample {
                group: g.id.clone(),
                group_type: k.type_name(),
                state: k.state_name(),
                members: k.member_count() as u64,
                rebalances: k.rebalances(),
                committed,
            });
        }
        out.sort_by(|a, b| a.group.cmp(&b.group));
        (out, omitted)
    }

    /// Opens (creating on disk if needed) the group's offset log.
    async fn log_of(&self, group: &Rc<Group>) -> Result<Rc<OffsetLog>, GroupError> {
        if let Some(l) = group.log.borrow().as_ref() {
            return Ok(l.clone());
        }
        let _permit = group
            .log_open
            .acquire_permit(1)
            .await
            .map_err(|_| GroupError::CoordinatorNotAvailable("group closed".into()))?;
        if let Some(l) = group.log.borrow().as_ref() {
            return Ok(l.clone());
        }
        // Opening recovers the log: never for a group another broker may hold now.
        refuse_if_gone(group)?;
        let dir = self.root.join(offsets::group_dir_name(&group.id));
        let storage = |e: String| GroupError::Storage(e);
        let root_existed = self.root.exists();
        kaas_durable::create_dir_all(&dir)
            .map_err(|e| storage(format!("{}: {e}", dir.display())))?;
        // The id file is written tmp + fsync + rename + directory fsync; then the new
        // directory's own entry is made durable in its parent (and the parent's in the data
        // directory the first time), so a crash cannot lose a group that acknowledged a commit.
        kaas_storage::write_atomically(&dir.join(GROUP_ID_FILE), group.id.as_bytes())
            .map_err(|e| storage(e.to_string()))?;
        offsets::sync_dir(&self.root).map_err(|e| storage(e.to_string()))?;
        if !root_existed {
            offsets::sync_dir(&self.data_dir).map_err(|e| storage(e.to_string()))?;
        }
        let (log, replayed) =
            OffsetLog::open(dir, self.config.offsets_segment_bytes, self.sync_scope)
                .await
                .map_err(|e| storage(e.to_string()))?;
        // A membership left there belongs to a group that is not this one's current state.
        let table = replayed.offsets;
        if !table.is_empty() {
            // A directory left by an earlier incarnation that was not cleaned up.
            let mut t = group.offsets.borrow_mut();
            for (topic, parts) in table {
                let entry = t.entry(topic).or_default();
                for (p, v) in parts {
                    entry.entry(p).or_insert(v);
                }
            }
        }
        *group.log.borrow_mut() = Some(log.clone());
        Ok(log)
    }

    /// Makes a classic group's settled membership durable in its offset log when it changed
    /// since the last write. Called before a SyncGroup is answered with a new generation (no
    /// member may hold an assignment a restarted coordinator would not know), before a
    /// LeaveGroup is answered, on the tick after a session expiry, and before the log is
    /// closed. A group's first generation creates its log, as Kafka writes every group to
    /// `__consumer_offsets` whether it commits or not (Kafka Connect and Schema Registry
    /// groups never commit); a group that empties before it ever had a log stores nothing.
    pub async fn store_settled(&self, group: &Rc<Group>) -> Result<(), GroupError> {
        if !group.store_behind() {
            return Ok(());
        }
        if group.log.borrow().is_none() {
            let members = group.kind.borrow().member_count();
            if members == 0 {
                return Ok(());
            }
            self.log_of(group).await?;
        }
        write_settled(group).await
    }

    /// Makes `records` durable and applies them to the group's offset table. Returns once an
    /// fsync covering them completed: only then may the OffsetCommit be acknowledged.
    pub async fn write_offsets(
        &self,
        group: &Rc<Group>,
        records: Vec<OffsetRecord>,
    ) -> Result<(), GroupError> {
        if records.is_empty() {
            return Ok(());
        }
        let log = self.log_of(group).await?;
        // Also after: the group may have moved while its log was being opened, or have been
        // handed out by the fast path while its release waited for an opening log.
        refuse_if_gone(group)?;
        let apply_to = group.clone();
        let applied = records.clone();
        log.append(&records, move || {
            let mut t = apply_to.offsets.borrow_mut();
            for r in applied {
                r.apply(&mut t);
            }
        })
        .await
        .map_err(|e| {
            tracing::error!(group = %group.id, error = %e, "offset commit not durable");
            GroupError::Storage(e.to_string())
        })?;
        if log.wants_snapshot() {
            let group = group.clone();
            glommio::spawn_local(async move {
                let live = {
                    let g = group.clone();
                    move || {
                        let mut live: Vec<OffsetRecord> = g
                            .offsets
                            .borrow()
                            .iter()
                            .flat_map(|(t, ps)| {
                                ps.iter().map(move |(p, v)| OffsetRecord::Commit {
                                    topic: t.clone(),
                                    partition: *p,
                                    value: v.clone(),
                                })
                            })
                            .collect();
                        live.extend(g.stored.borrow().clone().map(OffsetRecord::Group));
                        live
                    }
                };
                log.snapshot(live).await;
            })
            .detach();
        }
        Ok(())
    }

    /// Deletes, in every group this shard coordinates, the committed offsets that no longer
    /// belong to a topic of `catalog` (see [`CommittedOffset::is_current`]), as Kafka's
    /// coordinator drops a deleted topic's offsets: `kafka-consumer-groups --describe` then
    /// lists none for it, and a group left with nothing else can expire. (They are not
    /// answered meanwhile either way.)
    pub async fn forget_deleted_topics(&self, catalog: &crate::catalog::TopicTable) {
        let groups: Vec<Rc<Group>> = self.groups.borrow().values().cloned().collect();
        for g in groups {
            let stale: Vec<OffsetRecord> = g
                .offsets
                .borrow()
                .iter()
                .flat_map(|(t, ps)| {
                    ps.iter()
                        .filter(|(p, v)| !v.is_current(t, **p, catalog))
                        .map(|(p, _)| OffsetRecord::Delete {
                            topic: t.clone(),
                            partition: *p,
                        })
                })
                .collect();
            if stale.is_empty() {
                continue;
            }
            let n = stale.len();
            match self.write_offsets(&g, stale).await {
                Ok(()) => {
                    tracing::info!(group = %g.id, offsets = n, "deleted the committed offsets of deleted topics");
                }
                // Moved or deleted meanwhile: whoever has it now does the same.
                Err(e) => {
                    tracing::debug!(group = %g.id, error = %e, "offsets of deleted topics not deleted")
                }
            }
        }
    }

    /// DeleteGroups: only an empty group can go; its offsets are removed from disk.
    pub async fn delete_group(&self, group_id: &str) -> Result<(), GroupError> {
        let Some(group) = self.get(group_id) else {
            return Err(GroupError::GroupIdNotFound(format!(
                "Group {group_id} does not exist."
            )));
        };
        if !group.kind.borrow().is_empty() {
            return Err(GroupError::NonEmptyGroup);
        }
        self.groups.borrow_mut().remove(group_id);
        group.gone.set(Some(Gone::Deleted));
        group.offsets.borrow_mut().clear();
        let log = group.log.borrow_mut().take();
        if let Some(log) = log {
            let _ = log.close().await;
            // Rename first (atomic), then remove: a crash in between leaves a `.deleted`
            // directory that the next load finishes removing, never a half-deleted group that
            // comes back with some of its offsets.
            let dir = log.dir().to_path_buf();
            let gone = dir.with_file_name(format!(
                "{}.deleted-{}",
                dir.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::rename(&dir, &gone)
                .and_then(|_| offsets::sync_dir(&self.root).map_err(std::io::Error::other))
                .map_err(|e| GroupError::Storage(format!("{}: {e}", dir.display())))?;
            let _ = std::fs::remove_dir_all(&gone);
        }
        // The claim's lock file went with the directory; a later request claims afresh.
        self.claims.borrow_mut().remove(group_id);
        Ok(())
    }

    /// Timeouts of every group; groups with no members, no offsets and no log are dropped.
    /// Returns the groups with a log that have had no members and no offsets for the empty
    /// group retention, for the caller to delete (as Kafka's offsets cleanup removes an empty
    /// group that has no offsets left).
    pub fn tick(&self, now: Instant, catalog: &TopicTable) -> Vec<String> {
        let mut retired = Vec::new();
        let groups: Vec<Rc<Group>> = self.groups.borrow().values().cloned().collect();
        let mut dead = Vec::new();
        for g in groups {
            let mut kind = g.kind.borrow_mut();
            match &mut *kind {
                GroupKind::Classic(c) => {
                    for (id, why) in c.tick(now) {
                        tracing::info!(group = %g.id, member = %id, "removed a member from its group: {why}");
                    }
                }
                GroupKind::Consumer(c) => {
                    for id in c.tick(now) {
                        tracing::info!(group = %g.id, member = %id, "member fenced: session or rebalance timeout expired");
                    }
                }
            }
            downgrade_if_due(
                &g.id,
                &mut kind,
                &|id| catalog.by_id(id).map(|t| t.name.clone()),
                self.config.initial_rebalance_delay_ms,
                now,
            );
            drop(kind);
            // A session expiry emptied the group: written in the background (errors are
            // logged there), so a restart does not bring the expired members back.
            if g.log.borrow().is_some() && g.store_behind() && g.store_lock.available() > 0 {
                let g = g.clone();
                glommio::spawn_local(async move {
                    let _ = write_settled(&g).await;
                })
                .detach();
            }
            let kind = g.kind.borrow();
            let idle = kind.is_empty() && g.offsets.borrow().is_empty();
            if idle && g.log.borrow().is_some() && !g.store_behind() {
                let since = *g.empty_since.get().get_or_insert(now);
                g.empty_since.set(Some(since));
                if now.saturating_duration_since(since) >= self.config.empty_group_retention() {
                    retired.push(g.id.clone());
                }
            } else {
                g.empty_since.set(None);
            }
            // Two references: the map's and this loop's. Any other means a request is working
            // on the group (e.g. creating its log), so it must stay.
            if kind.is_empty()
                && g.offsets.borrow().is_empty()
                && g.log.borrow().is_none()
                && Rc::strong_count(&g) == 2
            {
                dead.push(g.id.clone());
            }
        }
        if !dead.is_empty() {
            let mut map = self.groups.borrow_mut();
            for id in dead {
                map.remove(&id);
            }
        }
        retired
    }

    /// Clean shutdown: every offset log is fsynced and closed.
    pub async fn close_all(&self) {
        let groups: Vec<Rc<Group>> = self.groups.borrow_mut().drain().map(|(_, g)| g).collect();
        for g in groups {
            if let Err(e) = write_settled(&g).await {
                tracing::warn!(group = %g.id, error = %e, "the group's last membership change did not reach its log; its members may rejoin after the restart");
            }
            let log = g.log.borrow_mut().take();
            if let Some(log) = log {
                if let Err(e) = log.close().await {
                    tracing::error!(group = %g.id, error = %e, "closing the offset log failed; it will be recovered on next start");
                }
            }
        }
    }

    /// Runs the named server assignor (`None` for an unknown name). The input comes from
    /// clients (subscriptions, racks), so a panic inside an assignor is caught and logged
    /// rather than allowed to take the shard down; the caller then falls back.
    pub fn run_assignor(
        &self,
        name: &str,
        weights: RackAwareWeights,
        members: &[MemberSpec],
        topics: &BTreeMap<String, TopicSpec>,
    ) -> Option<GroupAssignment> {
        let a = assignor::by_name(name, weights)?;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.assign(members, topics))) {
            Ok(r) => Some(r),
            Err(_) => {
                tracing::error!(
                    assignor = name,
                    members = members.len(),
                    topics = topics.len(),
                    "server assignor panicked; falling back"
                );
                None
            }
        }
    }

    /// A new member's id, for a member that joins without one (the state machines draw none
    /// of their own): a random v4 UUID.
    pub fn new_member_id() -> uuid::Uuid {
        uuid::Uuid::new_v4()
    }

    pub fn known_assignor(&self, name: &str) -> bool {
        assignor::by_name(name, self.config.rack_aware_weights).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::groups::offsets::tests::run;
    use crate::groups::offsets::CommittedOffset;

    /// A commit of offset `offset` for partition t-0.
    fn commit_t0(offset: i64) -> OffsetRecord {
        OffsetRecord::Commit {
            topic: "t".into(),
            partition: 0,
            value: CommittedOffset {
                offset,
                leader_epoch: 0,
                metadata: String::new(),
                commit_timestamp_ms: 1,
                topic_id: uuid::Uuid::nil(),
            },
        }
    }

    fn broker(root: &Path) -> GroupManager {
        let scope = kaas_storage::SyncScope::File;
        GroupManager::new(0, 1, root, GroupConfig::default(), true, scope)
    }

    // A commit through a handle taken before the group moved to another broker (a request
    // already past its checks) is refused with NOT_COORDINATOR and writes nothing: the new
    // coordinator may have the group's offset log open. It used to open the log again, without
    // the group's lock, and append to it.
    #[test]
    fn a_group_that_moved_away_takes_no_commit() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        run(move || async move {
            let old = broker(&root);
            old.claim("g").await.unwrap();
            let handle = old.get_or_create("g");
            old.release_unless(|_| false).await;
            let commit = commit_t0(7);
            let refused = old.write_offsets(&handle, vec![commit]).await;
            assert!(
                matches!(refused, Err(GroupError::NotCoordinator(_))),
                "{refused:?}"
            );
            let new = broker(&root);
            new.claim("g").await.expect("the released lock is free");
            let loaded = new.get("g").map(|g| g.offsets.borrow().clone());
            assert!(loaded.as_ref().is_none_or(|t| t.is_empty()), "{loaded:?}");
        });
    }

    // A classic group's settled generation goes with it to the next coordinator (a restart
    // loads it the same way): the member carries on with its generation, and its commits are
    // taken. Before, the group came back Empty and the member's next commit was refused.
    #[test]
    fn the_next_coordinator_loads_the_generation() {
        use crate::groups::classic::{JoinArgs, MemberRef, Reply};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        run(move || async move {
            let old = broker(&root);
            old.claim("g").await.unwrap();
            let group = old.get_or_create("g");
            let now = Instant::now();
            let member = {
                let mut kind = group.kind.borrow_mut();
                let GroupKind::Classic(c) = &mut *kind else {
                    unreachable!("new groups are classic")
                };
                let args = JoinArgs {
                    member_id: String::new(),
                    instance_id: None,
                    client_id: "c".into(),
                    client_host: "/127.0.0.1".into(),
                    session_timeout_ms: 10_000,
                    rebalance_timeout_ms: 30_000,
                    protocol_type: "consumer".into(),
                    protocols: vec![("range".into(), bytes::Bytes::from_static(b"m"))],
                    require_known_member_id: false,
                    supports_skip_assignment: false,
                };
                let joined = match c.join(args, now, 6_000, 300_000, &GroupManager::new_member_id) {
                    Reply::Now(j) => j,
                    Reply::Later(mut rx) => {
                        // The initial rebalance delay passes.
                        c.tick(now + std::time::Duration::from_secs(10));
                        rx.try_recv()
                            .unwrap()
                            .expect("joined after the initial delay")
                    }
                };
                let me = MemberRef {
                    member_id: &joined.member_id,
                    instance_id: None,
                    generation: joined.generation,
                };
                let assignment = vec![(joined.member_id.clone(), bytes::Bytes::from_static(b"a"))];
                let _ = c.sync(me, None, None, assignment, now);
                assert_eq!(c.state.name(), "Stable");
                (joined.member_id, joined.generation)
            };
            // The first generation creates the group's log (it has not committed yet).
            old.store_settled(&group).await.unwrap();
            assert!(group.stored.borrow().is_some());
            let commit = commit_t0(7);
            old.write_offsets(&group, vec![commit]).await.unwrap();
            old.release_unless(|_| false).await;

            let new = broker(&root);
            new.claim("g").await.unwrap();
            let loaded = new.get("g").expect("loaded");
            let kind = loaded.kind.borrow();
            let GroupKind::Classic(c) = &*kind else {
                panic!("a classic group comes back classic")
            };
            assert_eq!(c.state.name(), "Stable");
            assert_eq!(c.generation, member.1);
            c.validate_commit(MemberRef {
                member_id: &member.0,
                instance_id: None,
                generation: member.1,
            })
            .expect("the member's commit is taken by the new coordinator");
            assert_eq!(loaded.offsets.borrow()["t"][&0].offset, 7);
        });
    }

    // A group with a log that has no members and no offsets is handed back for deletion once
    // it has been so for the retention (Kafka's offsets cleanup), not before; one with offsets
    // stays.
    #[test]
    fn empty_groups_without_offsets_are_retired() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        run(move || async move {
            let config = GroupConfig {
                empty_group_retention_ms: 1_000,
                ..GroupConfig::default()
            };
            let m = GroupManager::new(0, 1, &root, config, false, kaas_storage::SyncScope::File);
            m.load().await;
            for id in ["idle", "committed"] {
                let g = m.get_or_create(id);
                m.write_offsets(&g, vec![commit_t0(5)]).await.unwrap();
            }
            // "idle" loses its only offset (OffsetDelete).
            let idle = m.get("idle").unwrap();
            m.write_offsets(
                &idle,
                vec![OffsetRecord::Delete {
                    topic: "t".into(),
                    partition: 0,
                }],
            )
            .await
            .unwrap();
            drop(idle);
            let t0 = Instant::now();
            let none = TopicTable::default();
            assert!(m.tick(t0, &none).is_empty());
            assert!(m
                .tick(t0 + std::time::Duration::from_millis(999), &none)
                .is_empty());
            assert_eq!(
                m.tick(t0 + std::time::Duration::from_secs(1), &none),
                vec!["idle".to_string()]
            );
            m.delete_group("idle").await.unwrap();
            assert!(m.get("idle").is_none());
            assert!(m.get("committed").is_some());
            let dirs = std::fs::read_dir(root.join("__groups")).unwrap().count();
            assert_eq!(dirs, 1, "the retired group's directory is removed");
        });
    }
}
