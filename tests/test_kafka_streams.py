"""Kafka Streams 4.4 against kaas (tests/java/StreamsCheck.java): the word count a user writes
first. Streams leans on parts of the broker the plain clients do not: it creates its internal
topics itself (a repartition topic and a compacted changelog, with the configs it chooses),
runs a classic group with its own assignor, commits every 500 ms here, and purges what it has
consumed of the repartition topic with DeleteRecords."""

from __future__ import annotations

import subprocess

import pytest

from conftest import broker_kind
from kcheck import admin, create_topic, rdkafka_consumer, unique_topic

LINES = 20000
PARTITIONS = 4


def word_count(java_classes, bootstrap: str, app: str, guarantee: str, state_dir) -> dict:
    cmd = ["java", "-Xmx512m", "-cp", java_classes, "StreamsCheck", "wordcount", bootstrap, app,
           str(LINES), guarantee, str(state_dir)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"StreamsCheck exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    out: dict = {"counts": {}, "log": r.stderr[-4000:]}
    for line in r.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "count":
            word, n = rest.split()
            out["counts"][word] = int(n)
        elif kind in ("state", "error", "seconds"):
            out[kind] = rest
    return out


def expected_counts() -> dict[str, int]:
    want: dict[str, int] = {}
    for i in range(LINES):
        for w in (f"w{i % 50}", f"x{i % 7}", "all"):
            want[w] = want.get(w, 0) + 1
    return want


def test_word_count_at_least_once(broker, java_classes, tmp_path):
    """Every word is counted exactly as often as the input holds it, the application stays
    RUNNING, its changelog topic is compacted as Streams asked, and its repartition topic has
    been purged behind the application's commits (DeleteRecords moved the log start)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import ConfigResource
    app = unique_topic("wc")
    create_topic(broker.bootstrap, f"{app}-in", PARTITIONS)
    create_topic(broker.bootstrap, f"{app}-out", PARTITIONS)
    run = word_count(java_classes, broker.bootstrap, app, "at_least_once", tmp_path / "state")
    assert "error" not in run, f"a stream thread died: {run['error']}\n{run['log']}"
    assert run.get("state") == "RUNNING", run
    want = expected_counts()
    wrong = {w: (run["counts"].get(w), n) for w, n in want.items() if run["counts"].get(w) != n}
    assert not wrong, f"(counted, in the input) for {len(wrong)} words: {dict(list(wrong.items())[:8])}"

    changelog, repartition = f"{app}-counts-changelog", f"{app}-counts-repartition"
    a = admin(broker.bootstrap)
    topics = a.list_topics(timeout=10).topics
    assert len(topics[repartition].partitions) == PARTITIONS, "Streams sizes it as its input"
    res = ConfigResource(ConfigResource.Type.TOPIC, changelog)
    configs = list(a.describe_configs([res]).values())[0].result(timeout=15)
    assert configs["cleanup.policy"].value == "compact", configs["cleanup.policy"]

    c = rdkafka_consumer(broker.bootstrap)
    try:
        starts = [c.get_watermark_offsets(TopicPartition(repartition, p), timeout=10)[0]
                  for p in range(PARTITIONS)]
    finally:
        c.close()
    assert any(s > 0 for s in starts), f"repartition topic's log starts {starts}: never purged"


@pytest.mark.skipif(broker_kind() != "kaas", reason="Apache Kafka serves transactions")
def test_exactly_once_stops_the_application_with_a_reason(broker, java_classes, tmp_path):
    """exactly_once_v2 needs transactions, which kaas does not serve: the application stops
    with the transactional producer's fatal error instead of retrying forever."""
    app = unique_topic("wceos")
    create_topic(broker.bootstrap, f"{app}-in", PARTITIONS)
    create_topic(broker.bootstrap, f"{app}-out", PARTITIONS)
    run = word_count(java_classes, broker.bootstrap, app, "exactly_once_v2", tmp_path / "state")
    assert run.get("error", "").startswith("TransactionalIdAuthorizationException"), run
    assert run.get("state") in ("PENDING_ERROR", "ERROR"), run
    assert float(run["seconds"]) < 60, run
    assert not run["counts"], "nothing is written without a transaction"
