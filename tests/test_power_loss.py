"""Power loss, not only process death: kaas runs on kaas-lazyfs (lazyfs/), a FUSE file system
that keeps everything written but not fsynced in its daemon's memory, and the test cuts the
power — SIGKILL of kaas and of the daemon, a forced unmount, a fresh daemon that loads only
what was synced. A plain SIGKILL keeps the page cache and so never tests fsync discipline.

kaas runs with `--sync-scope file`: a `syncfs` never reaches a FUSE server (see lazyfs/src/lib.rs),
so the default scope cannot be tested on this file system.

Environment: KAAS_LONG_TESTS=1 runs 50 rounds instead of 3 (KAAS_POWER_ROUNDS overrides);
KAAS_POWER_SEED seeds the cut moments."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from conftest import Broker, kaas_bin, report
from kcluster import Cluster
from test_storage_durability import create_topic, read_all

LONG = os.environ.get("KAAS_LONG_TESTS") == "1"
ROUNDS = int(os.environ.get("KAAS_POWER_ROUNDS", "50" if LONG else "3"))
CLUSTER_ROUNDS = int(os.environ.get("KAAS_POWER_CLUSTER_ROUNDS", "10" if LONG else "2"))
MOUNT_TIMEOUT_S = 10.0
SYNC_SCOPE = ["--sync-scope", "file"]


def lazyfs_bin() -> Path:
    return kaas_bin().parent / "kaas-lazyfs"


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to mount FUSE without fusermount"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (no FUSE in this kernel or container)"
    if not lazyfs_bin().exists():
        return f"kaas-lazyfs not built at {lazyfs_bin()} (cargo build --release -p kaas-lazyfs)"
    if not shutil.which("umount"):
        return "umount (util-linux) is missing"
    return None


pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


def mounted(path: Path) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


class LazyFs:
    """A kaas-lazyfs mount whose power can be cut: the daemon is SIGKILLed, the mount forcibly
    detached (so the kernel's page cache for it is gone with it), and a fresh daemon loads only
    the durable state from the backing directory."""

    def __init__(self, root: Path):
        self.backing = root / "backing"
        self.mnt = root / "mnt"
        self.log_path = root / "lazyfs.log"
        # While this file exists, the next fsync of a file fails with EIO and loses that file's
        # unsynced pages (see `fail_next_fsync`).
        self.fail_trigger = root / "fail-next-fsync"
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.cuts = 0

    def mount(self) -> None:
        assert not mounted(self.mnt), f"{self.mnt} is still mounted"
        log = open(self.log_path, "ab")
        log.write(f"===== mount #{self.cuts + 1}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            [str(lazyfs_bin()), "--backing", str(self.backing),
             "--fail-fsync-trigger", str(self.fail_trigger), str(self.mnt)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not mounted(self.mnt):
            if self.proc.poll() is not None:
                raise RuntimeError(f"kaas-lazyfs exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"kaas-lazyfs not mounted after {MOUNT_TIMEOUT_S}s:\n{self.log_tail()}")
            time.sleep(0.02)

    def _detach(self) -> None:
        if mounted(self.mnt):
            # Lazy: a dead daemon's mount answers ENOTCONN and cannot be unmounted normally.
            subprocess.run(["umount", "-l", str(self.mnt)], check=False, timeout=30,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def durable_dir(self, name: str) -> Path:
        """A directory at the mount's root, made durable (mkdir + fsync of the root) as an
        operator's data directory is before kaas ever starts."""
        path = self.mnt / name
        path.mkdir()
        fd = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return path

    def fail_next_fsync(self) -> None:
        """A disk error during write-back: the next fsync of a file fails with EIO, and what
        was written to that file since its last sync never reaches the disk (it reads back as
        a hole). The fsync after it succeeds, as on Linux, which reports the error once."""
        self.fail_trigger.touch()

    def fsync_fault_pending(self) -> bool:
        return self.fail_trigger.exists()

    def cut(self) -> None:
        """The power cut. Whatever kaas had not synced is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._detach()
        self.cuts += 1

    def close(self) -> None:
        self.cut()

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except FileNotFoundError:
            return ""


@pytest.fixture
def lazyfs(tmp_path):
    fs = LazyFs(tmp_path / "lazyfs")
    fs.mount()
    try:
        yield fs
    finally:
        fs.close()
        warnings = [line for line in fs.log_tail(100000).splitlines() if "WARN" in line or "ERROR" in line]
        if warnings:
            print("kaas-lazyfs warnings:\n" + "\n".join(warnings[-20:]))


class IdempotentLoad:
    """One idempotent acks=all producer that lives through every cut: batches in flight when the
    power goes are retried after the restart under the same producer id and sequence numbers,
    so the broker must recognise those it stored (and synced) before the cut."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.acked: dict[tuple[int, int], bytes] = {}
        self.errors: list[str] = []
        self.twice: list[tuple[tuple[int, int], bytes, bytes]] = []
        self.i = 0
        self.p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                           "linger.ms": 2, "message.timeout.ms": 120000, "retries": 1000000,
                           "reconnect.backoff.max.ms": 500})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _on_delivery(self, err, msg):
        if err is not None:
            self.errors.append(str(err))
            return
        key = (msg.partition(), msg.offset())
        if key in self.acked:
            # Raising here would kill the producer thread; the test reports it at the end.
            self.twice.append((key, self.acked[key], msg.value()))
        self.acked[key] = msg.value()

    def _run(self):
        while not self._stop.is_set():
            if len(self.p) < 2000:
                v = f"idem-{self.i}".encode()
                self.p.produce(self.topic, key=v, value=v, on_delivery=self._on_delivery)
                self.i += 1
            self.p.poll(0.001)

    def start(self):
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def pause(self):
        self._stop.set()
        if self._thread:
            self._thread.join(30)

    def flush(self, timeout: float) -> int:
        return self.p.flush(timeout)


