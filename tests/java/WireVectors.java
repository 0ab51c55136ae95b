import java.nio.ByteBuffer;
import java.util.List;

import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.message.ApiVersionsRequestData;
import org.apache.kafka.common.message.DeleteGroupsResponseData;
import org.apache.kafka.common.message.DescribeLogDirsResponseData;
import org.apache.kafka.common.message.OffsetCommitRequestData;
import org.apache.kafka.common.message.OffsetCommitResponseData;
import org.apache.kafka.common.message.OffsetFetchRequestData;
import org.apache.kafka.common.message.OffsetFetchResponseData;
import org.apache.kafka.common.protocol.ByteBufferAccessor;
import org.apache.kafka.common.protocol.Message;
import org.apache.kafka.common.protocol.ObjectSerializationCache;

/**
 * Writes, with Apache Kafka's own message classes, the bodies wire/src/beyond.rs's tests hold
 * the hand-written codec to (one "name hex" line each). tests/test_newest_versions.py runs it
 * and checks that every vector appears in beyond.rs as printed, so a vector can be neither
 * mistyped nor made up.
 */
public class WireVectors {
    static String hex(Message m, int version) {
        ObjectSerializationCache cache = new ObjectSerializationCache();
        ByteBuffer b = ByteBuffer.allocate(m.size(cache, (short) version));
        m.write(new ByteBufferAccessor(b), cache, (short) version);
        StringBuilder s = new StringBuilder();
        for (byte x : b.array()) s.append(String.format("%02x", x));
        return s.toString();
    }

    public static void main(String[] args) {
        Uuid id = new Uuid(0x0123456789abcdefL, 0x1122334455667788L);
        System.out.println("offset_commit_request_v10 " + hex(new OffsetCommitRequestData()
            .setGroupId("g").setGenerationIdOrMemberEpoch(5).setMemberId("m").setGroupInstanceId(null)
            .setTopics(List.of(new OffsetCommitRequestData.OffsetCommitRequestTopic().setTopicId(id)
                .setPartitions(List.of(
                    new OffsetCommitRequestData.OffsetCommitRequestPartition().setPartitionIndex(0)
                        .setCommittedOffset(42).setCommittedLeaderEpoch(3).setCommittedMetadata("meta"),
                    new OffsetCommitRequestData.OffsetCommitRequestPartition().setPartitionIndex(1)
                        .setCommittedOffset(7).setCommittedLeaderEpoch(-1).setCommittedMetadata(null))))),
            10));
        System.out.println("offset_commit_response_v10 " + hex(new OffsetCommitResponseData()
            .setTopics(List.of(new OffsetCommitResponseData.OffsetCommitResponseTopic().setTopicId(id)
                .setPartitions(List.of(
                    new OffsetCommitResponseData.OffsetCommitResponsePartition().setPartitionIndex(0),
                    new OffsetCommitResponseData.OffsetCommitResponsePartition().setPartitionIndex(1)
                        .setErrorCode((short) 100))))),
            10));
        System.out.println("offset_fetch_request_v10 " + hex(new OffsetFetchRequestData()
            .setRequireStable(true).setGroups(List.of(
                new OffsetFetchRequestData.OffsetFetchRequestGroup().setGroupId("g").setMemberId("m")
                    .setMemberEpoch(3).setTopics(List.of(new OffsetFetchRequestData.OffsetFetchRequestTopics()
                        .setTopicId(id).setPartitionIndexes(List.of(0, 1)))),
                new OffsetFetchRequestData.OffsetFetchRequestGroup().setGroupId("g2").setMemberId(null)
                    .setMemberEpoch(-1).setTopics(null))),
            10));
        System.out.println("offset_fetch_response_v10 " + hex(new OffsetFetchResponseData()
            .setGroups(List.of(
                new OffsetFetchResponseData.OffsetFetchResponseGroup().setGroupId("g").setTopics(List.of(
                    new OffsetFetchResponseData.OffsetFetchResponseTopics().setTopicId(id).setPartitions(List.of(
                        new OffsetFetchResponseData.OffsetFetchResponsePartitions().setPartitionIndex(0)
                            .setCommittedOffset(42).setCommittedLeaderEpoch(3).setMetadata("meta"),
                        new OffsetFetchResponseData.OffsetFetchResponsePartitions().setPartitionIndex(1)
                            .setCommittedOffset(-1).setCommittedLeaderEpoch(-1).setMetadata(""))))),
                new OffsetFetchResponseData.OffsetFetchResponseGroup().setGroupId("g2")
                    .setErrorCode((short) 16).setTopics(List.of()))),
            10));
        System.out.println("api_versions_request_v5 " + hex(new ApiVersionsRequestData()
            .setClientSoftwareName("kaas-test").setClientSoftwareVersion("1.0").setClusterId("abc")
            .setNodeId(2), 5));
        System.out.println("api_versions_request_v5_defaults " + hex(new ApiVersionsRequestData()
            .setClientSoftwareName("kaas-test").setClientSoftwareVersion("1.0"), 5));
        DeleteGroupsResponseData deleted = new DeleteGroupsResponseData();
        deleted.results().add(new DeleteGroupsResponseData.DeletableGroupResult().setGroupId("g1"));
        deleted.results().add(new DeleteGroupsResponseData.DeletableGroupResult().setGroupId("g2")
            .setErrorCode((short) 69).setErrorMessage(null));
        System.out.println("delete_groups_response_v3 " + hex(deleted, 3));
        System.out.println("describe_log_dirs_response_v5 " + hex(new DescribeLogDirsResponseData()
            .setResults(List.of(new DescribeLogDirsResponseData.DescribeLogDirsResult()
                .setLogDir("/data").setTotalBytes(1000).setUsableBytes(600).setTopics(List.of(
                    new DescribeLogDirsResponseData.DescribeLogDirsTopic().setName("t").setPartitions(List.of(
                        new DescribeLogDirsResponseData.DescribeLogDirsPartition().setPartitionIndex(2)
                            .setPartitionSize(4096).setOffsetLag(0).setIsFutureKey(false))))))),
            5));
    }
}
