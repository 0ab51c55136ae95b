"""librdkafka through confluent-kafka (Python): keyed idempotent produce with acks=all, read
back with manual assignment, survival across a clean restart and a SIGKILL, and the
1 KiB-message round trip with measured throughput."""

from __future__ import annotations

import os
import time

import pytest

from kcheck import (check_end_offsets, create_topic, key_for, rdkafka_produce,
                    rdkafka_read_all, seq_of, unique_topic, value_for, verify_log)

N = int(os.environ.get("KAAS_TEST_MESSAGES", "100000"))
PARTITIONS = 6
LONG = os.environ.get("KAAS_LONG_TESTS", "") not in ("", "0")

# state shared by the tests of this module, in order
state: dict = {}


def keyed(tag: str, n: int, start: int = 0):
    return ((key_for(i), value_for(tag, i)) for i in range(start, start + n))


def test_keyed_idempotent_roundtrip(broker):
    """100k keyed messages produced with acks=all and idempotence into 6 partitions are all
    read back, each at exactly the offset its ack reported, nothing missing or duplicated."""
    topic = unique_topic("rdk")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    acked = rdkafka_produce(broker.bootstrap, topic, keyed("rdk", N))
    assert len(acked) == N
    used = {p for p, _ in acked.values()}
    assert used == set(range(PARTITIONS)), f"keys spread over partitions {sorted(used)} only"
    records, ends = rdkafka_read_all(broker.bootstrap, topic, PARTITIONS)
    check_end_offsets(acked, ends, "librdkafka")
    verify_log(acked, records, label="librdkafka")
    state.update(topic=topic, acked=acked)


@pytest.mark.restart
def test_same_data_after_clean_restart(broker):
    """After SIGTERM and a restart on the same data dir, the same records sit at the same
    offsets, and new writes continue right after them."""
    if "topic" not in state:
        pytest.skip("needs test_keyed_idempotent_roundtrip")
    topic, acked = state["topic"], state["acked"]
    code = broker.restart()
    if broker.kind == "kaas":
        assert code == 0, f"kaas exited with {code} on SIGTERM, expected a clean exit (0)"
    records, ends = rdkafka_read_all(broker.bootstrap, topic, PARTITIONS)
    check_end_offsets(acked, ends, "after restart")
    verify_log(acked, records, label="after restart")

    more = rdkafka_produce(broker.bootstrap, topic, keyed("rdk", 1000, start=N))
    for v, (p, off) in more.items():
        assert off >= ends[p], f"new record {v!r} got offset {off} below old end {ends[p]}"
    acked = {**acked, **more}
    records, ends = rdkafka_read_all(broker.bootstrap, topic, PARTITIONS)
    check_end_offsets(acked, ends, "after restart + append")
    verify_log(acked, records, label="after restart + append")


@pytest.mark.restart
def test_acked_records_survive_sigkill(broker):
    """Records acknowledged with acks=all are all there after the broker is SIGKILLed and
    started again (recovery keeps every acked batch and offsets keep counting)."""
    if broker.external:
        pytest.skip("needs a broker started by the tests")
    topic = unique_topic("rdk-kill")
    create_topic(broker.bootstrap, topic, 3)
    acked = rdkafka_produce(broker.bootstrap, topic, keyed("kill", 20000))
    broker.kill()
    broker.start()
    records, ends = rdkafka_read_all(broker.bootstrap, topic, 3)
    check_end_offsets(acked, ends, "after SIGKILL")
    verify_log(acked, records, label="after SIGKILL")
    more = rdkafka_produce(broker.bootstrap, topic, keyed("kill", 500, start=20000))
    acked.update(more)
    records, ends = rdkafka_read_all(broker.bootstrap, topic, 3)
    verify_log(acked, records, label="after SIGKILL + append")


def roundtrip_1k(broker, n: int):
    """Produce n 1 KiB messages (acks=all, idempotent), read them all back, check, and print
    throughput."""
    size = 1024
    topic = unique_topic("rdk-1k")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    tag = "t"

    def items():
        for i in range(n):
            yield key_for(i), value_for(tag, i, size)

    small = {}

    t0 = time.monotonic()
    acked_seq = rdkafka_produce(
        broker.bootstrap, topic, items(), ack_key=seq_of, timeout=max(300, n / 1000),
        extra={"linger.ms": 10, "batch.size": 1000000, "queue.buffering.max.kbytes": 1048576,
               "queue.buffering.max.messages": 1000000})
    t_produce = time.monotonic() - t0
    assert len(acked_seq) == n
    for s, pos in acked_seq.items():
        small[value_for(tag, s)] = pos
    del acked_seq

    bad = []

    def record_fn(m):
        v = m.value()
        s = seq_of(v)
        if v != value_for(tag, s, size) and len(bad) < 5:
            bad.append((m.partition(), m.offset(), v[:40], len(v)))
        return (m.partition(), m.offset(), m.key(), value_for(tag, s))

    t0 = time.monotonic()
    records, ends = rdkafka_read_all(broker.bootstrap, topic, PARTITIONS,
                                     timeout=max(300, n / 1000), record_fn=record_fn,
                                     **{"fetch.max.bytes": 52428800,
                                        "max.partition.fetch.bytes": 4194304})
    t_consume = time.monotonic() - t0
    assert not bad, f"payload damaged: {bad}"
    check_end_offsets(small, ends, f"{n} x 1KiB")
    verify_log(small, records, label=f"{n} x 1KiB")
    mb = n * size / 1e6
    line = (f"[{broker.kind}] librdkafka round trip {n} x {size} B, {PARTITIONS} partitions, "
            f"acks=all idempotent: produce {mb / t_produce:.1f} MB/s ({n / t_produce:,.0f} msg/s, "
            f"{t_produce:.1f}s), consume {mb / t_consume:.1f} MB/s ({n / t_consume:,.0f} msg/s, "
            f"{t_consume:.1f}s)")
    print("\n" + line)
    tp_file = os.environ.get("KAAS_THROUGHPUT_FILE")
    if tp_file:
        with open(tp_file, "a") as f:
            f.write(line + "\n")
    return t_produce, t_consume


def test_roundtrip_100k_1kib(broker):
    """100k 1 KiB messages make the round trip through librdkafka with no loss and no
    duplicates (throughput printed with -s)."""
    roundtrip_1k(broker, 100_000)


@pytest.mark.long
@pytest.mark.skipif(not LONG, reason="set KAAS_LONG_TESTS=1 for the 1M-message round trip")
@pytest.mark.timeout(1800)
def test_roundtrip_1m_1kib(broker):
    """1 million 1 KiB messages make the round trip through librdkafka with no loss and no
    duplicates (throughput printed with -s)."""
    roundtrip_1k(broker, 1_000_000)
