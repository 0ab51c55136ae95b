//! Request and response versions newer than the generated codec (kafka-protocol 0.18.0, the
//! newest on crates.io) reads or writes, written by hand from Apache Kafka 4.4's message
//! schemas (`org.apache.kafka.common.message.*Data.SCHEMAS`, printed from the 4.4 client jar;
//! the test vectors below were serialized by those classes, see tests/java/WireVectors.java).
//!
//! | API | version | what changed | request | response |
//! |---|---|---|---|---|
//! | ListOffsets | 11 | a new special timestamp (-6), nothing on the wire | read as v10 | written as v10 |
//! | ApiVersions | 5 | the request names the cluster and broker the client meant (KIP-1242) | by hand | written as v4 |
//! | OffsetCommit | 10 | topics by id instead of name | by hand | the codec's v10 |
//! | OffsetFetch | 10 | topics by id instead of name | by hand | the codec's v10 |
//! | DeleteGroups | 3 | each result gains an error message | read as v2 | by hand |
//! | DescribeLogDirs | 5 | each log directory says whether it is cordoned (KIP-1066) | read as v4 | by hand |
//!
//! Requests decode into the generated types with their topic-id fields set (the generated
//! structs already carry them; only the generated request decoders stop at v9), so the
//! handlers serve every version with one code path. Every length read is checked against the
//! bytes left before anything is allocated.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::delete_groups_response::DeleteGroupsResponse;
use kafka_protocol::messages::describe_log_dirs_response::DescribeLogDirsResponse;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, GroupId, RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;

/// What a request may say beyond its generated type: ApiVersions v5's cluster and broker the
/// client meant to reach (KIP-1242), `None` for every other request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpectedBroker {
    /// The cluster id the client last saw, or `None` when it has none yet.
    pub cluster_id: Option<String>,
    /// The broker id the client meant to connect to, -1 for a bootstrap connection.
    pub node_id: i32,
}

/// How one direction of one version is read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// By the generated codec, at this very version.
    Codec,
    /// By the generated codec at an older version with the same bytes.
    Twin(i16),
    /// By this module.
    ByHand,
}

/// The versions past the generated codec: (API, version, its request, its response). The
/// registry's test (`versions::tests::ranges_within_codec`) holds every advertised version to
/// a row here or to the codec's own range, and every `ByHand` to an arm below.
pub const PAST_CODEC: &[(ApiKey, i16, How, How)] = &[
    (ApiKey::ListOffsets, 11, How::Twin(10), How::Twin(10)),
    (ApiKey::ApiVersions, 5, How::ByHand, How::Twin(4)),
    (ApiKey::OffsetCommit, 10, How::ByHand, How::Codec),
    (ApiKey::OffsetFetch, 10, How::ByHand, How::Codec),
    (ApiKey::DeleteGroups, 3, How::Twin(2), How::ByHand),
    (ApiKey::DescribeLogDirs, 5, How::Twin(4), How::ByHand),
];

fn row(api_key: ApiKey, version: i16) -> Option<&'static (ApiKey, i16, How, How)> {
    PAST_CODEC
        .iter()
        .find(|(k, v, _, _)| *k == api_key && *v == version)
}

/// How a request of `api_key` at `version` is decoded.
pub fn request_how(api_key: ApiKey, version: i16) -> How {
    row(api_key, version).map_or(How::Codec, |r| r.2)
}

/// How a response of `api_key` at `version` is encoded.
pub fn response_how(api_key: ApiKey, version: i16) -> How {
    row(api_key, version).map_or(How::Codec, |r| r.3)
}

