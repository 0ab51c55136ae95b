"""A new topic on a cluster is answered with leaders or not at all.

In cluster mode a topic is created in the shared catalog by whichever broker is asked, and led
only once the controller has placed it in its next assignment file. Metadata used to list the
new topic's partitions at once, each without a leader: kafka-python's producer then picked a
partition, started the record's delivery clock and waited out the placement (kafka-python's own
`test_idempotent_producer`, `send().get(timeout=1)` on an auto-created topic, timed out in CI
against three brokers). Kafka answers a topic still being created with a topic-level
LEADER_NOT_AVAILABLE and no partitions, and holds CreateTopics until the new partitions have
leaders; so does kaas now.

Metadata is sent and decoded with kafka-python's protocol classes over a plain socket
(tests/test_leader_epochs.py's `call`), so the test sees exactly what a client sees.
"""
from __future__ import annotations

import time

import pytest
from kafka import KafkaProducer
from kafka.protocol.metadata import MetadataRequest

from kcheck import admin
from kcluster import _CLUSTERS, Cluster, logs_on_failure
from kwire import send as call

NONE, LEADER_NOT_AVAILABLE = 0, 5


@pytest.fixture
def cluster(tmp_path):
    """Three brokers that auto-create unknown topics with three partitions."""
    c = Cluster(tmp_path / "cluster", 3, auto_create=3)
    _CLUSTERS.append(c)
    try:
        c.start()
        c.wait_controller()
        yield c
    finally:
        c.close()
        _CLUSTERS.remove(c)


def metadata(node, topic: str, auto_create: bool):
    """(topic error, {partition: (leader, partition error)}) as `node` answers Metadata v12."""
    req = MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                              allow_auto_topic_creation=auto_create,
                              include_topic_authorized_operations=False)
    (t,) = call(node, req).topics
    return t.error_code, {p.partition_index: (p.leader_id, p.error_code) for p in t.partitions}


def check_answer(node, topic: str, error: int, partitions: dict) -> bool:
    """Asserts an answer is whole: a retriable 'not yet' without partitions, or every partition
    led. Returns whether it was the latter."""
    if error == LEADER_NOT_AVAILABLE:
        assert not partitions, f"broker {node.id}: {topic} not available, yet lists {partitions}"
        return False
    assert error == NONE, f"broker {node.id}: {topic} error {error}"
    assert sorted(partitions) == [0, 1, 2], f"broker {node.id}: {topic} {partitions}"
    leaderless = {p: v for p, v in partitions.items() if v[0] < 0 or v[1] != NONE}
    assert not leaderless, f"broker {node.id} lists {topic}'s partitions without a leader: {partitions}"
    return True


@logs_on_failure
def test_auto_created_topic_is_listed_only_with_leaders(cluster):
    """Auto-creation through a broker that is not the controller answers LEADER_NOT_AVAILABLE
    until the controller has placed the topic, then every partition with its leader."""
    c = cluster
    controller = c.wait_controller()
    other = next(n for n in c.nodes if n.id != controller.id)
    for round_ in range(3):
        topic = f"auto-{round_}"
        error, partitions = metadata(other, topic, auto_create=True)
        if check_answer(other, topic, error, partitions):
            continue
        deadline = time.monotonic() + 10
        while True:
            error, partitions = metadata(other, topic, auto_create=False)
            if check_answer(other, topic, error, partitions):
                break
            assert time.monotonic() < deadline, f"{topic} still not led after 10 s"
            time.sleep(0.02)


@logs_on_failure
def test_create_topics_returns_once_the_topic_is_led(cluster):
    """CreateTopics (which clients send to the controller) answers only once the controller
    has placed the new partitions: its Metadata lists their leaders right after, and a producer
    bootstrapped through any broker writes to them."""
    from confluent_kafka.admin import NewTopic
    c = cluster
    controller = c.wait_controller()
    for node in c.nodes:
        topic = f"created-via-{node.id}"
        a = admin(node.bootstrap)
        a.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)],
                        request_timeout=30)[topic].result(30)
        error, partitions = metadata(controller, topic, auto_create=False)
        assert check_answer(controller, topic, error, partitions), (
            f"the controller (broker {controller.id}) answered CreateTopics for {topic} before it was led")


