"""A clean stop (SIGTERM) of a single broker under produce load answers every request it took.

Found with kafkajs (30 send loops, acks=-1, no idempotence, one SIGTERM and a restart): kaas
stored 10-65 records twice in 4 of 4 runs, Apache Kafka 4.4 none in 3. The shard closed its
partitions while its connections were still reading and answering: a request read before or
during the close was stored, but its answer was REQUEST_TIMED_OUT or never sent (the process
exited under it), so the client sent it again to the restarted broker. A producer without
idempotence cannot tell a retried record from a new one, so each retry of a stored write is a
duplicate. On a clean stop nothing forces that: the broker stops reading requests, answers the
ones it has read, and only then closes its partitions.
"""
from __future__ import annotations

import threading
import time

from confluent_kafka import Producer

from kcheck import create_topic, rdkafka_read_all, unique_topic

PARTITIONS = 4
# Rounds of (load, SIGTERM, restart): each round is a chance to catch a request mid-stop.
ROUNDS = 3


def test_sigterm_under_load_stores_each_record_once(broker_factory):
    b = broker_factory()
    topic = unique_topic("clean-stop")
    create_topic(b.bootstrap, topic, PARTITIONS)
    acked: set[bytes] = set()
    failed: list[str] = []
    stop = threading.Event()

    def produce(tag: int):
        # librdkafka's defaults for a producer without idempotence: a deep in-flight window
        # and retries, so requests are in flight whenever the broker stops.
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all",
                      "enable.idempotence": False, "linger.ms": 1,
                      "message.timeout.ms": 60000, "reconnect.backoff.ms": 50})

        def report(err, m):
            if err is None:
                acked.add(m.value())
            else:
                failed.append(str(err))

        i = 0
        while not stop.is_set():
            try:
                p.produce(topic, value=b"%d-%09d" % (tag, i), on_delivery=report)
                i += 1
            except BufferError:
                p.poll(0.01)
            p.poll(0)
            if i % 200 == 0:
                time.sleep(0.005)
        assert p.flush(90) == 0

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(ROUNDS):
            time.sleep(1.5)
            b.restart()
        time.sleep(1.5)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert not failed, failed[:5]
    records, _ = rdkafka_read_all(b.bootstrap, topic, PARTITIONS)
    values = [r[3] for r in records]
    stored = set(values)
    assert acked <= stored, f"{len(acked - stored)} acknowledged records are missing"
    twice = len(values) - len(stored)
    assert twice == 0, (f"{twice} of {len(values)} records stored twice across {ROUNDS} clean "
                        f"restarts ({len(acked)} acknowledged)")
