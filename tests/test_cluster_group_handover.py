"""A consumer group whose coordinator moves while a member's JoinGroup waits (cluster mode).

A group is coordinated by the first alive broker from its hash; when its home broker comes
back, the group moves home from the broker that stood in for it, although that broker is
alive. JoinGroup and SyncGroup requests parked on the stand-in then must be answered
NOT_COORDINATOR, as Kafka answers them when it unloads a group, so the members find the home
broker and rejoin there. The stand-in used to drop the group with the requests still parked:
no answer until the clients' own timeout (the rebalance timeout, five minutes by default), and
the whole group consumed nothing meanwhile — the stall test_failover_clients.py's group chaos
found (14,306 acknowledged records never consumed).

Three real broker processes; the members are raw JoinGroup v5 requests, so the test decides
exactly which request waits.
"""
from __future__ import annotations

import signal
import socket
import struct
import time

import pytest

import kwire
from kcluster import logs_on_failure, make_cluster  # noqa: F401  (the fixture)
from test_failover_clients import pytestmark  # noqa: F401  (skips when brokers are external)

GROUP = "handover"
NOT_COORDINATOR, LOAD_IN_PROGRESS, MEMBER_ID_REQUIRED = 16, 14, 79


def fnv1a_32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def subscription(topic: str) -> bytes:
    """ConsumerProtocolSubscription v0: one topic, no user data."""
    return struct.pack(">hi", 0, 1) + kwire.string(topic) + struct.pack(">i", -1)


def send_join(s: socket.socket, corr: int, member_id: str, session_ms: int) -> None:
    meta = subscription("t")
    body = (kwire.string(GROUP) + struct.pack(">ii", session_ms, 300_000)
            + kwire.string(member_id) + kwire.string(None) + kwire.string("consumer")
            + struct.pack(">i", 1) + kwire.string("range") + struct.pack(">i", len(meta)) + meta)
    s.sendall(kwire.request(11, 5, corr, body))


def read_join(s: socket.socket, timeout: float) -> tuple[int, int, str]:
    """(error code, generation, member id) of a JoinGroup v5 response."""
    s.settimeout(timeout)
    frame = kwire.recv_frame(s)
    pos = 4 + 4  # correlation id, throttle time
    (error, generation) = struct.unpack_from(">hi", frame, pos)
    pos += 6
    for _ in range(2):  # protocol name, leader
        (n,) = struct.unpack_from(">h", frame, pos)
        pos += 2 + max(n, 0)
    (n,) = struct.unpack_from(">h", frame, pos)
    member_id = frame[pos + 2:pos + 2 + n].decode()
    return error, generation, member_id


def join(node, session_ms: int, within: float = 60.0):
    """Joins as a new member at `node` (KIP-394: the first answer gives the member id) and
    returns (socket, member id) with the second JoinGroup sent and not yet answered. Waits
    (bounded) while `node` does not coordinate the group yet; a refused join leaves no
    pending member behind to hold up the rebalance."""
    deadline = time.monotonic() + within
    while True:
        s = kwire.connect(node)
        send_join(s, 1, "", session_ms)
        error, _, member_id = read_join(s, 30)
        if error == MEMBER_ID_REQUIRED:
            send_join(s, 2, member_id, session_ms)
            return s, member_id
        s.close()
        assert error in (NOT_COORDINATOR, LOAD_IN_PROGRESS), f"broker {node.id}: JoinGroup error {error}"
        assert time.monotonic() < deadline, f"broker {node.id} did not coordinate the group in {within}s"
        time.sleep(0.5)


