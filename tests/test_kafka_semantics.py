"""Behaviour that must match Apache Kafka exactly, found different by librdkafka's own suite
(issue 12, item 6): keyless records on compacted topics, commits for unknown topics,
LogAppendTime, Kafka's full list of topic configs, and a replication factor kaas cannot give."""

from __future__ import annotations

import time

import pytest

from kcheck import admin, create_topic, rdkafka_consumer, unique_topic


def produce_one(bootstrap: str, topic: str, key, value: bytes, timestamp: int = 0, **conf):
    """Produces one record (with CreateTime `timestamp` in ms, or the client's clock when 0)
    and returns the delivery error (None when stored) and message."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "message.timeout.ms": 10000,
                  **conf})
    out = {}
    p.produce(topic, key=key, value=value, partition=0, timestamp=timestamp,
              on_delivery=lambda err, msg: out.update(err=err, msg=msg))
    assert p.flush(15) == 0, "delivery report never came"
    return out["err"], out["msg"]


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_keyless_record_on_compacted_topic_is_invalid(broker, compression):
    """A compacted topic refuses a keyless record with INVALID_RECORD, compressed or not
    (librdkafka 0011); keyed records are stored."""
    from confluent_kafka import KafkaError
    topic = unique_topic("compact")
    create_topic(broker.bootstrap, topic, 1, config={"cleanup.policy": "compact"})
    err, _ = produce_one(broker.bootstrap, topic, None, b"no key", **{
        "compression.type": compression, "enable.idempotence": False, "retries": 0})
    assert err is not None and err.code() == KafkaError.INVALID_RECORD, f"got {err}"
    err, msg = produce_one(broker.bootstrap, topic, b"k", b"keyed",
                           **{"compression.type": compression})
    assert err is None, f"a keyed record was refused: {err}"
    assert msg.offset() == 0, "the refused record took an offset"


def test_commit_for_unknown_topic_is_refused(broker):
    """OffsetCommit (and AlterConsumerGroupOffsets) for a topic that does not exist answers
    UNKNOWN_TOPIC_OR_PARTITION per partition, as Kafka does (librdkafka 0030, 0081); a known
    partition in the same request is committed."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, TopicPartition
    known = unique_topic("known")
    create_topic(broker.bootstrap, known, 1)
    group = unique_topic("g")
    from confluent_kafka import KafkaException
    c = rdkafka_consumer(broker.bootstrap, **{"group.id": group})
    try:
        with pytest.raises(KafkaException) as failed:
            c.commit(offsets=[TopicPartition(known, 0, 7),
                              TopicPartition("no-such-topic-x", 0, 5)], asynchronous=False)
        assert failed.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, failed.value
        # The known partition of the same request was committed.
        committed = c.committed([TopicPartition(known, 0)], timeout=15)
        assert committed[0].offset == 7, committed
    finally:
        c.close()

    a = admin(broker.bootstrap)
    futures = a.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        group, [TopicPartition("no-such-topic-y", 0, 3)])])
    try:
        parts = futures[group].result(timeout=15).topic_partitions
        errs = [tp.error for tp in parts]
    except KafkaException as e:
        errs = [e.args[0]]
    assert errs and all(e is not None and e.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                        for e in errs), errs


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_log_append_time_stamps_broker_time(broker, compression):
    """With message.timestamp.type=LogAppendTime the broker's clock is every record's
    timestamp and the type says so, compressed batches included (librdkafka 0052)."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, TopicPartition
    topic = unique_topic("lat")
    create_topic(broker.bootstrap, topic, 1, config={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20,
                  "compression.type": compression})
    for i in range(10):
        p.produce(topic, value=b"v%d" % i, partition=0, timestamp=1_000_000 + i)
    assert p.flush(15) == 0
    after = int(time.time() * 1000)
    c = rdkafka_consumer(broker.bootstrap)
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 10 and time.monotonic() < deadline:
            for m in c.consume(10, timeout=1.0):
                if m.error() is None:
                    got.append(m.timestamp())
    finally:
        c.close()
    assert len(got) == 10
    for kind, ts in got:
        assert kind == TIMESTAMP_LOG_APPEND_TIME, f"timestamp type {kind}"
        assert before - 1000 <= ts <= after + 1000, f"timestamp {ts} not the broker's time"


def test_every_kafka_topic_config_is_accepted(broker):
    """Topic configs Kafka accepts but kaas has no use for are accepted and described (so
    librdkafka 0077 reaches its compaction checks), not refused."""
    from confluent_kafka.admin import ConfigResource
    topic = unique_topic("cfg")
    configs = {"file.delete.delay.ms": "1000", "max.compaction.lag.ms": "60000",
               "segment.jitter.ms": "5", "preallocate": "true",
               "message.timestamp.after.max.ms": "3600000", "cleanup.policy": "compact"}
    create_topic(broker.bootstrap, topic, 1, config=configs)
    a = admin(broker.bootstrap)
    res = ConfigResource("topic", topic)
    described = a.describe_configs([res])[res].result(timeout=15)
    for k, v in configs.items():
        assert described[k].value == v, f"{k}: {described[k].value!r}"


def test_replication_factor_three_says_why(broker):
    """A replication factor above one is refused with INVALID_REPLICATION_FACTOR and a
    message that says kaas keeps one copy, not a broker count that contradicts Metadata."""
    from confluent_kafka.admin import NewTopic
    a = admin(broker.bootstrap)
    f = a.create_topics([NewTopic(unique_topic("rf"), 1, 3)])
    with pytest.raises(Exception) as failed:
        list(f.values())[0].result(timeout=15)
    text = str(failed.value)
    assert "INVALID_REPLICATION_FACTOR" in text or "eplication" in text, text
    assert "one copy" in text, text
    assert "available brokers" not in text, text


def test_transactional_producer_fails_fast_with_a_reason(broker):
    """init_transactions() fails within seconds, fatally, saying that kaas does not serve
    transactions (it retried UNSUPPORTED_VERSION for its whole 15 s timeout before)."""
    from confluent_kafka import KafkaException, Producer
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tx-1"})
    started = time.monotonic()
    with pytest.raises(KafkaException) as failed:
        p.init_transactions(30)
    elapsed = time.monotonic() - started
    err = failed.value.args[0]
    assert "transactions" in err.str(), err.str()
    assert err.fatal() or not err.retriable(), err.str()
    assert elapsed < 10, f"took {elapsed:.1f} s to fail"


def test_timestamps_far_ahead_of_the_broker_are_refused(broker):
    """Kafka 4's message.timestamp.after.max.ms (default one hour): a record stamped two hours
    ahead of the broker's clock is refused with INVALID_TIMESTAMP and not stored; half an hour
    ahead and any age behind are stored. A topic's own window applies both ways."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    topic = unique_topic("clock")
    create_topic(broker.bootstrap, topic, 1)
    now = int(time.time() * 1000)
    hour = 3_600_000
    no_retry = {"enable.idempotence": False, "retries": 0}
    err, _ = produce_one(broker.bootstrap, topic, b"k", b"ahead", timestamp=now + 2 * hour, **no_retry)
    assert err is not None and err.code() == KafkaError.INVALID_TIMESTAMP, f"got {err}"
    err, msg = produce_one(broker.bootstrap, topic, b"k", b"soon", timestamp=now + hour // 2)
    assert err is None and msg.offset() == 0, f"got {err}; the refused record took no offset"
    err, msg = produce_one(broker.bootstrap, topic, b"k", b"2001", timestamp=1_000_000_000_000)
    assert err is None and msg.offset() == 1, f"got {err}"

    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("message.timestamp.after.max.ms", str(3 * hour),
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("message.timestamp.before.max.ms", str(hour),
                    incremental_operation=AlterConfigOpType.SET)])
    a = admin(broker.bootstrap)  # held: a destroyed client fails its futures
    a.incremental_alter_configs([res])[res].result(15)
    deadline = time.monotonic() + 10
    while True:  # Kafka applies a config change within moments, not at once
        err, msg = produce_one(broker.bootstrap, topic, b"k", b"later", timestamp=now + 2 * hour)
        if err is None or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert err is None and msg.offset() == 2, f"got {err}"
    err, _ = produce_one(broker.bootstrap, topic, b"k", b"old", timestamp=now - 2 * hour, **no_retry)
    assert err is not None and err.code() == KafkaError.INVALID_TIMESTAMP, f"got {err}"


