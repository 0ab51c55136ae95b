"""Two races in kafka-python 3.0.12 itself, closed so that its suite tests the broker.

Both make a client stall whatever the broker answers (each fix's comment says how it shows;
the second was reproduced against Apache Kafka 4.4 as well as kaas). They are applied to the
copy of kafka-python under test in two places:

* its own integration suite: `kafka_python_conftest.py` calls `apply()` unless
  KAAS_KAFKA_PYTHON_RAW_CLIENT=1 (tests/suites/kafka_python.py copies this file next to it);
* the project's test of the second fix (tests/test_kafka_python_client_fixes.py), inside
  `patched()`, so the rest of the project's tests keep the client as released.

This module touches nothing on import.
"""

from __future__ import annotations

import contextlib
import logging

log = logging.getLogger("kaas.suite")


def _metadata_update_kept(upstream):
    # ClusterMetadata.update_metadata (kafka/cluster.py) ends with `_need_update =
    # len(_retry_topics) > 0`. A consumer subscribes (in its constructor, or subscribe() right
    # after) while its bootstrap MetadataRequest(topics=[]) is in flight; when that
    # request_update() lands between the response's arrival and update_metadata, the update for
    # the new topic is dropped: the next refresh is metadata_max_age_ms (300 s) away, the
    # consumer never learns the topic's partitions and the test sees no records
    # (test_end_to_end, test_idempotent_producer_max_in_flight, ... — any consumer; one or more
    # in 7 of 17 suite runs against kaas on a 2-core machine). The log shows "Subscribed to
    # topic(s)" (or "Updating subscribed topics") between "Metadata refresh: success" and
    # "Updated metadata: ... topics: 0". An earlier kafka-python ClusterMetadata (the
    # kafka.conn-based one) kept the flag set unless the response covered every tracked topic;
    # this does the same (one more Metadata request, retry_backoff_ms later).
    def update_metadata(self, metadata):
        answered = {t.name for t in getattr(metadata, "topics", None) or ()}
        result = upstream(self, metadata)
        if not self.need_all_topic_metadata and not self._topics.issubset(answered):
            with self._lock:
                if not self._need_update:
                    log.info("kafka-python race: metadata response lacks subscribed %s;"
                             " refreshing again", sorted(self._topics - answered))
                self._need_update = True
        return result

    return update_metadata


def _join_in_flight_awaited(upstream):
    # BaseCoordinator.join_group_async (kafka/coordinator/base.py) loops `while
    # self.need_rejoin()`. When poll()'s timeout expires during a rebalance it returns and
    # leaves the JoinGroup/SyncGroup task in flight, for the next poll to await. But a rebalance
    # the consumer starts because its metadata changed (a subscribed topic appears or grows) is
    # not recorded in `rejoin_needed`: ConsumerCoordinator.need_rejoin() computes it from
    # `_assignment_snapshot != _metadata_snapshot`, and the group leader's assignment, made
    # inside that task, makes the two equal again. If the timeout falls after the assignment and
    # before the SyncGroup response, the next poll sees need_rejoin() false — in
    # ConsumerCoordinator.poll, which then never calls ensure_active_group, or in
    # join_group_async's loop — and nobody awaits the task: the member stays REBALANCING with no
    # partitions and its heartbeat disabled, for good. kafka-python's own ConsumerGroupRunner
    # polls with timeout_ms=200; test_describe_group_exists stalled this way in a CI run on a
    # 3-broker kaas cluster (the leader's SyncGroup answered in 13 ms, at the 200 ms boundary).
    # A consumer polling with timeout_ms=1 that subscribes before its topic exists stalls every
    # time, on kaas and on Kafka 4.4 alike (0 of 5 and 0 of 3 became stable). The fix: a join
    # task nobody has consumed means the member still has to (re)join, so need_rejoin() says so
    # and the next poll awaits the task (or, when it already finished unseen, joins again: one
    # more rebalance instead of a stalled member). A first version set `rejoin_needed` when
    # join_group_async found a task in flight; ConsumerCoordinator.poll does not call it when
    # need_rejoin() is false, and the test of this fix still stalled in 1 of 8 runs under CPU load.
    def need_rejoin(self):
        return upstream(self) or self._join_task is not None

    return need_rejoin


def _targets():
    from kafka.cluster import ClusterMetadata
    from kafka.coordinator.base import BaseCoordinator

    return [(ClusterMetadata, "update_metadata", _metadata_update_kept),
            (BaseCoordinator, "need_rejoin", _join_in_flight_awaited)]


def apply() -> None:
    """Close both races in the imported kafka-python for the rest of the process."""
    for cls, name, fix in _targets():
        setattr(cls, name, fix(getattr(cls, name)))


@contextlib.contextmanager
def patched():
    """Close both races while the block runs, then put the released client back."""
    saved = [(cls, name, cls.__dict__[name]) for cls, name, _ in _targets()]
    apply()
    try:
        yield
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)
