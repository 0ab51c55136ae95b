//! Classic members in a KIP-848 group, and the two conversions between the protocols: Kafka's
//! online migration (`group.consumer.migration.policy=bidirectional`, its default since 4.0).
//!
//! - **Upgrade.** The first ConsumerGroupHeartbeat joining a classic group that uses the
//!   `consumer` embedded protocol turns it into a KIP-848 group
//!   ([`ConsumerGroup::from_classic`]): each classic member keeps its id, its last assignment
//!   (as its target, at the classic generation as its epoch) and its subscription, so a rolling
//!   switch of `group.protocol` moves the group one member at a time without stopping it.
//! - **Classic members** keep speaking JoinGroup, SyncGroup, Heartbeat and LeaveGroup. The
//!   coordinator is their assignor: a JoinGroup is answered at once, as a follower (no leader
//!   named, no member list), at the member's epoch; its SyncGroup gets what reconciliation gave
//!   it. A heartbeat answers REBALANCE_IN_PROGRESS when the member must move: the group epoch
//!   passed the member's, it still owns partitions it must give up (revoked partitions are
//!   confirmed by the next JoinGroup no longer listing them as owned), or partitions it waited
//!   for were released.
//! - **Downgrade.** When the last member using the consumer protocol leaves or is fenced and
//!   classic members remain, the group becomes a classic group again
//!   ([`ConsumerGroup::downgrade`] hands it over as a settled generation) and rebalances.
//!
//! Kafka's rules, from its `GroupMetadataManager` (`classicGroupJoinToConsumerGroup`,
//! `classicGroupSyncToConsumerGroup`, `classicGroupHeartbeatToConsumerGroup`,
//! `convertToConsumerGroup`, `convertToClassicGroup`).

use super::*;
use crate::classic::{
    check_session_timeout, ClassicGroup, JoinArgs, JoinResult, MemberRef, StoredGroup, StoredMember,
};
use crate::consumer_protocol::{self as cp, Malformed};

const CONSUMER: &str = "consumer";

impl ConsumerGroup {
    /// The online upgrade: `classic` as a KIP-848 group at its generation, its members classic
    /// members of it. The classic group is left untouched (the caller discards it only if the
    /// heartbeat that asked for the upgrade succeeds on the result, as Kafka applies the
    /// conversion only with the heartbeat's own records).
    pub fn from_classic(
        classic: &ClassicGroup,
        topics: &dyn Topics,
        now: Instant,
    ) -> Result<ConsumerGroup, GroupError> {
        if classic.protocol_type.as_deref() != Some(CONSUMER) {
            return Err(GroupError::GroupIdNotFound(format!(
                "Group {} is not a consumer group: its members use the embedded protocol type {:?}, not \"consumer\", so it cannot be upgraded.",
                classic.group_id,
                classic.protocol_type.as_deref().unwrap_or("")
            )));
        }
        let malformed = |m: &str, e: Malformed| {
            GroupError::GroupIdNotFound(format!(
                "Cannot upgrade the classic group {} to a consumer group because the embedded consumer protocol of member {m} is malformed ({}).",
                classic.group_id, e.0
            ))
        };
        let generation = classic.generation;
        let mut g = ConsumerGroup::new(&classic.group_id);
        g.group_epoch = generation;
        g.assignment_epoch = generation;
        for m in classic.members.values() {
            // The protocol the group settled on; a group still in its first rebalance has
            // none yet, and each member's first preference stands in.
            let protocol = classic
                .protocol_name
                .clone()
                .or_else(|| m.protocols.first().map(|(n, _)| n.clone()))
                .unwrap_or_default();
            let sub = cp::decode_subscription(&m.metadata_for(&protocol))
                .map_err(|e| malformed(&m.member_id, e))?;
            let assigned = by_id(
                &cp::decode_assignment(&m.assignment).map_err(|e| malformed(&m.member_id, e))?,
                topics,
            );
            if let Some(i) = &m.instance_id {
                g.static_members.insert(i.clone(), m.member_id.clone());
            }
            let mut member = ConsumerMember::new(
                &m.member_id,
                m.instance_id.clone(),
                m.rebalance_timeout_ms,
                now + millis(m.session_timeout_ms),
            );
            member.rack_id = sub.rack;
            member.client_id = m.client_id.clone();
            member.client_host = m.client_host.clone();
            member.subscribed_names = sub.topics.into_iter().collect();
            member.member_epoch = generation;
            member.previous_member_epoch = generation;
            member.classic = Some(ClassicMeta {
                session_timeout_ms: m.session_timeout_ms,
                protocols: m.protocols.clone(),
                sync_deadline: None,
                join_deadline: None,
            });
            g.members.insert(m.member_id.clone(), member);
            g.target.insert(m.member_id.clone(), assigned.clone());
            g.set_member_ownership(&m.member_id, assigned, Assignment::new());
            let member = g.members.get_mut(&m.member_id).expect("inserted");
            for (t, ps) in &member.assigned {
                for p in ps {
                    member.assigned_at.insert((*t, *p), generation);
                }
            }
        }
        Ok(g)
    }

