//! Group coordinator APIs: FindCoordinator, the classic group protocol (JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup), offsets (OffsetCommit, OffsetFetch, OffsetDelete), administration
//! (ListGroups, DescribeGroups, DeleteGroups) and KIP-848 (ConsumerGroupHeartbeat,
//! ConsumerGroupDescribe).
//!
//! This module translates between the wire messages and the group state machines in
//! `crate::groups`. Every request for a group runs on the shard that owns the group
//! (`groups::owner_shard`), reached with `mesh::on_shard`; requests naming several groups fan
//! out with `per_partition`. Fields a version does not have are only set when the negotiated
//! version has them (the encoder refuses a non-default value in a field the version lacks).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use kaas_wire::kafka_protocol::messages::consumer_group_describe_response as cgd;
use kaas_wire::kafka_protocol::messages::consumer_group_heartbeat_response as cgh;
use kaas_wire::kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kaas_wire::kafka_protocol::messages::describe_groups_response::{
    DescribedGroup, DescribedGroupMember,
};
use kaas_wire::kafka_protocol::messages::find_coordinator_response::Coordinator;
use kaas_wire::kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kaas_wire::kafka_protocol::messages::leave_group_response::MemberResponse;
use kaas_wire::kafka_protocol::messages::list_groups_response::ListedGroup as WireListedGroup;
use kaas_wire::kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kaas_wire::kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kaas_wire::kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kaas_wire::kafka_protocol::messages::{
    BrokerId, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, DeleteGroupsRequest,
    DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest,
    ListGroupsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest,
    OffsetDeleteResponse, OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest,
    SyncGroupResponse, TopicName,
};
use kaas_wire::kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::per_partition;
use crate::errors;
use crate::groups::classic::{JoinArgs, JoinResult, MemberRef, Reply, SyncResult};
use crate::groups::consumer::{self, ConsumerGroup, HeartbeatArgs, HeartbeatEnv};
use crate::groups::manager::{Group, GroupKind, ListedGroup};
use crate::groups::offsets::{CommittedOffset, OffsetRecord};
use crate::groups::{classic::ClassicGroup, owner_shard, GroupError};
use crate::mesh::on_shard;
use crate::shard::Shard;

use super::authorized;

/// What DescribeGroups reports as a member's host: the connection's peer address is not
/// visible to handlers yet.
const CLIENT_HOST_UNKNOWN: &str = "/unknown";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn unavailable() -> GroupError {
    GroupError::CoordinatorNotAvailable("the coordinator shard is shutting down".into())
}

/// Runs `f` on the shard that owns `group_id`, after that shard has loaded its groups. In
/// cluster mode a group this broker does not coordinate is answered `failed(NotCoordinator)`,
/// so the client looks the coordinator up again; a shard shutting down answers
/// `failed(CoordinatorNotAvailable)`.
async fn on_group<R, F, Fut>(
    shard: &Rc<Shard>,
    group_id: &str,
    failed: impl FnOnce(GroupError) -> R,
    f: F,
) -> R
where
    R: Send + 'static,
    F: FnOnce(Rc<Shard>) -> Fut + Send + 'static,
    Fut: Future<Output = R> + 'static,
{
    if shard.cluster.coordinator(group_id) != Some(shard.cluster.me()) {
        return failed(GroupError::NotCoordinator(format!(
            "broker {} is not the coordinator of group {group_id}",
            shard.cluster.me()
        )));
    }
    let owner = owner_shard(group_id, shard.nshards);
    let gid = group_id.to_string();
    let answer = on_shard(shard, owner, move |s: Rc<Shard>| async move {
        s.groups.ready().await;
        s.groups.claim(&gid).await?;
        Ok(f(s).await)
    })
    .await;
    match answer {
        Some(Ok(r)) => r,
        Some(Err(e)) => failed(e),
        None => failed(unavailable()),
    }
}

fn code(e: &Option<GroupError>) -> i16 {
    e.as_ref().map(errors::group).unwrap_or(errors::NONE)
}

// ---------------------------------------------------------------------------------------------
// FindCoordinator

/// The coordinator of `key` as (node id, host, port). Single-node: the registered broker list
/// is this broker, so the design's rule always answers this broker.
fn coordinator_address(shard: &Shard, key: &str) -> Option<(i32, String, i32)> {
    let id = shard.cluster.coordinator(key)?;
    shard
        .cluster
        .brokers()
        .into_iter()
        .find(|b| b.id == id)
        .map(|b| (b.id, b.host, i32::from(b.port)))
}

/// (node id, host, port), or (error code, message).
type CoordinatorAnswer = Result<(i32, String, i32), (i16, String)>;

/// Why a transactional producer cannot start (see `find_coordinator`).
pub const TRANSACTIONS_UNSUPPORTED: &str = "kaas does not serve transactions yet: use an idempotent producer (enable.idempotence=true, no transactional.id)";

