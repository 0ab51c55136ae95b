"""The catalogue of Apache Kafka 4.4's command-line scripts against kaas (issue 15): every script
of the distribution's bin/ is either run against one kaas broker and classified, or listed as not
applicable with the reason, and the classes must match the table kept here.

Classes:
* PASS: exit 0 and the output shows the expected result (a check per invocation: the topic
  listed, the records read back, the offsets printed, ...).
* UNSUPPORTED: the tool stops with a Kafka error naming what the broker does not serve
  (UnsupportedVersionException, "does not support ...", SECURITY_DISABLED, kaas's own message).
  A few tools print that error and still exit 0 (kafka-cluster unregister, kafka-share-groups
  --describe, the share consumers); the message, not the exit code, is what the operator sees.
* BROKEN: anything else: no exit within the bound, a protocol parse error, an error that does
  not say what is missing, or exit 0 without the expected result.
* MISSING: the main class is not in the fetched jars; recorded, not compared.

The tools run from the jars scripts/fetch-kafka.sh fetched, as their main classes (what each
bin/*.sh execs through kafka-run-class.sh), at most two at a time on this 2-core machine. A
regression and an improvement both fail the comparison: an improvement only needs its row of
EXPECTED updated. `pytest -s` prints the table.

The list of scripts is Kafka 4.1.0's bin/ (43) plus connect-internal-topics.sh, whose main class
(org.apache.kafka.tools.ConnectInternalTopics) ships in kafka-tools-4.4.0.jar: 44 scripts.
Kafka 4 has no zookeeper-*.sh (removed with ZooKeeper in 4.0); bin/windows/ holds .bat twins of
the same tools and is left out."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from kcheck import admin, create_topic, rdkafka_consumer, unique_topic, wait_topic, watermarks

PASS, UNSUPPORTED, BROKEN, MISSING = "PASS", "UNSUPPORTED", "BROKEN", "MISSING"
NOT_APPLICABLE = "n/a"

# A tool that has not exited by then is hung, as far as an operator is concerned.
TOOL_TIMEOUT_S = 60
# Two JVMs at once keep both cores busy without starving the broker.
PARALLEL_TOOLS = 2
JAVA = ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]

T = "org.apache.kafka.tools."

# Every script in Kafka 4.4's bin/ (windows/ aside).
KAFKA_BIN = (
    "connect-distributed", "connect-internal-topics", "connect-mirror-maker",
    "connect-plugin-path", "connect-standalone", "kafka-acls", "kafka-broker-api-versions",
    "kafka-client-metrics", "kafka-cluster", "kafka-configs", "kafka-console-consumer",
    "kafka-console-producer", "kafka-console-share-consumer", "kafka-consumer-groups",
    "kafka-consumer-perf-test", "kafka-delegation-tokens", "kafka-delete-records",
    "kafka-dump-log", "kafka-e2e-latency", "kafka-features", "kafka-get-offsets", "kafka-groups",
    "kafka-jmx", "kafka-leader-election", "kafka-log-dirs", "kafka-metadata-quorum",
    "kafka-metadata-shell", "kafka-producer-perf-test", "kafka-reassign-partitions",
    "kafka-replica-verification", "kafka-run-class", "kafka-server-start", "kafka-server-stop",
    "kafka-share-consumer-perf-test", "kafka-share-groups", "kafka-storage",
    "kafka-streams-application-reset", "kafka-streams-groups", "kafka-topics",
    "kafka-transactions", "kafka-verifiable-consumer", "kafka-verifiable-producer",
    "kafka-verifiable-share-consumer", "trogdor",
)

# Scripts with no broker to point at: nothing to classify.
NOT_APPLICABLE_SCRIPTS = {
    "connect-distributed": "starts a Kafka Connect worker, a long-running service (a client of "
                           "the broker, not a command aimed at it)",
    "connect-standalone": "starts a standalone Kafka Connect worker, a long-running service",
    "connect-mirror-maker": "starts MirrorMaker 2 Connect workers, a long-running service",
    "connect-plugin-path": "lists and syncs Connect plugin jars on the local disk; no broker",
    "kafka-jmx": "reads MBeans from a JVM over JMX/RMI; kaas is no JVM (it serves /metrics)",
    "kafka-metadata-shell": "browses a KRaft __cluster_metadata log; kaas keeps no KRaft log",
    "kafka-run-class": "the launcher every script uses; each tool is covered by its own script",
    "kafka-server-start": "starts an Apache Kafka broker; kaas is the broker",
    "kafka-server-stop": "signals local kafka.Kafka processes found by ps; kaas stops on SIGTERM",
    "kafka-storage": "formats or inspects KRaft log dirs (meta.properties); kaas formats its own "
                     "--data-dir",
    "trogdor": "starts the Trogdor fault-injection agent and coordinator daemons",
}

# (script, invocation) -> class, as the current kaas binary answers. Keep the reason of every
# BROKEN row next to it.
EXPECTED = {
    ("connect-internal-topics", "create --worker-config <file>"): PASS,
    ("kafka-acls", "--list"): UNSUPPORTED,
    ("kafka-broker-api-versions", "(bootstrap only)"): PASS,
    ("kafka-client-metrics", "--list"): UNSUPPORTED,
    ("kafka-cluster", "cluster-id"): PASS,
    ("kafka-cluster", "unregister --id 7"): UNSUPPORTED,
    ("kafka-configs", "--alter --entity-type topics --add-config"): PASS,
    ("kafka-configs", "--describe --entity-type topics"): PASS,
    ("kafka-configs", "--describe --entity-type brokers --all"): PASS,
    ("kafka-console-consumer", "--group <g> --from-beginning --max-messages 100"): PASS,
    ("kafka-console-producer", "parse.key=true, 100 lines"): PASS,
    ("kafka-console-share-consumer", "--group <sg> --max-messages 5"): UNSUPPORTED,
    ("kafka-consumer-groups", "--list"): PASS,
    ("kafka-consumer-groups", "--describe --group <g>"): PASS,
    ("kafka-consumer-groups", "--reset-offsets --to-earliest --dry-run"): PASS,
    ("kafka-consumer-groups", "--reset-offsets --to-earliest --execute"): PASS,
    ("kafka-consumer-groups", "--delete --group <g>"): PASS,
    ("kafka-consumer-perf-test", "--num-records 5000"): PASS,
    ("kafka-delegation-tokens", "--describe"): UNSUPPORTED,
    ("kafka-delete-records", "--offset-json-file (offset 100)"): PASS,
    # kaas names its segments <base offset>.<leader epoch>.log; DumpLogSegments takes the base
    # offset from the name up to the first dot, and the bytes are Kafka's. (Before, with
    # <base>-<epoch>.log, this was BROKEN: NumberFormatException.)
    ("kafka-dump-log", "--files <kaas segment> --print-data-log"): PASS,
    ("kafka-e2e-latency", "--num-records 200 --producer-acks all"): PASS,
    # Only group.version: kaas reports none of Kafka's other features (metadata.version,
    # transaction.version, share.version, ...), as it serves none of them.
    ("kafka-features", "describe"): PASS,
    # UpdateFeatures keeps a level (the only change kaas can make: group.version is fixed at 1).
    ("kafka-features", "upgrade --feature group.version=1"): PASS,
    ("kafka-get-offsets", "--topic <t>"): PASS,
    ("kafka-groups", "--list"): PASS,
    ("kafka-leader-election", "--election-type preferred --all-topic-partitions"): PASS,
    ("kafka-log-dirs", "--describe --topic-list <t>"): PASS,
    ("kafka-metadata-quorum", "describe --status"): UNSUPPORTED,
    ("kafka-producer-perf-test", "--num-records 5000 acks=all"): PASS,
    ("kafka-reassign-partitions", "--list"): PASS,
    ("kafka-reassign-partitions", "--generate"): PASS,
    ("kafka-reassign-partitions", "--verify"): PASS,
    ("kafka-reassign-partitions", "--execute"): PASS,
    ("kafka-replica-verification", "--topics-include <t> (runs until stopped)"): PASS,
    ("kafka-share-consumer-perf-test", "--group <sg> --num-records 50"): UNSUPPORTED,
    ("kafka-share-groups", "--list"): PASS,
    ("kafka-share-groups", "--describe --group <sg>"): UNSUPPORTED,
    ("kafka-streams-application-reset", "--application-id <g> --input-topics <t>"): PASS,
    ("kafka-streams-groups", "--list"): PASS,
    ("kafka-streams-groups", "--describe --group <app>"): UNSUPPORTED,
    ("kafka-topics", "--create --partitions 3 --config"): PASS,
    ("kafka-topics", "--list"): PASS,
    ("kafka-topics", "--describe"): PASS,
    ("kafka-topics", "--alter --partitions 4"): PASS,
    ("kafka-topics", "--delete"): PASS,
    # ListTransactions answers an empty list (no transaction is ever started). UNSUPPORTED before.
    ("kafka-transactions", "list"): PASS,
    ("kafka-transactions", "describe-producers --partition 0"): PASS,
    # kaas refuses transactional coordinators with TRANSACTIONAL_ID_AUTHORIZATION_FAILED (so
    # clients fail at once); this tool drops kaas's message and prints "failed due to
    # authorization failure", which does not say that transactions are not served.
    ("kafka-transactions", "describe --transactional-id <id>"): BROKEN,
    ("kafka-verifiable-consumer", "--group-id <vg> --max-messages 50"): PASS,
    ("kafka-verifiable-producer", "--max-messages 50 --acks -1"): PASS,
    ("kafka-verifiable-share-consumer", "--group-id <sg> --max-messages 50"): UNSUPPORTED,
}

# A tool that stops on one of these failed to parse what the broker sent (or the broker what
# the tool sent): never a clean "unsupported", whatever else it prints.
PROTOCOL_ERROR = re.compile(
    r"SchemaException|Error reading field|Error deserializing|BufferUnderflowException|"
    r"CorruptRecordException|UnknownServerException|The server experienced an unexpected error")
UNSUPPORTED_ERROR = re.compile(
    r"UnsupportedVersionException|does not support|not supported|SecurityDisabledException|"
    r"SECURITY_DISABLED|kaas does not serve")


Check = Callable[[str, str], "str | None"]


@dataclass
class Step:
    """One invocation: `check(stdout, stderr)` returns the PASS evidence, or None when the
    output does not show the expected result (`shows` says what was looked for)."""
    script: str
    invocation: str
    main_class: str
    args: list | Callable[[], list]
    check: Check
    shows: str
    stdin: str | None = None
    # Tools that run until stopped (replica verification) are stopped once `check` passes, or
    # after this long, and judged on what they printed meanwhile.
    run_for: float | None = None


@dataclass
class Result:
    step: Step
    cls: str
    evidence: str
    seconds: float = 0.0
    rc: int | None = None
    output: str = field(default="", repr=False)


def line_with(text: str, pattern: str) -> str | None:
    m = re.search(rf"^.*(?:{pattern}).*$", text, re.M)
    return m.group(0).strip() if m else None


def short(line: str, width: int = 100) -> str:
    """One line of evidence: without Java package prefixes and log prefixes, at most `width`."""
    line = re.sub(r"\b(?:[a-z_][a-z0-9_]*\.)+(?=[A-Z]\w*(?:Exception|Error)\b)", "", line)
    line = re.sub(r"^\S+Z \S+ (?:ERROR|WARN|INFO) (?:\[[^\]]*\] )?", "", line.strip())
    line = " ".join(line.replace(" Enable debug logging for additional detail.", "").split())
    # Head and tail: a Kafka error often names the cause at the end of a long line.
    half = (width - 3) // 2
    return line if len(line) <= width else f"{line[:half]} … {line[-half:]}"


def unsupported_evidence(text: str) -> str | None:
    """The line naming what is unsupported: the sentence with 'does not support' first (it
    names the API), else the exception's line."""
    m = re.search(r"The (?:node|cluster|target cluster) does not support [^\n.:]*", text) or \
        re.search(r"[^\n:]*(?:does not support|not supported|kaas does not serve)[^\n]*", text)
    if m:
        return short(m.group(0))
    line = line_with(text, UNSUPPORTED_ERROR.pattern)
    return short(line) if line else None


