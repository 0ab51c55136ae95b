"""Bounded under hostile conditions (issue 13, item 1): request memory is reserved as bytes
arrive, within a broker-wide budget; a request body that stops arriving and an idle connection
are closed; --max-connections and --max-connections-per-ip behave like Kafka's max.connections
and max.connections.per.ip; accept backs off when the broker is out of file descriptors.

Every test starts its own kaas with the flags it needs (broker_factory) and checks what a user
or operator would: other clients keep working, memory stays bounded, the counters in /metrics
say what happened."""
from __future__ import annotations

import os
import re
import resource
import socket
import struct
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import kwire

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("KAAS_TEST_BOOTSTRAP")) or os.environ.get("KAAS_TEST_APACHE_KAFKA", "") not in ("", "0"),
    reason="starts kaas with custom limits")


def metric(broker, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(broker.health_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    pat = "^" + re.escape(name) + (re.escape("{" + labels + "}") if labels else r"(?:\{[^}]*\})?") + r" (\S+)$"
    values = [float(m.group(1)) for m in re.finditer(pat, text, re.M)]
    assert values, f"{name}{{{labels}}} not in /metrics"
    return sum(values)


def raise_own_fd_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= n, "the test needs more file descriptors"


def produce_and_consume(broker, topic: str, n: int, timeout_s: float = 60.0) -> float:
    """Produces n records (acks=all) and reads them back; returns the seconds it took."""
    started = time.monotonic()
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode())
        p.poll(0)
    assert p.flush(timeout_s) == 0, "records not acknowledged in time"
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    deadline = time.monotonic() + timeout_s
    while got < n and time.monotonic() < deadline:
        for m in c.consume(1000, 0.5):
            assert not m.error(), m.error()
            got += 1
    c.close()
    assert got == n, f"read back {got} of {n}"
    return time.monotonic() - started


def test_trickled_huge_frames_hold_no_memory_and_are_closed(broker_factory):
    """1,000 connections each declare a 100 MB request and then send one byte a second. The
    broker's resident memory grows by a few MB, not 100 GB or its 256 MiB budget; other clients
    keep producing and fetching meanwhile; each trickling connection is closed once its body
    stops arriving (--request-progress-timeout-ms), and /metrics counts them."""
    n = 1000
    raise_own_fd_limit(n + 200)
    b = broker_factory(extra_args=["--request-progress-timeout-ms", "8000"])
    rss_before = b.status_kib("VmRSS")
    socks = []
    header = struct.pack(">i", 100 * 1024 * 1024) + kwire.request(0, 3, 1, b"")[4:]
    for _ in range(n):
        s = socket.create_connection((b.host, b.port), timeout=10)
        s.sendall(header)
        socks.append(s)
    stop = threading.Event()

    def trickle():
        while not stop.is_set():
            for s in socks:
                try:
                    s.send(b"\0")
                except OSError:
                    pass
            stop.wait(1.0)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        took = produce_and_consume(b, "alongside", 2000)
        time.sleep(3)
        rss_during = b.status_kib("VmRSS")
        reserved = metric(b, "kaas_request_memory_bytes")
        # Then they stop making progress: all closed within the timeout plus slack.
        deadline = time.monotonic() + 30
        stalled = 'reason="request_stalled"'
        while (closed := metric(b, "kaas_connections_closed_total", stalled)) < n:
            assert time.monotonic() < deadline, (
                f"only {closed:.0f} of {n} trickling connections closed 30 s after they stalled")
            time.sleep(0.5)
    finally:
        stop.set()
        t.join(5)
        for s in socks:
            s.close()
    peak = b.status_kib("VmHWM")
    print(f"\n{n} connections trickling 100 MB frames: RSS {rss_before // 1024} MiB before,"
          f" {rss_during // 1024} MiB during, peak {peak // 1024} MiB; request memory reserved"
          f" {reserved / 2**20:.1f} MiB; 2,000 records produced and read alongside in {took:.1f} s")
    assert (peak - rss_before) < 96 * 1024, f"resident memory grew by {(peak - rss_before) // 1024} MiB"
    assert reserved <= 8 * 1024 * 1024, f"{reserved} bytes of request memory reserved by trickling connections"
    assert metric(b, "kaas_request_memory_bytes") == 0
    # And the broker still serves.
    assert kwire.api_versions(b)


def test_request_memory_budget_pushes_back_instead_of_allocating(broker_factory):
    """With a 4 MiB budget, 8 connections each sending a 3 MiB Produce at once: the broker never
    reserves more than the budget (the connections wait their turn — counted in /metrics) and
    every request is still answered."""
    b = broker_factory(max_frame_bytes=4 << 20, extra_args=["--queued-max-request-bytes", str(4 << 20)])
    ranges = kwire.api_versions(b)
    version = kwire.pick_produce_version(ranges)
    batch = kwire.record_batch([(None, b"x" * (3 << 20))])
    frame = kwire.produce_request(version, 7, "budget", 0, batch)
    socks = [kwire.connect(b) for _ in range(8)]
    peak = 0
    done = threading.Event()

    def watch():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, metric(b, "kaas_request_memory_bytes"))
            time.sleep(0.01)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    senders = [threading.Thread(target=s.sendall, args=(frame,)) for s in socks]
    for t in senders:
        t.start()
    answers = []
    for s in socks:
        s.settimeout(60)
        answers.append(kwire.parse_produce_response(version, kwire.recv_frame(s)))
    for t in senders:
        t.join(10)
    done.set()
    w.join(5)
    for s in socks:
        s.close()
    errors = [a for a in answers if a[2] not in (0,)]
    assert not errors, f"produce errors: {errors}"
    assert peak <= 4 << 20, f"{peak} bytes of request memory reserved, budget 4 MiB"
    assert metric(b, "kaas_request_memory_waits_total") >= 1, "no connection ever waited for memory"
    print(f"\n8 x 3 MiB produce through a 4 MiB budget: peak reserved {peak / 2**20:.2f} MiB,"
          f" {metric(b, 'kaas_request_memory_waits_total'):.0f} waits, all answered")


