//! The KIP-848 consumer group protocol (ConsumerGroupHeartbeat) as a state machine.
//!
//! Three epochs drive it, as in Kafka:
//! - the **group epoch** rises whenever what the assignment depends on changes (a member joins,
//!   leaves or changes its subscription; a subscribed topic appears, disappears or grows);
//! - the **assignment epoch** is the group epoch the current *target assignment* was computed
//!   at; the target is computed by a server-side assignor ([`crate::assignor`]) for all
//!   members at once whenever the group epoch is ahead of it;
//! - each **member epoch** says which target the member has caught up with.
//!
//! Reconciliation moves each member toward its target one heartbeat at a time, revoke before
//! assign: a member first gives up (and confirms, by no longer reporting them as owned) the
//! partitions it must lose, keeping its epoch; only then does it move to the target epoch, and
//! it receives a newly assigned partition only once no other member still owns it (assigned or
//! pending revocation). So no partition is ever owned by two members at once.
//!
//! Pure logic: time, the topic table, new member ids and the assignor come in as arguments, so
//! every rule is tested without IO, clock or randomness.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use uuid::Uuid;

use crate::assignor::{GroupAssignment, MemberSpec, TopicSpec};
use crate::GroupError;

mod classic_members;
mod target;

/// Topic id -> partitions.
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

pub const LEAVE_GROUP_MEMBER_EPOCH: i32 = -1;
pub const LEAVE_GROUP_STATIC_MEMBER_EPOCH: i32 = -2;

/// Where a member is in its reconciliation (Kafka's `MemberState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// At the target epoch with everything it may have.
    Stable,
    /// Must confirm the revocation of `pending_revocation` before moving on.
    UnrevokedPartitions,
    /// At the target epoch, waiting for partitions other members still own.
    UnreleasedPartitions,
}

#[derive(Debug, Clone)]
pub struct ConsumerMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub server_assignor: Option<String>,
    pub subscribed_names: BTreeSet<String>,
    pub subscribed_regex: Option<String>,
    pub state: MemberState,
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    pub assigned: Assignment,
    pub pending_revocation: Assignment,
    /// The member epoch at which each assigned partition was given to the member: a commit
    /// sent at an older member epoch is still valid for partitions it owned since then.
    assigned_at: HashMap<(Uuid, i32), i32>,
    session_deadline: Instant,
    revocation_deadline: Option<Instant>,
    /// Set for a member that speaks the classic protocol (JoinGroup, SyncGroup, Heartbeat)
    /// in this group: one that was in the classic group this group was upgraded from, or that
    /// joined since with JoinGroup ([`ConsumerGroup::classic_join`]).
    pub classic: Option<ClassicMeta>,
}

impl ConsumerMember {
    /// A member that just joined: epoch 0, nothing assigned, its session starting now.
    fn new(
        member_id: &str,
        instance_id: Option<String>,
        rebalance_timeout_ms: i32,
        session_deadline: Instant,
    ) -> ConsumerMember {
        ConsumerMember {
            member_id: member_id.to_string(),
            instance_id,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            rebalance_timeout_ms,
            server_assignor: None,
            subscribed_names: BTreeSet::new(),
            subscribed_regex: None,
            state: MemberState::Stable,
            member_epoch: 0,
            previous_member_epoch: 0,
            assigned: Assignment::new(),
            pending_revocation: Assignment::new(),
            assigned_at: HashMap::new(),
            session_deadline,
            revocation_deadline: None,
            classic: None,
        }
    }
}

/// What a classic member brings that a KIP-848 member does not.
#[derive(Debug, Clone)]
pub struct ClassicMeta {
    pub session_timeout_ms: i32,
    /// (name, metadata) in the member's order of preference. It is told the first (Kafka
    /// does the same), and its Assignment is written in that metadata's version.
    pub protocols: Vec<(String, Bytes)>,
    /// After a JoinGroup answer: the SyncGroup must come by then (the rebalance timeout).
    sync_deadline: Option<Instant>,
    /// After a heartbeat answered REBALANCE_IN_PROGRESS: the JoinGroup must come by then.
    join_deadline: Option<Instant>,
}

