//! The `range` assignor: Kafka's range semantics, topic by topic.
//!
//! For each topic, the members subscribed to it are sorted by member id and take contiguous
//! ranges of partitions in that order; the first `P mod M` members take one partition more.
//! Because the split depends only on the partition count and the subscriber list, topics with
//! the same partition count and subscribers are co-partitioned: the member holding partition `p`
//! of one holds partition `p` of the other, which is what joins over keyed topics rely on. The
//! price is that the extras pile up on the first members when there are many topics, and that
//! nothing is sticky beyond what the ranges happen to keep.

use std::collections::{BTreeMap, BTreeSet};

use super::balanced::{Model, RackMode};
use super::{GroupAssignment, MemberSpec, TopicSpec};

pub(crate) fn assign(
    members: &[MemberSpec],
    topics: &BTreeMap<String, TopicSpec>,
) -> GroupAssignment {
    let model = Model::new(members, topics, RackMode::Ignore);
    let mut out: GroupAssignment = model
        .members
        .iter()
        .map(|m| (m.member_id.clone(), BTreeMap::new()))
        .collect();
    for topic in &model.topics {
        let count = topic.racks.len();
        let subs = topic.subscribers.len();
        let (per_member, extra) = (count / subs, count % subs);
        for (i, &m) in topic.subscribers.iter().enumerate() {
            let start = i * per_member + i.min(extra);
            let len = per_member + usize::from(i < extra);
            if len == 0 {
                continue;
            }
            let range: BTreeSet<i32> = (start..start + len).map(|p| p as i32).collect();
            out.get_mut(&model.members[m].member_id)
                .expect("every member has an entry")
                .insert(topic.name.to_string(), range);
        }
    }
    out
}
