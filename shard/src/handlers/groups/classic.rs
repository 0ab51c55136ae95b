//! The classic group protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup. Each request is
//! decoded here, runs on the group's owner shard against `groups::classic`, and is encoded for
//! the negotiated version.

use super::kip848::with_env;
use super::*;

/// The classic state of `group`, converting an empty KIP-848 group (e.g. one that only has
/// offsets) into a classic one. A KIP-848 group with members cannot take classic members.
pub(super) fn with_classic<R>(
    group: &Group,
    initial_delay_ms: u64,
    f: impl FnOnce(&mut ClassicGroup) -> R,
) -> Result<R, GroupError> {
    let mut kind = group.kind.borrow_mut();
    if let GroupKind::Consumer(c) = &*kind {
        if !c.is_empty() {
            return Err(GroupError::InconsistentGroupProtocol(format!(
                "Group {} is a consumer group (KIP-848); classic members cannot join it.",
                group.id
            )));
        }
        *kind = GroupKind::Classic(ClassicGroup::new(&group.id, initial_delay_ms));
    }
    match &mut *kind {
        GroupKind::Classic(c) => Ok(f(c)),
        GroupKind::Consumer(_) => unreachable!("converted above"),
    }
}

pub async fn join_group(
    shard: &Rc<Shard>,
    req: JoinGroupRequest,
    version: i16,
    (client_id, client_host): (String, String),
) -> JoinGroupResponse {
    let gid = req.group_id.to_string();
    let result = if gid.is_empty() {
        JoinResult::error(invalid_group_id(), &req.member_id)
    } else {
        let member_id = req.member_id.to_string();
        let lost_member_id = member_id.clone();
        on_group(
            shard,
            &gid.clone(),
            move |e| JoinResult::error(e, &lost_member_id),
            move |s| async move {
                let args = JoinArgs {
                    member_id: req.member_id.to_string(),
                    instance_id: req.group_instance_id.as_ref().map(|i| i.to_string()),
                    client_id,
                    client_host,
                    session_timeout_ms: req.session_timeout_ms,
                    // v0 has no rebalance timeout: Kafka uses the session timeout.
                    rebalance_timeout_ms: if version >= 1 {
                        req.rebalance_timeout_ms
                    } else {
                        req.session_timeout_ms
                    },
                    protocol_type: req.protocol_type.to_string(),
                    protocols: req
                        .protocols
                        .iter()
                        .map(|p| (p.name.to_string(), p.metadata.clone()))
                        .collect(),
                    require_known_member_id: version >= 4,
                    supports_skip_assignment: version >= 9,
                };
                let group = s.groups.get_or_create(&gid);
                let cfg = &s.groups.config;
                let in_consumer_group =
                    matches!(&*group.kind.borrow(), GroupKind::Consumer(c) if !c.is_empty());
                if in_consumer_group {
                    return join_consumer_group(&s, &gid, &group, args);
                }
                let reply = with_classic(&group, cfg.initial_rebalance_delay_ms, |c| {
                    c.join(
                        args,
                        Instant::now(),
                        cfg.min_session_timeout_ms,
                        cfg.max_session_timeout_ms,
                        &GroupManager::new_member_id,
                    )
                });
                match reply {
                    Err(e) => JoinResult::error(e, &member_id),
                    // An answer without a rebalance (a static member replaced by its new
                    // instance) changed the settled generation's members: stored before the
                    // new member id is told, as a SyncGroup's generation is.
                    Ok(Reply::Now(r)) if r.error.is_none() => {
                        match s.groups.store_settled(&group).await {
                            Ok(()) => r,
                            Err(e) => JoinResult::error(e, &member_id),
                        }
                    }
                    Ok(Reply::Now(r)) => r,
                    Ok(Reply::Later(rx)) => rx.await.unwrap_or_else(|_| {
                        JoinResult::error(GroupError::RebalanceInProgress, &member_id)
                    }),
                }
            },
        )
        .await
    };
    join_response(&result, version)
}

/// A classic member joining a KIP-848 group that has members: it becomes a classic member of
/// it, assigned by the coordinator and answered at once (`ConsumerGroup::classic_join`).
fn join_consumer_group(s: &Rc<Shard>, gid: &str, group: &Group, args: JoinArgs) -> JoinResult {
    let member_id = args.member_id.clone();
    let cfg = &s.groups.config;
    with_env(s, gid, |env, _| {
        let mut kind = group.kind.borrow_mut();
        match &mut *kind {
            GroupKind::Consumer(c) => c.classic_join(
                args,
                env,
                cfg.min_session_timeout_ms,
                cfg.max_session_timeout_ms,
            ),
            GroupKind::Classic(_) => unreachable!("checked by the caller, on this thread"),
        }
    })
    .unwrap_or_else(|e| JoinResult::error(e, &member_id))
}

