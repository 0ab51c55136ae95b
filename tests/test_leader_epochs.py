"""Leader epochs as Kafka's clients rely on them (issue 12, item 3), on three real brokers.

Every Kafka broker answers Metadata with a partition's current leader epoch, whichever broker
is asked. librdkafka caches it, sends it as `current_leader_epoch` in Fetch and
OffsetForLeaderEpoch, and validates its position when it rises; the leader fences a request
from an older epoch (FENCED_LEADER_EPOCH) so that the client refreshes and validates before it
reads on. kaas's non-leaders used to answer -1, so a client's epoch flipped with the broker it
asked, and a tailing consumer with `auto.offset.reset=error` saw false truncations after
controller pauses; and Fetch ignored the epoch altogether.

Requests are built and parsed with kafka-python's protocol classes (its own codec, not kaas's)
and sent over a plain socket, so the test sees exactly what a client sees.
"""
from __future__ import annotations

import signal
import time

from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import MetadataRequest

from kcheck import create_topic
from kcluster import logs_on_failure, make_cluster  # noqa: F401  (the fixture)
from kwire import Closed, send as call

TOPIC = "epochs"
PARTITIONS = 6
NONE, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 0, 74, 75


def epochs(node) -> dict[int, tuple[int, int]]:
    """partition -> (leader id, leader epoch), as `node` answers Metadata v12."""
    req = MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)],
                              allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False)
    resp = call(node, req)
    (t,) = resp.topics
    assert t.error_code == NONE, t
    return {p.partition_index: (p.leader_id, p.leader_epoch) for p in t.partitions}


def agreed_epochs(c) -> dict[int, tuple[int, int]]:
    """What every running broker reports, once they all report the same."""
    seen = {}

    def same():
        seen.clear()
        seen.update({n.id: epochs(n) for n in c.running()})
        return len({tuple(sorted(v.items())) for v in seen.values()}) == 1

    c.wait(same, 30, "every broker reporting the same leaders and epochs")
    return next(iter(seen.values()))


def fetch_error(node, partition: int, current_leader_epoch: int) -> int:
    req = FetchRequest[12](
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=[
            FetchRequest.FetchTopic.FetchPartition(
                partition=partition, current_leader_epoch=current_leader_epoch,
                fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                partition_max_bytes=1 << 20)])],
        forgotten_topics_data=[], rack_id="")
    resp = call(node, req)
    (t,) = resp.responses
    (p,) = t.partitions
    return p.error_code


@logs_on_failure
def test_every_broker_reports_the_leaders_epoch_and_fetch_is_fenced(make_cluster):
    """All three brokers answer Metadata with the same leader and epoch for every partition
    (was: -1 from the brokers that do not lead it), every epoch at least 1 (a take-over
    raises it); after a broker is killed its partitions' epochs rise and everyone agrees again.
    The leader fences a Fetch from an older epoch (FENCED_LEADER_EPOCH) and one from a newer
    epoch (UNKNOWN_LEADER_EPOCH), and serves the current epoch and -1 (was: served them all)."""
    c = make_cluster(3)
    create_topic(c.bootstrap(), TOPIC, PARTITIONS)
    c.wait_settled(PARTITIONS, balanced=True)
    before = agreed_epochs(c)
    assert all(e >= 1 for _, e in before.values()), before

    by_id = {n.id: n for n in c.nodes}
    for p, (leader, epoch) in before.items():
        node = by_id[leader]
        assert fetch_error(node, p, epoch) == NONE
        assert fetch_error(node, p, -1) == NONE
        assert fetch_error(node, p, epoch - 1) == FENCED_LEADER_EPOCH
        assert fetch_error(node, p, epoch + 1) == UNKNOWN_LEADER_EPOCH

    victim = next(n for n in c.nodes if n is not c.controller())
    moved = {p for p, (leader, _) in before.items() if leader == victim.id}
    assert moved, before
    victim.kill()
    c.wait_settled(PARTITIONS)
    after = agreed_epochs(c)
    for p in moved:
        leader, epoch = after[p]
        assert leader != victim.id and epoch > before[p][1], (p, before[p], after[p])
        # A client still holding the dead leader's epoch is fenced by the new leader.
        assert fetch_error(by_id[leader], p, before[p][1]) == FENCED_LEADER_EPOCH


