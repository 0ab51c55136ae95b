//! The one place where internal errors become Kafka error codes.

use kaas_storage::StorageError;
use kaas_wire::error::BatchError;
use kaas_wire::kafka_protocol::ResponseError as E;

use crate::catalog::CatalogError;
use crate::groups::GroupError;

pub const NONE: i16 = 0;

pub fn storage(e: &StorageError) -> i16 {
    match e {
        StorageError::Io { .. } | StorageError::Corrupt { .. } => E::KafkaStorageError.code(),
        StorageError::OffsetOutOfRange { .. } => E::OffsetOutOfRange.code(),
        StorageError::FencedLeaderEpoch { .. } => E::FencedLeaderEpoch.code(),
        StorageError::InvalidProducerEpoch { .. } => E::InvalidProducerEpoch.code(),
        StorageError::OutOfOrderSequence { .. } => E::OutOfOrderSequenceNumber.code(),
        // A partition closed under a request (topic deleted, shutdown): the client refreshes
        // metadata and retries.
        StorageError::Closed => E::NotLeaderOrFollower.code(),
    }
}

pub fn catalog(e: &CatalogError) -> i16 {
    match e {
        CatalogError::TopicExists(_) => E::TopicAlreadyExists.code(),
        CatalogError::UnknownTopic(_) => E::UnknownTopicOrPartition.code(),
        CatalogError::InvalidTopicName(_) => E::InvalidTopicException.code(),
        CatalogError::InvalidPartitions(_) => E::InvalidPartitions.code(),
        CatalogError::InvalidReplicationFactor(_) => E::InvalidReplicationFactor.code(),
        CatalogError::InvalidReplicaAssignment(_) => E::InvalidReplicaAssignment.code(),
        CatalogError::DuplicateName => E::InvalidRequest.code(),
        CatalogError::InvalidConfig(_) => E::InvalidConfig.code(),
        CatalogError::InvalidRequest(_) => E::InvalidRequest.code(),
        CatalogError::NotDynamic(_) => E::InvalidRequest.code(),
        CatalogError::Storage { .. } => E::KafkaStorageError.code(),
        // Retriable: the name is free again within seconds (auto-creation's answer; CreateTopics
        // waits instead).
        CatalogError::NameRecentlyDeleted { .. } => E::UnknownTopicOrPartition.code(),
    }
}

/// The group coordinator's errors: each variant is the Kafka error of the same name, except
/// storage failures, which clients see as a coordinator that is not available (retriable).
pub fn group(e: &GroupError) -> i16 {
    match e {
        GroupError::NotCoordinator(_) => E::NotCoordinator.code(),
        GroupError::LoadInProgress(_) => E::CoordinatorLoadInProgress.code(),
        GroupError::InvalidGroupId(_) => E::InvalidGroupId.code(),
        GroupError::InvalidRequest(_) => E::InvalidRequest.code(),
        GroupError::UnknownMemberId(_) => E::UnknownMemberId.code(),
        GroupError::IllegalGeneration(_) => E::IllegalGeneration.code(),
        GroupError::RebalanceInProgress => E::RebalanceInProgress.code(),
        GroupError::MemberIdRequired => E::MemberIdRequired.code(),
        GroupError::FencedInstanceId(_) => E::FencedInstanceId.code(),
        GroupError::UnreleasedInstanceId(_) => E::UnreleasedInstanceId.code(),
        GroupError::InconsistentGroupProtocol(_) => E::InconsistentGroupProtocol.code(),
        GroupError::InvalidSessionTimeout { .. } => E::InvalidSessionTimeout.code(),
        GroupError::GroupIdNotFound(_) => E::GroupIdNotFound.code(),
        GroupError::NonEmptyGroup => E::NonEmptyGroup.code(),
        GroupError::FencedMemberEpoch(_) => E::FencedMemberEpoch.code(),
        GroupError::StaleMemberEpoch(_) => E::StaleMemberEpoch.code(),
        GroupError::UnsupportedAssignor(_) => E::UnsupportedAssignor.code(),
        GroupError::InvalidRegularExpression(_) => E::InvalidRegularExpression.code(),
        GroupError::UnsupportedVersion(_) => E::UnsupportedVersion.code(),
        GroupError::OffsetMetadataTooLarge { .. } => E::OffsetMetadataTooLarge.code(),
        GroupError::GroupSubscribedToTopic => E::GroupSubscribedToTopic.code(),
        GroupError::CoordinatorNotAvailable(_) | GroupError::Storage(_) => {
            E::CoordinatorNotAvailable.code()
        }
    }
}

