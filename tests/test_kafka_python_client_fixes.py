"""The fixes the kafka-python suite applies to its client (suites/kafka_python_client_fixes.py)
do what they claim, on a real kaas broker.

These are races in kafka-python 3.0.12, not in kaas; the suite runs with them closed so that a
stalled client is not reported as a broker failure. This test keeps the claim honest: the
scenario below stalls the released client every time (0 of 5 against kaas, 0 of 3 against
Apache Kafka 4.4, when the fix was written) and must not stall the fixed one.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from kafka import KafkaConsumer
from kafka.coordinator.base import MemberState

from conftest import poll
from kcheck import create_topic, unique_topic

sys.path.insert(0, str(Path(__file__).resolve().parent / "suites"))
import kafka_python_client_fixes  # noqa: E402

STABLE_WITHIN_S = 15


def test_a_consumer_polling_with_a_short_timeout_finishes_the_rebalance_its_topic_starts(broker_factory):
    # The group leader subscribes before its topic exists and polls with timeout_ms=1, so every
    # poll gives up mid-rebalance. When the topic appears, its metadata change starts a
    # rebalance; the released client's next poll after the leader's assignment forgets the
    # SyncGroup still in flight and the member stays REBALANCING with no partitions.
    b = broker_factory(extra_args=["--auto-create-topics", "false"])
    topic = unique_topic("short-poll-rebalance")
    with kafka_python_client_fixes.patched():
        consumer = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id=unique_topic("g"),
                                 metadata_max_age_ms=300)
        stop = threading.Event()

        def poll_briefly():
            while not stop.is_set():
                consumer.poll(timeout_ms=1)

        poller = threading.Thread(target=poll_briefly, daemon=True)
        try:
            consumer.subscribe([topic])
            poller.start()
            time.sleep(1.0)  # the member joins with nothing to consume
            create_topic(b.bootstrap, topic, 4)
            poll(lambda: consumer.group_metadata().state == MemberState.STABLE
                 and len(consumer.assignment()) == 4, STABLE_WITHIN_S,
                 "the consumer to finish the rebalance its new topic started", 0.2,
                 lambda: f"state {consumer.group_metadata().state},"
                         f" assigned {sorted(consumer.assignment())}")
        finally:
            stop.set()
            if poller.is_alive():
                poller.join(timeout=10)
            consumer.close()