    /// JoinGroup from a classic member (Kafka's `classicGroupJoinToConsumerGroup`). The
    /// session timeout must lie within the broker's bounds, as in a classic group; a member
    /// without an id on JoinGroup v4+ is given one and asked to rejoin with it
    /// (MEMBER_ID_REQUIRED), as in a classic group.
    pub fn classic_join(
        &mut self,
        args: JoinArgs,
        env: &HeartbeatEnv<'_>,
        min_session_ms: i32,
        max_session_ms: i32,
    ) -> Result<JoinResult, GroupError> {
        check_session_timeout(args.session_timeout_ms, min_session_ms, max_session_ms)?;
        let unknown = args.member_id.is_empty();
        let member_id = if unknown {
            (env.new_member_id)().to_string()
        } else {
            args.member_id.clone()
        };
        if !self.supports_classic(&member_id, &args.protocol_type, &args.protocols) {
            return Err(GroupError::InconsistentGroupProtocol(format!(
                "Member {member_id}'s protocols are not supported."
            )));
        }
        if unknown && args.instance_id.is_none() && args.require_known_member_id {
            return Ok(JoinResult::error(GroupError::MemberIdRequired, &member_id));
        }
        let first = args
            .protocols
            .first()
            .expect("supported protocols are not empty");
        let sub = cp::decode_subscription(&first.1).map_err(|e| {
            GroupError::InconsistentGroupProtocol(format!(
                "Member {member_id}'s embedded consumer protocol is malformed ({}).",
                e.0
            ))
        })?;

        let mut bump = self.find_or_add_classic(&member_id, unknown, &args, env.now)?;
        bump |= self.update_classic(&member_id, &args, &sub, env.now);

        // The target, and one reconciliation step against what the member still owns.
        self.bump_and_assign(bump, env);
        let owned: Vec<(Uuid, Vec<i32>)> = by_id(&sub.owned, &**env.topics)
            .into_iter()
            .map(|(t, ps)| (t, ps.into_iter().collect()))
            .collect();
        self.reconcile(&member_id, Some(&owned), env.now);

        let m = &self.members[&member_id];
        Ok(JoinResult {
            error: None,
            generation: m.member_epoch,
            protocol_type: Some(CONSUMER.to_string()),
            protocol_name: Some(first.0.clone()),
            // No leader: the coordinator assigns, and every classic member is a follower.
            leader: String::new(),
            member_id,
            skip_assignment: false,
            members: Vec::new(),
        })
    }

