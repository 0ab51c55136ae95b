"""Kafka API semantics a user relies on, checked through librdkafka (confluent-kafka) and a
few raw requests: auto-creation, acks 0/1, ListOffsets by timestamp, DeleteRecords,
DescribeCluster and topic ids, fetch long-poll, idempotent retries and sequence checks, and
what survives a restart."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import (OFFSET_BEGINNING, OFFSET_END, Producer, TopicCollection,
                             TopicPartition)
from confluent_kafka.admin import ConfigResource, NewTopic, OffsetSpec

import kwire
from kcheck import (admin, create_topic, rdkafka_consumer, rdkafka_read_all, unique_topic,
                    watermarks)

OUT_OF_ORDER_SEQUENCE_NUMBER = 45

state: dict = {}


def produce_plain(bootstrap, topic, items, **conf):
    """Produce (key, value, timestamp_ms|None) with the given producer config; returns the
    delivery reports as [(partition, offset)]."""
    p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 30000, **conf})
    reports, errors = [], []

    def cb(err, m):
        (errors if err else reports).append(err or (m.partition(), m.offset()))

    for key, value, ts in items:
        kw = {"timestamp": ts} if ts is not None else {}
        p.produce(topic, key=key, value=value, on_delivery=cb, **kw)
        p.poll(0)
    assert p.flush(40) == 0
    assert not errors, errors
    return reports


def test_auto_create_on_produce(broker):
    """Producing to a topic that does not exist creates it (auto-creation on) with the default
    partition count, and the first record lands at offset 0."""
    topic = unique_topic("auto")
    reports = produce_plain(broker.bootstrap, topic, [(b"k", b"v", None)], acks="all")
    assert reports == [(0, 0)]
    md = admin(broker.bootstrap).list_topics(topic, timeout=10)
    assert len(md.topics[topic].partitions) == 1


def test_acks_zero_and_one(broker):
    """acks=1 reports real offsets and acks=0 reports none, and every record of both is
    stored."""
    topic = unique_topic("acks")
    create_topic(broker.bootstrap, topic, 1)
    r1 = produce_plain(broker.bootstrap, topic,
                       [(b"a1", b"one-%d" % i, None) for i in range(500)],
                       acks=1, **{"enable.idempotence": False})
    assert [o for _, o in r1] == list(range(500))
    r0 = produce_plain(broker.bootstrap, topic,
                       [(b"a0", b"zero-%d" % i, None) for i in range(500)],
                       acks=0, **{"enable.idempotence": False})
    assert len(r0) == 500 and all(o is None or o < 0 for _, o in r0), r0[:3]
    deadline = time.monotonic() + 10
    while True:  # acks=0: nothing to wait on but the log itself
        records, ends = rdkafka_read_all(broker.bootstrap, topic, 1, timeout=30)
        if ends[0] >= 1000 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    values = [v for _, _, _, v in records]
    assert values == [b"one-%d" % i for i in range(500)] + [b"zero-%d" % i for i in range(500)]


def test_list_offsets_by_timestamp(broker):
    """ListOffsets answers earliest, latest, the first offset at or after a timestamp, and
    the offset of the largest timestamp, from the records' CreateTime."""
    topic = unique_topic("ts")
    create_topic(broker.bootstrap, topic, 1)
    t0 = int(time.time() * 1000) - 3_600_000
    stamps = [t0 + 1000 * i for i in range(10)]
    stamps[6] = t0 + 50_000  # max timestamp sits in the middle
    produce_plain(broker.bootstrap, topic, [(b"k", b"v%d" % i, ts) for i, ts in
                                            enumerate(stamps)], acks="all")
    tp = TopicPartition(topic, 0)
    a = admin(broker.bootstrap)

    def lookup(spec):
        return a.list_offsets({tp: spec}, request_timeout=10)[tp].result(15)

    mx = lookup(OffsetSpec.max_timestamp())
    got = {
        "earliest": lookup(OffsetSpec.earliest()).offset,
        "latest": lookup(OffsetSpec.latest()).offset,
        "ts=t0": lookup(OffsetSpec.for_timestamp(t0)).offset,
        "ts=t0+3.5s": lookup(OffsetSpec.for_timestamp(t0 + 3500)).offset,
        "ts=t0+100s": lookup(OffsetSpec.for_timestamp(t0 + 100_000)).offset,
        "max_timestamp": (mx.offset, mx.timestamp),
    }
    want = {"earliest": 0, "latest": 10, "ts=t0": 0, "ts=t0+3.5s": 4, "ts=t0+100s": -1,
            "max_timestamp": (6, t0 + 50_000)}
    assert got == want, f"ListOffsets (10 records produced together, so likely in one batch): got {got}, want {want}"
    c = rdkafka_consumer(broker.bootstrap)
    try:
        [got] = c.offsets_for_times([TopicPartition(topic, 0, t0 + 7000)], timeout=10)
        assert got.offset == 6, f"first offset with timestamp >= t0+7s is 6, got {got.offset}"
    finally:
        c.close()