@logs_on_failure
def test_a_join_waiting_on_a_coordinator_that_hands_the_group_home_is_answered(make_cluster):
    c = make_cluster(3)
    c.wait_controller()
    home = c.nodes[fnv1a_32(GROUP.encode()) % 3]
    stand_in = c.nodes[(home.id + 1) % 3]
    home.kill()

    # a joins and forms generation 1; b's join then waits for a, who has a long session and
    # never rejoins, so nothing but the coordinator moving can answer b soon.
    sa, _ = join(stand_in, session_ms=120_000)
    error, generation, _ = read_join(sa, 30)
    assert (error, generation) == (0, 1)
    sb, b = join(stand_in, session_ms=120_000)
    with pytest.raises(socket.timeout):
        read_join(sb, 1.0)

    home.start()
    started = time.monotonic()
    try:
        error, _, member_id = read_join(sb, 45)
    except socket.timeout:
        pytest.fail(f"b's JoinGroup parked on broker {stand_in.id} was not answered within 45 s"
                    f" of broker {home.id} coming back to coordinate the group")
    waited = time.monotonic() - started
    print(f"b answered {error} after {waited:.1f}s")
    assert (error, member_id) == (NOT_COORDINATOR, b)

    # The home broker serves the group: a new member forms a generation there.
    sc, _ = join(home, session_ms=30_000)
    error, generation, _ = read_join(sc, 30)
    assert error == 0 and generation >= 1
    for s in (sa, sb, sc):
        s.close()


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
@logs_on_failure
def test_a_group_keeps_its_generation_when_its_coordinator_moves(make_cluster, stop):
    """The broker coordinating a classic group (two librdkafka consumers) stops — drained by
    SIGTERM, or killed: the broker that takes the group over loads its generation from the
    shared volume, as Kafka's new coordinator loads it from __consumer_offsets, and the
    members carry on with the ids and partitions they had: no rebalance, nothing delivered
    twice. Before, the group came back Empty at the new coordinator and every member was made
    to rejoin."""
    from confluent_kafka import Consumer, Producer
    from test_cluster import create_topic

    c = make_cluster(3)
    c.wait_controller()
    group, topic, partitions = "moving", "moving-t", 6
    home = c.nodes[fnv1a_32(group.encode()) % 3]
    create_topic(c.bootstrap(), topic, partitions)
    # The session outlasts the move (a killed broker is declared dead within the failover
    # bound): librdkafka also times its session out on its own side.
    conf = {"bootstrap.servers": c.bootstrap(), "group.id": group,
            "auto.offset.reset": "earliest", "session.timeout.ms": 30_000,
            "heartbeat.interval.ms": 1_000, "auto.commit.interval.ms": 1_000}
    consumers = [Consumer(conf) for _ in range(2)]
    seen: dict[bytes, int] = {}
    assigned: list[int] = []

    def produce(start: int, n: int) -> None:
        p = Producer({"bootstrap.servers": c.bootstrap(), "enable.idempotence": True})
        for i in range(start, start + n):
            p.produce(topic, key=str(i).encode(), value=f"m{i}".encode())
        assert p.flush(60) == 0, "records not acknowledged"

    def step() -> None:
        for consumer in consumers:
            for m in consumer.consume(num_messages=500, timeout=0.05):
                if m.error() is None:
                    seen[m.value()] = seen.get(m.value(), 0) + 1

    def wait(pred, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"{what} within {timeout}s"
            step()

    try:
        for i, consumer in enumerate(consumers):
            consumer.subscribe([topic], on_assign=lambda _c, _p, i=i: assigned.append(i))
        wait(lambda: all(x.assignment() for x in consumers), 60, "both members get partitions")
        produce(0, 200)
        wait(lambda: len(seen) >= 200, 60, "the group consumes")
        members = [x.memberid() for x in consumers]
        rebalances = len(assigned)
        if stop == "sigterm":
            home.signal(signal.SIGTERM)
            home.proc.wait(60)
        else:
            home.kill()
        produce(200, 200)
        wait(lambda: len(seen) >= 400, 90, "the group consumes after its coordinator moved")
        # Heartbeats and commits at the new coordinator.
        end = time.monotonic() + 5
        while time.monotonic() < end:
            step()
        print(f"{stop}: {len(assigned) - rebalances} rebalances after the move,"
              f" {sum(n > 1 for n in seen.values())} records delivered twice")
        assert [x.memberid() for x in consumers] == members, "the members were made to rejoin"
        assert len(assigned) == rebalances, "the group rebalanced when its coordinator moved"
        assert not [v for v, n in seen.items() if n > 1], "records delivered twice"
    finally:
        for consumer in consumers:
            consumer.close()


def offset_fetch_v1(node, group: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    """(committed offset, error code) per partition from a raw OffsetFetch v1 sent to `node`
    (v1 carries a group error on every partition)."""
    body = (kwire.string(group) + struct.pack(">i", 1) + kwire.string(topic)
            + struct.pack(">i", partitions) + b"".join(struct.pack(">i", p) for p in range(partitions)))
    with kwire.connect(node) as s:
        s.sendall(kwire.request(9, 1, 7, body))
        s.settimeout(30)
        frame = kwire.recv_frame(s)
    pos = 4 + 4  # correlation id, topic count
    (n,) = struct.unpack_from(">h", frame, pos)
    pos += 2 + n
    (count,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    out = []
    for _ in range(count):
        _, offset, mlen = struct.unpack_from(">iqh", frame, pos)
        pos += 14 + max(mlen, 0)
        (error,) = struct.unpack_from(">h", frame, pos)
        pos += 2
        out.append((offset, error))
    return out


def describe_group_v0_error(node, group: str) -> int:
    with kwire.connect(node) as s:
        s.sendall(kwire.request(15, 0, 8, struct.pack(">i", 1) + kwire.string(group)))
        s.settimeout(30)
        frame = kwire.recv_frame(s)
    return struct.unpack_from(">h", frame, 8)[0]


@logs_on_failure
def test_only_the_coordinator_answers_for_a_group_and_with_its_offsets(make_cluster):
    """OffsetFetch and DescribeGroups sent to a broker that does not coordinate the group are
    refused NOT_COORDINATOR, as Kafka refuses them, and the broker that takes the group over
    answers with the offsets committed at the old one. A non-coordinator used to answer
    "no committed offset" (-1, no error) from its empty memory, and a member that asked it
    while the group moved (its FindCoordinator and the move crossing) reset to the log end
    with auto.offset.reset=latest: 3,113 acknowledged records never consumed in a group
    chaos run."""
    from confluent_kafka import Consumer, TopicPartition
    from test_cluster import create_topic

    c = make_cluster(3)
    c.wait_controller()
    group, topic, partitions = "reads", "reads-t", 3
    create_topic(c.bootstrap(), topic, partitions)
    c.wait_settled(partitions, balanced=True)  # every broker alive in every broker's view
    home = c.nodes[fnv1a_32(group.encode()) % 3]
    stand_in = c.nodes[(home.id + 1) % 3]
    consumer = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, 42) for p in range(partitions)],
                        asynchronous=False)
    finally:
        consumer.close()
    assert offset_fetch_v1(home, group, topic, partitions) == [(42, 0)] * partitions
    for node in c.nodes:
        if node is home:
            continue
        answers = offset_fetch_v1(node, group, topic, partitions)
        assert [e for _, e in answers] == [NOT_COORDINATOR] * partitions, \
            f"broker {node.id} does not coordinate {group} but answered OffsetFetch {answers}"
        assert describe_group_v0_error(node, group) == NOT_COORDINATOR
    # A group nobody ever served: the coordinator answers it unknown (no offsets).
    assert offset_fetch_v1(c.nodes[fnv1a_32(b"never") % 3], "never", topic, 1) == [(-1, 0)]

    home.kill()
    deadline = time.monotonic() + 60
    while True:
        answers = offset_fetch_v1(stand_in, group, topic, partitions)
        errors = {e for _, e in answers}
        if errors.isdisjoint({NOT_COORDINATOR, LOAD_IN_PROGRESS}):
            break
        assert time.monotonic() < deadline, f"broker {stand_in.id} never took the group over"
        time.sleep(0.05)
    assert answers == [(42, 0)] * partitions, \
        f"the group's new coordinator answered {answers}, not the offsets committed before"