    /// Step 1 of a classic JoinGroup: the member, found or added (a static member coming back
    /// without its id replaces the old instance and takes its partitions, as in a classic
    /// group). Returns whether it is new, which bumps the group epoch.
    fn find_or_add_classic(
        &mut self,
        member_id: &str,
        unknown: bool,
        args: &JoinArgs,
        now: Instant,
    ) -> Result<bool, GroupError> {
        if let Some(instance) = &args.instance_id {
            match self.static_members.get(instance).cloned() {
                Some(owner) if owner != member_id => {
                    if !unknown {
                        return Err(GroupError::FencedInstanceId(format!(
                            "Static member {member_id} with instance id {instance} was fenced by member {owner}."
                        )));
                    }
                    self.replace_static_member(&owner, member_id);
                }
                _ => {}
            }
            self.static_members
                .insert(instance.clone(), member_id.to_string());
        }
        if self.members.contains_key(member_id) {
            return Ok(false);
        }
        self.members.insert(
            member_id.to_string(),
            ConsumerMember::new(
                member_id,
                args.instance_id.clone(),
                args.rebalance_timeout_ms,
                now + millis(args.session_timeout_ms),
            ),
        );
        Ok(true)
    }

    /// Step 2 of a classic JoinGroup: what it says (subscription, rack, timeouts, protocols),
    /// and its SyncGroup deadline. Returns whether the subscription changed.
    fn update_classic(
        &mut self,
        member_id: &str,
        args: &JoinArgs,
        sub: &cp::Subscription,
        now: Instant,
    ) -> bool {
        let m = self.members.get_mut(member_id).expect("found or added");
        let names: BTreeSet<String> = sub.topics.iter().cloned().collect();
        let changed = names != m.subscribed_names || m.subscribed_regex.is_some();
        if changed {
            m.subscribed_names = names;
            m.subscribed_regex = None;
        }
        if sub.rack.is_some() {
            m.rack_id = sub.rack.clone();
        }
        m.rebalance_timeout_ms = args.rebalance_timeout_ms;
        m.server_assignor = None;
        m.client_id = args.client_id.clone();
        m.client_host = args.client_host.clone();
        m.session_deadline = now + millis(args.session_timeout_ms);
        m.classic = Some(ClassicMeta {
            session_timeout_ms: args.session_timeout_ms,
            protocols: args.protocols.clone(),
            sync_deadline: Some(now + millis(args.rebalance_timeout_ms)),
            join_deadline: None,
        });
        changed
    }

    /// SyncGroup from a classic member: its assigned partitions, in its metadata's version.
    /// `name` maps a topic id to its name (a topic deleted meanwhile is left out).
    pub fn classic_sync(
        &mut self,
        r: &MemberRef<'_>,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        name: &dyn Fn(Uuid) -> Option<String>,
        now: Instant,
    ) -> Result<Bytes, GroupError> {
        let member_id = self.classic_member(r)?;
        let group_epoch = self.group_epoch;
        let m = self.members.get_mut(&member_id).expect("found");
        check_generation(m, r.generation)?;
        let meta = m.classic.as_mut().expect("a classic member");
        let first = meta
            .protocols
            .first()
            .map(|(n, _)| n.as_str())
            .unwrap_or("");
        if protocol_type.is_some_and(|t| t != CONSUMER) {
            return Err(GroupError::InconsistentGroupProtocol(format!(
                "The protocol type {} from member {member_id} request is not equal to the group protocol type consumer.",
                protocol_type.unwrap_or("")
            )));
        }
        if protocol_name.is_some_and(|n| n != first) {
            return Err(GroupError::InconsistentGroupProtocol(format!(
                "The protocol name {} from member {member_id} request is not equal to the protocol name {first} returned in the join response.",
                protocol_name.unwrap_or("")
            )));
        }
        if group_epoch > m.member_epoch && m.state != MemberState::UnrevokedPartitions {
            // Another rebalance began since its JoinGroup: it must rejoin first.
            meta.join_deadline
                .get_or_insert(now + millis(m.rebalance_timeout_ms));
            return Err(GroupError::RebalanceInProgress);
        }
        meta.sync_deadline = None;
        m.session_deadline = now + millis(meta.session_timeout_ms);
        Ok(meta.assignment_bytes(&m.assigned, name))
    }