pub fn find_coordinator(
    shard: &Shard,
    req: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let keys: Vec<String> = if version >= 4 {
        req.coordinator_keys.iter().map(|k| k.to_string()).collect()
    } else {
        vec![req.key.to_string()]
    };
    // 0 = group, 1 = transaction, 2 = share group.
    let answers: Vec<(String, CoordinatorAnswer)> = keys
        .into_iter()
        .map(|k| {
            let r = if req.key_type == 1 {
                // Transactions are not served. Clients treat this code as fatal at once
                // (librdkafka, Java, franz-go), with this message, instead of retrying
                // InitProducerId until their timeout.
                Err((
                    errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    TRANSACTIONS_UNSUPPORTED.to_string(),
                ))
            } else if req.key_type != 0 {
                Err((
                    errors::INVALID_REQUEST,
                    format!("Invalid coordinator type {}", req.key_type),
                ))
            } else {
                coordinator_address(shard, &k).ok_or((
                    errors::COORDINATOR_NOT_AVAILABLE,
                    "no broker is alive to coordinate".to_string(),
                ))
            };
            (k, r)
        })
        .collect();
    find_coordinator_response(answers, version)
}

/// The FindCoordinator answer: batched (v4+) or the single-key fields (v0-3).
fn find_coordinator_response(
    answers: Vec<(String, CoordinatorAnswer)>,
    version: i16,
) -> FindCoordinatorResponse {
    let mut resp = FindCoordinatorResponse::default();
    if version >= 4 {
        resp.coordinators = answers
            .into_iter()
            .map(|(k, r)| {
                let c = Coordinator::default().with_key(s(&k));
                match r {
                    Ok((id, host, port)) => c
                        .with_node_id(BrokerId(id))
                        .with_host(s(&host))
                        .with_port(port)
                        .with_error_message(None),
                    Err((code, msg)) => c
                        .with_node_id(BrokerId(-1))
                        .with_host(s(""))
                        .with_port(-1)
                        .with_error_code(code)
                        .with_error_message(Some(s(&msg))),
                }
            })
            .collect();
    } else {
        let (_, r) = answers.into_iter().next().expect("one key");
        match r {
            Ok((id, host, port)) => {
                resp.node_id = BrokerId(id);
                resp.host = s(&host);
                resp.port = port;
                resp.error_message = None;
            }
            Err((code, msg)) => {
                resp.error_code = code;
                resp.node_id = BrokerId(-1);
                resp.port = -1;
                resp.error_message = (version >= 1).then(|| s(&msg));
            }
        }
        if version == 0 {
            resp.error_message = Some(s(""));
        }
    }
    resp
}

// ---------------------------------------------------------------------------------------------
// JoinGroup / SyncGroup / Heartbeat / LeaveGroup

fn invalid_group_id() -> GroupError {
    GroupError::InvalidGroupId("The group id must not be empty.".into())
}

/// The classic state of `group`, converting an empty KIP-848 group (e.g. one that only has
/// offsets) into a classic one. A KIP-848 group with members cannot take classic members.
fn with_classic<R>(
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
    client_id: String,
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
                    client_host: CLIENT_HOST_UNKNOWN.to_string(),
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
                let reply = with_classic(&group, cfg.initial_rebalance_delay_ms, |c| {
                    c.join(
                        args,
                        Instant::now(),
                        cfg.min_session_timeout_ms,
                        cfg.max_session_timeout_ms,
                    )
                });
                match reply {
                    Err(e) => JoinResult::error(e, &member_id),
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

fn join_response(result: &JoinResult, version: i16) -> JoinGroupResponse {
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
            let reply = {
                let mut kind = group.kind.borrow_mut();
                match &mut *kind {
                    GroupKind::Classic(c) => c.sync(
                        MemberRef {
                            member_id: &member_id,
                            instance_id: instance.as_deref(),
                            generation: req.generation_id,
                        },
                        req.protocol_type.as_deref(),
                        req.protocol_name.as_deref(),
                        assignments,
                        Instant::now(),
                    ),
                    GroupKind::Consumer(_) => Reply::Now(SyncResult {
                        error: Some(GroupError::UnknownMemberId(
                            "the group uses the consumer protocol".into(),
                        )),
                        ..SyncResult::default()
                    }),
                }
            };
            match reply {
                Reply::Now(r) => r,
                Reply::Later(rx) => rx.await.unwrap_or(SyncResult {
                    error: Some(GroupError::RebalanceInProgress),
                    ..SyncResult::default()
                }),
            }
        })
        .await
    };
    sync_response(result, version)
}

fn sync_response(result: SyncResult, version: i16) -> SyncGroupResponse {
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
            let mut kind = group.kind.borrow_mut();
            match &mut *kind {
                GroupKind::Classic(c) => c.heartbeat(
                    MemberRef {
                        member_id: &member_id,
                        instance_id: instance.as_deref(),
                        generation: req.generation_id,
                    },
                    Instant::now(),
                ),
                GroupKind::Consumer(_) => Err(GroupError::UnknownMemberId(
                    "the group uses the consumer protocol".into(),
                )),
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
            let mut kind = group.kind.borrow_mut();
            req_leaving
                .iter()
                .map(|(m, i)| match &mut *kind {
                    GroupKind::Classic(c) => c.leave(m, i.as_deref(), now),
                    GroupKind::Consumer(_) => Err(GroupError::UnknownMemberId(
                        "the group uses the consumer protocol".into(),
                    )),
                })
                .collect()
        })
        .await
    };
    leave_response(&leaving, &results, no_group_id, version)
}

