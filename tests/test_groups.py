"""Consumer groups against real clients: the classic protocol (kafka-python, librdkafka, the
Java client) and KIP-848 (librdkafka and the Java client with group.protocol=consumer),
committed offsets across a clean restart and a SIGKILL, the stock kafka-consumer-groups tool,
static membership, regex subscriptions, and the coordinator APIs on the wire.

The module's broker runs with short KIP-848 timeouts (session 6 s, heartbeat 500 ms) so that
"a member dies" and "the rest take over" fit in seconds; classic clients ask for a 6 s
session themselves. Long runs (bigger groups, the rebalance and commit benchmarks) are behind
KAAS_LONG_TESTS=1.
"""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid

import pytest

import kwire
from conftest import make_broker, temporary_env
from kcheck import create_topic, rdkafka_produce, unique_topic

LONG = os.environ.get("KAAS_LONG_TESTS", "") not in ("", "0")
PARTITIONS = 6

# Broker settings for this module (read by the broker at start; see groups/src/config.rs).
GROUP_ENV = {
    "KAAS_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "6000",
    "KAAS_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
    # The same for Apache Kafka when the suite is checked against it (KAAS_TEST_APACHE_KAFKA=1).
    "KAFKA_EXTRA_PROPS": "\n".join([
        os.environ.get("KAFKA_EXTRA_PROPS", ""),
        "group.consumer.min.session.timeout.ms=6000",
        "group.consumer.session.timeout.ms=6000",
        "group.consumer.min.heartbeat.interval.ms=500",
        "group.consumer.heartbeat.interval.ms=500",
    ]).strip(),
}

CONSUMER_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """This module's broker: fresh, with the short KIP-848 timeouts of GROUP_ENV."""
    with temporary_env(GROUP_ENV):
        b = make_broker(tmp_path_factory.mktemp("broker"))
        try:
            yield b
        finally:
            b.close()


def values(tag: str, n: int, start: int = 0):
    # Keyed, so the partitioner spreads them over every partition. Without keys librdkafka sticks
    # to one partition for sticky.partitioning.linger.ms (10 ms), a fast broker takes a few
    # hundred messages in that time, and a partition left empty is never committed by a member
    # (the groups tests compare committed offsets with the end offsets).
    return [(b"%09d" % i, b"%s:%09d" % (tag.encode(), i)) for i in range(start, start + n)]


def wait_until(pred, timeout: float, what: str, step=None, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        if step is not None:
            step()
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        if step is None:
            time.sleep(interval)


def covers(assignments, partitions: int) -> bool:
    """Assignments are pairwise disjoint and together cover every partition."""
    total = sum(len(a) for a in assignments)
    union = set().union(*assignments) if assignments else set()
    return total == partitions and union == set(range(partitions))


# -- librdkafka helpers -------------------------------------------------------------------------


def rd_consumer(bootstrap: str, group: str, protocol: str, **extra):
    """protocol: classic, classic-cooperative (cooperative-sticky, incremental rebalancing
    driven by the client) or consumer (KIP-848)."""
    from confluent_kafka import Consumer
    if protocol == "classic-cooperative":
        protocol = "classic"
        extra.setdefault("partition.assignment.strategy", "cooperative-sticky")
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": protocol,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    if protocol == "classic":
        conf.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    conf.update(extra)
    return Consumer(conf)


class RdGroup:
    """Several librdkafka consumers in one group, polled round-robin from this thread; every
    message read is committed synchronously before the next poll of that consumer."""

    def __init__(self, consumers, topic):
        self.consumers = list(consumers)
        self.topic = topic
        self.seen: dict[bytes, int] = {}
        self.errors: list = []
        self.commit_errors: list = []
        # Consumers whose last commit failed: they commit again at the next step even when no
        # new message arrived, or a commit lost to a rebalance would never be repeated.
        self.uncommitted: set[int] = set()

    def subscribe(self):
        for c in self.consumers:
            c.subscribe([self.topic])

    def step(self):
        from confluent_kafka import KafkaError, KafkaException
        for i, c in enumerate(self.consumers):
            msgs = c.consume(num_messages=500, timeout=0.02)
            for m in msgs:
                if m.error() is not None:
                    self.errors.append(m.error())
                    continue
                self.seen[m.value()] = self.seen.get(m.value(), 0) + 1
            if any(m.error() is None for m in msgs) or i in self.uncommitted:
                try:
                    c.commit(asynchronous=False)
                    self.uncommitted.discard(i)
                except KafkaException as e:
                    if e.args[0].code() == KafkaError._NO_OFFSET:
                        # Nothing left to commit (the partitions moved to another member).
                        self.uncommitted.discard(i)
                        continue
                    # A commit can fail across a rebalance or a coordinator restart; it is
                    # repeated at the next step (records may also be read again, which the
                    # checks allow).
                    self.commit_errors.append(e)
                    self.uncommitted.add(i)

    def assignments(self):
        return [{tp.partition for tp in c.assignment()} for c in self.consumers]

    def close(self):
        for c in self.consumers:
            c.close()


def committed(bootstrap: str, group: str, topic: str, partitions: int):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=20)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def end_offsets(bootstrap: str, topic: str, partitions: int):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kaas-test-ends"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=20)[1]
                for p in range(partitions)}
    finally:
        c.close()


# A member in its own process, so that it can die without leaving the group.
CHILD_CONSUMER = r"""
import sys, time
from confluent_kafka import Consumer
bootstrap, group, topic, protocol = sys.argv[1:5]
conf = {"bootstrap.servers": bootstrap, "group.id": group,
        "auto.offset.reset": "earliest", "enable.auto.commit": False}
if protocol == "classic-cooperative":
    protocol = "classic"
    conf["partition.assignment.strategy"] = "cooperative-sticky"
conf["group.protocol"] = protocol
if protocol == "classic":
    conf.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
c = Consumer(conf)
c.subscribe([topic])
last = None
while True:
    c.poll(0.05)
    a = sorted(tp.partition for tp in c.assignment())
    if a != last:
        print("ASSIGNED", ",".join(map(str, a)), flush=True)
        last = a
"""


