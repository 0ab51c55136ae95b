//! Committed offsets: OffsetCommit, OffsetFetch, OffsetDelete.

use super::*;

pub async fn offset_commit(
    shard: &Rc<Shard>,
    mut req: OffsetCommitRequest,
    version: i16,
) -> OffsetCommitResponse {
    let gid = req.group_id.to_string();
    // v10 names topics by id (KIP-516): resolved to names here, so the group's shard serves
    // every version alike. An id the catalog does not know is UNKNOWN_TOPIC_ID, as Kafka
    // answers, and is kept out of the commit: it neither fails the member's ownership check
    // for the known topics beside it nor creates the group.
    let mut unknown: Vec<OffsetCommitRequestTopic> = Vec::new();
    if version >= 10 {
        let catalog = shard.catalog.snapshot();
        for t in std::mem::take(&mut req.topics) {
            match catalog.by_id(t.topic_id) {
                Some(m) => req.topics.push(t.with_name(TopicName(s(&m.name)))),
                None => unknown.push(t),
            }
        }
    }
    // Per (topic index, partition index): the answer.
    let shape: Vec<(String, Uuid, Vec<i32>)> = req
        .topics
        .iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.topic_id,
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        })
        .collect();
    // One error for every partition of the request.
    let all = |e: GroupError| -> Vec<Vec<i16>> {
        shape
            .iter()
            .map(|(_, _, ps)| vec![errors::group(&e); ps.len()])
            .collect()
    };
    let codes: Vec<Vec<i16>> = if gid.is_empty() {
        all(invalid_group_id())
    } else if req.topics.is_empty() && !unknown.is_empty() {
        Vec::new()
    } else {
        let lost = all;
        on_group(shard, &gid.clone(), lost, move |s| async move {
            commit_on_owner(&s, &gid, req, version).await
        })
        .await
    };
    let unknown = unknown.into_iter().map(|t| {
        let codes = vec![errors::UNKNOWN_TOPIC_ID; t.partitions.len()];
        let parts = t.partitions.iter().map(|p| p.partition_index).collect();
        ((String::new(), t.topic_id, parts), codes)
    });
    let topics = shape
        .into_iter()
        .zip(codes)
        .chain(unknown)
        .map(|((name, id, parts), codes)| {
            OffsetCommitResponseTopic::default()
                .with_name(TopicName(s(&name)))
                .with_topic_id(id)
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
#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
pub(super) async fn commit_on_owner(
    s: &Rc<Shard>,
    gid: &str,
    req: OffsetCommitRequest,
    version: i16,
) -> Vec<Vec<i16>> {
    let group = s.groups.get_or_create(gid);
    let member_id = req.member_id.to_string();
    let instance = req.group_instance_id.as_ref().map(|i| i.to_string());
    let committer = Committer {
        member_id: &member_id,
        instance_id: instance.as_deref(),
        generation_or_member_epoch: req.generation_id_or_member_epoch,
        version,
    };
    let validated = group.kind.borrow().validate_commit(&committer, || {
        let topics = s.catalog.snapshot();
        req.topics
            .iter()
            .flat_map(|t| {
                let id = topics.get(t.name.as_str()).map(|m| m.id);
                t.partitions.iter().map(move |p| (id, p.partition_index))
            })
            .collect()
    });
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
        let (partitions, topic_id) = catalog
            .get(t.name.as_str())
            .map_or((0, uuid::Uuid::nil()), |m| (m.partitions, m.id));
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
                    topic_id,
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
pub(super) struct FetchGroup {
    pub(super) group_id: String,
    pub(super) member: Option<(String, i32)>,
    /// None = every committed offset of the group.
    pub(super) topics: Option<Vec<(String, Vec<i32>)>>,
    /// v10: topics asked for by an id the catalog does not know, answered UNKNOWN_TOPIC_ID.
    pub(super) unknown_ids: Vec<(Uuid, Vec<i32>)>,
}

/// One group's answer: group error, then per topic per partition
/// (partition, offset, leader epoch, metadata, error).
pub(super) type FetchedPartition = (i32, i64, i32, String, i16);
#[derive(Clone)]
pub(super) struct FetchedGroup {
    pub(super) error: i16,
    pub(super) topics: Vec<(String, Vec<FetchedPartition>)>,
}

pub async fn offset_fetch(
    shard: &Rc<Shard>,
    req: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let catalog = shard.catalog.snapshot();
    let wanted: Vec<FetchGroup> = if version >= 8 {
        req.groups
            .iter()
            .map(|g| {
                let mut unknown_ids = Vec::new();
                // v10 names topics by id (KIP-516), resolved to names here.
                let topics = g.topics.as_ref().map(|ts| {
                    ts.iter()
                        .filter_map(|t| {
                            if version < 10 {
                                return Some((t.name.to_string(), t.partition_indexes.clone()));
                            }
                            match catalog.by_id(t.topic_id) {
                                Some(m) => Some((m.name.clone(), t.partition_indexes.clone())),
                                None => {
                                    unknown_ids.push((t.topic_id, t.partition_indexes.clone()));
                                    None
                                }
                            }
                        })
                        .collect()
                });
                FetchGroup {
                    group_id: g.group_id.to_string(),
                    member: g
                        .member_id
                        .as_ref()
                        .map(|m| (m.to_string(), g.member_epoch)),
                    topics,
                    unknown_ids,
                }
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
            unknown_ids: Vec::new(),
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
            if !g.group_id.is_empty() {
                if let Err(e) = serve_here(&s, &g.group_id, Access::Read).await {
                    return FetchedGroup {
                        error: errors::group(&e),
                        topics: Vec::new(),
                    };
                }
            }
            fetch_on_owner(&s, g)
        },
        lost,
    )
    .await;
    offset_fetch_response(&wanted, answers, version, &|name| {
        catalog.get(name).map(|m| m.id)
    })
}

/// Builds the answer; `topic_id` names a topic by id for v10, which lists only topics that
/// still exist (the committed offsets of a deleted topic have no id to be listed under).
pub(super) fn offset_fetch_response(
    wanted: &[FetchGroup],
    answers: Vec<FetchedGroup>,
    version: i16,
    topic_id: &dyn Fn(&str) -> Option<Uuid>,
) -> OffsetFetchResponse {
    let mut resp = OffsetFetchResponse::default();
    if version >= 8 {
        resp.groups = wanted
            .iter()
            .zip(answers)
            .map(|(w, a)| fetched_group(w, a, version, topic_id))
            .collect();
    } else {
        let mut a = answers.into_iter().next().expect("one group");
        if version >= 2 {
            resp.error_code = a.error;
        } else if a.error != errors::NONE && a.topics.is_empty() {
            // v0-1 have no group error field: a refused group (NOT_COORDINATOR) is answered
            // on every partition asked for, or the client would see no answer at all.
            a.topics = wanted[0]
                .topics
                .iter()
                .flatten()
                .map(|(t, ps)| {
                    let ps = ps.iter().map(|p| (*p, -1, -1, String::new(), a.error));
                    (t.clone(), ps.collect())
                })
                .collect();
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

/// One group of a v8+ OffsetFetch answer.
fn fetched_group(
    w: &FetchGroup,
    a: FetchedGroup,
    version: i16,
    topic_id: &dyn Fn(&str) -> Option<Uuid>,
) -> OffsetFetchResponseGroup {
    // A group error answers the whole group, unknown ids included.
    let unknown_ids = if a.error == errors::NONE {
        &w.unknown_ids[..]
    } else {
        &[]
    };
    let unknown = unknown_ids.iter().map(|(id, ps)| {
        let ps = ps
            .iter()
            .map(|p| (*p, -1, -1, String::new(), errors::UNKNOWN_TOPIC_ID));
        (String::new(), Some(*id), ps.collect::<Vec<_>>())
    });
    let topics = a
        .topics
        .into_iter()
        .filter_map(|(t, ps)| {
            if version < 10 {
                return Some((t, None, ps));
            }
            topic_id(&t).map(|id| (t, Some(id), ps))
        })
        .chain(unknown)
        .map(|(t, id, ps)| {
            OffsetFetchResponseTopics::default()
                .with_name(TopicName(s(&t)))
                .with_topic_id(id.unwrap_or_default())
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
        .collect();
    OffsetFetchResponseGroup::default()
        .with_group_id(GroupId(s(&w.group_id)))
        .with_error_code(a.error)
        .with_topics(topics)
}

pub(super) fn fetch_on_owner(s: &Rc<Shard>, want: FetchGroup) -> FetchedGroup {
    if want.group_id.is_empty() {
        return FetchedGroup {
            error: errors::group(&invalid_group_id()),
            topics: Vec::new(),
        };
    }
    let group = s.groups.get(&want.group_id);
    if let (Some(g), Some((member_id, epoch))) = (&group, &want.member) {
        if let Err(e) = g.kind.borrow().validate_fetch(member_id, *epoch) {
            return FetchedGroup {
                error: errors::group(&e),
                topics: Vec::new(),
            };
        }
    }
    let empty = Default::default();
    let table_ref = group.as_ref().map(|g| g.offsets.borrow());
    let table = table_ref.as_deref().unwrap_or(&empty);
    // Offsets of a deleted topic (or of the one before a topic of the same name) are not
    // answered; the coordinator deletes them at its next tick.
    let catalog = s.catalog.snapshot();
    let topics = match want.topics {
        None => table
            .iter()
            .filter_map(|(t, ps)| {
                let ps: Vec<_> = ps
                    .iter()
                    .filter(|(p, v)| v.is_current(t, **p, &catalog))
                    .collect();
                (!ps.is_empty()).then_some((t, ps))
            })
            .map(|(t, ps)| {
                (
                    t.clone(),
                    ps.into_iter()
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
                    .map(|p| {
                        match committed
                            .and_then(|c| c.get(&p))
                            .filter(|v| v.is_current(&t, p, &catalog))
                        {
                            Some(v) => (
                                p,
                                v.offset,
                                v.leader_epoch,
                                v.metadata.clone(),
                                errors::NONE,
                            ),
                            None => (p, -1, -1, String::new(), errors::NONE),
                        }
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

#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
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
                // As Kafka: a partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION (it
                // was answered NONE, which read as "deleted").
                let catalog = s.catalog.snapshot();
                {
                    let table = group.offsets.borrow();
                    for (t, ps) in &shape2 {
                        let sub = subscribed.contains(t);
                        let count = catalog.get(t).map_or(0, |m| m.partitions);
                        codes.push(
                            ps.iter()
                                .map(|p| {
                                    if !(0..count).contains(p) {
                                        return errors::UNKNOWN_TOPIC_OR_PARTITION;
                                    }
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