fn leave_response(
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

// ---------------------------------------------------------------------------------------------
// OffsetCommit / OffsetFetch / OffsetDelete

pub async fn offset_commit(
    shard: &Rc<Shard>,
    req: OffsetCommitRequest,
    version: i16,
) -> OffsetCommitResponse {
    let gid = req.group_id.to_string();
    // Per (topic index, partition index): the answer.
    let shape: Vec<(String, Vec<i32>)> = req
        .topics
        .iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        })
        .collect();
    // One error for every partition of the request.
    let all = |e: GroupError| -> Vec<Vec<i16>> {
        shape
            .iter()
            .map(|(_, ps)| vec![errors::group(&e); ps.len()])
            .collect()
    };
    let codes: Vec<Vec<i16>> = if gid.is_empty() {
        all(invalid_group_id())
    } else {
        let lost = all;
        on_group(shard, &gid.clone(), lost, move |s| async move {
            commit_on_owner(&s, &gid, req, version).await
        })
        .await
    };
    let topics = shape
        .into_iter()
        .zip(codes)
        .map(|((name, parts), codes)| {
            OffsetCommitResponseTopic::default()
                .with_name(TopicName(s(&name)))
                .with_partitions(
                    parts
                        .into_iter()
                        .zip(codes)
                        .map(|(p, c)| {
                            OffsetCommitResponsePartition::default()
                                .with_partition_index(p)
                                .with_error_code(c)
                        })
                        .collect(),
                )
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

/// Runs on the group's shard: validates the committer, then makes the offsets durable.
async fn commit_on_owner(
    s: &Rc<Shard>,
    gid: &str,
    req: OffsetCommitRequest,
    version: i16,
) -> Vec<Vec<i16>> {
    let group = s.groups.get_or_create(gid);
    let member_id = req.member_id.to_string();
    let instance = req.group_instance_id.as_ref().map(|i| i.to_string());
    let generation = req.generation_id_or_member_epoch;
    let validated = match &*group.kind.borrow() {
        GroupKind::Classic(c) => c.validate_commit(MemberRef {
            member_id: &member_id,
            instance_id: instance.as_deref(),
            generation,
        }),
        GroupKind::Consumer(c) => {
            let topics = s.catalog.snapshot();
            let partitions: Vec<(Option<Uuid>, i32)> = req
                .topics
                .iter()
                .flat_map(|t| {
                    let id = topics.get(t.name.as_str()).map(|m| m.id);
                    t.partitions.iter().map(move |p| (id, p.partition_index))
                })
                .collect();
            c.validate_commit(&member_id, generation, version, &partitions)
        }
    };
    if let Err(e) = validated {
        let c = errors::group(&e);
        return req
            .topics
            .iter()
            .map(|t| vec![c; t.partitions.len()])
            .collect();
    }
    let max_meta = s.groups.config.offset_metadata_max_bytes;
    let now = crate::groups::offsets::now_ms();
    let mut records = Vec::new();
    let mut codes: Vec<Vec<i16>> = Vec::with_capacity(req.topics.len());
    let mut written: Vec<(usize, usize)> = Vec::new();
    let catalog = s.catalog.snapshot();
    for (ti, t) in req.topics.iter().enumerate() {
        let mut tc = Vec::with_capacity(t.partitions.len());
        let partitions = catalog.get(t.name.as_str()).map_or(0, |m| m.partitions);
        for (pi, p) in t.partitions.iter().enumerate() {
            // As Kafka: offsets are kept only for partitions that exist (a commit for a topic
            // nobody created would otherwise linger as an offset no consumer can use).
            if !(0..partitions).contains(&p.partition_index) {
                tc.push(errors::UNKNOWN_TOPIC_OR_PARTITION);
                continue;
            }
            let metadata = p
                .committed_metadata
                .as_ref()
                .map(|m| m.to_string())
                .unwrap_or_default();
            if metadata.len() > max_meta {
                tc.push(errors::group(&GroupError::OffsetMetadataTooLarge {
                    len: metadata.len(),
                    max: max_meta,
                }));
                continue;
            }
            tc.push(errors::NONE);
            written.push((ti, pi));
            records.push(OffsetRecord::Commit {
                topic: t.name.to_string(),
                partition: p.partition_index,
                value: CommittedOffset {
                    offset: p.committed_offset,
                    leader_epoch: p.committed_leader_epoch,
                    metadata,
                    commit_timestamp_ms: now,
                },
            });
        }
        codes.push(tc);
    }
    if let Err(e) = s.groups.write_offsets(&group, records).await {
        let c = errors::group(&e);
        for (ti, pi) in written {
            codes[ti][pi] = c;
        }
    }
    codes
}

/// One group's part of an OffsetFetch, normalised across versions.
#[derive(Clone)]
struct FetchGroup {
    group_id: String,
    member: Option<(String, i32)>,
    /// None = every committed offset of the group.
    topics: Option<Vec<(String, Vec<i32>)>>,
}

/// One group's answer: group error, then per topic per partition
/// (partition, offset, leader epoch, metadata, error).
type FetchedPartition = (i32, i64, i32, String, i16);
#[derive(Clone)]
struct FetchedGroup {
    error: i16,
    topics: Vec<(String, Vec<FetchedPartition>)>,
}

pub async fn offset_fetch(
    shard: &Rc<Shard>,
    req: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let wanted: Vec<FetchGroup> = if version >= 8 {
        req.groups
            .iter()
            .map(|g| FetchGroup {
                group_id: g.group_id.to_string(),
                member: g
                    .member_id
                    .as_ref()
                    .map(|m| (m.to_string(), g.member_epoch)),
                topics: g.topics.as_ref().map(|ts| {
                    ts.iter()
                        .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                        .collect()
                }),
            })
            .collect()
    } else {
        vec![FetchGroup {
            group_id: req.group_id.to_string(),
            member: None,
            topics: req.topics.as_ref().map(|ts| {
                ts.iter()
                    .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                    .collect()
            }),
        }]
    };
    let items: Vec<(usize, FetchGroup)> = wanted
        .iter()
        .map(|g| (owner_shard(&g.group_id, shard.nshards), g.clone()))
        .collect();
    let lost = FetchedGroup {
        error: errors::COORDINATOR_NOT_AVAILABLE,
        topics: Vec::new(),
    };
    let answers = per_partition(
        shard,
        items,
        |s, g| async move {
            s.groups.ready().await;
            fetch_on_owner(&s, g)
        },
        lost,
    )
    .await;
    offset_fetch_response(&wanted, answers, version)
}

fn offset_fetch_response(
    wanted: &[FetchGroup],
    answers: Vec<FetchedGroup>,
    version: i16,
) -> OffsetFetchResponse {
    let mut resp = OffsetFetchResponse::default();
    if version >= 8 {
        resp.groups = wanted
            .iter()
            .zip(answers)
            .map(|(w, a)| {
                OffsetFetchResponseGroup::default()
                    .with_group_id(GroupId(s(&w.group_id)))
                    .with_error_code(a.error)
                    .with_topics(
                        a.topics
                            .into_iter()
                            .map(|(t, ps)| {
                                OffsetFetchResponseTopics::default()
                                    .with_name(TopicName(s(&t)))
                                    .with_partitions(
                                        ps.into_iter()
                                            .map(|(p, o, e, m, c)| {
                                                OffsetFetchResponsePartitions::default()
                                                    .with_partition_index(p)
                                                    .with_committed_offset(o)
                                                    .with_committed_leader_epoch(e)
                                                    .with_metadata(Some(s(&m)))
                                                    .with_error_code(c)
                                            })
                                            .collect(),
                                    )
                            })
                            .collect(),
                    )
            })
            .collect();
    } else {
        let a = answers.into_iter().next().expect("one group");
        if version >= 2 {
            resp.error_code = a.error;
        }
        resp.topics = a
            .topics
            .into_iter()
            .map(|(t, ps)| {
                OffsetFetchResponseTopic::default()
                    .with_name(TopicName(s(&t)))
                    .with_partitions(
                        ps.into_iter()
                            .map(|(p, o, e, m, c)| {
                                // v1 has no top-level error: a group error goes on each partition.
                                let c = if version < 2 && c == errors::NONE {
                                    a.error
                                } else {
                                    c
                                };
                                OffsetFetchResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(o)
                                    .with_committed_leader_epoch(if version >= 5 { e } else { -1 })
                                    .with_metadata(Some(s(&m)))
                                    .with_error_code(c)
                            })
                            .collect(),
                    )
            })
            .collect();
    }
    resp
}

fn fetch_on_owner(s: &Rc<Shard>, want: FetchGroup) -> FetchedGroup {
    if want.group_id.is_empty() {
        return FetchedGroup {
            error: errors::group(&invalid_group_id()),
            topics: Vec::new(),
        };
    }
    let group = s.groups.get(&want.group_id);
    if let (Some(g), Some((member_id, epoch))) = (&group, &want.member) {
        if let GroupKind::Consumer(c) = &*g.kind.borrow() {
            if let Err(e) = c.validate_fetch(member_id, *epoch) {
                return FetchedGroup {
                    error: errors::group(&e),
                    topics: Vec::new(),
                };
            }
        }
    }
    let empty = Default::default();
    let table_ref = group.as_ref().map(|g| g.offsets.borrow());
    let table = table_ref.as_deref().unwrap_or(&empty);
    let topics = match want.topics {
        None => table
            .iter()
            .map(|(t, ps)| {
                (
                    t.clone(),
                    ps.iter()
                        .map(|(p, v)| {
                            (
                                *p,
                                v.offset,
                                v.leader_epoch,
                                v.metadata.clone(),
                                errors::NONE,
                            )
                        })
                        .collect(),
                )
            })
            .collect(),
        Some(ts) => ts
            .into_iter()
            .map(|(t, ps)| {
                let committed = table.get(&t);
                let parts = ps
                    .into_iter()
                    .map(|p| match committed.and_then(|c| c.get(&p)) {
                        Some(v) => (
                            p,
                            v.offset,
                            v.leader_epoch,
                            v.metadata.clone(),
                            errors::NONE,
                        ),
                        None => (p, -1, -1, String::new(), errors::NONE),
                    })
                    .collect();
                (t, parts)
            })
            .collect(),
    };
    FetchedGroup {
        error: errors::NONE,
        topics,
    }
}

pub async fn offset_delete(shard: &Rc<Shard>, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let gid = req.group_id.to_string();
    let shape: Vec<(String, Vec<i32>)> = req
        .topics
        .iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        })
        .collect();
    let (top, codes): (i16, Vec<Vec<i16>>) = if gid.is_empty() {
        (errors::group(&invalid_group_id()), Vec::new())
    } else {
        let shape2 = shape.clone();
        on_group(
            shard,
            &gid.clone(),
            |e| (errors::group(&e), Vec::new()),
            move |s| async move {
                let Some(group) = s.groups.get(&gid) else {
                    return (
                        errors::group(&GroupError::GroupIdNotFound(format!(
                            "Group {gid} does not exist."
                        ))),
                        Vec::new(),
                    );
                };
                // Topics an active group subscribes to keep their offsets.
                let subscribed: HashSet<String> = match &*group.kind.borrow() {
                    GroupKind::Classic(c) => c.subscribed_topics().unwrap_or_default(),
                    GroupKind::Consumer(c) => c.subscribed_topics().into_iter().collect(),
                };
                let mut records = Vec::new();
                let mut codes = Vec::new();
                {
                    let table = group.offsets.borrow();
                    for (t, ps) in &shape2 {
                        let sub = subscribed.contains(t);
                        codes.push(
                            ps.iter()
                                .map(|p| {
                                    if sub {
                                        return errors::group(&GroupError::GroupSubscribedToTopic);
                                    }
                                    if table.get(t).is_some_and(|x| x.contains_key(p)) {
                                        records.push(OffsetRecord::Delete {
                                            topic: t.clone(),
                                            partition: *p,
                                        });
                                    }
                                    errors::NONE
                                })
                                .collect(),
                        );
                    }
                }
                match s.groups.write_offsets(&group, records).await {
                    Ok(()) => (errors::NONE, codes),
                    Err(e) => (errors::group(&e), Vec::new()),
                }
            },
        )
        .await
    };
    let topics = if codes.is_empty() {
        Vec::new()
    } else {
        shape
            .into_iter()
            .zip(codes)
            .map(|((t, ps), cs)| {
                OffsetDeleteResponseTopic::default()
                    .with_name(TopicName(s(&t)))
                    .with_partitions(
                        ps.into_iter()
                            .zip(cs)
                            .map(|(p, c)| {
                                OffsetDeleteResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_error_code(c)
                            })
                            .collect(),
                    )
            })
            .collect()
    };
    OffsetDeleteResponse::default()
        .with_error_code(top)
        .with_topics(topics)
}

