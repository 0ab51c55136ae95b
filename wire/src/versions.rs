//! The one registry of what kaas serves: every API key with the version range we implement.
//! ApiVersions is built from it and the request decoder refuses anything outside it, so a client
//! can never negotiate a version we do not handle.

use kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

/// (API, lowest version, highest version) served by this broker.
///
/// These are Kafka 4.4's newest versions of each API served. Versions past the generated
/// codec's newest are read and written by [`crate::beyond`].
pub const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 13),
    (ApiKey::Fetch, 4, 18),
    (ApiKey::ListOffsets, 1, 11),
    (ApiKey::Metadata, 0, 13),
    (ApiKey::ApiVersions, 0, 5),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DescribeCluster, 0, 2),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    // kafka-log-dirs and UIs: one log directory, partition sizes, the volume's bytes (v4).
    (ApiKey::DescribeLogDirs, 1, 5),
    // What admin tools and UIs read (shard/src/handlers/describe.rs): producer state per
    // partition, and the empty answers of quotas and SCRAM users.
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    // kafka-transactions list: none exists (transactional producers are refused).
    (ApiKey::ListTransactions, 0, 2),
    // kafka-reassign-partitions: a reassignment moves a partition's leadership to the one
    // broker it names, copying nothing (shard/src/handlers/reassign.rs).
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    // kafka-leader-election: a partition's one replica always leads it (handlers/elect.rs).
    (ApiKey::ElectLeaders, 0, 2),
    // kafka-features upgrade/downgrade/disable: the levels of FEATURES never change; keeping
    // one is accepted, moving one is refused (shard/src/handlers/features.rs).
    (ApiKey::UpdateFeatures, 0, 2),
    // The group coordinator (groups/, shard/src/groups). OffsetCommit and OffsetFetch start where
    // Kafka 4 does (v0/v1 were removed); FindCoordinator v4+ is the batched form.
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 10),
    (ApiKey::OffsetFetch, 1, 10),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::DeleteGroups, 0, 3),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
];

/// The version range we serve for `api_key`, or `None` when we do not serve it at all.
pub fn supported_range(api_key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED_APIS
        .iter()
        .find(|(k, _, _)| *k == api_key)
        .map(|(_, lo, hi)| (*lo, *hi))
}

/// Whether we serve `api_key` at `version`.
pub fn is_supported(api_key: ApiKey, version: i16) -> bool {
    matches!(supported_range(api_key), Some((lo, hi)) if (lo..=hi).contains(&version))
}

/// The feature flags kaas reports in ApiVersions v4+ (what `kafka-features describe` and
/// `Admin::describeFeatures` read): (name, highest supported level, finalized level).
///
/// Only `group.version` is reported: level 1 is KIP-848's consumer group protocol, which every
/// kaas broker serves, so it is always finalized at 1. Kafka's other features describe what
/// kaas does not have (KRaft metadata records, transactions v2, share groups, streams groups,
/// eligible leader replicas) and are left out rather than reported at a level that would mean
/// something they do not; a client then treats them as level 0.
pub const FEATURES: &[(&str, i16, i16)] = &[("group.version", 1, 1)];

/// The epoch of the finalized features: they never change while a broker runs.
const FINALIZED_FEATURES_EPOCH: i64 = 0;

/// The lowest ApiVersions version whose answer carries [`FEATURES`]. Java clients 3.7 and 3.8
/// refuse a supported feature whose minimum level is 0 and drop the connection (KAFKA-17011),
/// so Kafka 3.9+ brokers leave such features out of v0-v3 answers, and so does kaas; v4 exists
/// to say the client can read them.
const FEATURES_FROM_VERSION: i16 = 4;

/// The lowest Produce version ApiVersions names, below the lowest served (3), as Kafka 4 does
/// (KAFKA-18659): librdkafka before 2.8 decides whether a broker takes gzip, snappy and lz4 by
/// asking whether it serves Produce v0, and otherwise sends those batches uncompressed without
/// a word (Debian's kcat, linked to librdkafka 2.0.2, did so against kaas). Clients pick the
/// highest version both sides name, so none sends v0-v2; one that does is refused by the
/// decoder, which goes by [`SUPPORTED_APIS`], and its connection closed.
const ADVERTISED_PRODUCE_MIN: i16 = 0;