/// A ConsumerGroupHeartbeat as the state machine sees it (`None` = field not sent).
#[derive(Debug, Clone, Default)]
pub struct HeartbeatArgs {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    pub owned: Option<Vec<(Uuid, Vec<i32>)>>,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatResult {
    pub member_id: String,
    pub member_epoch: i32,
    /// Sent when the member joined, sent a full request, or its assignment changed.
    pub assignment: Option<Vec<(Uuid, Vec<i32>)>>,
}

/// The topics a group's subscriptions resolve against: the shard's catalog snapshot.
///
/// A trait rather than the catalog's own type, so this crate needs nothing of `kaas-shard`: the
/// shard implements it for its `TopicTable` snapshot and hands that `Arc` over as it is (no copy
/// per heartbeat), tests implement it for a map. A group re-resolves its regexes only when it is
/// handed another `Arc` (compared by pointer), so a table never changes: a change is a new
/// snapshot.
pub trait Topics: std::fmt::Debug {
    /// The topic called `name`: its id and partition count.
    fn topic(&self, name: &str) -> Option<(Uuid, i32)>;
    /// Every topic's name (what a regex subscription is matched against).
    fn names(&self) -> Box<dyn Iterator<Item = &str> + '_>;
}

/// A plain table: topic name -> (id, partition count).
impl Topics for BTreeMap<String, (Uuid, i32)> {
    fn topic(&self, name: &str) -> Option<(Uuid, i32)> {
        self.get(name).copied()
    }
    fn names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        Box::new(self.keys().map(String::as_str))
    }
}

/// Runs the named assignor; `None` when the name is unknown.
pub type AssignFn<'a> =
    &'a dyn Fn(&str, &[MemberSpec], &BTreeMap<String, TopicSpec>) -> Option<GroupAssignment>;

/// What a heartbeat needs from outside the group.
pub struct HeartbeatEnv<'a> {
    pub now: Instant,
    pub topics: &'a Arc<dyn Topics>,
    /// Draws the id of a member that joins without one (ConsumerGroupHeartbeat v0; v1+ members
    /// bring their own): the caller's randomness (the shard's `GroupManager::new_member_id`),
    /// called only when needed, so the state machine has none of its own.
    pub new_member_id: &'a dyn Fn() -> Uuid,
    /// The rack of the broker that leads a partition (the cluster view Metadata serves), for
    /// the rack-aware assignor; `None` when unknown (no racks, single node, in handover).
    pub leader_rack: &'a dyn Fn(&str, i32) -> Option<String>,
    pub session_timeout_ms: i32,
    pub default_assignor: &'a str,
    pub assign: AssignFn<'a>,
}

/// Checks a heartbeat before it touches the group (Kafka's request validation).
pub fn validate(
    args: &HeartbeatArgs,
    version: i16,
    known_assignor: impl Fn(&str) -> bool,
) -> Result<(), GroupError> {
    let invalid = |m: &str| Err(GroupError::InvalidRequest(m.to_string()));
    // v1+ members generate their own id (KIP-1082); v0 members may leave it to us.
    if (version >= 1 || args.member_epoch > 0 || args.member_epoch == LEAVE_GROUP_MEMBER_EPOCH)
        && args.member_id.is_empty()
    {
        return invalid("MemberId can't be empty.");
    }
    if args.instance_id.as_deref() == Some("") {
        return invalid("InstanceId can't be empty.");
    }
    if args.rack_id.as_deref() == Some("") {
        return invalid("RackId can't be empty.");
    }
    match args.member_epoch {
        0 => {
            if args.rebalance_timeout_ms == -1 {
                return invalid("RebalanceTimeoutMs must be provided in first request.");
            }
            if !args.owned.as_ref().is_some_and(|o| o.is_empty()) {
                return invalid("TopicPartitions must be empty when (re-)joining.");
            }
            if args.subscribed_topic_names.is_none() && args.subscribed_topic_regex.is_none() {
                return invalid(
                    "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.",
                );
            }
        }
        LEAVE_GROUP_STATIC_MEMBER_EPOCH if args.instance_id.is_none() => {
            return invalid("InstanceId can't be null.");
        }
        e if e < LEAVE_GROUP_STATIC_MEMBER_EPOCH => return invalid("MemberEpoch is invalid."),
        _ => {}
    }
    if let Some(a) = &args.server_assignor {
        if !known_assignor(a) {
            return Err(GroupError::UnsupportedAssignor(format!(
                "ServerAssignor {a} is not supported."
            )));
        }
    }
    if let Some(r) = &args.subscribed_topic_regex {
        if !r.is_empty() {
            compile_regex(r)?;
        }
    }
    Ok(())
}

