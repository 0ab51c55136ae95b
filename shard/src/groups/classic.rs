//! The classic group membership protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) as a
//! state machine: requests and the current time go in, answers come out — immediately, or
//! later through a oneshot channel when a JoinGroup or SyncGroup has to wait for the rest of the
//! group. No IO and no clock of its own, so it is tested without sockets or sleeps; the
//! per-shard timer calls [`ClassicGroup::tick`].
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
use futures::channel::oneshot;

use super::GroupError;

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
    fn same_protocols(&self, protocols: &[(String, Bytes)]) -> bool {
        self.protocols == protocols
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
}

fn new_member_id(client_id: &str) -> String {
    format!("{client_id}-{}", uuid::Uuid::new_v4())
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

    fn validate_session(
        &self,
        args: &JoinArgs,
        min_ms: i32,
        max_ms: i32,
    ) -> Result<(), GroupError> {
        if args.session_timeout_ms < min_ms || args.session_timeout_ms > max_ms {
            return Err(GroupError::InvalidSessionTimeout {
                got: args.session_timeout_ms,
                min: min_ms,
                max: max_ms,
            });
        }
        Ok(())
    }

    /// JoinGroup.
    pub fn join(
        &mut self,
        args: JoinArgs,
        now: Instant,
        min_session_ms: i32,
        max_session_ms: i32,
    ) -> Reply<JoinResult> {
        if let Err(e) = self.validate_session(&args, min_session_ms, max_session_ms) {
            return Reply::Now(JoinResult::error(e, &args.member_id));
        }
        if !self.supports(&args.protocol_type, &args.protocols) {
            return Reply::Now(JoinResult::error(
                GroupError::InconsistentGroupProtocol(format!(
                    "member protocols ({}) are incompatible with group {}",
                    args.protocols
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(","),
                    self.group_id
                )),
                &args.member_id,
            ));
        }
        if args.member_id.is_empty() {
            self.join_unknown_member(args, now)
        } else {
            self.join_known_member(args, now)
        }
    }

    fn join_unknown_member(&mut self, args: JoinArgs, now: Instant) -> Reply<JoinResult> {
        let member_id = new_member_id(&args.client_id);
        if let Some(instance) = args.instance_id.clone() {
            if let Some(old_id) = self.static_members.get(&instance).cloned() {
                return self.replace_static_member(old_id, member_id, args, now);
            }
            self.static_members.insert(instance, member_id.clone());
            return self.add_member_and_rebalance(member_id, args, now);
        }
        if args.require_known_member_id {
            // KIP-394: hand out the id; the member joins for real with it.
            let deadline = now + Duration::from_millis(args.session_timeout_ms.max(0) as u64);
            self.pending_members.insert(member_id.clone(), deadline);
            return Reply::Now(JoinResult::error(GroupError::MemberIdRequired, &member_id));
        }
        self.add_member_and_rebalance(member_id, args, now)
    }

    fn join_known_member(&mut self, args: JoinArgs, now: Instant) -> Reply<JoinResult> {
        let member_id = args.member_id.clone();
        if let Some(instance) = &args.instance_id {
            match self.static_members.get(instance) {
                Some(owner) if *owner != member_id => {
                    return Reply::Now(JoinResult::error(
                        GroupError::FencedInstanceId(format!(
                            "instance {instance} is owned by another member"
                        )),
                        &member_id,
                    ));
                }
                Some(_) => {}
                None => {
                    return Reply::Now(JoinResult::error(
                        GroupError::UnknownMemberId(format!("instance {instance} is unknown")),
                        &member_id,
                    ));
                }
            }
        }
        if self.pending_members.remove(&member_id).is_some() {
            return self.add_member_and_rebalance(member_id, args, now);
        }
        if !self.members.contains_key(&member_id) {
            return Reply::Now(JoinResult::error(
                GroupError::UnknownMemberId(format!("member {member_id} is not in the group")),
                &member_id,
            ));
        }
        match self.state {
            ClassicState::PreparingRebalance => {
                let (rx, _) = self.update_member_awaiting_join(&member_id, args, now);
                self.maybe_complete_join(now);
                Reply::Later(rx)
            }
            ClassicState::CompletingRebalance => {
                let same = self.members[&member_id].same_protocols(&args.protocols);
                if same {
                    // The member probably lost our answer: give it again.
                    Reply::Now(self.join_result_for(&member_id))
                } else {
                    let (rx, _) = self.update_member_awaiting_join(&member_id, args, now);
                    self.prepare_rebalance(now);
                    Reply::Later(rx)
                }
            }
            ClassicState::Stable => {
                let is_leader = self.leader.as_deref() == Some(member_id.as_str());
                let same = self.members[&member_id].same_protocols(&args.protocols);
                if is_leader || !same {
                    // The leader rejoining (metadata changed, e.g. new topics) or any member
                    // with new metadata (cooperative rebalancing) starts a new generation.
                    let (rx, _) = self.update_member_awaiting_join(&member_id, args, now);
                    self.prepare_rebalance(now);
                    Reply::Later(rx)
                } else {
                    if let Some(m) = self.members.get_mut(&member_id) {
                        m.last_heartbeat = now;
                    }
                    Reply::Now(self.join_result_for(&member_id))
                }
            }
            ClassicState::Empty | ClassicState::Dead => Reply::Now(JoinResult::error(
                GroupError::UnknownMemberId(format!("member {member_id} is not in the group")),
                &member_id,
            )),
        }
    }

    /// A static member came back with a new member id (its process restarted).
    fn replace_static_member(
        &mut self,
        old_id: String,
        new_id: String,
        args: JoinArgs,
        now: Instant,
    ) -> Reply<JoinResult> {
        let Some(mut old) = self.members.remove(&old_id) else {
            // The mapping outlived the member; treat as a new static member.
            if let Some(i) = &args.instance_id {
                self.static_members.insert(i.clone(), new_id.clone());
            }
            return self.add_member_and_rebalance(new_id, args, now);
        };
        // Whoever still waits under the old id has been replaced.
        if let Some(w) = old.join_waiter.take() {
            let _ = w.send(JoinResult::error(
                GroupError::FencedInstanceId("replaced by a newer instance".into()),
                &old_id,
            ));
        }
        if let Some(w) = old.sync_waiter.take() {
            let _ = w.send(SyncResult::error(GroupError::FencedInstanceId(
                "replaced by a newer instance".into(),
            )));
        }
        let protocols_changed = !old.same_protocols(&args.protocols);
        old.member_id = new_id.clone();
        old.client_id = args.client_id.clone();
        old.client_host = args.client_host.clone();
        old.session_timeout_ms = args.session_timeout_ms;
        old.rebalance_timeout_ms = args.rebalance_timeout_ms;
        old.protocols = args.protocols.clone();
        old.last_heartbeat = now;
        self.members.insert(new_id.clone(), old);
        if let Some(i) = &args.instance_id {
            self.static_members.insert(i.clone(), new_id.clone());
        }
        if self.leader.as_deref() == Some(old_id.as_str()) {
            self.leader = Some(new_id.clone());
        }
        if self.pending_sync.remove(&old_id) {
            self.pending_sync.insert(new_id.clone());
        }
        match self.state {
            ClassicState::Stable if !protocols_changed => {
                // KIP-345: no rebalance for a static member that comes back unchanged.
                let mut r = self.join_result_for(&new_id);
                if self.leader.as_deref() == Some(new_id.as_str()) && args.supports_skip_assignment
                {
                    r.skip_assignment = true;
                }
                Reply::Now(r)
            }
            ClassicState::PreparingRebalance => {
                let (rx, _) = self.update_member_awaiting_join(&new_id, args, now);
                self.maybe_complete_join(now);
                Reply::Later(rx)
            }
            _ => {
                let (rx, _) = self.update_member_awaiting_join(&new_id, args, now);
                self.prepare_rebalance(now);
                Reply::Later(rx)
            }
        }
    }

    fn add_member_and_rebalance(
        &mut self,
        member_id: String,
        args: JoinArgs,
        now: Instant,
    ) -> Reply<JoinResult> {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.members.is_empty() {
            self.protocol_type = Some(args.protocol_type.clone());
        }
        self.members.insert(
            member_id.clone(),
            ClassicMember {
                member_id: member_id.clone(),
                instance_id: args.instance_id.clone(),
                client_id: args.client_id.clone(),
                client_host: args.client_host.clone(),
                session_timeout_ms: args.session_timeout_ms,
                rebalance_timeout_ms: args.rebalance_timeout_ms,
                protocol_type: args.protocol_type.clone(),
                protocols: args.protocols.clone(),
                assignment: Bytes::new(),
                join_waiter: None,
                sync_waiter: None,
                last_heartbeat: now,
                seq,
            },
        );
        let (rx, _) = self.update_member_awaiting_join(&member_id, args, now);
        match self.state {
            ClassicState::PreparingRebalance => {
                // A new member during the initial delay extends it.
                if let Some((deadline, cap)) = self.initial_delay {
                    let d = (now + Duration::from_millis(self.initial_delay_ms)).min(cap);
                    self.initial_delay = Some((deadline.max(d), cap));
                }
                self.maybe_complete_join(now);
            }
            _ => self.prepare_rebalance(now),
        }
        Reply::Later(rx)
    }

    fn update_member_awaiting_join(
        &mut self,
        member_id: &str,
        args: JoinArgs,
        now: Instant,
    ) -> (oneshot::Receiver<JoinResult>, ()) {
        let (tx, rx) = oneshot::channel();
        let m = self
            .members
            .get_mut(member_id)
            .expect("member exists when it awaits a join");
        m.protocols = args.protocols;
        m.session_timeout_ms = args.session_timeout_ms;
        m.rebalance_timeout_ms = args.rebalance_timeout_ms;
        m.client_id = args.client_id;
        m.client_host = args.client_host;
        m.last_heartbeat = now;
        if let Some(old) = m.join_waiter.replace(tx) {
            // A duplicate join from the same member: the earlier request is superseded.
            let _ = old.send(JoinResult::error(
                GroupError::RebalanceInProgress,
                member_id,
            ));
        }
        (rx, ())
    }

    fn prepare_rebalance(&mut self, now: Instant) {
        // Anyone still waiting for a sync answer learns the generation is over.
        for m in self.members.values_mut() {
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(SyncResult::error(GroupError::RebalanceInProgress));
            }
        }
        self.pending_sync.clear();
        self.sync_deadline = None;
        let timeout = self.group_rebalance_timeout();
        if self.state == ClassicState::Empty {
            let delay = Duration::from_millis(self.initial_delay_ms).min(timeout);
            self.initial_delay = Some((now + delay, now + timeout));
        } else {
            self.initial_delay = None;
        }
        self.join_deadline = Some(now + timeout);
        self.state = ClassicState::PreparingRebalance;
        self.maybe_complete_join(now);
    }

    fn all_joined(&self) -> bool {
        self.pending_members.is_empty() && self.members.values().all(|m| m.awaiting_join())
    }

    fn maybe_complete_join(&mut self, now: Instant) {
        if self.state != ClassicState::PreparingRebalance {
            return;
        }
        if let Some((deadline, _)) = self.initial_delay {
            if now < deadline {
                return;
            }
        }
        let timed_out = self.join_deadline.is_some_and(|d| now >= d);
        if self.all_joined() || timed_out {
            self.complete_join(now);
        }
    }

    fn complete_join(&mut self, now: Instant) {
        self.initial_delay = None;
        self.join_deadline = None;
        // Dynamic members that did not rejoin in time are dropped; static members stay (they
        // may come back) but get no answer for this generation.
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| !m.awaiting_join() && m.instance_id.is_none())
            .map(|m| m.member_id.clone())
            .collect();
        for id in gone {
            self.remove_member(&id);
        }
        self.pending_members.clear();
        self.generation += 1;
        if self.members.is_empty() {
            self.state = ClassicState::Empty;
            self.protocol_name = None;
            self.leader = None;
            return;
        }
        self.protocol_name = self.select_protocol();
        if !self
            .leader
            .as_ref()
            .is_some_and(|l| self.members.get(l).is_some_and(|m| m.awaiting_join()))
        {
            self.leader = self
                .members
                .values()
                .filter(|m| m.awaiting_join())
                .min_by_key(|m| m.seq)
                .or_else(|| self.members.values().min_by_key(|m| m.seq))
                .map(|m| m.member_id.clone());
        }
        self.state = ClassicState::CompletingRebalance;
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in &ids {
            let result = self.join_result_for(id);
            let m = self.members.get_mut(id).expect("listed");
            m.assignment = Bytes::new();
            m.last_heartbeat = now;
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(result);
            }
        }
        self.pending_sync = ids.into_iter().collect();
        self.sync_deadline = Some(now + self.group_rebalance_timeout());
    }

    fn join_result_for(&self, member_id: &str) -> JoinResult {
        let leader = self.leader.clone().unwrap_or_default();
        let protocol = self.protocol_name.clone().unwrap_or_default();
        let members = if leader == member_id {
            let mut ms: Vec<&ClassicMember> = self.members.values().collect();
            ms.sort_by_key(|m| m.seq);
            ms.into_iter()
                .map(|m| JoinedMember {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    metadata: m.metadata_for(&protocol),
                })
                .collect()
        } else {
            Vec::new()
        };
        JoinResult {
            error: None,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader,
            member_id: member_id.to_string(),
            skip_assignment: false,
            members,
        }
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
                        if let Some(w) =
                            self.members.get_mut(&id).and_then(|m| m.sync_waiter.take())
                        {
                            let _ = w.send(res);
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
    /// expired KIP-394 pending ids. Returns true when something changed.
    pub fn tick(&mut self, now: Instant) -> bool {
        let mut changed = false;
        let before = self.pending_members.len();
        self.pending_members.retain(|_, deadline| *deadline > now);
        changed |= before != self.pending_members.len();
        if self.state == ClassicState::PreparingRebalance {
            let gen = self.generation;
            self.maybe_complete_join(now);
            changed |= gen != self.generation;
        }
        if self.state == ClassicState::CompletingRebalance
            && self.sync_deadline.is_some_and(|d| now >= d)
        {
            // Members that never synced are gone; the rest rebalance without them.
            let missing: Vec<String> = self.pending_sync.drain().collect();
            self.sync_deadline = None;
            for id in missing {
                self.remove_member_and_rebalance(&id, now);
                changed = true;
            }
        }
        // Members waiting for our answer are not expired: the wait is ours, not theirs.
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| m.join_waiter.is_none() && m.sync_waiter.is_none())
            .filter(|m| {
                now.saturating_duration_since(m.last_heartbeat)
                    >= Duration::from_millis(m.session_timeout_ms.max(0) as u64)
            })
            .map(|m| m.member_id.clone())
            .collect();
        for id in expired {
            tracing::info!(group = %self.group_id, member = %id, "member session expired");
            self.remove_member_and_rebalance(&id, now);
            changed = true;
        }
        changed
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
mod tests {
    use super::*;

    const MIN: i32 = 6000;
    const MAX: i32 = 300_000;

    fn args(member_id: &str, protocols: &[&str]) -> JoinArgs {
        JoinArgs {
            member_id: member_id.into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/h".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: protocols
                .iter()
                .map(|p| (p.to_string(), Bytes::from_static(b"meta")))
                .collect(),
            require_known_member_id: true,
            supports_skip_assignment: true,
        }
    }

    fn now_result(r: Reply<JoinResult>) -> JoinResult {
        match r {
            Reply::Now(r) => r,
            Reply::Later(_) => panic!("expected an immediate answer"),
        }
    }

    fn later<T>(r: Reply<T>) -> oneshot::Receiver<T> {
        match r {
            Reply::Later(rx) => rx,
            Reply::Now(_) => panic!("expected to wait"),
        }
    }

    fn ready<T>(rx: &mut oneshot::Receiver<T>) -> Option<T> {
        rx.try_recv().expect("sender alive or answered")
    }

    /// Joins a new dynamic member through KIP-394 and returns its id and pending answer.
    fn join_new(
        g: &mut ClassicGroup,
        now: Instant,
        protocols: &[&str],
    ) -> (String, oneshot::Receiver<JoinResult>) {
        let first = now_result(g.join(args("", protocols), now, MIN, MAX));
        assert_eq!(first.error, Some(GroupError::MemberIdRequired));
        let id = first.member_id.clone();
        let rx = later(g.join(args(&id, protocols), now, MIN, MAX));
        (id, rx)
    }

    // KIP-394, the initial delay, leader election, and sync distribute the leader's assignment.
    #[test]
    fn first_generation() {
        let t0 = Instant::now();
        let mut g = ClassicGroup::new("g", 100);
        let (a, mut ra) = join_new(&mut g, t0, &["range"]);
        let (b, mut rb) = join_new(&mut g, t0 + Duration::from_millis(50), &["range"]);
        assert_eq!(g.state, ClassicState::PreparingRebalance);
        g.tick(t0 + Duration::from_millis(100));
        assert!(ready(&mut ra).is_none(), "the delay was extended by b");
        g.tick(t0 + Duration::from_millis(151));
        let ja = ready(&mut ra).unwrap();
        let jb = ready(&mut rb).unwrap();
        assert_eq!(ja.generation, 1);
        assert_eq!(ja.leader, a);
        assert_eq!(ja.members.len(), 2);
        assert!(jb.members.is_empty());
        assert_eq!(ja.protocol_name.as_deref(), Some("range"));
        assert_eq!(g.state, ClassicState::CompletingRebalance);

        let t1 = t0 + Duration::from_millis(200);
        let mut sb = later(g.sync(
            MemberRef {
                member_id: &b,
                instance_id: None,
                generation: 1,
            },
            None,
            None,
            vec![],
            t1,
        ));
        assert!(ready(&mut sb).is_none());
        let mut sa = later(g.sync(
            MemberRef {
                member_id: &a,
                instance_id: None,
                generation: 1,
            },
            Some("consumer"),
            Some("range"),
            vec![
                (a.clone(), Bytes::from_static(b"A")),
                (b.clone(), Bytes::from_static(b"B")),
            ],
            t1,
        ));
        assert_eq!(ready(&mut sa).unwrap().assignment, Bytes::from_static(b"A"));
        assert_eq!(ready(&mut sb).unwrap().assignment, Bytes::from_static(b"B"));
        assert_eq!(g.state, ClassicState::Stable);
        assert!(g
            .heartbeat(
                MemberRef {
                    member_id: &a,
                    instance_id: None,
                    generation: 1
                },
                t1
            )
            .is_ok());
        assert!(matches!(
            g.heartbeat(
                MemberRef {
                    member_id: &a,
                    instance_id: None,
                    generation: 0
                },
                t1
            ),
            Err(GroupError::IllegalGeneration(_))
        ));
        assert!(matches!(
            g.heartbeat(
                MemberRef {
                    member_id: "nobody",
                    instance_id: None,
                    generation: 1
                },
                t1
            ),
            Err(GroupError::UnknownMemberId(_))
        ));
    }

    fn stable_pair(t0: Instant) -> (ClassicGroup, String, String) {
        let mut g = ClassicGroup::new("g", 0);
        let (a, mut ra) = join_new(&mut g, t0, &["range"]);
        assert!(ready(&mut ra).is_some(), "no delay: a completes alone");
        // b joins a group that already has a generation: everyone rejoins.
        let (b, mut rb) = join_new(&mut g, t0, &["range"]);
        assert_eq!(g.state, ClassicState::PreparingRebalance);
        let mut ra = later(g.join(args(&a, &["range"]), t0, MIN, MAX));
        let ja = ready(&mut ra).unwrap();
        let _ = ready(&mut rb).unwrap();
        assert_eq!(ja.generation, 2);
        let _ = g.sync(
            MemberRef {
                member_id: &a,
                instance_id: None,
                generation: 2,
            },
            None,
            None,
            vec![],
            t0,
        );
        let _ = g.sync(
            MemberRef {
                member_id: &b,
                instance_id: None,
                generation: 2,
            },
            None,
            None,
            vec![],
            t0,
        );
        assert_eq!(g.state, ClassicState::Stable);
        (g, a, b)
    }

    // A leaving member triggers a rebalance that completes as soon as the rest rejoin.
    #[test]
    fn leave_rebalances() {
        let t0 = Instant::now();
        let (mut g, a, b) = stable_pair(t0);
        assert_eq!(g.leave(&a, None, t0).unwrap(), a);
        assert_eq!(g.state, ClassicState::PreparingRebalance);
        assert_eq!(
            g.heartbeat(
                MemberRef {
                    member_id: &b,
                    instance_id: None,
                    generation: 2
                },
                t0
            ),
            Err(GroupError::RebalanceInProgress)
        );
        let mut rb = later(g.join(args(&b, &["range"]), t0, MIN, MAX));
        let jb = ready(&mut rb).unwrap();
        assert_eq!(jb.generation, 3);
        assert_eq!(jb.leader, b);
        assert_eq!(jb.members.len(), 1);
        assert!(matches!(
            g.leave("zzz", None, t0),
            Err(GroupError::UnknownMemberId(_))
        ));
    }

    // A member that stops heartbeating is removed after its session timeout; the last one
    // leaving empties the group, and an empty group accepts simple commits only.
    #[test]
    fn session_expiry() {
        let t0 = Instant::now();
        let (mut g, a, b) = stable_pair(t0);
        let t1 = t0 + Duration::from_millis(9_000);
        g.heartbeat(
            MemberRef {
                member_id: &b,
                instance_id: None,
                generation: 2,
            },
            t1,
        )
        .unwrap();
        g.tick(t0 + Duration::from_millis(10_000));
        assert!(!g.members.contains_key(&a));
        assert_eq!(g.state, ClassicState::PreparingRebalance);
        // b rejoins; then b stops too.
        let mut rb = later(g.join(args(&b, &["range"]), t1, MIN, MAX));
        assert_eq!(ready(&mut rb).unwrap().generation, 3);
        assert!(g
            .validate_commit(MemberRef {
                member_id: "",
                instance_id: None,
                generation: -1
            })
            .is_err());
        g.tick(t1 + Duration::from_secs(60));
        assert_eq!(g.state, ClassicState::Empty);
        assert!(g
            .validate_commit(MemberRef {
                member_id: "",
                instance_id: None,
                generation: -1
            })
            .is_ok());
    }

    // Protocols: a member with no protocol in common is refused; the majority choice wins.
    #[test]
    fn protocol_selection() {
        let t0 = Instant::now();
        let mut g = ClassicGroup::new("g", 0);
        let (_, mut r1) = join_new(&mut g, t0, &["cooperative-sticky", "range"]);
        ready(&mut r1).unwrap();
        let refused = now_result(g.join(args("", &["roundrobin"]), t0, MIN, MAX));
        assert!(matches!(
            refused.error,
            Some(GroupError::InconsistentGroupProtocol(_))
        ));
        let short = JoinArgs {
            session_timeout_ms: 10,
            ..args("", &["range"])
        };
        assert!(matches!(
            now_result(g.join(short, t0, MIN, MAX)).error,
            Some(GroupError::InvalidSessionTimeout { .. })
        ));
        g.members.values_mut().for_each(|m| {
            m.join_waiter = None;
        });
        let (_, _r2) = join_new(&mut g, t0, &["range", "cooperative-sticky"]);
        let (_, _r3) = join_new(&mut g, t0, &["range"]);
        g.tick(t0 + Duration::from_secs(31));
        assert_eq!(g.protocol_name.as_deref(), Some("range"));
    }

    // Static membership: a restarted instance takes over without a rebalance; the old id is
    // fenced.
    #[test]
    fn static_member_rejoin() {
        let t0 = Instant::now();
        let mut g = ClassicGroup::new("g", 0);
        let mut a = args("", &["range"]);
        a.instance_id = Some("i-1".into());
        let mut r = later(g.join(a.clone(), t0, MIN, MAX));
        let j = ready(&mut r).unwrap();
        let old = j.member_id.clone();
        let _ = g.sync(
            MemberRef {
                member_id: &old,
                instance_id: Some("i-1"),
                generation: 1,
            },
            None,
            None,
            vec![(old.clone(), Bytes::from_static(b"X"))],
            t0,
        );
        assert_eq!(g.state, ClassicState::Stable);
        let j2 = now_result(g.join(a, t0, MIN, MAX));
        assert_eq!(j2.error, None);
        assert_ne!(j2.member_id, old);
        assert_eq!(j2.generation, 1, "no rebalance");
        assert!(j2.skip_assignment);
        assert!(matches!(
            g.heartbeat(
                MemberRef {
                    member_id: &old,
                    instance_id: Some("i-1"),
                    generation: 1
                },
                t0
            ),
            Err(GroupError::FencedInstanceId(_))
        ));
        let s = match g.sync(
            MemberRef {
                member_id: &j2.member_id,
                instance_id: Some("i-1"),
                generation: 1,
            },
            None,
            None,
            vec![],
            t0,
        ) {
            Reply::Now(s) => s,
            Reply::Later(_) => panic!("stable group answers at once"),
        };
        assert_eq!(s.assignment, Bytes::from_static(b"X"));
    }

    // The consumer protocol's subscription header parses; garbage does not panic.
    #[test]
    fn subscription_parse() {
        let mut b = vec![0u8, 1, 0, 0, 0, 2];
        for t in ["ab", "c"] {
            b.extend_from_slice(&(t.len() as i16).to_be_bytes());
            b.extend_from_slice(t.as_bytes());
        }
        b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(parse_subscription_topics(&b).unwrap(), vec!["ab", "c"]);
        for cut in 0..b.len() {
            let _ = parse_subscription_topics(&b[..cut]);
        }
    }
}