class ChildConsumer:
    def __init__(self, bootstrap, group, topic, protocol):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD_CONSUMER, bootstrap, group, topic, protocol],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            text=True)
        self.assignment: set[int] = set()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("ASSIGNED"):
                parts = line.split()[1:]
                self.assignment = {int(x) for x in parts[0].split(",")} if parts else set()

    def kill(self):
        """SIGKILL: the member vanishes without a LeaveGroup."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.assignment = set()

    def close(self):
        if self.proc.poll() is None:
            self.kill()


# -- the wire ------------------------------------------------------------------------------------


def test_group_apis_advertised(broker):
    """ApiVersions advertises every group API at the versions the Java client 4.x, librdkafka
    and kafka-python use."""
    ranges = kwire.api_versions(broker)
    want = {10: (0, 6), 11: (0, 9), 14: (0, 5), 12: (0, 4), 13: (0, 5), 8: (2, 9), 9: (1, 9),
            16: (0, 5), 15: (0, 6), 42: (0, 2), 47: (0, 0), 68: (0, 1), 69: (0, 1)}
    if broker.kind != "kaas":
        want = {k: v for k, v in want.items() if k in ranges}
    for key, (lo, hi) in want.items():
        assert key in ranges, f"API {key} not advertised"
        assert ranges[key][0] <= lo and ranges[key][1] >= hi, f"API {key}: {ranges[key]}"


def find_coordinator_v4(broker, keys, key_type):
    body = struct.pack(">b", key_type) + kwire.uvarint(len(keys) + 1)
    for k in keys:
        body += kwire.compact_string(k)
    body += kwire.uvarint(0)
    s = kwire.connect(broker)
    try:
        s.sendall(kwire.request(10, 4, 7, body, flexible=True))
        f = kwire.recv_frame(s)
    finally:
        s.close()
    (corr,) = struct.unpack_from(">i", f, 0)
    assert corr == 7
    pos = 4
    _, pos = kwire.read_uvarint(f, pos)  # response header tagged fields
    pos += 4  # throttle
    n, pos = kwire.read_uvarint(f, pos)
    out = []
    for _ in range(n - 1):
        ln, pos = kwire.read_uvarint(f, pos)
        key = f[pos:pos + ln - 1].decode()
        pos += ln - 1
        node, = struct.unpack_from(">i", f, pos)
        pos += 4
        ln, pos = kwire.read_uvarint(f, pos)
        host = f[pos:pos + ln - 1].decode()
        pos += ln - 1
        port, err = struct.unpack_from(">ih", f, pos)
        pos += 6
        ln, pos = kwire.read_uvarint(f, pos)
        pos += max(ln - 1, 0)
        _, pos = kwire.read_uvarint(f, pos)
        out.append((key, node, host, port, err))
    return out


def test_find_coordinator_batched(broker):
    """FindCoordinator v4 answers every key of a batch with this broker, refuses transactional
    ids while transactions are not served, and refuses an unknown key type per key."""
    host, port = broker.host, broker.port
    # Apache Kafka answers COORDINATOR_NOT_AVAILABLE (retriable) until its offsets topic exists.
    got = wait_until(lambda: [g for g in [find_coordinator_v4(broker, ["g-a", "g-b", ""], 0)]
                              if all(x[4] != 15 for x in g)], 30, "a coordinator")[0]
    assert [g[0] for g in got] == ["g-a", "g-b", ""]
    assert all(g[4] == 0 and g[2] == host and g[3] == port for g in got), got
    got = wait_until(lambda: [g for g in [find_coordinator_v4(broker, ["txn-1"], 1)]
                              if g[0][4] != 15], 30, "a transaction coordinator")[0]
    if broker.kind == "kaas":
        # kaas serves no transactions: TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which clients
        # treat as fatal at once (see test_kafka_semantics).
        assert got[0][4] == 53, got
    else:
        assert got[0][4] == 0 and got[0][3] == port
    got = find_coordinator_v4(broker, ["x"], 9)
    assert got[0][4] == 42, got  # INVALID_REQUEST


# -- classic protocol ------------------------------------------------------------------------------


def test_kafka_python_classic_group(broker):
    """Three kafka-python consumers split six partitions disjointly; when one closes, the other
    two take over all six; with a commit after every poll every message is consumed and the
    group's committed offsets reach the end offsets."""
    from kafka import KafkaConsumer
    topic = unique_topic("kpg")
    group = unique_topic("kpg-group")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    rdkafka_produce(broker.bootstrap, topic, values("kp", 600))
    seen: dict[bytes, int] = {}
    lock = threading.Lock()
    stop = [threading.Event() for _ in range(3)]
    assignments: list[set[int]] = [set(), set(), set()]
    failures: list[BaseException] = []

    def run(i):
        try:
            c = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group,
                              client_id=f"kp-{i}", auto_offset_reset="earliest",
                              enable_auto_commit=False, session_timeout_ms=6000,
                              heartbeat_interval_ms=500, max_poll_interval_ms=60000)
            while not stop[i].is_set():
                batch = c.poll(timeout_ms=100)
                with lock:
                    for recs in batch.values():
                        for r in recs:
                            seen[r.value] = seen.get(r.value, 0) + 1
                if batch:
                    c.commit()
                assignments[i] = {tp.partition for tp in c.assignment()}
            c.close()
            assignments[i] = set()
        except BaseException as e:  # reported by the test thread
            failures.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: failures or (covers(assignments, PARTITIONS)
                                        and all(assignments)), 60, "three-way split")
        assert not failures, failures
        stop[0].set()
        threads[0].join(30)
        wait_until(lambda: failures or covers(assignments[1:], PARTITIONS), 60,
                   "the two remaining consumers to take over")
        assert not failures, failures
        rdkafka_produce(broker.bootstrap, topic, values("kp", 600, start=600))
        wait_until(lambda: len(seen) >= 1200, 60, "every message consumed")
    finally:
        for s in stop:
            s.set()
        for t in threads:
            t.join(30)
    assert not failures, failures
    assert len(seen) == 1200
    assert committed(broker.bootstrap, group, topic, PARTITIONS) == \
        end_offsets(broker.bootstrap, topic, PARTITIONS)


@pytest.mark.parametrize("protocol", ["classic", "classic-cooperative", "consumer"])
def test_librdkafka_group_leave_and_death(broker, protocol):
    """librdkafka consumers (classic eager, classic cooperative-sticky, KIP-848) split six partitions
    disjointly; one closes (leaves) and the others take over at once; another is SIGKILLed and
    the survivors take over its partitions after the session timeout; with commits every
    message is consumed and the committed offsets reach the end offsets."""
    topic = unique_topic(f"rdg-{protocol}")
    group = unique_topic(f"rdg-group-{protocol}")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    rdkafka_produce(broker.bootstrap, topic, values("rd", 600))
    g = RdGroup([rd_consumer(broker.bootstrap, group, protocol) for _ in range(3)], topic)
    child = ChildConsumer(broker.bootstrap, group, topic, protocol)
    try:
        g.subscribe()
        wait_until(lambda: covers(g.assignments() + [child.assignment], PARTITIONS)
                   and child.assignment and all(g.assignments()), 60,
                   "a split over four members", step=g.step)
        # A clean leave.
        leaving = g.consumers.pop(0)
        leaving.close()
        t0 = time.monotonic()
        wait_until(lambda: covers(g.assignments() + [child.assignment], PARTITIONS), 30,
                   "takeover after a leave", step=g.step)
        leave_s = time.monotonic() - t0
        # A death: no LeaveGroup, the coordinator notices when the session expires.
        wait_until(lambda: child.assignment, 30, "the child to own partitions", step=g.step)
        child.kill()
        t0 = time.monotonic()
        wait_until(lambda: covers(g.assignments(), PARTITIONS), 45,
                   "takeover after a member died", step=g.step)
        death_s = time.monotonic() - t0
        rdkafka_produce(broker.bootstrap, topic, values("rd", 600, start=600))
        wait_until(lambda: len(g.seen) >= 1200, 60, "every message consumed", step=g.step)
        assert not [e for e in g.errors if e.fatal()], g.errors
        print(f"{protocol}: takeover after leave {leave_s:.2f}s, after death {death_s:.2f}s")
        assert death_s < 20, f"death noticed after {death_s:.1f}s"
        wait_until(lambda: committed(broker.bootstrap, group, topic, PARTITIONS)
                   == end_offsets(broker.bootstrap, topic, PARTITIONS), 30,
                   "committed offsets at the end offsets", step=g.step)
    finally:
        child.close()
        g.close()


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_group_members_are_described_with_their_host(broker, protocol):
    """DescribeGroups / ConsumerGroupDescribe name each member's host as Kafka does
    (`/127.0.0.1`, what kafka-consumer-groups and UIs show), not `/unknown` as before."""
    from confluent_kafka.admin import AdminClient
    topic = unique_topic(f"host-{protocol}")
    group = unique_topic(f"host-group-{protocol}")
    create_topic(broker.bootstrap, topic, 2)
    c = rd_consumer(broker.bootstrap, group, protocol)
    try:
        c.subscribe([topic])
        wait_until(lambda: c.assignment(), 60, "the member's assignment", step=lambda: c.poll(0.1))
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        (f,) = admin.describe_consumer_groups([group]).values()
        hosts = [m.host for m in f.result(15).members]
        assert hosts == ["/127.0.0.1"], hosts
    finally:
        c.close()