/// Kafka matches the whole topic name (`Matcher.matches`), so the pattern is anchored.
fn compile_regex(r: &str) -> Result<regex::Regex, GroupError> {
    regex::Regex::new(&format!("^(?:{r})$")).map_err(|e| {
        GroupError::InvalidRegularExpression(format!(
            "SubscribedTopicRegex `{r}` is not a valid regular expression: {e}."
        ))
    })
}

#[derive(Debug)]
pub struct ConsumerGroup {
    pub group_id: String,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, ConsumerMember>,
    /// member id -> target assignment at `assignment_epoch`.
    pub target: BTreeMap<String, Assignment>,
    /// Who owns each partition now (assigned or pending revocation).
    owners: HashMap<(Uuid, i32), String>,
    /// Subscribed topics that exist: name -> (id, partition count). A change bumps the epoch.
    subscription_metadata: BTreeMap<String, (Uuid, i32)>,
    /// Subscribed topic -> each partition's leader rack, kept only while some member has a
    /// rack (nothing else uses it). A leader moving to another rack changes it and bumps the
    /// epoch, so locality does not go stale; the rack-aware assignor's overlap weight keeps
    /// the new target close to the old one.
    partition_racks: BTreeMap<String, Vec<Option<String>>>,
    /// Regex -> compiled pattern and the topics it matched in `resolved_for`.
    regexes: HashMap<String, (regex::Regex, BTreeSet<String>)>,
    resolved_for: Option<Arc<dyn Topics>>,
    /// group.instance.id -> member id.
    static_members: HashMap<String, String>,
    /// The assignor of the last target computation (ConsumerGroupDescribe).
    pub assignor_name: String,
    /// A member using the consumer protocol was removed and only classic members are left:
    /// the group goes back to being a classic group ([`ConsumerGroup::downgrade`]).
    downgrade_due: bool,
}

impl ConsumerGroup {
    pub fn new(group_id: &str) -> ConsumerGroup {
        ConsumerGroup {
            group_id: group_id.to_string(),
            group_epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            owners: HashMap::new(),
            subscription_metadata: BTreeMap::new(),
            partition_racks: BTreeMap::new(),
            regexes: HashMap::new(),
            resolved_for: None,
            static_members: HashMap::new(),
            assignor_name: String::new(),
            downgrade_due: false,
        }
    }