pub(super) fn join_response(result: &JoinResult, version: i16) -> JoinGroupResponse {
    let mut resp = JoinGroupResponse::default()
        .with_error_code(code(&result.error))
        .with_generation_id(result.generation)
        .with_leader(s(&result.leader))
        .with_member_id(s(&result.member_id))
        .with_members(
            result
                .members
                .iter()
                .map(|m| {
                    let mut jm = JoinGroupResponseMember::default()
                        .with_member_id(s(&m.member_id))
                        .with_metadata(m.metadata.clone());
                    if version >= 5 {
                        jm.group_instance_id = m.instance_id.as_deref().map(s);
                    }
                    jm
                })
                .collect(),
        );
    // Before v7 the protocol name is a non-null string.
    resp.protocol_name = match (&result.protocol_name, version >= 7) {
        (Some(n), _) => Some(s(n)),
        (None, true) => None,
        (None, false) => Some(s("")),
    };
    if version >= 7 {
        resp.protocol_type = result.protocol_type.as_deref().map(s);
    }
    if version >= 9 {
        resp.skip_assignment = result.skip_assignment;
    }
    resp
}

pub async fn sync_group(
    shard: &Rc<Shard>,
    req: SyncGroupRequest,
    version: i16,
) -> SyncGroupResponse {
    let gid = req.group_id.to_string();
    let result = if gid.is_empty() {
        SyncResult {
            error: Some(invalid_group_id()),
            ..SyncResult::default()
        }
    } else {
        let lost = |e| SyncResult {
            error: Some(e),
            ..SyncResult::default()
        };
        on_group(shard, &gid.clone(), lost, move |s| async move {
            let Some(group) = s.groups.get(&gid) else {
                return SyncResult {
                    error: Some(GroupError::UnknownMemberId(format!(
                        "Group {gid} is unknown."
                    ))),
                    ..SyncResult::default()
                };
            };
            let member_id = req.member_id.to_string();
            let instance = req.group_instance_id.as_ref().map(|i| i.to_string());
            let assignments: Vec<(String, Bytes)> = req
                .assignments
                .iter()
                .map(|a| (a.member_id.to_string(), a.assignment.clone()))
                .collect();
            let member = MemberRef {
                member_id: &member_id,
                instance_id: instance.as_deref(),
                generation: req.generation_id,
            };
            let (protocol_type, protocol_name) =
                (req.protocol_type.as_deref(), req.protocol_name.as_deref());
            let reply = {
                let mut kind = group.kind.borrow_mut();
                match &mut *kind {
                    GroupKind::Classic(c) => c.sync(
                        member,
                        protocol_type,
                        protocol_name,
                        assignments,
                        Instant::now(),
                    ),
                    GroupKind::Consumer(c) => Reply::Now(sync_in_consumer_group(
                        &s,
                        c,
                        &member,
                        protocol_type,
                        protocol_name,
                    )),
                }
            };
            let result = match reply {
                Reply::Now(r) => r,
                Reply::Later(rx) => rx.await.unwrap_or(SyncResult {
                    error: Some(GroupError::RebalanceInProgress),
                    ..SyncResult::default()
                }),
            };
            if result.error.is_some() {
                return result;
            }
            // No member learns a generation a restarted coordinator would not load: its
            // assignment is answered only once the generation is in the group's log.
            match s.groups.store_settled(&group).await {
                Ok(()) => result,
                Err(e) => SyncResult {
                    error: Some(e),
                    ..SyncResult::default()
                },
            }
        })
        .await
    };
    sync_response(result, version)
}

/// SyncGroup from a classic member of a KIP-848 group: its assignment as reconciliation left
/// it (`ConsumerGroup::classic_sync`), with the protocol type and name it sent, as Kafka
/// answers.
fn sync_in_consumer_group(
    s: &Shard,
    c: &mut ConsumerGroup,
    r: &MemberRef<'_>,
    protocol_type: Option<&str>,
    protocol_name: Option<&str>,
) -> SyncResult {
    let catalog = s.catalog.snapshot();
    let name = |id| catalog.by_id(id).map(|t| t.name.clone());
    match c.classic_sync(r, protocol_type, protocol_name, &name, Instant::now()) {
        Ok(assignment) => SyncResult {
            error: None,
            protocol_type: protocol_type.map(str::to_string),
            protocol_name: protocol_name.map(str::to_string),
            assignment,
        },
        Err(e) => SyncResult {
            error: Some(e),
            ..SyncResult::default()
        },
    }
}