// ---------------------------------------------------------------------------------------------
// ListGroups / DescribeGroups / DeleteGroups

pub async fn list_groups(
    shard: &Rc<Shard>,
    req: ListGroupsRequest,
    version: i16,
) -> ListGroupsResponse {
    let items: Vec<(usize, ())> = (0..shard.nshards).map(|i| (i, ())).collect();
    let per_shard: Vec<Option<Vec<ListedGroup>>> = per_partition(
        shard,
        items,
        |s, ()| async move {
            s.groups.ready().await;
            Some(s.groups.list())
        },
        None,
    )
    .await;
    let error = if per_shard.iter().any(|x| x.is_none()) {
        errors::COORDINATOR_NOT_AVAILABLE
    } else {
        errors::NONE
    };
    let states: Vec<String> = req.states_filter.iter().map(|x| x.to_lowercase()).collect();
    let types: Vec<String> = req.types_filter.iter().map(|x| x.to_lowercase()).collect();
    let groups = per_shard
        .into_iter()
        .flatten()
        .flatten()
        .filter(|g| states.is_empty() || states.contains(&g.state.to_lowercase()))
        .filter(|g| types.is_empty() || types.contains(&g.group_type.to_string()))
        .map(|g| listed_group(&g, version))
        .collect();
    ListGroupsResponse::default()
        .with_error_code(error)
        .with_groups(groups)
}

