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

from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import MetadataRequest

from kcheck import create_topic
from kcluster import logs_on_failure, make_cluster  # noqa: F401  (the fixture)
from kwire import send as call

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