def test_idle_connections_are_closed(broker_factory):
    """connections.max.idle.ms: a connection with no request for that long is closed; one that
    keeps sending requests stays open."""
    b = broker_factory(extra_args=["--connections-max-idle-ms", "2000"])
    idle = kwire.connect(b)
    busy = kwire.connect(b)
    started = time.monotonic()
    for i in range(6):
        busy.sendall(kwire.request(18, 0, i, b""))
        kwire.recv_frame(busy)
        time.sleep(0.5)
    kwire.wait_closed(idle, timeout=5)
    assert time.monotonic() - started >= 1.9
    busy.sendall(kwire.request(18, 0, 99, b""))
    assert kwire.recv_frame(busy)
    assert metric(b, "kaas_connections_closed_total", 'reason="idle"') >= 1
    idle.close()
    busy.close()


def test_max_connections_per_ip_closes_the_excess(broker_factory):
    """max.connections.per.ip: the 6th connection from 127.0.0.1 is closed at once, another
    address (127.0.0.2) still gets in, and a slot freed is usable again."""
    b = broker_factory(extra_args=["--max-connections-per-ip", "5"])
    kept = [kwire.connect(b) for _ in range(5)]
    for s in kept:
        s.sendall(kwire.request(18, 0, 1, b""))
        assert kwire.recv_frame(s)
    extra = kwire.connect(b)
    extra.sendall(kwire.request(18, 0, 2, b""))
    assert kwire.closed_or_response(extra, timeout=5) is None, "the 6th connection was served"
    extra.close()
    # Another source address on loopback.
    other = socket.socket()
    other.bind(("127.0.0.2", 0))
    other.settimeout(5)
    other.connect((b.host, b.port))
    other.sendall(kwire.request(18, 0, 3, b""))
    assert kwire.recv_frame(other)
    other.close()
    kept.pop().close()
    deadline = time.monotonic() + 5
    while True:
        s = kwire.connect(b)
        s.sendall(kwire.request(18, 0, 4, b""))
        if kwire.closed_or_response(s, timeout=5) is not None:
            s.close()
            break
        s.close()
        assert time.monotonic() < deadline, "a freed slot was not given back"
        time.sleep(0.1)
    assert metric(b, "kaas_connections_closed_total", 'reason="max_connections_per_ip"') >= 1
    for s in kept:
        s.close()


