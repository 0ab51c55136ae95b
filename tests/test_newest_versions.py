"""Kafka 4.4's newest request versions, as its clients and tools send them.

kaas serves Produce v13, ListOffsets v11, OffsetCommit and OffsetFetch v10, ApiVersions v5 and
DeleteGroups v3 (the ones past the generated codec are written by hand in wire/src/beyond.rs).
Each is checked twice: on the wire, with hand-built requests over a plain socket, for what
Kafka 4.4 answers (UNKNOWN_TOPIC_ID for an id nobody created, REBOOTSTRAP_REQUIRED for a
client that meant another cluster, -1 for tiered-storage offsets); and end to end, with the
Java client 4.4 negotiating them by itself, read back from the broker's per-version request
counters.
"""
from __future__ import annotations

import re
import struct
import urllib.request
import uuid

import pytest

import kwire
from kcheck import create_topic, rdkafka_read_all, unique_topic

NONE, UNSUPPORTED_VERSION, INVALID_REQUEST = 0, 35, 42
GROUP_ID_NOT_FOUND, UNKNOWN_TOPIC_ID, REBOOTSTRAP_REQUIRED = 69, 100, 129
PRODUCE, LIST_OFFSETS, OFFSET_COMMIT, OFFSET_FETCH, API_VERSIONS, DELETE_GROUPS = 0, 2, 8, 9, 18, 42


class Reader:
    """Reads a flexible-version response body."""

    def __init__(self, frame: bytes, flexible_header: bool = True):
        self.b = frame
        (self.corr,) = struct.unpack_from(">i", frame, 0)
        self.pos = 4
        if flexible_header:
            self.tags()

    def unpack(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.pos)
        self.pos += struct.calcsize(fmt)
        return v if len(v) > 1 else v[0]

    def uvarint(self):
        v, self.pos = kwire.read_uvarint(self.b, self.pos)
        return v

    def count(self):
        """A compact array's length (None: null)."""
        n = self.uvarint()
        return None if n == 0 else n - 1

    def string(self):
        n = self.count()
        if n is None:
            return None
        s = self.b[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def uuid(self):
        u = uuid.UUID(bytes=self.b[self.pos:self.pos + 16])
        self.pos += 16
        return u

    def tags(self):
        for _ in range(self.uvarint()):
            self.uvarint()
            size = self.uvarint()
            self.pos += size

    def offset_partitions(self):
        """An OffsetFetch (v8+) topic's partitions and its tagged fields:
        {partition: (offset, metadata, error)}."""
        ps = {}
        for _ in range(self.count()):
            p, off, _epoch = self.unpack(">iqi")
            meta = self.string()
            ps[p] = (off, meta, self.unpack(">h"))
            self.tags()
        self.tags()
        return ps

    def done(self):
        assert self.pos == len(self.b), f"{len(self.b) - self.pos} bytes left over"


def roundtrip(broker, frame: bytes) -> bytes:
    with kwire.connect(broker) as s:
        s.sendall(frame)
        return kwire.recv_frame(s)


def cluster_and_node(broker) -> tuple[str, int]:
    from confluent_kafka.admin import AdminClient
    md = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=15)
    (node,) = md.brokers
    return md.cluster_id, node


def topic_id(broker, topic: str) -> uuid.UUID:
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    u = a.describe_topics(TopicCollection([topic]))[topic].result(15).topic_id
    return uuid.UUID(int=((u.get_most_significant_bits() % (1 << 64)) << 64)
                     | (u.get_least_significant_bits() % (1 << 64)))


def test_the_codec_vectors_are_kafkas(java_classes):
    """wire/src/beyond.rs holds its hand-written codec to byte strings; each must be what
    Apache Kafka 4.4's own message classes write (tests/java/WireVectors.java)."""
    import subprocess
    from pathlib import Path
    out = subprocess.run(["java", "-cp", java_classes, "WireVectors"], capture_output=True,
                         text=True, timeout=120, check=True, stdin=subprocess.DEVNULL).stdout
    source = (Path(__file__).resolve().parent.parent / "wire/src/beyond.rs").read_text()
    # Long vectors are split over lines with a `\` continuation.
    source = re.sub(r"\\\n\s*", "", source)
    vectors = dict(line.split() for line in out.splitlines())
    assert len(vectors) == 8, vectors
    missing = [name for name, hexed in vectors.items() if f'"{hexed}"' not in source]
    assert not missing, f"beyond.rs does not hold Kafka's bytes for {missing}"