@logs_on_failure
def test_idempotent_sends_to_a_new_topic_complete_within_a_second(cluster):
    """kafka-python's test_idempotent_producer, on every broker: ten idempotent sends to a
    topic the first one auto-creates, each acknowledged within one second."""
    c = cluster
    for node in c.nodes:
        topic = f"idempotent-via-{node.id}"
        producer = KafkaProducer(bootstrap_servers=node.bootstrap, enable_idempotence=True)
        try:
            for i in range(10):
                producer.send(topic, value=b"idempotent_msg").get(timeout=1)
        finally:
            producer.close(timeout=5)


@logs_on_failure
def test_create_partitions_returns_once_the_new_partitions_are_led(cluster):
    """CreatePartitions, like CreateTopics, answers only once the controller has placed what it
    added: right after it returns, the broker that answered lists the new partitions with
    leaders (before, partition-level LEADER_NOT_AVAILABLE until the next round), and the other
    brokers do within their next catalog read (1 s), as Kafka's brokers learn metadata.

    The broker that answered is the controller whichever broker the admin client bootstraps
    through: librdkafka sends CreatePartitions to the controller Metadata names. (This test
    once asked the bootstrap broker at once, and failed in CI when that broker had not yet
    read the catalog the controller wrote.)"""
    from confluent_kafka.admin import NewPartitions, NewTopic
    c = cluster
    controller = c.wait_controller()
    for node in c.nodes:
        topic = f"grown-via-{node.id}"
        a = admin(node.bootstrap)
        a.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)],
                        request_timeout=30)[topic].result(30)
        a.create_partitions([NewPartitions(topic, 3)], request_timeout=30)[topic].result(30)
        error, partitions = metadata(controller, topic, auto_create=False)
        assert check_answer(controller, topic, error, partitions), (
            f"the controller (broker {controller.id}) answered CreatePartitions for {topic} "
            "before the new partitions were led")
        for other in c.nodes:
            deadline = time.monotonic() + 5
            while True:
                error, partitions = metadata(other, topic, auto_create=False)
                if error == NONE and sorted(partitions) == [0, 1, 2] and all(
                        leader >= 0 and code == NONE for leader, code in partitions.values()):
                    break
                assert time.monotonic() < deadline, (
                    f"broker {other.id} still lists {topic} as {partitions} 5 s after CreatePartitions")
                time.sleep(0.05)


@logs_on_failure
def test_a_topic_created_through_one_broker_is_led_at_every_other_at_once(cluster):
    """Right after CreateTopics answered through one broker, every other broker's Metadata
    lists the topic with its leaders. The others apply the controller's assignment that places
    the topic milliseconds after the creating broker does, and used to answer "unknown topic"
    meanwhile: kafka-python's admin asked a second broker 6 ms after the creation (its own
    test_list_partition_offsets, in CI). A broker that finds the topics on the volume changed
    now refreshes its view before it answers a topic it does not know."""
    c = cluster
    late = []
    for round_ in range(4):
        for node in c.nodes:
            topic = f"at-once-{round_}-{node.id}"
            create_through(node, topic)
            for other in c.nodes:
                if other is node:
                    continue
                error, partitions = metadata(other, topic, auto_create=False)
                if error != NONE or sorted(partitions) != [0, 1, 2]:
                    late.append((topic, other.id, error, partitions))
                else:
                    check_answer(other, topic, error, partitions)
    assert not late, f"brokers answered a topic created through another without it: {late}"


def create_through(node, topic: str) -> None:
    """CreateTopics v4 (three partitions) sent to `node` itself, answered without error."""
    from kafka.protocol.admin import CreateTopicsRequest
    req = CreateTopicsRequest[4](
        topics=[CreateTopicsRequest.CreatableTopic(
            name=topic, num_partitions=3, replication_factor=1, assignments=[], configs=[])],
        timeout_ms=30_000, validate_only=False)
    (created,) = call(node, req).topics
    assert created.error_code == NONE, created


def describe_topic_partitions(node, topic: str):
    """(topic error, {partition: (leader, partition error)}) as `node` answers
    DescribeTopicPartitions v0 (what the Java admin's describeTopics sends)."""
    from kafka.protocol.admin import DescribeTopicPartitionsRequest as D
    req = D[0](topics=[D.TopicRequest(name=topic)], response_partition_limit=2000, cursor=None)
    (t,) = call(node, req).topics
    return t.error_code, {p.partition_index: (p.leader_id, p.error_code) for p in t.partitions}