pub(super) fn sync_response(result: SyncResult, version: i16) -> SyncGroupResponse {
    let mut resp = SyncGroupResponse::default()
        .with_error_code(code(&result.error))
        .with_assignment(result.assignment);
    if version >= 5 {
        resp.protocol_type = result.protocol_type.as_deref().map(s);
        resp.protocol_name = result.protocol_name.as_deref().map(s);
    }
    resp
}

pub async fn heartbeat(shard: &Rc<Shard>, req: HeartbeatRequest) -> HeartbeatResponse {
    let gid = req.group_id.to_string();
    let result: Result<(), GroupError> = if gid.is_empty() {
        Err(invalid_group_id())
    } else {
        on_group(shard, &gid.clone(), Err, move |s| async move {
            let Some(group) = s.groups.get(&gid) else {
                return Err(GroupError::UnknownMemberId(format!(
                    "Group {gid} is unknown."
                )));
            };
            let member_id = req.member_id.to_string();
            let instance = req.group_instance_id.as_ref().map(|i| i.to_string());
            let member = MemberRef {
                member_id: &member_id,
                instance_id: instance.as_deref(),
                generation: req.generation_id,
            };
            let mut kind = group.kind.borrow_mut();
            match &mut *kind {
                GroupKind::Classic(c) => c.heartbeat(member, Instant::now()),
                GroupKind::Consumer(c) => c.classic_heartbeat(&member, Instant::now()),
            }
        })
        .await
    };
    HeartbeatResponse::default().with_error_code(code(&result.err()))
}

pub async fn leave_group(
    shard: &Rc<Shard>,
    req: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let gid = req.group_id.to_string();
    // (member id, instance id) of every member leaving.
    let leaving: Vec<(String, Option<String>)> = if version >= 3 {
        req.members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|i| i.to_string()),
                )
            })
            .collect()
    } else {
        vec![(req.member_id.to_string(), None)]
    };
    let no_group_id = gid.is_empty();
    let results: Vec<Result<String, GroupError>> = if no_group_id {
        leaving.iter().map(|_| Err(invalid_group_id())).collect()
    } else {
        let n = leaving.len();
        let lost = |e: GroupError| -> Vec<Result<String, GroupError>> {
            (0..n).map(|_| Err(e.clone())).collect()
        };
        let req_leaving = leaving.clone();
        on_group(shard, &gid.clone(), lost, move |s| async move {
            let Some(group) = s.groups.get(&gid) else {
                return req_leaving
                    .iter()
                    .map(|_| {
                        Err(GroupError::UnknownMemberId(format!(
                            "Group {gid} is unknown."
                        )))
                    })
                    .collect();
            };
            let now = Instant::now();
            let results = {
                let mut kind = group.kind.borrow_mut();
                req_leaving
                    .iter()
                    .map(|(m, i)| match &mut *kind {
                        GroupKind::Classic(c) => c.leave(m, i.as_deref(), now),
                        GroupKind::Consumer(c) => c.classic_leave(m, i.as_deref()),
                    })
                    .collect()
            };
            // The last member out empties the group: stored before the answer, so a restart
            // right after does not bring the members back for a session timeout. A failure
            // is logged there; the members did leave.
            let _ = s.groups.store_settled(&group).await;
            results
        })
        .await
    };
    leave_response(&leaving, &results, no_group_id, version)
}

pub(super) fn leave_response(
    leaving: &[(String, Option<String>)],
    results: &[Result<String, GroupError>],
    no_group_id: bool,
    version: i16,
) -> LeaveGroupResponse {
    let mut resp = LeaveGroupResponse::default();
    if version >= 3 {
        resp.members = leaving
            .iter()
            .zip(results)
            .map(|((m, i), r)| {
                MemberResponse::default()
                    .with_member_id(s(m))
                    .with_group_instance_id(i.as_deref().map(s))
                    .with_error_code(r.as_ref().err().map(errors::group).unwrap_or(errors::NONE))
            })
            .collect();
        if no_group_id {
            resp.error_code = errors::group(&invalid_group_id());
        }
    } else {
        resp.error_code = results[0]
            .as_ref()
            .err()
            .map(errors::group)
            .unwrap_or(errors::NONE);
    }
    resp
}