def test_max_connections_makes_new_ones_wait(broker_factory):
    """max.connections: at the limit a new connection waits (it is not refused) and is served as
    soon as another closes."""
    b = broker_factory(extra_args=["--max-connections", "4"])
    kept = [kwire.connect(b) for _ in range(4)]
    for s in kept:
        s.sendall(kwire.request(18, 0, 1, b""))
        assert kwire.recv_frame(s)
    waiting = kwire.connect(b)
    waiting.sendall(kwire.request(18, 0, 2, b""))
    waiting.settimeout(1.5)
    with pytest.raises(socket.timeout):
        waiting.recv(4)
    kept.pop().close()
    waiting.settimeout(5)
    assert kwire.recv_frame(waiting), "the waiting connection was not served after a slot freed"
    assert metric(b, "kaas_accept_paused_total") >= 1
    waiting.close()
    for s in kept:
        s.close()


def test_out_of_file_descriptors_backs_off_and_recovers(broker_factory, tmp_path):
    """With a hard limit of 256 open files, 400 connections: accept fails with EMFILE, the broker
    backs off and logs it a few times (not a line per attempt), and once the flood closes it
    answers ApiVersions again."""
    raise_own_fd_limit(600)

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    b = broker_factory(preexec_fn=limit)
    assert metric(b, "kaas_fd_limit") == 256
    assert 0 < metric(b, "kaas_open_fds") < 256
    socks = []
    for _ in range(400):
        try:
            socks.append(socket.create_connection((b.host, b.port), timeout=2))
        except OSError:
            break
    time.sleep(3)
    for s in socks:
        s.close()
    deadline = time.monotonic() + 15
    while True:
        try:
            assert kwire.api_versions(b)
            break
        except (OSError, kwire.Closed, AssertionError):
            assert time.monotonic() < deadline, "no ApiVersions answer after the flood closed"
            time.sleep(0.2)
    log = b.log_path.read_text(errors="replace")
    lines = log.count("accepting a connection failed")
    print(f"\n400 connections at a 256-file limit: {lines} accept-failure log lines")
    assert lines <= 10, f"{lines} accept-failure lines in the log"


def test_a_flood_of_bad_frames_writes_little_log(broker_factory):
    """Issue 13, item 5: 5,000 connections each sending a malformed frame (a negative length,
    an oversized one, an unknown API) are all refused and counted in /metrics, and the log grows
    by a few kilobytes (a line per cause per 10 s with the count suppressed), not a line each."""
    b = broker_factory()
    before = b.log_path.stat().st_size
    errors_before = metric(b, "kaas_protocol_errors_total")
    frames = [struct.pack(">i", -5), struct.pack(">i", 1 << 30),
              kwire.request(9999, 0, 1, b"")]
    for i in range(5000):
        with socket.create_connection((b.host, b.port), timeout=5) as s:
            s.sendall(frames[i % len(frames)])
            try:
                s.recv(64)
            except OSError:
                pass
    grown = b.log_path.stat().st_size - before
    refused = metric(b, "kaas_protocol_errors_total") - errors_before
    print(f"\n5,000 malformed frames: {refused:.0f} counted, log grew {grown} bytes")
    assert refused >= 4900, f"only {refused} of 5,000 malformed frames counted"
    assert grown < 20_000, f"the log grew by {grown} bytes"
    assert kwire.api_versions(b)