def plain_load(bootstrap: str, topic: str, tag: str, acked: dict, stop: threading.Event) -> None:
    """librdkafka's defaults without idempotence, and no retries (a retry would be allowed to
    store a record twice), until `stop`."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                  "retries": 0, "linger.ms": 2, "message.timeout.ms": 3000})

    def on_delivery(err, msg):
        if err is None:
            acked[(msg.partition(), msg.offset())] = msg.value()
    i = 0
    while not stop.is_set():
        try:
            v = f"{tag}-{i}".encode()
            p.produce(topic, key=v, value=v, on_delivery=on_delivery)
            i += 1
        except BufferError:
            pass
        p.poll(0.001)
    p.flush(6)


def check_log(stored: dict, acked: dict, partitions: int) -> None:
    """Every acknowledged record at its acknowledged offset, none stored twice, no gap."""
    missing = {k: v for k, v in acked.items() if stored.get(k) != v}
    assert not missing, (f"{len(missing)} of {len(acked)} acknowledged records lost or changed after a"
                         f" power cut, e.g. {sorted(missing.items())[:5]}")
    values = list(stored.values())
    assert len(values) == len(set(values)), "a record is stored twice"
    for p in range(partitions):
        offsets = sorted(o for (pp, o) in stored if pp == p)
        if offsets:
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), f"partition {p} has a gap"


def check_idempotent_order(acked: dict) -> None:
    """Within a partition, the idempotent producer's records sit in the order it sent them."""
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for (p, off), v in acked.items():
        if v.startswith(b"idem-"):
            by_partition.setdefault(p, []).append((off, int(v[5:])))
    for p, rows in by_partition.items():
        seq = [i for _, i in sorted(rows)]
        assert seq == sorted(seq), f"partition {p}: idempotent records out of order"