def test_newest_versions_are_advertised(broker):
    ranges = kwire.api_versions(broker)
    for key, version in [(PRODUCE, 13), (1, 18), (LIST_OFFSETS, 11), (3, 13), (OFFSET_COMMIT, 10),
                         (OFFSET_FETCH, 10), (API_VERSIONS, 5), (DELETE_GROUPS, 3), (35, 5)]:
        assert ranges[key][1] >= version, f"API {key}: {ranges[key]}, want v{version}"


def api_versions_v5(broker, cluster_id, node_id):
    body = (kwire.compact_string("kaas-test") + kwire.compact_string("1.0")
            + kwire.compact_string(cluster_id) + struct.pack(">i", node_id) + kwire.uvarint(0))
    # ApiVersions responses keep the v0 header (no tagged fields) at every version.
    r = Reader(roundtrip(broker, kwire.request(API_VERSIONS, 5, 5, body, flexible=True)),
               flexible_header=False)
    error = r.unpack(">h")
    keys = {}
    for _ in range(r.count()):
        k, lo, hi = r.unpack(">hhh")
        r.tags()
        keys[k] = (lo, hi)
    r.unpack(">i")
    r.tags()
    r.done()
    return error, keys


def test_api_versions_v5_checks_the_cluster_and_broker_the_client_meant(broker):
    """KIP-1242: a client whose metadata names another cluster, or another broker at this
    address, is told to bootstrap again (REBOOTSTRAP_REQUIRED, no API list); naming only one
    of the two is malformed; naming this one, or neither (a bootstrap connection), gets the
    full list."""
    cluster, node = cluster_and_node(broker)
    error, keys = api_versions_v5(broker, None, -1)
    assert error == NONE and keys[API_VERSIONS][1] >= 5, (error, keys)
    error, keys = api_versions_v5(broker, cluster, node)
    assert error == NONE and keys[PRODUCE][1] >= 13, (error, keys)
    assert api_versions_v5(broker, "another-cluster", node) == (REBOOTSTRAP_REQUIRED, {})
    assert api_versions_v5(broker, cluster, node + 1) == (REBOOTSTRAP_REQUIRED, {})
    assert api_versions_v5(broker, cluster, -1) == (INVALID_REQUEST, {})
    assert api_versions_v5(broker, None, node)[0] == INVALID_REQUEST


def produce_v13(broker, tid: uuid.UUID, partition: int, batch: bytes):
    body = (kwire.compact_string(None) + struct.pack(">hi", -1, 10000)
            + kwire.uvarint(2) + tid.bytes
            + kwire.uvarint(2) + struct.pack(">i", partition) + kwire.compact_bytes(batch)
            + kwire.uvarint(0) + kwire.uvarint(0) + kwire.uvarint(0))
    r = Reader(roundtrip(broker, kwire.request(PRODUCE, 13, 13, body, flexible=True)))
    assert r.count() == 1
    echoed = r.uuid()
    assert r.count() == 1
    index, error, base = r.unpack(">ihq")
    return echoed, index, error, base


def test_produce_v13_names_topics_by_id(broker):
    """Produce v13 writes to the topic its id names and echoes the id (the Java producer
    matches answers to batches by it); an id nobody created is UNKNOWN_TOPIC_ID, on which
    clients refresh their metadata, and creates nothing."""
    topic = unique_topic("v13")
    create_topic(broker.bootstrap, topic, 2)
    tid = topic_id(broker, topic)
    batch = kwire.record_batch([(b"k", b"by id")])
    assert produce_v13(broker, tid, 1, batch) == (tid, 1, NONE, 0)
    assert produce_v13(broker, tid, 1, batch) == (tid, 1, NONE, 1)
    stranger = uuid.uuid4()
    echoed, _, error, _ = produce_v13(broker, stranger, 0, batch)
    assert (echoed, error) == (stranger, UNKNOWN_TOPIC_ID)
    records, ends = rdkafka_read_all(broker.bootstrap, topic, 2)
    assert [(p, o, v) for p, o, _, v in records] == [(1, 0, b"by id"), (1, 1, b"by id")], records
    assert ends == {0: 0, 1: 2}, ends


