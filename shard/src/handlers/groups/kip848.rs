//! The KIP-848 consumer group protocol: ConsumerGroupHeartbeat, ConsumerGroupDescribe.

use super::*;

/// The consumer-protocol state of `group`, for a ConsumerGroupHeartbeat. An empty classic
/// group (e.g. one that only has offsets) becomes a KIP-848 group; a classic group with
/// members is upgraded when `upgrade` is given (a member joining, epoch 0), as Kafka upgrades
/// online: only if the heartbeat succeeds on the upgraded group does it replace the classic
/// one, whose JoinGroups and SyncGroups still waiting are told to rejoin. After `f`, a group
/// whose last consumer-protocol member left goes back to classic ([`downgrade_if_due`]).
pub(super) fn with_consumer<R>(
    s: &Shard,
    group: &Group,
    upgrade: Option<&dyn consumer::Topics>,
    f: impl FnOnce(&mut ConsumerGroup) -> Result<R, GroupError>,
) -> Result<R, GroupError> {
    let mut kind = group.kind.borrow_mut();
    if let GroupKind::Classic(c) = &mut *kind {
        if c.is_empty() && c.state == crate::groups::classic::ClassicState::Empty {
            *kind = GroupKind::Consumer(ConsumerGroup::new(&group.id));
        } else {
            let not_consumer = || {
                GroupError::GroupIdNotFound(format!("Group {} is not a consumer group.", group.id))
            };
            let topics = upgrade.ok_or_else(not_consumer)?;
            let mut upgraded = ConsumerGroup::from_classic(c, topics, Instant::now())?;
            let r = f(&mut upgraded)?;
            let members = c.members.len();
            c.unload(&GroupError::RebalanceInProgress);
            *kind = GroupKind::Consumer(upgraded);
            tracing::info!(group = %group.id, classic_members = members, "a member using the consumer protocol joined a classic group: the group is a consumer group now, its classic members keep their partitions and are assigned by the coordinator (online upgrade)");
            return Ok(r);
        }
    }
    let GroupKind::Consumer(c) = &mut *kind else {
        unreachable!("converted above")
    };
    let r = f(c);
    downgrade_if_due(
        &group.id,
        &mut kind,
        &|id| s.catalog.snapshot().by_id(id).map(|t| t.name.clone()),
        s.groups.config.initial_rebalance_delay_ms,
        Instant::now(),
    );
    r
}

