"""Cluster mode on real processes: three kaas brokers sharing one data directory with the file
Lease, faults injected (SIGKILL, SIGTERM, SIGSTOP/SIGCONT, restart, a forged stale assignment
file) under an idempotent acks=all load, and global invariants checked at the end: every
acknowledged record is stored exactly once, at its acknowledged offset, in produce order within
its partition, and nothing else is stored.

Each test starts its own brokers on free ports with short Lease timings (3 s / 2 s / 0.5 s) so a
failover fits in test time, and kills them at teardown. Logs go to `broker-<id>.log` in the
test's tmp dir; their tails are printed when a test fails. The randomized chaos test runs only
with KAAS_LONG_TESTS=1 (its length: KAAS_CHAOS_SECONDS, default 240; seed: KAAS_CHAOS_SEED).
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

LONG = os.environ.get("KAAS_LONG_TESTS", "") not in ("", "0")

from kcluster import DRAIN_TIMEOUT_MS, FAILOVER_BOUND_S, Cluster, logs_on_failure
from kcluster import make_cluster  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("KAAS_TEST_BOOTSTRAP")) or os.environ.get("KAAS_TEST_APACHE_KAFKA", "") not in ("", "0"),
    reason="cluster mode tests start their own kaas brokers")


# -- clients -----------------------------------------------------------------------------------

def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10).values():
        fut.result(timeout=30)


def delete_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_topics([name], operation_timeout=10).values():
        fut.result(timeout=30)


def metadata_leaders(bootstrap: str, topic: str | None = None):
    """(broker ids, {topic: {partition: (leader, error)}}) as one broker's Metadata tells it."""
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic=topic, timeout=10)
    topics = {t: {p: (pm.leader, pm.error) for p, pm in tm.partitions.items()}
              for t, tm in md.topics.items() if tm.error is None}
    return sorted(md.brokers), topics


def file_leaders(a: dict, topic: str) -> dict[int, int]:
    return {p["partition"]: p["leader"] for p in a["partitions"] if p["topic"] == topic}


