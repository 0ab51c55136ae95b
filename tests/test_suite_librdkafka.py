"""librdkafka's own test suite (`tests/` of librdkafka 2.12.1, built by tests/suites/librdkafka.py)
against the real kaas binary. `tests/suites/expected-librdkafka.txt` is the ratchet: `PASS`
tests must pass, every other test names the feature that excludes it; PASS lines marked LONG
run only with KAAS_LONG_TESTS=1 (as do the excluded tests, to notice new passes).
The fast run takes about 3.5 minutes, KAAS_LONG_TESTS=1 about 20. The counts
are printed (and appended to $KAAS_THROUGHPUT_FILE's report).

The brokers are librdkafka's test scenarios (its tests/scenarios/*.json) on kaas: `default`
auto-creates topics with 4 partitions, `noautocreate` does not create them at all. Their
group settings are kaas's defaults, which are Kafka's (librdkafka's trivup clusters change
none of them)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "suites"))

import franz_go  # noqa: E402
import librdkafka  # noqa: E402
from conftest import Broker, broker_kind, report  # noqa: E402

LONG = os.environ.get("KAAS_LONG_TESTS", "") not in ("", "0")
# One test-runner process per test number gets this long (a LONG one 900 s: 0113@full takes
# about 520); the runner's own per-test timeouts (30 s and up, x2.7) end most failures sooner.
CAP_S = 300


class ScenarioBroker(Broker):
    """conftest's kaas broker with a scenario's topic auto-creation settings (clap refuses a
    flag given twice, so they replace conftest's values instead of being appended)."""

    def __init__(self, workdir: Path, auto_create: bool, partitions: int = 4):
        super().__init__(workdir)
        self.auto_create, self.partitions = auto_create, partitions

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--num-partitions") + 1] = str(self.partitions)
        cmd[cmd.index("--auto-create-topics") + 1] = "true" if self.auto_create else "false"
        return cmd


@pytest.fixture(scope="module")
def brokers(tmp_path_factory):
    if broker_kind() != "kaas":
        pytest.skip("the ratchet describes kaas (and the scenarios need kaas flags)")
    started = []
    try:
        for auto in (True, False):
            b = ScenarioBroker(tmp_path_factory.mktemp("broker"), auto_create=auto)
            started.append(b)
            b.start()
        yield started
    finally:
        for b in started:
            b.close()


MODE_TITLES = {"local": "local (no broker)", "quick": "quick mode",
               "consumer": "quick mode, group.protocol=consumer", "full": "full mode"}


# The fast part (~3.5 min) runs in the default test command; KAAS_LONG_TESTS=1 adds the LONG
# and excluded tests (~16 min). scripts/install-test-deps.sh builds the suite; otherwise the
# first run here does.
@pytest.mark.suite
@pytest.mark.timeout(5400)
def test_librdkafka_suite(brokers, tmp_path):
    """librdkafka's tests in every mode (quick over all, KIP-848 groups, groups and idempotence
    in full mode; tests/suites/librdkafka.py), each test number alone with a 300 s cap, 5 at a
    time: every test on the PASS list passes."""
    auto, noauto = brokers
    librdkafka.test_runner()  # built by scripts/install-test-deps.sh; else here, once
    names = librdkafka.all_tests()
    passing, excluded = franz_go.load_expected(librdkafka.NAME)
    long_ = librdkafka.load_long()
    # The fast run leaves out what is excluded or LONG. A test number (or split sub-test) runs
    # as a whole, so an excluded entry that shares one with a wanted entry runs too.
    only = None if LONG else {n for n in names if n in passing and n not in long_}
    run = librdkafka.run_suite(librdkafka.Brokers(auto.bootstrap, noauto.bootstrap), only=only,
                               cap_s=CAP_S, log_dir=tmp_path, work=tmp_path / "work")
    report(f"librdkafka {librdkafka.VERSION} tests (TEST_KAFKA_VERSION={librdkafka.KAFKA_VERSION}"
           f", {'all' if LONG else 'fast run'}): {run.summary()} of {len(run.results)} run;"
           f" {len(excluded)} of {len(names)} excluded, {len(long_)} LONG")
    for mode in librdkafka.MODES:
        part = franz_go.SuiteRun({t: o for t, o in run.results.items() if names[t][1] is mode})
        if part.results:
            report(f"  {MODE_TITLES[mode.key]}: {part.summary()}")
    slow = sorted(run.seconds.items(), key=lambda kv: -kv[1])[:5]
    report("  slowest: " + ", ".join(f"{t} {s:.0f}s" for t, s in slow))
    fresh = franz_go.new_passes(run, librdkafka.NAME)
    if fresh:
        report(f"  newly passing (add to the PASS list): {' '.join(fresh)}")
    problems = franz_go.check_ratchet(run, librdkafka.NAME)
    excused = librdkafka.excused_invalid_topic_race(run)
    for t, why in excused.items():
        report(f"  excused: {t} {run.results[t]} ({why})")
    problems = [p for p in problems if not any(p.startswith(t + ":") for t in excused)]
    assert not problems, (f"broker logs: {auto.log_path} {noauto.log_path}; runner output in"
                          f" {tmp_path}\n\n" + "\n\n".join(problems))


# Tests whose assertions assume one broker, excused against a cluster (reported, not hidden).
# 0081's CreateTopics and CreatePartitions cases ask for as many replicas as Metadata lists
# brokers (3 here, 1 on a single node), and kaas keeps one copy: INVALID_REPLICATION_FACTOR
# with the reason, the named unsupported feature "replication factor above 1".
_RF = "asks for replication factor 3 (one per broker); kaas keeps one copy on the shared volume"
CLUSTER_ONLY_EXCUSED: dict[str, str] = {
    f"0081_admin/{case}{mode}": _RF
    for case in ("do_test_CreateTopics", "do_test_CreatePartitions")
    for mode in ("", "@consumer", "@full")
}


@pytest.mark.suite
@pytest.mark.long
@pytest.mark.skipif(not LONG, reason="the suites against a cluster: set KAAS_LONG_TESTS=1")
@pytest.mark.timeout(5400)
def test_librdkafka_suite_cluster(tmp_path):
    """The fast run's tests against two 3-broker clusters in cluster mode (file Lease, one
    shared data directory each), one auto-creating topics with 4 partitions and one not, as
    the single-node run's two brokers: the clients follow Metadata, coordinators and leaders
    across the brokers. The same PASS list must pass."""
    if broker_kind() != "kaas":
        pytest.skip("cluster mode starts its own kaas brokers")
    from kcluster import Cluster
    librdkafka.test_runner()
    names = librdkafka.all_tests()
    passing, _ = franz_go.load_expected(librdkafka.NAME)
    long_ = librdkafka.load_long()
    only = {n for n in names if n in passing and n not in long_}
    auto = Cluster(tmp_path / "auto", 3, auto_create=4)
    noauto = Cluster(tmp_path / "noauto", 3)
    try:
        auto.start()
        noauto.start()
        run = librdkafka.run_suite(librdkafka.Brokers(auto.bootstrap(), noauto.bootstrap()),
                                   only=only, cap_s=CAP_S, log_dir=tmp_path,
                                   work=tmp_path / "work")
        report(f"librdkafka {librdkafka.VERSION} tests (3-broker clusters, fast run):"
               f" {run.summary()} of {len(run.results)} run")
        for mode in librdkafka.MODES:
            part = franz_go.SuiteRun({t: o for t, o in run.results.items() if names[t][1] is mode})
            if part.results:
                report(f"  {MODE_TITLES[mode.key]}: {part.summary()}")
        excused = [t for t in CLUSTER_ONLY_EXCUSED if run.results.get(t) not in (None, "pass")]
        for t in excused:
            report(f"  excused on a cluster: {t} {run.results[t]} ({CLUSTER_ONLY_EXCUSED[t]})")
        raced = librdkafka.excused_invalid_topic_race(run)
        for t, why in raced.items():
            report(f"  excused: {t} {run.results[t]} ({why})")
        problems = [p for p in franz_go.check_ratchet(run, librdkafka.NAME)
                    if not any(p.startswith(t + ":") for t in [*CLUSTER_ONLY_EXCUSED, *raced])]
        assert not problems, (f"cluster logs under {tmp_path}\n\n" + "\n\n".join(problems))
    finally:
        auto.close()
        noauto.close()