/// A produced batch that fails validation. CRC and framing problems are CORRUPT_MESSAGE, as
/// Kafka answers them; a wrong record count is INVALID_RECORD.
pub fn batch(e: &BatchError) -> i16 {
    match e {
        BatchError::BadCount { .. } => E::InvalidRecord.code(),
        BatchError::BadMagic { .. } => E::UnsupportedForMessageFormat.code(),
        BatchError::Truncated { .. }
        | BatchError::BadLength { .. }
        | BatchError::BadCrc { .. }
        | BatchError::Empty => E::CorruptMessage.code(),
    }
}

pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = E::UnknownTopicOrPartition.code();
pub const UNKNOWN_TOPIC_ID: i16 = E::UnknownTopicId.code();
pub const INVALID_REQUIRED_ACKS: i16 = E::InvalidRequiredAcks.code();
pub const MESSAGE_TOO_LARGE: i16 = E::MessageTooLarge.code();
pub const INVALID_REQUEST: i16 = E::InvalidRequest.code();
/// KIP-1242 (ApiVersions v5): the client's metadata names another cluster or broker.
pub const REBOOTSTRAP_REQUIRED: i16 = E::RebootstrapRequired.code();
pub const INVALID_RECORD: i16 = E::InvalidRecord.code();
pub const FETCH_SESSION_ID_NOT_FOUND: i16 = E::FetchSessionIdNotFound.code();
pub const INVALID_TIMESTAMP: i16 = E::InvalidTimestamp.code();
pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = E::TransactionalIdAuthorizationFailed.code();
pub const INVALID_CONFIG: i16 = E::InvalidConfig.code();
pub const INVALID_UPDATE_VERSION: i16 = E::InvalidUpdateVersion.code();
pub const INVALID_GROUP_ID: i16 = E::InvalidGroupId.code();
pub const UNSUPPORTED_VERSION: i16 = E::UnsupportedVersion.code();
pub const FENCED_LEADER_EPOCH: i16 = E::FencedLeaderEpoch.code();
pub const UNKNOWN_LEADER_EPOCH: i16 = E::UnknownLeaderEpoch.code();
pub const INVALID_PRODUCER_EPOCH: i16 = E::InvalidProducerEpoch.code();
pub const NOT_LEADER_OR_FOLLOWER: i16 = E::NotLeaderOrFollower.code();
pub const REQUEST_TIMED_OUT: i16 = E::RequestTimedOut.code();
pub const LEADER_NOT_AVAILABLE: i16 = E::LeaderNotAvailable.code();
pub const KAFKA_STORAGE_ERROR: i16 = E::KafkaStorageError.code();
pub const INVALID_TOPIC: i16 = E::InvalidTopicException.code();
pub const POLICY_VIOLATION: i16 = E::PolicyViolation.code();
pub const OFFSET_OUT_OF_RANGE: i16 = E::OffsetOutOfRange.code();
pub const INVALID_PARTITIONS: i16 = E::InvalidPartitions.code();
pub const COORDINATOR_NOT_AVAILABLE: i16 = E::CoordinatorNotAvailable.code();
pub const RESOURCE_NOT_FOUND: i16 = E::ResourceNotFound.code();
pub const INVALID_REGULAR_EXPRESSION: i16 = E::InvalidRegularExpression.code();
/// DescribeCluster v1+ for the controllers' endpoints (type 2), sent to a broker's.
pub const MISMATCHED_ENDPOINT_TYPE: i16 = E::MismatchedEndpointType.code();
/// DescribeCluster v1+ naming an endpoint type that does not exist.
pub const UNSUPPORTED_ENDPOINT_TYPE: i16 = E::UnsupportedEndpointType.code();