@pytest.mark.timeout(600)
def test_more_partitions_than_file_descriptors(broker_factory):
    """50,000 partitions with an open-file limit of 4,096: producing to and fetching from 5,000
    random ones keeps the open segment files within the broker's budget (idle logs are closed
    and reopened on use), every record comes back, and ApiVersions is answered throughout."""
    from kcheck import create_topic
    raise_own_fd_limit(8192)

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))

    b = broker_factory(preexec_fn=limit)
    assert metric(b, "kaas_fd_limit") == 4096
    create_topic(b.bootstrap, "wide", 50_000, timeout=120)
    stop = threading.Event()
    unanswered: list[str] = []

    def probe():
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                assert kwire.api_versions(b)
            except Exception as e:  # noqa: BLE001 — any failure to answer is what we look for
                unanswered.append(f"{type(e).__name__}: {e}")
            time.sleep(max(0.0, 0.2 - (time.monotonic() - t0)))

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    rng = __import__("random").Random(4096)
    chosen = rng.sample(range(50_000), 5_000)
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
    for i, part in enumerate(chosen):
        p.produce("wide", value=f"v-{part}".encode(), partition=part)
        if i % 200 == 0:
            p.poll(0)
    assert p.flush(240) == 0, "records still unacknowledged"
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "wide-check",
                  "enable.auto.commit": False, "enable.partition.eof": False})
    try:
        c.assign([TopicPartition("wide", part, 0) for part in chosen])
        got: dict[int, bytes] = {}
        deadline = time.monotonic() + 240
        while len(got) < len(chosen) and time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                assert not m.error(), m.error()
                got[m.partition()] = m.value()
    finally:
        c.close()
        stop.set()
        t.join(10)
    missing = [part for part in chosen if got.get(part) != f"v-{part}".encode()]
    with urllib.request.urlopen(b.health_url + "/healthz", timeout=5) as r:
        limits = __import__("json").loads(r.read())["limits"]
    files, budget = limits["log_files_open"], limits["max_open_log_files"]
    evicted = metric(b, "kaas_logs_evicted_total")
    log = b.log_path.read_text(errors="replace")
    emfile = log.count("Too many open files")
    print(f"\n50,000 partitions, fd limit 4096: {files:.0f} segment files open (budget {budget}),"
          f" {evicted:.0f} idle logs closed, fds {limits['open_fds']}/{limits['fd_limit']},"
          f" {len(unanswered)} ApiVersions unanswered, {emfile} EMFILE lines")
    assert not missing, f"{len(missing)} of {len(chosen)} records not read back, e.g. {missing[:5]}"
    assert files <= budget, (files, budget)
    assert evicted > 0, "5,000 logs at a budget below that: some must have been closed"
    assert not unanswered, unanswered[:5]
    assert emfile == 0, "the broker ran out of file descriptors"