    /// Kafka's state names: Empty, Assigning, Reconciling, Stable.
    pub fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.group_epoch > self.assignment_epoch {
            "Assigning"
        } else if self
            .members
            .values()
            .any(|m| m.state != MemberState::Stable || m.member_epoch != self.assignment_epoch)
        {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every topic a member subscribes to, by name or through its regex.
    pub fn member_topics(&self, m: &ConsumerMember) -> BTreeSet<String> {
        let mut out = m.subscribed_names.clone();
        if let Some((_, matched)) = m
            .subscribed_regex
            .as_ref()
            .and_then(|r| self.regexes.get(r))
        {
            out.extend(matched.iter().cloned());
        }
        out
    }

    /// Topics any member subscribes to (OffsetDelete's GROUP_SUBSCRIBED_TO_TOPIC).
    pub fn subscribed_topics(&self) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|m| self.member_topics(m))
            .collect()
    }

    fn set_member_ownership(&mut self, member_id: &str, assigned: Assignment, pending: Assignment) {
        let m = self.members.get_mut(member_id).expect("member exists");
        for (t, ps) in m.assigned.iter().chain(m.pending_revocation.iter()) {
            for p in ps {
                if self.owners.get(&(*t, *p)).map(String::as_str) == Some(member_id) {
                    self.owners.remove(&(*t, *p));
                }
            }
        }
        for (t, ps) in assigned.iter().chain(pending.iter()) {
            for p in ps {
                self.owners.insert((*t, *p), member_id.to_string());
            }
        }
        m.assigned_at
            .retain(|(t, p), _| assigned.get(t).is_some_and(|ps| ps.contains(p)));
        m.assigned = assigned;
        m.pending_revocation = pending;
    }

    fn remove_member(&mut self, member_id: &str) {
        if !self.members.contains_key(member_id) {
            return;
        }
        self.set_member_ownership(member_id, Assignment::new(), Assignment::new());
        if let Some(m) = self.members.remove(member_id) {
            // Kafka's online downgrade: the last member using the consumer protocol is gone
            // and classic members remain (Kafka's `validateOnlineDowngradeWithFencedMember`).
            self.downgrade_due |= m.classic.is_none()
                && !self.members.is_empty()
                && self.members.values().all(|x| x.classic.is_some());
            if let Some(i) = &m.instance_id {
                if self.static_members.get(i).map(String::as_str) == Some(member_id) {
                    self.static_members.remove(i);
                }
            }
        }
        self.target.remove(member_id);
        self.group_epoch += 1;
    }

    /// ConsumerGroupHeartbeat. `args` has passed [`validate`].
    #[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
    pub fn heartbeat(
        &mut self,
        args: HeartbeatArgs,
        env: &HeartbeatEnv<'_>,
    ) -> Result<HeartbeatResult, GroupError> {
        if args.member_epoch == LEAVE_GROUP_MEMBER_EPOCH
            || args.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH
        {
            return self.leave(&args);
        }
        let member_id = if args.member_id.is_empty() {
            (env.new_member_id)().to_string()
        } else {
            args.member_id.clone()
        };
        let session = Duration::from_millis(env.session_timeout_ms.max(0) as u64);
        let joining = args.member_epoch == 0;
        let mut bump = self.group_epoch == 0;
        let before: Option<ConsumerMember> = self.members.get(&member_id).cloned();

        // 1. Find or create the member.
        if joining {
            if let Some(instance) = &args.instance_id {
                if let Some(old_id) = self.static_members.get(instance).cloned() {
                    if old_id != member_id {
                        // A classic instance is replaced at once: that is how a static
                        // member moves to the consumer protocol (Kafka does the same).
                        let unreleased = self.members.get(&old_id).is_some_and(|m| {
                            m.classic.is_none() && m.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH
                        });
                        if unreleased {
                            return Err(GroupError::UnreleasedInstanceId(format!(
                                "Static member {member_id} with instance id {instance} cannot join the group because the instance id is owned by {old_id} member."
                            )));
                        }
                        self.replace_static_member(&old_id, &member_id);
                    }
                }
                self.static_members
                    .insert(instance.clone(), member_id.clone());
            }
            match self.members.get(&member_id) {
                // A member rejoining with epoch 0 lost its partitions: start it afresh.
                Some(m) if m.member_epoch != 0 || !m.assigned.is_empty() => {
                    if m.instance_id.is_none() {
                        self.set_member_ownership(&member_id, Assignment::new(), Assignment::new());
                        let m = self.members.get_mut(&member_id).expect("exists");
                        m.member_epoch = 0;
                        m.previous_member_epoch = 0;
                        m.state = MemberState::Stable;
                        m.revocation_deadline = None;
                    }
                }
                Some(_) => {}
                None => {
                    self.members.insert(
                        member_id.clone(),
                        ConsumerMember::new(
                            &member_id,
                            args.instance_id.clone(),
                            args.rebalance_timeout_ms,
                            env.now + session,
                        ),
                    );
                    bump = true;
                }
            }
        } else {
            if let Some(instance) = &args.instance_id {
                match self.static_members.get(instance) {
                    None => {
                        return Err(GroupError::UnknownMemberId(format!(
                            "Instance id {instance} is unknown."
                        )))
                    }
                    Some(owner) if *owner != member_id => {
                        return Err(GroupError::FencedInstanceId(format!(
                            "Static member {member_id} with instance id {instance} was fenced by member {owner}."
                        )))
                    }
                    Some(_) => {}
                }
            }
            let Some(m) = self.members.get(&member_id) else {
                return Err(GroupError::UnknownMemberId(format!(
                    "Member {member_id} is not a member of group {}.",
                    self.group_id
                )));
            };
            check_epoch(m, args.member_epoch, args.owned.as_deref())?;
        }

        // 2. Update what the member told us; a new subscription bumps the group epoch.
        {
            let m = self.members.get_mut(&member_id).expect("found or created");
            m.session_deadline = env.now + session;
            // It speaks the consumer protocol now (a classic static member replaced by it).
            m.classic = None;
            m.client_id = args.client_id.clone();
            m.client_host = args.client_host.clone();
            if let Some(i) = &args.instance_id {
                m.instance_id = Some(i.clone());
            }
            if args.rack_id.is_some() {
                m.rack_id = args.rack_id.clone();
            }
            if args.rebalance_timeout_ms != -1 {
                m.rebalance_timeout_ms = args.rebalance_timeout_ms;
            }
            if args.server_assignor.is_some() {
                m.server_assignor = args.server_assignor.clone();
            }
            if let Some(names) = &args.subscribed_topic_names {
                let names: BTreeSet<String> = names.iter().cloned().collect();
                if names != m.subscribed_names {
                    m.subscribed_names = names;
                    bump = true;
                }
            }
            if let Some(r) = &args.subscribed_topic_regex {
                let r = Some(r.clone()).filter(|r| !r.is_empty());
                if r != m.subscribed_regex {
                    m.subscribed_regex = r;
                    bump = true;
                }
            }
        }

        // 3. Topics matter too: a subscribed topic created, deleted or grown bumps the epoch.
        self.bump_and_assign(bump, env);

        // 4. Reconcile this member toward its target.
        self.reconcile(&member_id, args.owned.as_deref(), env.now);

        let m = &self.members[&member_id];
        let full_request = joining
            || (args.rebalance_timeout_ms != -1
                && (args.subscribed_topic_names.is_some()
                    || args.subscribed_topic_regex.is_some())
                && args.owned.is_some());
        let changed = before.as_ref().is_none_or(|b| b.assigned != m.assigned);
        let assignment = (full_request || changed).then(|| {
            m.assigned
                .iter()
                .map(|(t, ps)| (*t, ps.iter().copied().collect()))
                .collect()
        });
        Ok(HeartbeatResult {
            member_id,
            member_epoch: m.member_epoch,
            assignment,
        })
    }

    /// Bumps the group epoch when `bump` says a member's subscription changed or when the
    /// subscribed topics did (created, deleted, grown, or a leader's rack moved), and computes
    /// the target for the new epoch.
    fn bump_and_assign(&mut self, mut bump: bool, env: &HeartbeatEnv<'_>) {
        self.refresh_regexes(env.topics);
        let metadata = self.compute_subscription_metadata(&**env.topics);
        if metadata != self.subscription_metadata {
            self.subscription_metadata = metadata;
            bump = true;
        }
        let racks = self.compute_partition_racks(env);
        if racks != self.partition_racks {
            self.partition_racks = racks;
            bump = true;
        }
        if bump {
            self.group_epoch += 1;
        }
        if self.group_epoch > self.assignment_epoch {
            self.compute_target(env);
        }
    }

    /// A static member came back under a new member id: it inherits the old one's partitions.
    fn replace_static_member(&mut self, old_id: &str, new_id: &str) {
        let Some(mut old) = self.members.remove(old_id) else {
            return;
        };
        let assigned = std::mem::take(&mut old.assigned);
        let pending = std::mem::take(&mut old.pending_revocation);
        for (t, ps) in assigned.iter().chain(pending.iter()) {
            for p in ps {
                self.owners.remove(&(*t, *p));
            }
        }
        old.member_id = new_id.to_string();
        old.member_epoch = 0;
        old.previous_member_epoch = 0;
        old.state = MemberState::Stable;
        old.revocation_deadline = None;
        self.members.insert(new_id.to_string(), old);
        if let Some(t) = self.target.remove(old_id) {
            self.target.insert(new_id.to_string(), t);
        }
        self.set_member_ownership(new_id, assigned, Assignment::new());
    }

    fn leave(&mut self, args: &HeartbeatArgs) -> Result<HeartbeatResult, GroupError> {
        let member_id = self.leaving_member(&args.member_id, args.instance_id.as_deref())?;
        if args.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH {
            // A static member leaving temporarily keeps its partitions until its session
            // expires, so a quick restart gets them back without a rebalance.
            if let Some(m) = self.members.get_mut(&member_id) {
                m.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH;
            }
        } else {
            self.remove_member(&member_id);
        }
        Ok(HeartbeatResult {
            member_id,
            member_epoch: args.member_epoch,
            assignment: None,
        })
    }

    /// The member a leave names, by member id or (static) instance id: a leave heartbeat or
    /// a classic LeaveGroup. An instance owned by another member id is fenced.
    fn leaving_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<String, GroupError> {
        let id = match instance_id {
            Some(instance) => {
                let Some(owner) = self.static_members.get(instance).cloned() else {
                    return Err(GroupError::UnknownMemberId(format!(
                        "Instance id {instance} is unknown."
                    )));
                };
                if !member_id.is_empty() && owner != member_id {
                    return Err(GroupError::FencedInstanceId(format!(
                        "Static member {member_id} with instance id {instance} was fenced by member {owner}."
                    )));
                }
                owner
            }
            None => member_id.to_string(),
        };
        if !self.members.contains_key(&id) {
            return Err(GroupError::UnknownMemberId(format!(
                "Member {id} is not a member of group {}.",
                self.group_id
            )));
        }
        Ok(id)
    }

    /// Kafka's CurrentAssignmentBuilder: one reconciliation step for one member.
    #[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
    fn reconcile(&mut self, member_id: &str, owned: Option<&[(Uuid, Vec<i32>)]>, now: Instant) {
        let m = &self.members[member_id];
        if m.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH {
            return;
        }
        let owns_any = |revoked: &Assignment| match owned {
            None => true,
            Some(o) => o.iter().any(|(t, ps)| {
                revoked
                    .get(t)
                    .is_some_and(|r| ps.iter().any(|p| r.contains(p)))
            }),
        };
        match m.state {
            MemberState::Stable if m.member_epoch == self.assignment_epoch => return,
            MemberState::UnrevokedPartitions if owns_any(&m.pending_revocation) => return,
            _ => {}
        }
        let target = self.target.get(member_id).cloned().unwrap_or_default();
        let mut assigned = Assignment::new();
        let mut revoke = Assignment::new();
        let mut to_assign = Assignment::new();
        let mut unreleased = false;
        let topics: BTreeSet<Uuid> = target.keys().chain(m.assigned.keys()).copied().collect();
        for t in topics {
            let want = target.get(&t).cloned().unwrap_or_default();
            let have = m.assigned.get(&t).cloned().unwrap_or_default();
            let keep: BTreeSet<i32> = have.intersection(&want).copied().collect();
            let gone: BTreeSet<i32> = have.difference(&keep).copied().collect();
            let mut new: BTreeSet<i32> = want.difference(&keep).copied().collect();
            let mine_pending = m.pending_revocation.get(&t);
            new.retain(|p| {
                let free = match self.owners.get(&(t, *p)) {
                    None => true,
                    Some(o) => o == member_id && mine_pending.is_some_and(|x| x.contains(p)),
                };
                unreleased |= !free;
                free
            });
            if !keep.is_empty() {
                assigned.insert(t, keep);
            }
            if !gone.is_empty() {
                revoke.insert(t, gone);
            }
            if !new.is_empty() {
                to_assign.insert(t, new);
            }
        }
        let epoch = m.member_epoch;
        let rebalance_timeout = Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64);
        let (state, new_epoch, pending) = if !revoke.is_empty() && owns_any(&revoke) {
            // Revoke first; the member keeps its epoch until it confirms.
            (MemberState::UnrevokedPartitions, epoch, revoke)
        } else {
            for (t, ps) in to_assign {
                assigned.entry(t).or_default().extend(ps);
            }
            let state = if unreleased {
                MemberState::UnreleasedPartitions
            } else {
                MemberState::Stable
            };
            (state, self.assignment_epoch, Assignment::new())
        };
        self.set_member_ownership(member_id, assigned, pending);
        let m = self.members.get_mut(member_id).expect("exists");
        if new_epoch != m.member_epoch {
            m.previous_member_epoch = m.member_epoch;
            m.member_epoch = new_epoch;
        }
        for (t, ps) in &m.assigned {
            for p in ps {
                m.assigned_at.entry((*t, *p)).or_insert(new_epoch);
            }
        }
        // A classic member has no revocation deadline: it revokes by rejoining, and its
        // JoinGroup and SyncGroup deadlines bound that (as in Kafka).
        if state == MemberState::UnrevokedPartitions && m.classic.is_none() {
            if m.state != MemberState::UnrevokedPartitions || m.revocation_deadline.is_none() {
                m.revocation_deadline = Some(now + rebalance_timeout);
            }
        } else {
            m.revocation_deadline = None;
        }
        m.state = state;
    }

    /// Expired sessions, members that did not revoke within their rebalance timeout, and
    /// classic members that did not sync after a JoinGroup answer or rejoin after being told to
    /// (each within its rebalance timeout) are removed. Returns the members removed, for the
    /// caller to log (nothing here logs).
    pub fn tick(&mut self, now: Instant) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                let classic_late = m.classic.as_ref().is_some_and(|c| {
                    c.sync_deadline.is_some_and(|d| now >= d)
                        || c.join_deadline.is_some_and(|d| now >= d)
                });
                now >= m.session_deadline
                    || m.revocation_deadline.is_some_and(|d| now >= d)
                    || classic_late
            })
            .map(|m| m.member_id.clone())
            .collect();
        for id in &gone {
            self.remove_member(id);
        }
        gone
    }

    /// OffsetCommit: admin / standalone commits (epoch < 0) only while the group is empty;
    /// members commit at their current epoch, or at an older one for partitions they have
    /// owned since that epoch (`partitions`: topic id, `None` for an unknown topic, and
    /// partition). The older-epoch case is the commit that crossed the heartbeat answer moving
    /// the member on: the member still owns those partitions, so the commit is no zombie's,
    /// and refusing it would only surface a spurious CommitFailedException.
    pub fn validate_commit(
        &self,
        member_id: &str,
        member_epoch: i32,
        version: i16,
        partitions: &[(Option<Uuid>, i32)],
    ) -> Result<(), GroupError> {
        if member_epoch < 0 && self.members.is_empty() {
            return Ok(());
        }
        let Some(m) = self.members.get(member_id) else {
            return Err(GroupError::UnknownMemberId(format!(
                "Member {member_id} is not a member of group {}.",
                self.group_id
            )));
        };
        if m.classic.is_some() {
            // A classic member commits with its generation, which is its member epoch here;
            // any other is ILLEGAL_GENERATION, which a classic client rejoins on.
            return classic_members::check_generation(m, member_epoch);
        }
        if version < 9 {
            return Err(GroupError::UnsupportedVersion(
                "OffsetCommit version 9 or above must be used by members using the consumer group protocol".into(),
            ));
        }
        let owned_since = |(t, p): &(Option<Uuid>, i32)| {
            t.and_then(|t| m.assigned_at.get(&(t, *p)))
                .is_some_and(|since| *since <= member_epoch)
        };
        if member_epoch >= 0
            && member_epoch < m.member_epoch
            && !partitions.is_empty()
            && partitions.iter().all(owned_since)
        {
            return Ok(());
        }
        check_commit_epoch(m, member_epoch)
    }

    /// OffsetFetch v9: a member reading offsets must be current.
    pub fn validate_fetch(&self, member_id: &str, member_epoch: i32) -> Result<(), GroupError> {
        let Some(m) = self.members.get(member_id) else {
            return Err(GroupError::UnknownMemberId(format!(
                "Member {member_id} is not a member of group {}.",
                self.group_id
            )));
        };
        if m.classic.is_some() {
            return classic_members::check_generation(m, member_epoch);
        }
        check_commit_epoch(m, member_epoch)
    }
}