def test_a_refused_acks0_write_closes_the_connection(broker):
    """acks=0 gets no response, so a refused write (here: a partition the topic does not have)
    closes the connection, as Kafka does: only that makes the client notice and refresh its
    metadata. Before, kaas kept the connection, and after a leader moved an acks=0 producer
    went on sending to a broker that dropped everything. A stored acks=0 write keeps the
    connection open."""
    import kwire
    topic = unique_topic("acks0")
    create_topic(broker.bootstrap, topic, 1)
    version = kwire.pick_produce_version(kwire.api_versions(broker))
    batch = kwire.record_batch([(None, b"v")])
    with kwire.connect(broker) as s:
        s.settimeout(10)
        s.sendall(kwire.produce_request(version, 1, topic, 0, batch, acks=0))
        s.sendall(kwire.request(18, 0, 2, b""))       # ApiVersions: answered, so still open
        assert kwire.parse_api_versions_v0(kwire.recv_frame(s)[4:])[0] == 0
        s.sendall(kwire.produce_request(version, 3, topic, 7, batch, acks=0))
        assert kwire.wait_closed(s, 10) == b"", "acks=0 got a response"
    records, ends = rdkafka_read_all_one(broker.bootstrap, topic)
    assert ends == 1 and records == [b"v"]


def rdkafka_read_all_one(bootstrap: str, topic: str):
    from kcheck import rdkafka_read_all
    records, ends = rdkafka_read_all(bootstrap, topic, 1, timeout=30)
    return [v for _, _, _, v in records], ends[0]