def broken_evidence(rc: int | None, out: str, err: str) -> str:
    text = err + "\n" + out
    line = line_with(text, r"Exception|Error|error|failed")
    if line:
        line = line.replace('Exception in thread "main" ', "")
        return f"exit {rc}: {short(line, 150)}"
    lines = [l for l in (out + "\n" + err).splitlines() if l.strip()]
    return f"exit {rc}: {short(lines[-1], 150)}" if lines else f"exit {rc}, no output"


def classify(step: Step, rc: int | None, out: str, err: str, stopped: bool) -> tuple[str, str]:
    text = out + "\n" + err
    if stopped and step.run_for is None:
        last = [l for l in text.splitlines() if l.strip()][-1:] or ["no output"]
        return BROKEN, f"no exit within {TOOL_TIMEOUT_S} s; last: {short(last[0], 70)}"
    if PROTOCOL_ERROR.search(text):
        return BROKEN, short(line_with(text, PROTOCOL_ERROR.pattern))
    why_not = ""
    if rc == 0 or stopped:
        evidence, why_not = safe_check(step, out, err)
        if evidence:
            return PASS, evidence
    evidence = unsupported_evidence(text)
    if evidence:
        return UNSUPPORTED, evidence
    if rc == 0 or stopped:
        how = f"stopped after {step.run_for:.0f} s" if stopped else "exit 0"
        last = short(text.strip().splitlines()[-1], 60) if text.strip() else "no output"
        return BROKEN, f"{how} without {step.shows}: {why_not or last}"
    return BROKEN, broken_evidence(rc, out, err)


