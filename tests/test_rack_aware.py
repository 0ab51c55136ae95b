"""Rack-aware consumer assignment end to end (issue 17, seed 004): three brokers in cluster mode
with `--rack rack-a/rack-b/rack-c`, a 24-partition topic the balancer spreads 8/8/8, and
KIP-848 librdkafka consumers with `client.rack` and `group.remote.assignor=rack-aware`.

What a user checks: the share of partitions owned by a consumer in the rack of the partition's
leader (reading without crossing racks). Before, the group never saw the leaders' racks, so
`rack-aware` gave the same 25-46% as `uniform`.
"""

from __future__ import annotations

import time
from collections import Counter

from kcheck import create_topic
from kcluster import logs_on_failure, make_cluster  # noqa: F401  (the fixture)

RACKS = ["rack-a", "rack-b", "rack-c"]
PARTITIONS = 24
TOPIC = "racked"
# id(consumer) -> (its group, bootstrap), for the failure diagnostics
GROUP_OF: dict[int, tuple[str, str]] = {}


def leader_racks(c) -> dict[int, str]:
    a = c.assignment()
    rack_of = {n.id: RACKS[n.id] for n in c.nodes}
    return {p["partition"]: rack_of[p["leader"]] for p in a["partitions"] if p["topic"] == TOPIC}