def answers(node) -> dict[int, tuple[int, int]] | None:
    """Like `epochs`, but None when `node` cannot answer for the topic yet (not up, not placed)."""
    req = MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)],
                              allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False)
    try:
        resp = call(node, req)
    except (OSError, Closed):  # stopped, or stopping
        return None
    (t,) = resp.topics
    if t.error_code != NONE:
        return None
    return {p.partition_index: (p.leader_id, p.leader_epoch) for p in t.partitions}


@logs_on_failure
def test_an_epoch_names_one_leader_while_leadership_moves(make_cluster):
    """While partitions move — a broker drained by SIGTERM, restarted and given its share back,
    another killed — every broker is asked for Metadata over and over. Every answer has a real
    epoch (was: -1 from every broker while a partition was between leaders, and from the
    brokers that had not yet seen the new leader's claim; librdkafka takes -1 from anyone,
    after which a late answer naming the old leader at its old epoch wins), and one epoch
    always names one broker: a partition's epoch rises when it leaves its leader, and the
    leader that ends a handover keeps the handover's epoch (no client is sent to "none"). The
    epoch the leaders run at in the end is at least every epoch ever
    reported, so no client was told an epoch that would make it ignore the real leader."""
    import threading

    c = make_cluster(3)
    create_topic(c.bootstrap(), TOPIC, PARTITIONS)
    c.wait_settled(PARTITIONS, balanced=True)
    seen: list[tuple[int, int, int, int]] = []  # (asked broker, partition, leader, epoch)
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            for n in list(c.nodes):
                got = answers(n) if n.running() else None
                for p, (leader, epoch) in (got or {}).items():
                    seen.append((n.id, p, leader, epoch))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        ctl = c.controller()
        drained, killed = [n for n in c.nodes if n is not ctl][:2]
        drained.signal(signal.SIGTERM)
        c.wait(lambda: not drained.alive(), 60, f"broker {drained.id} exiting after its drain")
        c.wait_settled(PARTITIONS)
        drained.start()
        c.wait_settled(PARTITIONS, balanced=True)
        killed.kill()
        c.wait_settled(PARTITIONS)
        time.sleep(1)
    finally:
        stop.set()
        poller.join(30)
    final = agreed_epochs(c)

    assert len(seen) > 1000, f"only {len(seen)} answers gathered"
    unknown = [s for s in seen if s[3] < 0]
    assert not unknown, f"{len(unknown)} answers without an epoch, e.g. {unknown[:5]}"
    leaders_of: dict[tuple[int, int], set[int]] = {}
    for _, p, leader, epoch in seen:
        if leader >= 0:  # "none" (a handover) shares its epoch with the leader ending it
            leaders_of.setdefault((p, epoch), set()).add(leader)
    shared = {k: v for k, v in leaders_of.items() if len(v) > 1}
    assert not shared, f"epochs naming more than one leader ((partition, epoch): leaders): {shared}"
    for p, (_, epoch) in final.items():
        highest = max(e for _, q, _, e in seen if q == p)
        assert epoch >= highest, f"partition {p} runs at epoch {epoch}, but {highest} was reported"
    moved = {p for p in final if len({e for _, q, _, e in seen if q == p}) > 1}
    assert moved, "no partition changed leader: the test moved nothing"


