//! A KIP-848 group's target assignment: the subscribed topics (regexes resolved), their
//! partitions' leader racks, and the assignor's answer, recomputed when any of them changes.

use super::*;

impl ConsumerGroup {
    /// Re-resolves regexes against a new topic table (cheap when the table is unchanged).
    pub(super) fn refresh_regexes(&mut self, topics: &Arc<dyn Topics>) {
        let wanted: BTreeSet<String> = self
            .members
            .values()
            .filter_map(|m| m.subscribed_regex.clone())
            .filter(|r| !r.is_empty())
            .collect();
        self.regexes.retain(|r, _| wanted.contains(r));
        let table_changed = !self
            .resolved_for
            .as_ref()
            .is_some_and(|t| Arc::ptr_eq(t, topics));
        for r in wanted {
            let fresh = !self.regexes.contains_key(&r);
            if fresh {
                let Ok(re) = compile_regex(&r) else { continue };
                self.regexes.insert(r.clone(), (re, BTreeSet::new()));
            }
            if fresh || table_changed {
                let (re, matched) = self.regexes.get_mut(&r).expect("inserted");
                *matched = topics
                    .names()
                    .filter(|t| re.is_match(t))
                    .map(str::to_string)
                    .collect();
            }
        }
        self.resolved_for = Some(topics.clone());
    }

    pub(super) fn compute_subscription_metadata(
        &self,
        topics: &dyn Topics,
    ) -> BTreeMap<String, (Uuid, i32)> {
        let mut out = BTreeMap::new();
        for m in self.members.values() {
            for t in self.member_topics(m) {
                if let Some(meta) = topics.topic(&t) {
                    out.insert(t, meta);
                }
            }
        }
        out
    }

    /// Each subscribed partition's leader rack, when some member has a rack. A partition whose
    /// leader is unknown for the moment (in handover) keeps the rack it had: a move then changes
    /// the map once, when the new leader is known, rather than twice.
    pub(super) fn compute_partition_racks(
        &self,
        env: &HeartbeatEnv<'_>,
    ) -> BTreeMap<String, Vec<Option<String>>> {
        if !self.members.values().any(|m| m.rack_id.is_some()) {
            return BTreeMap::new();
        }
        self.subscription_metadata
            .iter()
            .map(|(t, (_, count))| {
                let before = self.partition_racks.get(t);
                let racks = (0..*count)
                    .map(|p| {
                        (env.leader_rack)(t, p)
                            .or_else(|| before.and_then(|b| b.get(p as usize).cloned().flatten()))
                    })
                    .collect();
                (t.clone(), racks)
            })
            .collect()
    }

    /// The assignor most members ask for; the default when none asks.
    pub(super) fn preferred_assignor(&self, default: &str) -> String {
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = &m.server_assignor {
                *votes.entry(a.as_str()).or_default() += 1;
            }
        }
        let best = votes.values().copied().max();
        match best {
            Some(b) => votes
                .into_iter()
                .find(|(_, v)| *v == b)
                .map(|(k, _)| k.to_string())
                .unwrap_or_else(|| default.to_string()),
            None => default.to_string(),
        }
    }

    #[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
    pub(super) fn compute_target(&mut self, env: &HeartbeatEnv<'_>) {
        let names: HashMap<Uuid, &str> = self
            .subscription_metadata
            .iter()
            .map(|(n, (id, _))| (*id, n.as_str()))
            .collect();
        let topics: BTreeMap<String, TopicSpec> = self
            .subscription_metadata
            .iter()
            .map(|(n, (_, p))| {
                (
                    n.clone(),
                    TopicSpec {
                        name: n.clone(),
                        partitions: *p,
                        partition_racks: self
                            .partition_racks
                            .get(n)
                            .map(|racks| {
                                racks.iter().map(|r| r.iter().cloned().collect()).collect()
                            })
                            .unwrap_or_default(),
                    },
                )
            })
            .collect();
        let specs: Vec<MemberSpec> = self
            .members
            .values()
            .map(|m| MemberSpec {
                member_id: m.member_id.clone(),
                rack: m.rack_id.clone(),
                subscribed_topics: self
                    .member_topics(m)
                    .into_iter()
                    .filter(|t| topics.contains_key(t))
                    .collect(),
                current: self
                    .target
                    .get(&m.member_id)
                    .map(|a| {
                        a.iter()
                            .filter_map(|(id, ps)| {
                                names.get(id).map(|n| (n.to_string(), ps.clone()))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect();
        let name = self.preferred_assignor(env.default_assignor);
        let result = (env.assign)(&name, &specs, &topics)
            .or_else(|| (env.assign)(env.default_assignor, &specs, &topics))
            .unwrap_or_default();
        let mut target = BTreeMap::new();
        for m in self.members.keys() {
            let mut a = Assignment::new();
            if let Some(per_topic) = result.get(m) {
                for (t, ps) in per_topic {
                    if let Some((id, count)) = self.subscription_metadata.get(t) {
                        let ps: BTreeSet<i32> = ps
                            .iter()
                            .copied()
                            .filter(|p| (0..*count).contains(p))
                            .collect();
                        if !ps.is_empty() {
                            a.insert(*id, ps);
                        }
                    }
                }
            }
            target.insert(m.clone(), a);
        }
        // A target gives each partition to one member at most (the assignors' contract).
        debug_assert!(
            {
                let mut seen = BTreeSet::new();
                target
                    .values()
                    .flat_map(|a| {
                        a.iter()
                            .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
                    })
                    .all(|tp| seen.insert(tp))
            },
            "a partition is in two members' targets"
        );
        self.target = target;
        self.assignment_epoch = self.group_epoch;
        self.assignor_name = name;
    }
}
