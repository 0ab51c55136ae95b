//! Group administration: ListGroups, DescribeGroups, DeleteGroups.

use super::*;

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

pub(super) fn listed_group(g: &ListedGroup, version: i16) -> WireListedGroup {
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
pub(super) struct DescribedClassic {
    pub(super) error: Option<GroupError>,
    pub(super) state: String,
    pub(super) protocol_type: String,
    pub(super) protocol_data: String,
    /// (member id, instance id, client id, host, metadata, assignment)
    pub(super) members: Vec<(String, Option<String>, String, String, Bytes, Bytes)>,
}

pub(super) fn describe_classic_on_owner(s: &Rc<Shard>, gid: &str) -> DescribedClassic {
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
            if let Err(e) = serve_here(&s, &gid, Access::Read).await {
                return DescribedClassic {
                    error: Some(e),
                    state: String::new(),
                    protocol_type: String::new(),
                    protocol_data: String::new(),
                    members: Vec::new(),
                };
            }
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

pub(super) fn described_group(gid: &str, a: DescribedClassic, version: i16) -> DescribedGroup {
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
            if let Err(e) = serve_here(&s, &gid, Access::Read).await {
                return errors::group(&e);
            }
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
