"""Shared helpers for the client suites: message generation, the log checker, and small
librdkafka (confluent-kafka) utilities used to create topics and probe a broker."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

# -- message generation -----------------------------------------------------------------


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def key_for(i: int, nkeys: int = 1000) -> bytes:
    return b"key-%05d" % (i % nkeys)


def value_for(tag: str, i: int, size: int = 0) -> bytes:
    """A value that names its producer and its sequence number; padded to `size` bytes."""
    head = f"{tag}:{i:09d}:".encode()
    if size <= len(head):
        return head
    fill = (b"%09d" % i) * (size // 9 + 1)
    return head + fill[: size - len(head)]


def seq_of(value: bytes) -> int:
    return int(value.split(b":", 2)[1])


# -- the checker ------------------------------------------------------------------------


class LogMismatch(AssertionError):
    pass


def verify_log(acked: dict, records, expect_keys: bool = True, label: str = "") -> dict:
    """Check what was read back against what the broker acknowledged.

    acked:   {value: (partition, offset)} as reported by each producer ack.
    records: iterable of (partition, offset, key, value) read back from the topic.

    Proves: every acknowledged offset holds exactly the value acknowledged for it, every
    acknowledged value is read exactly once, nothing else is in the topic, offsets in each
    partition are contiguous from 0, the single producer's order is kept within each
    partition, and (if expect_keys) each key was stored with its value.
    Raises LogMismatch listing the first problems; returns per-partition counts."""
    problems: list[str] = []

    def problem(msg):
        if len(problems) < 25:
            problems.append(msg)

    by_pos: dict[tuple[int, int], bytes] = {}
    for v, pos in acked.items():
        other = by_pos.get(pos)
        if other is not None:
            problem(f"two acked values share {pos}: {other[:40]!r} and {v[:40]!r}")
        by_pos[pos] = v

    seen_pos: set[tuple[int, int]] = set()
    seen_val: dict[bytes, tuple[int, int]] = {}
    per_part: dict[int, list[tuple[int, int]]] = defaultdict(list)
    n = 0
    for p, off, key, value in records:
        n += 1
        pos = (p, off)
        if pos in seen_pos:
            problem(f"offset {pos} read twice")
            continue
        seen_pos.add(pos)
        if value in seen_val:
            problem(f"value {value[:40]!r} read at {seen_val[value]} and again at {pos}")
        seen_val[value] = pos
        want = by_pos.get(pos)
        if want is None:
            problem(f"unexpected record at {pos}: {value[:40]!r} (no ack reported this offset)")
        elif want != value:
            problem(f"offset {pos} holds {value[:40]!r} but the ack for it was for {want[:40]!r}")
        if expect_keys and key != key_for(seq_of(value)):
            problem(f"offset {pos} value {value[:40]!r} has key {key!r}, "
                    f"expected {key_for(seq_of(value))!r}")
        per_part[p].append((off, seq_of(value)))

    missing = [(pos, v) for pos, v in by_pos.items() if pos not in seen_pos]
    if missing:
        missing.sort()
        problem(f"{len(missing)} acknowledged records not read back, first: "
                f"{[(pos, v[:30]) for pos, v in missing[:5]]}")

    for p, rows in sorted(per_part.items()):
        rows.sort()
        offs = [o for o, _ in rows]
        if offs and (offs[0] != 0 or offs[-1] != len(offs) - 1):
            problem(f"partition {p}: offsets are not contiguous from 0 "
                    f"(first {offs[0]}, last {offs[-1]}, count {len(offs)})")
        seqs = [s for _, s in rows]
        for a, b in zip(seqs, seqs[1:]):
            if b <= a:
                problem(f"partition {p}: producer order broken, seq {b} stored after {a}")
                break

    if problems:
        raise LogMismatch(f"{label} read {n} records, {len(acked)} acked; problems:\n  "
                          + "\n  ".join(problems))
    return {p: len(rows) for p, rows in per_part.items()}


def check_end_offsets(acked: dict, end_offsets: dict, label: str = ""):
    """The broker's high watermark for each partition equals the number of acked records."""
    counts: dict[int, int] = defaultdict(int)
    for p, _ in acked.values():
        counts[p] += 1
    for p in set(counts) | set(end_offsets):
        assert end_offsets.get(p, 0) == counts.get(p, 0), (
            f"{label} partition {p}: end offset {end_offsets.get(p)} but "
            f"{counts.get(p, 0)} records were acknowledged")


# -- librdkafka (confluent-kafka) utilities ----------------------------------------------


def admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict | None = None,
                 timeout: float = 30):
    """Create a topic through CreateTopics and wait until Metadata shows all its partitions
    with a leader."""
    from confluent_kafka.admin import NewTopic
    a = admin(bootstrap)
    fut = a.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1,
                                    config=config or {})], request_timeout=timeout)
    fut[topic].result(timeout)
    wait_topic(bootstrap, topic, partitions, timeout)