    /// Heartbeat from a classic member (Kafka's `classicGroupHeartbeatToConsumerGroup`).
    pub fn classic_heartbeat(&mut self, r: &MemberRef<'_>, now: Instant) -> Result<(), GroupError> {
        let member_id = self.classic_member(r)?;
        let waiting = self.waiting_on_unreleased(&member_id);
        let group_epoch = self.group_epoch;
        let m = self.members.get_mut(&member_id).expect("found");
        check_generation(m, r.generation)?;
        let meta = m.classic.as_mut().expect("a classic member");
        m.session_deadline = now + millis(meta.session_timeout_ms);
        let must_rejoin = m.member_epoch < group_epoch
            || m.state == MemberState::UnrevokedPartitions
            || (m.state == MemberState::UnreleasedPartitions && !waiting);
        if must_rejoin {
            meta.join_deadline
                .get_or_insert(now + millis(m.rebalance_timeout_ms));
            return Err(GroupError::RebalanceInProgress);
        }
        Ok(())
    }

    /// LeaveGroup for one classic member, named by member id or (static) instance id. Returns
    /// the id of the member that left.
    pub fn classic_leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<String, GroupError> {
        let id = self.leaving_member(member_id, instance_id)?;
        if self.members[&id].classic.is_none() {
            return Err(GroupError::UnknownMemberId(format!(
                "Member {id} does not use the classic protocol."
            )));
        }
        self.remove_member(&id);
        Ok(id)
    }

    /// Whether the group must become a classic group now (see the module's comment).
    pub fn downgrade_due(&self) -> bool {
        self.downgrade_due
            && !self.members.is_empty()
            && self.members.values().all(|m| m.classic.is_some())
    }

    /// The online downgrade: the group's classic members as a settled classic generation at
    /// the group epoch, each holding its target assignment (written in its metadata's
    /// version); the classic side restores it and rebalances
    /// ([`ClassicGroup::downgraded`]). `name` maps topic ids to names.
    pub fn downgrade(&mut self, name: &dyn Fn(Uuid) -> Option<String>) -> StoredGroup {
        debug_assert!(self.downgrade_due());
        self.downgrade_due = false;
        let members = self
            .members
            .values()
            .filter_map(|m| {
                let meta = m.classic.as_ref()?;
                let target = self.target.get(&m.member_id).cloned().unwrap_or_default();
                Some(StoredMember {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: meta.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocol_type: CONSUMER.to_string(),
                    protocols: meta.protocols.clone(),
                    assignment: meta.assignment_bytes(&target, name),
                })
            })
            .collect();
        StoredGroup {
            generation: self.group_epoch,
            protocol_type: Some(CONSUMER.to_string()),
            protocol_name: None, // chosen by the classic side, by vote
            leader: None,
            members,
        }
    }

    /// A classic JoinGroup's protocols fit the group: type `consumer`, and one protocol every
    /// other classic member supports (Kafka's `supportsClassicProtocols`).
    fn supports_classic(
        &self,
        member_id: &str,
        protocol_type: &str,
        protocols: &[(String, Bytes)],
    ) -> bool {
        protocol_type == CONSUMER
            && !protocols.is_empty()
            && protocols.iter().any(|(name, _)| {
                self.members
                    .values()
                    .filter(|m| m.member_id != member_id)
                    .filter_map(|m| m.classic.as_ref())
                    .all(|c| c.protocols.iter().any(|(n, _)| n == name))
            })
    }

    /// The member a classic SyncGroup or Heartbeat names (Kafka's
    /// `validateConsumerGroupMember`), which must speak the classic protocol.
    fn classic_member(&self, r: &MemberRef<'_>) -> Result<String, GroupError> {
        if let Some(instance) = r.instance_id {
            match self.static_members.get(instance) {
                None => {
                    return Err(GroupError::UnknownMemberId(format!(
                        "Member with instance id {instance} is not a member of group {}.",
                        self.group_id
                    )))
                }
                Some(owner) if owner != r.member_id => {
                    return Err(GroupError::FencedInstanceId(format!(
                        "Static member {} with instance id {instance} was fenced by member {owner}.",
                        r.member_id
                    )))
                }
                Some(_) => {}
            }
        }
        match self.members.get(r.member_id) {
            None => Err(GroupError::UnknownMemberId(format!(
                "Member {} is not a member of group {}.",
                r.member_id, self.group_id
            ))),
            Some(m) if m.classic.is_none() => Err(GroupError::UnknownMemberId(format!(
                "Member {} does not use the classic protocol.",
                r.member_id
            ))),
            Some(_) => Ok(r.member_id.to_string()),
        }
    }