def safe_check(step: Step, out: str, err: str) -> tuple[str | None, str]:
    """(evidence, "") or (None, why): a check that raises could not confirm the result."""
    try:
        return step.check(out, err), ""
    except Exception as e:
        return None, f"check raised {short(repr(e), 80)}"


def run_step(step: Step, libs: Path, classes: set[str]) -> Result:
    if step.main_class.replace(".", "/") + ".class" not in classes:
        return Result(step, MISSING, f"{step.main_class} not in {libs}")
    args = step.args() if callable(step.args) else step.args
    cmd = [*JAVA, "-cp", f"{libs}/*", step.main_class, *map(str, args)]
    t0 = time.monotonic()
    stdin = subprocess.PIPE if step.stdin is not None else subprocess.DEVNULL
    p = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    if step.run_for is None:
        stopped = False
        try:
            out, err = p.communicate(step.stdin, timeout=TOOL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stopped = True
            p.kill()
            out, err = p.communicate()
    else:
        out, err, stopped = watch(step, p)
    cls, evidence = classify(step, None if stopped else p.returncode, out, err, stopped)
    return Result(step, cls, evidence, time.monotonic() - t0, p.returncode,
                  f"$ {' '.join(cmd[len(JAVA) + 2:])}\nexit {p.returncode}\n"
                  f"--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}")


def watch(step: Step, p: subprocess.Popen) -> tuple[str, str, bool]:
    """A tool that runs until stopped: stop it once its output shows the expected result, or
    after step.run_for seconds. Returns (stdout, stderr, whether it had to be stopped)."""
    chunks: dict[str, list[str]] = {"out": [], "err": []}

    def pump(stream, key):
        for line in stream:
            chunks[key].append(line)

    readers = [threading.Thread(target=pump, args=(p.stdout, "out"), daemon=True),
               threading.Thread(target=pump, args=(p.stderr, "err"), daemon=True)]
    for r in readers:
        r.start()
    deadline = time.monotonic() + step.run_for
    stopped = False
    while p.poll() is None:
        shown, _ = safe_check(step, "".join(chunks["out"]), "".join(chunks["err"]))
        if shown or time.monotonic() > deadline:
            stopped = True
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            break
        time.sleep(0.2)
    for r in readers:
        r.join(10)
    return "".join(chunks["out"]), "".join(chunks["err"]), stopped


def jar_classes(libs: Path) -> set[str]:
    names: set[str] = set()
    for jar in libs.glob("*.jar"):
        with zipfile.ZipFile(jar) as z:
            names.update(n for n in z.namelist() if n.endswith(".class"))
    return names


def table_rows(results: list[Result]) -> list[tuple[str, str, str, str]]:
    """By script, each script's invocations in EXPECTED's order (not the order they finished)."""
    order = {key: i for i, key in enumerate(EXPECTED)}
    rows = [(r.step.script, r.step.invocation, r.cls, r.evidence) for r in results]
    rows += [(s, "-", NOT_APPLICABLE, reason) for s, reason in NOT_APPLICABLE_SCRIPTS.items()]
    return sorted(rows, key=lambda r: (r[0], order.get(r[:2], 0)))


# -- the invocations -------------------------------------------------------------------------

def chains(broker, tmp: Path) -> list[list[Step]]:
    """The invocations as chains: a chain runs in order (a step may need what the one before
    it wrote), chains run side by side."""
    bs = ["--bootstrap-server", broker.bootstrap]
    topic, group = unique_topic("cat-data"), unique_topic("cat-group")
    admin_topic = unique_topic("cat-admin")
    perf, vtopic = unique_topic("cat-perf"), unique_topic("cat-verifiable")
    share_group, app = unique_topic("cat-share"), unique_topic("cat-app")
    n = 100
    for t, parts in ((topic, 2), (perf, 1), (vtopic, 1)):
        create_topic(broker.bootstrap, t, parts)

    def has(pattern: str, evidence: str) -> Check:
        return lambda out, err: evidence if re.search(pattern, out + err, re.M) else None

    # -- chain A: the data path and the group tools on one topic and one group ------------
    lines = "".join(f"k{i % 7}:line-{i}\n" for i in range(n))

    def produced(out, err):
        from confluent_kafka import TopicPartition
        c = rdkafka_consumer(broker.bootstrap)
        try:
            total = sum(watermarks(c, TopicPartition(topic, p))[1] for p in (0, 1))
        finally:
            c.close()
        return f"{n} lines in, the topic's end offsets sum to {n}" if total == n else None

    def consumed(out, err):
        got = {tuple(l.split("\t")) for l in out.splitlines() if "\t" in l}
        want = {(f"k{i % 7}", f"line-{i}") for i in range(n)}
        ok = got == want and f"Processed a total of {n} messages" in err
        return f"{n} records read back with their keys" if ok else None

    def end_offsets(out, err):
        offs = re.findall(rf"^{re.escape(topic)}:(\d+):(\d+)$", out, re.M)
        total = sum(int(o) for _, o in offs)
        return f"{len(offs)} partitions, end offsets sum to {n}" if total == n else None

    def group_rows(out: str) -> list[dict]:
        table = [l.split() for l in out.splitlines() if l.strip()]
        header = next((l for l in table if l[:2] == ["GROUP", "TOPIC"]), None)
        return [dict(zip(header, l)) for l in table if header and l[:2] == [group, topic]]

    def described(out, err):
        rows = group_rows(out)
        ok = len(rows) == 2 and sum(int(r["CURRENT-OFFSET"]) for r in rows) == n \
            and all(r["LAG"] == "0" for r in rows)
        return f"2 partitions, committed offsets sum to {n}, lag 0" if ok else None

    def reset_planned(out, err):
        rows = group_rows(out)
        ok = len(rows) == 2 and all(r["NEW-OFFSET"] == "0" for r in rows)
        return "both partitions planned at NEW-OFFSET 0" if ok else None

    def reset_done(out, err):
        if not reset_planned(out, err):
            return None
        # The same table as --dry-run: what shows it executed is the committed offsets.
        from confluent_kafka import ConsumerGroupTopicPartitions
        a = admin(broker.bootstrap)  # held: the future never completes once it is collected
        fut = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
        tps = fut[group].result(15).topic_partitions
        ok = len(tps) == 2 and all(tp.offset == 0 for tp in tps)
        return "committed offsets now 0 on both partitions" if ok else None

    def listed_classic(out, err):
        ok = re.search(rf"^{re.escape(group)}\s+Classic\s+consumer\s*$", out, re.M)
        return "the group listed as Classic, protocol consumer" if ok else None

    def lists_no_classic_group(kind):
        def check(out, err):
            ok = group not in out and not re.search(r"Error|Exception", out + err)
            return f"no {kind} group listed (the classic group is left out)" if ok else None
        return check

    def segment() -> Path:
        # The partition holding the most bytes: the keys spread the lines over both.
        logs = sorted(broker.data_dir.glob(f"{topic}~*/*/*.log"), key=lambda p: p.stat().st_size)
        assert logs, f"no segment of {topic} under {broker.data_dir}"
        return logs[-1]

    def dumped(out, err):
        batches = re.findall(r"^baseOffset: \d+ .* isvalid: true$", out, re.M)
        records = re.findall(r"^\| offset: \d+ .* payload: line-\d+$", out, re.M)
        return (f"valid batches: {len(batches)}, records with keys and payloads: {len(records)}"
                if batches and records else None)

    chain_a = [
        Step("kafka-console-producer", "parse.key=true, 100 lines", T + "ConsoleProducer",
             [*bs, "--topic", topic, "--reader-property", "parse.key=true",
              "--reader-property", "key.separator=:", "--command-property", "acks=all"],
             produced, f"{n} records in the topic", stdin=lines),
        Step("kafka-console-consumer", "--group <g> --from-beginning --max-messages 100",
             T + "consumer.ConsoleConsumer",
             [*bs, "--topic", topic, "--group", group, "--from-beginning", "--max-messages", n,
              "--timeout-ms", 30000, "--formatter-property", "print.key=true"],
             consumed, f"the {n} keyed lines"),
        Step("kafka-get-offsets", "--topic <t>", T + "GetOffsetShell", [*bs, "--topic", topic],
             end_offsets, f"end offsets summing to {n}"),
        Step("kafka-consumer-groups", "--list", T + "consumer.group.ConsumerGroupCommand",
             [*bs, "--list"], has(rf"^{re.escape(group)}$", "the group listed"), "the group"),
        Step("kafka-consumer-groups", "--describe --group <g>",
             T + "consumer.group.ConsumerGroupCommand", [*bs, "--describe", "--group", group],
             described, "committed offsets and lag"),
        Step("kafka-consumer-groups", "--reset-offsets --to-earliest --dry-run",
             T + "consumer.group.ConsumerGroupCommand",
             [*bs, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest",
              "--dry-run"], reset_planned, "the planned offsets"),
        Step("kafka-consumer-groups", "--reset-offsets --to-earliest --execute",
             T + "consumer.group.ConsumerGroupCommand",
             [*bs, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest",
              "--execute"], reset_done, "offsets reset to 0"),
        Step("kafka-groups", "--list", T + "GroupsCommand", [*bs, "--list"], listed_classic,
             "the group with its type"),
        Step("kafka-share-groups", "--list", T + "consumer.group.ShareGroupCommand",
             [*bs, "--list"], lists_no_classic_group("share"), "an empty share-group list"),
        Step("kafka-streams-groups", "--list", T + "streams.StreamsGroupCommand",
             [*bs, "--list"], lists_no_classic_group("streams"), "an empty streams-group list"),
        Step("kafka-streams-application-reset", "--application-id <g> --input-topics <t>",
             T + "StreamsResetter", [*bs, "--application-id", group, "--input-topics", topic],
             has(rf"^Topic: {re.escape(topic)} Partition: 1 Offset: 0$",
                 "input offsets reset to 0"), "the reset offsets"),
        Step("kafka-consumer-groups", "--delete --group <g>",
             T + "consumer.group.ConsumerGroupCommand", [*bs, "--delete", "--group", group],
             has(r"Deletion of requested consumer groups .* was successful",
                 "deletion successful"), "the deletion"),
        Step("kafka-dump-log", "--files <kaas segment> --print-data-log", T + "DumpLogSegments",
             lambda: ["--files", segment(), "--print-data-log"], dumped, "the batches"),
    ]

    # -- chain B: topic and cluster administration ---------------------------------------
    def created(out, err):
        return "created" if f"Created topic {admin_topic}." in out else None

    def topic_described(out, err):
        head = re.search(rf"^Topic: {re.escape(admin_topic)}\s.*PartitionCount: 3\s", out, re.M)
        leaders = re.findall(r"^\s+Topic: .*Partition: \d+\s+Leader: (\d+)", out, re.M)
        ok = head and len(leaders) == 3 and "retention.ms=86400000" in out
        return "3 partitions, each led, config shown" if ok else None

    def grown(out, err):
        try:
            wait_topic(broker.bootstrap, admin_topic, 4, timeout=15)
        except AssertionError:
            return None
        return "Metadata shows 4 led partitions"

    def deleted(out, err):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if admin_topic not in admin(broker.bootstrap).list_topics(timeout=10).topics:
                return "gone from Metadata"
            time.sleep(0.3)
        return None

    def cluster_id(out, err):
        with urllib.request.urlopen(broker.health_url + "/healthz", timeout=5) as r:
            want = json.load(r)["cluster_id"]
        return "the broker's cluster id" if f"Cluster ID: {want}" in out else None

    def features(out, err):
        found = [dict(re.findall(r"(\w+):\s*(\S+)", l)) for l in out.splitlines()
                 if l.startswith("Feature:")]
        return "; ".join(f"{f['Feature']} supported {f['SupportedMinVersion']}-"
                         f"{f['SupportedMaxVersion']}, finalized {f['FinalizedVersionLevel']}"
                         for f in found) or None

    def log_dirs(out, err):
        doc = next((json.loads(l) for l in out.splitlines() if l.startswith("{")), None)
        parts = {p["partition"] for b in (doc or {}).get("brokers", ())
                 for d in b["logDirs"] for p in d["partitions"]}
        want = {f"{admin_topic}-{i}" for i in range(4)}
        return "the data dir with the topic's 4 partitions" if parts == want else None

    def reassignment_json() -> list:
        f = tmp / "reassign.json"
        f.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": admin_topic, "partition": p, "replicas": [0], "log_dirs": ["any"]}
            for p in range(4)]}))
        return [*bs, "--reassignment-json-file", f]

    def topics_to_move() -> list:
        f = tmp / "move.json"
        f.write_text(json.dumps({"version": 1, "topics": [{"topic": admin_topic}]}))
        return [*bs, "--generate", "--topics-to-move-json-file", f, "--broker-list", "0"]

    token_config = tmp / "admin.properties"
    token_config.write_text("")
    configs = T + "ConfigCommand"
    topic_entity = ["--entity-type", "topics", "--entity-name", admin_topic]
    chain_b = [
        Step("kafka-topics", "--create --partitions 3 --config", T + "TopicCommand",
             [*bs, "--create", "--topic", admin_topic, "--partitions", 3,
              "--replication-factor", 1, "--config", "retention.ms=86400000"],
             created, "'Created topic'"),
        Step("kafka-topics", "--list", T + "TopicCommand", [*bs, "--list"],
             lambda out, err: "the topic listed" if admin_topic in out.split() else None,
             "the topic"),
        Step("kafka-topics", "--describe", T + "TopicCommand",
             [*bs, "--describe", "--topic", admin_topic], topic_described, "the partitions"),
        Step("kafka-topics", "--alter --partitions 4", T + "TopicCommand",
             [*bs, "--alter", "--topic", admin_topic, "--partitions", 4], grown,
             "4 partitions"),
        Step("kafka-configs", "--alter --entity-type topics --add-config", configs,
             [*bs, *topic_entity, "--alter", "--add-config", "retention.ms=3600000"],
             has(r"Completed updating config for topic", "config updated"), "the update"),
        Step("kafka-configs", "--describe --entity-type topics", configs,
             [*bs, *topic_entity, "--describe"],
             has(r"^\s+retention\.ms=3600000 sensitive=false", "the new retention.ms"),
             "retention.ms=3600000"),
        Step("kafka-configs", "--describe --entity-type brokers --all", configs,
             [*bs, "--entity-type", "brokers", "--entity-name", 0, "--describe", "--all"],
             lambda out, err: (f"{len(re.findall(r'sensitive=', out))} broker configs"
                               if "All configs for broker 0 are:" in out
                               and out.count("sensitive=") >= 3 else None),
             "the broker's configs"),
        Step("kafka-broker-api-versions", "(bootstrap only)", T + "BrokerApiVersionsCommand", bs,
             lambda out, err: (f"{out.count('[usable: ')} APIs usable, ApiVersions(18) among them"
                               if re.search(r"\(id: 0 rack: .*\) -> \(", out)
                               and re.search(r"ApiVersions\(18\): 0 to \d+ \[usable", out)
                               else None),
             "the broker's API ranges"),
        Step("kafka-cluster", "cluster-id", T + "ClusterTool", ["cluster-id", *bs], cluster_id,
             "the cluster id"),
        Step("kafka-cluster", "unregister --id 7", T + "ClusterTool",
             ["unregister", *bs, "--id", 7], lambda out, err: None, "an unregistration"),
        Step("kafka-acls", "--list", T + "AclCommand", [*bs, "--list"],
             lambda out, err: "listed" if "Current ACLs" in out else None, "the ACLs"),
        Step("kafka-client-metrics", "--list", T + "ClientMetricsCommand", [*bs, "--list"],
             lambda out, err: None if (out + err).strip() else "empty list",
             "the subscriptions"),
        Step("kafka-delegation-tokens", "--describe", T + "DelegationTokenCommand",
             [*bs, "--command-config", token_config, "--describe"],
             has(r"TOKENID", "token table"), "the tokens"),
        Step("kafka-features", "describe", T + "FeatureCommand", [*bs, "describe"],
             features, "a 'Feature:' line"),
        Step("kafka-features", "upgrade --feature group.version=1", T + "FeatureCommand",
             [*bs, "upgrade", "--feature", "group.version=1"],
             has(r"^group\.version was upgraded to 1\.", "the upgrade"), "the upgrade"),
        Step("kafka-leader-election", "--election-type preferred --all-topic-partitions",
             T + "LeaderElectionCommand",
             [*bs, "--election-type", "preferred", "--all-topic-partitions"],
             # Every partition's one replica leads it: nothing to elect, and as from Kafka's
             # controller, partitions that need no election are not listed.
             lambda out, err: ("nothing to elect, nothing failed"
                               if not out.strip() and "Exception" not in err else None),
             "an election result"),
        Step("kafka-log-dirs", "--describe --topic-list <t>", T + "LogDirsCommand",
             [*bs, "--describe", "--topic-list", admin_topic], log_dirs, "the partitions"),
        Step("kafka-metadata-quorum", "describe --status", T + "MetadataQuorumCommand",
             [*bs, "describe", "--status"], has(r"^LeaderId:", "quorum status"),
             "the quorum"),
        Step("kafka-reassign-partitions", "--list", T + "reassign.ReassignPartitionsCommand",
             [*bs, "--list"], has(r"^No partition reassignments found\.$", "none in progress"),
             "the reassignments"),
        Step("kafka-reassign-partitions", "--generate", T + "reassign.ReassignPartitionsCommand",
             topics_to_move,
             lambda out, err: ("current and proposed assignments of 4 partitions"
                               if "Proposed partition reassignment configuration" in out
                               and out.count(f'"topic":"{admin_topic}"') == 8 else None),
             "the proposal"),
        Step("kafka-reassign-partitions", "--verify", T + "reassign.ReassignPartitionsCommand",
             lambda: [*reassignment_json(), "--verify"],
             lambda out, err: ("all 4 partitions reported completed" if len(re.findall(
                 rf"Reassignment of partition {re.escape(admin_topic)}-\d is completed", out)) == 4
                 else None),
             "the status"),
        Step("kafka-reassign-partitions", "--execute", T + "reassign.ReassignPartitionsCommand",
             lambda: [*reassignment_json(), "--execute"],
             has(r"Successfully started partition reassignment", "started"), "the start"),
        Step("kafka-transactions", "list", T + "TransactionsCommand", [*bs, "list"],
             has(r"^TransactionalId", "the transaction table"), "the transactions"),
        Step("kafka-transactions", "describe --transactional-id <id>", T + "TransactionsCommand",
             [*bs, "describe", "--transactional-id", "cat-txn"],
             has(r"^CoordinatorId", "the transaction state"), "the transaction"),
        Step("kafka-topics", "--delete", T + "TopicCommand",
             [*bs, "--delete", "--topic", admin_topic], deleted, "the topic deleted"),
    ]

    # -- chain C: the client tools -----------------------------------------------------
    def perf_consumed(out, err):
        rows = [l.split(", ") for l in out.splitlines() if re.match(r"\d{4}-\d\d-\d\d ", l)]
        ok = len(rows) == 1 and rows[0][4] == "5000"
        return "5000 records consumed" if ok else None

    def producers(out, err):
        table = [l.split() for l in out.splitlines() if l.strip()]
        if not table or table[0][:4] != ["ProducerId", "ProducerEpoch",
                                         "LatestCoordinatorEpoch", "LastSequence"]:
            return None
        rows = [dict(zip(table[0], l)) for l in table[1:]]
        ok = len(rows) == 1 and rows[0]["LastSequence"] == "4999"
        return "the perf producer, last sequence 4999" if ok else None

    def vp_events(out: str) -> list[dict]:
        return [json.loads(l) for l in out.splitlines() if l.startswith("{")]

    def verifiable_produced(out, err):
        data = [e for e in vp_events(out) if e["name"] == "tool_data"]
        ok = data and data[0]["sent"] == 50 and data[0]["acked"] == 50
        return "50 sent, 50 acked" if ok else None

    def verifiable_consumed(out, err):
        ev = vp_events(out)
        count = sum(e["count"] for e in ev if e["name"] == "records_consumed")
        commits = [e for e in ev if e["name"] == "offsets_committed"]
        ok = count == 50 and commits and all(e["success"] for e in commits)
        return "50 records consumed, offsets committed" if ok else None

    worker = tmp / "worker.properties"
    worker.write_text("\n".join([
        f"bootstrap.servers={broker.bootstrap}", "group.id=cat-connect",
        *(f"{k}.storage.topic=cat-connect-{k}" for k in ("config", "offset", "status")),
        *(f"{k}.storage.replication.factor=1" for k in ("config", "offset", "status")),
        "key.converter=org.apache.kafka.connect.json.JsonConverter",
        "value.converter=org.apache.kafka.connect.json.JsonConverter", ""]))
    delete_json = tmp / "delete-records.json"
    delete_json.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": perf, "partition": 0, "offset": 100}]}))

    chain_c = [
        Step("kafka-producer-perf-test", "--num-records 5000 acks=all", T + "ProducerPerformance",
             [*bs, "--topic", perf, "--num-records", 5000, "--record-size", 100,
              "--throughput", -1, "--command-property", "acks=all"],
             has(r"^5000 records sent, .* avg latency", "5000 records sent"), "5000 sent"),
        Step("kafka-consumer-perf-test", "--num-records 5000", T + "ConsumerPerformance",
             [*bs, "--topic", perf, "--num-records", 5000, "--timeout", 30000],
             perf_consumed, "5000 consumed"),
        Step("kafka-transactions", "describe-producers --partition 0", T + "TransactionsCommand",
             [*bs, "describe-producers", "--topic", perf, "--partition", 0], producers,
             "the producer"),
        Step("kafka-delete-records", "--offset-json-file (offset 100)", T + "DeleteRecordsCommand",
             [*bs, "--offset-json-file", delete_json],
             has(rf"partition: {re.escape(perf)}-0\s+low_watermark: 100$", "low watermark 100"),
             "the new low watermark"),
        Step("kafka-e2e-latency", "--num-records 200 --producer-acks all", T + "EndToEndLatency",
             [*bs, "--topic", unique_topic("cat-e2e"), "--num-records", 200,
              "--producer-acks", "all", "--record-size", 100],
             lambda out, err: short(line_with(out, r"^Avg latency: ")) if re.search(
                 r"^Percentiles: 50th = ", out, re.M) else None, "the latencies"),
        Step("kafka-verifiable-producer", "--max-messages 50 --acks -1", T + "VerifiableProducer",
             [*bs, "--topic", vtopic, "--max-messages", 50, "--acks", -1], verifiable_produced,
             "50 acked"),
        Step("kafka-verifiable-consumer", "--group-id <vg> --max-messages 50",
             T + "VerifiableConsumer",
             [*bs, "--topic", vtopic, "--group-id", unique_topic("cat-vg"), "--max-messages", 50,
              "--reset-policy", "earliest"], verifiable_consumed, "50 consumed"),
        Step("kafka-replica-verification", "--topics-include <t> (runs until stopped)",
             T + "ReplicaVerificationTool",
             ["--broker-list", broker.bootstrap, "--topics-include", vtopic,
              "--report-interval-ms", 1000, "--time", -2],
             has(rf"max lag is 0 for partition {re.escape(vtopic)}-0 at offset 50",
                 "max lag 0 at offset 50"), "a lag report", run_for=30),
        Step("connect-internal-topics", "create --worker-config <file>",
             T + "ConnectInternalTopics", ["create", "--worker-config", worker],
             lambda out, err: ("the 3 Connect topics created"
                               if len(re.findall(r"^Created internal topic: ", out, re.M)) == 3
                               else None), "the topics created"),
        Step("kafka-console-share-consumer", "--group <sg> --max-messages 5",
             T + "consumer.ConsoleShareConsumer",
             [*bs, "--topic", vtopic, "--group", share_group, "--max-messages", 5,
              "--timeout-ms", 5000],
             has(r"^Processed a total of 5 messages", "5 records"), "5 records"),
        Step("kafka-share-consumer-perf-test", "--group <sg> --num-records 50",
             T + "ShareConsumerPerformance",
             [*bs, "--topic", vtopic, "--group", share_group, "--num-records", 50,
              "--timeout", 5000],
             has(r"^\d{4}-\d\d-\d\d.*, 50$", "50 consumed"), "50 consumed"),
        Step("kafka-verifiable-share-consumer", "--group-id <sg> --max-messages 50",
             T + "VerifiableShareConsumer",
             [*bs, "--topic", vtopic, "--group-id", share_group, "--max-messages", 50],
             has(r'"name":"records_consumed"', "records consumed"), "records consumed"),
        Step("kafka-share-groups", "--describe --group <sg>",
             T + "consumer.group.ShareGroupCommand",
             [*bs, "--describe", "--group", share_group],
             has(r"^GROUP\s+TOPIC", "the group's offsets"), "the group"),
        Step("kafka-streams-groups", "--describe --group <app>", T + "streams.StreamsGroupCommand",
             [*bs, "--describe", "--group", app],
             has(r"^GROUP\s+TOPIC", "the group's offsets"), "the group"),
    ]
    # Longest first, so the two workers finish close together.
    return [chain_c, chain_b, chain_a]