def test_delete_records(broker):
    """DeleteRecords moves the log start offset; reading from the beginning then starts there
    and the high watermark is unchanged."""
    topic = unique_topic("delrec")
    create_topic(broker.bootstrap, topic, 2)
    # Keyed, so the murmur2 partitioner spreads the records deterministically over both
    # partitions (keyless records may all stick to one partition).
    reports = produce_plain(broker.bootstrap, topic,
                            [(b"k%d" % i, b"r%d" % i, None) for i in range(100)], acks="all")
    assert sum(1 for p, _ in reports if p == 0) > 20, reports
    a = admin(broker.bootstrap)
    c = rdkafka_consumer(broker.bootstrap)
    try:
        hi = watermarks(c, TopicPartition(topic, 0))[1]
        assert hi > 20
        res = a.delete_records([TopicPartition(topic, 0, 20)], request_timeout=10)
        [(tp, fut)] = list(res.items())
        out = fut.result(15)
        assert out.low_watermark == 20, out
        assert watermarks(c, TopicPartition(topic, 0)) == (20, hi)
    finally:
        c.close()
    c = rdkafka_consumer(broker.bootstrap, **{"auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        first = None
        deadline = time.monotonic() + 20
        while first is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                first = m.offset()
        assert first == 20, f"first record read from the beginning is at {first}"
    finally:
        c.close()
    state["delrec"] = (topic, hi)


def test_topic_names_assignments_and_delete_policy_as_kafka(broker):
    """Found with sarama and kafkajs, each compared with Kafka 4.4:
    * a 249-character name (Kafka's limit) made a topic whose directory name was longer than
      the file system takes, so every write to it failed; now it takes records and reads them;
    * `x_y` next to `x.y` is refused as Kafka refuses it (INVALID_TOPIC_EXCEPTION);
    * `__consumer_offsets` and `__transaction_state` were created as ordinary topics (by
      CreateTopics, by a produce, by a Metadata request); now they are refused and unknown;
    * DeleteRecords on a compact-only topic is refused with POLICY_VIOLATION, as Kafka does;
    * a replica assignment naming a broker that does not exist (CreateTopics, CreatePartitions)
      was accepted silently; Kafka refuses it with INVALID_REPLICA_ASSIGNMENT."""
    from confluent_kafka import KafkaError, KafkaException
    a = admin(broker.bootstrap)
    longest = unique_topic("L").ljust(249, "L")
    create_topic(broker.bootstrap, longest, 1)
    reports = produce_plain(broker.bootstrap, longest,
                            [(b"k%d" % i, b"v%d" % i, None) for i in range(50)], acks="all")
    assert [o for _, o in reports] == list(range(50))
    records, ends = rdkafka_read_all(broker.bootstrap, longest, 1)
    assert [r[3] for r in records] == [b"v%d" % i for i in range(50)] and ends == {0: 50}

    def create_error(name):
        fut = a.create_topics([NewTopic(name, 1, 1)], request_timeout=10)[name]
        with pytest.raises(KafkaException) as e:
            fut.result(15)
        return e.value.args[0]

    dotted = unique_topic("orders") + ".eu"
    create_topic(broker.bootstrap, dotted, 1)
    err = create_error(dotted.replace(".", "_"))
    assert err.code() == KafkaError.TOPIC_EXCEPTION, err
    assert f"collides with existing topic: {dotted}" in err.str(), err
    for name in ("__consumer_offsets", "__transaction_state"):
        err = create_error(name)
        assert err.code() == KafkaError.TOPIC_EXCEPTION and "reserved" in err.str(), err
        # A Metadata request naming it, auto-creation allowed, does not create it either.
        p = Producer({"bootstrap.servers": broker.bootstrap, "allow.auto.create.topics": True})
        md = p.list_topics(name, timeout=10).topics[name]
        assert md.error is not None and md.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, md
    assert not {"__consumer_offsets", "__transaction_state"} & set(
        a.list_topics(timeout=10).topics)

    from confluent_kafka.admin import NewPartitions
    made_up = unique_topic("assigned")
    fut = a.create_topics([NewTopic(made_up, 1, replica_assignment=[[42]])],
                          request_timeout=10)[made_up]
    with pytest.raises(KafkaException) as e:
        fut.result(15)
    assert e.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT, e.value
    assert "broker 42" in e.value.args[0].str(), e.value
    # Partitions 0 and 2: Kafka refuses the gap (kaas renumbered it to 0 and 1).
    gap = kwire.create_topic_assigned(broker, made_up, {0: [0], 2: [0]})
    assert gap == 39, f"CreateTopics with partitions 0 and 2 answered {gap}"  # INVALID_REPLICA_ASSIGNMENT
    fut = a.create_partitions([NewPartitions(dotted, 2, replica_assignment=[[42]])],
                              request_timeout=10)[dotted]
    with pytest.raises(KafkaException) as e:
        fut.result(15)
    assert e.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT, e.value
    assert len(a.list_topics(dotted, timeout=10).topics[dotted].partitions) == 1
    assert made_up not in a.list_topics(timeout=10).topics

    compacted = unique_topic("compacted")
    create_topic(broker.bootstrap, compacted, 1, config={"cleanup.policy": "compact"})
    produce_plain(broker.bootstrap, compacted, [(b"k%d" % i, b"v", None) for i in range(10)],
                  acks="all")
    [(_, fut)] = list(a.delete_records([TopicPartition(compacted, 0, 5)],
                                       request_timeout=10).items())
    with pytest.raises(KafkaException) as e:
        fut.result(15)
    assert e.value.args[0].code() == KafkaError.POLICY_VIOLATION, e.value
    c = rdkafka_consumer(broker.bootstrap)
    try:
        assert watermarks(c, TopicPartition(compacted, 0)) == (0, 10)
    finally:
        c.close()


def test_describe_cluster_and_topic_ids(broker):
    """DescribeCluster names one broker at the advertised address and a cluster id; topics
    carry real, stable topic ids."""
    a = admin(broker.bootstrap)
    cl = a.describe_cluster(request_timeout=10).result(15)
    assert cl.cluster_id, cl
    assert [(n.host, n.port) for n in cl.nodes] == [(broker.host, broker.port)], cl.nodes
    assert cl.controller is not None
    topic = unique_topic("ids")
    create_topic(broker.bootstrap, topic, 3)
    d1 = a.describe_topics(TopicCollection([topic]), request_timeout=10)[topic].result(15)
    d2 = a.describe_topics(TopicCollection([topic]), request_timeout=10)[topic].result(15)
    assert str(d1.topic_id) not in ("", "AAAAAAAAAAAAAAAAAAAAAA", "None"), d1.topic_id
    assert str(d1.topic_id) == str(d2.topic_id)
    assert len(d1.partitions) == 3
    other = unique_topic("ids")
    create_topic(broker.bootstrap, other, 1)
    d3 = a.describe_topics(TopicCollection([other]), request_timeout=10)[other].result(15)
    assert str(d3.topic_id) != str(d1.topic_id)
    state["ids"] = (topic, str(d1.topic_id))


def test_describe_cluster_refuses_endpoint_types_a_broker_does_not_serve(broker):
    """DescribeCluster v1 for the controllers' endpoints (type 2) is MISMATCHED_ENDPOINT_TYPE
    and an endpoint type that does not exist UNSUPPORTED_ENDPOINT_TYPE, as a Kafka broker
    answers: kaas described its brokers whatever was asked, so an admin client asking for the
    controllers took the brokers for them."""
    from kafka.protocol.admin import DescribeClusterRequest as DC

    def ask(endpoint_type):
        return kwire.send(broker, DC[1](include_cluster_authorized_operations=False,
                                         endpoint_type=endpoint_type))

    brokers = ask(1)
    assert brokers.error_code == 0 and brokers.brokers, brokers
    controllers = ask(2)
    assert (controllers.error_code, controllers.brokers) == (114, []), controllers
    assert "CONTROLLER" in controllers.error_message
    for unknown in (0, 5):
        r = ask(unknown)
        assert (r.error_code, r.brokers) == (115, []), r
        assert f"type {unknown}" in r.error_message


def test_authorized_operations_as_kafka_without_an_authorizer(broker):
    """Asked for, the authorized operations are what Kafka grants every client when it has no
    authorizer: every operation the resource type supports (librdkafka's 0081 compares them).
    Not asked for, they are absent."""
    from confluent_kafka import Consumer
    a = admin(broker.bootstrap)
    cl = a.describe_cluster(request_timeout=10, include_authorized_operations=True).result(15)
    assert sorted(op.name for op in cl.authorized_operations) == sorted(
        ["CREATE", "ALTER", "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS",
         "IDEMPOTENT_WRITE"]), cl.authorized_operations
    assert not a.describe_cluster(request_timeout=10).result(15).authorized_operations
    topic = unique_topic("ops")
    create_topic(broker.bootstrap, topic, 1)
    d = a.describe_topics(TopicCollection([topic]), request_timeout=10,
                          include_authorized_operations=True)[topic].result(15)
    assert sorted(op.name for op in d.authorized_operations) == sorted(
        ["READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS",
         "ALTER_CONFIGS"]), d.authorized_operations
    group = unique_topic("opsgroup")
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while not c.assignment() and time.monotonic() < deadline:
            c.poll(0.2)
        assert c.assignment(), "the consumer joined its group"
        desc = a.describe_consumer_groups([group], request_timeout=10,
                                          include_authorized_operations=True)[group].result(15)
        # Kafka 4.4 grants a group's configs too (AclEntry.supportedOperations).
        assert sorted(op.name for op in desc.authorized_operations) == [
            "ALTER_CONFIGS", "DELETE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ"], (
            desc.authorized_operations)
    finally:
        c.close()


def test_create_topics_validate_only_and_configs(broker):
    """CreateTopics with validate_only creates nothing; a topic created with configs reports
    them through DescribeConfigs."""
    a = admin(broker.bootstrap)
    topic = unique_topic("validate")
    a.create_topics([NewTopic(topic, 3, 1)], validate_only=True,
                    request_timeout=10)[topic].result(15)
    time.sleep(0.5)
    assert topic not in a.list_topics(timeout=10).topics
    create_topic(broker.bootstrap, topic, 2, config={"retention.ms": "123456789",
                                                      "cleanup.policy": "delete"})
    res = ConfigResource("topic", topic)
    cfg = a.describe_configs([res], request_timeout=10)[res].result(15)
    assert cfg["retention.ms"].value == "123456789"
    assert cfg["cleanup.policy"].value == "delete"
    state["cfg"] = topic


def fetch_requests(stats: dict) -> int:
    return sum(b.get("req", {}).get("Fetch", 0) for b in stats.get("brokers", {}).values()
               if b.get("nodeid", -1) >= 0)


def test_idle_consumer_long_polls(broker):
    """A consumer at the end of an empty partition waits in long-poll Fetches (no busy
    loop), and a record produced meanwhile reaches it promptly."""
    topic = unique_topic("longpoll")
    create_topic(broker.bootstrap, topic, 1)
    stats = []
    c = rdkafka_consumer(broker.bootstrap, **{"fetch.wait.max.ms": 500,
                                              "statistics.interval.ms": 1000,
                                              "stats_cb": lambda s: stats.append(json.loads(s))})
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_END)])
        t_end = time.monotonic() + 4
        while time.monotonic() < t_end:
            m = c.poll(0.2)
            assert m is None or m.error() is not None, "record out of nowhere"
        first, last = stats[0], stats[-1]
        n = fetch_requests(last) - fetch_requests(first)
        secs = (last["ts"] - first["ts"]) / 1e6
        assert secs > 1.5, "too few statistics samples"
        # with max_wait 500 ms honoured: about 2 Fetches per second; a broker that answers
        # empty fetches at once makes librdkafka spin at hundreds per second
        assert n <= 6 * secs + 4, f"{n} Fetch requests in {secs:.1f}s while idle"
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
        t0 = time.monotonic()
        p.produce(topic, value=b"wake-up")
        assert p.flush(10) == 0
        got = None
        while got is None and time.monotonic() - t0 < 10:
            m = c.poll(0.05)
            if m is not None and m.error() is None:
                got = m
        latency = time.monotonic() - t0
        assert got is not None and got.value() == b"wake-up"
        assert latency < 2.0, f"record reached the waiting consumer after {latency:.2f}s"
    finally:
        c.close()