/// Decodes the body of a request past the codec. `buf` is positioned after the header.
pub fn decode_request(
    api_key: ApiKey,
    version: i16,
    buf: &mut Bytes,
) -> Result<(RequestKind, Option<ExpectedBroker>), String> {
    let mut r = Reader(buf);
    let body = match (api_key, version) {
        (ApiKey::ApiVersions, 5) => {
            let name = r.compact_string()?;
            let software_version = r.compact_string()?;
            let cluster_id = r.compact_nullable_string()?;
            let node_id = r.i32()?;
            r.tagged_fields()?;
            let expected = ExpectedBroker {
                cluster_id: cluster_id.map(|s| s.to_string()),
                node_id,
            };
            let req = ApiVersionsRequest::default()
                .with_client_software_name(name)
                .with_client_software_version(software_version);
            return Ok((RequestKind::ApiVersions(req), Some(expected)));
        }
        (ApiKey::OffsetCommit, 10) => {
            let mut req = OffsetCommitRequest::default()
                .with_group_id(GroupId(r.compact_string()?))
                .with_generation_id_or_member_epoch(r.i32()?)
                .with_member_id(r.compact_string()?)
                .with_group_instance_id(r.compact_nullable_string()?);
            // A topic is at least its id, a partition count and its tagged fields.
            for _ in 0..r.compact_array_len(18)?.unwrap_or(0) {
                let mut topic = OffsetCommitRequestTopic::default().with_topic_id(r.uuid()?);
                // A partition: index, offset, epoch, metadata length and tagged fields.
                for _ in 0..r.compact_array_len(18)?.unwrap_or(0) {
                    let p = OffsetCommitRequestPartition::default()
                        .with_partition_index(r.i32()?)
                        .with_committed_offset(r.i64()?)
                        .with_committed_leader_epoch(r.i32()?)
                        .with_committed_metadata(r.compact_nullable_string()?);
                    r.tagged_fields()?;
                    topic.partitions.push(p);
                }
                r.tagged_fields()?;
                req.topics.push(topic);
            }
            r.tagged_fields()?;
            RequestKind::OffsetCommit(req)
        }
        (ApiKey::OffsetFetch, 10) => {
            let mut req = OffsetFetchRequest::default();
            for _ in 0..r.compact_array_len(7)?.unwrap_or(0) {
                let mut group = OffsetFetchRequestGroup::default()
                    .with_group_id(GroupId(r.compact_string()?))
                    .with_member_id(r.compact_nullable_string()?)
                    .with_member_epoch(r.i32()?);
                group.topics = match r.compact_array_len(18)? {
                    None => None,
                    Some(n) => {
                        let mut topics = Vec::new();
                        for _ in 0..n {
                            let mut t =
                                OffsetFetchRequestTopics::default().with_topic_id(r.uuid()?);
                            for _ in 0..r.compact_array_len(4)?.unwrap_or(0) {
                                t.partition_indexes.push(r.i32()?);
                            }
                            r.tagged_fields()?;
                            topics.push(t);
                        }
                        Some(topics)
                    }
                };
                r.tagged_fields()?;
                req.groups.push(group);
            }
            req.require_stable = r.bool()?;
            r.tagged_fields()?;
            RequestKind::OffsetFetch(req)
        }
        _ => return Err(format!("no decoder for {api_key:?} v{version}")),
    };
    Ok((body, None))
}

/// Encodes the body of a response written by hand ([`How::ByHand`]) into `out`; `None` when
/// `body` at `version` is not one of them.
pub fn encode_response(body: &ResponseKind, version: i16, out: &mut BytesMut) -> Option<()> {
    match (body, version) {
        (ResponseKind::DeleteGroups(r), 3) => encode_delete_groups_v3(r, out),
        (ResponseKind::DescribeLogDirs(r), 5) => encode_describe_log_dirs_v5(r, out),
        _ => return None,
    }
    Some(())
}

/// DeleteGroups v3: each result may say why in words (KIP-1331). Kafka 4.4 sets a message
/// only for its streams topology plugin's failures, which kaas does not have: `null` for every
/// result, as Kafka answers GROUP_ID_NOT_FOUND and NON_EMPTY_GROUP.
fn encode_delete_groups_v3(r: &DeleteGroupsResponse, out: &mut BytesMut) {
    out.put_i32(r.throttle_time_ms);
    put_len(out, r.results.len());
    for g in &r.results {
        put_string(out, Some(&g.group_id.0));
        out.put_i16(g.error_code);
        put_string(out, None);
        out.put_u8(0);
    }
    out.put_u8(0);
}

/// DescribeLogDirs v5: v4 with `is_cordoned` after each directory's usable bytes (KIP-1066,
/// a directory taking no new partitions). kaas has one directory per broker, never cordoned.
fn encode_describe_log_dirs_v5(r: &DescribeLogDirsResponse, out: &mut BytesMut) {
    out.put_i32(r.throttle_time_ms);
    out.put_i16(r.error_code);
    put_len(out, r.results.len());
    for d in &r.results {
        out.put_i16(d.error_code);
        put_string(out, Some(&d.log_dir));
        put_len(out, d.topics.len());
        for t in &d.topics {
            put_string(out, Some(&t.name.0));
            put_len(out, t.partitions.len());
            for p in &t.partitions {
                out.put_i32(p.partition_index);
                out.put_i64(p.partition_size);
                out.put_i64(p.offset_lag);
                out.put_u8(u8::from(p.is_future_key));
                out.put_u8(0);
            }
            out.put_u8(0);
        }
        out.put_i64(d.total_bytes);
        out.put_i64(d.usable_bytes);
        out.put_u8(0); // is_cordoned: false
        out.put_u8(0);
    }
    out.put_u8(0);
}

