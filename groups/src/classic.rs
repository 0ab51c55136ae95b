//! The classic group membership protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) as a
//! state machine: requests and the current time go in, answers come out — immediately, or
//! later through a oneshot channel when a JoinGroup or SyncGroup has to wait for the rest of the
//! group. No IO, no clock and no randomness of its own (a new member's id is drawn by the
//! caller), so it is tested without sockets or sleeps; the per-shard timer calls
//! [`ClassicGroup::tick`].
//!
//! States, as Kafka's: `Empty` (no members) → `PreparingRebalance` (collecting JoinGroups;
//! every known member must rejoin, or be dropped at the rebalance timeout) →
//! `CompletingRebalance` (joined; waiting for the leader's SyncGroup with the assignment) →
//! `Stable`. A member that stops heartbeating for its session timeout is removed and the group
//! rebalances. The first rebalance of an empty group waits `group.initial.rebalance.delay.ms`
//! (extended by each new member, capped by the rebalance timeout) so consumers started together
//! land in one generation.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_channel::oneshot;
use uuid::Uuid;

use crate::GroupError;

mod join;
mod stored;

pub use stored::{SettledKey, StoredGroup, StoredMember};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassicState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl ClassicState {
    /// Kafka's name for the state (DescribeGroups, ListGroups).
    pub fn name(&self) -> &'static str {
        match self {
            ClassicState::Empty => "Empty",
            ClassicState::PreparingRebalance => "PreparingRebalance",
            ClassicState::CompletingRebalance => "CompletingRebalance",
            ClassicState::Stable => "Stable",
            ClassicState::Dead => "Dead",
        }
    }
}

/// A JoinGroup as the state machine sees it.
#[derive(Debug, Clone)]
pub struct JoinArgs {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    /// (name, metadata) in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+ (KIP-394): a dynamic member's first join only gets a member id.
    pub require_known_member_id: bool,
    /// JoinGroup v9+ (KIP-814): a static leader rejoining a stable group can skip assignment.
    pub supports_skip_assignment: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub metadata: Bytes,
}

/// The JoinGroup answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinResult {
    pub error: Option<GroupError>,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    pub skip_assignment: bool,
    /// Filled for the leader only: every member's metadata for the chosen protocol.
    pub members: Vec<JoinedMember>,
}

impl JoinResult {
    pub fn error(e: GroupError, member_id: &str) -> JoinResult {
        JoinResult {
            error: Some(e),
            generation: -1,
            member_id: member_id.to_string(),
            ..JoinResult::default()
        }
    }
}

/// The SyncGroup answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncResult {
    pub error: Option<GroupError>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncResult {
    fn error(e: GroupError) -> SyncResult {
        SyncResult {
            error: Some(e),
            ..SyncResult::default()
        }
    }
}

/// An answer now, or one that arrives when the group gets there.
pub enum Reply<T> {
    Now(T),
    Later(oneshot::Receiver<T>),
}

#[derive(Debug)]
pub struct ClassicMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    join_waiter: Option<oneshot::Sender<JoinResult>>,
    sync_waiter: Option<oneshot::Sender<SyncResult>>,
    last_heartbeat: Instant,
    /// Order of arrival: the oldest member becomes leader when the leader leaves.
    seq: u64,
}

impl ClassicMember {
    pub fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
    fn awaiting_join(&self) -> bool {
        self.join_waiter.is_some()
    }
    /// Answers the member's parked SyncGroup, if it has one, and restarts its session from
    /// now, as Kafka does: a parked request is our wait, not the member's silence, and many
    /// clients (sarama, librdkafka) send no heartbeat until their SyncGroup is answered — a
    /// follower that waited most of its session on a slow leader would otherwise be expired
    /// at the next tick, right after it got its assignment or was told to rejoin.
    fn answer_sync(&mut self, result: SyncResult, now: Instant) {
        if let Some(w) = self.sync_waiter.take() {
            let _ = w.send(result);
            self.last_heartbeat = now;
        }
    }
    fn same_protocols(&self, protocols: &[(String, Bytes)]) -> bool {
        self.protocols == protocols
    }
}

/// Why the coordinator removed a member on its own, for the caller to log (nothing here logs):
/// an operator whose consumer was thrown out needs to know which deadline it missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// Nothing from the member (heartbeat, JoinGroup, SyncGroup) for its session timeout.
    SessionExpired { session_timeout_ms: i32 },
    /// It did not rejoin within the rebalance timeout of a rebalance.
    NotRejoined { rebalance_timeout_ms: u64 },
    /// It had its JoinGroup answer for `generation` but sent no SyncGroup within the
    /// rebalance timeout; a leader that does this held every member's assignment back.
    NotSynced {
        generation: i32,
        rebalance_timeout_ms: u64,
        leader: bool,
    },
}

