"""kcat (Debian's package, linked against Debian's librdkafka): metadata listing, keyed
idempotent produce with acks=all, and reading whole topics back without a consumer group."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from kcheck import (check_end_offsets, create_topic, key_for, rdkafka_produce,
                    rdkafka_read_all, seq_of, unique_topic, value_for, verify_log)

N = int(os.environ.get("KAAS_TEST_MESSAGES", "100000"))
PARTITIONS = 6

pytestmark = pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")


def kcat(*args, input=None, timeout=300):
    r = subprocess.run(["kcat", *args], input=input, capture_output=True, timeout=timeout,
                       stdin=None if input is not None else subprocess.DEVNULL)
    assert r.returncode == 0, (f"kcat {' '.join(args)} exited {r.returncode}:\n"
                               f"{r.stderr.decode(errors='replace')[-4000:]}")
    return r.stdout


def kcat_read_all(broker, topic):
    out = kcat("-C", "-b", broker.bootstrap, "-t", topic, "-o", "beginning", "-e", "-J", "-q",
               "-X", "fetch.wait.max.ms=100")
    rows = []
    for line in out.splitlines():
        m = json.loads(line)
        assert m["topic"] == topic
        rows.append((m["partition"], m["offset"],
                     None if m["key"] is None else m["key"].encode(),
                     None if m["payload"] is None else m["payload"].encode()))
    return rows


def test_metadata_listing(broker):
    """`kcat -L` shows the broker at its advertised address and a new topic with all of its
    partitions led by that broker."""
    topic = unique_topic("kcat-md")
    create_topic(broker.bootstrap, topic, 4)
    md = json.loads(kcat("-L", "-b", broker.bootstrap, "-t", topic, "-J", timeout=60))
    brokers = {b["id"]: b["name"] for b in md["brokers"]}
    assert list(brokers.values()) == [broker.bootstrap], md["brokers"]
    [t] = md["topics"]
    assert t["topic"] == topic and "error" not in t, t
    assert sorted(p["partition"] for p in t["partitions"]) == [0, 1, 2, 3]
    assert all(p["leader"] in brokers for p in t["partitions"]), t


def test_kcat_produce_then_read_back(broker):
    """100k keyed lines piped into `kcat -P` (acks=all, idempotent) come back from `kcat -C`
    exactly once each, in order per partition, at contiguous offsets from 0."""
    topic = unique_topic("kcat")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    lines = b"".join(key_for(i) + b"\t" + value_for("kc", i) + b"\n" for i in range(N))
    kcat("-P", "-b", broker.bootstrap, "-t", topic, "-K", "\t",
         "-X", "enable.idempotence=true", "-X", "acks=all", "-X", "linger.ms=5", input=lines)
    rows = kcat_read_all(broker, topic)
    assert len(rows) == N, f"kcat produced {N} lines, read back {len(rows)}"
    seqs = sorted(seq_of(v) for _, _, _, v in rows)
    assert seqs == list(range(N)), "some lines lost or duplicated"
    # kcat does not report per-message offsets; treat what was read as the ack map and let
    # the checker prove uniqueness, contiguity, per-partition order and keys.
    acked = {v: (p, off) for p, off, _, v in rows}
    verify_log(acked, rows, label="kcat")
    assert {p for p, _, _, _ in rows} == set(range(PARTITIONS))
    _, ends = rdkafka_read_all(broker.bootstrap, topic, PARTITIONS)
    check_end_offsets(acked, ends, "kcat")


def test_kcat_reads_acked_offsets(broker):
    """Records produced through confluent-kafka are read by `kcat -C` (no group), each at the
    offset its delivery report gave."""
    topic = unique_topic("kcat-acked")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    n = min(N, 50_000)
    acked = rdkafka_produce(broker.bootstrap, topic,
                            ((key_for(i), value_for("kca", i)) for i in range(n)))
    rows = kcat_read_all(broker, topic)
    verify_log(acked, rows, label="kcat -C")


@pytest.mark.parametrize("codec,attribute", [("gzip", 1), ("snappy", 2), ("lz4", 3), ("zstd", 4)])
def test_old_librdkafka_compresses(broker, codec, attribute):
    """kcat's librdkafka (Debian's 2.0.2) compresses with every codec: librdkafka before 2.8
    takes gzip, snappy and lz4 as supported only if the broker names Produce v0, so kaas names
    it in ApiVersions (as Kafka 4 does, KAFKA-18659) while serving v3 and up. Before, those
    three went out uncompressed without a word. The stored batch carries the codec."""
    if broker.external:
        pytest.skip("reads the broker's segment files")
    topic = unique_topic(f"old-{codec}")
    create_topic(broker.bootstrap, topic, 1)
    kcat("-P", "-b", broker.bootstrap, "-t", topic, "-p", "0", "-z", codec,
         "-X", "linger.ms=50", input=b"".join(b"record-%d\n" % i for i in range(20)))
    segments = sorted(broker.data_dir.glob(f"{topic}~*/0/*.log"))
    assert segments, f"no segment of {topic} under {broker.data_dir}"
    first = segments[0].read_bytes()
    assert len(first) > 61, "nothing stored"
    assert int.from_bytes(first[21:23], "big") & 0x07 == attribute, \
        f"stored with codec {int.from_bytes(first[21:23], 'big') & 7}, sent with {codec}"
    assert [v for _, _, _, v in kcat_read_all(broker, topic)] == \
        [b"record-%d" % i for i in range(20)]