/// A compact array's or string's length: unsigned varint of length + 1 (0 is null).
fn put_len(out: &mut BytesMut, len: usize) {
    crate::varint::put_uvarint(out, len as u64 + 1);
}

/// A compact nullable string.
fn put_string(out: &mut BytesMut, s: Option<&str>) {
    match s {
        None => out.put_u8(0),
        Some(s) => {
            put_len(out, s.len());
            out.put_slice(s.as_bytes());
        }
    }
}

/// Reads the flexible-version primitives, refusing any length the remaining bytes cannot hold.
struct Reader<'a>(&'a mut Bytes);

impl Reader<'_> {
    fn need(&self, n: usize, what: &str) -> Result<(), String> {
        if self.0.remaining() < n {
            return Err(format!(
                "{what}: {n} bytes needed, {} left",
                self.0.remaining()
            ));
        }
        Ok(())
    }

    fn i32(&mut self) -> Result<i32, String> {
        self.need(4, "int32")?;
        Ok(self.0.get_i32())
    }

    fn i64(&mut self) -> Result<i64, String> {
        self.need(8, "int64")?;
        Ok(self.0.get_i64())
    }

    fn bool(&mut self) -> Result<bool, String> {
        self.need(1, "boolean")?;
        Ok(self.0.get_u8() != 0)
    }

    fn uuid(&mut self) -> Result<uuid::Uuid, String> {
        self.need(16, "uuid")?;
        let mut b = [0u8; 16];
        self.0.copy_to_slice(&mut b);
        Ok(uuid::Uuid::from_bytes(b))
    }

    fn uvarint(&mut self) -> Result<u64, String> {
        let mut v: u64 = 0;
        for i in 0..5 {
            self.need(1, "unsigned varint")?;
            let b = self.0.get_u8();
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("unsigned varint longer than 5 bytes".into())
    }

    /// A compact array's element count (`None`: null), refused when even `min_element`
    /// bytes per element would run past the end.
    fn compact_array_len(&mut self, min_element: usize) -> Result<Option<usize>, String> {
        let n = self.uvarint()?;
        if n == 0 {
            return Ok(None);
        }
        let n = usize::try_from(n - 1).map_err(|e| e.to_string())?;
        if n.saturating_mul(min_element) > self.0.remaining() {
            return Err(format!(
                "array of {n} elements in {} bytes",
                self.0.remaining()
            ));
        }
        Ok(Some(n))
    }

    fn compact_nullable_string(&mut self) -> Result<Option<StrBytes>, String> {
        let n = self.uvarint()?;
        if n == 0 {
            return Ok(None);
        }
        let n = usize::try_from(n - 1).map_err(|e| e.to_string())?;
        self.need(n, "string")?;
        let bytes = self.0.split_to(n);
        StrBytes::from_utf8(bytes)
            .map(Some)
            .map_err(|e| format!("string is not UTF-8: {e}"))
    }

    fn compact_string(&mut self) -> Result<StrBytes, String> {
        self.compact_nullable_string()?
            .ok_or_else(|| "null where a string is required".to_string())
    }

    /// Skips a tagged-field section: none of these versions defines a tag kaas reads.
    fn tagged_fields(&mut self) -> Result<(), String> {
        let n = self.uvarint()?;
        for _ in 0..n {
            let _tag = self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).map_err(|e| e.to_string())?;
            self.need(size, "tagged field")?;
            self.0.advance(size);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{OffsetCommitResponse, OffsetFetchResponse};

    fn unhex(s: &str) -> Bytes {
        let s: String = s.split_whitespace().collect();
        Bytes::from(
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect::<Vec<u8>>(),
        )
    }

    // The vectors below were written by Apache Kafka 4.4's own message classes
    // (`org.apache.kafka.common.message.*Data.write`, kafka-clients-4.4.0.jar), so these tests
    // hold the hand-written codec to the reference implementation byte for byte.
    const TOPIC_ID: &str = "01234567-89ab-cdef-1122-334455667788";

    fn id() -> uuid::Uuid {
        TOPIC_ID.parse().unwrap()
    }

    fn decode(api_key: ApiKey, version: i16, hex: &str) -> (RequestKind, Option<ExpectedBroker>) {
        let mut b = unhex(hex);
        let r = decode_request(api_key, version, &mut b).unwrap();
        assert!(b.is_empty(), "{} bytes left over", b.len());
        r
    }

    /// A response body as the broker writes it: by hand or by the codec, per [`response_how`].
    fn encoded(api_key: ApiKey, body: &ResponseKind, version: i16) -> Bytes {
        let mut out = BytesMut::new();
        match response_how(api_key, version) {
            How::ByHand => encode_response(body, version, &mut out).expect("written here"),
            How::Codec => body.encode(&mut out, version).unwrap(),
            How::Twin(v) => body.encode(&mut out, v).unwrap(),
        }
        out.freeze()
    }

    #[test]
    fn offset_commit_v10_as_kafka_writes_it() {
        let (body, _) = decode(
            ApiKey::OffsetCommit,
            10,
            "026700000005026d00020123456789abcdef11223344556677880300000000000000000000002a\
             00000003056d65746100000000010000000000000007ffffffff00000000",
        );
        let RequestKind::OffsetCommit(r) = body else {
            panic!("{body:?}")
        };
        assert_eq!(
            (
                &*r.group_id.0,
                r.generation_id_or_member_epoch,
                &*r.member_id
            ),
            ("g", 5, "m")
        );
        assert_eq!(r.group_instance_id, None);
        assert_eq!(r.topics.len(), 1);
        assert_eq!(r.topics[0].topic_id, id());
        let p: Vec<_> = r.topics[0]
            .partitions
            .iter()
            .map(|p| {
                (
                    p.partition_index,
                    p.committed_offset,
                    p.committed_leader_epoch,
                    p.committed_metadata.as_deref().map(str::to_string),
                )
            })
            .collect();
        assert_eq!(p, [(0, 42, 3, Some("meta".into())), (1, 7, -1, None)]);

        use kafka_protocol::messages::offset_commit_response::{
            OffsetCommitResponsePartition as P, OffsetCommitResponseTopic as T,
        };
        let resp = OffsetCommitResponse::default().with_topics(vec![T::default()
            .with_topic_id(id())
            .with_partitions(vec![
                P::default().with_partition_index(0),
                P::default().with_partition_index(1).with_error_code(100),
            ])]);
        assert_eq!(
            encoded(ApiKey::OffsetCommit, &ResponseKind::OffsetCommit(resp), 10),
            unhex("00000000020123456789abcdef11223344556677880300000000000000000000010064000000")
        );
    }

    #[test]
    fn offset_fetch_v10_as_kafka_writes_it() {
        let (body, _) = decode(
            ApiKey::OffsetFetch,
            10,
            "030267026d00000003020123456789abcdef1122334455667788030000000000000001000003673200\
             ffffffff00000100",
        );
        let RequestKind::OffsetFetch(r) = body else {
            panic!("{body:?}")
        };
        assert!(r.require_stable);
        assert_eq!(r.groups.len(), 2);
        let g = &r.groups[0];
        assert_eq!(
            (&*g.group_id.0, g.member_id.as_deref(), g.member_epoch),
            ("g", Some("m"), 3)
        );
        let topics = g.topics.as_ref().unwrap();
        assert_eq!(topics[0].topic_id, id());
        assert_eq!(topics[0].partition_indexes, [0, 1]);
        let g2 = &r.groups[1];
        assert_eq!(
            (&*g2.group_id.0, g2.member_id.as_deref(), g2.member_epoch),
            ("g2", None, -1)
        );
        assert!(g2.topics.is_none());

        use kafka_protocol::messages::offset_fetch_response::{
            OffsetFetchResponseGroup as G, OffsetFetchResponsePartitions as P,
            OffsetFetchResponseTopics as T,
        };
        let resp = OffsetFetchResponse::default().with_groups(vec![
            G::default()
                .with_group_id(GroupId(StrBytes::from_static_str("g")))
                .with_topics(vec![T::default().with_topic_id(id()).with_partitions(
                    vec![
                        P::default()
                            .with_partition_index(0)
                            .with_committed_offset(42)
                            .with_committed_leader_epoch(3)
                            .with_metadata(Some(StrBytes::from_static_str("meta"))),
                        P::default()
                            .with_partition_index(1)
                            .with_committed_offset(-1)
                            .with_committed_leader_epoch(-1)
                            .with_metadata(Some(StrBytes::from_static_str(""))),
                    ],
                )]),
            G::default()
                .with_group_id(GroupId(StrBytes::from_static_str("g2")))
                .with_error_code(16),
        ]);
        assert_eq!(
            encoded(ApiKey::OffsetFetch, &ResponseKind::OffsetFetch(resp), 10),
            unhex(
                "00000000030267020123456789abcdef11223344556677880300000000000000000000002a\
                 00000003056d65746100000000000001ffffffffffffffffffffffff01000000000000000367\
                 320100100000"
            )
        );
    }

    #[test]
    fn api_versions_v5_as_kafka_writes_it() {
        let (body, expected) = decode(
            ApiKey::ApiVersions,
            5,
            "0a6b6161732d7465737404312e30046162630000000200",
        );
        let RequestKind::ApiVersions(r) = body else {
            panic!("{body:?}")
        };
        assert_eq!(
            (&*r.client_software_name, &*r.client_software_version),
            ("kaas-test", "1.0")
        );
        assert_eq!(
            expected,
            Some(ExpectedBroker {
                cluster_id: Some("abc".into()),
                node_id: 2
            })
        );
        // The Java client's defaults: no cluster id, node -1.
        let (_, expected) = decode(
            ApiKey::ApiVersions,
            5,
            "0a6b6161732d7465737404312e3000ffffffff00",
        );
        assert_eq!(
            expected,
            Some(ExpectedBroker {
                cluster_id: None,
                node_id: -1
            })
        );
    }

    #[test]
    fn delete_groups_v3_as_kafka_writes_it() {
        use kafka_protocol::messages::delete_groups_response::DeletableGroupResult as R;
        let resp = DeleteGroupsResponse::default().with_results(vec![
            R::default().with_group_id(GroupId(StrBytes::from_static_str("g1"))),
            R::default()
                .with_group_id(GroupId(StrBytes::from_static_str("g2")))
                .with_error_code(69),
        ]);
        assert_eq!(
            encoded(ApiKey::DeleteGroups, &ResponseKind::DeleteGroups(resp), 3),
            unhex("0000000003036731000000000367320045000000")
        );
    }

    #[test]
    fn describe_log_dirs_v5_as_kafka_writes_it() {
        use kafka_protocol::messages::describe_log_dirs_response::{
            DescribeLogDirsPartition as P, DescribeLogDirsResult as D, DescribeLogDirsTopic as T,
        };
        use kafka_protocol::messages::TopicName;
        let resp = DescribeLogDirsResponse::default().with_results(vec![D::default()
            .with_log_dir(StrBytes::from_static_str("/data"))
            .with_total_bytes(1000)
            .with_usable_bytes(600)
            .with_topics(vec![T::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![P::default()
                    .with_partition_index(2)
                    .with_partition_size(4096)])])]);
        assert_eq!(
            encoded(
                ApiKey::DescribeLogDirs,
                &ResponseKind::DescribeLogDirs(resp),
                5
            ),
            unhex(
                "000000000000020000062f6461746102027402000000020000000000001000000000000000000000\
                 000000000000000003e80000000000000258000000"
            )
        );
    }

    #[test]
    fn a_lying_array_length_is_refused_before_allocating() {
        // OffsetCommit v10: group "g", generation 1, member "m", no instance, then a topic
        // array claiming 2^28 topics in the 1 byte left.
        let mut b = unhex("02 67 00000001 02 6d 00 8080808001 00");
        let e = decode_request(ApiKey::OffsetCommit, 10, &mut b).unwrap_err();
        assert!(e.contains("array of"), "{e}");
    }

    #[test]
    fn truncated_bodies_are_refused() {
        for (api_key, version, hex) in [
            (
                ApiKey::OffsetCommit,
                10,
                "026700000005026d00020123456789abcdef11223344556677880300000000000000000000002a\
                 00000003056d65746100000000010000000000000007ffffffff00000000",
            ),
            (
                ApiKey::OffsetFetch,
                10,
                "030267026d00000003020123456789abcdef1122334455667788030000000000000001000003673200\
                 ffffffff00000100",
            ),
            (
                ApiKey::ApiVersions,
                5,
                "0a6b6161732d7465737404312e30046162630000000200",
            ),
        ] {
            let whole = unhex(hex);
            // Every cut short of the whole body, down to the last tagged-fields byte.
            for cut in 0..whole.len() {
                let mut b = whole.slice(..cut);
                assert!(
                    decode_request(api_key, version, &mut b).is_err(),
                    "{api_key:?} cut at {cut}"
                );
            }
            let mut b = whole.clone();
            assert!(decode_request(api_key, version, &mut b).is_ok());
        }
    }
}