def test_bad_group_settings_stop_the_broker_with_a_reason(tmp_path):
    """The group settings are typed flags (env KAAS_GROUP_*): an unknown default assignor or an
    out-of-range timeout stops the broker at start and names the flag. Before, a bad
    KAAS_GROUP_CONSUMER_ASSIGNOR was accepted silently and KIP-848 members then never got an
    assignment, and a bad number was ignored with a warning."""
    from conftest import kaas_bin
    cases = [({"KAAS_GROUP_CONSUMER_ASSIGNOR": "ranged"}, [],
              "invalid value 'ranged' for '--group-consumer-assignor"),
             ({}, ["--group-consumer-session-timeout-ms", "0"],
              "invalid value '0' for '--group-consumer-session-timeout-ms")]
    for env, flags, message in cases:
        r = subprocess.run([str(kaas_bin()), "--data-dir", str(tmp_path / "data"), *flags],
                           env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)
    assert not (tmp_path / "data").exists(), "nothing was started or written"


def test_group_configs_override_the_broker_per_group(broker):
    """Kafka 4's group configs (IncrementalAlterConfigs on the GROUP resource, as librdkafka's
    0081 and kafka-configs --entity-type groups set them): set before the group exists, they are
    described with source GROUP_CONFIG, a bad name or value is refused with INVALID_CONFIG, and
    they govern the group: with consumer.session.timeout.ms=60000 a KIP-848 member SIGKILLed
    keeps its partitions for a minute, where the module broker's 6 s session would have handed
    them over within seconds."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, ConfigSource, ResourceType)
    topic = unique_topic("gcfg")
    group = unique_topic("gcfg-group")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    a = AdminClient({"bootstrap.servers": broker.bootstrap})

    def alter(*entries):
        res = ConfigResource(ResourceType.GROUP, group, incremental_configs=list(entries))
        for f in a.incremental_alter_configs([res]).values():
            f.result(15)

    def described():
        [f] = a.describe_configs([ConfigResource(ResourceType.GROUP, group)]).values()
        return f.result(15)

    assert described()["consumer.session.timeout.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    alter(ConfigEntry("consumer.session.timeout.ms", "60000",
                      incremental_operation=AlterConfigOpType.SET))
    got = described()["consumer.session.timeout.ms"]
    assert (got.value, got.source) == ("60000", ConfigSource.GROUP_CONFIG.value), got
    # Outside Kafka's group.consumer.{min,max} ranges (45-60 s, 5-15 s), which kaas took
    # (found side by side with Kafka 4.4: a session timeout of 1 ms fenced every member at
    # every heartbeat).
    for name, value in (("consumer.session.timeout.msx", "1"),
                        ("consumer.heartbeat.interval.ms", "soon"),
                        ("consumer.session.timeout.ms", "1"),
                        ("consumer.heartbeat.interval.ms", "100"),
                        ("consumer.heartbeat.interval.ms", "60000")):
        with pytest.raises(KafkaException) as e:
            alter(ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET))
        assert e.value.args[0].code() == 40, e.value  # INVALID_CONFIG

    g = RdGroup([rd_consumer(broker.bootstrap, group, "consumer")], topic)
    child = ChildConsumer(broker.bootstrap, group, topic, "consumer")
    try:
        g.subscribe()
        wait_until(lambda: covers(g.assignments() + [child.assignment], PARTITIONS)
                   and child.assignment and all(g.assignments()), 60,
                   "a split over two members", step=g.step)
        orphaned = set(child.assignment)
        child.kill()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            g.step()
        mine = set(g.assignments()[0])
        assert not (mine & orphaned), (
            f"the survivor took {sorted(mine & orphaned)} within 15 s: the group's 60 s session "
            "timeout was not applied")
    finally:
        child.close()
        g.close()
    alter(ConfigEntry("consumer.session.timeout.ms", "",
                      incremental_operation=AlterConfigOpType.DELETE))
    assert described()["consumer.session.timeout.ms"].value == "6000"


def test_follower_answered_by_a_slow_leader_keeps_its_membership(broker):
    """A follower whose SyncGroup waited on the leader for longer than its own session gets
    its assignment and stays in the group: Kafka restarts a member's session when it answers
    the member's parked SyncGroup. Clients that send no heartbeat while their SyncGroup is
    parked (sarama, librdkafka) were expired at the broker's next tick, right after they got
    their assignment, and the group rebalanced again: the heartbeat below got
    UNKNOWN_MEMBER_ID. Raw JoinGroup v5 / SyncGroup v3 / Heartbeat v3 through kafka-python's
    codec, one connection per request, as two members would send them."""
    from concurrent.futures import ThreadPoolExecutor

    from kafka.protocol.consumer import HeartbeatRequest, JoinGroupRequest, SyncGroupRequest

    group = unique_topic("slow-leader")
    session_ms = 6000
    none, rebalancing, member_id_required = 0, 27, 79

    def join(member_id=""):
        return kwire.send(broker, JoinGroupRequest[5](
            group_id=group, session_timeout_ms=session_ms, rebalance_timeout_ms=30_000,
            member_id=member_id, group_instance_id=None, protocol_type="consumer",
            protocols=[JoinGroupRequest[5].JoinGroupRequestProtocol(
                name="range", metadata=b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")]))

    def joined(member_id=""):
        r = join(member_id)
        if r.error_code == member_id_required:
            r = join(r.member_id)
        assert r.error_code == none, r
        return r

    def sync(member_id, generation, assignments=()):
        return kwire.send(broker, SyncGroupRequest[3](
            group_id=group, generation_id=generation, member_id=member_id,
            group_instance_id=None,
            assignments=[SyncGroupRequest[3].SyncGroupRequestAssignment(
                member_id=m, assignment=a) for m, a in assignments]))

    def heartbeat(member_id, generation):
        return kwire.send(broker, HeartbeatRequest[3](
            group_id=group, generation_id=generation, member_id=member_id,
            group_instance_id=None)).error_code

    with ThreadPoolExecutor(3) as pool:
        a = joined()
        assert sync(a.member_id, a.generation_id, [(a.member_id, b"A")]).error_code == none
        b_join = pool.submit(joined)
        wait_until(lambda: heartbeat(a.member_id, a.generation_id) == rebalancing, 30,
                   "the leader to be told of the rebalance", interval=0.2)
        a2 = joined(a.member_id)
        b = b_join.result(timeout=30)
        assert (a2.generation_id, a2.leader) == (b.generation_id, a.member_id)
        generation = b.generation_id
        b_sync = pool.submit(sync, b.member_id, generation)
        # The leader takes longer than the follower's session to hand out the assignment,
        # heartbeating meanwhile so that only the follower's session is in question.
        slow_until = time.monotonic() + session_ms / 1000 + 1.5
        while time.monotonic() < slow_until:
            assert heartbeat(a.member_id, generation) == none
            time.sleep(0.5)
        assert b_sync.running(), "the follower's SyncGroup waits for the leader's"
        assigned = sync(a.member_id, generation, [(a.member_id, b"A"), (b.member_id, b"B")])
        assert assigned.error_code == none, assigned
        answered = b_sync.result(timeout=10)
        assert (answered.error_code, answered.assignment) == (none, b"B"), answered
        # A few coordinator ticks later, the follower's first heartbeat.
        time.sleep(1.0)
        assert heartbeat(b.member_id, generation) == none, (
            "the follower was removed right after it got its assignment")
        assert heartbeat(a.member_id, generation) == none


def test_a_static_leader_rejoining_below_v9_is_not_asked_to_assign(broker):
    """A static leader that restarts and rejoins a stable group unchanged is not named leader
    below JoinGroup v9 (which cannot say "skip the assignment"): the answer names its id from
    before the rejoin and lists no members, as Kafka's does, and its SyncGroup gets the
    assignment it had. kaas named it leader with the member list, so the client ran its
    assignor for a group that hands nobody the result. At v9 it is named leader, with the
    members and skip_assignment. Raw JoinGroup v5 and v9 through kafka-python's codec."""
    from kafka.protocol.consumer import JoinGroupRequest, SyncGroupRequest

    group = unique_topic("static-leader")
    metadata = b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"

    def join(version):
        req = JoinGroupRequest[version]
        fields = dict(group_id=group, session_timeout_ms=10_000, rebalance_timeout_ms=30_000,
                      member_id="", group_instance_id="inst-1", protocol_type="consumer",
                      protocols=[req.JoinGroupRequestProtocol(name="range", metadata=metadata)])
        if version >= 8:
            fields["reason"] = None
        return kwire.send(broker, req(**fields))

    def sync(member_id, generation, assignments=()):
        return kwire.send(broker, SyncGroupRequest[3](
            group_id=group, generation_id=generation, member_id=member_id,
            group_instance_id="inst-1",
            assignments=[SyncGroupRequest[3].SyncGroupRequestAssignment(
                member_id=m, assignment=a) for m, a in assignments]))

    first = join(5)
    assert first.error_code == 0 and first.leader == first.member_id, first
    assert sync(first.member_id, first.generation_id,
                [(first.member_id, b"A")]).error_code == 0

    again = join(5)
    assert again.error_code == 0, again
    assert again.generation_id == first.generation_id, "no rebalance"
    assert again.member_id != first.member_id
    assert again.leader == first.member_id, "named leader below v9"
    assert again.members == [], "sent the member list below v9"
    got = sync(again.member_id, again.generation_id)
    assert (got.error_code, got.assignment) == (0, b"A"), got

    at_v9 = join(9)
    assert at_v9.error_code == 0 and at_v9.generation_id == first.generation_id, at_v9
    assert at_v9.leader == at_v9.member_id and at_v9.skip_assignment
    assert [m[0] for m in at_v9.members] == [at_v9.member_id]


