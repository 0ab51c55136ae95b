"""The Apache Kafka Java client 4.x (tests/java/KaasClientCheck.java): topic creation through
AdminClient, keyed idempotent produce with acks=all, read back with assign(), and the same
data after a restart."""

from __future__ import annotations

import os
import subprocess

import pytest

from kcheck import check_end_offsets, key_for, unique_topic, verify_log

N = int(os.environ.get("KAAS_TEST_MESSAGES", "100000"))
PARTITIONS = 6

state: dict = {}


def jvalue(i: int) -> bytes:
    return b"jv:%09d:" % i


def run_java(java_classes, *args, timeout=600):
    cmd = ["java", "-Xmx768m", "-cp", java_classes, "KaasClientCheck", *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[4:])} failed ({r.returncode}):\n"
                             f"stdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-6000:]}")
    return r.stdout


def java_consume(java_classes, broker, topic, tmp_path, name):
    out = tmp_path / f"{name}.txt"
    run_java(java_classes, "consume", broker.bootstrap, topic, PARTITIONS, out)
    records, ends = [], {}
    with open(out, "rb") as f:
        for line in f:
            parts = line.split()
            if parts[0] == b"#":
                ends[int(parts[2])] = int(parts[3])
                continue
            records.append((int(parts[0]), int(parts[1]), parts[2], parts[3]))
    return records, ends


def test_keyed_idempotent_roundtrip(broker, java_classes, tmp_path):
    """100k keyed messages sent by the Java producer (acks=all, idempotent) into a topic the
    Java AdminClient created with 6 partitions are read back by the Java consumer each at
    exactly the offset its ack reported."""
    topic = unique_topic("java")
    run_java(java_classes, "create", broker.bootstrap, topic, PARTITIONS, timeout=120)
    acks = tmp_path / "acks.txt"
    run_java(java_classes, "produce", broker.bootstrap, topic, N, acks)
    acked = {}
    with open(acks) as f:
        for line in f:
            i, p, off = map(int, line.split())
            acked[jvalue(i)] = (p, off)
    assert len(acked) == N
    assert {p for p, _ in acked.values()} == set(range(PARTITIONS))
    records, ends = java_consume(java_classes, broker, topic, tmp_path, "read1")
    check_end_offsets(acked, ends, "java")
    # KaasClientCheck uses the same key scheme as kcheck.key_for
    assert key_for(7) == b"key-00007"
    verify_log(acked, records, label="java")
    state.update(topic=topic, acked=acked)


@pytest.mark.restart
def test_same_data_after_restart(broker, java_classes, tmp_path):
    """After a clean restart the Java consumer reads exactly the same records at the same
    offsets."""
    if "topic" not in state:
        pytest.skip("needs test_keyed_idempotent_roundtrip")
    broker.restart()
    records, ends = java_consume(java_classes, broker, state["topic"], tmp_path, "read2")
    check_end_offsets(state["acked"], ends, "java after restart")
    verify_log(state["acked"], records, label="java after restart")
