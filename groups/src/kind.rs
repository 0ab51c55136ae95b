//! [`GroupKind`]: which membership protocol a group speaks, and the checks on its members that
//! do not depend on the protocol's own requests (OffsetCommit, OffsetFetch).

use uuid::Uuid;

use crate::classic::{ClassicGroup, ClassicState, MemberRef};
use crate::consumer::ConsumerGroup;
use crate::GroupError;

/// The membership side of a group: classic or KIP-848. A group with no members (for instance
/// one loaded from disk with only offsets) may switch kind when a member of the other kind
/// arrives.
#[derive(Debug)]
pub enum GroupKind {
    Classic(ClassicGroup),
    Consumer(ConsumerGroup),
}

/// Who sends an OffsetCommit, as the request names it.
#[derive(Debug, Clone, Copy)]
pub struct Committer<'a> {
    pub member_id: &'a str,
    pub instance_id: Option<&'a str>,
    /// The classic generation, or the KIP-848 member epoch (one field on the wire).
    pub generation_or_member_epoch: i32,
    /// The OffsetCommit version (KIP-848 members must use v9+).
    pub version: i16,
}

impl GroupKind {
    pub fn is_empty(&self) -> bool {
        match self {
            GroupKind::Classic(g) => g.is_empty() && g.state == ClassicState::Empty,
            GroupKind::Consumer(g) => g.is_empty(),
        }
    }
    /// Kafka's state name.
    pub fn state_name(&self) -> &'static str {
        match self {
            GroupKind::Classic(g) => g.state.name(),
            GroupKind::Consumer(g) => g.state_name(),
        }
    }
    /// ListGroups' `group_type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            GroupKind::Classic(_) => "classic",
            GroupKind::Consumer(_) => "consumer",
        }
    }
    /// Members in the group now.
    pub fn member_count(&self) -> usize {
        match self {
            GroupKind::Classic(g) => g.members.len(),
            GroupKind::Consumer(g) => g.members.len(),
        }
    }
    /// How many rebalances the group has gone through since it was loaded: the classic
    /// generation, or the KIP-848 group epoch (each bumps once per membership or assignment
    /// change). Starts again from 0 when a group is loaded from disk, as both do.
    pub fn rebalances(&self) -> u64 {
        let n = match self {
            GroupKind::Classic(g) => g.generation,
            GroupKind::Consumer(g) => g.group_epoch,
        };
        u64::try_from(n).unwrap_or(0)
    }
    /// ListGroups' `protocol_type`.
    pub fn protocol_type(&self) -> String {
        match self {
            GroupKind::Classic(g) => g.protocol_type.clone().unwrap_or_default(),
            GroupKind::Consumer(_) => "consumer".to_string(),
        }
    }

    /// The coordinator gives the group up: requests parked on it are answered with `error`
    /// ([`ClassicGroup::unload`]); KIP-848 requests never wait on the group.
    pub fn unload(&mut self, error: &GroupError) {
        match self {
            GroupKind::Classic(g) => g.unload(error),
            GroupKind::Consumer(_) => {}
        }
    }

    /// Whether `committer` may commit offsets to this group now: a classic member at the
    /// current generation outside a sync ([`ClassicGroup::validate_commit`]), a KIP-848 member
    /// at its epoch or owning the partitions since an older one
    /// ([`ConsumerGroup::validate_commit`]). `partitions` lists what the commit names (topic id,
    /// `None` for an unknown topic, and partition); only a KIP-848 group asks for it, so a
    /// classic commit never resolves topic names.
    pub fn validate_commit(
        &self,
        committer: &Committer<'_>,
        partitions: impl FnOnce() -> Vec<(Option<Uuid>, i32)>,
    ) -> Result<(), GroupError> {
        match self {
            GroupKind::Classic(c) => c.validate_commit(MemberRef {
                member_id: committer.member_id,
                instance_id: committer.instance_id,
                generation: committer.generation_or_member_epoch,
            }),
            GroupKind::Consumer(c) => c.validate_commit(
                committer.member_id,
                committer.generation_or_member_epoch,
                committer.version,
                &partitions(),
            ),
        }
    }

    /// OffsetFetch v9+ naming a member: a KIP-848 member must be at its current epoch
    /// ([`ConsumerGroup::validate_fetch`]); a classic group does not check.
    pub fn validate_fetch(&self, member_id: &str, member_epoch: i32) -> Result<(), GroupError> {
        match self {
            GroupKind::Classic(_) => Ok(()),
            GroupKind::Consumer(c) => c.validate_fetch(member_id, member_epoch),
        }
    }
}
