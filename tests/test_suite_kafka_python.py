"""kafka-python's own integration suite (`test/integration` of its 3.0.12 sdist) against the real
kaas binary (tests/suites/kafka_python.py). `tests/suites/expected-kafka-python.txt` is the
ratchet: `PASS` tests must pass, every other test names the feature that excludes it. The counts
are printed (and appended to $KAAS_THROUGHPUT_FILE's report)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "suites"))

import kafka_python  # noqa: E402
from conftest import make_broker, report, temporary_env  # noqa: E402

# The group settings of kafka-python's own test brokers (its servers/resources/*/
# kafka.properties): test_group asks for session_timeout_ms=3000, below Kafka's default
# group.min.session.timeout.ms of 6000, which kaas shares. Read by kaas at start
# (groups/src/config.rs); KAFKA_EXTRA_PROPS is the same for Apache Kafka
# (KAAS_TEST_APACHE_KAFKA=1, scripts/run-apache-kafka.sh).
SUITE_BROKER_ENV = {
    "KAAS_GROUP_MIN_SESSION_TIMEOUT_MS": "1000",
    "KAAS_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    "KAFKA_EXTRA_PROPS": "\n".join([
        os.environ.get("KAFKA_EXTRA_PROPS", ""),
        "group.min.session.timeout.ms=1000",
        "group.initial.rebalance.delay.ms=0",
    ]).strip(),
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """tests/conftest.py's broker, started with SUITE_BROKER_ENV."""
    with temporary_env(SUITE_BROKER_ENV):
        b = make_broker(tmp_path_factory.mktemp("broker"))
    try:
        yield b
    finally:
        b.close()


@pytest.mark.suite
@pytest.mark.timeout(2700)
def test_kafka_python_integration_suite(broker, tmp_path):
    """kafka-python's integration tests, in one pytest run with a 120 s cap per test, against a
    single broker: every test on the PASS list passes."""
    if broker.kind != "kaas":
        pytest.skip("the ratchet describes kaas")
    everything = kafka_python.list_tests()
    _, excluded = kafka_python.load_expected("kafka-python")
    # Unlike franz-go's, the excluded tests run too: each fails or skips within a second (an
    # API kaas does not advertise, a SASL/SSL broker the suite cannot start), and running them
    # is what notices a new pass.
    run = kafka_python.run_suite(broker.bootstrap, log_dir=tmp_path)
    report(f"kafka-python {kafka_python.VERSION} integration (single node,"
           f" KAFKA_VERSION={kafka_python.KAFKA_VERSION}): {run.summary()};"
           f" {len(excluded)} of {len(everything)} excluded")
    slow = sorted(run.seconds.items(), key=lambda kv: -kv[1])[:5]
    report("  slowest: " + ", ".join(f"{t} {s:.0f}s" for t, s in slow))
    fresh = kafka_python.new_passes(run, "kafka-python")
    if fresh:
        report(f"  newly passing (add to the PASS list): {' '.join(fresh)}")
    problems = kafka_python.check_ratchet(run, "kafka-python")
    # a test the ratchet lists that the suite no longer has
    passing, _ = kafka_python.load_expected("kafka-python")
    problems += [f"{t}: listed as PASS in expected-kafka-python.txt but not in the suite"
                 for t in sorted(passing - set(everything))]
    assert not problems, "\n\n".join(problems) + f"\n\n(logs in {tmp_path})"


# Tests whose assertions assume one broker, excused against a cluster (reported, not hidden):
# test_delete_records expects a single poll(timeout_ms=2000) to return the records of six
# partitions, which on a cluster are led by three brokers fetched from independently (it passed
# in one local cluster run and failed in the next with 180 of 380 records in that one poll).
CLUSTER_ONLY_EXCUSED = {
    "test_admin_integration.py::test_delete_records": "assumes one poll gathers records from every broker",
    # It reassigns a partition to every broker ("single-broker cluster: only valid target is
    # [broker]"): three replicas, which kaas refuses with INVALID_REPLICA_ASSIGNMENT (one copy
    # on the shared volume; tests/test_reassign.py covers reassignment on a cluster).
    "test_admin_integration.py::test_alter_partition_reassignments":
        "assumes a single broker: names every broker as a replica",
}


@pytest.mark.suite
@pytest.mark.timeout(2700)
def test_kafka_python_integration_suite_cluster(tmp_path):
    """The same suite against three kaas brokers in cluster mode (file Lease, one shared data
    directory), bootstrapped through one of them: the clients follow Metadata, group
    coordinators and partition leaders to the others. The same PASS list must pass."""
    if os.environ.get("KAAS_TEST_BOOTSTRAP") or os.environ.get("KAAS_TEST_APACHE_KAFKA", "") not in ("", "0"):
        pytest.skip("cluster mode starts its own kaas brokers")
    from kcluster import Cluster
    env = {k: v for k, v in SUITE_BROKER_ENV.items() if k.startswith("KAAS_")}
    c = Cluster(tmp_path / "cluster", 3, auto_create=1, env=env)
    try:
        c.start()
        run = kafka_python.run_suite(c.nodes[0].bootstrap, log_dir=tmp_path)
        report(f"kafka-python {kafka_python.VERSION} integration (3-broker cluster): {run.summary()}")
        fresh = kafka_python.new_passes(run, "kafka-python")
        if fresh:
            report(f"  newly passing (add to the PASS list): {' '.join(fresh)}")
        excused = [t for t in CLUSTER_ONLY_EXCUSED if run.results.get(t) not in (None, "pass")]
        for t in excused:
            report(f"  excused on a cluster: {t} {run.results[t]} ({CLUSTER_ONLY_EXCUSED[t]})")
        problems = [p for p in kafka_python.check_ratchet(run, "kafka-python")
                    if not any(p.startswith(t + ":") for t in CLUSTER_ONLY_EXCUSED)]
        assert not problems, "\n\n".join(problems) + f"\n\n(logs in {tmp_path})"
    finally:
        c.close()
