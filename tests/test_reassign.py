"""`kafka-reassign-partitions --execute` moves a partition's leadership, copying nothing.

kaas keeps one copy of each partition on the volume every broker of a cluster shares, so a
reassignment names one broker, and moving the partition there is a handover: the controller pins
the partition to that broker, its next assignment file moves it, and the new leader opens the
log from the shared volume. It completes in seconds whatever the partition's size, and the
balancer places the other partitions around it from then on.

Checked with the stock tool (Apache Kafka 4.4's ReassignPartitionsCommand) against three real
broker processes, while an idempotent acks=all producer keeps writing: the move completes
(`--verify`), the partition is led by the named broker and stays there, `--list` shows nothing
in progress once it is done, and every acknowledged record is read back exactly once, in order.
A cancel (`--cancel`) hands the partition back to the balancer; a broker that does not exist,
and more than one replica, are refused with INVALID_REPLICA_ASSIGNMENT.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

from conftest import REPO
from kcheck import (create_topic, key_for, rdkafka_produce, rdkafka_read_all, value_for,
                    verify_log)
from kcluster import Cluster, logs_on_failure, make_cluster  # noqa: F401  (the fixture)

TOPIC = "moved"
PARTITIONS = 3
TOOL = "kafka-reassign-partitions"


@pytest.fixture
def cluster(make_cluster, kafka_libs):
    c = make_cluster(3)
    c.wait_controller()
    return c


def tool(bootstrap: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts" / "kafka-tool.sh"), TOOL,
                           "--bootstrap-server", bootstrap, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def plan_file(tmp_path, moves: dict[int, list[int]]):
    f = tmp_path / f"reassign-{time.monotonic_ns()}.json"
    f.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": TOPIC, "partition": p, "replicas": r, "log_dirs": ["any"] * len(r)}
        for p, r in moves.items()]}))
    return f


def leaders(c: Cluster) -> dict[int, int]:
    a = c.assignment() or {"partitions": []}
    return {p["partition"]: p["leader"] for p in a["partitions"] if p["topic"] == TOPIC}


@logs_on_failure
def test_reassignment_moves_leadership_without_copying(cluster, tmp_path):
    c = cluster
    bs = c.bootstrap()
    create_topic(bs, TOPIC, PARTITIONS)
    c.wait_settled(PARTITIONS, balanced=True)
    # About 48 MiB before the move, so that a copy would show in the time it takes.
    acked = rdkafka_produce(bs, TOPIC, ((key_for(i), value_for("w", i, 1024))
                                        for i in range(48_000)))
    before = leaders(c)
    source = before[0]
    target = next(b for b in (0, 1, 2) if b != source)

    # Keep writing through the move: nothing acknowledged may be lost or reordered.
    during: dict = {}
    writer = threading.Thread(target=lambda: during.update(rdkafka_produce(
        bs, TOPIC, ((key_for(i), value_for("w", i, 256)) for i in range(48_000, 68_000)),
        extra={"linger.ms": 20}, timeout=240)))
    writer.start()
    time.sleep(0.5)

    started = time.monotonic()
    r = tool(bs, "--reassignment-json-file", plan_file(tmp_path, {0: [target]}), "--execute")
    assert r.returncode == 0 and "Successfully started partition reassignment" in r.stdout, \
        r.stdout + r.stderr
    verify = plan_file(tmp_path, {0: [target]})
    done_after = None
    deadline = started + 60
    while time.monotonic() < deadline:
        r = tool(bs, "--reassignment-json-file", verify, "--verify")
        if f"Reassignment of partition {TOPIC}-0 is completed" in r.stdout:
            done_after = time.monotonic() - started
            break
        assert "is still in progress" in r.stdout, r.stdout + r.stderr
        time.sleep(0.5)
    assert done_after is not None, f"not completed within 60 s: {r.stdout}{r.stderr}"
    print(f"reassignment of a ~16 MiB partition completed in {done_after:.1f} s "
          "(including two JVM tool runs)")
    assert leaders(c)[0] == target

    r = tool(bs, "--list")
    assert "No partition reassignments found" in r.stdout, r.stdout + r.stderr
    writer.join(300)
    assert not writer.is_alive(), "the producer did not finish"

    # Pinned: several controller rounds later it is still there.
    time.sleep(3)
    assert leaders(c)[0] == target
    settled, led = c.wait_settled(PARTITIONS)
    assert sum(led.values()) == PARTITIONS

    records, ends = rdkafka_read_all(bs, TOPIC, PARTITIONS, timeout=240)
    verify_log({**acked, **during}, records)

    # Cancel: the partition goes back to the balancer (an even spread: one per broker).
    r = tool(bs, "--reassignment-json-file", plan_file(tmp_path, {0: [target]}), "--cancel")
    assert r.returncode == 0, r.stdout + r.stderr
    c.wait_settled(PARTITIONS, balanced=True)


@logs_on_failure
def test_impossible_reassignments_are_refused(cluster, tmp_path):
    c = cluster
    bs = c.bootstrap()
    create_topic(bs, TOPIC, PARTITIONS)
    c.wait_settled(PARTITIONS, balanced=True)
    before = leaders(c)
    # The tool checks broker ids against DescribeCluster itself; the broker checks the rest.
    for moves, why in (({0: [7]}, "Unknown broker id 7"),
                       ({1: [0, 1]}, f"{TOPIC}-1: kaas keeps one copy")):
        r = tool(bs, "--reassignment-json-file", plan_file(tmp_path, moves), "--execute")
        text = r.stdout + r.stderr
        assert r.returncode != 0 and why in text, text
    r = tool(bs, "--list")
    assert "No partition reassignments found" in r.stdout, r.stdout + r.stderr
    assert leaders(c) == before

    # A broker that is down: known to the cluster, but it cannot lead.
    dead = next(n for n in c.nodes if n.id != c.wait_controller().id)
    dead.kill()
    c.wait_settled(PARTITIONS, balanced=True)
    r = tool(c.bootstrap(c.running()), "--reassignment-json-file",
             plan_file(tmp_path, {0: [dead.id]}), "--execute")
    text = r.stdout + r.stderr
    assert r.returncode != 0 and ("not alive" in text or f"Unknown broker id {dead.id}" in text), text
