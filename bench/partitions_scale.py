#!/usr/bin/env python3
"""bench/partitions_scale.py — what many partitions cost a broker: memory per idle partition
and the time to serve again after a restart (issue 16's scale figures).

Starts one broker (kaas, or Apache Kafka 4.x through scripts/run-apache-kafka.sh) on a fresh
data directory, creates topics of 1,000 partitions each until there are N (Kafka's KRaft
controller refuses more than 10,000 partition records in one CreateTopics), then produces to
the partitions 1% at a time (a random permutation cut into 100 rounds, ten 1 KiB records to each partition of a
round, so every partition holds data and most are idle at any moment), and reports:

  - anonymous memory (RssAnon) and VmRSS after start, after the topic exists, and after every
    partition was written and left idle for 10 s; per partition: (after - start) / N;
  - the clean stop's duration (SIGTERM to exit);
  - after a restart on the same data: seconds until the port accepts connections, until
    Metadata lists all N partitions with a leader, and until a produce to a random partition is
    acknowledged, then the produce round trip to a random 1% of partitions.

Usage: bench/partitions_scale.py [--broker kaas|kafka] [--partitions N] [--workdir DIR]
                                 [--kaas-bin PATH] [--shards N] [--keep]
A benchmark: it reports figures and asserts nothing. Needs confluent-kafka (pip) and a release
kaas ($KAAS_BIN, default ~/.cache/kaas-target/release/kaas). Kafka's figure is RssAnon, which
with its -Xms1g heap counts the heap the JVM has touched, not only per-partition state; Kafka at
100,000 partitions needs vm.max_map_count raised (two index mappings per partition).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def java_pid(proc: subprocess.Popen) -> int:
    """Kafka's script execs java, so the child is the JVM itself."""
    return proc.pid


class Broker:
    def __init__(self, kind: str, workdir: Path, kaas_bin: str, shards: int):
        self.kind, self.workdir, self.kaas_bin, self.shards = kind, workdir, kaas_bin, shards
        self.port = free_port()
        self.data = workdir / f"{kind}-data"
        self.proc: subprocess.Popen | None = None
        self.log = open(workdir / f"{kind}.log", "ab")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> float:
        if self.kind == "kaas":
            cmd = [self.kaas_bin, "--listen", self.bootstrap, "--data-dir", str(self.data),
                   "--shards", str(self.shards), "--health-listen", f"127.0.0.1:{free_port()}"]
        else:
            cmd = [str(ROOT / "scripts/run-apache-kafka.sh"), str(self.port), str(self.data)]
        started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = started + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{self.kind} exited ({self.proc.returncode}); see {self.log.name}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return time.monotonic() - started
            except OSError:
                time.sleep(0.05)
        sys.exit(f"{self.kind} did not listen within 300 s")

    def stop(self) -> float:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - started

    def memory(self) -> tuple[float, float]:
        pid = java_pid(self.proc)
        return status_kib(pid, "RssAnon") / 1024, status_kib(pid, "VmRSS") / 1024


def all_led(bootstrap: str, topic: str, n: int, timeout: float) -> float:
    from confluent_kafka.admin import AdminClient
    a = AdminClient({"bootstrap.servers": bootstrap})
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            t = a.list_topics(topic, timeout=30).topics.get(topic)
            if t and t.error is None and len(t.partitions) == n and all(
                    p.leader >= 0 and p.error is None for p in t.partitions.values()):
                return time.monotonic() - started
        except Exception:  # noqa: BLE001 - still starting
            pass
        time.sleep(0.2)
    raise SystemExit(f"{topic}: not all {n} partitions led within {timeout} s")