def list_offsets(broker, version: int, topic: str, timestamps: list[int]):
    parts = b"".join(struct.pack(">iiq", p, -1, ts) + kwire.uvarint(0)
                     for p, ts in enumerate(timestamps))
    body = (struct.pack(">ib", -1, 0) + kwire.uvarint(2) + kwire.compact_string(topic)
            + kwire.uvarint(len(timestamps) + 1) + parts + kwire.uvarint(0))
    if version >= 10:
        body += struct.pack(">i", 5000)
    body += kwire.uvarint(0)
    r = Reader(roundtrip(broker, kwire.request(LIST_OFFSETS, version, 2, body, flexible=True)))
    r.unpack(">i")
    assert r.count() == 1
    assert r.string() == topic
    out = []
    for _ in range(r.count()):
        index, error, ts, offset, epoch = r.unpack(">ihqqi")
        r.tags()
        out.append((index, error, ts, offset, epoch))
    r.tags()
    r.tags()
    r.done()
    return [o[1:] for o in sorted(out)]


def test_list_offsets_v11_answers_tiered_storage_timestamps_as_kafka_without_it(broker):
    """ListOffsets v9 and v11 add -5 (latest tiered offset) and -6 (earliest not yet
    uploaded): kaas has no tiered storage, so both are offset -1, as Kafka answers for a topic
    without remote storage. A special timestamp older than its version is UNSUPPORTED_VERSION
    for that partition."""
    topic = unique_topic("lo11")
    create_topic(broker.bootstrap, topic, 4)
    for p in range(4):
        body = kwire.record_batch([(None, b"a"), (None, b"b")])
        kwire_produce(broker, topic, p, body)
    got = list_offsets(broker, 11, topic, [-1, -2, -5, -6])
    assert got[0][0] == NONE and got[0][2] == 2, got
    assert got[1][0] == NONE and got[1][2] == 0, got
    assert got[2] == (NONE, -1, -1, -1), got
    assert got[3] == (NONE, -1, -1, -1), got
    got = list_offsets(broker, 7, topic, [-4, -3, -1, -2])
    assert [g[0] for g in got] == [UNSUPPORTED_VERSION, NONE, NONE, NONE], got
    got = list_offsets(broker, 10, topic, [-6, -5, -4, -1])
    assert [g[0] for g in got] == [UNSUPPORTED_VERSION, NONE, NONE, NONE], got
    assert got[2][2] == 0, got


def kwire_produce(broker, topic, partition, batch):
    version = kwire.pick_produce_version(kwire.api_versions(broker))
    resp = roundtrip(broker, kwire.produce_request(version, 3, topic, partition, batch))
    _, _, _, error, _ = kwire.parse_produce_response(version, resp)
    assert error == NONE, error


def offset_commit_v10(broker, group, tid, offsets):
    parts = b"".join(struct.pack(">iqi", p, o, -1) + kwire.compact_string("m%d" % p)
                     + kwire.uvarint(0) for p, o in offsets)
    body = (kwire.compact_string(group) + struct.pack(">i", -1) + kwire.compact_string("")
            + kwire.compact_string(None)
            + kwire.uvarint(2) + tid.bytes + kwire.uvarint(len(offsets) + 1) + parts
            + kwire.uvarint(0) + kwire.uvarint(0))
    r = Reader(roundtrip(broker, kwire.request(OFFSET_COMMIT, 10, 8, body, flexible=True)))
    r.unpack(">i")
    assert r.count() == 1
    assert r.uuid() == tid
    out = {}
    for _ in range(r.count()):
        p, e = r.unpack(">ih")
        r.tags()
        out[p] = e
    r.tags()
    r.tags()
    r.done()
    return out