impl std::fmt::Display for Removal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Removal::SessionExpired { session_timeout_ms } => write!(
                f,
                "its session expired: no heartbeat, JoinGroup or SyncGroup for its session \
                 timeout ({session_timeout_ms} ms)"
            ),
            Removal::NotRejoined {
                rebalance_timeout_ms,
            } => write!(
                f,
                "it did not rejoin within the rebalance timeout ({rebalance_timeout_ms} ms)"
            ),
            Removal::NotSynced {
                generation,
                rebalance_timeout_ms,
                leader: false,
            } => write!(
                f,
                "it sent no SyncGroup for generation {generation} within the rebalance timeout \
                 ({rebalance_timeout_ms} ms) after its JoinGroup answer"
            ),
            Removal::NotSynced {
                generation,
                rebalance_timeout_ms,
                leader: true,
            } => write!(
                f,
                "the group's leader sent no SyncGroup for generation {generation} within the \
                 rebalance timeout ({rebalance_timeout_ms} ms) after its JoinGroup answer; the \
                 other members' assignments waited for it, and the group rebalances without it"
            ),
        }
    }
}

/// Validation input shared by SyncGroup, Heartbeat and OffsetCommit.
pub struct MemberRef<'a> {
    pub member_id: &'a str,
    pub instance_id: Option<&'a str>,
    pub generation: i32,
}

#[derive(Debug)]
pub struct ClassicGroup {
    pub group_id: String,
    pub state: ClassicState,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub generation: i32,
    pub leader: Option<String>,
    pub members: BTreeMap<String, ClassicMember>,
    /// KIP-394: ids handed out with MEMBER_ID_REQUIRED, valid until the deadline.
    pending_members: HashMap<String, Instant>,
    /// group.instance.id -> member id.
    static_members: HashMap<String, String>,
    /// When the current join phase ends even if not every member rejoined.
    join_deadline: Option<Instant>,
    /// The initial-delay phase of the first rebalance: (current deadline, hard cap).
    initial_delay: Option<(Instant, Instant)>,
    /// Members that got a JoinGroup answer but have not synced yet, and until when they may.
    pending_sync: HashSet<String>,
    sync_deadline: Option<Instant>,
    next_seq: u64,
    initial_delay_ms: u64,
    /// Members removed on a deadline since the last [`ClassicGroup::tick`], which hands them
    /// to the caller (a deadline can also pass within a request that finds it passed).
    removed: Vec<(String, Removal)>,
}

/// A JoinGroup's session timeout must lie within the broker's bounds
/// (`group.min.session.timeout.ms`, `group.max.session.timeout.ms`), whichever protocol the
/// group speaks.
pub fn check_session_timeout(ms: i32, min_ms: i32, max_ms: i32) -> Result<(), GroupError> {
    if ms < min_ms || ms > max_ms {
        return Err(GroupError::InvalidSessionTimeout {
            got: ms,
            min: min_ms,
            max: max_ms,
        });
    }
    Ok(())
}

/// Kafka's form of a member id: the client id, a dash, a UUID (drawn by the caller).
fn member_id_for(client_id: &str, id: Uuid) -> String {
    format!("{client_id}-{id}")
}

impl ClassicGroup {
    pub fn new(group_id: &str, initial_delay_ms: u64) -> ClassicGroup {
        ClassicGroup {
            group_id: group_id.to_string(),
            state: ClassicState::Empty,
            protocol_type: None,
            protocol_name: None,
            generation: 0,
            leader: None,
            members: BTreeMap::new(),
            pending_members: HashMap::new(),
            static_members: HashMap::new(),
            join_deadline: None,
            initial_delay: None,
            pending_sync: HashSet::new(),
            sync_deadline: None,
            next_seq: 0,
            initial_delay_ms,
            removed: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.pending_members.is_empty()
    }

    fn group_rebalance_timeout(&self) -> Duration {
        let ms = self
            .members
            .values()
            .map(|m| m.rebalance_timeout_ms)
            .max()
            .unwrap_or(0);
        Duration::from_millis(ms.max(0) as u64)
    }

    /// Protocols every member (plus a candidate) supports.
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        if self.protocol_type.as_deref() != Some(protocol_type) {
            return false;
        }
        protocols.iter().any(|(name, _)| {
            self.members
                .values()
                .all(|m| m.protocols.iter().any(|(n, _)| n == name))
        })
    }