def test_static_member_replaced_without_rebalance(broker):
    """A second classic consumer with the same group.instance.id takes over the first one's
    partitions in the same generation (no rebalance), and the first is fenced
    (FENCED_INSTANCE_ID, fatal in librdkafka)."""
    from confluent_kafka import KafkaError
    topic = unique_topic("static")
    group = unique_topic("static-group")
    create_topic(broker.bootstrap, topic, 2)
    a = rd_consumer(broker.bootstrap, group, "classic", **{"group.instance.id": "inst-1"})
    b = None
    try:
        a.subscribe([topic])
        wait_until(lambda: len(a.assignment()) == 2, 30, "the first instance's assignment",
                   step=lambda: a.poll(0.05))
        b = rd_consumer(broker.bootstrap, group, "classic", **{"group.instance.id": "inst-1"})
        b.subscribe([topic])
        wait_until(lambda: len(b.assignment()) == 2, 30, "the second instance's assignment",
                   step=lambda: b.poll(0.05))
        fenced = []

        def poll_a():
            try:
                m = a.poll(0.05)
            except Exception as e:  # some versions raise on a fatal error
                fenced.append(e)
                return
            if m is not None and m.error() is not None:
                fenced.append(m.error())

        wait_until(lambda: fenced, 30, "the first instance to be fenced", step=poll_a)
        err = fenced[0]
        text = str(err)
        assert (getattr(err, "fatal", lambda: False)() or "fenced" in text.lower()
                or getattr(err, "code", lambda: None)() == KafkaError._FATAL), text
    finally:
        a.close()
        if b is not None:
            b.close()


@pytest.mark.restart
@pytest.mark.parametrize("protocol", ["classic", "consumer", "mixed"])
def test_group_survives_broker_restart(broker, protocol):
    """An active group (librdkafka, classic / consumer protocol, or one member of each: a
    consumer group upgraded online from a classic one) rides through a broker restart: its
    members rejoin, resume from the committed offsets, consume everything produced before and
    after, and the committed offsets end at the end offsets."""
    if broker.external:
        pytest.skip("needs a broker the test can restart")
    topic = unique_topic(f"rst-{protocol}")
    group = unique_topic(f"rst-group-{protocol}")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    rdkafka_produce(broker.bootstrap, topic, values("rst", 300))
    protocols = ["classic", "consumer"] if protocol == "mixed" else [protocol] * 2
    g = RdGroup([rd_consumer(broker.bootstrap, group, p) for p in protocols], topic)
    try:
        g.subscribe()
        wait_until(lambda: len(g.seen) >= 300 and covers(g.assignments(), PARTITIONS), 60,
                   "the group to consume", step=g.step)
        broker.restart()
        rdkafka_produce(broker.bootstrap, topic, values("rst", 300, start=300))
        wait_until(lambda: len(g.seen) >= 600 and covers(g.assignments(), PARTITIONS), 60,
                   "the group to resume after the restart", step=g.step)
        assert not [e for e in g.errors if e.fatal()], g.errors
        wait_until(lambda: committed(broker.bootstrap, group, topic, PARTITIONS)
                   == end_offsets(broker.bootstrap, topic, PARTITIONS), 30,
                   "committed offsets at the end offsets", step=g.step)
        # Committed before the restart: nothing read before it is read again in full.
        assert sum(g.seen.values()) < 900, "the group restarted from the beginning"
    finally:
        g.close()