def offset_fetch_v10(broker, group, topics):
    """topics: None (all) or [(id, [partitions])]. Returns (group error, {id: {p: (offset,
    metadata, error)}})."""
    if topics is None:
        t = kwire.uvarint(0)
    else:
        t = kwire.uvarint(len(topics) + 1) + b"".join(
            tid.bytes + kwire.uvarint(len(ps) + 1) + b"".join(struct.pack(">i", p) for p in ps)
            + kwire.uvarint(0) for tid, ps in topics)
    body = (kwire.uvarint(2) + kwire.compact_string(group) + kwire.compact_string(None)
            + struct.pack(">i", -1) + t + kwire.uvarint(0) + b"\x00" + kwire.uvarint(0))
    r = Reader(roundtrip(broker, kwire.request(OFFSET_FETCH, 10, 9, body, flexible=True)))
    r.unpack(">i")
    assert r.count() == 1
    assert r.string() == group
    out = {}
    for _ in range(r.count()):
        tid = r.uuid()
        out[tid] = r.offset_partitions()
    error = r.unpack(">h")
    r.tags()
    r.tags()
    r.done()
    return error, out


def offset_fetch_v9_topics(broker, group):
    """The topic names OffsetFetch v9 lists for all of `group`'s committed offsets."""
    body = (kwire.uvarint(2) + kwire.compact_string(group) + kwire.compact_string(None)
            + struct.pack(">i", -1) + kwire.uvarint(0) + kwire.uvarint(0) + b"\x00"
            + kwire.uvarint(0))
    r = Reader(roundtrip(broker, kwire.request(OFFSET_FETCH, 9, 10, body, flexible=True)))
    r.unpack(">i")
    assert r.count() == 1
    assert r.string() == group
    names = []
    for _ in range(r.count()):
        names.append(r.string())
        r.offset_partitions()
    return names


def delete_groups_v3(broker, groups):
    body = (kwire.uvarint(len(groups) + 1) + b"".join(kwire.compact_string(g) for g in groups)
            + kwire.uvarint(0))
    r = Reader(roundtrip(broker, kwire.request(DELETE_GROUPS, 3, 4, body, flexible=True)))
    r.unpack(">i")
    out = {}
    for _ in range(r.count()):
        g = r.string()
        e = r.unpack(">h")
        out[g] = (e, r.string())
        r.tags()
    r.tags()
    r.done()
    return out


def test_offsets_v10_by_topic_id_and_delete_groups_v3(broker):
    """OffsetCommit and OffsetFetch v10 name topics by id: committed offsets read back under
    the id (listing all of a group's topics too), an unknown id is UNKNOWN_TOPIC_ID on every
    partition and commits nothing. DeleteGroups v3 then deletes the group, and answers a group
    that does not exist with GROUP_ID_NOT_FOUND and no message, as Kafka 4.4."""
    topic = unique_topic("oc10")
    create_topic(broker.bootstrap, topic, 3)
    tid = topic_id(broker, topic)
    group = unique_topic("oc10-g")
    # The coordinator may still be loading right after start (retriable, as Kafka's).
    import time
    deadline = time.monotonic() + 30
    while True:
        got = offset_commit_v10(broker, group, tid, [(0, 5), (2, 9)])
        if got != {0: 14, 2: 14} and got != {0: 15, 2: 15}:
            break
        assert time.monotonic() < deadline, got
        time.sleep(0.2)
    assert got == {0: NONE, 2: NONE}, got
    stranger = uuid.uuid4()
    assert offset_commit_v10(broker, group, stranger, [(0, 1)]) == {0: UNKNOWN_TOPIC_ID}

    error, got = offset_fetch_v10(broker, group, [(tid, [0, 1, 2]), (stranger, [0])])
    assert error == NONE
    assert got[tid] == {0: (5, "m0", NONE), 1: (-1, "", NONE), 2: (9, "m2", NONE)}, got
    assert got[stranger] == {0: (-1, "", UNKNOWN_TOPIC_ID)}, got
    error, got = offset_fetch_v10(broker, group, None)
    assert (error, got) == (NONE, {tid: {0: (5, "m0", NONE), 2: (9, "m2", NONE)}}), got
    # By name (v9), the unknown id left nothing either: only the topic committed to.
    assert offset_fetch_v9_topics(broker, group) == [topic]
    # A commit naming only unknown ids creates no group.
    lonely = unique_topic("oc10-none")
    assert offset_commit_v10(broker, lonely, stranger, [(0, 1)]) == {0: UNKNOWN_TOPIC_ID}
    assert delete_groups_v3(broker, [lonely]) == {lonely: (GROUP_ID_NOT_FOUND, None)}

    missing = unique_topic("no-such-group")
    assert delete_groups_v3(broker, [group, missing]) == {
        group: (NONE, None), missing: (GROUP_ID_NOT_FOUND, None)}
    error, got = offset_fetch_v10(broker, group, None)
    assert (error, got) == (NONE, {}), got


