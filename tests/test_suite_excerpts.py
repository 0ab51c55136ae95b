"""The excerpt a failed suite test shows in CI says why it failed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "suites"))
import franz_go  # noqa: E402 - the suites' modules import each other by name
import sarama  # noqa: E402


def failing_cooperative_run_output() -> str:
    """A sarama run whose cooperative test failed: the reason, then 60 log lines."""
    lines = ["=== RUN   TestFuncConsumerGroupCooperative",
             "=== RUN   TestFuncConsumerGroupCooperative/round_trips",
             "    functional_consumer_group_cooperative_test.go:41: unexpected consumer errors:"
             " [kafka server: The provided member is not known in the current generation]"]
    lines += [f"    functional_consumer_group_test.go:608: Consumer c{i}: session context done,"
              f" consumed {i} messages" for i in range(60)]
    lines += ["--- FAIL: TestFuncConsumerGroupCooperative (13.11s)",
              "=== RUN   TestFuncOther", "--- PASS: TestFuncOther (0.01s)"]
    return "\n".join(lines)


def test_the_ratchet_reports_a_failure_with_its_reason():
    """The ratchet's problem for an expected pass that failed carries the reason too: it cut
    the excerpt to its last 1,500 characters, which dropped the reason put first (a CI run
    printed the cooperative test's log lines and not why it failed)."""
    run = franz_go.SuiteRun()
    test = "TestFuncConsumerGroupCooperative"
    run.results[test] = "fail"
    run.tails[test] = sarama.test_output(failing_cooperative_run_output(), test)
    [problem] = franz_go.check_ratchet(run, sarama.NAME)
    assert problem.startswith(f"{test}: expected to pass, fail")
    assert "unexpected consumer errors" in problem
    assert "--- FAIL: TestFuncConsumerGroupCooperative (13.11s)" in problem


def test_a_sarama_excerpt_keeps_the_failure_reason_its_tail_would_cut():
    """CI printed the last 3,000 characters of a failed sarama test, and the line that said
    why (`…_test.go:41: unexpected consumer errors: …`) was above them: 60 log lines of a
    consumer reporting what it consumed followed it."""
    out = failing_cooperative_run_output()
    lines = out.splitlines()
    excerpt = sarama.test_output(out, "TestFuncConsumerGroupCooperative")
    assert len(excerpt) <= 3000 + len("\n[…]\n")
    assert "unexpected consumer errors" in excerpt
    assert excerpt.rstrip().endswith("--- FAIL: TestFuncConsumerGroupCooperative (13.11s)")
    assert "TestFuncOther" not in excerpt
    # A short output is shown whole, as before.
    short = "\n".join(lines[:3] + lines[-3:-2])
    assert sarama.test_output(short, "TestFuncConsumerGroupCooperative") == short


# A coordinator's log line when it removed sarama's leader (a 2026-12-07 run).
LATE_LEADER_REMOVED = (
    "2026-12-07T10:02:18.348758Z  INFO kaas_shard::groups::manager: removed a member from its"
    " group: the group's leader sent no SyncGroup for generation 2 within the rebalance timeout"
    " (6000 ms) after its JoinGroup answer; the other members' assignments waited for it, and"
    " the group rebalances without it group=sarama.TestFuncConsumerGroupCooperative/round_trips"
    "_messages_while_scaling_the_group1796637727984522810 member=cooperative-1-0e71b82d")


def cooperative_failure(reason: str) -> franz_go.SuiteRun:
    run = franz_go.SuiteRun()
    out = "\n".join(["=== RUN   TestFuncConsumerGroupCooperative",
                     "=== RUN   TestFuncConsumerGroupCooperative/round_trips",
                     f"    functional_consumer_group_cooperative_test.go:41: {reason}",
                     "--- FAIL: TestFuncConsumerGroupCooperative (13.11s)"])
    run.results["TestFuncConsumerGroupCooperative"] = "fail"
    run.tails["TestFuncConsumerGroupCooperative"] = sarama.test_output(
        out, "TestFuncConsumerGroupCooperative")
    return run


def test_a_leader_removed_for_its_late_sync_is_excused_and_nothing_else():
    """sarama's cooperative test fails when its own leader syncs after its 6 s rebalance
    timeout; that failure is excused (and reported) only when it is that one: the leader's
    UNKNOWN_MEMBER_ID and nothing else, and a broker's log naming the removal."""
    member_gone = ("unexpected consumer errors: [kafka server: The provided member is not"
                   " known in the current generation]")
    excused = sarama.excused_late_leader_sync(cooperative_failure(member_gone),
                                              LATE_LEADER_REMOVED)
    assert list(excused) == ["TestFuncConsumerGroupCooperative"]
    assert "generation 2" in excused["TestFuncConsumerGroupCooperative"]
    # No removal in the brokers' logs: the broker lost the member some other way.
    assert sarama.excused_late_leader_sync(cooperative_failure(member_gone), "") == {}
    # Another reason: a message not received is never excused.
    lost = cooperative_failure("Error: consumer group did not receive every message")
    assert sarama.excused_late_leader_sync(lost, LATE_LEADER_REMOVED) == {}
    # The test passed: nothing to excuse.
    passed = franz_go.SuiteRun({"TestFuncConsumerGroupCooperative": "pass"})
    assert sarama.excused_late_leader_sync(passed, LATE_LEADER_REMOVED) == {}


def test_librdkafka_0057_is_excused_only_for_its_produce_loop_race():
    """librdkafka's 0057 fails when the broker's Metadata answer beats its produce() loop
    (librdkafka then returns Local: Unknown topic itself); only that expectation is excused
    and reported, never another failure of the test or a failure of another test."""
    import librdkafka  # noqa: E402 - beside sarama, on the path set above
    raced = ("[0057_invalid_topic          /  0.003s] TEST FAILURE\n"
             "### Test \"0057_invalid_topic\" failed at testcpp.h:77:() at Mon Dec  7 13:53:14"
             " 2026: ###\n"
             "test_invalid_topic:90: Expected Broker: Invalid topic, got Local: Unknown topic\n"
             "3 thread(s) still active in librdkafka\n")
    run = franz_go.SuiteRun(results={"0057_invalid_topic": "fail"},
                            tails={"0057_invalid_topic": raced})
    assert list(librdkafka.excused_invalid_topic_race(run)) == ["0057_invalid_topic"]
    # The delivery report's check failing is the broker's answer, not the race: not excused.
    wrong_answer = raced.replace("test_invalid_topic:90: Expected Broker: Invalid topic, got"
                                 " Local: Unknown topic",
                                 "dr_cb:59: Expected Broker: Invalid topic, got Success")
    run.tails["0057_invalid_topic"] = wrong_answer
    assert librdkafka.excused_invalid_topic_race(run) == {}
    run.tails["0057_invalid_topic"] = raced + "dr_cb:59: Expected Success, got Local: Timed out\n"
    assert librdkafka.excused_invalid_topic_race(run) == {}
    # Another test with the same words, or a timeout, is never excused.
    run = franz_go.SuiteRun(results={"0058_log": "fail", "0057_invalid_topic": "timeout"},
                            tails={"0058_log": raced, "0057_invalid_topic": raced})
    assert librdkafka.excused_invalid_topic_race(run) == {}