    /// The protocol with the most first-preference votes among those every member supports.
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.values().min_by_key(|m| m.seq)?;
        let candidates: Vec<&String> = first
            .protocols
            .iter()
            .map(|(n, _)| n)
            .filter(|n| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(x, _)| x == *n))
            })
            .collect();
        let mut votes: Vec<(usize, &String)> = candidates.iter().map(|c| (0, *c)).collect();
        for m in self.members.values() {
            if let Some(pick) = m
                .protocols
                .iter()
                .map(|(n, _)| n)
                .find(|n| candidates.contains(n))
            {
                if let Some(v) = votes.iter_mut().find(|(_, c)| *c == pick) {
                    v.0 += 1;
                }
            }
        }
        // Most votes; ties go to the oldest member's preference (stable, deterministic).
        let best = votes.iter().map(|(v, _)| *v).max()?;
        votes
            .into_iter()
            .find(|(v, _)| *v == best)
            .map(|(_, c)| c.clone())
    }

    /// Checks a member's identity and generation (SyncGroup, Heartbeat, OffsetCommit).
    fn validate_member(&self, r: &MemberRef<'_>) -> Result<(), GroupError> {
        if let Some(instance) = r.instance_id {
            match self.static_members.get(instance) {
                Some(owner) if owner != r.member_id => {
                    return Err(GroupError::FencedInstanceId(format!(
                        "instance {instance} is owned by another member"
                    )))
                }
                Some(_) => {}
                None => {
                    return Err(GroupError::UnknownMemberId(format!(
                        "instance {instance} is unknown"
                    )))
                }
            }
        }
        if !self.members.contains_key(r.member_id) {
            return Err(GroupError::UnknownMemberId(format!(
                "member {} is not in group {}",
                r.member_id, self.group_id
            )));
        }
        Ok(())
    }

    fn validate_generation(&self, r: &MemberRef<'_>) -> Result<(), GroupError> {
        if r.generation != self.generation {
            return Err(GroupError::IllegalGeneration(format!(
                "generation {} is not the group's generation {}",
                r.generation, self.generation
            )));
        }
        Ok(())
    }

    /// SyncGroup. `assignments` is what the leader sends (empty from followers).
    pub fn sync(
        &mut self,
        r: MemberRef<'_>,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        assignments: Vec<(String, Bytes)>,
        now: Instant,
    ) -> Reply<SyncResult> {
        if self.state == ClassicState::Empty || self.state == ClassicState::Dead {
            return Reply::Now(SyncResult::error(GroupError::UnknownMemberId(
                "the group has no members".into(),
            )));
        }
        if let Err(e) = self
            .validate_member(&r)
            .and_then(|_| self.validate_generation(&r))
        {
            return Reply::Now(SyncResult::error(e));
        }
        if protocol_type.is_some_and(|t| Some(t) != self.protocol_type.as_deref())
            || protocol_name.is_some_and(|n| Some(n) != self.protocol_name.as_deref())
        {
            return Reply::Now(SyncResult::error(GroupError::InconsistentGroupProtocol(
                "protocol type or name does not match the group's".into(),
            )));
        }
        let member_id = r.member_id.to_string();
        match self.state {
            ClassicState::PreparingRebalance => {
                Reply::Now(SyncResult::error(GroupError::RebalanceInProgress))
            }
            ClassicState::CompletingRebalance => {
                let (tx, rx) = oneshot::channel();
                self.pending_sync.remove(&member_id);
                {
                    let m = self.members.get_mut(&member_id).expect("validated");
                    m.last_heartbeat = now;
                    if let Some(old) = m.sync_waiter.replace(tx) {
                        let _ = old.send(SyncResult::error(GroupError::RebalanceInProgress));
                    }
                }
                if self.leader.as_deref() == Some(member_id.as_str()) {
                    let mut given: HashMap<String, Bytes> = assignments.into_iter().collect();
                    for m in self.members.values_mut() {
                        m.assignment = given.remove(&m.member_id).unwrap_or_default();
                    }
                    self.state = ClassicState::Stable;
                    let result = |m: &ClassicMember| SyncResult {
                        error: None,
                        protocol_type: self.protocol_type.clone(),
                        protocol_name: self.protocol_name.clone(),
                        assignment: m.assignment.clone(),
                    };
                    let answers: Vec<(String, SyncResult)> = self
                        .members
                        .values()
                        .filter(|m| m.sync_waiter.is_some())
                        .map(|m| (m.member_id.clone(), result(m)))
                        .collect();
                    for (id, res) in answers {
                        if let Some(m) = self.members.get_mut(&id) {
                            m.answer_sync(res, now);
                        }
                    }
                    if self.pending_sync.is_empty() {
                        self.sync_deadline = None;
                    }
                }
                Reply::Later(rx)
            }
            ClassicState::Stable => {
                self.pending_sync.remove(&member_id);
                if self.pending_sync.is_empty() {
                    self.sync_deadline = None;
                }
                let m = self.members.get_mut(&member_id).expect("validated");
                m.last_heartbeat = now;
                Reply::Now(SyncResult {
                    error: None,
                    protocol_type: self.protocol_type.clone(),
                    protocol_name: self.protocol_name.clone(),
                    assignment: m.assignment.clone(),
                })
            }
            ClassicState::Empty | ClassicState::Dead => unreachable!("checked above"),
        }
    }

    /// Heartbeat.
    pub fn heartbeat(&mut self, r: MemberRef<'_>, now: Instant) -> Result<(), GroupError> {
        if self.state == ClassicState::Empty || self.state == ClassicState::Dead {
            return Err(GroupError::UnknownMemberId(
                "the group has no members".into(),
            ));
        }
        self.validate_member(&r)?;
        self.validate_generation(&r)?;
        if let Some(m) = self.members.get_mut(r.member_id) {
            m.last_heartbeat = now;
        }
        match self.state {
            ClassicState::PreparingRebalance => Err(GroupError::RebalanceInProgress),
            _ => Ok(()),
        }
    }

    /// One member of a LeaveGroup (v3+ carries several).
    pub fn leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        now: Instant,
    ) -> Result<String, GroupError> {
        let id = match instance_id {
            Some(instance) => {
                let Some(owner) = self.static_members.get(instance).cloned() else {
                    return Err(GroupError::UnknownMemberId(format!(
                        "instance {instance} is unknown"
                    )));
                };
                if !member_id.is_empty() && owner != member_id {
                    return Err(GroupError::FencedInstanceId(format!(
                        "instance {instance} is owned by another member"
                    )));
                }
                owner
            }
            None => member_id.to_string(),
        };
        if self.pending_members.remove(&id).is_some() {
            self.maybe_complete_join(now);
            return Ok(id);
        }
        if !self.members.contains_key(&id) {
            return Err(GroupError::UnknownMemberId(format!(
                "member {id} is not in group {}",
                self.group_id
            )));
        }
        self.remove_member_and_rebalance(&id, now);
        Ok(id)
    }

    fn remove_member(&mut self, member_id: &str) {
        if let Some(mut m) = self.members.remove(member_id) {
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(JoinResult::error(
                    GroupError::UnknownMemberId("removed from the group".into()),
                    member_id,
                ));
            }
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(SyncResult::error(GroupError::UnknownMemberId(
                    "removed from the group".into(),
                )));
            }
            if let Some(i) = &m.instance_id {
                if self.static_members.get(i).map(String::as_str) == Some(member_id) {
                    self.static_members.remove(i);
                }
            }
        }
        self.pending_sync.remove(member_id);
        if self.leader.as_deref() == Some(member_id) {
            self.leader = self
                .members
                .values()
                .min_by_key(|m| m.seq)
                .map(|m| m.member_id.clone());
        }
    }

    /// A group just downgraded from a KIP-848 group ([`ClassicGroup::downgraded`]) rebalances
    /// at once: its members were assigned by the coordinator, and now need a leader.
    pub(crate) fn settle_downgraded(&mut self, now: Instant) {
        if self.state == ClassicState::Stable {
            self.prepare_rebalance(now);
        }
    }

    /// The coordinator gives the group up (cluster mode: another broker coordinates it now).
    /// Every JoinGroup and SyncGroup still waiting is answered with `error` (NOT_COORDINATOR),
    /// as Kafka answers them when it unloads a group: the members find the new coordinator at
    /// once and rejoin there. Unanswered, they would wait out their rebalance timeout (five
    /// minutes by default) while the group consumed nothing. The group is dead afterwards.
    pub fn unload(&mut self, error: &GroupError) {
        for m in self.members.values_mut() {
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(JoinResult::error(error.clone(), &m.member_id));
            }
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(SyncResult::error(error.clone()));
            }
        }
        self.state = ClassicState::Dead;
    }

    fn remove_member_and_rebalance(&mut self, member_id: &str, now: Instant) {
        self.remove_member(member_id);
        match self.state {
            ClassicState::Stable | ClassicState::CompletingRebalance => {
                if self.members.is_empty() {
                    // Nothing to rebalance: a new generation with no members.
                    self.generation += 1;
                    self.state = ClassicState::Empty;
                    self.protocol_name = None;
                    self.leader = None;
                    self.pending_sync.clear();
                    self.sync_deadline = None;
                } else {
                    self.prepare_rebalance(now);
                }
            }
            ClassicState::PreparingRebalance => self.maybe_complete_join(now),
            ClassicState::Empty | ClassicState::Dead => {}
        }
    }

    /// Timeouts: initial delay and rebalance deadline, sync deadline, expired sessions and
    /// expired KIP-394 pending ids. Returns the members removed on a deadline since the last
    /// tick, and why, for the caller to log (nothing here logs).
    pub fn tick(&mut self, now: Instant) -> Vec<(String, Removal)> {
        self.pending_members.retain(|_, deadline| *deadline > now);
        if self.state == ClassicState::PreparingRebalance {
            self.maybe_complete_join(now);
        }
        if self.state == ClassicState::CompletingRebalance
            && self.sync_deadline.is_some_and(|d| now >= d)
        {
            // Members that never synced are gone; the rest rebalance without them.
            let missing: Vec<String> = self.pending_sync.drain().collect();
            self.sync_deadline = None;
            let generation = self.generation;
            let rebalance_timeout_ms = self.group_rebalance_timeout().as_millis() as u64;
            // Before any removal: removing the leader elects another.
            let leader = self.leader.clone();
            for id in missing {
                let why = Removal::NotSynced {
                    generation,
                    rebalance_timeout_ms,
                    leader: leader.as_deref() == Some(id.as_str()),
                };
                self.remove_member_and_rebalance(&id, now);
                self.removed.push((id, why));
            }
        }
        // Members waiting for our answer are not expired: the wait is ours, not theirs.
        let expired: Vec<(String, Removal)> = self
            .members
            .values()
            .filter(|m| m.join_waiter.is_none() && m.sync_waiter.is_none())
            .filter(|m| {
                now.saturating_duration_since(m.last_heartbeat)
                    >= Duration::from_millis(m.session_timeout_ms.max(0) as u64)
            })
            .map(|m| {
                let why = Removal::SessionExpired {
                    session_timeout_ms: m.session_timeout_ms,
                };
                (m.member_id.clone(), why)
            })
            .collect();
        for (id, why) in expired {
            self.remove_member_and_rebalance(&id, now);
            self.removed.push((id, why));
        }
        std::mem::take(&mut self.removed)
    }

    /// OffsetCommit from this group: simple commits (generation < 0, no member) only while
    /// the group is empty; otherwise the member and generation must be current.
    pub fn validate_commit(&self, r: MemberRef<'_>) -> Result<(), GroupError> {
        if r.generation < 0 && self.state == ClassicState::Empty {
            return Ok(());
        }
        self.validate_member(&r)?;
        self.validate_generation(&r)?;
        if self.state == ClassicState::CompletingRebalance {
            // The member has not got its new assignment yet; a commit now could be for
            // partitions it no longer owns.
            return Err(GroupError::RebalanceInProgress);
        }
        Ok(())
    }

    /// Topics the members subscribe to, from their `consumer` protocol metadata (for
    /// OffsetDelete's GROUP_SUBSCRIBED_TO_TOPIC). `None` when not a consumer group.
    pub fn subscribed_topics(&self) -> Option<HashSet<String>> {
        if self.protocol_type.as_deref() != Some("consumer") || self.members.is_empty() {
            return None;
        }
        let protocol = self.protocol_name.clone()?;
        let mut out = HashSet::new();
        for m in self.members.values() {
            out.extend(parse_subscription_topics(&m.metadata_for(&protocol))?);
        }
        Some(out)
    }
}

/// The topics of a `consumer` protocol Subscription (version i16, then an array of strings;
/// every version starts this way).
pub fn parse_subscription_topics(b: &[u8]) -> Option<Vec<String>> {
    let get = |at: usize, n: usize| b.get(at..at.checked_add(n)?);
    let n = i32::from_be_bytes(get(2, 4)?.try_into().ok()?);
    if n < 0 {
        return Some(Vec::new());
    }
    let mut at = 6;
    let mut out = Vec::with_capacity((n as usize).min(1024));
    for _ in 0..n {
        let len = i16::from_be_bytes(get(at, 2)?.try_into().ok()?);
        at += 2;
        if len < 0 {
            return None;
        }
        out.push(String::from_utf8(get(at, len as usize)?.to_vec()).ok()?);
        at += len as usize;
    }
    Some(out)
}

#[cfg(test)]
mod tests;
