"""Captures the fuzz targets' seeds from real clients: a TCP proxy in front of a kaas broker
records every request frame that librdkafka (producer with each compression codec and
idempotence, classic and KIP-848 consumer groups, the admin API) and kafka-python send, and
writes them under seeds/request/ (one file per API version, a few each) and the record sets of
their Produce requests under seeds/record_batch/.

    python3 fuzz/capture_seeds.py        # needs the release kaas binary and the test clients

The seeds are committed; run this again when the broker serves new APIs."""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
import kwire  # noqa: E402

PER_VERSION = 4
MAX_FRAME = 64 << 10
frames: dict[tuple[int, int], list[bytes]] = {}
batches: set[bytes] = set()
lock = threading.Lock()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def recv_exact(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


def pipe_requests(client, upstream):
    try:
        while True:
            (n,) = struct.unpack(">i", recv_exact(client, 4))
            frame = recv_exact(client, n)
            key, version = struct.unpack(">hh", frame[:4])
            if key == 0:
                with lock:
                    batches.update(b for b in record_sets(frame) if len(b) <= MAX_FRAME)
            if len(frame) <= MAX_FRAME:
                with lock:
                    kept = frames.setdefault((key, version), [])
                    if len(kept) < PER_VERSION and frame not in kept:
                        kept.append(frame)
            upstream.sendall(struct.pack(">i", n) + frame)
    except (EOFError, OSError):
        pass
    finally:
        for s in (client, upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def pipe_raw(src, dst):
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass


def proxy(listen_port, broker_port):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen_port))
    srv.listen(64)
    while True:
        c, _ = srv.accept()
        u = socket.create_connection(("127.0.0.1", broker_port))
        threading.Thread(target=pipe_requests, args=(c, u), daemon=True).start()
        threading.Thread(target=pipe_raw, args=(u, c), daemon=True).start()


def record_sets(frame: bytes) -> list[bytes]:
    """The record batches inside a Produce frame, found by their CRC."""
    out = []
    i = 0
    while i + 61 <= len(frame):
        (length,) = struct.unpack(">i", frame[i + 8:i + 12])
        end = i + 12 + length
        if frame[i + 16] == 2 and 49 <= length and end <= len(frame):
            (crc,) = struct.unpack(">I", frame[i + 17:i + 21])
            if kwire.crc32c(frame[i + 21:end]) == crc:
                out.append(frame[i:end])
                i = end
                continue
        i += 1
    return out


def clients(bootstrap: str):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, NewPartitions, NewTopic, OffsetSpec,
                                       ResourceType)
    a = AdminClient({"bootstrap.servers": bootstrap})
    for f in a.create_topics([NewTopic("seeds", 3, 1), NewTopic("seeds-compact", 1, 1,
                              config={"cleanup.policy": "compact"})]).values():
        f.result(15)
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                      "enable.idempotence": codec != "none", "linger.ms": 5})
        for i in range(200):
            p.produce("seeds", key=b"k%d" % (i % 7), value=b"v%d" % i * (1 + i % 5),
                      headers=[("h", b"x")] if i % 3 == 0 else None)
            p.produce("seeds-compact", key=b"k%d" % (i % 7), value=None if i % 11 == 0 else b"v")
        p.flush(30)
    for protocol in ("classic", "consumer"):
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"seeds-{protocol}",
                      "group.protocol": protocol, "auto.offset.reset": "earliest"})
        c.subscribe(["seeds"])
        deadline = time.monotonic() + 20
        n = 0
        while n < 300 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                n += 1
        c.commit(asynchronous=False)
        c.close()
    a.describe_configs([ConfigResource(ResourceType.TOPIC, "seeds")])[
        ConfigResource(ResourceType.TOPIC, "seeds")].result(15)
    for f in a.incremental_alter_configs([ConfigResource(
            ResourceType.TOPIC, "seeds", incremental_configs=[
                ConfigEntry("retention.ms", "86400000",
                            incremental_operation=AlterConfigOpType.SET)])]).values():
        f.result(15)
    for f in a.create_partitions([NewPartitions("seeds", 4)]).values():
        f.result(15)
    a.list_consumer_groups().result(15)
    for f in a.describe_consumer_groups(["seeds-classic", "seeds-consumer"]).values():
        f.result(15)
    a.describe_cluster().result(15)
    a.list_offsets({TopicPartition("seeds", 0): OffsetSpec.latest()})[
        TopicPartition("seeds", 0)].result(15)
    for f in a.delete_records([TopicPartition("seeds", 1, 5)]).values():
        f.result(15)
    for f in a.delete_topics(["seeds-compact"]).values():
        f.result(15)
    # kafka-python speaks older versions of several APIs.
    from kafka import KafkaConsumer, KafkaProducer
    kp = KafkaProducer(bootstrap_servers=bootstrap, acks=1)
    for i in range(50):
        kp.send("seeds-kp", key=b"kp", value=b"kafka-python %d" % i)
    kp.flush(30)
    kp.close()
    kc = KafkaConsumer("seeds-kp", bootstrap_servers=bootstrap, group_id="seeds-kp",
                       auto_offset_reset="earliest", consumer_timeout_ms=5000)
    for _ in kc:
        pass
    kc.commit()
    kc.close()


def main():
    kaas = Path(os.environ.get("KAAS_BIN", Path.home() / ".cache/kaas-target/release/kaas"))
    data = tempfile.mkdtemp(prefix="kaas-seeds-")
    bport, pport = free_port(), free_port()
    broker = subprocess.Popen([str(kaas), "--data-dir", data, "--listen", f"127.0.0.1:{bport}",
                               "--advertised-listener", f"127.0.0.1:{pport}",
                               "--health-listen", f"127.0.0.1:{free_port()}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        threading.Thread(target=proxy, args=(pport, bport), daemon=True).start()
        time.sleep(1.5)
        clients(f"127.0.0.1:{pport}")
    finally:
        broker.terminate()
        broker.wait(30)
    out = HERE / "seeds"
    for target in ("request", "record_batch"):
        (out / target).mkdir(parents=True, exist_ok=True)
    for (key, version), kept in sorted(frames.items()):
        for i, f in enumerate(kept):
            (out / "request" / f"api{key:02d}-v{version:02d}-{i}").write_bytes(f)
    # Of each compression codec and kind, a few (attributes' low bits: codec; bit 4: control).
    by_kind: dict[int, list[bytes]] = {}
    for b in sorted(batches, key=len):
        kind = struct.unpack(">h", b[21:23])[0] & 0x37
        by_kind.setdefault(kind, []).append(b)
    chosen = [b for kind in sorted(by_kind) for b in by_kind[kind][::max(1, len(by_kind[kind]) // 12)][:12]]
    for b in chosen:
        (out / "record_batch" / hashlib.sha1(b).hexdigest()[:16]).write_bytes(b)
    print(f"{sum(len(v) for v in frames.values())} request seeds over {len(frames)} API "
          f"versions, {len(chosen)} record batch seeds of {len(batches)} seen")


if __name__ == "__main__":
    main()