def wait_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30):
    a = admin(bootstrap)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        md = a.list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        last = t
        if t is not None and t.error is None and len(t.partitions) == partitions and all(
                pm.leader >= 0 and pm.error is None for pm in t.partitions.values()):
            return md
        time.sleep(0.2)
    raise AssertionError(f"topic {topic} not ready with {partitions} partitions: {last}")


def rdkafka_consumer(bootstrap: str, **extra):
    """A librdkafka consumer for manual assignment. confluent-kafka insists on a group.id;
    nothing here subscribes or commits, so the group is never joined."""
    from confluent_kafka import Consumer
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": f"kaas-test-unused-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
    }
    conf.update(extra)
    return Consumer(conf)


def watermarks(consumer, tp, timeout: float = 20):
    """(low, high) watermarks; retriable errors (e.g. NOT_LEADER right after a restart, while
    leadership settles) are retried for up to `timeout` seconds, as clients do."""
    from confluent_kafka import KafkaError, KafkaException
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=10)
        except KafkaException as e:
            err = e.args[0]
            transient = err.retriable() or err.code() in (
                KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TIMED_OUT, KafkaError._TRANSPORT)
            if not transient or time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def rdkafka_read_all(bootstrap: str, topic: str, partitions: int, timeout: float = 180,
                     record_fn=None, **extra):
    """Read every record of `topic` from the beginning with assign(); returns
    (records [(partition, offset, key, value)], end_offsets {partition: high watermark}).
    record_fn(message) -> row replaces the default row (to check and shrink big values)."""
    from confluent_kafka import TopicPartition, OFFSET_BEGINNING, KafkaError
    c = rdkafka_consumer(bootstrap, **extra)
    try:
        ends = {}
        for p in range(partitions):
            lo, hi = watermarks(c, TopicPartition(topic, p))
            assert lo == 0, f"partition {p}: log start offset {lo}, expected 0"
            ends[p] = hi
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        records = []
        pos = {p: 0 for p in range(partitions)}
        deadline = time.monotonic() + timeout
        while any(pos[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out reading {topic}: at {pos}, ends {ends}")
            for m in c.consume(num_messages=10000, timeout=1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(f"consume error: {err}")
                if record_fn is None:
                    records.append((m.partition(), m.offset(), m.key(), m.value()))
                else:
                    records.append(record_fn(m))
                pos[m.partition()] = max(pos[m.partition()], m.offset() + 1)
        return records, ends
    finally:
        c.close()


def rdkafka_produce(bootstrap: str, topic: str, items, extra: dict | None = None,
                    timeout: float = 300, ack_key=None):
    """Produce (key, value) pairs with acks=all and idempotence; returns {value: (p, off)}
    from the delivery reports (keyed by ack_key(value) if given). Fails on any delivery
    error."""
    from confluent_kafka import Producer
    conf = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "message.timeout.ms": int(timeout * 1000),
    }
    conf.update(extra or {})
    p = Producer(conf)
    acked: dict[bytes, tuple[int, int]] = {}
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            if len(errors) < 10:
                errors.append(f"{msg.value()[:40]!r}: {err}")
            return
        v = msg.value()
        acked[v if ack_key is None else ack_key(v)] = (msg.partition(), msg.offset())

    deadline = time.monotonic() + timeout
    for key, value in items:
        while True:
            try:
                p.produce(topic, value=value, key=key, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
                if time.monotonic() > deadline:
                    raise AssertionError("producer queue stayed full")
        p.poll(0)
    remaining = p.flush(max(1.0, deadline - time.monotonic()))
    assert not errors, f"delivery errors: {errors}"
    assert remaining == 0, f"{remaining} messages still undelivered after {timeout}s"
    return acked


def assert_serves(broker, label: str = ""):
    """The broker is alive and a normal client can create, write and read a topic."""
    from confluent_kafka import Producer, TopicPartition
    if not broker.external:
        assert broker.alive(), f"{label}: broker process died; log:\n{broker.log_tail()}"
    topic = unique_topic("alive")
    create_topic(broker.bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                  "enable.idempotence": True, "message.timeout.ms": 20000})
    got = []
    p.produce(topic, key=b"k", value=b"still-serving",
              on_delivery=lambda err, m: got.append((err, m.partition(), m.offset())))
    assert p.flush(25) == 0, f"{label}: produce not acknowledged"
    assert got and got[0][0] is None, f"{label}: produce failed: {got}"
    assert got[0][1:] == (0, 0), f"{label}: first record of a new topic at {got[0][1:]}"
    records, ends = rdkafka_read_all(broker.bootstrap, topic, 1, timeout=30)
    assert ends == {0: 1}
    assert records == [(0, 0, b"k", b"still-serving")], f"{label}: read back {records}"
