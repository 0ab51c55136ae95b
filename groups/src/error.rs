//! Errors of the group coordinator. `kaas_shard::errors::group` is the one place they become Kafka
//! error codes; each variant is named after the Kafka error it stands for, because clients act
//! on the exact code (rejoin, retry, give up).

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GroupError {
    /// Cluster mode: another broker coordinates this group.
    #[error("{0}")]
    NotCoordinator(String),
    /// Cluster mode: the group is still held by its previous coordinator.
    #[error("{0}")]
    LoadInProgress(String),
    #[error("{0}")]
    InvalidGroupId(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    UnknownMemberId(String),
    #[error("{0}")]
    IllegalGeneration(String),
    #[error("the group is rebalancing, so a rejoin is needed")]
    RebalanceInProgress,
    /// KIP-394: a dynamic member's first JoinGroup is answered with the id it must use.
    #[error("the member must rejoin with the member id it was given")]
    MemberIdRequired,
    #[error("{0}")]
    FencedInstanceId(String),
    #[error("{0}")]
    UnreleasedInstanceId(String),
    #[error("{0}")]
    InconsistentGroupProtocol(String),
    #[error("session timeout {got} ms is outside [{min}, {max}] ms")]
    InvalidSessionTimeout { got: i32, min: i32, max: i32 },
    #[error("{0}")]
    GroupIdNotFound(String),
    #[error("the group is not empty")]
    NonEmptyGroup,
    #[error("{0}")]
    FencedMemberEpoch(String),
    #[error("{0}")]
    StaleMemberEpoch(String),
    #[error("{0}")]
    UnsupportedAssignor(String),
    #[error("{0}")]
    InvalidRegularExpression(String),
    #[error("{0}")]
    UnsupportedVersion(String),
    #[error("offset metadata of {len} bytes is larger than {max}")]
    OffsetMetadataTooLarge { len: usize, max: usize },
    #[error("the group is subscribed to this topic")]
    GroupSubscribedToTopic,
    #[error("the group coordinator is not available: {0}")]
    CoordinatorNotAvailable(String),
    #[error("storing offsets failed: {0}")]
    Storage(String),
}