def test_segments_that_roll_on_every_batch_cannot_exhaust_descriptors(broker_factory):
    """segment.bytes below Kafka 4's 1 MiB minimum is refused as Kafka refuses it (100-byte
    segments once ran a broker out of file descriptors in a minute: each segment holds one
    while its log is open). segment.ms=1 is legal and rolls on every batch: past its share of
    --max-open-log-files the partition's active segment grows instead, said once in the log,
    and every record is read back in order, before and after a restart."""
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, NewTopic)
    from kcheck import create_topic
    b = broker_factory(shards=1, extra_args=["--max-open-log-files", "64"])
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    with pytest.raises(Exception) as refused:
        a.create_topics([NewTopic("tiny", 1, 1, config={"segment.bytes": "100"})])["tiny"].result(15)
    assert "INVALID_CONFIG" in str(refused.value) and "1048576" in str(refused.value), refused.value
    create_topic(b.bootstrap, "rolls", 1, {"segment.ms": "1"})
    resource_ = ConfigResource("topic", "rolls", incremental_configs=[
        ConfigEntry("segment.bytes", "100", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(Exception) as refused:
        a.incremental_alter_configs([resource_])[resource_].result(15)
    assert "1048576" in str(refused.value), refused.value

    n = 400
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(n):
        p.produce("rolls", value=f"r-{i:05d}".encode(), partition=0)
        assert p.flush(15) == 0  # one batch per request
        time.sleep(0.002)  # older than segment.ms=1 by the next batch

    def read_back() -> list[bytes]:
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "rolls-check",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        try:
            c.assign([TopicPartition("rolls", 0, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 60
            while len(got) < n and time.monotonic() < deadline:
                for m in c.consume(1000, 1.0):
                    assert not m.error(), m.error()
                    got.append(m.value())
            return got
        finally:
            c.close()

    want = [f"r-{i:05d}".encode() for i in range(n)]
    assert read_back() == want
    [pdir] = [d for d in b.data_dir.iterdir() if d.name.startswith("rolls~")]
    segments = len(list((pdir / "0").glob("*.log")))
    log = b.log_path.read_text(errors="replace")
    said = log.count("as many segment files as one log may hold open")
    print(f"\n{n} batches at segment.ms=1, --max-open-log-files 64: {segments} segment files")
    assert segments == 32, f"{segments} segment files: one log may hold half the shard's 64"
    time.sleep(1.5)  # /healthz is published every second
    with urllib.request.urlopen(b.health_url + "/healthz", timeout=5) as r:
        reported = __import__("json").loads(r.read())["limits"]["log_files_open"]
    assert reported == 32, f"/healthz counts {reported} open segment files, not the 32 rolls made"
    assert said == 1, f"the cap was reported {said} times"
    assert "Too many open files" not in log
    b.restart()
    assert read_back() == want


def test_partitions_that_grow_by_rolling_are_brought_back_within_the_budget(broker_factory):
    """Eight partitions rolling on every batch (segment.ms=1) grow to 32 segment files each
    under --max-open-log-files 64 on one shard: 256 open, four times the budget. Opening a log
    makes room only for what it opens, so the periodic pass closes idle logs until the shard
    is within its budget again; `/healthz` counts the files rolls added, and every record is
    read back in order (closed logs reopen)."""
    import json
    from kcheck import create_topic
    b = broker_factory(shards=1, extra_args=["--max-open-log-files", "64",
                                             "--retention-check-interval-ms", "500"])
    create_topic(b.bootstrap, "rolls8", 8, {"segment.ms": "1"})
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 0})
    rounds = 40
    for i in range(rounds):
        for part in range(8):
            p.produce("rolls8", value=f"{part}-{i:04d}".encode(), partition=part)
        assert p.flush(15) == 0  # one batch per partition per round
        time.sleep(0.002)
    limits = lambda: json.loads(urllib.request.urlopen(b.health_url + "/healthz", timeout=5).read())["limits"]  # noqa: E731
    on_disk = sum(len(list((d / str(part)).glob("*.log")))
                  for d in b.data_dir.iterdir() if d.name.startswith("rolls8~") for part in range(8))

    def segment_fds() -> int:  # what the process really holds, whatever it reports
        n = 0
        for fd in Path(f"/proc/{b.proc.pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            n += "/rolls8~" in target and target.endswith(".log")
        return n
    before = (segment_fds(), limits()["log_files_open"])
    deadline = time.monotonic() + 20
    while (segment_fds() > 64 or limits()["log_files_open"] > 64) and time.monotonic() < deadline:
        time.sleep(0.2)
    now = limits()
    print(f"\n8 partitions at segment.ms=1: {on_disk} segment files on disk; right after producing"
          f" {before[0]} open, reported {before[1]}; then {segment_fds()} open, reported"
          f" {now['log_files_open']} (budget {now['max_open_log_files']})")
    assert on_disk == 8 * 32, on_disk
    assert segment_fds() <= 64 and now["log_files_open"] <= 64, (segment_fds(), now)
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "rolls8-check",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    got: dict[int, list[bytes]] = {part: [] for part in range(8)}
    try:
        c.assign([TopicPartition("rolls8", part, 0) for part in range(8)])
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < 8 * rounds and time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                assert not m.error(), m.error()
                got[m.partition()].append(m.value())
    finally:
        c.close()
    assert got == {part: [f"{part}-{i:04d}".encode() for i in range(rounds)] for part in range(8)}
