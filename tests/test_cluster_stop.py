"""Stopping a whole cluster (issue 15, item 5): SIGTERM to every broker at once, as a
StatefulSet scaled to 0 or `systemctl stop` on every host does. No broker is left to take the
partitions, so none should wait its drain timeout for a move that cannot happen (each waited
the full 30 s; 120 s in the chart) — and nothing acknowledged may be lost when they start again.
"""
from __future__ import annotations

import signal
import time

from confluent_kafka import Consumer, Producer

from kcheck import create_topic
from kcluster import DRAIN_TIMEOUT_MS, logs_on_failure, make_cluster  # noqa: F401  (the fixture)

TOPIC = "stop-all"
PARTITIONS = 6
RECORDS = 600


def produce(bootstrap: str) -> set[bytes]:
    acked: set[bytes] = set()
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        p.produce(TOPIC, value=b"v-%d" % i,
                  on_delivery=lambda err, m: err is None and acked.add(m.value()))
        p.poll(0)
    assert p.flush(60) == 0
    return acked


def read_all(bootstrap: str, want: set[bytes], timeout: float = 60) -> set[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "stop-all-check",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([TOPIC])
    got: set[bytes] = set()
    deadline = time.monotonic() + timeout
    try:
        while not want <= got and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.add(m.value())
    finally:
        c.close()
    return got


@logs_on_failure
def test_sigterm_to_every_broker_stops_the_cluster_promptly(make_cluster):
    """Three brokers get SIGTERM together: each exits 0 well within the drain timeout (it took
    the whole 30 s before), and after a restart every acknowledged record is read back."""
    c = make_cluster(3)
    create_topic(c.bootstrap(), TOPIC, PARTITIONS)
    c.wait_settled(PARTITIONS, balanced=True)
    acked = produce(c.bootstrap())
    assert len(acked) == RECORDS

    t0 = time.monotonic()
    for n in c.nodes:
        n.signal(signal.SIGTERM)
    limit = DRAIN_TIMEOUT_MS / 1000
    exits = {}
    for n in c.nodes:
        n.proc.wait(limit + 15)
        exits[n.id] = (n.proc.returncode, round(time.monotonic() - t0, 1))
    print(f"\nwhole-cluster SIGTERM: exit codes and seconds {exits}")
    assert all(code == 0 for code, _ in exits.values()), exits
    assert max(s for _, s in exits.values()) < limit / 2, (
        f"brokers waited for a drain nobody could serve: {exits} (drain timeout {limit:.0f} s)")

    for n in c.nodes:
        n.start()
    c.wait_settled(PARTITIONS, balanced=True)
    got = read_all(c.bootstrap(), acked)
    missing = acked - got
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"