fn listed_group(g: &ListedGroup, version: i16) -> WireListedGroup {
    let mut lg = WireListedGroup::default()
        .with_group_id(GroupId(s(&g.group_id)))
        .with_protocol_type(s(&g.protocol_type));
    if version >= 4 {
        lg.group_state = s(g.state);
    }
    if version >= 5 {
        lg.group_type = s(g.group_type);
    }
    lg
}

#[derive(Clone)]
struct DescribedClassic {
    error: Option<GroupError>,
    state: String,
    protocol_type: String,
    protocol_data: String,
    /// (member id, instance id, client id, host, metadata, assignment)
    members: Vec<(String, Option<String>, String, String, Bytes, Bytes)>,
}

fn describe_classic_on_owner(s: &Rc<Shard>, gid: &str) -> DescribedClassic {
    let not_found = |msg: String| DescribedClassic {
        error: Some(GroupError::GroupIdNotFound(msg)),
        state: "Dead".into(),
        protocol_type: String::new(),
        protocol_data: String::new(),
        members: Vec::new(),
    };
    let Some(group) = s.groups.get(gid) else {
        return not_found(format!("Group {gid} not found."));
    };
    let kind = group.kind.borrow();
    let c = match &*kind {
        GroupKind::Classic(c) => c,
        GroupKind::Consumer(_) => return not_found(format!("Group {gid} is not a classic group.")),
    };
    let stable = c.state == crate::groups::classic::ClassicState::Stable;
    let protocol = c.protocol_name.clone().unwrap_or_default();
    DescribedClassic {
        error: None,
        state: c.state.name().to_string(),
        protocol_type: c.protocol_type.clone().unwrap_or_default(),
        protocol_data: if stable {
            protocol.clone()
        } else {
            String::new()
        },
        members: c
            .members
            .values()
            .map(|m| {
                (
                    m.member_id.clone(),
                    m.instance_id.clone(),
                    m.client_id.clone(),
                    m.client_host.clone(),
                    if stable {
                        m.metadata_for(&protocol)
                    } else {
                        Bytes::new()
                    },
                    if stable {
                        m.assignment.clone()
                    } else {
                        Bytes::new()
                    },
                )
            })
            .collect(),
    }
}