def test_idempotent_retry_and_sequence_checks(broker):
    """With a producer id from InitProducerId, a retried batch (same sequence) gets its
    original offset and is stored once; the next sequence appends; a sequence gap, and a batch
    that goes back before the stored sequence, get OUT_OF_ORDER_SEQUENCE_NUMBER and are not
    stored."""
    topic = unique_topic("idem")
    create_topic(broker.bootstrap, topic, 1)
    ranges = kwire.api_versions(broker)
    version = kwire.pick_produce_version(ranges)
    pid, epoch = kwire.init_producer_id(broker, ranges)
    assert pid >= 0 and epoch >= 0

    def batch(seq, n, tag):
        return kwire.record_batch([(b"k", b"%s-%d" % (tag, i)) for i in range(n)],
                                  producer_id=pid, producer_epoch=epoch, base_sequence=seq)

    with kwire.connect(broker) as s:
        s.settimeout(15)

        def send(corr, b):
            return kwire.produce(s, version, corr, topic, 0, b)

        first = batch(0, 3, b"a")
        assert send(1, first) == (0, 0)
        assert send(2, first) == (0, 0), "retried batch did not return its original offset"
        assert send(3, batch(3, 2, b"b")) == (0, 3)
        err, _ = send(4, batch(10, 1, b"gap"))
        assert err == OUT_OF_ORDER_SEQUENCE_NUMBER, f"sequence gap: error {err}, want 45"
        err, _ = send(5, batch(1, 2, b"rewind"))
        assert err == OUT_OF_ORDER_SEQUENCE_NUMBER, f"sequence rewind: error {err}, want 45"
        assert send(6, batch(5, 1, b"c")) == (0, 5)
    records, ends = rdkafka_read_all(broker.bootstrap, topic, 1, timeout=30)
    assert ends == {0: 6}
    assert [v for _, _, _, v in records] == [b"a-0", b"a-1", b"a-2", b"b-0", b"b-1", b"c-0"]


@pytest.mark.restart
def test_metadata_survives_restart(broker):
    """After a clean restart topic ids, topic configs and the log start offset moved by
    DeleteRecords are unchanged."""
    if not {"ids", "cfg", "delrec"} <= set(state):
        pytest.skip("needs the earlier tests of this module")
    broker.restart()
    a = admin(broker.bootstrap)
    topic, tid = state["ids"]
    d = a.describe_topics(TopicCollection([topic]), request_timeout=10)[topic].result(15)
    assert str(d.topic_id) == tid, "topic id changed across restart"
    res = ConfigResource("topic", state["cfg"])
    cfg = a.describe_configs([res], request_timeout=10)[res].result(15)
    assert cfg["retention.ms"].value == "123456789"
    dtopic, hi = state["delrec"]
    c = rdkafka_consumer(broker.bootstrap)
    try:
        assert watermarks(c, TopicPartition(dtopic, 0)) == (20, hi)
    finally:
        c.close()