def commit_until(bootstrap: str, group: str, topic: str, partitions: int, stop: threading.Event,
                 acked: dict, tried: dict) -> None:
    """Commits ever higher offsets; `acked` keeps the last one the coordinator confirmed."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "socket.timeout.ms": 3000})
    try:
        n = max(list(tried.values()) + [0])
        while not stop.is_set():
            n += 1
            tps = [TopicPartition(topic, p, n) for p in range(partitions)]
            for tp in tps:
                tried[tp.partition] = n
            try:
                res = c.commit(offsets=tps, asynchronous=False)
            except KafkaException:
                continue
            for tp in res:
                if tp.error is None:
                    acked[tp.partition] = tp.offset
            time.sleep(0.02)
    finally:
        c.close()


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return {tp.partition: tp.offset for tp in
                c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)}
    finally:
        c.close()


def test_power_cut_single_node_keeps_every_acknowledged_write(lazyfs, tmp_path):
    """After power cuts at random moments under acks=all load and offset commits, kaas on the
    cut file system starts, and keeps every acknowledged record and committed offset."""
    rng = random.Random(int(os.environ.get("KAAS_POWER_SEED", "13")))
    t0 = time.monotonic()
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker", extra_args=SYNC_SCOPE)
    broker.data_dir = lazyfs.durable_dir("data")
    topic, partitions, group = "power", 2, "power-offsets"
    acked: dict[tuple[int, int], bytes] = {}
    commits_acked: dict[int, int] = {}
    commits_tried: dict[int, int] = {}
    try:
        broker.start()
        create_topic(broker.bootstrap, topic, partitions)
        idem = IdempotentLoad(broker.bootstrap, topic)
        for r in range(ROUNDS):
            if r > 0:
                lazyfs.mount()
                broker.start()
            stop = threading.Event()
            threads = [
                threading.Thread(target=plain_load, args=(broker.bootstrap, topic, f"r{r}", acked, stop)),
                threading.Thread(target=commit_until, args=(broker.bootstrap, group, topic, partitions, stop,
                                                            commits_acked, commits_tried)),
            ]
            for t in threads:
                t.start()
            idem.start()
            time.sleep(rng.uniform(0.5, 2.0))
            broker.kill()
            lazyfs.cut()
            stop.set()
            idem.pause()
            for t in threads:
                t.join(60)
        # The last remount: the idempotent producer's unacknowledged batches are retried now.
        lazyfs.mount()
        broker.start()
        idem.start()
        time.sleep(1.0)
        idem.pause()
        assert not idem.twice, (f"{len(idem.twice)} offsets acknowledged to two records: an acknowledged"
                                f" record was lost in a cut, e.g. {idem.twice[:3]}")
        assert idem.flush(60) == 0, "idempotent records still unacknowledged 60 s after the restart"
        acked.update(idem.acked)
        stored = read_all(broker.bootstrap, topic, partitions)
        check_log(stored, acked, partitions)
        check_idempotent_order(idem.acked)
        got = committed(broker.bootstrap, group, topic, partitions)
        for p, off in commits_acked.items():
            assert off <= got.get(p, -1) <= commits_tried[p], \
                f"partition {p}: committed offset {got.get(p)} after the cuts, {off} was acknowledged"
        idem_values = [v for v in stored.values() if v.startswith(b"idem-")]
        dt = time.monotonic() - t0
        report(f"power loss, single node: {ROUNDS} cuts, {len(acked)} records acknowledged"
               f" ({len(idem.acked)} idempotent), 0 lost, {len(stored)} stored ({len(idem_values)} idempotent),"
               f" {len(commits_acked)} partitions' commits kept, {dt:.0f} s")
        assert len(acked) > ROUNDS * 50, "the load was too light to prove anything"
    finally:
        broker.close()


def newest_version(dir_: Path, stem: str) -> tuple[int, dict] | None:
    """The newest `<stem>.<n>.json` of a version chain (control/src/chain.rs), parsed."""
    best = None
    for f in dir_.glob(f"{stem}.*.json"):
        middle = f.name[len(stem) + 1:-len(".json")]
        if middle.isdigit() and (best is None or int(middle) > best[0]):
            best = (int(middle), f)
    if best is None:
        return None
    text = best[1].read_text()
    try:
        return best[0], json.loads(text)
    except ValueError:
        raise AssertionError(f"{best[1]} is not valid JSON after a power cut: {text[:200]!r}")


def test_power_cut_whole_cluster_keeps_lease_assignment_and_records(lazyfs, tmp_path):
    """Three brokers on one cut file system lose power together: the file Lease and
    assignment.json are not rolled back below what the brokers had acknowledged, and every
    acknowledged record survives."""
    t0 = time.monotonic()
    c = Cluster(tmp_path / "cluster", 3, extra_args=SYNC_SCOPE)
    c.data_dir = lazyfs.durable_dir("data")
    topic, partitions = "power", 6
    acked: dict[tuple[int, int], bytes] = {}
    try:
        c.start()
        create_topic(c.bootstrap(), topic, partitions)
        c.wait_settled(partitions)
        for r in range(CLUSTER_ROUNDS):
            if r > 0:
                lazyfs.mount()
                cluster_dir = c.data_dir / "__cluster"
                lease = newest_version(cluster_dir, "lease")
                assignment = newest_version(cluster_dir, "assignment")
                assert lease is not None and assignment is not None, \
                    f"the version chains are gone after a power cut: {sorted(os.listdir(cluster_dir))}"
                a = assignment[1]
                assert (a["controller_epoch"], a["assignment_version"]) >= seen_assignment, \
                    f"assignment.json rolled back to {a['controller_epoch'], a['assignment_version']}," \
                    f" brokers had applied {seen_assignment}"
                assert lease[0] >= seen_lease_version, \
                    f"the Lease rolled back to version {lease[0]}, brokers had seen {seen_lease_version}"
                for n in c.nodes:
                    n.start()
                c.wait_all_ready()
                c.wait_controller()
                c.wait_settled(partitions)
            stop = threading.Event()
            t = threading.Thread(target=plain_load, args=(c.bootstrap(), topic, f"c{r}", acked, stop))
            t.start()
            time.sleep(3.0)
            # What the brokers acknowledged about the cluster files just before the cut.
            health = [h for h in c.health().values() if h]
            seen_assignment = max((h["controller_epoch"], h["assignment_version"]) for h in health)
            seen_lease_version = max(newest_version(c.data_dir / "__cluster", "lease")[0] - 1, 0)
            for n in c.nodes:
                n.kill()
            lazyfs.cut()
            stop.set()
            t.join(60)
        lazyfs.mount()
        for n in c.nodes:
            n.start()
        c.wait_all_ready()
        c.wait_controller()
        c.wait_settled(partitions)
        stored = read_all(c.bootstrap(), topic, partitions)
        check_log(stored, acked, partitions)
        report(f"power loss, 3-broker cluster: {CLUSTER_ROUNDS} cuts, {len(acked)} records acknowledged,"
               f" 0 lost, {len(stored)} stored, {time.monotonic() - t0:.0f} s")
        assert len(acked) > CLUSTER_ROUNDS * 20, "the load was too light to prove anything"
    finally:
        c.close()


def test_a_failed_fsync_stops_acknowledging_until_a_restart(lazyfs, tmp_path):
    """One fdatasync of the segment fails with EIO and the bytes it should have made durable
    never reach the disk. kaas acknowledges nothing written after that (librdkafka's retries of
    the refused batch and every later record time out), /healthz reports the broker failed with
    what to do, and after a power cut and a restart every acknowledged record is there, with no
    hole, and the broker accepts writes again. Before, the retried batch was appended behind the
    lost bytes and acknowledged by the next fdatasync (which succeeds: the kernel reports a
    write-back error once), and the restart lost it and every record after it."""
    import urllib.error
    import urllib.request
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker", extra_args=SYNC_SCOPE)
    broker.data_dir = lazyfs.durable_dir("data")
    topic = "fsync-error"
    acked: dict[tuple[int, int], bytes] = {}
    failed: list[str] = []

    def on_delivery(err, msg):
        if err is None:
            acked[(msg.partition(), msg.offset())] = msg.value()
        else:
            failed.append(f"{msg.value()!r}: {err}")

    def health() -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(broker.health_url + "/healthz", timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        broker.start()
        create_topic(broker.bootstrap, topic, 1)
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0,
                      "message.timeout.ms": 8000, "retry.backoff.ms": 200})
        for i in range(20):
            p.produce(topic, f"before-{i}".encode(), on_delivery=on_delivery)
            assert p.flush(30) == 0
        assert len(acked) == 20 and not failed, failed
        assert health()[0] == 200

        lazyfs.fail_next_fsync()
        p.produce(topic, b"lost", on_delivery=on_delivery)
        p.flush(30)
        assert not lazyfs.fsync_fault_pending(), "the write was never fsynced"
        for i in range(10):
            p.produce(topic, f"after-{i}".encode(), on_delivery=on_delivery)
        p.flush(30)
        late = {k: v for k, v in acked.items() if not v.startswith(b"before-")}
        assert not late, f"acknowledged after the failed fdatasync: {sorted(late.items())[:5]}"
        assert len(failed) == 11, failed
        status, body = health()
        assert status == 503 and body["status"] == "failed", (status, body)
        assert "restart the broker" in (body["storage"]["sync_failed"] or ""), body["storage"]

        broker.kill()
        lazyfs.cut()
        lazyfs.mount()
        broker.start()
        assert health()[0] == 200
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0,
                      "message.timeout.ms": 30000})
        p.produce(topic, b"again", on_delivery=on_delivery)
        assert p.flush(30) == 0
        stored = read_all(broker.bootstrap, topic, 1)
        check_log(stored, acked, 1)
        assert [v for _, v in sorted(stored.items())] == \
            [f"before-{i}".encode() for i in range(20)] + [b"again"], sorted(stored.items())[18:]
    finally:
        broker.close()