pub async fn describe_groups(
    shard: &Rc<Shard>,
    req: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let ids: Vec<String> = req.groups.iter().map(|g| g.to_string()).collect();
    let items: Vec<(usize, String)> = ids
        .iter()
        .map(|g| (owner_shard(g, shard.nshards), g.clone()))
        .collect();
    let lost = DescribedClassic {
        error: Some(unavailable()),
        state: String::new(),
        protocol_type: String::new(),
        protocol_data: String::new(),
        members: Vec::new(),
    };
    let answers = per_partition(
        shard,
        items,
        |s, gid: String| async move {
            s.groups.ready().await;
            describe_classic_on_owner(&s, &gid)
        },
        lost,
    )
    .await;
    let ops = authorized::operations(
        version >= 3 && req.include_authorized_operations,
        authorized::GROUP,
    );
    let groups = ids
        .into_iter()
        .zip(answers)
        .map(|(gid, a)| {
            let mut g = described_group(&gid, a, version);
            if version >= 3 && g.error_code == errors::NONE {
                g.authorized_operations = ops;
            }
            g
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

fn described_group(gid: &str, a: DescribedClassic, version: i16) -> DescribedGroup {
    let mut g = DescribedGroup::default().with_group_id(GroupId(s(gid)));
    match &a.error {
        // Before v6 an unknown group is described as Dead with no error.
        Some(GroupError::GroupIdNotFound(msg)) => {
            if version >= 6 {
                g.error_code = errors::group(a.error.as_ref().expect("matched"));
                g.error_message = Some(s(msg));
            } else {
                g.group_state = s("Dead");
            }
        }
        Some(e) => {
            g.error_code = errors::group(e);
            if version >= 6 {
                g.error_message = Some(s(&e.to_string()));
            }
        }
        None => {
            g.group_state = s(&a.state);
            g.protocol_type = s(&a.protocol_type);
            g.protocol_data = s(&a.protocol_data);
            g.members = a
                .members
                .iter()
                .map(|(id, inst, client, host, meta, assign)| {
                    let mut m = DescribedGroupMember::default()
                        .with_member_id(s(id))
                        .with_client_id(s(client))
                        .with_client_host(s(host))
                        .with_member_metadata(meta.clone())
                        .with_member_assignment(assign.clone());
                    if version >= 4 {
                        m.group_instance_id = inst.as_deref().map(s);
                    }
                    m
                })
                .collect();
        }
    }
    g
}

pub async fn delete_groups(shard: &Rc<Shard>, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let ids: Vec<String> = req.groups_names.iter().map(|g| g.to_string()).collect();
    let items: Vec<(usize, String)> = ids
        .iter()
        .map(|g| (owner_shard(g, shard.nshards), g.clone()))
        .collect();
    let answers = per_partition(
        shard,
        items,
        |s, gid: String| async move {
            if gid.is_empty() {
                return errors::group(&invalid_group_id());
            }
            s.groups.ready().await;
            match s.groups.delete_group(&gid).await {
                Ok(()) => errors::NONE,
                Err(e) => errors::group(&e),
            }
        },
        errors::COORDINATOR_NOT_AVAILABLE,
    )
    .await;
    DeleteGroupsResponse::default().with_results(
        ids.into_iter()
            .zip(answers)
            .map(|(g, c)| {
                DeletableGroupResult::default()
                    .with_group_id(GroupId(s(&g)))
                    .with_error_code(c)
            })
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------------
// KIP-848: ConsumerGroupHeartbeat / ConsumerGroupDescribe

/// The consumer-protocol state of `group`, converting an empty classic group (e.g. one that
/// only has offsets) into a KIP-848 group.
fn with_consumer<R>(
    group: &Group,
    f: impl FnOnce(&mut ConsumerGroup) -> Result<R, GroupError>,
) -> Result<R, GroupError> {
    let mut kind = group.kind.borrow_mut();
    if let GroupKind::Classic(c) = &*kind {
        if !(c.is_empty() && c.state == crate::groups::classic::ClassicState::Empty) {
            return Err(GroupError::GroupIdNotFound(format!(
                "Group {} is not a consumer group.",
                group.id
            )));
        }
        *kind = GroupKind::Consumer(ConsumerGroup::new(&group.id));
    }
    match &mut *kind {
        GroupKind::Consumer(c) => f(c),
        GroupKind::Classic(_) => unreachable!("converted above"),
    }
}

pub async fn consumer_group_heartbeat(
    shard: &Rc<Shard>,
    req: ConsumerGroupHeartbeatRequest,
    version: i16,
    client_id: String,
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
        client_host: CLIENT_HOST_UNKNOWN.to_string(),
    };
    let result: Result<(consumer::HeartbeatResult, i32), GroupError> = if gid.is_empty() {
        Err(GroupError::InvalidRequest("GroupId can't be empty.".into()))
    } else {
        on_group(shard, &gid.clone(), Err, move |s| async move {
            consumer::validate(&args, version, |n| s.groups.known_assignor(n))?;
            let group = s.groups.get_or_create(&gid);
            let topics = s.catalog.snapshot();
            // The broker's group settings with this group's configs (Kafka's GROUP resource).
            let cfg = s
                .groups
                .config
                .for_group(s.catalog.group_configs().get(&gid));
            let assign = |name: &str, m: &[_], t: &BTreeMap<_, _>| {
                s.groups.run_assignor(name, cfg.rack_aware_weights, m, t)
            };
            let env = HeartbeatEnv {
                now: Instant::now(),
                topics: &topics,
                session_timeout_ms: cfg.consumer_session_timeout_ms,
                default_assignor: &cfg.default_assignor,
                assign: &assign,
                leader_rack: &|t, p| s.cluster.leader_rack(t, p),
            };
            let r = with_consumer(&group, |c| c.heartbeat(args, &env))?;
            Ok((r, cfg.consumer_heartbeat_interval_ms))
        })
        .await
    };
    consumer_heartbeat_response(result)
}

fn consumer_heartbeat_response(
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
struct DescribedConsumerGroup {
    error: Option<GroupError>,
    group: Option<cgd::DescribedGroup>,
}

fn describe_consumer_on_owner(
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
fn describe_consumer(
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
                // 1 = a member using the consumer protocol.
                dm.member_type = 1;
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
            s.groups.ready().await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::groups::classic::JoinedMember;
    use kaas_wire::kafka_protocol::messages::ApiKey;
    use kaas_wire::kafka_protocol::protocol::{Decodable, Encodable};
    use kaas_wire::versions::supported_range;

    /// Encodes `resp` at every version we serve for `key` and decodes it back: the encoder
    /// refuses a non-default value in a field the version lacks, so this proves every builder
    /// sets version-dependent fields only where they exist.
    fn round_trip<T: Encodable + Decodable>(key: ApiKey, build: impl Fn(i16) -> T) {
        let (lo, hi) = supported_range(key).expect("served");
        for v in lo..=hi {
            let resp = build(v);
            let mut buf = bytes::BytesMut::new();
            resp.encode(&mut buf, v)
                .unwrap_or_else(|e| panic!("{key:?} v{v} does not encode: {e}"));
            let mut bytes = buf.freeze();
            T::decode(&mut bytes, v)
                .unwrap_or_else(|e| panic!("{key:?} v{v} does not decode: {e}"));
            assert!(
                bytes.is_empty(),
                "{key:?} v{v}: {} bytes left over",
                bytes.len()
            );
        }
    }

    // Every group response builder encodes at every version we advertise, with every optional
    // field populated.
    #[test]
    fn responses_encode_at_every_version() {
        round_trip(ApiKey::FindCoordinator, |v| {
            let mut answers = vec![("g".to_string(), Ok((0, "h".to_string(), 9092)))];
            if v >= 4 {
                answers.push(("t".into(), Err((errors::INVALID_REQUEST, "bad".into()))));
            }
            find_coordinator_response(answers, v)
        });
        round_trip(ApiKey::FindCoordinator, |v| {
            find_coordinator_response(vec![("g".into(), Err((15, "none".into())))], v)
        });
        let joined = JoinResult {
            error: None,
            generation: 3,
            protocol_type: Some("consumer".into()),
            protocol_name: Some("range".into()),
            leader: "m1".into(),
            member_id: "m1".into(),
            skip_assignment: true,
            members: vec![JoinedMember {
                member_id: "m1".into(),
                instance_id: Some("i1".into()),
                metadata: Bytes::from_static(b"meta"),
            }],
        };
        round_trip(ApiKey::JoinGroup, |v| join_response(&joined, v));
        let required = JoinResult::error(GroupError::MemberIdRequired, "m2");
        round_trip(ApiKey::JoinGroup, |v| join_response(&required, v));
        round_trip(ApiKey::SyncGroup, |v| {
            sync_response(
                SyncResult {
                    error: None,
                    protocol_type: Some("consumer".into()),
                    protocol_name: Some("range".into()),
                    assignment: Bytes::from_static(b"a"),
                },
                v,
            )
        });
        round_trip(ApiKey::LeaveGroup, |v| {
            leave_response(
                &[("m1".into(), Some("i1".into())), ("m2".into(), None)],
                &[Ok("m1".into()), Err(GroupError::NonEmptyGroup)],
                false,
                v,
            )
        });
        round_trip(ApiKey::OffsetFetch, |v| {
            let wanted: Vec<FetchGroup> = (0..if v >= 8 { 2 } else { 1 })
                .map(|i| FetchGroup {
                    group_id: format!("g{i}"),
                    member: None,
                    topics: None,
                })
                .collect();
            let answers = wanted
                .iter()
                .map(|_| FetchedGroup {
                    error: errors::NONE,
                    topics: vec![(
                        "t".into(),
                        vec![
                            (0, 5, 2, "meta".into(), errors::NONE),
                            (1, -1, -1, String::new(), 0),
                        ],
                    )],
                })
                .collect();
            offset_fetch_response(&wanted, answers, v)
        });
        round_trip(ApiKey::ListGroups, |v| {
            ListGroupsResponse::default().with_groups(vec![listed_group(
                &ListedGroup {
                    group_id: "g".into(),
                    protocol_type: "consumer".into(),
                    state: "Stable",
                    group_type: "classic",
                },
                v,
            )])
        });
        round_trip(ApiKey::DescribeGroups, |v| {
            let stable = DescribedClassic {
                error: None,
                state: "Stable".into(),
                protocol_type: "consumer".into(),
                protocol_data: "range".into(),
                members: vec![(
                    "m1".into(),
                    Some("i1".into()),
                    "c".into(),
                    "/h".into(),
                    Bytes::from_static(b"md"),
                    Bytes::from_static(b"as"),
                )],
            };
            let missing = DescribedClassic {
                error: Some(GroupError::GroupIdNotFound("no".into())),
                state: "Dead".into(),
                protocol_type: String::new(),
                protocol_data: String::new(),
                members: vec![],
            };
            let failed = DescribedClassic {
                error: Some(unavailable()),
                ..missing.clone()
            };
            DescribeGroupsResponse::default().with_groups(vec![
                described_group("a", stable, v),
                described_group("b", missing, v),
                described_group("c", failed, v),
            ])
        });
        round_trip(ApiKey::ConsumerGroupHeartbeat, |_| {
            consumer_heartbeat_response(Ok((
                consumer::HeartbeatResult {
                    member_id: "m".into(),
                    member_epoch: 3,
                    assignment: Some(vec![(Uuid::from_u128(7), vec![0, 1])]),
                },
                5000,
            )))
        });
        round_trip(ApiKey::ConsumerGroupHeartbeat, |_| {
            consumer_heartbeat_response(Err(GroupError::FencedMemberEpoch("x".into())))
        });
        let mut cg = ConsumerGroup::new("g");
        let topics = std::sync::Arc::new(crate::catalog::TopicTable::default());
        let assign = |_: &str, _: &[_], _: &BTreeMap<_, _>| None;
        let env = HeartbeatEnv {
            now: Instant::now(),
            topics: &topics,
            session_timeout_ms: 45_000,
            default_assignor: "uniform",
            assign: &assign,
            leader_rack: &|_, _| None,
        };
        cg.heartbeat(
            HeartbeatArgs {
                member_id: "m".into(),
                instance_id: Some("i".into()),
                rack_id: Some("r".into()),
                rebalance_timeout_ms: 1000,
                subscribed_topic_regex: Some("t.*".into()),
                subscribed_topic_names: Some(vec!["t".into()]),
                owned: Some(vec![]),
                ..Default::default()
            },
            &env,
        )
        .unwrap();
        cg.target
            .insert("m".into(), [(Uuid::from_u128(1), [0, 1].into())].into());
        let names: HashMap<Uuid, String> = [(Uuid::from_u128(1), "t".to_string())].into();
        round_trip(ApiKey::ConsumerGroupDescribe, |v| {
            ConsumerGroupDescribeResponse::default()
                .with_groups(vec![describe_consumer(&cg, "g", &names, "uniform", v)])
        });
    }
}
