"""One member of a consumer group, as its own process so a test can SIGKILL it: it subscribes
to a topic with librdkafka's defaults (auto commit every 5 s, auto.offset.reset=latest) except
that an offset is stored for commit only after the record was written to this member's output
file. That makes the group at-least-once by construction: an offset the group commits was
processed by some member, so a record that no member ever wrote was skipped by the brokers'
group coordination (a lost or misplaced commit, a wrong position after a rebalance), not by
the consumer.

    python3 group_member.py BOOTSTRAP GROUP TOPIC OUT_FILE [group.protocol]

Each output line is `partition offset value`, flushed to the kernel before the offset is
stored, so a SIGKILL loses no processed line. Stops on SIGTERM (closing the consumer, which
commits and leaves the group). KAAS_MEMBER_DEBUG=cgrp,fetch turns on librdkafka's debug log
(to the member's stderr) to see what a failing run's member was told."""
from __future__ import annotations

import os
import signal
import sys

from confluent_kafka import Consumer, KafkaException


def main() -> int:
    bootstrap, group, topic, out_path = sys.argv[1:5]
    protocol = sys.argv[5] if len(sys.argv) > 5 else "classic"
    conf = {
        "bootstrap.servers": bootstrap, "group.id": group,
        "enable.auto.offset.store": False,
        "topic.metadata.refresh.interval.ms": 2000, "log.connection.close": False,
    }
    if os.environ.get("KAAS_MEMBER_DEBUG"):
        # librdkafka's own log (to stderr, the member's .err file) for a failure's story.
        conf["debug"] = os.environ["KAAS_MEMBER_DEBUG"]
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"
    else:
        # The classic protocol's session timeout bounds how long a killed member's partitions
        # wait; Kafka's minimum (group.min.session.timeout.ms) is 6 s.
        conf["session.timeout.ms"] = 6000
        conf["heartbeat.interval.ms"] = 1000
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    c = Consumer(conf)
    c.subscribe([topic])
    with open(out_path, "a", buffering=1 << 16) as out:
        while not stop:
            msgs = c.consume(500, 0.2)
            good = [m for m in msgs if not m.error()]
            for m in msgs:
                if m.error():
                    print(f"consumer error: {m.error()}", file=sys.stderr, flush=True)
            if not good:
                continue
            out.write("".join(f"{m.partition()} {m.offset()} {m.value().decode()}\n" for m in good))
            out.flush()
            for m in good:
                try:
                    c.store_offsets(m)
                except KafkaException as e:  # revoked meanwhile: its new owner reads it again
                    print(f"store_offsets: {e}", file=sys.stderr, flush=True)
    c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