@logs_on_failure
def test_a_leader_that_missed_a_move_and_back_runs_at_the_reported_epoch(make_cluster):
    """A broker paused while the controller moved some of its partitions towards another
    broker (pending: it could not confirm) and, once that broker drained, back to it, sees
    only the last file when it resumes: it leads those partitions in both files it applied,
    but their epoch rose twice meanwhile, and every other broker reports the new epoch. It
    must reopen them at that epoch (was: it kept serving at the old one, refusing every Fetch
    at the reported epoch with UNKNOWN_LEADER_EPOCH, so librdkafka's consumer read nothing
    from them; found by test_failover_clients.py's chaos run)."""
    # A long fence: the paused broker stays alive in the controller's eyes throughout.
    c = make_cluster(3, extra_args=["--write-fence-ms", "10000"])
    create_topic(c.bootstrap(), TOPIC, 12)
    c.wait_settled(12, balanced=True)
    ctl = c.controller()
    paused, other = [n for n in c.nodes if n is not ctl]
    other.kill()
    c.wait_settled(12, timeout=60)

    def leaders():
        return {p["partition"]: p["leader"] for p in c.assignment()["partitions"] if p["topic"] == TOPIC}

    def pending_from_paused():
        return {m["partition"] for m in c.assignment().get("pending", [])
                if m["topic"] == TOPIC and m["from"] == paused.id}

    paused.pause()
    started = time.monotonic()
    other.start()
    moving = c.wait(pending_from_paused, 8, f"partitions of the paused broker {paused.id} pending")
    other.signal(signal.SIGTERM)
    moving = c.wait(lambda: {p for p in moving if leaders().get(p) == paused.id}, 8,
                    f"one of partitions {sorted(moving)} given back to the paused broker {paused.id}")
    assert time.monotonic() - started < 9, "the paused broker may have been declared gone"
    c.wait(lambda: not other.alive(), 60, f"broker {other.id} exiting after its drain")
    paused.resume()
    c.wait_settled(12)
    final = agreed_epochs(c)
    by_id = {n.id: n for n in c.nodes}

    def served():
        return all(fetch_error(by_id[final[p][0]], p, final[p][1]) == NONE for p in moving)

    c.wait(served, 30, f"partitions {sorted(moving)} served at the epoch every broker reports")


@logs_on_failure
def test_a_paused_leader_of_a_topic_created_again_runs_at_the_reported_epoch(make_cluster):
    """A broker paused while its topic is deleted and created again under the same name (the
    controller placing some of the new partitions on it, as it is still alive) finds itself
    leading the same names in both files it applies. It must take the new topic's partitions
    over, at the epoch every other broker reports (was: it served them by name, opening the new
    directories at epoch 0 on first use, and refused every Fetch at the reported epoch with
    UNKNOWN_LEADER_EPOCH)."""
    from kcheck import admin

    c = make_cluster(3, extra_args=["--write-fence-ms", "20000"])
    create_topic(c.bootstrap(), TOPIC, PARTITIONS)
    c.wait_settled(PARTITIONS, balanced=True)
    ctl = c.controller()
    paused = next(n for n in c.nodes if n is not ctl)
    others = [n for n in c.nodes if n is not paused]

    def placed() -> dict[int, int]:
        a = c.assignment() or {"partitions": []}
        return {p["partition"]: p["leader"] for p in a["partitions"] if p["topic"] == TOPIC}

    paused.pause()
    started = time.monotonic()
    a = admin(c.bootstrap(others))
    a.delete_topics([TOPIC], operation_timeout=10)[TOPIC].result(15)
    c.wait(lambda: not placed(), 10, "the deleted topic gone from assignment.json")

    def created() -> bool:  # the name is refused until its reuse delay has passed
        try:
            create_topic(c.bootstrap(others), TOPIC, PARTITIONS, timeout=5)
            return True
        except Exception:  # noqa: BLE001  (TOPIC_ALREADY_EXISTS or a timeout while refused)
            return False

    c.wait(created, 15, f"{TOPIC} created again", interval=0.5)
    led = c.wait(lambda: {p for p, b in placed().items() if b == paused.id}, 5,
                 f"a partition of the new {TOPIC} placed on the paused broker {paused.id}")
    assert time.monotonic() - started < 18, "the paused broker may have been declared gone"
    paused.resume()
    c.wait_settled(PARTITIONS)
    final = agreed_epochs(c)
    by_id = {n.id: n for n in c.nodes}

    def served():
        return all(fetch_error(by_id[final[p][0]], p, final[p][1]) == NONE for p in led)

    c.wait(served, 30, f"partitions {sorted(led)} served at the epoch every broker reports")
