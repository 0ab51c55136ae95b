"""Clients other than test_cluster.py's load generator through random broker faults in cluster
mode: three kaas brokers SIGKILLed, paused past their Lease and restarted.

- A consumer group: an idempotent acks=all load, and member processes (tests/group_member.py:
  librdkafka with its defaults, at-least-once by construction) that are also SIGKILLed and
  replaced. At the end the group has consumed every acknowledged record, and every record
  below its final committed offsets: a committed offset past what some member processed is a
  record skipped after a failover. Both group protocols, with librdkafka members and with
  Apache Kafka Java consumer members.
- The Apache Kafka Java producer with its defaults: nothing lost, duplicated or reordered.

CI runs 45 s of faults each (30 s with the Java members); KAAS_LONG_TESTS=1 runs KAAS_CHAOS_SECONDS (default 240) with the
seed in KAAS_CHAOS_SEED."""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from kcluster import logs_on_failure
from kcluster import make_cluster  # noqa: F401  (the fixture)
from test_cluster import LONG, Load, create_topic, read_all
from test_power_loss import committed

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("KAAS_TEST_BOOTSTRAP")) or os.environ.get("KAAS_TEST_APACHE_KAFKA", "") not in ("", "0"),
    reason="cluster mode tests start their own kaas brokers")

TOPIC, PARTITIONS, GROUP = "grp", 12, "chaos-group"
MEMBER = Path(__file__).with_name("group_member.py")


class Members:
    """The group's member processes; each incarnation writes its own file."""

    def __init__(self, root: Path, bootstrap: str, protocol: str, java_classes: str | None = None):
        """librdkafka members (tests/group_member.py), or Java client members
        (tests/java/KaasClientCheck.java `member`) when given the Java classpath."""
        self.root, self.bootstrap, self.protocol = root, bootstrap, protocol
        self.java_classes = java_classes
        self.procs: dict[int, subprocess.Popen] = {}
        self.files: list[Path] = []

    def start(self, slot: int) -> None:
        out = self.root / f"member-{slot}-{len(self.files)}.txt"
        self.files.append(out)
        err = open(self.root / f"member-{slot}.err", "ab")
        if self.java_classes:
            cmd = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-cp", self.java_classes, "KaasClientCheck",
                   "member", self.bootstrap, GROUP, TOPIC, str(out), self.protocol]
        else:
            cmd = [sys.executable, str(MEMBER), self.bootstrap, GROUP, TOPIC, str(out), self.protocol]
        self.procs[slot] = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT, start_new_session=True)
        err.close()

    def kill(self, slot: int) -> None:
        self.procs[slot].kill()
        self.procs[slot].wait(10)

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)

    def consumed(self) -> dict[tuple[int, int], str]:
        """(partition, offset) -> value over every incarnation's output."""
        seen: dict[tuple[int, int], str] = {}
        for f in self.files:
            if not f.exists():
                continue
            for line in f.read_text().splitlines():
                parts = line.split(" ", 2)
                if len(parts) == 3:  # a SIGKILL can cut the last line
                    seen[(int(parts[0]), int(parts[1]))] = parts[2]
        return seen


