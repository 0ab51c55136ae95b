"""The excerpt a failed suite test shows in CI says why it failed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "suites"))
import sarama  # noqa: E402 - the suites' modules import each other by name


def test_a_sarama_excerpt_keeps_the_failure_reason_its_tail_would_cut():
    """CI printed the last 3,000 characters of a failed sarama test, and the line that said
    why (`…_test.go:41: unexpected consumer errors: …`) was above them: 60 log lines of a
    consumer reporting what it consumed followed it."""
    lines = ["=== RUN   TestFuncConsumerGroupCooperative",
             "=== RUN   TestFuncConsumerGroupCooperative/round_trips",
             "    functional_consumer_group_cooperative_test.go:41: unexpected consumer errors:"
             " [kafka server: The provided member is not known in the current generation]"]
    lines += [f"    functional_consumer_group_test.go:608: Consumer c{i}: session context done,"
              f" consumed {i} messages" for i in range(60)]
    lines += ["--- FAIL: TestFuncConsumerGroupCooperative (13.11s)",
              "=== RUN   TestFuncOther", "--- PASS: TestFuncOther (0.01s)"]
    out = "\n".join(lines)
    excerpt = sarama.test_output(out, "TestFuncConsumerGroupCooperative")
    assert len(excerpt) <= 3000 + len("\n[…]\n")
    assert "unexpected consumer errors" in excerpt
    assert excerpt.rstrip().endswith("--- FAIL: TestFuncConsumerGroupCooperative (13.11s)")
    assert "TestFuncOther" not in excerpt
    # A short output is shown whole, as before.
    short = "\n".join(lines[:3] + lines[-3:-2])
    assert sarama.test_output(short, "TestFuncConsumerGroupCooperative") == short
