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
use std::sync::Arc;
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
use kaas_wire::kafka_protocol::messages::offset_commit_request::OffsetCommitRequestTopic;
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
use crate::groups::manager::{downgrade_if_due, Group, GroupManager, ListedGroup};
use crate::groups::offsets::{CommittedOffset, OffsetRecord};
use crate::groups::{
    classic::ClassicGroup, owner_shard, Committer, GroupConfig, GroupError, GroupKind,
};
use crate::mesh::on_shard;
use crate::shard::Shard;

use super::authorized;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn unavailable() -> GroupError {
    GroupError::CoordinatorNotAvailable("the coordinator shard is shutting down".into())
}

/// Runs `f` on the shard that owns `group_id`, once this broker may serve the group
/// ([`serve_here`]). A group this broker does not coordinate is answered
/// `failed(NotCoordinator)`, so the client looks the coordinator up again; a shard shutting
/// down answers `failed(CoordinatorNotAvailable)`.
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
    let owner = owner_shard(group_id, shard.nshards);
    let gid = group_id.to_string();
    let answer = on_shard(shard, owner, move |s: Rc<Shard>| async move {
        serve_here(&s, &gid, Access::Change).await?;
        Ok(f(s).await)
    })
    .await;
    match answer {
        Some(Ok(r)) => r,
        Some(Err(e)) => failed(e),
        None => failed(unavailable()),
    }
}

/// What a request does with a group, for [`serve_here`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Joins, commits: the group is created when it does not exist.
    Change,
    /// Fetches offsets, describes, deletes: a group nobody ever served is answered as unknown,
    /// and nothing is created on the volume for it.
    Read,
}

/// On the shard that owns `group_id`: makes sure what this shard holds of the group is the
/// group — this broker coordinates it, the shard has loaded its groups, and in cluster mode
/// the broker holds the group's lock, so the group's state was loaded from the shared volume
/// when the lock was taken. Every request that reads or changes a group passes here first. A
/// broker that has not claimed a group has nothing of it in memory: an OffsetFetch answered
/// from there says "no committed offset", and a consumer with auto.offset.reset=latest then
/// starts past records nobody consumed.
async fn serve_here(s: &Rc<Shard>, group_id: &str, access: Access) -> Result<(), GroupError> {
    if s.cluster.coordinator(group_id) != Some(s.cluster.me()) {
        return Err(GroupError::NotCoordinator(format!(
            "broker {} is not the coordinator of group {group_id}",
            s.cluster.me()
        )));
    }
    s.groups.ready().await;
    match access {
        Access::Change => s.groups.claim(group_id).await,
        Access::Read => s.groups.claim_existing(group_id).await,
    }
}

fn invalid_group_id() -> GroupError {
    GroupError::InvalidGroupId("The group id must not be empty.".into())
}

fn code(e: &Option<GroupError>) -> i16 {
    e.as_ref().map(errors::group).unwrap_or(errors::NONE)
}

mod admin;
mod classic;
pub(crate) mod coordinator;
mod kip848;
mod offsets;

pub use admin::{delete_groups, describe_groups, list_groups};
pub use classic::{heartbeat, join_group, leave_group, sync_group};
pub use coordinator::find_coordinator;
pub use kip848::{consumer_group_describe, consumer_group_heartbeat};
pub use offsets::{offset_commit, offset_delete, offset_fetch};

#[cfg(test)]
mod tests {
    use super::admin::*;
    use super::classic::*;
    use super::coordinator::*;
    use super::kip848::*;
    use super::offsets::*;
    use super::*;
    use crate::groups::classic::JoinedMember;
    use kaas_wire::kafka_protocol::messages::ApiKey;
    use kaas_wire::kafka_protocol::protocol::{Decodable, Encodable};
    use kaas_wire::versions::supported_range;

    /// Encodes `resp` at every version we serve for `key` and decodes it back: the encoder
    /// refuses a non-default value in a field the version lacks, so this proves every builder
    /// sets version-dependent fields only where they exist.
    fn round_trip<T: Encodable + Decodable>(key: ApiKey, build: impl Fn(i16) -> T) {
        use kaas_wire::beyond::{response_how, How};
        let (lo, hi) = supported_range(key).expect("served");
        for built_at in lo..=hi {
            let resp = build(built_at);
            // The version whose bytes the codec writes: a twin's, and none for the responses
            // `kaas_wire::beyond` writes by hand (tested there against Kafka's own bytes).
            let v = match response_how(key, built_at) {
                How::Codec => built_at,
                How::Twin(t) => t,
                How::ByHand => continue,
            };
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
    #[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
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
                    unknown_ids: Vec::new(),
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
            offset_fetch_response(&wanted, answers, v, &|_| Some(Uuid::nil()))
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
        let topics: Arc<dyn consumer::Topics> = Arc::new(crate::catalog::TopicTable::default());
        let assign = |_: &str, _: &[_], _: &BTreeMap<_, _>| None;
        let env = HeartbeatEnv {
            now: Instant::now(),
            topics: &topics,
            new_member_id: &GroupManager::new_member_id,
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