# -- the tests ---------------------------------------------------------------------------

def test_catalogue_covers_every_script_of_kafka_bin():
    """Each script of Kafka 4.4's bin/ is either run by the catalogue or listed as not
    applicable, and nothing outside bin/ is: the note's table cannot silently skip a tool."""
    run = {script for script, _ in EXPECTED}
    assert not run & set(NOT_APPLICABLE_SCRIPTS), run & set(NOT_APPLICABLE_SCRIPTS)
    assert run | set(NOT_APPLICABLE_SCRIPTS) == set(KAFKA_BIN), \
        set(KAFKA_BIN) ^ (run | set(NOT_APPLICABLE_SCRIPTS))
    assert len(KAFKA_BIN) == len(set(KAFKA_BIN)) == 44


def test_classification_rules():
    """The rules the table rests on: an unsupported API named in the error is UNSUPPORTED even
    at exit 0, a hang, a parse error or an exit 0 without the result is BROKEN."""
    step = Step("kafka-x", "", T + "X", [], lambda out, err: "ok" if "listed" in out else None,
                "the listing")
    unsupported = ("org.apache.kafka.common.errors.UnsupportedVersionException: "
                   "The node does not support DESCRIBE_ACLS\n\tat Foo.bar(Foo.java:1)")
    assert classify(step, 0, "listed", "", False) == (PASS, "ok")
    assert classify(step, 1, "", unsupported, False) == \
        (UNSUPPORTED, "The node does not support DESCRIBE_ACLS")
    assert classify(step, 0, "Error: The node does not support X", "", False)[0] == UNSUPPORTED
    assert classify(step, None, "waiting", "", True)[0] == BROKEN
    parse_error = "SchemaException: Error reading field 'topics': not supported"
    assert classify(step, 1, "", parse_error, False)[0] == BROKEN
    assert classify(step, 0, "", "", False) == (BROKEN, "exit 0 without the listing: no output")
    assert classify(step, 1, "", "TimeoutException: Timed out waiting for a node", False) == \
        (BROKEN, "exit 1: TimeoutException: Timed out waiting for a node")