    /// A member in UnreleasedPartitions still waits when another member owns a partition of
    /// its target that it has not got.
    fn waiting_on_unreleased(&self, member_id: &str) -> bool {
        let m = &self.members[member_id];
        self.target.get(member_id).is_some_and(|target| {
            target.iter().any(|(t, ps)| {
                ps.iter().any(|p| {
                    !m.assigned.get(t).is_some_and(|a| a.contains(p))
                        && self.owners.get(&(*t, *p)).is_some_and(|o| o != member_id)
                })
            })
        })
    }
}

impl ClassicGroup {
    /// The classic side of the online downgrade: the generation [`ConsumerGroup::downgrade`]
    /// handed over, restored with the protocol the members vote for, then rebalanced so the
    /// members (told by their next heartbeat) agree on a leader and an assignment.
    pub fn downgraded(
        group_id: &str,
        initial_delay_ms: u64,
        mut stored: StoredGroup,
        now: Instant,
    ) -> ClassicGroup {
        stored.leader = stored.members.first().map(|m| m.member_id.clone());
        // `restore` wants a protocol every member supports: the first member's first choice
        // that all support (the vote below then picks among them).
        stored.protocol_name = stored.members.first().and_then(|first| {
            first.protocols.iter().map(|(n, _)| n.clone()).find(|n| {
                stored
                    .members
                    .iter()
                    .all(|m| m.protocols.iter().any(|(x, _)| x == n))
            })
        });
        let mut g = ClassicGroup::restore(group_id, initial_delay_ms, stored, now);
        g.settle_downgraded(now);
        g
    }
}

impl ClassicMeta {
    /// `assignment` as the member reads it: a `consumer` protocol Assignment by topic name,
    /// in the version of the metadata it was told to use (its first protocol's). A topic
    /// `name` no longer knows (deleted meanwhile) is left out.
    fn assignment_bytes(
        &self,
        assignment: &Assignment,
        name: &dyn Fn(Uuid) -> Option<String>,
    ) -> Bytes {
        let version = self
            .protocols
            .first()
            .map(|(_, md)| cp::version(md))
            .unwrap_or(0);
        let named: Vec<(String, Vec<i32>)> = assignment
            .iter()
            .filter_map(|(t, ps)| Some((name(*t)?, ps.iter().copied().collect())))
            .collect();
        cp::encode_assignment(
            version,
            named.iter().map(|(t, ps)| (t.as_str(), ps.clone())),
        )
    }
}

/// A classic member's generation is its member epoch.
pub(super) fn check_generation(m: &ConsumerMember, generation: i32) -> Result<(), GroupError> {
    if generation != m.member_epoch {
        return Err(GroupError::IllegalGeneration(format!(
            "The request generation id {generation} is not equal to the member epoch {} of member {}.",
            m.member_epoch, m.member_id
        )));
    }
    Ok(())
}

/// Topic names to ids; topics that do not exist (deleted meanwhile) and partitions they do
/// not have are left out.
fn by_id(named: &BTreeMap<String, Vec<i32>>, topics: &dyn Topics) -> Assignment {
    let mut out = Assignment::new();
    for (name, ps) in named {
        if let Some((id, count)) = topics.topic(name) {
            let ps: BTreeSet<i32> = ps
                .iter()
                .copied()
                .filter(|p| (0..count).contains(p))
                .collect();
            if !ps.is_empty() {
                out.entry(id).or_default().extend(ps);
            }
        }
    }
    out
}

fn millis(ms: i32) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

#[cfg(test)]
mod tests;