def consumer(bootstrap: str, group: str, rack: str, classic: str | None = None):
    """A KIP-848 member asking for `rack-aware`, or (classic=strategy) a classic member."""
    from confluent_kafka import Consumer
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "client.rack": rack,
            "auto.offset.reset": "earliest", "enable.auto.commit": False}
    if classic:
        conf.update({"group.protocol": "classic", "partition.assignment.strategy": classic,
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    else:
        conf.update({"group.protocol": "consumer", "group.remote.assignor": "rack-aware"})
    c = Consumer(conf)
    c.subscribe([TOPIC])
    GROUP_OF[id(c)] = (group, bootstrap)
    return (rack, c)


def consumers(bootstrap: str, group: str, layout: list[str], classic: str | None = None):
    return [consumer(bootstrap, group, rack, classic) for rack in layout]


class Reads:
    """What a group's members read: each value and how many times; every read is committed."""

    def __init__(self):
        self.count: Counter = Counter()

    def poll(self, cs):
        for _, c in cs:
            m = c.poll(0.05)
            if m is not None and not m.error():
                self.count[m.value()] += 1
                try:
                    c.commit(message=m, asynchronous=False)
                except Exception:  # noqa: BLE001 - a commit lost to a revocation: read again
                    pass


def owners(cs) -> dict[int, str]:
    """partition -> rack of the consumer that owns it."""
    out = {}
    for rack, c in cs:
        for tp in c.assignment():
            out[tp.partition] = rack
    return out


def settle(cs, want, timeout: float, what: str, reads: Reads | None = None,
           partitions: int = PARTITIONS, leaders=None):
    """Polls every consumer until `want(owners)` has held for 3 s; returns the owners. On a
    time-out the message names the owners and, given `leaders` (a callable), the leader racks
    they were judged against."""
    deadline = time.monotonic() + timeout
    since, last = None, None
    reads = reads or Reads()
    while time.monotonic() < deadline:
        reads.poll(cs)
        now = owners(cs)
        if len(now) == partitions and want(now):
            if now != last:
                since, last = time.monotonic(), now
            elif time.monotonic() - since >= 3:
                return now
        else:
            since, last = None, None
    judged = f"; leader racks {leaders()}" if leaders else ""
    raise AssertionError(f"{what}: owners {owners(cs)}{judged}; {group_view(cs)}")


def group_view(cs) -> str:
    """What the coordinator says of the group: each member's assignment and target (a target
    that differs from what members own is a reconciliation in progress; one that equals it
    while locality is low is a target that did not follow the leaders)."""
    try:
        from confluent_kafka.admin import AdminClient
        group, bootstrap = GROUP_OF[id(cs[0][1])]
        a = AdminClient({"bootstrap.servers": bootstrap})
        (d,) = a.describe_consumer_groups([group]).values()
        d = d.result(10)
        def parts(x):
            return sorted(tp.partition for tp in (x.topic_partitions if x else []))
        return f"group {group} coordinator {d.coordinator.id} state {d.state} members " + ", ".join(
            f"{m.client_id}:{m.host} owns {parts(m.assignment)} target {parts(m.target_assignment)}"
            for m in d.members)
    except Exception as e:  # noqa: BLE001 - a diagnostic must not hide the failure
        return f"(could not describe the group: {e!r})"


def local_share(own: dict[int, str], leaders: dict[int, str]) -> float:
    return sum(own[p] == leaders[p] for p in own) / PARTITIONS


class Producer:
    """acks=all, idempotent, 100 records/s into the topic from a thread, for the whole test."""

    def __init__(self, bootstrap: str):
        import threading
        from confluent_kafka import Producer as P
        self.p = P({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                    "message.timeout.ms": 120000})
        self.acked: set[bytes] = set()
        self.errors: list = []
        self.stop_flag = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def cb(self, err, m):
        (self.errors.append(err) if err else self.acked.add(m.value()))

    def run(self):
        i = 0
        while not self.stop_flag:
            self.p.produce(TOPIC, key=b"k%d" % i, value=b"rack-%d" % i, on_delivery=self.cb)
            self.p.poll(0)
            i += 1
            time.sleep(0.01)
        self.p.flush(120)

    def stop(self):
        self.stop_flag = True
        self.t.join(180)
        assert not self.errors, self.errors[:5]


@logs_on_failure
def test_rack_aware_keeps_consumers_in_their_rack(make_cluster):
    """2/2/2 consumers over racks a/b/c: every partition is owned in its leader's rack (100%,
    was 25-46%), each consumer gets 4; after a member leaves and another joins in its rack,
    100% again. When a broker dies its partitions' leaders move to other racks and the target
    follows them; when it comes back and the balancer returns its partitions, 100% again. A
    producer runs throughout and every acknowledged record is read (a record read twice is
    counted and reported: a commit lost to a revocation is read again, as in Kafka). A 4/1/1
    layout keeps the loads within one partition (4 each) and then takes as much locality as
    that allows (16 of 24, 67%). librdkafka's classic assignors on the same cluster, for
    comparison, are printed."""
    c = make_cluster(3, racks=RACKS, extra_args=["--group-consumer-heartbeat-interval-ms", "500"])
    create_topic(c.bootstrap(), TOPIC, PARTITIONS)
    c.wait_settled(PARTITIONS, balanced=True)
    leaders = leader_racks(c)
    assert Counter(leaders.values()) == {r: 8 for r in RACKS}, leaders
    full = lambda o: local_share(o, leader_racks(c)) == 1.0  # noqa: E731
    shares = {}

    producer = Producer(c.bootstrap())
    reads = Reads()
    cs = consumers(c.bootstrap(), "rack-balanced", ["rack-a", "rack-a", "rack-b", "rack-b",
                                                     "rack-c", "rack-c"])
    try:
        own = settle(cs, full, 90, "every partition owned in its leader's rack", reads,
                     leaders=lambda: leader_racks(c))
        assert Counter(len(k.assignment()) for _, k in cs) == {4: 6}
        shares["2/2/2"] = local_share(own, leaders)

        # A member leaves; another joins in its rack.
        gone = cs.pop(2)
        gone[1].close()
        settle(cs, lambda o: True, 60, "the rest take over", reads)
        cs.append(consumer(c.bootstrap(), "rack-balanced", "rack-b"))
        own = settle(cs, full, 90, "locality back after a member left and one rejoined", reads,
                     leaders=lambda: leader_racks(c))
        shares["after leave and rejoin"] = local_share(own, leader_racks(c))

        # A broker dies: its partitions get leaders in the other two racks.
        victim = c.nodes[2]
        # The balancer may move leaders more than once (first off the dead broker, then to even
        # the two survivors out), so locality is judged against the leaders of the moment, as
        # `full` does: a snapshot taken after the first move made this fail in CI although the
        # group had followed the second (seen 2026-12-02).
        victim.kill()
        c.wait_settled(PARTITIONS, balanced=True)
        assert "rack-c" not in leader_racks(c).values(), leader_racks(c)
        own = settle(cs, lambda o: local_share(o, leader_racks(c)) >= 16 / PARTITIONS, 90,
                     "the target follows the moved leaders", reads, leaders=lambda: leader_racks(c))
        shares["rack-c's broker down"] = local_share(own, leader_racks(c))
        victim.start()
        c.wait_settled(PARTITIONS, balanced=True, timeout=120)
        own = settle(cs, full, 90, "locality back once rack-c's partitions returned", reads,
                     leaders=lambda: leader_racks(c))
        shares["rack-c's broker back"] = local_share(own, leader_racks(c))

        producer.stop()
        deadline = time.monotonic() + 60
        while not producer.acked <= set(reads.count) and time.monotonic() < deadline:
            reads.poll(cs)
        missing = producer.acked - set(reads.count)
        assert not missing, f"{len(missing)} acknowledged records never read, e.g. {sorted(missing)[:3]}"
        twice = sum(1 for v in reads.count.values() if v > 1)
        print(f"{len(producer.acked)} records acknowledged, all read; {twice} read twice")
    finally:
        producer.stop_flag = True
        for _, k in cs:
            k.close()

    cs = consumers(c.bootstrap(), "rack-skewed", ["rack-a"] * 4 + ["rack-b", "rack-c"])
    try:
        own = settle(cs, lambda o: Counter(len(k.assignment()) for _, k in cs) == {4: 6}, 90,
                     "balanced loads on a 4/1/1 layout")
        shares["4/1/1"] = local_share(own, leader_racks(c))
        assert shares["4/1/1"] >= 16 / PARTITIONS, shares
    finally:
        for _, k in cs:
            k.close()

    for strategy in ("range", "cooperative-sticky"):
        for layout, name in (([r for r in RACKS for _ in range(2)], "2/2/2"),
                             (["rack-a"] * 4 + ["rack-b", "rack-c"], "4/1/1")):
            cs = consumers(c.bootstrap(), f"classic-{strategy}-{name}", layout, classic=strategy)
            try:
                own = settle(cs, lambda o: True, 90, f"classic {strategy} {name}")
                shares[f"classic {strategy} {name}"] = local_share(own, leader_racks(c))
            finally:
                for _, k in cs:
                    k.close()
    print("rack-local shares: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))


def test_single_node_reports_its_rack_and_keeps_the_local_member_busy(broker_factory):
    """On a single node `--rack` is what Metadata and DescribeCluster report, and every partition
    is read from that rack: with one rack-aware member in it and one elsewhere, loads stay
    balanced (3 and 3 of 6). Before, a single node ignored `--rack`."""
    from confluent_kafka.admin import AdminClient
    b = broker_factory(extra_args=["--rack", "rack-a"])
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    nodes = a.describe_cluster().result(15).nodes
    assert [(n.id, n.rack) for n in nodes] == [(0, "rack-a")]
    create_topic(b.bootstrap, TOPIC, 6)
    cs = consumers(b.bootstrap, "single-rack", ["rack-a", "rack-b"])
    try:
        # Wait until the second member got its share: the first one to join owns all six until
        # then, which is a moment of the rebalance, not its outcome.
        own = settle(cs, lambda o: len(set(o.values())) == 2, 60, "both members assigned", partitions=6)
        assert Counter(own.values()) == {"rack-a": 3, "rack-b": 3}, own
    finally:
        for _, k in cs:
            k.close()