def producer_debug(tag: str) -> dict:
    contexts = os.environ.get("KAAS_PRODUCER_DEBUG")
    if not contexts:
        return {}
    import logging
    log = logging.getLogger(f"rdkafka-{tag}")
    handler = logging.FileHandler(os.environ.get("KAAS_PRODUCER_DEBUG_FILE", f"/tmp/rdkafka-{tag}.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    return {"debug": contexts, "logger": log}


class Load:
    """An idempotent acks=all producer writing continuously from a thread, round-robin over the
    partitions. Values are `<tag>-<partition>-<per-partition sequence>`, so the consumer can
    check produce order; every acknowledgement is recorded with its offset and time."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, tag: str, round_sleep_s: float = 0.01):
        self.topic, self.partitions, self.tag = topic, partitions, tag
        self.round_sleep_s = round_sleep_s
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "retries": 10_000_000, "delivery.timeout.ms": 120_000, "message.timeout.ms": 120_000,
            "request.timeout.ms": 10_000, "retry.backoff.ms": 100, "linger.ms": 5,
            "topic.metadata.refresh.interval.ms": 2000, "log.connection.close": False,
            "error_cb": self._on_error,
            # KAAS_PRODUCER_DEBUG=eos,msg (for example) writes librdkafka's debug log to
            # $KAAS_PRODUCER_DEBUG_FILE: what a fault run needs to tell why the producer did what.
            **producer_debug(tag),
        })
        self.acked: dict[tuple[int, int], bytes] = {}
        # librdkafka's "implicit acks": a request that timed out (or whose connection broke)
        # with its fate unknown, followed by a later batch of the same partition that
        # succeeded, proves the first was stored; librdkafka then reports it delivered with no
        # offset (rdkafka_request.c, rd_kafka_handle_idempotent_Produce_success). Kafka gives
        # the same when its response is lost. Checked by value in `verify`.
        self.acked_no_offset: list[tuple[int, bytes]] = []
        self.ack_times: list[tuple[float, int]] = []  # (monotonic time, partition)
        self.failed: list[tuple[int, bytes, str]] = []
        self.double_acks: list[tuple[int, int]] = []
        self.fatal: list[str] = []
        self.sent = 0
        self.seq = [0] * partitions
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"load-{tag}", daemon=True)
        self._finished = False

    def _on_error(self, err) -> None:
        if err.fatal():
            self.fatal.append(str(err))

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self.failed.append((msg.partition(), msg.value(), str(err)))
            return
        if msg.offset() is None or msg.offset() < 0:
            self.acked_no_offset.append((msg.partition(), msg.value()))
            self.ack_times.append((time.monotonic(), msg.partition()))
            return
        key = (msg.partition(), msg.offset())
        if key in self.acked:
            self.double_acks.append(key)
        self.acked[key] = msg.value()
        self.ack_times.append((time.monotonic(), msg.partition()))

    def _run(self) -> None:
        p = 0
        while not self._stop.is_set():
            value = f"{self.tag}-{p}-{self.seq[p]:08d}".encode()
            try:
                self.producer.produce(self.topic, value=value, partition=p, on_delivery=self._on_delivery)
            except BufferError:
                self.producer.poll(0.05)
                continue
            except KafkaException as e:
                self.fatal.append(f"produce raised {e}")
                return
            self.seq[p] += 1
            self.sent += 1
            self.producer.poll(0)
            p = (p + 1) % self.partitions
            if p == 0:
                time.sleep(self.round_sleep_s)

    def start(self) -> "Load":
        self._thread.start()
        return self

    def wait_acks(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < n:
            assert not self.fatal, f"producer fatal error: {self.fatal}"
            assert time.monotonic() < deadline, f"only {len(self.acked)} of {n} records acknowledged in {timeout:.0f}s"
            time.sleep(0.05)

    def partitions_acked_since(self, t: float) -> set[int]:
        return {p for (at, p) in list(self.ack_times) if at > t}

    def wait_acks_everywhere_since(self, t: float, timeout: float = 60.0) -> float:
        """Waits until every partition had an acknowledgement after `t`; returns when."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.partitions_acked_since(t)
            if len(got) == self.partitions:
                return time.monotonic()
            assert not self.fatal, f"producer fatal error: {self.fatal}"
            assert time.monotonic() < deadline, (
                f"partitions {sorted(set(range(self.partitions)) - got)} got no acknowledgement"
                f" in the {timeout:.0f}s after the fault")
            time.sleep(0.05)

    def stop(self, flush_timeout_s: float = 150.0) -> None:
        """Stops producing and waits for every record sent to be acknowledged or failed."""
        self._stop.set()
        self._thread.join(30)
        remaining = self.producer.flush(flush_timeout_s)
        self._finished = True
        assert remaining == 0, f"{remaining} records neither acknowledged nor failed after {flush_timeout_s}s"

    def abort(self) -> None:
        """Teardown: stop without waiting for anything."""
        if not self._finished:
            self._stop.set()
            if self._thread.ident is not None:
                self._thread.join(30)
            self.producer.purge()
            self.producer.flush(1)
            self._finished = True
        self.producer = None  # destroys the client now (its callbacks refer back to this object)

    def check_client_side(self) -> None:
        """Every record sent was acknowledged once: nothing failed, nothing acknowledged twice."""
        assert not self.fatal, f"producer fatal error: {self.fatal}"
        assert not self.double_acks, f"offsets acknowledged twice: {self.double_acks[:10]}"
        assert not self.failed, (f"{len(self.failed)} of {self.sent} records failed delivery"
                                 f" (the brokers were available well within delivery.timeout.ms),"
                                 f" e.g. {self.failed[:5]}")
        n_acked = len(self.acked) + len(self.acked_no_offset)
        assert n_acked == self.sent, f"{n_acked} acknowledged of {self.sent} sent"


def close_bounded(consumer, what: str, timeout_s: float = 30.0) -> None:
    """Closes a librdkafka consumer, giving up after `timeout_s`. librdkafka 2.12 can deadlock
    in close when an OffsetForLeaderEpoch request is still queued for a broker it is
    decommissioning (a lock-order inversion between the handle's rwlock and the partition's
    mutex: rd_kafka_toppar_forget_leader against the OffsetForLeaderEpoch error path's leader
    query; confluentinc/librdkafka#5476, seen here after a 14-minute chaos run). What the
    consumer read is already collected, so the test goes on and the client is leaked."""
    t = threading.Thread(target=consumer.close, name=f"close {what}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        sys.stderr.write(f"\n{what}: close() did not return in {timeout_s:.0f}s (librdkafka"
                         " deadlock, confluentinc/librdkafka#5476); leaving it\n")


class Tail:
    """A consumer reading every partition from the start while faults happen, with
    `auto.offset.reset=error`: where librdkafka detects a log truncation after a leader change
    (OffsetForLeaderEpoch answered an end offset below what it had already read) it reports an
    error instead of silently skipping records. `check` then asserts there was none and that it
    read every stored record once, in offset order, with no gap."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        self.topic, self.partitions = topic, partitions
        self.conf = {
            "bootstrap.servers": bootstrap, "group.id": f"tail-{topic}", "enable.auto.commit": False,
            "auto.offset.reset": "error", "check.crcs": True, "fetch.error.backoff.ms": 100,
            "topic.metadata.refresh.interval.ms": 2000, "log.connection.close": False,
        }
        self.consumer = Consumer(self.conf)
        self.read: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        self.errors: list[str] = []
        # Consumers replaced because they stopped reading: (records read then, seconds stalled).
        self.replaced: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tail-{topic}", daemon=True)

    def _run(self) -> None:
        self.consumer.assign([
            TopicPartition(self.topic, p, self.read[p][-1][0] + 1 if self.read[p] else 0)
            for p in range(self.partitions)])
        while not self._stop.is_set():
            for m in self.consumer.consume(1000, 0.2):
                if m.error():
                    self.errors.append(f"partition {m.partition()}: {m.error()}")
                else:
                    self.read[m.partition()].append((m.offset(), m.value()))

    def start(self) -> "Tail":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(30)
        if self.consumer is not None:
            close_bounded(self.consumer, "the tailing consumer")
            self.consumer = None

    def _replace(self, stalled_s: float) -> None:
        """The consumer stopped reading while records wait: librdkafka 2.12 can deadlock its
        main thread (confluentinc/librdkafka#5476: an OffsetForLeaderEpoch error handled while
        a broker connection fails), and nothing is fetched after that. A fresh consumer goes on
        from the next offset of each partition; what the old one read stays checked, and the
        replacement is reported."""
        self.replaced.append((sum(map(len, self.read.values())), round(stalled_s)))
        self.stop()
        self.consumer = Consumer(self.conf)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tail-{self.topic}", daemon=True)
        self._thread.start()

    def check(self, stored_counts: dict[int, tuple[int, int]], timeout_s: float = 180.0) -> int:
        """Waits (bounded) until it read up to each partition's high watermark in
        `stored_counts` ({p: (log start, high watermark)}), stops, and checks. Returns the
        number of records it read."""
        deadline = time.monotonic() + timeout_s
        def behind():
            return {p: (len(self.read[p]), h - low) for p, (low, h) in stored_counts.items()
                    if len(self.read[p]) < h - low}
        def total():
            return sum(map(len, self.read.values()))
        progress = (total(), time.monotonic())
        while behind() and not self.errors and time.monotonic() < deadline:
            time.sleep(0.2)
            if total() != progress[0]:
                progress = (total(), time.monotonic())
            elif time.monotonic() - progress[1] > 20:
                self._replace(time.monotonic() - progress[1])
                progress = (total(), time.monotonic())
        if self.replaced:
            print(f"\ntailing consumer replaced {len(self.replaced)} time(s) after it stopped reading"
                  f" (records read then, seconds without progress): {self.replaced}")
        self.stop()
        assert not self.errors, (f"the tailing consumer (auto.offset.reset=error) got {len(self.errors)}"
                                 f" errors, e.g. {self.errors[:5]}")
        assert not behind(), f"the tailing consumer read only (got, stored) {behind()} in {timeout_s:.0f}s"
        for p, recs in self.read.items():
            offsets = [o for o, _ in recs]
            low = stored_counts[p][0]
            assert offsets == list(range(low, low + len(recs))), (
                f"partition {p}: the tailing consumer's offsets are not contiguous from {low}"
                f" (first gap after {next((a for a, b in zip(offsets, offsets[1:]) if b != a + 1), None)})")
        return sum(map(len, self.read.values()))


def drain_and_return(c: Cluster, victim, partitions: int) -> None:
    """SIGTERM `victim` (it hands its partitions over in order and exits 0), start it again and
    wait for the rebalance back: two orderly handovers of its share."""
    victim.signal(signal.SIGTERM)
    assert victim.proc.wait(DRAIN_TIMEOUT_MS / 1000 + 15) == 0
    c.wait_settled(partitions, timeout=30)
    victim.start()
    c.wait_all_ready()
    c.wait_settled(partitions, balanced=True)


@logs_on_failure
def test_led_partitions_past_the_open_file_budget_close_and_reopen(make_cluster):
    """Each broker leads 20 of 60 partitions with room for 16 open segment files: idle logs are
    closed and reopened under load, through a drain and the rebalance back, and every
    acknowledged record is stored once, in order, at its offset."""
    c = make_cluster(3, extra_args=("--max-open-log-files", "16"))
    create_topic(c.bootstrap(), "budget", 60)
    c.wait_settled(60, balanced=True)
    load = Load(c.bootstrap(), "budget", 60, "a").start()
    try:
        load.wait_acks(3000)
        ctl = c.wait_controller()
        victim = next(n for n in c.nodes if n is not ctl)
        drain_and_return(c, victim, 60)
        load.wait_acks_everywhere_since(time.monotonic(), timeout=60)
        load.stop()
        load.check_client_side()
        evicted = {}
        for n in c.running():
            lim = json.loads(n._get("/healthz")[1])["limits"]
            evicted[n.id] = (lim["logs_evicted"], lim["log_files_open"], lim["max_open_log_files"])
        n_stored = verify(c.bootstrap(c.running()), "budget", 60, [load])
        print(f"\nopen-file budget 16, 20 partitions led per broker: (logs closed for room, files"
              f" open, budget) {evicted}, {len(load.acked)} acknowledged, {n_stored} stored")
        assert all(e > 0 for e, _, _ in evicted.values()), evicted
    finally:
        load.abort()


class RefusalProbe:
    """A producer without retries writing acks=all to every partition of `topic` from a thread,
    sorting each outcome: acknowledged (value → where), refused as not leader, answered
    "possibly persisted" (REQUEST_TIMED_OUT), or another error. `check` then holds the log to
    what was said: every acknowledgement kept, nothing stored twice, nothing refused as not
    leader stored anyway — librdkafka retries NOT_LEADER_OR_FOLLOWER even with retries=0 (it
    means "not written"), so a stored write refused with it comes back as a second copy."""

    def __init__(self, c, topic: str, prefix: str, config: dict, poll_every: int, poll_s: float):
        self.c, self.topic = c, topic
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.refused: list[tuple[int, bytes]] = []
        self.unknown: list[tuple[int, bytes]] = []
        self.other: Counter = Counter()
        self._stop = threading.Event()
        self._args = (prefix, config, poll_every, poll_s)
        self._thread = threading.Thread(target=self._produce, daemon=True)

    def _on_delivery(self, err, msg):
        if err is None:
            self.acked[msg.value()] = (msg.partition(), msg.offset())
        elif err.code() == KafkaError.NOT_LEADER_FOR_PARTITION:
            self.refused.append((msg.partition(), msg.value()))
        elif err.code() == KafkaError.REQUEST_TIMED_OUT:
            self.unknown.append((msg.partition(), msg.value()))
        else:
            self.other[err.name()] += 1

    def _produce(self):
        prefix, config, poll_every, poll_s = self._args
        pr = Producer({"bootstrap.servers": self.c.bootstrap(), "acks": "all", "enable.idempotence": False,
                       "retries": 0, "linger.ms": 1, "topic.metadata.refresh.interval.ms": 1000, **config})
        n = 0
        while not self._stop.is_set():
            try:
                pr.produce(self.topic, value=f"{prefix}-{n:09d}".encode(), partition=n % 12,
                           on_delivery=self._on_delivery)
                n += 1
            except BufferError:
                pass
            pr.poll(0 if n % poll_every else poll_s)
        pr.flush(90)

    def start(self) -> "RefusalProbe":
        self._thread.start()
        return self

    def stop(self, join_s: float) -> None:
        self._stop.set()
        self._thread.join(join_s)

    def check(self) -> tuple[int, int, dict]:
        """The invariants above; returns (values stored twice, possibly-persisted answers
        kept, where each value is stored)."""
        stored = read_all(self.c.bootstrap(), self.topic, 12)
        where = {v: (p, off) for p, (_, recs) in stored.items() for off, v in recs}
        lost = [(v, at) for v, at in self.acked.items() if where.get(v) != at]
        assert not lost, f"{len(lost)} acknowledged writes missing or moved: {lost[:5]}"
        counts = Counter(v for _, (_, recs) in stored.items() for _, v in recs)
        twice = [(v, n) for v, n in counts.items() if n > 1]
        kept = [(p, v, where[v]) for p, v in self.refused if v in where]
        assert not twice, f"{len(twice)} values stored more than once, e.g. {twice[:5]}"
        assert not kept, (f"{len(kept)} writes refused with NOT_LEADER_OR_FOLLOWER are stored anyway"
                          f" (partition, value, stored at): {kept[:5]}")
        assert len(self.acked) > 1000
        return len(twice), sum(v in where for _, v in self.unknown), where


@logs_on_failure
def test_orderly_handover_refuses_only_what_it_did_not_store(make_cluster):
    """Partitions handed over in order (a drain, then the rebalance back) while a producer
    without retries writes acks=all: a write the old leader stored before it let go is
    acknowledged, and one refused with NOT_LEADER_OR_FOLLOWER is not in the log. librdkafka
    reads that error as "not persisted"; refusing stored writes let an idempotent producer's
    epoch bump send them again, stored twice (the controller-pause fault run)."""
    c = make_cluster(3)
    create_topic(c.bootstrap(), "orderly", 12)
    c.wait_settled(12, balanced=True)
    probe = RefusalProbe(c, "orderly", "o", {"max.in.flight.requests.per.connection": 1,
                                             **producer_debug("orderly")}, 50, 0.001).start()
    try:
        for cycle in range(3):
            ctl = c.wait_controller()
            victim = next(n for n in c.nodes if n is not ctl and n.running())
            time.sleep(1.0)
            drain_and_return(c, victim, 12)
    finally:
        probe.stop(90)
    twice, _, _ = probe.check()
    print(f"\norderly handovers: {len(probe.acked)} acknowledged, {len(probe.refused)} refused as not leader,"
          f" {twice} stored twice, other errors {dict(probe.other)}")


@logs_on_failure
def test_only_a_hole_from_before_a_take_over_is_answered_not_leader(make_cluster):
    """In its first minute as a partition's leader, a broker answers a hole in an idempotent
    producer's sequence NOT_LEADER_OR_FOLLOWER if the producer's last batch was stored before
    it took over: the previous leader may have refused the missing batch unstored
    (shard/src/refused.rs). Anything else is Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER: a batch that
    goes back before the stored sequence, and a hole after a batch this leader stored itself.
    kaas answered both NOT_LEADER_OR_FOLLOWER for a minute (KafkaJS's produce test sends them
    to a topic just created, and expects 45)."""
    import kwire
    from kafka.protocol.admin import AlterPartitionReassignmentsRequest as APR
    c = make_cluster(3)
    create_topic(c.bootstrap(), "holes", 1)
    first = file_leaders(c.wait_settled(1)[0], "holes")[0]
    ranges = kwire.api_versions(c.nodes[0])
    version = kwire.pick_produce_version(ranges)
    pid, epoch = kwire.init_producer_id(c.nodes[0], ranges)

    def send(node, seq, n=1):
        batch = kwire.record_batch([(b"k", b"v%d" % (seq + i)) for i in range(n)],
                                   producer_id=pid, producer_epoch=epoch, base_sequence=seq)
        with kwire.connect(node) as s:
            s.settimeout(15)
            return kwire.produce(s, version, 1, "holes", 0, batch)

    leader = next(n for n in c.nodes if n.id == first)
    assert send(leader, 0, 3) == (0, 0)
    assert send(leader, 1, 3)[0] == 45, "a rewind on a new topic"
    assert send(leader, 10)[0] == 45, "a hole after a batch this leader stored"

    # Leadership moves: the new leader has stored nothing of this producer's.
    target = next(n for n in c.nodes if n.id != first)
    r = kwire.send(c.wait_controller(), APR[0](timeout_ms=30_000, topics=[APR.ReassignableTopic(
        name="holes", partitions=[APR.ReassignableTopic.ReassignablePartition(
            partition_index=0, replicas=[target.id])])]))
    assert r.error_code == 0 and r.responses[0].partitions[0].error_code == 0, r
    c.wait(lambda: (a := c.settled(1)) and file_leaders(a[0], "holes")[0] == target.id, 60,
           f"partition 0 led by broker {target.id}")
    assert send(target, 10)[0] == 6, "a hole the previous leader may have left"
    assert send(target, 1, 3)[0] == 45, "a rewind after the move"
    assert send(target, 3) == (0, 3)
    assert send(target, 10)[0] == 45, "a hole after a batch the new leader stored"


@logs_on_failure
def test_paused_leader_refuses_as_not_leader_only_what_it_did_not_store(make_cluster):
    """A leader paused (SIGSTOP) with acks=all writes in flight loses its partitions by time;
    resumed, it must not call a write it had stored "not leader": librdkafka reads
    NOT_LEADER_OR_FOLLOWER as "not persisted" and sends it again (even with retries=0, and under
    new sequence numbers after an idempotent epoch bump), so the value was stored twice (82
    values in 3 pauses before the fix). A write it cannot prove kept gets REQUEST_TIMED_OUT
    ("possibly persisted") instead."""
    c = make_cluster(3)
    create_topic(c.bootstrap(), "bytime", 12)
    c.wait_settled(12, balanced=True)
    # About 5,000 records/s: enough in flight at every pause, and a queue that drains well
    # within message.timeout.ms.
    probe = RefusalProbe(c, "bytime", "t", {"request.timeout.ms": 30_000, "message.timeout.ms": 60_000},
                         10, 0.002).start()
    try:
        for cycle in range(3):
            ctl = c.wait_controller()
            victim = next(n for n in c.nodes if n is not ctl and n.running())
            time.sleep(1.5)
            victim.pause()
            # Past the write fence and the handover margin: the controller moves its partitions
            # by time, and the successor recovers what the paused broker had stored.
            c.wait_settled(12, timeout=60)
            time.sleep(0.5)
            victim.resume()
            c.wait_settled(12, balanced=True, timeout=90)
    finally:
        probe.stop(120)
    twice, unknown_kept, _ = probe.check()
    print(f"\nleader paused past its fence 3 times: {len(probe.acked)} acknowledged, {len(probe.refused)} refused"
          f" as not leader, {len(probe.unknown)} answered possibly persisted ({unknown_kept} of them kept),"
          f" {twice} stored twice, other errors {dict(probe.other)}")


def read_all(bootstrap: str, topic: str, partitions: int, timeout_s: float = 120.0):
    """Every record of the topic by partition: {p: (log start, [(offset, value), ...])}."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                  "check.crcs": True, "auto.offset.reset": "earliest", "fetch.error.backoff.ms": 100})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15) for p in range(partitions)}
        c.assign([TopicPartition(topic, p, ends[p][0]) for p in range(partitions)])
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        seen: set[tuple[int, int]] = set()
        want = sum(h - low for low, h in ends.values())
        deadline = time.monotonic() + timeout_s
        while sum(map(len, out.values())) < want and time.monotonic() < deadline:
            for m in c.consume(10000, 0.5):
                if m.error():
                    raise KafkaException(m.error())
                key = (m.partition(), m.offset())
                assert key not in seen, f"offset {key} delivered twice to one consumer"
                seen.add(key)
                if m.offset() < ends[m.partition()][1]:
                    out[m.partition()].append((m.offset(), m.value()))
        got = {p: len(v) for p, v in out.items()}
        assert all(got[p] == h - low for p, (low, h) in ends.items()), (
            f"read {got} records per partition below the high watermarks, watermarks {ends}")
        return {p: (ends[p][0], sorted(out[p])) for p in range(partitions)}
    finally:
        c.close()


def parse_value(v: bytes) -> tuple[str, int, int]:
    tag, p, seq = v.decode().rsplit("-", 2)
    return tag, int(p), int(seq)


def verify(bootstrap: str, topic: str, partitions: int, loads: list[Load], tail: "Tail | None" = None) -> int:
    """The global invariants over everything stored in `topic`, written only by `loads` (in
    that order): every acknowledged value at its acknowledged offset, no value stored twice,
    no value that was never sent, contiguous offsets, per-partition produce order. Returns the
    number of records stored."""
    stored = read_all(bootstrap, topic, partitions)
    if tail is not None:
        counts = {p: (start, start + len(recs)) for p, (start, recs) in stored.items()}
        n_tail = tail.check(counts)
        for p, (_, recs) in stored.items():
            assert tail.read[p] == recs[:len(tail.read[p])], (
                f"partition {p}: the tailing consumer read other values than are stored")
        print(f"tailing consumer (auto.offset.reset=error): {n_tail} records, no error, no gap")
    order = {load.tag: i for i, load in enumerate(loads)}
    at = {(p, off): v for p, (_, recs) in stored.items() for off, v in recs}

    wrong = []
    for load in loads:
        for key, v in load.acked.items():
            if at.get(key) != v:
                wrong.append((key, v, at.get(key)))
    assert not wrong, (f"{len(wrong)} acknowledged records missing or changed"
                       f" ((partition, offset), acknowledged value, stored value): {wrong[:10]}")

    where = {v: p for (p, _), v in at.items()}
    unplaced = [(p, v) for load in loads for p, v in load.acked_no_offset if where.get(v) != p]
    assert not unplaced, (f"{len(unplaced)} records acknowledged without an offset are not stored in"
                          f" their partition: {unplaced[:10]}")

    dups = [v for v, n in Counter(at.values()).items() if n > 1]
    assert not dups, f"{len(dups)} values stored more than once, e.g. {[(v, [k for k, x in at.items() if x == v]) for v in dups[:5]]}"

    for p, (start, recs) in stored.items():
        offsets = [off for off, _ in recs]
        assert offsets == list(range(start, start + len(recs))), f"partition {p}: offsets not contiguous from {start}"
        prev = None
        for off, v in recs:
            tag, vp, seq = parse_value(v)
            assert tag in order and vp == p, f"partition {p} offset {off}: unexpected value {v!r}"
            assert seq < next(l for l in loads if l.tag == tag).sent, f"partition {p} offset {off}: {v!r} was never sent"
            key = (order[tag], seq)
            assert prev is None or key > prev, (
                f"partition {p} offset {off}: {v!r} stored after {prev} — produce order broken")
            prev = key

    # With every record acknowledged (checked on the client side), the log holds exactly them.
    acked_values = {v for load in loads for v in load.acked.values()}
    acked_values |= {v for load in loads for _, v in load.acked_no_offset}
    extra = set(at.values()) - acked_values
    if all(not load.failed for load in loads):
        assert not extra, f"{len(extra)} stored values were never acknowledged: {sorted(extra)[:10]}"
    return len(at)


def settle_and_verify(c, load: Load, topic: str, partitions: int, tail: Tail | None = None) -> int:
    """After a fault run: every broker ready, leadership balanced, every partition writable
    again, the load stopped with every record acknowledged; then the global invariants
    (`verify`). Returns the number of records stored."""
    c.wait_all_ready(timeout=90)
    c.wait_settled(partitions, balanced=True, timeout=90)
    load.wait_acks_everywhere_since(time.monotonic(), timeout=90)
    load.stop()
    load.check_client_side()
    return verify(c.bootstrap(), topic, partitions, [load], tail)


# -- tests -------------------------------------------------------------------------------------

@logs_on_failure
def test_three_brokers_elect_one_controller_and_balance_4_4_4(make_cluster):
    """Three brokers elect exactly one controller, spread a 12-partition topic 4/4/4, agree with
    Metadata about the leaders, and serve produce and fetch through any bootstrap broker."""
    c = make_cluster(3)
    ctl = c.wait_controller()
    hs = c.health()
    assert [i for i, h in hs.items() if h["is_controller"]] == [ctl.id]
    assert {h["lease_epoch"] for h in hs.values()} == {hs[ctl.id]["lease_epoch"]}
    lease = json.loads(c.lease_path.read_text())
    assert lease["holder"].split("@")[0] == str(ctl.id)
    # Brokers started together on a fresh volume each keep their own emergency ballast; they
    # used to race on one file ("could not write the emergency ballast ... No such file").
    for n in c.nodes:
        assert (c.data_dir / "__meta" / f"ballast-broker-{n.id}").stat().st_size >= 64 << 10
        assert "could not write the emergency ballast" not in n.log_tail(1 << 20), f"broker {n.id}"

    create_topic(c.bootstrap(), "balanced", 12)
    a, led = c.wait_settled(12)
    assert led == {0: 4, 1: 4, 2: 4}, led
    assert Counter(p["leader"] for p in a["partitions"]) == {0: 4, 1: 4, 2: 4}
    assert sorted(p["partition"] for p in a["partitions"]) == list(range(12))
    assert sorted(b["id"] for b in a["brokers"]) == [0, 1, 2]
    assert all(b["health"] == "alive" for b in a["brokers"])

    want = file_leaders(a, "balanced")
    for n in c.nodes:
        brokers, topics = metadata_leaders(n.bootstrap, "balanced")
        assert brokers == [0, 1, 2], f"Metadata from broker {n.id} lists brokers {brokers}"
        got = {p: leader for p, (leader, err) in topics["balanced"].items()}
        assert got == want, f"Metadata from broker {n.id}: leaders {got}, assignment.json {want}"

    p = Producer({"bootstrap.servers": c.nodes[1].bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    acked: dict[tuple[int, int], bytes] = {}

    def on_delivery(err, msg):
        assert err is None, err
        acked[(msg.partition(), msg.offset())] = msg.value()
    for i in range(360):
        p.produce("balanced", value=f"v-{i}".encode(), key=f"k{i}".encode(), on_delivery=on_delivery)
    assert p.flush(60) == 0
    assert len(acked) == 360
    assert len({part for part, _ in acked}) == 12, "the keys should spread over every partition"
    stored = read_all(c.nodes[2].bootstrap, "balanced", 12)
    at = {(part, off): v for part, (_, recs) in stored.items() for off, v in recs}
    assert at == acked


def start_load(c: Cluster, tag: str = "a") -> Load:
    """A balanced 12-partition topic `load` and a Load writing to it."""
    create_topic(c.bootstrap(), "load", 12)
    c.wait_settled(12, balanced=True)
    return Load(c.bootstrap(), "load", 12, tag)


def sigkill_under_load(c: Cluster, load: Load, victim_is_controller: bool):
    """Common body: SIGKILL a broker under load, wait for every partition to be led by the
    survivors. Returns (victim, new controller, failover seconds, old lease epoch, acks before
    the kill)."""
    ctl = c.wait_controller()
    old_epoch = ctl.healthz()["lease_epoch"]
    victim = ctl if victim_is_controller else next(n for n in c.nodes if n is not ctl)
    load.start()
    load.wait_acks(600)
    killed_at = time.monotonic()
    victim.kill()
    acked_at_kill = len(load.acked)
    new_ctl = c.wait_controller(timeout=30, newer_than=old_epoch if victim_is_controller else -1)
    _, led = c.wait_settled(12, timeout=30)
    failover_s = time.monotonic() - killed_at
    assert victim.id not in led
    return victim, new_ctl, failover_s, old_epoch, acked_at_kill


@logs_on_failure
def test_controller_sigkill_under_load_loses_nothing(make_cluster):
    """SIGKILL of the controller under idempotent acks=all load: a new controller with a higher
    epoch takes over, every partition is led again, writes keep being acknowledged, and every
    acknowledged record is stored exactly once at its offset, in order."""
    c = make_cluster(3)
    load = start_load(c)
    tail = Tail(c.bootstrap(), "load", 12).start()
    try:
        victim, new_ctl, failover_s, old_epoch, acked_at_kill = sigkill_under_load(c, load, victim_is_controller=True)
        h = new_ctl.healthz()
        a = c.assignment()
        assert new_ctl is not victim
        assert h["lease_epoch"] > old_epoch and a["controller_epoch"] > old_epoch, (h, old_epoch)
        assert json.loads(c.lease_path.read_text())["lease_transitions"] == h["lease_epoch"]
        assert [b["health"] for b in a["brokers"] if b["id"] == victim.id] == ["dead"], a["brokers"]
        recovered = time.monotonic()
        acks_everywhere = load.wait_acks_everywhere_since(recovered, timeout=60)
        load.wait_acks(len(load.acked) + 500, timeout=60)
        load.stop()
        load.check_client_side()
        n = verify(c.bootstrap(c.running()), "load", 12, [load], tail)
        print(f"\ncontroller SIGKILL: failover (kill -> all 12 partitions led by survivors) {failover_s:.2f}s;"
              f" every partition acknowledged again {acks_everywhere - recovered:.2f}s after that;"
              f" {acked_at_kill} acks before the kill, {len(load.acked)} in all, {n} stored")
        assert failover_s < FAILOVER_BOUND_S, f"failover took {failover_s:.1f}s"
    finally:
        tail.stop()
        load.abort()


LOST = "heartbeat stream to the controller lost"


@logs_on_failure
def test_a_controller_failover_is_logged_once_per_broker(make_cluster):
    """A follower says once that its heartbeat stream to the controller is lost, and once that
    it is back, however often it re-dials the dead controller while the Lease runs out (each
    failed dial was a WARN saying "lost": 5 to 7 per follower with 3 s Leases). Brokers started
    together say nothing alarming while the controller's heartbeat port comes up."""
    c = make_cluster(3)
    ctl = c.wait_controller()
    old_epoch = ctl.healthz()["lease_epoch"]
    followers = [n for n in c.nodes if n is not ctl]
    for n in c.nodes:
        warns = [ln for ln in n.log_path.read_text().splitlines() if " WARN " in ln or " ERROR " in ln]
        assert warns == [], f"broker {n.id} at start: {warns}"
    offsets = {n.id: n.log_path.stat().st_size for n in followers}

    def since_kill(n) -> str:
        return n.log_path.read_bytes()[offsets[n.id]:].decode(errors="replace")
    ctl.kill()
    c.wait_controller(timeout=30, newer_than=old_epoch)
    c.wait(lambda: all(re.search(LOST + r"(.|\n)*heartbeat stream to the controller open",
                                 since_kill(n)) for n in followers),
           30, "every follower reporting the stream lost, then open")
    time.sleep(2)  # any late re-dial would have logged by now
    for n in followers:
        since = since_kill(n).splitlines()
        lost = [ln for ln in since if LOST in ln]
        assert len(lost) == 1, f"broker {n.id} said 'lost' {len(lost)} times: {lost}"
        assert "open again" in since[-1] or any("open again" in ln for ln in since), f"broker {n.id}"
        assert [ln for ln in since if " ERROR " in ln] == [], f"broker {n.id}"


@logs_on_failure
def test_sigterm_drains_partitions_before_exit(make_cluster):
    """SIGTERM on a non-controller broker: its partitions move to the survivors (6/6) while it
    is still running, then it exits 0 within the drain timeout; nothing acknowledged is lost."""
    c = make_cluster(3)
    create_topic(c.bootstrap(), "load", 12)
    c.wait_settled(12, balanced=True)
    ctl = c.wait_controller()
    victim = next(n for n in c.nodes if n is not ctl)
    load = Load(c.bootstrap(), "load", 12, "a").start()
    try:
        load.wait_acks(600)
        t0 = time.monotonic()
        victim.signal(signal.SIGTERM)
        drained_seen_alive = None
        relinquished_s = None  # when the broker itself reported leading nothing
        last_file = last_health = None
        deadline = t0 + DRAIN_TIMEOUT_MS / 1000 + 15
        while victim.proc.poll() is None and time.monotonic() < deadline:
            a = c.assignment()
            alive = victim.proc.poll() is None  # read the file, then confirm the process was alive
            if a is not None:
                last_file = a
                gives = [p for p in a["partitions"] if p["leader"] == victim.id]
                pending = [m for m in a.get("pending") or [] if victim.id in (m["from"], m["to"])]
                if alive and not gives and not pending and drained_seen_alive is None:
                    drained_seen_alive = time.monotonic() - t0
            h = victim.healthz()
            if h is not None:
                last_health = h
                # The signal is handled asynchronously: allow a moment before it must show.
                assert h["draining"] or time.monotonic() - t0 < 2.0, (
                    f"broker {victim.id} does not report draining 2 s after SIGTERM: {h}")
                if h["partitions_led"] == 0 and relinquished_s is None:
                    relinquished_s = time.monotonic() - t0
            time.sleep(0.05)
        exit_seen = time.time()
        code = victim.proc.wait(5) if victim.proc.poll() is None else victim.proc.returncode
        exited_s = time.monotonic() - t0
        a = c.assignment()
        if drained_seen_alive is None:
            # The broker may exit within one poll of the file that drained it. Then that file
            # must already be the one in place, written before the exit was seen.
            gives = [p for p in a["partitions"] if p["leader"] == victim.id]
            pending = [m for m in a.get("pending") or [] if victim.id in (m["from"], m["to"])]
            written = c.assignment_path.stat().st_mtime
            if not gives and not pending and written <= exit_seen:
                drained_seen_alive = exited_s
        assert drained_seen_alive is not None, (
            f"while the broker was alive, assignment.json still gave it partitions; last seen: {last_file}")
        assert not [p for p in a["partitions"] if p["leader"] == victim.id]
        assert code == 0, f"drained broker exited with {code}"
        _, led = c.wait_settled(12, timeout=30)
        assert sorted(led.values()) == [6, 6], led
        moved_at = time.monotonic()
        load.wait_acks_everywhere_since(moved_at, timeout=60)
        load.stop()
        load.check_client_side()
        n = verify(c.bootstrap(c.running()), "load", 12, [load])
        print(f"\nSIGTERM drain: partitions off the broker {drained_seen_alive:.2f}s after SIGTERM,"
              f" the broker led none {'never' if relinquished_s is None else f'{relinquished_s:.2f}s after SIGTERM'},"
              f" exit 0 after {exited_s:.2f}s;"
              f" {len(load.acked)} acks, {n} stored")
        # The draining broker hands its partitions over itself (it applies the files that take
        # them away and confirms), rather than being waited out like a dead broker; and the drain
        # ends when the partitions have moved, not when the drain timeout runs out.
        # It leads nothing for only ~0.1 s before it exits, which a poll on a loaded machine can
        # miss; its own log then shows the relinquish.
        relinquish_logged = re.search(r"applied assignment.*relinquished=[1-9]",
                                      victim.log_path.read_text(errors="replace"))
        assert relinquished_s is not None or relinquish_logged, (
            f"broker {victim.id} never relinquished its partitions before it exited; its last"
            f" /healthz: {last_health}")
        assert exited_s < DRAIN_TIMEOUT_MS / 1000 - 5, (
            f"the broker exited {exited_s:.1f}s after SIGTERM although its partitions were gone from"
            f" assignment.json after {drained_seen_alive:.1f}s: the drain waited out --drain-timeout-ms"
            f" ({DRAIN_TIMEOUT_MS} ms)")
    finally:
        load.abort()


OVERLAP = "a newer leader epoch owns this partition"


WROTE = re.compile(r"wrote assignment.json epoch=(\d+) version=(\d+) partitions=(\d+)"
                   r" .*ms_since_elected=(\d+)")


def files_written(node) -> list[tuple[int, int, int, int]]:
    """(epoch, version, partitions led, ms since its election) of every assignment file the
    broker wrote as controller, from its log."""
    return [tuple(map(int, m)) for m in WROTE.findall(node.log_path.read_text(errors="replace"))]


@logs_on_failure
def test_sigterm_on_the_controller_hands_over_only_what_it_stopped_serving(make_cluster):
    """SIGTERM on the controller with the binary's own Lease timings (15 s, renew deadline
    10 s), as the chart runs it: the broker releases the Lease and drains, and the broker that
    takes the free Lease over moves the draining broker's partitions only once it stopped
    serving them. A released Lease did not run out, so no election gap separates the draining
    broker's last acknowledgement of itself from the new controller's start; counting one gave
    its partitions a second leader within a millisecond of the election while it still
    acknowledged writes (the chart's rolling upgrade: librdkafka's idempotent producer then
    failed with OUT_OF_ORDER_SEQUENCE_NUMBER). Every broker logs, per assignment it applies,
    how many partitions it took over and gave up: no broker takes anything over in the file
    that takes the draining broker's partitions away; nothing acknowledged is lost."""
    c = make_cluster(3, lease_args=())
    create_topic(c.bootstrap(), "load", 12)
    c.wait_settled(12, balanced=True)
    ctl = c.wait_controller()
    old_epoch = ctl.healthz()["lease_epoch"]
    load = Load(c.bootstrap(), "load", 12, "a").start()
    try:
        load.wait_acks(600)
        ctl.signal(signal.SIGTERM)
        assert ctl.proc.wait(DRAIN_TIMEOUT_MS / 1000 + 15) == 0
        new_ctl = c.wait_controller(timeout=30, newer_than=old_epoch)
        assert new_ctl is not ctl
        _, led = c.wait_settled(12, timeout=30)
        assert sorted(led.values()) == [6, 6], led
        load.wait_acks_everywhere_since(time.monotonic(), timeout=60)
        load.stop()
        load.check_client_side()
        n = verify(c.bootstrap(c.running()), "load", 12, [load])
        applied = re.compile(r"applied assignment epoch=(\d+) version=(\d+) took_over=(\d+)"
                             r" relinquished=(\d+)")

        def moves(node) -> list[tuple[int, int, int, int]]:
            return [tuple(map(int, m.groups())) for m in
                    applied.finditer(node.log_path.read_text(errors="replace"))]
        given_up = {(e, v) for e, v, _, r in moves(ctl) if r > 0 and e > old_epoch}
        assert given_up, f"broker {ctl.id} never gave up a partition under the new controller"
        # A move straight to the new leader is right only once the draining broker was silent
        # past the release time (3.5 s after the election at the earliest): a machine too
        # loaded for it to reconnect by then. Such a file is not held against the broker.
        elected_ms = {(e, v): ms for e, v, _, ms in files_written(new_ctl)}
        by_time = {k for k in given_up if elected_ms.get(k, 0) >= 3500}
        taken_at_once = {n.id: (e, v) for n in c.running() for e, v, t, _ in moves(n)
                         if t > 0 and (e, v) in given_up - by_time}
        assert not taken_at_once, (
            f"broker(s) took partitions over in the same file that took them from the draining"
            f" broker {ctl.id}, before it confirmed: {taken_at_once}")
        overlap = [ln for ln in ctl.log_path.read_text(errors="replace").splitlines()
                   if OVERLAP in ln]
        assert by_time or not overlap, (
            f"another broker led a partition while broker {ctl.id} still had it open: {overlap}")
        down = [int(ms) for node in c.running() for ms in re.findall(
            r"heartbeat stream to the controller open again .*down_ms=(\d+)",
            node.log_path.read_text(errors="replace"))]
        print(f"\ncontroller SIGTERM (15 s Leases): the others' heartbeat streams down {down} ms;"
              f" {len(load.acked)} acks, {n} stored;"
              f" files that took partitions from it: {sorted(given_up)}"
              f"{f', by time: {sorted(by_time)}' if by_time else ''}")
    finally:
        load.abort()


# An election gap (lease duration − renew deadline: 4 s) longer than the 3.5 s release time, as
# with the binary's own timings (15 s and 10 s: 5 s), but a Lease that runs out in 6 s.
GAP_LEASE_ARGS = ("--lease-duration-ms", "6000", "--lease-renew-deadline-ms", "2000",
                  "--lease-retry-period-ms", "500")


@logs_on_failure
def test_a_controller_paused_past_its_lease_loses_nothing_its_successor_moved_at_once(make_cluster):
    """The other way a Lease changes hands: it runs out. The successor names the paused holder
    as the one it replaced and counts the election gap for it (the holder stopped
    acknowledging itself at least that long before the takeover), so with a gap longer than the
    release time it moves the paused broker's partitions in its first files, without waiting.
    SIGSTOP the controller under idempotent acks=all load until it is replaced and its
    partitions moved, then SIGCONT it with its requests in flight: it steps down, acknowledges
    nothing it wrote after the move, every partition is acknowledged again, and every
    acknowledged record is stored once, at its offset, in order."""
    c = make_cluster(3, lease_args=GAP_LEASE_ARGS)
    load = start_load(c)
    try:
        ctl = c.wait_controller()
        old_epoch = ctl.healthz()["lease_epoch"]
        load.start()
        load.wait_acks(600)
        ctl.pause()
        paused_at = time.monotonic()
        new_ctl = c.wait_controller(timeout=30, newer_than=old_epoch)
        _, led = c.wait_settled(12, timeout=30)
        moved_s = time.monotonic() - paused_at
        assert ctl.id not in led, led
        first_full = min((ms for e, _, parts, ms in files_written(new_ctl)
                          if e > old_epoch and parts == 12), default=None)
        ctl.resume()
        load.wait_acks_everywhere_since(time.monotonic(), timeout=60)
        load.stop()
        load.check_client_side()
        n = verify(c.bootstrap(c.running()), "load", 12, [load])
        assert not ctl.healthz()["is_controller"]
        print(f"\ncontroller paused past a 6 s Lease: partitions moved {moved_s:.1f}s after"
              f" SIGSTOP, every partition led {first_full} ms after the election;"
              f" {len(load.acked)} acks, {n} stored")
        # The gap was counted: nothing waited out the release time after the election.
        assert first_full is not None and first_full < 3500, (
            f"the successor led all 12 partitions only {first_full} ms after its election")
    finally:
        load.abort()


@logs_on_failure
def test_paused_controller_cannot_write_assignments(make_cluster):
    """A controller paused (SIGSTOP) past its Lease is replaced; once resumed (SIGCONT) it knows
    it is no longer the controller, no broker goes back to its epoch, and assignment.json is
    never again stamped with it."""
    c = make_cluster(3)
    create_topic(c.bootstrap(), "paused", 12)
    c.wait_settled(12, balanced=True)
    old = c.wait_controller()
    old_epoch = old.healthz()["lease_epoch"]
    old.pause()
    t0 = time.monotonic()
    new = c.wait_controller(timeout=30, newer_than=old_epoch)
    a, led = c.wait_settled(12, timeout=30)
    print(f"\npaused controller: new controller {new.id} after {time.monotonic() - t0:.2f}s")
    new_epoch = new.healthz()["lease_epoch"]
    assert new_epoch > old_epoch and a["controller_epoch"] == new_epoch, (new_epoch, old_epoch, a["controller_epoch"])
    assert old.id not in led

    old.resume()
    resumed = time.monotonic()
    caught_up = None
    end = resumed + 8
    while time.monotonic() < end:
        f = c.assignment()
        assert f is not None
        assert f["controller_epoch"] >= new_epoch, (
            f"assignment.json went back to epoch {f['controller_epoch']} after the old controller resumed"
            f" (new epoch {new_epoch}): {f}")
        h_old = old.healthz()
        if h_old is not None:
            assert not h_old["is_controller"], f"resumed broker {old.id} still reports is_controller: {h_old}"
        hs = c.health()
        if caught_up is None and all(h and h["controller_epoch"] == new_epoch and h["controller_id"] == new.id
                                     for h in hs.values()):
            caught_up = time.monotonic() - resumed
        if caught_up is not None:
            for i, h in hs.items():
                assert h is not None and h["controller_epoch"] == new_epoch, (
                    f"broker {i} reports controller epoch {h and h['controller_epoch']}, new epoch {new_epoch}")
                assert h["controller_id"] == new.id, f"broker {i}: controller {h['controller_id']}, expected {new.id}"
        time.sleep(0.1)
    assert caught_up is not None and caught_up < 5, f"brokers did not all report controller {new.id}, epoch {new_epoch} within 5s of SIGCONT"
    # The resumed broker rejoins as an ordinary broker and gets its share back.
    a, led = c.wait_settled(12, balanced=True)
    assert a["controller_epoch"] == new_epoch and led == {0: 4, 1: 4, 2: 4}, (a["controller_epoch"], led)
    assert c.controller() is new


@logs_on_failure
def test_stale_assignment_file_is_not_applied(make_cluster):
    """A newest assignment version stamped with a deposed controller's epoch (as a paused
    controller finishing a write late would leave, if the compare-and-swap let it) is applied by
    no broker, even with a higher version,
    and the controller does not adopt its layout: leaders stay where the live epoch put them."""
    c = make_cluster(3)
    create_topic(c.bootstrap(), "stale", 12)
    c.wait_settled(12, balanced=True)
    old = c.wait_controller()
    old_epoch = old.healthz()["lease_epoch"]
    # Depose the first controller to have a stale epoch; bring it back as a plain broker.
    old.kill()
    new = c.wait_controller(timeout=30, newer_than=old_epoch)
    new_epoch = new.healthz()["lease_epoch"]
    c.wait_settled(12, timeout=30)
    old.start()
    c.wait_all_ready([old])
    a, led = c.wait_settled(12, balanced=True)
    assert a["controller_epoch"] == new_epoch and old_epoch < new_epoch
    leaders = file_leaders(a, "stale")
    versions = {i: h["assignment_version"] for i, h in c.health().items()}

    target = next(n for n in c.nodes if n is not new)
    forged = json.loads(json.dumps(a))
    forged["controller_epoch"] = old_epoch
    forged["assignment_version"] = a["assignment_version"] + 100
    for p in forged["partitions"]:
        p["leader"] = target.id
    forged.pop("pending", None)
    # As the newest version of the file (assignment.<n>.json; assignment.json is its copy).
    versions = [int(m.group(1)) for f in c.assignment_path.parent.iterdir()
                if (m := re.fullmatch(r"assignment\.(\d+)\.json", f.name))]
    tmp = c.assignment_path.with_name("assignment.json.forged")
    tmp.write_text(json.dumps(forged, indent=2))
    os.link(tmp, c.assignment_path.with_name(f"assignment.{max(versions) + 1}.json"))
    tmp.unlink()
    for n in c.nodes:
        n.note(f"test wrote a forged assignment.json: epoch {old_epoch}, version {forged['assignment_version']}, all partitions on {target.id}")

    end = time.monotonic() + 8
    checks = 0
    while time.monotonic() < end:
        for i, h in c.health().items():
            assert h is not None, f"broker {i} stopped answering"
            assert h["controller_epoch"] == new_epoch, f"broker {i} applied an assignment of epoch {h['controller_epoch']}: {h}"
            assert h["partitions_led"] == led[i], (
                f"broker {i} leads {h['partitions_led']} partitions, {led[i]} before the forged file"
                f" (assignment version {versions[i]} -> {h['assignment_version']})")
        f = c.assignment()
        if f is not None and f["controller_epoch"] >= new_epoch:
            assert file_leaders(f, "stale") == leaders and not f.get("pending"), (
                f"the controller rewrote assignment.json from the forged layout: version {f['assignment_version']},"
                f" leaders {file_leaders(f, 'stale')}, pending {f.get('pending')}; before the forgery {leaders}")
        if checks % 10 == 0:
            for n in c.nodes:
                _, topics = metadata_leaders(n.bootstrap, "stale")
                got = {p: leader for p, (leader, _) in topics["stale"].items()}
                assert got == leaders, f"Metadata from broker {n.id} changed leaders: {got}, before {leaders}"
        checks += 1
        time.sleep(0.1)


@logs_on_failure
def test_topic_created_on_any_broker_is_served(make_cluster):
    """A topic created through any one broker is led across the whole cluster and served by
    every broker's Metadata; a topic deleted through another broker disappears everywhere."""
    c = make_cluster(3)
    create_topic(c.nodes[2].bootstrap, "via-two", 6)
    create_topic(c.nodes[0].bootstrap, "via-zero", 5)
    a, led = c.wait_settled(11, balanced=True)
    assert sorted(led.values()) == [3, 4, 4], led
    for topic, n_parts in (("via-two", 6), ("via-zero", 5)):
        want = file_leaders(a, topic)
        assert sorted(want) == list(range(n_parts))
        for n in c.nodes:
            brokers, topics = metadata_leaders(n.bootstrap)
            assert brokers == [0, 1, 2]
            got = {p: leader for p, (leader, err) in topics.get(topic, {}).items()}
            assert got == want, f"Metadata from broker {n.id} for {topic}: {got}, assignment.json {want}"
    # Both topics take writes through a broker other than the one that created them.
    for topic, n_parts, via in (("via-two", 6, c.nodes[0]), ("via-zero", 5, c.nodes[1])):
        p = Producer({"bootstrap.servers": via.bootstrap, "acks": "all", "enable.idempotence": True})
        for i in range(n_parts * 10):
            p.produce(topic, value=f"x-{i % n_parts}-{i // n_parts:08d}".encode(), partition=i % n_parts)
        assert p.flush(60) == 0
        stored = read_all(c.nodes[2].bootstrap, topic, n_parts)
        assert all(len(recs) == 10 for _, recs in stored.values()), {q: len(r) for q, (_, r) in stored.items()}

    delete_topic(c.nodes[1].bootstrap, "via-two")

    def gone():
        f = c.assignment()
        if f is None or file_leaders(f, "via-two"):
            return False
        for n in c.nodes:
            _, topics = metadata_leaders(n.bootstrap)
            if "via-two" in topics:
                return False
        return True
    c.wait(gone, 30, "via-two gone from assignment.json and every broker's Metadata")
    # Deleting a topic is not an error on the brokers that led it (they logged one ERROR per
    # partition: the producer-state snapshot could not be written into the deleted directory).
    for n in c.nodes:
        errors = [line for line in n.log_path.read_text(errors="replace").splitlines()
                  if "ERROR" in line and "closing a partition failed" in line]
        assert not errors, f"broker {n.id} logged {len(errors)} errors closing deleted partitions: {errors[:3]}"
    a, led = c.wait_settled(5)
    assert sum(led.values()) == 5
    for n in c.nodes:
        _, topics = metadata_leaders(n.bootstrap)
        assert "via-zero" in topics and len(topics["via-zero"]) == 5

    # Partition growth through a third broker: the new partitions are led and take writes, and
    # the old ones keep their records.
    admin = AdminClient({"bootstrap.servers": c.nodes[2].bootstrap})
    admin.create_partitions([NewPartitions("via-zero", 8)])["via-zero"].result(30)
    a, led = c.wait_settled(8, balanced=True)
    assert sorted(file_leaders(a, "via-zero")) == list(range(8))
    p = Producer({"bootstrap.servers": c.nodes[1].bootstrap, "acks": "all", "enable.idempotence": True})
    for q in range(5, 8):
        p.produce("via-zero", value=f"grown-{q}".encode(), partition=q)
    assert p.flush(60) == 0
    stored = read_all(c.nodes[0].bootstrap, "via-zero", 8)
    assert [len(stored[q][1]) for q in range(8)] == [10] * 5 + [1] * 3, {q: len(r) for q, (_, r) in stored.items()}


@logs_on_failure
def test_a_topic_deleted_and_created_again_keeps_every_acknowledged_record(make_cluster):
    """A topic deleted and at once created again under its name, three times, with records
    produced right after each create: every acknowledged record is stored in the new topic,
    and nothing of the deleted one is read from it. Before, brokers that had not yet re-read
    the catalog (once a second) still resolved the name to the deleted topic and wrote the new
    topic's records into its removed files: 573-600 of 600 acknowledged records were lost."""
    c = make_cluster(3)
    for gen in range(3):
        started = time.monotonic()
        create_topic(c.bootstrap(), "again", 6)
        if gen == 0:
            c.wait_settled(6, balanced=True)
        created_in = time.monotonic() - started
        p = Producer({"bootstrap.servers": c.bootstrap(), "acks": "all", "linger.ms": 2})
        acked: dict[tuple[int, int], bytes] = {}

        def on_delivery(err, msg):
            if err is None:
                acked[(msg.partition(), msg.offset())] = msg.value()
        for i in range(300):
            p.produce("again", value=f"g{gen}-{i}".encode(), on_delivery=on_delivery)
        assert p.flush(60) == 0
        assert len(acked) == 300, f"generation {gen}: {len(acked)} of 300 acknowledged"
        stored = read_all(c.bootstrap(), "again", 6)
        at = {(part, off): v for part, (_, recs) in stored.items() for off, v in recs}
        lost = [k for k, v in acked.items() if at.get(k) != v]
        assert not lost, f"generation {gen}: {len(lost)} of 300 acknowledged records not stored, e.g. {lost[:5]}"
        foreign = [v for v in at.values() if not v.startswith(f"g{gen}-".encode())]
        assert not foreign, f"generation {gen}: the new topic holds {foreign[:5]}"
        print(f"generation {gen}: created in {created_in:.1f}s, 300 acknowledged and stored")
        delete_topic(c.bootstrap(), "again")


@logs_on_failure
def test_kill_and_restart_a_broker_rebalances(make_cluster):
    """SIGKILL of a non-controller broker under load: the survivors lead its partitions within
    the failover bound and nothing acknowledged is lost; restarted with the same id it rejoins,
    the balancer evens out to 4/4/4 under a second load, and again nothing is lost."""
    c = make_cluster(3)
    load = start_load(c)
    load2 = None
    try:
        victim, _, failover_s, _, acked_at_kill = sigkill_under_load(c, load, victim_is_controller=False)
        recovered = time.monotonic()
        load.wait_acks_everywhere_since(recovered, timeout=60)
        load.stop()
        load.check_client_side()
        n1 = verify(c.bootstrap(c.running()), "load", 12, [load])
        assert failover_s < FAILOVER_BOUND_S, f"failover took {failover_s:.1f}s"

        load2 = Load(c.bootstrap(), "load", 12, "b").start()
        load2.wait_acks(300)
        t0 = time.monotonic()
        victim.start()
        c.wait_all_ready([victim])
        a, led = c.wait_settled(12, balanced=True)
        rebalance_s = time.monotonic() - t0
        assert led == {0: 4, 1: 4, 2: 4}, led
        load2.wait_acks_everywhere_since(time.monotonic(), timeout=60)
        load2.stop()
        load2.check_client_side()
        n2 = verify(c.bootstrap(), "load", 12, [load, load2])
        print(f"\nnon-controller SIGKILL: failover {failover_s:.2f}s ({acked_at_kill} acks before the kill,"
              f" {n1} stored); restart -> 4/4/4 in {rebalance_s:.2f}s; {n2} stored at the end")
    finally:
        load.abort()
        if load2:
            load2.abort()


@pytest.mark.long
@pytest.mark.timeout(5400)
@pytest.mark.skipif(not LONG, reason="long chaos test: set KAAS_LONG_TESTS=1")
@logs_on_failure
def test_random_faults_under_load_lose_nothing(make_cluster):
    """Minutes of random SIGKILL, SIGSTOP/SIGCONT, SIGTERM drains and restarts under load (at
    least one broker always running): at the end every acknowledged record is stored exactly
    once, in order."""
    seconds = float(os.environ.get("KAAS_CHAOS_SECONDS", "240"))
    seed = int(os.environ.get("KAAS_CHAOS_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    print(f"\nchaos seed {seed}, {seconds:.0f}s")
    c = make_cluster(3)
    create_topic(c.bootstrap(), "chaos", 12)
    c.wait_settled(12, balanced=True)
    load = Load(c.bootstrap(), "chaos", 12, "a").start()
    tail = Tail(c.bootstrap(), "chaos", 12).start()
    actions = []
    try:
        load.wait_acks(300)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            running = c.running()
            down = [n for n in c.nodes if not n.alive()]
            choices = ["restart"] * bool(down)
            if len(running) >= 2:
                choices += ["kill", "pause", "kill-controller", "drain"]
            choice = rng.choice(choices) if choices else "wait"
            if choice == "restart":
                n = rng.choice(down)
                n.start()
            elif choice == "kill":
                n = rng.choice(running)
                n.kill()
            elif choice == "kill-controller":
                n = c.controller() or rng.choice(running)
                n.kill()
            elif choice == "pause":
                n = rng.choice(running)
                n.pause()
                time.sleep(rng.uniform(0.5, 6.0))
                n.resume()
            elif choice == "drain":
                # SIGTERM: the broker hands its partitions over, then exits (or is killed
                # when the drain cannot finish, e.g. with no controller to move them).
                n = rng.choice(running)
                n.signal(signal.SIGTERM)
                try:
                    n.proc.wait(DRAIN_TIMEOUT_MS / 1000 + 15)
                except subprocess.TimeoutExpired:
                    n.kill()
            actions.append((round(time.monotonic() - end + seconds, 1), choice, n.id if choice != "wait" else None))
            time.sleep(rng.uniform(1.0, 8.0))
        for n in c.nodes:
            if not n.alive():
                n.start()
        n_stored = settle_and_verify(c, load, "chaos", 12, tail)
        print(f"chaos: {len(actions)} faults {actions}; {len(load.acked)} acks with offsets, {len(load.acked_no_offset)} implicit, {n_stored} stored")
    except BaseException:
        sys.stderr.write(f"\nchaos seed {seed}; faults so far: {actions}\n")
        raise
    finally:
        tail.stop()
        load.abort()


@pytest.mark.long
@pytest.mark.timeout(5400)
@pytest.mark.skipif(not LONG, reason="long pause test: set KAAS_LONG_TESTS=1")
@logs_on_failure
def test_paused_controller_cycles_never_ack_stale(make_cluster):
    """≥ 100 times: the controller is paused (SIGSTOP) past its Lease under acks=all load, so
    produce requests queue on its sockets; a successor moves its partitions; it resumes
    (SIGCONT) with those requests still queued. At the end every acknowledged record sits at
    its acknowledged offset, none twice, in produce order: a deposed leader acknowledged
    nothing that a new leader did not keep (this failed in 1 of 38 pauses before)."""
    cycles = int(os.environ.get("KAAS_PAUSE_CYCLES", "100"))
    c = make_cluster(3)
    create_topic(c.bootstrap(), "pauses", 12)
    c.wait_settled(12, balanced=True)
    load = Load(c.bootstrap(), "pauses", 12, "a", round_sleep_s=0.002).start()
    tail = Tail(c.bootstrap(), "pauses", 12).start()
    try:
        load.wait_acks(300)
        for i in range(cycles):
            old = c.wait_controller(timeout=60)
            epoch = old.healthz()["lease_epoch"]
            old.pause()
            c.wait_controller(timeout=60, newer_than=epoch)
            # Long enough for the successor to move the paused broker's partitions by time.
            time.sleep(random.uniform(0.5, 4.5))
            old.resume()
            time.sleep(random.uniform(0.5, 2.0))
            if i % 10 == 9:
                print(f"pause cycle {i + 1}/{cycles}: {len(load.acked)} acks")
        n_stored = settle_and_verify(c, load, "pauses", 12, tail)
        print(f"{cycles} controller pauses: {len(load.acked)} acks with offsets, {len(load.acked_no_offset)} implicit (no offset), {n_stored} stored, 0 lost")
    finally:
        tail.stop()
        load.abort()