def test_cli_catalogue(broker_factory, kafka_libs, tmp_path):
    """Every Kafka tool an operator points at a broker, run against kaas, is classified PASS /
    UNSUPPORTED / BROKEN as EXPECTED says: a tool that regresses or improves fails here."""
    if not any(p.name.startswith("kafka-tools-") for p in kafka_libs.iterdir()):
        pytest.skip("kafka-tools jar missing")
    broker = broker_factory()
    classes = jar_classes(kafka_libs)
    t0 = time.monotonic()

    lock = threading.Lock()
    results: list[Result] = []
    pending = list(chains(broker, tmp_path))
    steps = [s for c in pending for s in c]
    assert {(s.script, s.invocation) for s in steps} == set(EXPECTED), \
        set(EXPECTED) ^ {(s.script, s.invocation) for s in steps}

    def run_chain(chain: list[Step]):
        for step in chain:
            r = run_step(step, kafka_libs, classes)
            with lock:
                results.append(r)

    # Chains are uneven; each worker takes the next chain when it is free.
    with ThreadPoolExecutor(PARALLEL_TOOLS) as pool:
        for f in [pool.submit(run_chain, c) for c in pending]:
            f.result()
    elapsed = time.monotonic() - t0

    rows = table_rows(results)
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    print(f"\nKafka 4.4 command-line tools against kaas ({elapsed:.0f} s, "
          f"{len(results)} invocations, {PARALLEL_TOOLS} at a time)")
    for row in [("script", "invocation", "class", "evidence"), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[3])
    counts = {c: sum(1 for r in results if r.cls == c)
              for c in (PASS, UNSUPPORTED, BROKEN, MISSING)}
    slowest = max(results, key=lambda r: r.seconds)
    print(", ".join(f"{c} {k}" for c, k in counts.items() if k or c != MISSING)
          + f"; scripts run: {len({r.step.script for r in results})}, not applicable: "
          f"{len(NOT_APPLICABLE_SCRIPTS)}; slowest: {slowest.step.script} "
          f"{slowest.step.invocation} ({slowest.seconds:.0f} s)")

    assert broker.alive(), "the broker exited while the tools ran"
    wrong = [r for r in results
             if r.cls != MISSING and r.cls != EXPECTED[(r.step.script, r.step.invocation)]]
    assert not wrong, "classes differ from EXPECTED (update the table for an improvement):\n" + \
        "\n".join(f"{r.step.script} {r.step.invocation}: expected "
                  f"{EXPECTED[(r.step.script, r.step.invocation)]}, got {r.cls} ({r.evidence})\n"
                  f"{r.output}" for r in wrong)