/// Runs `f` with what a KIP-848 group's decisions need from the shard: the topics, the
/// group's settings (the broker's with the group's own configs, Kafka's GROUP resource), the
/// assignors and the partition leaders' racks.
pub(super) fn with_env<R>(
    s: &Rc<Shard>,
    gid: &str,
    f: impl FnOnce(&HeartbeatEnv<'_>, &GroupConfig) -> R,
) -> R {
    let topics: Arc<dyn consumer::Topics> = s.catalog.snapshot();
    let cfg = s
        .groups
        .config
        .for_group(s.catalog.group_configs().get(gid));
    let assign = |name: &str, m: &[_], t: &BTreeMap<_, _>| {
        s.groups.run_assignor(name, cfg.rack_aware_weights, m, t)
    };
    let env = HeartbeatEnv {
        now: Instant::now(),
        topics: &topics,
        new_member_id: &GroupManager::new_member_id,
        session_timeout_ms: cfg.consumer_session_timeout_ms,
        default_assignor: &cfg.default_assignor,
        assign: &assign,
        leader_rack: &|t, p| s.cluster.leader_rack(t, p),
    };
    f(&env, &cfg)
}

pub async fn consumer_group_heartbeat(
    shard: &Rc<Shard>,
    req: ConsumerGroupHeartbeatRequest,
    version: i16,
    (client_id, client_host): (String, String),
) -> ConsumerGroupHeartbeatResponse {
    let gid = req.group_id.to_string();
    let args = HeartbeatArgs {
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.as_ref().map(|x| x.to_string()),
        rack_id: req.rack_id.as_ref().map(|x| x.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: req
            .subscribed_topic_names
            .as_ref()
            .map(|ts| ts.iter().map(|t| t.to_string()).collect()),
        subscribed_topic_regex: req.subscribed_topic_regex.as_ref().map(|x| x.to_string()),
        server_assignor: req.server_assignor.as_ref().map(|x| x.to_string()),
        owned: req.topic_partitions.as_ref().map(|tps| {
            tps.iter()
                .map(|tp| (tp.topic_id, tp.partitions.clone()))
                .collect()
        }),
        client_id,
        client_host,
    };
    let result: Result<(consumer::HeartbeatResult, i32), GroupError> = if gid.is_empty() {
        Err(GroupError::InvalidRequest("GroupId can't be empty.".into()))
    } else {
        on_group(shard, &gid.clone(), Err, move |s| async move {
            consumer::validate(&args, version, |n| s.groups.known_assignor(n))?;
            let group = s.groups.get_or_create(&gid);
            let joining = args.member_epoch == 0;
            with_env(&s, &gid, |env, cfg| {
                let upgrade = joining.then_some(&**env.topics);
                let r = with_consumer(&s, &group, upgrade, |c| c.heartbeat(args, env))?;
                Ok((r, cfg.consumer_heartbeat_interval_ms))
            })
        })
        .await
    };
    consumer_heartbeat_response(result)
}

pub(super) fn consumer_heartbeat_response(
    result: Result<(consumer::HeartbeatResult, i32), GroupError>,
) -> ConsumerGroupHeartbeatResponse {
    match result {
        Ok((r, interval)) => ConsumerGroupHeartbeatResponse::default()
            .with_member_id(Some(s(&r.member_id)))
            .with_member_epoch(r.member_epoch)
            .with_heartbeat_interval_ms(interval)
            .with_assignment(r.assignment.map(|a| {
                cgh::Assignment::default().with_topic_partitions(
                    a.into_iter()
                        .map(|(t, ps)| {
                            cgh::TopicPartitions::default()
                                .with_topic_id(t)
                                .with_partitions(ps)
                        })
                        .collect(),
                )
            })),
        Err(e) => ConsumerGroupHeartbeatResponse::default()
            .with_error_code(errors::group(&e))
            .with_error_message(Some(s(&e.to_string()))),
    }
}

#[derive(Clone)]
pub(super) struct DescribedConsumerGroup {
    pub(super) error: Option<GroupError>,
    pub(super) group: Option<cgd::DescribedGroup>,
}

pub(super) fn describe_consumer_on_owner(
    shard: &Rc<Shard>,
    gid: &str,
    version: i16,
) -> DescribedConsumerGroup {
    let not_found = |msg: String| DescribedConsumerGroup {
        error: Some(GroupError::GroupIdNotFound(msg)),
        group: None,
    };
    let Some(group) = shard.groups.get(gid) else {
        return not_found(format!("Group {gid} not found."));
    };
    let kind = group.kind.borrow();
    let c = match &*kind {
        GroupKind::Consumer(c) => c,
        GroupKind::Classic(_) => return not_found(format!("Group {gid} is not a consumer group.")),
    };
    let snapshot = shard.catalog.snapshot();
    let names: HashMap<Uuid, String> = snapshot
        .topics
        .values()
        .map(|t| (t.id, t.name.clone()))
        .collect();
    DescribedConsumerGroup {
        error: None,
        group: Some(describe_consumer(
            c,
            gid,
            &names,
            &shard.groups.config.default_assignor,
            version,
        )),
    }
}

/// A KIP-848 group as ConsumerGroupDescribe reports it; `names` maps topic ids to names.
pub(super) fn describe_consumer(
    c: &ConsumerGroup,
    gid: &str,
    names: &HashMap<Uuid, String>,
    default_assignor: &str,
    version: i16,
) -> cgd::DescribedGroup {
    let assignment = |a: &consumer::Assignment| {
        cgd::Assignment::default().with_topic_partitions(
            a.iter()
                .map(|(t, ps)| {
                    cgd::TopicPartitions::default()
                        .with_topic_id(*t)
                        .with_topic_name(TopicName(s(names
                            .get(t)
                            .map(String::as_str)
                            .unwrap_or(""))))
                        .with_partitions(ps.iter().copied().collect())
                })
                .collect(),
        )
    };
    let members = c
        .members
        .values()
        .map(|m| {
            let mut dm = cgd::Member::default()
                .with_member_id(s(&m.member_id))
                .with_instance_id(m.instance_id.as_deref().map(s))
                .with_rack_id(m.rack_id.as_deref().map(s))
                .with_member_epoch(m.member_epoch)
                .with_client_id(s(&m.client_id))
                .with_client_host(s(&m.client_host))
                .with_subscribed_topic_names(
                    m.subscribed_names.iter().map(|t| TopicName(s(t))).collect(),
                )
                .with_subscribed_topic_regex(m.subscribed_regex.as_deref().map(s))
                .with_assignment(assignment(&m.assigned))
                .with_target_assignment(assignment(
                    c.target.get(&m.member_id).unwrap_or(&Default::default()),
                ));
            if version >= 1 {
                // 0 = a classic member (JoinGroup, SyncGroup), 1 = the consumer protocol.
                dm.member_type = if m.classic.is_some() { 0 } else { 1 };
            }
            dm
        })
        .collect();
    cgd::DescribedGroup::default()
        .with_group_id(GroupId(s(gid)))
        .with_group_state(s(c.state_name()))
        .with_group_epoch(c.group_epoch)
        .with_assignment_epoch(c.assignment_epoch)
        .with_assignor_name(s(if c.assignor_name.is_empty() {
            default_assignor
        } else {
            &c.assignor_name
        }))
        .with_members(members)
        .with_authorized_operations(authorized::OMITTED)
}

pub async fn consumer_group_describe(
    shard: &Rc<Shard>,
    req: ConsumerGroupDescribeRequest,
    version: i16,
) -> ConsumerGroupDescribeResponse {
    let ids: Vec<String> = req.group_ids.iter().map(|g| g.to_string()).collect();
    let items: Vec<(usize, String)> = ids
        .iter()
        .map(|g| (owner_shard(g, shard.nshards), g.clone()))
        .collect();
    let lost = DescribedConsumerGroup {
        error: Some(unavailable()),
        group: None,
    };
    let answers = per_partition(
        shard,
        items,
        move |s, gid: String| async move {
            if let Err(e) = serve_here(&s, &gid, Access::Read).await {
                return DescribedConsumerGroup {
                    error: Some(e),
                    group: None,
                };
            }
            describe_consumer_on_owner(&s, &gid, version)
        },
        lost,
    )
    .await;
    let groups = ids
        .into_iter()
        .zip(answers)
        .map(|(gid, a)| match (a.group, a.error) {
            (Some(g), _) => g.with_authorized_operations(authorized::operations(
                req.include_authorized_operations,
                authorized::GROUP,
            )),
            (None, e) => {
                let e = e.unwrap_or_else(unavailable);
                cgd::DescribedGroup::default()
                    .with_group_id(GroupId(s(&gid)))
                    .with_error_code(errors::group(&e))
                    .with_error_message(Some(s(&e.to_string())))
            }
        })
        .collect();
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}
