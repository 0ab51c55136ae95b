//! JoinGroup for a classic group: new, known and static members, and the join phase of a
//! rebalance (who is waited for, when it completes, what each member is told).

use super::*;

impl ClassicGroup {
    /// JoinGroup. `new_member_id` draws the UUID of a member that joins without an id (the
    /// caller's randomness: the shard's `GroupManager::new_member_id`); it is called only then.
    pub fn join(
        &mut self,
        args: JoinArgs,
        now: Instant,
        min_session_ms: i32,
        max_session_ms: i32,
        new_member_id: &dyn Fn() -> Uuid,
    ) -> Reply<JoinResult> {
        if let Err(e) =
            check_session_timeout(args.session_timeout_ms, min_session_ms, max_session_ms)
        {
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
            let member_id = member_id_for(&args.client_id, new_member_id());
            self.join_unknown_member(member_id, args, now)
        } else {
            self.join_known_member(args, now)
        }
    }

    pub(super) fn join_unknown_member(
        &mut self,
        member_id: String,
        args: JoinArgs,
        now: Instant,
    ) -> Reply<JoinResult> {
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

    pub(super) fn join_known_member(&mut self, args: JoinArgs, now: Instant) -> Reply<JoinResult> {
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
    pub(super) fn replace_static_member(
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
        let previous_leader = self.leader.clone();
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
                if args.supports_skip_assignment {
                    // KIP-814: the leader gets the members, to know them, and is told not to
                    // assign.
                    r.skip_assignment = self.leader.as_deref() == Some(new_id.as_str());
                } else {
                    // Below JoinGroup v9 a leader cannot be told to skip its assignment, and
                    // one made now would reach no other member of a stable group. As Kafka
                    // does, the answer names the leader's id from before the rejoin and lists
                    // no members, so the client takes itself for a follower.
                    r.leader = previous_leader.unwrap_or_default();
                    r.members.clear();
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

    pub(super) fn add_member_and_rebalance(
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

    pub(super) fn update_member_awaiting_join(
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

    pub(super) fn prepare_rebalance(&mut self, now: Instant) {
        // Anyone still waiting for a sync answer learns the generation is over, and has a
        // whole session from this answer to rejoin (see `ClassicMember::answer_sync`).
        for m in self.members.values_mut() {
            m.answer_sync(SyncResult::error(GroupError::RebalanceInProgress), now);
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

    pub(super) fn all_joined(&self) -> bool {
        self.pending_members.is_empty() && self.members.values().all(|m| m.awaiting_join())
    }

    pub(super) fn maybe_complete_join(&mut self, now: Instant) {
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

    pub(super) fn complete_join(&mut self, now: Instant) {
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
        let rebalance_timeout_ms = self.group_rebalance_timeout().as_millis() as u64;
        for id in gone {
            self.remove_member(&id);
            self.removed.push((
                id,
                Removal::NotRejoined {
                    rebalance_timeout_ms,
                },
            ));
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

    pub(super) fn join_result_for(&self, member_id: &str) -> JoinResult {
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
}