@pytest.mark.restart
@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_classic_group_keeps_its_generation_across_restart(broker, stop):
    """A classic group (librdkafka, auto-commit every 5 s) rides through a broker restart
    without a rebalance, as on Kafka, whose coordinator loads the group's generation from
    __consumer_offsets: the members keep their ids and assignments, their next auto-commit is
    taken, and no record is delivered twice. Before, the group came back Empty: the members
    were told UNKNOWN_MEMBER_ID, rejoined with new ids, and their last auto-commit was refused,
    so whatever they had read since the one before was delivered again."""
    if broker.external:
        pytest.skip("needs a broker the test can restart")
    topic = unique_topic(f"gen-{stop}")
    group = unique_topic(f"gen-group-{stop}")
    create_topic(broker.bootstrap, topic, 4)
    auto = {"enable.auto.commit": True, "auto.commit.interval.ms": 5000}
    consumers = [rd_consumer(broker.bootstrap, group, "classic", **auto) for _ in range(2)]
    seen: dict[bytes, int] = {}
    assigned: list[int] = []

    def step():
        for c in consumers:
            for m in c.consume(num_messages=500, timeout=0.02):
                if m.error() is None:
                    seen[m.value()] = seen.get(m.value(), 0) + 1

    try:
        for i, c in enumerate(consumers):
            c.subscribe([topic], on_assign=lambda _c, _parts, i=i: assigned.append(i))
        wait_until(lambda: all(c.assignment() for c in consumers), 60,
                   "both members to get partitions", step=step)
        rdkafka_produce(broker.bootstrap, topic, values("gen", 300))
        wait_until(lambda: len(seen) >= 300, 60, "the group to consume", step=step)
        members = [c.memberid() for c in consumers]
        assignments = [sorted(tp.partition for tp in c.assignment()) for c in consumers]
        rebalances = len(assigned)
        # Within the auto-commit interval of reading: what was read is not all committed yet.
        if stop == "sigterm":
            broker.restart()
        else:
            broker.kill()
            broker.start()
        rdkafka_produce(broker.bootstrap, topic, values("gen", 300, start=300))
        wait_until(lambda: len(seen) >= 600, 60, "the group to consume after the restart",
                   step=step)
        # Heartbeats and an auto-commit after the restart.
        end = time.monotonic() + 6
        while time.monotonic() < end:
            step()
        assert [c.memberid() for c in consumers] == members, "the members were made to rejoin"
        assert len(assigned) == rebalances, "the group rebalanced after the restart"
        assert [sorted(tp.partition for tp in c.assignment()) for c in consumers] == assignments
        twice = {v: n for v, n in seen.items() if n > 1}
        assert not twice, f"{len(twice)} records delivered more than once"
        wait_until(lambda: committed(broker.bootstrap, group, topic, 4)
                   == end_offsets(broker.bootstrap, topic, 4), 30,
                   "committed offsets at the end offsets", step=step)
    finally:
        for c in consumers:
            c.close()


# -- KIP-848 ----------------------------------------------------------------------------------


def test_kip848_regex_subscription_and_assignor(broker):
    """A KIP-848 consumer subscribed by regex gets every partition of the matching topics, and
    of a matching topic created later; the server assignor it names (range) is used, and an
    unknown assignor is refused."""
    uid = uuid.uuid4().hex[:8]
    t1, t2, other = f"rx-{uid}-a", f"rx-{uid}-b", f"ry-{uid}-c"
    for t in (t1, t2, other):
        create_topic(broker.bootstrap, t, 2)
    group = unique_topic("rx-group")
    c = rd_consumer(broker.bootstrap, group, "consumer", **{"group.remote.assignor": "range"})
    try:
        c.subscribe([f"^rx-{uid}-.*"])
        want = {(t1, 0), (t1, 1), (t2, 0), (t2, 1)}
        wait_until(lambda: {(tp.topic, tp.partition) for tp in c.assignment()} == want, 30,
                   "the regex's partitions", step=lambda: c.poll(0.05))
        t3 = f"rx-{uid}-d"
        create_topic(broker.bootstrap, t3, 1)
        want.add((t3, 0))
        wait_until(lambda: {(tp.topic, tp.partition) for tp in c.assignment()} == want, 30,
                   "the new matching topic", step=lambda: c.poll(0.05))
    finally:
        c.close()
    bad = rd_consumer(broker.bootstrap, unique_topic("rx-bad"), "consumer",
                      **{"group.remote.assignor": "no-such-assignor"})
    errors = []
    try:
        bad.subscribe([t1])

        def step():
            m = bad.poll(0.1)
            if m is not None and m.error() is not None:
                errors.append(m.error())

        wait_until(lambda: errors, 20, "UNSUPPORTED_ASSIGNOR", step=step)
        assert "assignor" in str(errors[0]).lower(), errors
    finally:
        bad.close()


# -- Java client -----------------------------------------------------------------------------------