/// Commits and fetches at another epoch than the member's are STALE_MEMBER_EPOCH, as in Kafka
/// (the member retries once its heartbeat brings the current epoch).
fn check_commit_epoch(m: &ConsumerMember, epoch: i32) -> Result<(), GroupError> {
    if epoch != m.member_epoch {
        return Err(GroupError::StaleMemberEpoch(format!(
            "The received member epoch {epoch} does not match the expected member epoch {}.",
            m.member_epoch
        )));
    }
    Ok(())
}

/// A heartbeat's epoch must be the member's, or its previous one when the answer that moved
/// it on was lost (then it may only own partitions it still has).
fn check_epoch(
    m: &ConsumerMember,
    received: i32,
    owned: Option<&[(Uuid, Vec<i32>)]>,
) -> Result<(), GroupError> {
    if received > m.member_epoch {
        return Err(GroupError::FencedMemberEpoch(format!(
            "The consumer group member has a greater member epoch ({received}) than the one known by the group coordinator ({}). The member must abandon all its partitions and rejoin.",
            m.member_epoch
        )));
    }
    if received < m.member_epoch {
        let subset = owned.is_some_and(|o| {
            o.iter().all(|(t, ps)| {
                m.assigned
                    .get(t)
                    .is_some_and(|a| ps.iter().all(|p| a.contains(p)))
            })
        });
        if received != m.previous_member_epoch || !subset {
            return Err(GroupError::FencedMemberEpoch(format!(
                "The consumer group member has a smaller member epoch ({received}) than the one known by the group coordinator ({}). The member must abandon all its partitions and rejoin.",
                m.member_epoch
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
