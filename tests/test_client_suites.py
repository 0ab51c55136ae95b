"""The client projects' own test suites against the real kaas binary (issue 12, item 7):
franz-go's `pkg/kgo` integration tests. Each suite keeps a ratchet of tests that must pass
(`tests/suites/expected-*.txt`); every other test names the unsupported feature that excludes
it. The suites' counts are printed (and appended to $KAAS_THROUGHPUT_FILE's report)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "suites"))

import franz_go  # noqa: E402
from conftest import report  # noqa: E402

LONG = os.environ.get("KAAS_LONG_TESTS", "") not in ("", "0")


@pytest.mark.suite
@pytest.mark.timeout(3000)
def test_franz_go_kgo_suite_single_node(broker, tmp_path):
    """franz-go's kgo integration tests, each run alone with a 300 s cap against a single
    broker: every test on the PASS list passes."""
    if broker.kind != "kaas":
        pytest.skip("the ratchet describes kaas")
    everything = franz_go.list_tests(franz_go.test_binary())
    _, excluded = franz_go.load_expected("franz-go")
    # The fast run leaves out the tests excluded by an unsupported feature (TestTxnEtl alone
    # would wait out its 300 s cap); KAAS_LONG_TESTS=1 runs them too, to notice new passes.
    only = everything if LONG else [t for t in everything if t not in excluded]
    run = franz_go.run_suite(broker.bootstrap, only=only, log_dir=tmp_path)
    report(f"franz-go kgo {franz_go.VERSION} (single node): {run.summary()}")
    slow = sorted(run.seconds.items(), key=lambda kv: -kv[1])[:5]
    report("  slowest: " + ", ".join(f"{t} {s:.0f}s" for t, s in slow))
    fresh = franz_go.new_passes(run, "franz-go")
    if fresh:
        report(f"  newly passing (add to the PASS list): {' '.join(fresh)}")
    problems = franz_go.check_ratchet(run, "franz-go")
    assert not problems, "\n\n".join(problems)


@pytest.mark.suite
@pytest.mark.long
@pytest.mark.skipif(not LONG, reason="the suites against a cluster: set KAAS_LONG_TESTS=1")
@pytest.mark.timeout(5400)
def test_franz_go_kgo_suite_cluster(tmp_path):
    """franz-go's kgo integration tests against three kaas brokers in cluster mode (file Lease,
    one shared data directory), seeded with all three: the same PASS list must pass."""
    if os.environ.get("KAAS_TEST_BOOTSTRAP") or os.environ.get("KAAS_TEST_APACHE_KAFKA", "") not in ("", "0"):
        pytest.skip("cluster mode starts its own kaas brokers")
    from kcluster import Cluster
    c = Cluster(tmp_path / "cluster", 3, auto_create=1)
    try:
        c.start()
        _, excluded = franz_go.load_expected("franz-go")
        only = [t for t in franz_go.list_tests(franz_go.test_binary()) if t not in excluded]
        run = franz_go.run_suite(c.bootstrap(), only=only, log_dir=tmp_path)
        report(f"franz-go kgo {franz_go.VERSION} (3-broker cluster): {run.summary()}")
        problems = franz_go.check_ratchet(run, "franz-go")
        assert not problems, "\n\n".join(problems)
    finally:
        c.close()
