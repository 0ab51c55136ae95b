"""A restarted broker gets its partitions back only after --rebalance-hold-ms (cluster mode).

The balancer used to hand a broker that came back its even share within a second of its
first heartbeat. A client that had just lost that broker was then sent straight back to it:
librdkafka 2.0.2 (kcat's) can leave a partition for good on a broker that no longer leads it
when Metadata names A, B and A again while its thread for A still holds the partition, and in
a rolling upgrade of the chart the returning pod's new address may not even answer the client
yet. The CI's rolling-upgrade test once had a partition written by nobody for five minutes
that way. Now the controller holds a (re)started broker out of the evening-out for the hold:
it gets no partition another alive broker leads, and its share once the hold is over.

Three real broker processes sharing a directory; the assignment file is read as it changes.
"""
from __future__ import annotations

import signal
import time
from collections import Counter

from kcluster import FAILOVER_BOUND_S, logs_on_failure, make_cluster  # noqa: F401  (the fixture)
from test_failover_clients import pytestmark  # noqa: F401  (skips when brokers are external)

HOLD_MS = 8_000
PARTITIONS = 12


def leaders(c) -> Counter:
    """Partitions per leader in assignment.json."""
    return Counter(p["leader"] for p in (c.assignment() or {"partitions": []})["partitions"])


def row_health(c, broker: int) -> str | None:
    a = c.assignment() or {"brokers": []}
    return next((b["health"] for b in a["brokers"] if b["id"] == broker), None)


def start_with_topic(c, topic: str) -> None:
    """Creates `topic` once every broker is alive in assignment.json, so that it is placed
    evenly at once rather than after the hold of a broker that registered late."""
    from test_cluster import create_topic

    c.wait_controller()
    c.wait(lambda: all(row_health(c, n.id) == "alive" for n in c.nodes), 60,
           "every broker alive in assignment.json")
    create_topic(c.bootstrap(), topic, PARTITIONS)
    c.wait_settled(PARTITIONS, balanced=True)


@logs_on_failure
def test_a_restarted_broker_is_given_its_share_only_after_the_hold(make_cluster):
    c = make_cluster(3, rebalance_hold_ms=HOLD_MS)
    start_with_topic(c, "held")
    ctl = c.controller()
    victim = next(n for n in c.nodes if n is not ctl)

    victim.kill()
    c.wait_settled(PARTITIONS, timeout=FAILOVER_BOUND_S + 30)
    assert victim.id not in leaders(c)

    victim.start()
    back = c.wait(lambda: row_health(c, victim.id) == "alive", 60,
                  f"broker {victim.id} alive again in assignment.json")
    assert back
    seen_back = time.monotonic()
    # The hold runs from the controller's first status of the new process, which is at or
    # before the row turned alive: watch until shortly before it can end.
    while time.monotonic() < seen_back + HOLD_MS / 1000 - 2:
        led = leaders(c).get(victim.id, 0)
        assert led == 0, (f"broker {victim.id} was given {led} partitions"
                          f" {time.monotonic() - seen_back:.1f}s after it came back,"
                          f" within the {HOLD_MS} ms hold")
        time.sleep(0.1)

    _, led = c.wait_settled(PARTITIONS, balanced=True, timeout=HOLD_MS / 1000 + 30)
    waited = time.monotonic() - seen_back
    print(f"broker {victim.id} led {led[victim.id]} partitions {waited:.1f}s after it came back")
    assert led[victim.id] == PARTITIONS // 3
    assert waited >= HOLD_MS / 1000 - 2


@logs_on_failure
def test_a_settling_broker_takes_over_from_a_draining_one(make_cluster):
    """The hold keeps partitions other brokers lead off a settling broker, not partitions
    that need a new leader: a broker drained while another settles hands its partitions to
    it as to any broker (a rolling upgrade drains the next broker just after the last one
    came back)."""
    c = make_cluster(3, rebalance_hold_ms=60_000)
    start_with_topic(c, "drained")
    ctl = c.controller()
    returning, drained = [n for n in c.nodes if n is not ctl]

    returning.kill()
    c.wait_settled(PARTITIONS, timeout=FAILOVER_BOUND_S + 30)
    returning.start()
    c.wait(lambda: row_health(c, returning.id) == "alive", 60,
           f"broker {returning.id} alive again in assignment.json")
    assert leaders(c).get(returning.id, 0) == 0
    had = leaders(c).get(drained.id, 0)
    assert had > 0

    drained.signal(signal.SIGTERM)
    drained.proc.wait(60)
    _, led = c.wait_settled(PARTITIONS, timeout=60)
    print(f"broker {drained.id} drained {had} partitions; leaders now {led}")
    # Placed on the broker with the fewest of the topic first: the settling one.
    assert led[returning.id] >= had // 2, led