def describe_topic_configs(node, topic: str) -> int:
    """The error code of `node`'s DescribeConfigs v4 answer for a topic."""
    from kafka.protocol.admin import DescribeConfigsRequest as C
    req = C[4](resources=[C.DescribeConfigsResource(resource_type=2, resource_name=topic,
                                                    configuration_keys=None)],
               include_synonyms=False, include_documentation=False)
    (r,) = call(node, req).results
    return r.error_code


def alter_topic_configs(node, topic: str) -> int:
    """The error code of `node`'s IncrementalAlterConfigs v1 answer setting a topic's
    retention.ms."""
    from kafka.protocol.admin import IncrementalAlterConfigsRequest as I
    req = I[1](resources=[I.AlterConfigsResource(
        resource_type=2, resource_name=topic, configs=[I.AlterConfigsResource.AlterableConfig(
            name="retention.ms", config_operation=0, value="86400000")])], validate_only=False)
    (r,) = call(node, req).responses
    return r.error_code


@logs_on_failure
def test_a_topic_created_through_one_broker_is_described_at_every_other_at_once(cluster):
    """The Java admin sends describeTopics (DescribeTopicPartitions), describeConfigs and
    incrementalAlterConfigs to whichever broker it likes, and fails on "unknown topic" without
    retrying: `kafka-topics --create` then `--describe`, or a UI creating a topic and showing
    it, against three brokers. Right after CreateTopics answered through one broker, every
    other broker answers each for the new topic, with every partition led. They used to answer
    UNKNOWN_TOPIC_OR_PARTITION until they applied the controller's assignment (Metadata alone
    caught up first)."""
    c = cluster
    late = []
    for round_ in range(3):
        for node in c.nodes:
            for api in ("partitions", "configs", "alter"):
                topic = f"described-{api}-{round_}-{node.id}"
                create_through(node, topic)
                for other in c.nodes:
                    if other is node:
                        continue
                    if api in ("configs", "alter"):
                        ask = describe_topic_configs if api == "configs" else alter_topic_configs
                        error = ask(other, topic)
                        if error != NONE:
                            late.append((topic, other.id, api, error))
                        continue
                    error, partitions = describe_topic_partitions(other, topic)
                    led = sorted(partitions) == [0, 1, 2] and all(
                        leader >= 0 and code == NONE for leader, code in partitions.values())
                    if error != NONE or not led:
                        late.append((topic, other.id, "DescribeTopicPartitions", error, partitions))
    assert not late, f"brokers answered for a topic created through another without it: {late}"


def list_offsets(node, topic: str, partition: int) -> int:
    """The error code of `node`'s ListOffsets v7 answer for a partition's latest offset."""
    from kafka.protocol.consumer.offsets import ListOffsetsRequest as L
    req = L[7](replica_id=-1, isolation_level=0, topics=[L.ListOffsetsTopic(
        name=topic, partitions=[L.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=-1, timestamp=-1)])])
    ((p,),) = [t.partitions for t in call(node, req).topics]
    return p.error_code


@logs_on_failure
def test_the_leader_metadata_names_for_a_new_topic_answers_list_offsets(cluster):
    """librdkafka's offsetsForTimes() sends ListOffsets to the leaders Metadata names and does
    not retry NOT_LEADER_OR_FOLLOWER (its own test 0054_offset_time failed on a cluster: a
    partition of a topic auto-created 0.5 s earlier). Right after CreateTopics answered, the
    broker Metadata names as a partition's leader answers ListOffsets for it: a leader still
    taking the partition over (or still applying the assignment that gives it) finishes first,
    up to 250 ms, instead of answering NOT_LEADER_OR_FOLLOWER."""
    c = cluster
    by_id = {n.id: n for n in c.nodes}
    refused = []
    for round_ in range(4):
        for node in c.nodes:
            topic = f"listed-{round_}-{node.id}"
            create_through(node, topic)
            error, partitions = metadata(node, topic, auto_create=False)
            assert check_answer(node, topic, error, partitions)
            for p, (leader, _) in sorted(partitions.items()):
                code = list_offsets(by_id[leader], topic, p)
                if code != NONE:
                    refused.append((topic, p, leader, code))
    assert not refused, f"leaders Metadata named refused ListOffsets: {refused}"