def commit_start(bootstrap: str) -> None:
    """The group starts with offset 0 committed on every partition, so a member that finds no
    committed offset (auto.offset.reset=latest) can only mean the brokers lost it."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)], asynchronous=False)
    finally:
        c.close()


def broker_fault(c, rng: random.Random) -> tuple[str, int]:
    """One random broker fault, at least one broker left running: restart a dead one, SIGKILL
    one (or the controller), or pause one for up to 6 s (past its 3 s Lease)."""
    running = c.running()
    down = [n for n in c.nodes if not n.alive()]
    choices = ["restart"] * bool(down)
    if len(running) >= 2:
        choices += ["kill", "pause", "kill-controller"]
    choice = rng.choice(choices)
    if choice == "restart":
        n = rng.choice(down)
        n.start()
    elif choice in ("kill", "kill-controller"):
        n = (c.controller() if choice == "kill-controller" else None) or rng.choice(running)
        n.kill()
    else:
        n = rng.choice(running)
        n.pause()
        time.sleep(rng.uniform(0.5, 6.0))
        n.resume()
    return choice, n.id


def member_fault(members: Members, rng: random.Random) -> tuple[str, int]:
    """SIGKILL a member (what it consumed since its last commit is read again by whoever gets
    its partitions after its session times out) or stop it cleanly (it commits and leaves);
    either way a new member takes its slot."""
    slot = rng.randrange(3)
    if rng.random() < 0.5:
        members.kill(slot)
        choice = "kill-member"
    else:
        members.procs[slot].send_signal(signal.SIGTERM)
        try:
            members.procs[slot].wait(30)
        except subprocess.TimeoutExpired:
            members.kill(slot)
        choice = "replace-member"
    members.start(slot)
    return choice, slot


def chaos_cluster(make_cluster, what: str, ci_seconds: float = 45.0):
    """(seconds of faults, seed, its random source, a 3-broker cluster with the topic balanced)."""
    seconds = float(os.environ.get("KAAS_CHAOS_SECONDS", "240")) if LONG else ci_seconds
    seed = int(os.environ.get("KAAS_CHAOS_SEED", str(int(time.time()))))
    print(f"\n{what}: seed {seed}, {seconds:.0f}s of faults")
    c = make_cluster(3)
    create_topic(c.bootstrap(), TOPIC, PARTITIONS)
    c.wait_settled(PARTITIONS, balanced=True)
    return seconds, seed, random.Random(seed), c


def restart_all_and_settle(c) -> None:
    for n in c.nodes:
        if not n.alive():
            n.start()
    c.wait_all_ready(timeout=90)
    c.wait_settled(PARTITIONS, balanced=True, timeout=90)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
@logs_on_failure
def test_group_consumes_every_acknowledged_record_through_faults(make_cluster, tmp_path, protocol):
    group_chaos(make_cluster, tmp_path, protocol, None)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
@logs_on_failure
def test_java_group_consumes_every_acknowledged_record_through_faults(
        make_cluster, tmp_path, protocol, java_classes):
    """As the librdkafka test above, with the Apache Kafka Java consumer's defaults as members:
    its auto commit runs inside poll() and commits what the previous poll returned."""
    group_chaos(make_cluster, tmp_path, protocol, java_classes)


def group_chaos(make_cluster, tmp_path, protocol: str, java_classes: str | None) -> None:
    client = "java" if java_classes else "librdkafka"
    # The Java members get 30 s of faults in CI (45 s for librdkafka's), to keep CI's time.
    seconds, seed, rng, c = chaos_cluster(make_cluster, f"group chaos, {client} {protocol} protocol",
                                          30.0 if java_classes else 45.0)
    commit_start(c.bootstrap())
    members = Members(tmp_path, c.bootstrap(), protocol, java_classes)
    for slot in range(3):
        members.start(slot)
    load = Load(c.bootstrap(), TOPIC, PARTITIONS, "g").start()
    actions = []
    try:
        load.wait_acks(300)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            choice, what = member_fault(members, rng) if rng.random() < 0.4 else broker_fault(c, rng)
            actions.append((round(time.monotonic() - end + seconds, 1), choice, what))
            time.sleep(rng.uniform(1.0, 6.0))
        restart_all_and_settle(c)
        load.wait_acks_everywhere_since(time.monotonic(), timeout=90)
        load.stop()
        load.check_client_side()
        stored = read_all(c.bootstrap(), TOPIC, PARTITIONS)
        at = {(p, off): v.decode() for p, (_, recs) in stored.items() for off, v in recs}
        want = {k: v.decode() for k, v in load.acked.items()}
        assert all(at.get(k) == v for k, v in want.items()), "acknowledged records not stored"

        # The group catches up (bounded): every stored record consumed by some member.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = members.consumed()
            if all(k in got for k in at):
                break
            time.sleep(1)
        got = members.consumed()
        members.stop_all()
        final = committed(c.bootstrap(), GROUP, TOPIC, PARTITIONS)
        print(f"group chaos: {len(actions)} faults {actions}; {len(at)} stored, {len(got)} consumed"
              f" ({len(members.files)} member incarnations), committed {final}")

        wrong = [(k, v, at.get(k)) for k, v in got.items() if at.get(k) != v]
        assert not wrong, f"members consumed values that are not stored there: {wrong[:10]}"
        missing = sorted(k for k in want if k not in got)
        assert not missing, (f"{len(missing)} acknowledged records were never consumed by the group"
                             f" (skipped), e.g. {missing[:10]}")
        for p in range(PARTITIONS):
            low, recs = stored[p]
            high = low + len(recs)
            assert 0 <= final[p] <= high, f"partition {p}: committed {final[p]} outside [0, {high}]"
            below = [o for o in range(low, final[p]) if (p, o) not in got]
            assert not below, (f"partition {p}: offsets below the committed {final[p]} that no member"
                               f" consumed: {below[:10]}")
    except BaseException:
        sys.stderr.write(f"\ngroup chaos seed {seed}; faults so far: {actions}\n")
        raise
    finally:
        members.stop_all()
        load.abort()


@pytest.mark.timeout(1800)
@logs_on_failure
def test_java_producer_with_defaults_loses_and_reorders_nothing_through_faults(
        make_cluster, tmp_path, java_classes):
    """The Apache Kafka Java producer with its defaults (acks=all, idempotent, five requests in
    flight, 120 s delivery timeout; tests/java/KaasClientCheck.java `load`) writes through
    random broker kills and pauses: at the end nothing failed, every acknowledged record is
    stored at its acknowledged offset, no value is stored twice, and each partition holds its
    values in send order."""
    seconds, seed, rng, c = chaos_cluster(make_cluster, "java producer chaos")
    stop, out = tmp_path / "stop", tmp_path / "java-acks.txt"
    log = open(tmp_path / "java-load.log", "wb")
    proc = subprocess.Popen(
        ["java", "-Xmx512m", "-cp", java_classes, "KaasClientCheck", "load", c.bootstrap(), TOPIC,
         str(PARTITIONS), str(stop), str(out)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    actions = []
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.stat().st_size > 10_000):
            assert proc.poll() is None, (tmp_path / "java-load.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Java producer got no acknowledgement in 60 s"
            time.sleep(0.2)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            choice, what = broker_fault(c, rng)
            actions.append((round(time.monotonic() - end + seconds, 1), choice, what))
            time.sleep(rng.uniform(1.0, 6.0))
        restart_all_and_settle(c)
        time.sleep(3)
        stop.touch()
        assert proc.wait(180) == 0, (tmp_path / "java-load.log").read_text()[-3000:]
        sent = int(re.search(r"sent (\d+)", (tmp_path / "java-load.log").read_text()).group(1))
        acked: dict[tuple[int, int], str] = {}
        failed = []
        for line in out.read_text().splitlines():
            parts = line.split(" ", 3)
            if parts[0] == "E":
                failed.append(line)
            else:
                assert (int(parts[0]), int(parts[1])) not in acked, f"offset acknowledged twice: {line}"
                acked[(int(parts[0]), int(parts[1]))] = parts[2]
        print(f"java producer chaos: {len(actions)} faults {actions}; {sent} sent,"
              f" {len(acked)} acknowledged, {len(failed)} failed")
        assert not failed, f"{len(failed)} of {sent} records failed, e.g. {failed[:5]}"
        assert len(acked) == sent, f"{len(acked)} acknowledged of {sent} sent"

        stored = read_all(c.bootstrap(), TOPIC, PARTITIONS)
        at = {(p, off): v.decode() for p, (_, recs) in stored.items() for off, v in recs}
        wrong = [(k, v, at.get(k)) for k, v in acked.items() if at.get(k) != v]
        assert not wrong, f"{len(wrong)} acknowledged records missing or changed: {wrong[:10]}"
        dups = [v for v, n in Counter(at.values()).items() if n > 1]
        assert not dups, f"{len(dups)} values stored more than once, e.g. {dups[:5]}"
        for p, (_, recs) in stored.items():
            seqs = [int(v.decode().rsplit("-", 1)[1]) for _, v in recs]
            assert all(v.decode().startswith(f"j-{p}-") for _, v in recs), f"partition {p}: foreign values"
            assert seqs == sorted(seqs), (
                f"partition {p}: stored out of send order near offset"
                f" {next(i for i, (a, b) in enumerate(zip(seqs, seqs[1:])) if b < a)}")
    except BaseException:
        sys.stderr.write(f"\njava producer chaos seed {seed}; faults so far: {actions}\n")
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