def request_versions(broker) -> dict[tuple[str, int], float]:
    with urllib.request.urlopen(broker.health_url + "/metrics", timeout=5) as r:
        body = r.read().decode()
    out = {}
    for m in re.finditer(r'^kaas_request_versions_total\{api="(\w+)",version="(\d+)"\} (\S+)$',
                         body, re.M):
        out[(m.group(1), int(m.group(2)))] = float(m.group(3))
    return out


def test_the_java_client_negotiates_the_newest_versions(broker, java_classes):
    """The Java client 4.4, left to negotiate, sends ApiVersions v5, Produce v13, Fetch v18,
    Metadata v13 and (group.protocol=consumer, topics known by id) OffsetCommit v10, and its
    group round trip still consumes every record and commits the end offsets. The broker's
    per-version request counters say which versions arrived."""
    if broker.kind != "kaas":
        pytest.skip("reads kaas's /metrics")
    from test_groups import parse_group_check, run_java
    before = request_versions(broker)
    topic = unique_topic("newest")
    out = run_java(java_classes, "group", broker.bootstrap, topic, 3,
                   unique_topic("newest-g"), "consumer", 2, 600)
    parse_group_check(out, 3, 600)
    after = request_versions(broker)
    sent = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
    for api, version in [("ApiVersions", 5), ("Produce", 13), ("Fetch", 18), ("Metadata", 13),
                         ("OffsetCommit", 10), ("OffsetFetch", 10)]:
        assert sent.get((api, version), 0) > 0, f"no {api} v{version} arrived: {sorted(sent)}"


LIST_TRANSACTIONS, INVALID_REGULAR_EXPRESSION = 66, 128


def list_transactions_v2(broker, states: list[str], pattern: str | None) -> tuple[int, list, int]:
    """ListTransactions v2 (KIP-1152's transactional-id pattern): (error, unknown state
    filters, number of transactions)."""
    body = (kwire.uvarint(len(states) + 1) + b"".join(kwire.compact_string(s) for s in states)
            + kwire.uvarint(1)                 # producer id filters: none
            + struct.pack(">q", -1)            # duration filter: any
            + kwire.compact_string(pattern) + kwire.uvarint(0))
    r = Reader(roundtrip(broker, kwire.request(LIST_TRANSACTIONS, 2, 66, body, flexible=True)))
    _throttle, error = r.unpack(">ih")
    unknown = [r.string() for _ in range(r.count())]
    n = r.count()
    assert n == 0 or error, "kaas never has a transaction to list"
    r.tags()
    r.done()
    return error, unknown, n


def test_list_transactions_checks_filters_as_kafka_and_lists_none(broker):
    """ListTransactions v2 lists no transaction (kaas starts none). As Kafka does, it lists back
    the state filters that name no transaction state, and refuses a transactional-id pattern
    that is not a regular expression with INVALID_REGULAR_EXPRESSION."""
    assert kwire.api_versions(broker)[LIST_TRANSACTIONS] == (0, 2)
    assert list_transactions_v2(broker, [], None) == (NONE, [], 0)
    assert list_transactions_v2(broker, ["Ongoing", "Sleeping", "CompleteCommit", "Sleeping"],
                                "(?i)orders-\\p{L}+") == (NONE, ["Sleeping"], 0)
    assert list_transactions_v2(broker, [], "orders-(")[0] == INVALID_REGULAR_EXPRESSION
