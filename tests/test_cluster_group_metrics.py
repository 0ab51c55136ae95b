"""A consumer group's committed offsets stay on /metrics when its coordinator dies.

Consumer lag is a partition's end offset minus a group's committed offset, and the group's
committed offsets are published by the broker coordinating it. In a cluster, the group moves to
another broker when its coordinator dies; that broker used to load the group only when a request
for it arrived. A group whose consumers are gone sends none — which is exactly when its lag
grows and the KaasConsumerLagGrowing alert should fire — so the series vanished with the dead
broker. Now the new coordinator loads every group that moved to it as soon as it applies the
assignment.

Three real broker processes, one killed with SIGKILL; the metrics are read from /metrics.
"""
from __future__ import annotations

import re
import time

import pytest

from kcheck import create_topic, rdkafka_produce
from kcluster import logs_on_failure, make_cluster  # noqa: F401  (the fixture)
from test_http_endpoints import parse_metrics

TOPIC = "lagged"


@pytest.fixture
def cluster(make_cluster):
    c = make_cluster(3)
    c.wait_controller()
    return c


def committed_series(node, group: str) -> dict[int, float] | None:
    """{partition: committed offset} that `node` publishes for `group`; None if it is down."""
    try:
        _, body = node._get("/metrics")
    except OSError:
        return None
    samples, _ = parse_metrics(body.decode())
    out = {}
    for name, labels, value in samples:
        if name == "kaas_group_committed_offset" and f'group="{group}"' in labels:
            out[int(re.search(r'partition="(\d+)"', labels).group(1))] = value
    return out


@logs_on_failure
def test_an_idle_groups_offsets_survive_its_coordinators_death(cluster):
    from confluent_kafka import Consumer, TopicPartition
    c = cluster
    bs = c.bootstrap()
    create_topic(bs, TOPIC, 2)
    c.wait_settled(2)
    rdkafka_produce(bs, TOPIC, [(b"k", b"v%d" % i) for i in range(200)],
                    extra={"partitioner": "random"})
    committed = {0: 11, 1: 23}
    consumer = Consumer({"bootstrap.servers": bs, "group.id": "idle",
                         "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(TOPIC, p, o) for p, o in committed.items()],
                    asynchronous=False)
    consumer.close()
    want = {p: float(o) for p, o in committed.items()}

    # The coordinator publishes them within a second.
    coordinator = c.wait(lambda: next((n for n in c.running() if committed_series(n, "idle") == want),
                                      None), 15, "a broker publishing the group's offsets")
    coordinator.kill()

    # Nobody asks for the group from now on; another broker must publish it anyway.
    def published():
        for n in c.running():
            if committed_series(n, "idle") == want:
                return n
        return None
    successor = c.wait(published, 90, "the group's offsets published by a surviving broker")
    assert successor.id != coordinator.id