/// The ApiVersions response body (for a request of `version`) listing every supported range,
/// with `error_code`.
pub fn api_versions_response(error_code: i16, version: i16) -> ApiVersionsResponse {
    let api_keys = SUPPORTED_APIS
        .iter()
        .map(|(k, lo, hi)| {
            let lo = if *k == ApiKey::Produce {
                ADVERTISED_PRODUCE_MIN
            } else {
                *lo
            };
            ApiVersion::default()
                .with_api_key(*k as i16)
                .with_min_version(lo)
                .with_max_version(*hi)
        })
        .collect();
    let features = if version >= FEATURES_FROM_VERSION {
        FEATURES
    } else {
        &[]
    };
    let supported = features
        .iter()
        .map(|(name, max, _)| {
            SupportedFeatureKey::default()
                .with_name(kafka_protocol::protocol::StrBytes::from_static_str(name))
                .with_min_version(0)
                .with_max_version(*max)
        })
        .collect();
    let finalized = features
        .iter()
        .map(|(name, _, level)| {
            FinalizedFeatureKey::default()
                .with_name(kafka_protocol::protocol::StrBytes::from_static_str(name))
                .with_min_version_level(*level)
                .with_max_version_level(*level)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(error_code)
        .with_api_keys(api_keys)
        .with_supported_features(supported)
        .with_finalized_features_epoch(FINALIZED_FEATURES_EPOCH)
        .with_finalized_features(finalized)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::Message;

    // Java clients 3.7 and 3.8 drop a connection whose ApiVersions answer lists a feature with
    // minimum level 0 (KAFKA-17011): below v4 no feature is listed; from v4 on, group.version.
    #[test]
    fn features_only_from_v4() {
        for version in 0..4 {
            let r = api_versions_response(0, version);
            assert!(r.supported_features.is_empty(), "v{version}");
            assert!(r.finalized_features.is_empty(), "v{version}");
        }
        let r = api_versions_response(0, 4);
        let names: Vec<&str> = r.supported_features.iter().map(|f| &*f.name).collect();
        assert_eq!(names, ["group.version"]);
        assert_eq!(r.finalized_features[0].max_version_level, 1);
    }

    // Produce is named from v0 (librdkafka's compression check, KAFKA-18659) but served, and
    // decoded, from v3 only.
    #[test]
    fn produce_is_named_from_v0_and_served_from_v3() {
        let r = api_versions_response(0, 3);
        let produce = r
            .api_keys
            .iter()
            .find(|k| k.api_key == ApiKey::Produce as i16)
            .unwrap();
        assert_eq!((produce.min_version, produce.max_version), (0, 13));
        assert!(!is_supported(ApiKey::Produce, 2));
        assert!(is_supported(ApiKey::Produce, 3));
    }

    /// Checks that every version of `k` from `first` (the first past the codec) to `hi` has
    /// a decoder and an encoder; returns the codec's part of the range's top.
    fn past_codec_served(k: ApiKey, first: i16, hi: i16) -> i16 {
        use crate::beyond::{self, How};
        fn within<M: Message>(lo: i16, hi: i16) -> bool {
            M::VERSIONS.min <= lo && hi <= M::VERSIONS.max && lo <= hi
        }
        let k = &k;
        let hi = &hi;
        for v in first..=*hi {
            match beyond::request_how(*k, v) {
                How::Codec => panic!("{k:?} v{v} is past the codec and has no row"),
                How::Twin(t) => assert!(t < first, "{k:?} v{v} twin v{t}"),
                How::ByHand => {
                    // An empty body must be refused as truncated, not as unknown.
                    let e = beyond::decode_request(*k, v, &mut bytes::Bytes::new()).unwrap_err();
                    assert!(!e.starts_with("no decoder"), "{k:?} v{v}: {e}");
                }
            }
            let encodes = match (beyond::response_how(*k, v), k) {
                (How::Twin(t), _) => t < first,
                (How::Codec, ApiKey::OffsetCommit) => within::<OffsetCommitResponse>(v, v),
                (How::Codec, ApiKey::OffsetFetch) => within::<OffsetFetchResponse>(v, v),
                (How::ByHand, ApiKey::DescribeLogDirs) => beyond::encode_response(
                    &ResponseKind::DescribeLogDirs(Default::default()),
                    v,
                    &mut bytes::BytesMut::new(),
                )
                .is_some(),
                (How::ByHand, ApiKey::DeleteGroups) => beyond::encode_response(
                    &ResponseKind::DeleteGroups(Default::default()),
                    v,
                    &mut bytes::BytesMut::new(),
                )
                .is_some(),
                (how, _) => panic!("{k:?} v{v} response {how:?}: add its check here"),
            };
            assert!(encodes, "{k:?} v{v}: no encoder for the response");
        }
        first - 1
    }

    // Every range we advertise is one the codec can decode, or past it a row of
    // `beyond::PAST_CODEC` whose request and response are each read and written by the codec
    // (at that version or a twin) or by an arm of `beyond`, so no advertised version can fail
    // to parse or encode for lack of a schema.
    #[test]
    fn ranges_within_codec() {
        use crate::beyond;
        fn within<M: Message>(lo: i16, hi: i16) -> bool {
            M::VERSIONS.min <= lo && hi <= M::VERSIONS.max && lo <= hi
        }
        for (k, lo, hi) in SUPPORTED_APIS {
            // The codec's part of the range: up to the first version past it.
            let past = beyond::PAST_CODEC
                .iter()
                .filter(|(key, ..)| key == k)
                .map(|(_, v, ..)| *v)
                .min();
            let hi = &past.map_or(*hi, |first| past_codec_served(*k, first, *hi));
            let ok = match k {
                ApiKey::Produce => within::<ProduceRequest>(*lo, *hi),
                ApiKey::Fetch => within::<FetchRequest>(*lo, *hi),
                ApiKey::ListOffsets => within::<ListOffsetsRequest>(*lo, *hi),
                ApiKey::Metadata => within::<MetadataRequest>(*lo, *hi),
                ApiKey::ApiVersions => within::<ApiVersionsRequest>(*lo, *hi),
                ApiKey::CreateTopics => within::<CreateTopicsRequest>(*lo, *hi),
                ApiKey::DeleteTopics => within::<DeleteTopicsRequest>(*lo, *hi),
                ApiKey::InitProducerId => within::<InitProducerIdRequest>(*lo, *hi),
                ApiKey::DescribeConfigs => within::<DescribeConfigsRequest>(*lo, *hi),
                ApiKey::AlterConfigs => within::<AlterConfigsRequest>(*lo, *hi),
                ApiKey::CreatePartitions => within::<CreatePartitionsRequest>(*lo, *hi),
                ApiKey::DeleteRecords => within::<DeleteRecordsRequest>(*lo, *hi),
                ApiKey::OffsetForLeaderEpoch => within::<OffsetForLeaderEpochRequest>(*lo, *hi),
                ApiKey::IncrementalAlterConfigs => {
                    within::<IncrementalAlterConfigsRequest>(*lo, *hi)
                }
                ApiKey::DescribeCluster => within::<DescribeClusterRequest>(*lo, *hi),
                ApiKey::DescribeTopicPartitions => {
                    within::<DescribeTopicPartitionsRequest>(*lo, *hi)
                }
                ApiKey::DescribeLogDirs => within::<DescribeLogDirsRequest>(*lo, *hi),
                ApiKey::DescribeProducers => within::<DescribeProducersRequest>(*lo, *hi),
                ApiKey::DescribeClientQuotas => within::<DescribeClientQuotasRequest>(*lo, *hi),
                ApiKey::DescribeUserScramCredentials => {
                    within::<DescribeUserScramCredentialsRequest>(*lo, *hi)
                }
                ApiKey::ListTransactions => within::<ListTransactionsRequest>(*lo, *hi),
                ApiKey::ListPartitionReassignments => {
                    within::<ListPartitionReassignmentsRequest>(*lo, *hi)
                }
                ApiKey::AlterPartitionReassignments => {
                    within::<AlterPartitionReassignmentsRequest>(*lo, *hi)
                }
                ApiKey::ElectLeaders => within::<ElectLeadersRequest>(*lo, *hi),
                ApiKey::UpdateFeatures => within::<UpdateFeaturesRequest>(*lo, *hi),
                ApiKey::FindCoordinator => within::<FindCoordinatorRequest>(*lo, *hi),
                ApiKey::JoinGroup => within::<JoinGroupRequest>(*lo, *hi),
                ApiKey::SyncGroup => within::<SyncGroupRequest>(*lo, *hi),
                ApiKey::Heartbeat => within::<HeartbeatRequest>(*lo, *hi),
                ApiKey::LeaveGroup => within::<LeaveGroupRequest>(*lo, *hi),
                ApiKey::OffsetCommit => within::<OffsetCommitRequest>(*lo, *hi),
                ApiKey::OffsetFetch => within::<OffsetFetchRequest>(*lo, *hi),
                ApiKey::ListGroups => within::<ListGroupsRequest>(*lo, *hi),
                ApiKey::DescribeGroups => within::<DescribeGroupsRequest>(*lo, *hi),
                ApiKey::DeleteGroups => within::<DeleteGroupsRequest>(*lo, *hi),
                ApiKey::OffsetDelete => within::<OffsetDeleteRequest>(*lo, *hi),
                ApiKey::ConsumerGroupHeartbeat => within::<ConsumerGroupHeartbeatRequest>(*lo, *hi),
                ApiKey::ConsumerGroupDescribe => within::<ConsumerGroupDescribeRequest>(*lo, *hi),
                _ => false,
            };
            assert!(ok, "{k:?} {lo}..={hi} outside the codec's range");
        }
    }
}