@pytest.mark.parametrize("topic_codec,producer_codec,attribute",
                         [("gzip", "none", 1), ("zstd", "lz4", 4), ("uncompressed", "lz4", 0),
                          ("producer", "snappy", 2)])
def test_a_topics_compression_type_is_how_it_stores_batches(broker, topic_codec, producer_codec,
                                                             attribute):
    """A topic's `compression.type` is the codec its stored batches have, whatever the
    producer used, as Kafka recompresses (`producer` keeps the producer's). kaas stored every
    batch as the producer sent it (found side by side with Kafka 4.4). The records read back
    whole with librdkafka."""
    from confluent_kafka import Producer
    if broker.external:
        pytest.skip("reads the broker's segment files")
    topic = unique_topic(f"ct-{topic_codec}")
    create_topic(broker.bootstrap, topic, 1, config={"compression.type": topic_codec})
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": producer_codec,
                  "linger.ms": 20})
    for i in range(50):
        p.produce(topic, value=b"record-%d " % i * 20, partition=0)
    assert p.flush(30) == 0
    segments = sorted(broker.data_dir.glob(f"{topic}~*/0/*.log"))
    data = segments[0].read_bytes()
    codecs, at = set(), 0
    while at + 61 <= len(data):
        length = int.from_bytes(data[at + 8:at + 12], "big")
        codecs.add(int.from_bytes(data[at + 21:at + 23], "big") & 7)
        at += 12 + length
    assert codecs == {attribute}, f"stored codecs {codecs}, topic {topic_codec}"
    from kcheck import rdkafka_read_all
    records, ends = rdkafka_read_all(broker.bootstrap, topic, 1, timeout=30)
    assert [v for _, _, _, v in records] == [b"record-%d " % i * 20 for i in range(50)]
