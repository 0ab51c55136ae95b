"""kafka-python (pure-Python client): keyed idempotent produce with acks=all, read back with
manual assignment, the admin API, and the same data after a restart."""

from __future__ import annotations

import os
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from kcheck import (check_end_offsets, key_for, unique_topic, value_for, verify_log)

N = int(os.environ.get("KAAS_TEST_MESSAGES", "100000"))
PARTITIONS = 6

state: dict = {}


def admin_client(broker):
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000,
                            client_id="kaas-test-admin")


def produce(broker, topic, n, start=0, tag="kp"):
    """Send n keyed messages with acks=all + idempotence; return {value: (partition, offset)}."""
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=True,
                      linger_ms=5, batch_size=128 * 1024, max_in_flight_requests_per_connection=5,
                      request_timeout_ms=30000, client_id="kaas-test-producer")
    try:
        futures = []
        for i in range(start, start + n):
            futures.append(p.send(topic, key=key_for(i), value=value_for(tag, i)))
        p.flush(timeout=300)
        acked = {}
        for i, f in zip(range(start, start + n), futures):
            md = f.get(timeout=60)
            acked[value_for(tag, i)] = (md.partition, md.offset)
        return acked
    finally:
        p.close(timeout=30)


def read_all(broker, topic, partitions, timeout=180):
    """Read the whole topic from the beginning with assign() (no consumer group)."""
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                      enable_auto_commit=False, auto_offset_reset="earliest",
                      max_poll_records=5000, fetch_max_bytes=50 * 1024 * 1024,
                      client_id="kaas-test-consumer")
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        begins = c.beginning_offsets(tps)
        assert all(v == 0 for v in begins.values()), f"log start offsets {begins}"
        ends = {tp.partition: off for tp, off in c.end_offsets(tps).items()}
        c.seek_to_beginning(*tps)
        records = []
        pos = {p: 0 for p in range(partitions)}
        deadline = time.monotonic() + timeout
        while any(pos[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out reading {topic}: at {pos}, ends {ends}")
            for tp, msgs in c.poll(timeout_ms=1000).items():
                for m in msgs:
                    records.append((m.partition, m.offset, m.key, m.value))
                    pos[m.partition] = max(pos[m.partition], m.offset + 1)
        return records, ends
    finally:
        c.close()


def test_keyed_idempotent_roundtrip(broker):
    """100k keyed messages produced by kafka-python (acks=all, idempotent) into a 6-partition
    topic are read back each at exactly the offset its ack reported, nothing missing or
    duplicated."""
    topic = unique_topic("kpy")
    a = admin_client(broker)
    try:
        a.create_topics({topic: {"num_partitions": PARTITIONS, "replication_factor": 1}},
                        wait_for_metadata=True)
    finally:
        a.close()
    acked = produce(broker, topic, N)
    assert len(acked) == N
    assert {p for p, _ in acked.values()} == set(range(PARTITIONS))
    records, ends = read_all(broker, topic, PARTITIONS)
    check_end_offsets(acked, ends, "kafka-python")
    verify_log(acked, records, label="kafka-python")
    state.update(topic=topic, acked=acked)


def test_admin_create_describe_alter_delete(broker):
    """kafka-python's admin client creates a topic with a config, sees it described, alters
    the config, adds partitions, and deletes the topic."""
    topic = unique_topic("kpy-admin")
    a = admin_client(broker)
    try:
        a.create_topics({topic: {"num_partitions": 2, "replication_factor": 1,
                                 "configs": {"retention.ms": "3600000"}}},
                        wait_for_metadata=True)
        assert topic in a.list_topics()
        [desc] = a.describe_topics([topic])
        assert desc["error_code"] == 0 and len(desc["partitions"]) == 2, desc

        res = ConfigResource(ConfigResourceType.TOPIC, topic)
        cfg = a.describe_configs([res])["topic"][topic]
        assert cfg["retention.ms"]["value"] == "3600000", cfg

        a.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                        configs={"retention.ms": "7200000",
                                                 "cleanup.policy": "delete"})])
        deadline = time.monotonic() + 15
        while True:
            cfg = a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)],
                                     config_filter="all")["topic"][topic]
            if cfg["retention.ms"]["value"] == "7200000" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert cfg["retention.ms"]["value"] == "7200000", cfg["retention.ms"]
        assert cfg["cleanup.policy"]["value"] == "delete", cfg["cleanup.policy"]

        a.create_partitions({topic: 5})
        deadline = time.monotonic() + 15
        while True:
            [desc] = a.describe_topics([topic])
            if len(desc["partitions"]) == 5 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(desc["partitions"]) == 5, desc

        a.delete_topics([topic])
        deadline = time.monotonic() + 15
        while topic in a.list_topics() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert topic not in a.list_topics()
    finally:
        a.close()


@pytest.mark.restart
def test_same_data_after_restart(broker):
    """After a clean restart kafka-python reads exactly the same records at the same
    offsets."""
    if "topic" not in state:
        pytest.skip("needs test_keyed_idempotent_roundtrip")
    broker.restart()
    records, ends = read_all(broker, state["topic"], PARTITIONS)
    check_end_offsets(state["acked"], ends, "kafka-python after restart")
    verify_log(state["acked"], records, label="kafka-python after restart")