def test_kafkas_dynamic_broker_configs(broker_factory):
    """Kafka's dynamic broker configs are accepted as in Kafka (librdkafka's 0081 sets
    sasl.kerberos.min.time.before.relogin, which kaas refused with INVALID_CONFIG): ones kaas
    has no equivalent for are stored and described, a malformed value is refused, and
    max.connections.per.ip takes effect at once, survives a restart, and deleting it goes back
    to the flag."""
    import socket
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ResourceType
    b = broker_factory()
    a = admin(b.bootstrap)
    [broker_id] = [str(i) for i in a.list_topics(timeout=10).brokers]
    res = lambda *entries: ConfigResource(ResourceType.BROKER, broker_id, incremental_configs=list(entries))  # noqa: E731
    futs = a.incremental_alter_configs([res(
        ConfigEntry("sasl.kerberos.min.time.before.relogin", "58000",
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("background.threads", "9", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("ssl.keystore.password", "secret", incremental_operation=AlterConfigOpType.SET),
    )])
    for f in futs.values():
        f.result(15)

    def described():
        [f] = a.describe_configs([ConfigResource(ResourceType.BROKER, broker_id)]).values()
        return f.result(15)

    cfg = described()
    assert cfg["sasl.kerberos.min.time.before.relogin"].value == "58000"
    assert cfg["background.threads"].value == "9"
    assert cfg["ssl.keystore.password"].is_sensitive and cfg["ssl.keystore.password"].value is None

    bad = a.incremental_alter_configs([res(ConfigEntry(
        "background.threads", "many", incremental_operation=AlterConfigOpType.SET))])
    with pytest.raises(KafkaException) as e:
        for f in bad.values():
            f.result(15)
    assert e.value.args[0].code() == 40, e.value  # INVALID_CONFIG
    assert described()["background.threads"].value == "9", "a refused change changes nothing"

    def refused_after(limit_probe: int) -> int:
        """Opens plain connections until one is closed at once; returns how many stayed open."""
        socks = []
        try:
            for _ in range(limit_probe):
                s = socket.create_connection((b.host, b.port), timeout=5)
                socks.append(s)
                s.settimeout(0.5)
                try:
                    if s.recv(1) == b"":
                        return len(socks) - 1
                except socket.timeout:
                    pass
            return len(socks)
        finally:
            for s in socks:
                s.close()

    for f in a.incremental_alter_configs([res(ConfigEntry(
            "max.connections.per.ip", "4", incremental_operation=AlterConfigOpType.SET))]).values():
        f.result(15)
    time.sleep(0.5)
    # The admin client holds one or two connections of the four.
    held = refused_after(10)
    assert 1 <= held <= 3, f"{held} more connections were admitted past max.connections.per.ip=4"
    a = None
    b.restart()
    a = admin(b.bootstrap)
    held = refused_after(10)
    assert held <= 3, f"after a restart, {held} more connections were admitted past the limit"
    for f in a.incremental_alter_configs([res(ConfigEntry(
            "max.connections.per.ip", "", incremental_operation=AlterConfigOpType.DELETE))]).values():
        f.result(15)
    time.sleep(0.5)
    assert refused_after(10) == 10, "deleting max.connections.per.ip went back to the flag"
    assert described()["sasl.kerberos.min.time.before.relogin"].value == "58000"

    # APPEND and SUBTRACT on a list start from the effective value, the default included, as in
    # Kafka: librdkafka's 0081 appends and then subtracts "compact", and the broker's default
    # stayed "compact", so every later topic refused keyless records (0081 ListOffsets, 0086).
    for op, want in ((AlterConfigOpType.APPEND, "delete,compact"),
                     (AlterConfigOpType.SUBTRACT, "delete")):
        for f in a.incremental_alter_configs([res(ConfigEntry(
                "log.cleanup.policy", "compact", incremental_operation=op))]).values():
            f.result(15)
        assert described()["log.cleanup.policy"].value == want, op
    topic = unique_topic("after-subtract")
    create_topic(b.bootstrap, topic, 1)
    produce_plain(b.bootstrap, topic, [(None, b"keyless", None)], acks="all")


def test_broker_configs_kafka_does_not_define_or_cannot_change(broker_factory):
    """AlterConfigs on a broker as Kafka 4.4 answers it (checked against Kafka 4.4 on
    2026-12-06): a name Kafka does not define is stored and described back as sensitive
    without its value (kaas refused KafkaJS's "alter broker configs", which sets
    `cleanup.policy` on a broker); a config Kafka defines as static is refused with
    INVALID_REQUEST; a dynamic topic default kaas refused before (`log.message.timestamp.type`)
    is accepted and takes effect on a topic that does not set it; and DescribeConfigs lists
    named configs in the order asked (KafkaJS reads two by position)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ResourceType
    from kafka.protocol.admin import DescribeConfigsRequest
    b = broker_factory()
    a = admin(b.bootstrap)
    [broker_id] = [str(i) for i in a.list_topics(timeout=10).brokers]

    # Legacy AlterConfigs, as KafkaJS sends it, then IncrementalAlterConfigs.
    for f in a.alter_configs([ConfigResource(ResourceType.BROKER, broker_id,
                                             set_config={"cleanup.policy": "delete"})]).values():
        f.result(15)
    for f in a.incremental_alter_configs([ConfigResource(
            ResourceType.BROKER, broker_id, incremental_configs=[
                ConfigEntry("cleanup.policy", "delete",
                            incremental_operation=AlterConfigOpType.SET),
                ConfigEntry("no.such.kafka.config", "x",
                            incremental_operation=AlterConfigOpType.SET)])]).values():
        f.result(15)
    [f] = a.describe_configs([ConfigResource(ResourceType.BROKER, broker_id)]).values()
    cfg = f.result(15)
    for name in ("cleanup.policy", "no.such.kafka.config"):
        assert cfg[name].is_sensitive and cfg[name].value is None, cfg[name]

    refused = a.incremental_alter_configs([ConfigResource(
        ResourceType.BROKER, broker_id, incremental_configs=[ConfigEntry(
            "log.dirs", "/elsewhere", incremental_operation=AlterConfigOpType.SET)])])
    with pytest.raises(KafkaException) as e:
        for f in refused.values():
            f.result(15)
    assert e.value.args[0].code() == 42, e.value  # INVALID_REQUEST
    assert "Cannot update these configs dynamically: [log.dirs]" in str(e.value), e.value

    # This broker's default, then a topic without its own.
    for f in a.incremental_alter_configs([ConfigResource(
            ResourceType.BROKER, broker_id, incremental_configs=[ConfigEntry(
                "log.message.timestamp.type", "LogAppendTime",
                incremental_operation=AlterConfigOpType.SET)])]).values():
        f.result(15)
    topic = unique_topic("append-time-default")
    create_topic(b.bootstrap, topic, 1)
    before = int(time.time() * 1000)
    produce_plain(b.bootstrap, topic, [(None, b"old", 1_000)], acks="all")
    c = rdkafka_consumer(b.bootstrap)
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        msgs = [m for m in c.consume(num_messages=1, timeout=15) if m.error() is None]
    finally:
        c.close()
    assert len(msgs) == 1, msgs
    kind, ts = msgs[0].timestamp()
    assert kind == 2 and ts >= before - 1000, (kind, ts)  # TIMESTAMP_LOG_APPEND_TIME

    for names in (["default.replication.factor", "num.partitions"],
                  ["num.partitions", "log.retention.ms", "default.replication.factor"]):
        r = kwire.send(b, DescribeConfigsRequest[3](
            resources=[(4, broker_id, names)], include_synonyms=False,
            include_documentation=False))
        assert [e.name for e in r.results[0].configs] == names, r


def test_newest_metadata_and_fetch_versions(broker):
    """Metadata v13 (its top-level error code) and Fetch v17 and v18 (fields only replicas
    send), the newest a Kafka 4.x client or tool speaks, built and parsed by kafka-python's own
    codec: the topic and its records come back as with older versions. A tool sending Fetch v18
    without negotiating was closed and reconnected 122,683 times in 40 s before."""
    from kafka.protocol.consumer import FetchRequest
    from kafka.protocol.metadata import MetadataRequest

    topic = unique_topic("newest")
    create_topic(broker.bootstrap, topic, 1)
    produce_plain(broker.bootstrap, topic, [(None, b"v%d" % i, None) for i in range(5)], acks="all")

    def call(request):
        return kwire.send(broker, request)

    md = call(MetadataRequest[13](topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                                  allow_auto_topic_creation=False,
                                  include_topic_authorized_operations=False))
    assert md.error_code == 0, md
    (t,) = md.topics
    assert t.error_code == 0 and [p.partition_index for p in t.partitions] == [0], t
    for version in (17, 18):
        f = call(FetchRequest[version](
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
            session_id=0, session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic_id=t.topic_id, partitions=[
                FetchRequest.FetchTopic.FetchPartition(
                    partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                    log_start_offset=-1, partition_max_bytes=1 << 20)])],
            forgotten_topics_data=[], rack_id=""))
        assert f.error_code == 0, f
        (ft,) = f.responses
        (fp,) = ft.partitions
        assert fp.error_code == 0 and fp.high_watermark == 5, (version, fp)
        assert fp.records and b"v4" in bytes(fp.records), (version, fp)


def test_fetch_max_bytes_limits_the_answer_in_whole_batches(broker):
    """A Fetch's max_bytes bounds the whole answer, as Kafka bounds it (KIP-74): the first
    partition with data gets at least its first batch, however small the limit (0 included),
    and nothing beyond the limit follows it; a second partition gets what fits of the rest.
    kaas kept the first partition's whole read past the limit (max_bytes 500 answered three
    batches of 391 bytes) and took 0 for no limit. Raw Fetch v12; kaas answers whole batches
    where Kafka may end on part of one."""
    from kafka.protocol.consumer import FetchRequest
    topic = unique_topic("maxbytes")
    create_topic(broker.bootstrap, topic, 2)
    s = kwire.connect(broker)
    version = kwire.pick_produce_version(kwire.api_versions(broker))
    try:  # three batches of three records in partition 0, one batch in partition 1
        for i in range(3):
            batch = kwire.record_batch([(None, b"a%d" % i * 100)] * 3)
            assert kwire.produce(s, version, i, topic, 0, batch) == (0, 3 * i)
        assert kwire.produce(s, version, 3, topic, 1, kwire.record_batch([(None, b"b" * 100)])) \
            == (0, 0)
    finally:
        s.close()

    def fetch(max_bytes):
        f = kwire.send(broker, FetchRequest[12](
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes, isolation_level=0,
            session_id=0, session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                FetchRequest.FetchTopic.FetchPartition(
                    partition=p, current_leader_epoch=-1, fetch_offset=0,
                    last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
                for p in (0, 1)])],
            forgotten_topics_data=[], rack_id=""))
        assert f.error_code == 0, f
        return [bytes(p.records or b"") for p in f.responses[0].partitions]

    whole = fetch(1 << 20)
    first, rest = whole[0], whole[1]
    sizes = kwire.batch_sizes(first)
    assert len(sizes) == 3 and len(kwire.batch_sizes(rest)) == 1, (sizes, len(rest))
    for limit in (0, 1, sizes[0] - 1, sizes[0], sizes[0] + 10):
        p0, p1 = fetch(limit)
        assert kwire.batch_sizes(p0) == sizes[:1], (limit, kwire.batch_sizes(p0))
        assert p1 == b"", (limit, len(p1))
    p0, p1 = fetch(sizes[0] + sizes[1] + 5)
    assert kwire.batch_sizes(p0) == sizes[:2] and p1 == b""
    p0, p1 = fetch(sum(sizes) + len(rest))
    assert (p0, p1) == (first, rest)


def test_a_fetch_is_capped_at_the_brokers_fetch_max_bytes(broker):
    """A Fetch asking for 2 GiB from a partition holding 64 MiB gets at most 55 MiB, the
    broker's fetch.max.bytes (Kafka's default, read-only there); kaas had no cap, so one
    request made it read and hold up to a whole segment."""
    from kafka.protocol.consumer import FetchRequest
    topic = unique_topic("fetchcap")
    create_topic(broker.bootstrap, topic, 1)
    version = kwire.pick_produce_version(kwire.api_versions(broker))
    value = b"x" * 1_000_000
    with kwire.connect(broker) as s:
        s.settimeout(30)
        for i in range(64):
            assert kwire.produce(s, version, i, topic, 0, kwire.record_batch([(None, value)])) \
                == (0, i)
    f = kwire.send(broker, FetchRequest[12](
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=2**31 - 1, isolation_level=0,
        session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=2**31 - 1)])],
        forgotten_topics_data=[], rack_id=""))
    assert f.error_code == 0, f
    records = bytes(f.responses[0].partitions[0].records or b"")
    assert 50 * 2**20 <= len(records) <= 57_671_680, len(records)


def test_a_fetch_claiming_to_come_from_a_replica_gets_no_records(broker):
    """A Fetch with replica_id >= 0 claims to come from a follower; no broker follows a kaas
    partition (one copy), so it is answered NOT_LEADER_OR_FOLLOWER with no records and high
    watermark -1, as Kafka answers a fetch from a broker that is not a follower (any id, its
    own included). kaas served it as a consumer's fetch. A consumer's fetch (-1) still reads."""
    from kafka.protocol.consumer import FetchRequest
    topic = unique_topic("replica")
    create_topic(broker.bootstrap, topic, 1)
    with kwire.connect(broker) as s:
        s.settimeout(15)
        assert kwire.produce(s, 8, 1, topic, 0, kwire.record_batch([(None, b"v")])) == (0, 0)

    def fetch(replica_id):
        f = kwire.send(broker, FetchRequest[12](
            replica_id=replica_id, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
            isolation_level=0, session_id=0, session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                FetchRequest.FetchTopic.FetchPartition(
                    partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                    log_start_offset=-1, partition_max_bytes=1 << 20)])],
            forgotten_topics_data=[], rack_id=""))
        p = f.responses[0].partitions[0]
        return p.error_code, p.high_watermark, len(p.records or b"")

    for replica_id in (0, 1, 7):
        assert fetch(replica_id) == (6, -1, 0), replica_id
    err, hw, n = fetch(-1)
    assert (err, hw) == (0, 1) and n > 0


def test_an_incremental_fetch_names_no_session(broker):
    """kaas grants no fetch sessions (it answers session id 0), so a Fetch with a session epoch
    above 0 — an incremental fetch of a session it never granted — is answered
    FETCH_SESSION_ID_NOT_FOUND, as Kafka answers for an unknown session, and a full fetch
    (epoch 0 or -1, any session id) is served. kaas answered the incremental one as a full
    fetch of the partitions it listed (found side by side with Kafka 4.4)."""
    from kafka.protocol.consumer import FetchRequest
    topic = unique_topic("session")
    create_topic(broker.bootstrap, topic, 1)
    produce_plain(broker.bootstrap, topic, [(None, b"v", None)], acks="all")

    def fetch(session_id, session_epoch):
        return kwire.send(broker, FetchRequest[12](
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
            session_id=session_id, session_epoch=session_epoch,
            topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                FetchRequest.FetchTopic.FetchPartition(
                    partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                    log_start_offset=-1, partition_max_bytes=1 << 20)])],
            forgotten_topics_data=[], rack_id=""))

    for session_id, epoch in ((1234, 1), (0, 7)):
        f = fetch(session_id, epoch)
        assert (f.error_code, f.responses) == (70, []), (session_id, epoch, f)
    for session_id, epoch in ((0, -1), (0, 0), (1234, 0)):
        f = fetch(session_id, epoch)
        assert (f.error_code, f.session_id) == (0, 0), f
        assert f.responses[0].partitions[0].high_watermark == 1, f


def test_a_broker_describes_every_config_it_knows_with_its_default(broker):
    """A broker's DescribeConfigs lists every broker config kaas knows, as Kafka lists all of
    its own: the topic defaults (alterable, DEFAULT_CONFIG until set), the connection limits,
    and the configs kaas stores without effect at Kafka's defaults, each documented when asked.
    kaas listed only what had been set, so a tool reading `log.cleaner.backoff.ms` before
    changing it found nothing (sarama's TestFuncAdminIncrementalAlterConfigs), and nothing was
    documented (its TestFuncAdminDescribeConfig)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigSource, ResourceType
    a = admin(broker.bootstrap)
    [broker_id] = [str(i) for i in a.list_topics(timeout=10).brokers]

    def described():
        [f] = a.describe_configs([ConfigResource(ResourceType.BROKER, broker_id)]).values()
        return f.result(15)

    cfg = described()
    for name, value in (("log.cleaner.backoff.ms", "15000"), ("log.retention.bytes", "-1"),
                        ("log.retention.ms", "604800000"), ("num.io.threads", "8"),
                        ("log.cleanup.policy", "delete")):
        assert name in cfg, f"{name} is not described"
        assert (cfg[name].value, cfg[name].source) == (value, ConfigSource.DEFAULT_CONFIG.value), \
            (name, cfg[name])
        assert not cfg[name].is_read_only, name
    assert cfg["ssl.keystore.password"].is_sensitive and cfg["ssl.keystore.password"].value is None
    # The connection limits come from flags, reported as the other flags are; alterable.
    assert cfg["max.connections"].value.isdigit()
    assert cfg["max.connections"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert not cfg["max.connections"].is_read_only
    # The defaults layer names nothing twice and comes after what is set.
    for f in a.incremental_alter_configs([ConfigResource(
            ResourceType.BROKER, broker_id, incremental_configs=[ConfigEntry(
                "log.cleaner.backoff.ms", "15001",
                incremental_operation=AlterConfigOpType.SET)])]).values():
        f.result(15)
    cfg = described()
    assert (cfg["log.cleaner.backoff.ms"].value, cfg["log.cleaner.backoff.ms"].source) == (
        "15001", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    # Documentation, when asked (raw: confluent-kafka does not ask for it).
    docs = kwire.describe_configs_raw(broker, broker_id,
                                      ["log.retention.bytes", "background.threads"])
    assert "retention.bytes" in docs["log.retention.bytes"], docs
    assert "no effect in kaas" in docs["background.threads"], docs


def test_broker_configs_given_at_start(broker_factory, tmp_path):
    """`--broker-config KEY=VALUE` (Kafka's server.properties, what the chart's config.broker
    renders) sets topic defaults beneath the dynamic configs: a new topic reports
    log.retention.ms's value as its retention.ms with source STATIC_BROKER_CONFIG, a record over
    the static message.max.bytes is refused MESSAGE_TOO_LARGE, and a dynamic default set with
    kafka-configs' AlterConfigs wins over the static one. A name or value Kafka would refuse
    stops the broker before it starts, saying which (exit 2)."""
    import subprocess

    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ResourceType

    from conftest import kaas_bin
    b = broker_factory(extra_args=["--broker-config", "log.retention.ms=123456789",
                                   "--broker-config", "message.max.bytes=2000"])
    a = admin(b.bootstrap)
    topic = unique_topic("static")
    create_topic(b.bootstrap, topic, 1)

    def topic_config(name):
        (f,) = a.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
        e = f.result(15)[name]
        return e.value, e.source

    STATIC, DYNAMIC_BROKER = 4, 2
    assert topic_config("retention.ms") == ("123456789", STATIC)
    assert topic_config("max.message.bytes") == ("2000", STATIC)
    p = Producer({"bootstrap.servers": b.bootstrap, "compression.type": "none",
                  "message.max.bytes": 100000, "message.timeout.ms": 10000})
    errors = []
    p.produce(topic, value=b"x" * 5000, on_delivery=lambda err, m: errors.append(err))
    p.flush(15)
    assert [e.code() for e in errors] == [KafkaError.MSG_SIZE_TOO_LARGE], errors
    # A dynamic config of this broker (kafka-configs --entity-type brokers --entity-name 0)
    # overrides the static value.
    res = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[ConfigEntry(
        "log.retention.ms", "42000", incremental_operation=AlterConfigOpType.SET)])
    for f in a.incremental_alter_configs([res]).values():
        f.result(15)
    assert topic_config("retention.ms") == ("42000", DYNAMIC_BROKER)
    (f,) = a.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
    entry = f.result(15)["message.max.bytes"]
    assert (entry.value, entry.source) == ("2000", STATIC), entry

    for bad, named in (("log.retention.ms=soon", "log.retention.ms"),
                       ("log.retentoin.ms=1000", "log.retentoin.ms"),
                       ("log.retention.ms", "KEY=VALUE")):
        r = subprocess.run([str(kaas_bin()), "--data-dir", str(tmp_path / "never"),
                            "--broker-config", bad], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and named in r.stderr and "--broker-config" in r.stderr, (bad, r.stderr)
        assert not (tmp_path / "never").exists()


def test_a_broker_config_lists_every_layer_that_sets_it_as_its_synonyms(broker_factory):
    """DescribeConfigs of a broker with synonyms lists, for each config, every layer that sets
    it, highest first, as Kafka's ConfigHelper does: this broker's dynamic config (source 2),
    the cluster-wide dynamic default (3), the static setting (4) and the built-in default (5);
    `log.retention.ms` has no built-in default of its own in Kafka, which lists
    `log.retention.hours`'s instead. The cluster-wide default entity lists only its own layer.
    kaas listed no synonyms for a broker at all (found with KafkaJS's admin client, which asks
    for them)."""
    from kafka.protocol.admin import DescribeConfigsRequest as D
    from kafka.protocol.admin import IncrementalAlterConfigsRequest as IAC
    b = broker_factory(extra_args=["--broker-config", "log.retention.ms=123456789",
                                   "--broker-config", "message.max.bytes=2000"])
    [broker_id] = [str(i) for i in admin(b.bootstrap).list_topics(timeout=10).brokers]
    # This broker's own dynamic config, then the cluster-wide default (the empty name).
    for entity, (name, value) in ((broker_id, ("log.retention.ms", "42000")),
                                  ("", ("message.max.bytes", "3000"))):
        (r,) = kwire.send(b, IAC[1](resources=[IAC.AlterConfigsResource(
            resource_type=4, resource_name=entity, configs=[
                IAC.AlterConfigsResource.AlterableConfig(
                    name=name, config_operation=0, value=value)])],
            validate_only=False)).responses
        assert r.error_code == 0, r

    def synonyms(entity, names):
        (r,) = kwire.send(b, D[1](resources=[D.DescribeConfigsResource(
            resource_type=4, resource_name=entity, configuration_keys=names)],
            include_synonyms=True)).results
        assert r.error_code == 0, r
        return {c.name: [(s.source, s.name, s.value) for s in c.synonyms] for c in r.configs}

    got = synonyms(broker_id, ["log.retention.ms", "message.max.bytes", "log.cleanup.policy"])
    assert got == {
        "log.retention.ms": [(2, "log.retention.ms", "42000"),
                             (4, "log.retention.ms", "123456789"),
                             (5, "log.retention.hours", "168")],
        "message.max.bytes": [(3, "message.max.bytes", "3000"),
                              (4, "message.max.bytes", "2000"),
                              (5, "message.max.bytes", "1048588")],
        "log.cleanup.policy": [(5, "log.cleanup.policy", "delete")],
    }, got
    assert synonyms("", ["message.max.bytes"]) == {
        "message.max.bytes": [(3, "message.max.bytes", "3000")]}


def test_a_topic_named_twice_in_one_admin_request_is_refused_as_kafka_does(broker):
    """Found with segmentio/kafka-go's suite (TestConnCreateTopics), compared with Kafka's
    controller: a CreateTopics, DeleteTopics or CreatePartitions request that names one topic
    twice is answered INVALID_REQUEST ("Duplicate topic name.") for that name, once, and
    nothing is done for it; the request's other topics are served. kaas performed the first
    entry and answered the second on its own (CreateTopics created the topic; DeleteTopics
    deleted it and answered UNKNOWN_TOPIC_OR_PARTITION; CreatePartitions grew it once)."""
    INVALID_REQUEST, TOPIC_ALREADY_EXISTS = 42, 36
    a = admin(broker.bootstrap)
    twice, once, existing = (unique_topic(p) for p in ("twice", "once", "existing"))
    create_topic(broker.bootstrap, existing, 1)
    rows = kwire.topic_admin_raw(broker, "create_topics", [existing, twice, once, twice])
    assert rows == [(existing, TOPIC_ALREADY_EXISTS, rows[0][2]),
                    (twice, INVALID_REQUEST, "Duplicate topic name."),
                    (once, 0, None)], rows
    topics = a.list_topics(timeout=10).topics
    assert once in topics and twice not in topics

    rows = kwire.topic_admin_raw(broker, "create_partitions", [once, existing, once], count=3)
    assert rows == [(once, INVALID_REQUEST, "Duplicate topic name."), (existing, 0, None)], rows
    topics = a.list_topics(timeout=10).topics
    assert len(topics[once].partitions) == 1 and len(topics[existing].partitions) == 3

    rows = kwire.topic_admin_raw(broker, "delete_topics", [once, existing, once])
    assert [r[:2] for r in rows] == [(once, INVALID_REQUEST), (existing, 0)], rows
    topics = a.list_topics(timeout=10).topics
    assert once in topics and existing not in topics


def test_delete_topics_naming_a_topic_by_name_and_id_is_refused(broker):
    """DeleteTopics v6 with both a name and an id for one entry is INVALID_REQUEST, as Kafka
    answers ("You may not specify both topic name and topic id."), and nothing is deleted.
    kaas deleted the topic the name gave (found side by side with Kafka 4.4)."""
    from kafka.protocol.admin import CreateTopicsRequest as CT, DeleteTopicsRequest as DT
    topic = unique_topic("nameandid")
    (created,) = kwire.send(broker, CT[7](topics=[CT.CreatableTopic(
        name=topic, num_partitions=1, replication_factor=1, assignments=[], configs=[])],
        timeout_ms=30_000, validate_only=False)).topics
    assert created.error_code == 0, created
    (r,) = kwire.send(broker, DT[6](topics=[DT.DeleteTopicState(
        name=topic, topic_id=created.topic_id)], timeout_ms=30_000)).responses
    assert (r.error_code, r.error_message) == (
        42, "You may not specify both topic name and topic id."), r
    assert topic in admin(broker.bootstrap).list_topics(timeout=10).topics


def test_admin_requests_that_contradict_themselves_are_refused(broker):
    """As Kafka's controller answers them (compared side by side with Kafka 4.4), and nothing
    is done: CreateTopics with explicit assignments and a partition count (INVALID_REQUEST),
    CreateTopics with a config without a value (INVALID_CONFIG), CreatePartitions growing to 6
    with one assignment (INVALID_REPLICA_ASSIGNMENT), IncrementalAlterConfigs naming one config
    twice (INVALID_REQUEST). kaas obeyed one half of each."""
    from kafka.protocol.admin import (CreatePartitionsRequest as CP, CreateTopicsRequest as CT,
                                      IncrementalAlterConfigsRequest as IAC)
    a = admin(broker.bootstrap)
    [me] = list(a.list_topics(timeout=10).brokers)
    both, null_config, grown = (unique_topic(p) for p in ("both", "nullcfg", "grown"))

    def create(name, **fields):
        topic = dict(name=name, num_partitions=1, replication_factor=1, assignments=[],
                     configs=[])
        topic.update(fields)
        (r,) = kwire.send(broker, CT[7](topics=[CT.CreatableTopic(**topic)], timeout_ms=30_000,
                                        validate_only=False)).topics
        return r.error_code

    assert create(both, num_partitions=2, replication_factor=-1, assignments=[
        CT.CreatableTopic.CreatableReplicaAssignment(partition_index=0, broker_ids=[me])]) == 42
    assert create(null_config, configs=[
        CT.CreatableTopic.CreatableTopicConfig(name="retention.ms", value=None)]) == 40
    assert create(grown) == 0
    (r,) = kwire.send(broker, CP[3](topics=[CP.CreatePartitionsTopic(
        name=grown, count=6, assignments=[CP.CreatePartitionsTopic.CreatePartitionsAssignment(
            broker_ids=[me])])], timeout_ms=30_000, validate_only=False)).results
    assert r.error_code == 39, r
    (r,) = kwire.send(broker, IAC[1](resources=[IAC.AlterConfigsResource(
        resource_type=2, resource_name=grown, configs=[
            IAC.AlterConfigsResource.AlterableConfig(name="retention.ms", config_operation=0,
                                                     value=v) for v in ("1000", "2000")])],
        validate_only=False)).responses
    assert r.error_code == 42, r
    topics = a.list_topics(timeout=10).topics
    assert both not in topics and null_config not in topics
    assert len(topics[grown].partitions) == 1
    [described] = a.describe_configs([ConfigResource("topic", grown)]).values()
    assert described.result(10)["retention.ms"].value == "604800000"


def test_a_name_no_topic_can_have_is_an_invalid_topic(broker):
    """Produce to, and DescribeConfigs of, a name no topic can have ("a b", "") answer
    INVALID_TOPIC_EXCEPTION, as Kafka does, not UNKNOWN_TOPIC_OR_PARTITION: a client retries
    the latter, waiting for a topic that can never exist (found side by side with Kafka 4.4)."""
    from kafka.protocol.admin import DescribeConfigsRequest as DCf
    version = kwire.pick_produce_version(kwire.api_versions(broker))
    with kwire.connect(broker) as s:
        s.settimeout(15)
        assert kwire.produce(s, version, 5, "a b", 0, kwire.record_batch([(None, b"v")]))[0] == 17
    for name in ("", "a b"):
        (r,) = kwire.send(broker, DCf[4](resources=[DCf.DescribeConfigsResource(
            resource_type=2, resource_name=name, configuration_keys=None)],
            include_synonyms=False, include_documentation=False)).results
        assert r.error_code == 17, (name, r)


# The error message of a successful entry, as Apache Kafka 4.4 sends it: null, "", or (for
# FindCoordinator v1-v3 and an UpdateFeatures v1 feature) "NONE". A client may take any
# message for an error, and KafkaJS's own tests expect null after CreateTopics.
# KAAS_TEST_APACHE_KAFKA=1 runs the test below against Kafka, which checks this table.
SUCCESS_MESSAGES: dict[str, str | None] = {
    "CreateTopics v7": None,
    "CreatePartitions v3": None,
    "DescribeConfigs v4": "",
    "IncrementalAlterConfigs v1": None,
    "AlterConfigs v2": None,
    "FindCoordinator v3": "NONE",
    "FindCoordinator v4": "",
    "DescribeCluster v1": None,
    "AlterPartitionReassignments v0": None,
    "AlterPartitionReassignments v0, partition": None,
    "ListPartitionReassignments v0": None,
    "DescribeClientQuotas v1": "",
    "DescribeUserScramCredentials v0": "",
    "DescribeProducers v0": None,
    "UpdateFeatures v1": None,
    "UpdateFeatures v1, feature": "NONE",
    "DeleteTopics v6": None,
}


def test_a_success_carries_the_error_message_kafka_sends(broker):
    """A successful answer carries the error message Kafka's does (SUCCESS_MESSAGES). kaas sent
    "" (its codec's default) where Kafka sends null, after CreateTopics and
    ListPartitionReassignments, and null where Kafka sends "NONE" or "" after FindCoordinator.
    Each request is built and parsed by kafka-python's codec, which tells null from ""."""
    from kafka.protocol.admin import (AlterConfigsRequest as AC,
                                      AlterPartitionReassignmentsRequest as APR,
                                      CreatePartitionsRequest as CP,
                                      CreateTopicsRequest as CT, DeleteTopicsRequest as DT,
                                      DescribeClientQuotasRequest as DQ,
                                      DescribeClusterRequest as DC, DescribeConfigsRequest as DCf,
                                      DescribeProducersRequest as DP,
                                      DescribeUserScramCredentialsRequest as DS,
                                      IncrementalAlterConfigsRequest as IAC,
                                      ListPartitionReassignmentsRequest as LPR,
                                      UpdateFeaturesRequest as UF)
    from kafka.protocol.metadata import FindCoordinatorRequest as FC

    def send(request):
        return kwire.send(broker, request)

    topic = unique_topic("nullmsg")
    seen: dict[str, str | None] = {}
    (r,) = send(CT[7](topics=[CT.CreatableTopic(name=topic, num_partitions=1,
                                                  replication_factor=1, assignments=[],
                                                  configs=[])],
                      timeout_ms=30_000, validate_only=False)).topics
    assert r.error_code == 0, r
    seen["CreateTopics v7"] = r.error_message
    (r,) = send(CP[3](topics=[CP.CreatePartitionsTopic(name=topic, count=2, assignments=None)],
                      timeout_ms=30_000, validate_only=False)).results
    assert r.error_code == 0, r
    seen["CreatePartitions v3"] = r.error_message
    (r,) = send(DCf[4](resources=[DCf.DescribeConfigsResource(
        resource_type=2, resource_name=topic, configuration_keys=["retention.ms"])],
        include_synonyms=False, include_documentation=False)).results
    assert r.error_code == 0, r
    seen["DescribeConfigs v4"] = r.error_message
    (r,) = send(IAC[1](resources=[IAC.AlterConfigsResource(
        resource_type=2, resource_name=topic, configs=[IAC.AlterConfigsResource.AlterableConfig(
            name="retention.ms", config_operation=0, value="3600000")])],
        validate_only=False)).responses
    assert r.error_code == 0, r
    seen["IncrementalAlterConfigs v1"] = r.error_message
    (r,) = send(AC[2](resources=[AC.AlterConfigsResource(
        resource_type=2, resource_name=topic, configs=[AC.AlterConfigsResource.AlterableConfig(
            name="retention.ms", value="7200000")])], validate_only=False)).responses
    assert r.error_code == 0, r
    seen["AlterConfigs v2"] = r.error_message
    # Kafka answers COORDINATOR_NOT_AVAILABLE until it has created its offsets topic.
    deadline = time.monotonic() + 30
    while (r := send(FC[3](key="nullmsg-group", key_type=0))).error_code == 15:
        assert time.monotonic() < deadline, r
        time.sleep(0.5)
    assert r.error_code == 0, r
    seen["FindCoordinator v3"] = r.error_message
    (r,) = send(FC[4](key_type=0, coordinator_keys=["nullmsg-group"])).coordinators
    assert r.error_code == 0, r
    seen["FindCoordinator v4"] = r.error_message
    r = send(DC[1](include_cluster_authorized_operations=False, endpoint_type=1))
    assert r.error_code == 0, r
    seen["DescribeCluster v1"] = r.error_message
    (me,) = [b.broker_id for b in r.brokers]
    r = send(APR[0](timeout_ms=30_000, topics=[APR.ReassignableTopic(name=topic, partitions=[
        APR.ReassignableTopic.ReassignablePartition(partition_index=0, replicas=[me])])]))
    assert r.error_code == 0, r
    seen["AlterPartitionReassignments v0"] = r.error_message
    ((p,),) = [t.partitions for t in r.responses]
    assert p.error_code == 0, p
    seen["AlterPartitionReassignments v0, partition"] = p.error_message
    r = send(LPR[0](timeout_ms=30_000, topics=None))
    assert r.error_code == 0, r
    seen["ListPartitionReassignments v0"] = r.error_message
    r = send(DQ[1](components=[], strict=False))
    assert r.error_code == 0, r
    seen["DescribeClientQuotas v1"] = r.error_message
    r = send(DS[0](users=None))
    assert r.error_code == 0, r
    seen["DescribeUserScramCredentials v0"] = r.error_message
    (t,) = send(DP[0](topics=[DP.TopicRequest(name=topic, partition_indexes=[0])])).topics
    (p,) = t.partitions
    assert p.error_code == 0, p
    seen["DescribeProducers v0"] = p.error_message
    # group.version stays at the level both finalize (1): an update that changes nothing.
    r = send(UF[1](timeout_ms=30_000, feature_updates=[UF.FeatureUpdateKey(
        feature="group.version", max_version_level=1, upgrade_type=1)], validate_only=False))
    assert r.error_code == 0, r
    seen["UpdateFeatures v1"] = r.error_message
    (f,) = r.results
    assert f.error_code == 0, f
    seen["UpdateFeatures v1, feature"] = f.error_message
    (r,) = send(DT[6](topics=[DT.DeleteTopicState(name=topic, topic_id=None)],
                      timeout_ms=30_000)).responses
    assert r.error_code == 0, r
    seen["DeleteTopics v6"] = r.error_message
    differ = {api: (m, SUCCESS_MESSAGES[api]) for api, m in seen.items()
              if m != SUCCESS_MESSAGES[api]}
    assert not differ, f"successful answers whose error message differs from Kafka's (sent, Kafka's): {differ}"


def test_a_topic_default_is_listed_among_its_synonyms_as_kafka_lists_it(broker):
    """DescribeConfigs with synonyms names a topic config's built-in default by the broker
    config Kafka names it by, and lists none where Kafka lists none: `retention.ms` (Kafka's
    `log.retention.ms` has no default of its own) and configs no broker config sets. kaas
    listed `log.retention.ms` (KafkaJS's DescribeConfigs test compares the synonyms) and named
    the others by the topic config itself."""
    from kafka.protocol.admin import DescribeConfigsRequest as D
    topic = unique_topic("synonyms")
    create_topic(broker.bootstrap, topic, 1)
    want = {"retention.ms": [], "segment.ms": [], "segment.jitter.ms": [],
            "remote.storage.enable": [], "cleanup.policy": ["log.cleanup.policy"],
            "file.delete.delay.ms": ["log.segment.delete.delay.ms"],
            "segment.index.bytes": ["log.index.size.max.bytes"],
            "preallocate": ["log.preallocate"]}
    (r,) = kwire.send(broker, D[1](resources=[D.DescribeConfigsResource(
        resource_type=2, resource_name=topic, configuration_keys=list(want))],
        include_synonyms=True)).results
    assert r.error_code == 0, r
    got = {c.name: [s.name for s in c.synonyms if s.source == 5] for c in r.configs}
    assert got == want


def test_a_produce_refused_on_validation_reports_the_log_start_offset(broker):
    """A batch refused on validation (INVALID_RECORD: a keyless record on a compacted topic,
    whose `delete` policy lets DeleteRecords move the log start) is answered with the partition's log start offset, as Kafka answers it (its
    `processFailedRecord`); kaas answered -1."""
    from confluent_kafka import TopicPartition as TP
    topic = unique_topic("lso")
    create_topic(broker.bootstrap, topic, 1, {"cleanup.policy": "compact,delete"})
    version = 8
    with kwire.connect(broker) as s:
        s.settimeout(15)
        for i in range(3):
            assert kwire.produce(s, version, i, topic, 0,
                                 kwire.record_batch([(b"k%d" % i, b"v")])) == (0, i)
    a = admin(broker.bootstrap)
    done = a.delete_records([TP(topic, 0, 2)], request_timeout=10)
    for f in done.values():
        f.result()
    with kwire.connect(broker) as s:
        s.settimeout(15)
        s.sendall(kwire.produce_request(version, 7, topic, 0, kwire.record_batch([(None, b"v")])))
        frame = kwire.recv_frame(s)
    _, _, _, err, base = kwire.parse_produce_response(version, frame)
    assert (err, base) == (87, -1), "INVALID_RECORD, nothing stored"
    assert kwire.produce_log_start_offset(version, frame) == 2