def run_java(java_classes, *args, timeout=300):
    cmd = ["java", "-Xmx512m", "-XX:+UseSerialGC", "-cp", java_classes, "GroupCheck",
           *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise AssertionError(f"GroupCheck {' '.join(map(str, args))} failed ({r.returncode}):\n"
                             f"stdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-6000:]}")
    return r.stdout


def parse_group_check(out: str, partitions: int, messages: int):
    lines = out.splitlines()
    stable = {m.group(1): int(m.group(2)) for m in
              (re.match(r"(STABLE\d) (\d+)", ln) for ln in lines) if m}
    consumed = [ln.split() for ln in lines if ln.startswith("CONSUMED")]
    commits = [ln.split() for ln in lines if ln.startswith("COMMITTED")]
    assert "STABLE1" in stable and "STABLE2" in stable, out
    assert consumed and int(consumed[0][1]) == messages, out
    assert len(commits) == partitions, out
    for _, p, off, end in commits:
        # A partition that never held a record may never have been committed.
        assert off == end or (end == "0" and off == "-1"), \
            f"partition {p}: committed {off}, end {end}\n{out}"
    return stable


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_java_group(broker, java_classes, protocol):
    """The Java client 4.x (group.protocol=classic / consumer): three consumers split six
    partitions disjointly, one closes and the other two take over, every message is consumed
    with commitSync, and the committed offsets equal the end offsets."""
    topic = unique_topic(f"jg-{protocol}")
    out = run_java(java_classes, "group", broker.bootstrap, topic, PARTITIONS,
                   unique_topic("jg-group"), protocol, 3, 2000)
    stable = parse_group_check(out, PARTITIONS, 2000)
    print(f"java {protocol}: first assignment {stable['STABLE1']} ms, "
          f"takeover after a leave {stable['STABLE2']} ms")


@pytest.mark.parametrize("classic", ["classic", "classic-cooperative"])
def test_a_rolling_switch_of_group_protocol_keeps_the_group_consuming(broker, classic):
    """Kafka's online migration (group.consumer.migration.policy=bidirectional, its default):
    a live group of classic librdkafka members is switched to group.protocol=consumer one
    member at a time, and back. The first consumer-protocol member turns the group into a
    consumer group in which the classic members stay and keep their partitions; when the last
    consumer-protocol member leaves, the group is classic again. Records are produced at every
    step; every one is consumed by some member (nothing skipped across either switch), and no
    partition is ever assigned to two members at once."""
    from confluent_kafka.admin import AdminClient
    topic, group = unique_topic("mig"), unique_topic("mig-group")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    members: dict[str, object] = {}
    consumed: dict[tuple[int, int], bytes] = {}
    produced: list[bytes] = []
    overlaps: list[str] = []

    def start(name: str, protocol: str) -> None:
        c = rd_consumer(broker.bootstrap, group, protocol, **{
            "enable.auto.commit": True, "auto.commit.interval.ms": 300})
        c.subscribe([topic])
        members[name] = c

    def poll_all() -> None:
        for c in list(members.values()):
            m = c.poll(0.05)
            if m is not None and not m.error():
                consumed[(m.partition(), m.offset())] = m.value()
        owners: dict[int, str] = {}
        for name, c in members.items():
            for tp in c.assignment():
                if tp.partition in owners:
                    overlaps.append(f"p{tp.partition}: {owners[tp.partition]} and {name}")
                owners[tp.partition] = name

    def produce(step: str) -> None:
        batch = values(f"{step}", 120, start=len(produced))
        rdkafka_produce(broker.bootstrap, topic, batch)
        produced.extend(v for _, v in batch)

    def listing():
        for g in admin.list_consumer_groups(request_timeout=10).result().valid:
            if g.group_id == group:
                return g
        return None

    def settled(kind: str, n: int) -> bool:
        g = listing()
        if g is None or g.type.name.lower() != kind:
            return False
        d = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        owned = [{tp.partition for tp in m.assignment.topic_partitions} for m in d.members]
        return len(d.members) == n and covers(owned, PARTITIONS)

    def stop(name: str) -> None:
        members.pop(name).close()

    def everything_consumed() -> bool:
        return set(produced) <= set(consumed.values())

    try:
        start("c0", classic)
        start("c1", classic)
        produce("classic")
        wait_until(lambda: settled("classic", 2), 60, "two classic members", step=poll_all)
        # Switch: a consumer-protocol member joins the classic group.
        start("k0", "consumer")
        produce("upgrade")
        wait_until(lambda: settled("consumer", 3), 60, "the upgraded group with all three",
                   step=poll_all)
        stop("c0")
        start("k1", "consumer")
        produce("rolling")
        stop("c1")
        wait_until(lambda: settled("consumer", 2), 60, "two consumer-protocol members",
                   step=poll_all)
        wait_until(everything_consumed, 60, "every record after the upgrade", step=poll_all)
        # And back: a classic member joins the consumer group, the consumer members leave.
        start("c2", classic)
        produce("mixed")
        wait_until(lambda: settled("consumer", 3), 60, "a classic member in the consumer group",
                   step=poll_all)
        stop("k0")
        produce("downgrade")
        stop("k1")
        wait_until(lambda: settled("classic", 1), 60, "the downgraded classic group",
                   step=poll_all)
        produce("classic-again")
        wait_until(everything_consumed, 60, "every record after the downgrade", step=poll_all)
    finally:
        for c in members.values():
            c.close()
    missing = set(produced) - set(consumed.values())
    assert not missing, f"{len(missing)} records never consumed, e.g. {sorted(missing)[:5]}"
    assert not overlaps, f"partitions assigned to two members at once: {overlaps[:5]}"


def test_java_members_switch_group_protocol_both_ways(broker, java_classes, tmp_path):
    """The same rolling switch with the Java client 4.x as separate processes (its defaults:
    range then cooperative-sticky for classic members, auto commit, SIGTERM closes and
    leaves): two classic members, then consumer-protocol members replace them one at a time,
    then a classic member replaces those. Every record produced at every step is consumed, and
    each settled group splits the partitions disjointly."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient
    topic, group = unique_topic("jmig"), unique_topic("jmig-group")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    # Offset 0 committed first: a member finding no offset would start at the end (Java's
    # auto.offset.reset=latest) and miss what was produced before it was assigned.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    c.commit(offsets=[TopicPartition(topic, p, 0) for p in range(PARTITIONS)], asynchronous=False)
    c.close()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    procs: dict[str, subprocess.Popen] = {}
    outs: list = []
    produced: list[bytes] = []

    def start(name: str, protocol: str) -> None:
        out = tmp_path / f"{name}.txt"
        outs.append(out)
        err = open(tmp_path / f"{name}.err", "ab")
        procs[name] = subprocess.Popen(
            ["java", "-Xmx256m", "-XX:+UseSerialGC", "-cp", java_classes, "KaasClientCheck",
             "member", broker.bootstrap, group, topic, str(out), protocol],
            stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT)
        err.close()

    def stop(name: str) -> None:
        p = procs.pop(name)
        p.send_signal(signal.SIGTERM)
        p.wait(60)

    def consumed() -> set[bytes]:
        got = set()
        for f in outs:
            if f.exists():
                got.update(line.split(" ", 2)[2].encode()
                           for line in f.read_text().splitlines() if line.count(" ") >= 2)
        return got

    def produce(step: str) -> None:
        batch = values(step, 120, start=len(produced))
        rdkafka_produce(broker.bootstrap, topic, batch)
        produced.extend(v for _, v in batch)

    def settled(kind: str, n: int) -> bool:
        listed = [g for g in admin.list_consumer_groups(request_timeout=10).result().valid
                  if g.group_id == group]
        if not listed or listed[0].type.name.lower() != kind:
            return False
        d = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        owned = [{tp.partition for tp in m.assignment.topic_partitions} for m in d.members]
        return len(d.members) == n and covers(owned, PARTITIONS)

    def all_consumed() -> bool:
        return set(produced) <= consumed()

    try:
        start("classic-0", "classic")
        start("classic-1", "classic")
        produce("classic")
        wait_until(lambda: settled("classic", 2), 90, "two classic members", interval=0.5)
        start("consumer-0", "consumer")
        produce("upgrade")
        wait_until(lambda: settled("consumer", 3), 90, "the upgraded group", interval=0.5)
        stop("classic-0")
        start("consumer-1", "consumer")
        stop("classic-1")
        produce("rolling")
        wait_until(lambda: settled("consumer", 2), 90, "two consumer members", interval=0.5)
        wait_until(all_consumed, 90, "every record after the upgrade", interval=0.5)
        start("classic-2", "classic")
        wait_until(lambda: settled("consumer", 3), 90, "a classic member in the consumer group",
                   interval=0.5)
        stop("consumer-0")
        produce("downgrade")
        stop("consumer-1")
        wait_until(lambda: settled("classic", 1), 90, "the downgraded group", interval=0.5)
        produce("classic-again")
        wait_until(all_consumed, 90, "every record after the downgrade", interval=0.5)
    finally:
        for name in list(procs):
            stop(name)
    missing = set(produced) - consumed()
    assert not missing, f"{len(missing)} records never consumed, e.g. {sorted(missing)[:5]}"


# -- durability ----------------------------------------------------------------------------------


@pytest.mark.restart
def test_offsets_survive_restart_and_crash(broker):
    """Committed offsets (with metadata and leader epochs) come back after a clean restart and
    after a SIGKILL; offsets committed after the restart are kept too, and a deleted group's
    offsets stay deleted."""
    from confluent_kafka import Consumer, TopicPartition
    if broker.external:
        pytest.skip("needs a broker the test can restart")
    topic = unique_topic("dur")
    create_topic(broker.bootstrap, topic, 4)
    groups = [unique_topic("dur-g") for _ in range(5)]
    gone = unique_topic("dur-gone")

    def commit(group, base, meta):
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
        try:
            tps = [TopicPartition(topic, p, base + p, metadata=meta) for p in range(4)]
            res = c.commit(offsets=tps, asynchronous=False)
            assert all(tp.error is None for tp in res), res
        finally:
            c.close()

    def read(group):
        # A coordinator still loading answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS
        # (Apache Kafka does after a crash); clients retry those.
        from confluent_kafka import KafkaException
        deadline = time.monotonic() + 30
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
        try:
            while True:
                try:
                    tps = c.committed([TopicPartition(topic, p) for p in range(4)], timeout=20)
                    return {tp.partition: (tp.offset, tp.metadata) for tp in tps}
                except KafkaException as e:
                    if not e.args[0].retriable() and e.args[0].code() not in (14, 15, 16):
                        raise
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        finally:
            c.close()

    for i, g in enumerate(groups):
        commit(g, 10 * i, f"m{i}")
    commit(gone, 5, "x")
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # must outlive the future
    admin.delete_consumer_groups([gone], request_timeout=20)[gone].result(20)
    want = {g: {p: (10 * i + p, f"m{i}") for p in range(4)} for i, g in enumerate(groups)}
    broker.restart()
    assert {g: read(g) for g in groups} == want
    commit(groups[0], 100, "after-restart")
    want[groups[0]] = {p: (100 + p, "after-restart") for p in range(4)}
    broker.kill()
    broker.start()
    assert {g: read(g) for g in groups} == want
    assert all(off < 0 for off, _ in read(gone).values())


# -- the kafka-consumer-groups tool ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tool(kafka_libs):
    if not any(p.name.startswith("kafka-tools-") for p in kafka_libs.iterdir()):
        pytest.skip("kafka-tools jar missing")

    def run(*args, timeout=120, check=True):
        cmd = ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
               "-cp", f"{kafka_libs}/*", CONSUMER_GROUP_COMMAND, *map(str, args)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"kafka-consumer-groups {' '.join(map(str, args))} exited "
                                 f"{r.returncode}\nstdout: {r.stdout[-3000:]}\n"
                                 f"stderr: {r.stderr[-3000:]}")
        return r.stdout

    return run


def describe_rows(out: str):
    """Rows of `--describe` output as dicts keyed by the header's column names."""
    rows, header = [], None
    for line in out.splitlines():
        cols = line.split()
        if not cols:
            continue
        if cols[0] == "GROUP":
            header = cols
            continue
        if header and len(cols) == len(header):
            rows.append(dict(zip(header, cols)))
    return rows


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_consumer_groups_tool(broker, tool, protocol):
    """kafka-consumer-groups lists the group, describes its active member and the lag of every
    partition, and, once the group is empty, resets its offsets to the earliest and deletes
    it."""
    bs = ["--bootstrap-server", broker.bootstrap]
    topic = unique_topic(f"tool-{protocol}")
    group = unique_topic(f"tool-group-{protocol}")
    create_topic(broker.bootstrap, topic, 3)
    # Keyed, so every partition gets records (and a committed offset to describe).
    keyed = [(b"k%d" % i, v) for i, (_, v) in enumerate(values("tool", 330))]
    rdkafka_produce(broker.bootstrap, topic, keyed[:300])
    g = RdGroup([rd_consumer(broker.bootstrap, group, protocol)], topic)
    g.subscribe()
    stop = threading.Event()
    try:
        wait_until(lambda: len(g.seen) >= 300, 60, "the group to consume", step=g.step)
        rdkafka_produce(broker.bootstrap, topic, keyed[300:])

        def keep_polling():
            while not stop.is_set():
                for c in g.consumers:
                    c.poll(0.05)  # alive, but no longer consuming-and-committing

        poller = threading.Thread(target=keep_polling, daemon=True)
        # librdkafka consumers are not thread-safe for concurrent polls; only this thread
        # polls from here on.
        poller.start()
        assert group in tool(*bs, "--list").split()
        members = tool(*bs, "--describe", "--group", group, "--members")
        assert "rdkafka" in members or "CLIENT-ID" in members, members
        rows = describe_rows(tool(*bs, "--describe", "--group", group))
        assert {int(r["PARTITION"]) for r in rows} == {0, 1, 2}, rows
        assert sum(int(r["LAG"]) for r in rows) == 30, rows
        assert all(r["CONSUMER-ID"] != "-" for r in rows), rows
    finally:
        stop.set()
        time.sleep(0.2)
        g.close()
    wait_until(lambda: "Empty" in tool(*bs, "--describe", "--group", group, "--state"), 30,
               "the group to be empty", interval=0.5)
    # ListGroups with a state filter.
    listed = tool(*bs, "--list", "--state", "Empty")
    assert any(line.split()[:1] == [group] and "Empty" in line for line in listed.splitlines()), \
        listed
    assert group not in tool(*bs, "--list", "--state", "Stable").split()
    out = tool(*bs, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest",
               "--execute")
    assert topic in out
    assert committed(broker.bootstrap, group, topic, 3) == {0: 0, 1: 0, 2: 0}
    rows = describe_rows(tool(*bs, "--describe", "--group", group))
    assert sum(int(r["LAG"]) for r in rows) == 330, rows
    out = tool(*bs, "--delete", "--group", group)
    assert "successful" in out.lower(), out
    assert group not in tool(*bs, "--list").split()


# -- API semantics (kafka-python admin) -----------------------------------------------------------


def test_group_admin_semantics(broker):
    """Describe of an unknown group, DeleteGroups of an active or unknown group, OffsetDelete of
    a subscribed topic or of a partition that does not exist, and a standalone commit into an
    active group get Kafka's errors; an empty group's offsets can be deleted partition by
    partition."""
    from kafka import KafkaAdminClient, TopicPartition as KTP
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    topic = unique_topic("sem")
    group = unique_topic("sem-group")
    create_topic(broker.bootstrap, topic, 2)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    member = rd_consumer(broker.bootstrap, group, "classic")
    try:
        member.subscribe([topic])
        wait_until(lambda: len(member.assignment()) == 2, 30, "the member's assignment",
                   step=lambda: member.poll(0.05))
        member.commit(offsets=[TopicPartition(topic, 0, 1), TopicPartition(topic, 1, 1)],
                      asynchronous=False)
        res = admin.delete_groups([group, unique_topic("nope")])
        assert res[group] != "OK" and "NonEmpty" in str(res[group]), res
        assert any("GroupIdNotFound" in str(v) for k, v in res.items() if k != group), res
        deleted = admin.delete_group_offsets(group, [KTP(topic, 0)])
        assert "SubscribedToTopic" in str(deleted), deleted
        # A standalone consumer (no generation) may not commit into an active group.
        outsider = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
        try:
            with pytest.raises(KafkaException):
                outsider.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
        finally:
            outsider.close()
    finally:
        member.close()
    wait_until(lambda: admin.describe_groups([group])[group]["group_state"] == "Empty", 30,
               "the group to be empty", interval=0.2)
    deleted = admin.delete_group_offsets(group, [KTP(topic, 0)])
    assert "NoError" in str(deleted), deleted
    offsets = admin.list_group_offsets(group)[group]
    assert KTP(topic, 0) not in offsets and offsets[KTP(topic, 1)].offset == 1, offsets
    # As Kafka: a partition or topic that does not exist is named, not answered "deleted".
    for tp in (KTP(topic, 9), KTP(unique_topic("no-such-topic"), 0)):
        deleted = admin.delete_group_offsets(group, [tp])
        assert "UnknownTopicOrPartition" in str(deleted), (tp, deleted)
    unknown = unique_topic("never")
    d = admin.describe_groups([unknown])[unknown]
    assert d.get("group_state") == "Dead" or "GroupIdNotFound" in str(d.get("error")), d
    # A group that never committed stays after its last member leaves, Empty, as on Kafka
    # (until the offsets cleanup): listed, and deletable. It used to vanish at once, and
    # DeleteGroups answered GROUP_ID_NOT_FOUND.
    idle = unique_topic("sem-idle")
    member = rd_consumer(broker.bootstrap, idle, "classic")
    try:
        member.subscribe([topic])
        wait_until(lambda: len(member.assignment()) == 2, 30, "the idle member's assignment",
                   step=lambda: member.poll(0.05))
    finally:
        member.close()
    wait_until(lambda: admin.describe_groups([idle])[idle].get("group_state") == "Empty", 30,
               "the idle group to be empty", interval=0.2)
    time.sleep(1)  # many coordinator ticks
    listed = admin.list_groups()
    assert any(idle in (g.get("group_id"), g.get("group")) if isinstance(g, dict) else idle in g
               for g in listed), listed
    res = admin.delete_groups([idle])
    assert res[idle] == "OK", res
    admin.close()


# -- benchmarks (long) ------------------------------------------------------------------------------


@pytest.mark.long
@pytest.mark.skipif(not LONG, reason="set KAAS_LONG_TESTS=1")
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_bench_rebalance_100_partitions_10_members(broker, java_classes, protocol):
    """Benchmark: 10 Java consumers on 100 partitions; time from the start of one member's
    close (it leaves the group) to the remaining nine owning all 100 partitions disjointly."""
    topic = unique_topic(f"bench-rb-{protocol}")
    out = run_java(java_classes, "group", broker.bootstrap, topic, 100,
                   unique_topic("bench-rb"), protocol, 10, 2000, timeout=600)
    stable = parse_group_check(out, 100, 2000)
    print(f"BENCH rebalance {protocol}: first assignment {stable['STABLE1']} ms, "
          f"stable again after a leave {stable['STABLE2']} ms")


@pytest.mark.long
@pytest.mark.skipif(not LONG, reason="set KAAS_LONG_TESTS=1")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_bench_offset_commits(broker, java_classes, mode):
    """Benchmark: offset commits per second for one group from one Java consumer (commitSync
    in a loop, or commitAsync with up to 64 outstanding), each acknowledged only once durable."""
    topic = unique_topic("bench-commit")
    create_topic(broker.bootstrap, topic, 1)
    out = run_java(java_classes, "commitbench", broker.bootstrap, topic,
                   unique_topic("bench-commit"), 10, mode)
    m = re.search(r"COMMITS (\d+) (\d+)", out)
    assert m, out
    print(f"BENCH offset commits ({mode}): {m.group(2)}/s ({m.group(1)} in 10 s)")


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_deleted_topics_offsets_do_not_position_its_successor(broker, protocol):
    """A group's committed offsets go with their topic, as in Kafka: deleted and created again
    under its name (here with fewer partitions), the topic is read from its start by a group
    that had read the old one to its end, `list_consumer_group_offsets` lists nothing for the
    deleted partitions, and the group is described. kaas kept the old offsets by name: the
    group skipped the new topic's records up to the old offset, and kafka-consumer-groups
    --describe failed on the partition that no longer exists (found side by side with Kafka
    4.4)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import NewTopic
    from kcheck import admin
    topic, group = unique_topic(f"reborn-{protocol}"), unique_topic(f"reborn-g-{protocol}")
    create_topic(broker.bootstrap, topic, 2)
    rdkafka_produce(broker.bootstrap, topic, values("old", 20))
    c = rd_consumer(broker.bootstrap, group, protocol)
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(2)])
        seen = []
        wait_until(lambda: len(seen) >= 20, 30, "the old topic read",
                   step=lambda: seen.extend(m for m in c.consume(100, 0.1) if not m.error()))
        c.commit(asynchronous=False)
    finally:
        c.close()
    assert committed(broker.bootstrap, group, topic, 2) == end_offsets(broker.bootstrap, topic, 2)

    a = admin(broker.bootstrap)
    a.delete_topics([topic], operation_timeout=30)[topic].result(30)
    wait_until(lambda: topic not in a.list_topics(timeout=10).topics, 30, "the topic gone")
    a.create_topics([NewTopic(topic, 1)], operation_timeout=30)[topic].result(60)
    rdkafka_produce(broker.bootstrap, topic, values("new", 5))

    def listed():
        req = [ConsumerGroupTopicPartitions(group)]
        [f] = a.list_consumer_group_offsets(req).values()
        return {(tp.partition, tp.offset) for tp in f.result(30).topic_partitions
                if tp.topic == topic}
    assert listed() <= {(0, -1001)}, listed()
    [described] = a.describe_consumer_groups([group]).values()
    assert described.result(30).group_id == group

    c = rd_consumer(broker.bootstrap, group, protocol)
    try:
        c.subscribe([topic])
        got = []
        wait_until(lambda: len(got) >= 5, 60, "the new topic read from its start",
                   step=lambda: got.extend(m.value() for m in c.consume(100, 0.1)
                                           if not m.error()))
        assert sorted(got) == sorted(v for _, v in values("new", 5))
    finally:
        c.close()