def produce_round(bootstrap: str, targets: list[tuple[str, int]], records: int = 10) -> float:
    from confluent_kafka import Producer
    failed = []
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "enable.idempotence": True, "message.timeout.ms": 120000})
    value = b"x" * 1024
    started = time.monotonic()
    for topic, part in targets:
        for _ in range(records):
            while True:
                try:
                    p.produce(topic, value, partition=part,
                              on_delivery=lambda e, m: e and failed.append(e))
                    break
                except BufferError:
                    p.poll(0.05)
    left = p.flush(180)
    if left or failed:
        raise SystemExit(f"{left} undelivered, {len(failed)} failed: {failed[:3]}")
    return time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", choices=("kaas", "kafka"), default="kaas")
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--workdir")
    ap.add_argument("--kaas-bin", default=os.environ.get(
        "KAAS_BIN", str(Path.home() / ".cache/kaas-target/release/kaas")))
    ap.add_argument("--shards", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="kaas-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    n = a.partitions
    per_topic = min(n, 1000)
    topics = [f"scale-{i}" for i in range((n + per_topic - 1) // per_topic)]
    sizes = {t: min(per_topic, n - i * per_topic) for i, t in enumerate(topics)}
    every = [(t, p) for t in topics for p in range(sizes[t])]
    b = Broker(a.broker, workdir, a.kaas_bin, a.shards)
    rows = []

    def report(what, value):
        rows.append((what, value))
        print(f"{a.broker} {n} partitions: {what}: {value}", flush=True)

    try:
        if a.broker == "kaas" and not os.access(a.kaas_bin, os.X_OK):
            sys.exit(f"no kaas binary at {a.kaas_bin}: build it (cargo build --release -p kaas) "
                     "or set KAAS_BIN / --kaas-bin")
        b.start()
        from confluent_kafka.admin import AdminClient, NewTopic
        time.sleep(2)
        anon0, rss0 = b.memory()
        report("RssAnon / VmRSS MiB after start", f"{anon0:.0f} / {rss0:.0f}")
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        started = time.monotonic()
        for t in topics:
            admin.create_topics([NewTopic(t, num_partitions=sizes[t], replication_factor=1)],
                                request_timeout=600)[t].result(600)
        report("CreateTopics s", f"{time.monotonic() - started:.1f}")
        started = time.monotonic()
        for t in topics:
            all_led(b.bootstrap, t, sizes[t], 600)
        report("every partition led, s after CreateTopics", f"{time.monotonic() - started:.1f}")
        anon1, rss1 = b.memory()
        report("RssAnon / VmRSS MiB with the topic", f"{anon1:.0f} / {rss1:.0f}")
        order = list(every)
        random.Random(16).shuffle(order)
        step = max(1, n // 100)
        started = time.monotonic()
        for i in range(0, n, step):
            produce_round(b.bootstrap, order[i:i + step])
        report("produce to every partition, 1% at a time, s", f"{time.monotonic() - started:.1f}")
        time.sleep(10)
        anon2, rss2 = b.memory()
        report("RssAnon / VmRSS MiB, every partition written, idle 10 s", f"{anon2:.0f} / {rss2:.0f}")
        report("anonymous KiB per partition", f"{(anon2 - anon0) * 1024 / n:.1f}")
        del admin  # no client reconnecting to the stopped broker
        report("clean stop s", f"{b.stop():.1f}")
        report("restart: listening s", f"{b.start():.1f}")
        started = time.monotonic()
        for t in topics:
            all_led(b.bootstrap, t, sizes[t], 600)
        report("restart: every partition led, s after listening", f"{time.monotonic() - started:.1f}")
        report("restart: then a new idempotent producer's first write acknowledged, s after listening",
               f"{time.monotonic() - started + produce_round(b.bootstrap, [random.choice(every)], 1):.1f}")
        report("restart: produce to a random 1% of partitions, s",
               f"{produce_round(b.bootstrap, random.sample(every, step)):.1f}")
        anon3, rss3 = b.memory()
        report("RssAnon / VmRSS MiB after the restart", f"{anon3:.0f} / {rss3:.0f}")
        b.stop()
    finally:
        if b.proc and b.proc.poll() is None:
            b.proc.kill()
        if not a.keep:
            shutil.rmtree(b.data, ignore_errors=True)
    print("\n| figure | value |\n|---|---:|")
    for what, value in rows:
        print(f"| {what} | {value} |")


if __name__ == "__main__":
    main()
