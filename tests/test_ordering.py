"""A connection's requests take effect in the order they arrived (issue 12, item 1).

Kafka handles one request per connection at a time, and clients rely on it without saying so:
librdkafka's default producer (no idempotence, a deep in-flight window) and Java producers
with max.in.flight > 1 keep per-partition order only because of it, and idempotent producers
sharing a partition get OUT_OF_ORDER_SEQUENCE_NUMBER storms without it. These tests configure
the clients as users do and check the stored order, not individual responses."""

from __future__ import annotations

import struct
import threading
import time

import pytest

from kcheck import create_topic, rdkafka_read_all, seq_of, unique_topic, value_for


def produce_in_order(bootstrap: str, topic: str, n: int, conf: dict, tag: str = "ord"):
    """Sends values 0..n-1 to partition 0 in that order; returns the sequence numbers in the
    order their delivery reports named offsets, and the delivery errors."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, **conf})
    acked: dict[int, int] = {}
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            if len(errors) < 10:
                errors.append(str(err))
            return
        acked[seq_of(msg.value())] = msg.offset()

    deadline = time.monotonic() + 120
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=value_for(tag, i), partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
                assert time.monotonic() < deadline, "producer queue stayed full"
        p.poll(0)
    assert p.flush(max(1.0, deadline - time.monotonic())) == 0, "messages left undelivered"
    return acked, errors


def inversions(seqs: list[int]) -> int:
    """How many records are stored before one that was sent earlier (adjacent descents)."""
    return sum(1 for a, b in zip(seqs, seqs[1:]) if b < a)


@pytest.mark.parametrize("acks", ["1", "all"])
def test_librdkafka_default_producer_keeps_send_order(broker, acks):
    """librdkafka with idempotence off (its default), linger.ms=0 and tiny batches pipelines
    many produce requests on one connection; every record is stored in send order (this
    stored 2,571 of 50,000 out of order when requests ran concurrently)."""
    topic = unique_topic("order")
    create_topic(broker.bootstrap, topic, 1)
    n = 50_000 if acks == "1" else 20_000
    acked, errors = produce_in_order(broker.bootstrap, topic, n, {
        "enable.idempotence": False,
        "linger.ms": 0,
        "batch.size": 200,
        "acks": acks,
        "retries": 0,
    })
    assert not errors, f"delivery errors: {errors}"
    assert len(acked) == n
    records, ends = rdkafka_read_all(broker.bootstrap, topic, 1)
    stored = [seq_of(v) for _, _, _, v in sorted(records, key=lambda r: r[1])]
    assert len(stored) == n == ends[0], f"stored {len(stored)}, end offset {ends[0]}, sent {n}"
    assert inversions(stored) == 0, (
        f"{inversions(stored)} records stored out of send order; first stored: {stored[:20]}")
    # The delivery reports agree with the log.
    assert all(acked[s] == off for off, s in enumerate(stored))


def test_idempotent_producers_sharing_a_partition(broker):
    """Ten idempotent producers, each with the default in-flight window, write one partition
    at once: no OUT_OF_ORDER_SEQUENCE_NUMBER, nothing lost or duplicated, and each producer's
    records are stored in its send order (this took 95 s with 78 sequence errors before)."""
    topic = unique_topic("idem")
    create_topic(broker.bootstrap, topic, 1)
    workers, per = 10, 2_000
    results: dict[int, tuple] = {}

    def run(w: int):
        results[w] = produce_in_order(broker.bootstrap, topic, per, {
            "enable.idempotence": True,
            "linger.ms": 0,
            "batch.size": 500,
            "acks": "all",
        }, tag=f"w{w}")

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    elapsed = time.monotonic() - started
    assert len(results) == workers, "a producer did not finish"
    for w, (acked, errors) in results.items():
        assert not errors, f"producer {w}: {errors}"
        assert len(acked) == per
    records, ends = rdkafka_read_all(broker.bootstrap, topic, 1)
    assert ends[0] == workers * per, f"end offset {ends[0]}, expected {workers * per}"
    per_worker: dict[str, list[int]] = {}
    for _, _, _, v in sorted(records, key=lambda r: r[1]):
        per_worker.setdefault(v.split(b":", 1)[0].decode(), []).append(seq_of(v))
    for w, seqs in per_worker.items():
        assert seqs == list(range(per)), f"{w}: {inversions(seqs)} inversions, {len(seqs)} stored"
    print(f"{workers} idempotent producers x {per} records on one partition: {elapsed:.1f} s")


@pytest.mark.parametrize("acks", [1, -1])
def test_pipelined_idempotent_batches_on_one_connection(broker, acks):
    """200 idempotent batches sent back to back on one connection, without waiting for any
    answer, are all accepted in order: sequence n lands right after n-1. A broker that ran
    them concurrently answered some with OUT_OF_ORDER_SEQUENCE_NUMBER (45); no client retry
    hides that here."""
    import kwire
    topic = unique_topic("pipe")
    create_topic(broker.bootstrap, topic, 1)
    ranges = kwire.api_versions(broker)
    version = kwire.pick_produce_version(ranges)
    pid, epoch = kwire.init_producer_id(broker, ranges)
    n, per = 200, 5
    frames = b"".join(
        kwire.produce_request(version, i, topic, 0, kwire.record_batch(
            [(None, value_for("pipe", i * per + j)) for j in range(per)],
            producer_id=pid, producer_epoch=epoch, base_sequence=i * per), acks=acks)
        for i in range(n))
    with kwire.connect(broker, timeout=30) as s:
        s.sendall(frames)
        answers = [kwire.parse_produce_response(version, kwire.recv_frame(s)) for _ in range(n)]
    assert [a[0] for a in answers] == list(range(n)), "responses out of request order"
    bad = [(corr, err) for corr, _, _, err, _ in answers if err != 0]
    assert not bad, f"{len(bad)} of {n} batches refused, first: {bad[:5]}"
    assert [a[4] for a in answers] == [i * per for i in range(n)], "offsets not in send order"


def list_offsets_v1(corr: int, topic: str, partitions: int) -> bytes:
    """ListOffsets v1 asking every partition's end offset (timestamp -1)."""
    import kwire
    body = (struct.pack(">i", -1) + struct.pack(">i", 1) + kwire.string(topic)
            + struct.pack(">i", partitions)
            + b"".join(struct.pack(">iq", p, -1) for p in range(partitions)))
    return kwire.request(2, 1, corr, body)


def parse_list_offsets_v1(frame: bytes) -> tuple[int, dict[int, tuple[int, int]]]:
    """(correlation id, {partition: (error code, offset)})."""
    (corr, _topics) = struct.unpack_from(">ii", frame, 0)
    (ln,) = struct.unpack_from(">h", frame, 8)
    pos = 10 + ln
    (n,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    out = {}
    for _ in range(n):
        p, err, _ts, off = struct.unpack_from(">ihqq", frame, pos)
        pos += 22
        out[p] = (err, off)
    return corr, out


@pytest.mark.parametrize("acks", [1, -1])
def test_pipelined_produce_across_shards_with_reads_between(broker, acks):
    """One connection pipelines 480 idempotent Produce requests over 8 partitions, five in a
    row to each in turn (both shards own some, so requests hop between them), with a ListOffsets after
    every 60 of them, all sent before any answer is read. A Produce may start while the one
    before it is still appending, but only behind it in each partition's order; anything else
    waits for every earlier append. So: every batch is accepted, each partition's offsets
    follow the send order, and with acks=1 each ListOffsets sees exactly the records sent
    before it. (With acks=all a record becomes visible only once its sync is done, as a
    replicated Kafka partition's high watermark waits for its followers: the reads between
    see at most what was sent, and everything once the answers are in.)"""
    import kwire
    topic = unique_topic("xshard")
    partitions, n, every = 8, 480, 60
    create_topic(broker.bootstrap, topic, partitions)
    ranges = kwire.api_versions(broker)
    version = kwire.pick_produce_version(ranges)
    pid, epoch = kwire.init_producer_id(broker, ranges)
    frames, expect = [], []
    sent = [0] * partitions
    for i in range(n):
        p = i // 5 % partitions
        batch = kwire.record_batch([(None, value_for(f"p{p}", sent[p]))], producer_id=pid,
                                   producer_epoch=epoch, base_sequence=sent[p])
        frames.append(kwire.produce_request(version, i, topic, p, batch, acks=acks))
        expect.append(("produce", i, p, sent[p]))
        sent[p] += 1
        if (i + 1) % every == 0:
            corr = 100_000 + i
            frames.append(list_offsets_v1(corr, topic, partitions))
            expect.append(("list", corr, None, list(sent)))
    with kwire.connect(broker, timeout=60) as s:
        s.sendall(b"".join(frames))
        for kind, corr, p, want in expect:
            frame = kwire.recv_frame(s)
            if kind == "produce":
                got, _, idx, err, base = kwire.parse_produce_response(version, frame)
                assert (got, idx) == (corr, p), "responses out of request order"
                assert err == 0, f"request {corr} to partition {p} refused with {err}"
                assert base == want, f"partition {p}: record {want} stored at offset {base}"
            else:
                got, ends = parse_list_offsets_v1(frame)
                assert got == corr, "responses out of request order"
                seen = {q: off for q, (err, off) in ends.items() if err == 0}
                assert len(seen) == partitions, f"ListOffsets refused: {ends}"
                after = f"ListOffsets after {corr - 100_000 + 1} produces saw {ends}"
                if acks == 1:
                    assert seen == dict(enumerate(want)), after
                else:
                    assert all(seen[q] <= want[q] for q in seen), after
        s.sendall(list_offsets_v1(1, topic, partitions))
        _, ends = parse_list_offsets_v1(kwire.recv_frame(s))
        assert {q: off for q, (_, off) in ends.items()} == dict(enumerate(sent))


def test_answers_ready_are_not_held_behind_a_long_poll(broker):
    """Five Produce requests and then a Fetch that long-polls (3 s, at the log end) are sent in
    one write. The broker writes answers that are ready together, but none may wait in its
    buffer for a later request: every Produce answer arrives well before the Fetch's, in
    request order, and the Fetch's after its wait."""
    import kwire
    topic = unique_topic("held")
    create_topic(broker.bootstrap, topic, 1)
    version = kwire.pick_produce_version(kwire.api_versions(broker))
    n = 5
    frames = b"".join(
        kwire.produce_request(version, i, topic, 0,
                              kwire.record_batch([(None, value_for("held", i))]), acks=1)
        for i in range(n))
    wait_ms = 3000
    # Partition 0 at offset n: the end of the log once the five batches are stored.
    frames += kwire.fetch_v4_request(n, topic, {0: n}, 1 << 20, wait_ms=wait_ms)
    with kwire.connect(broker, timeout=30) as s:
        sent = time.monotonic()
        s.sendall(frames)
        answers = []
        for _ in range(n):
            answers.append(kwire.parse_produce_response(version, kwire.recv_frame(s)))
        produced_after = time.monotonic() - sent
        (corr,) = struct.unpack_from(">i", kwire.recv_frame(s), 0)
        fetched_after = time.monotonic() - sent
    assert [a[0] for a in answers] == list(range(n)), "answers out of request order"
    assert [a[3] for a in answers] == [0] * n, answers
    assert [a[4] for a in answers] == list(range(n)), "offsets not in send order"
    assert produced_after < 1.5, (
        f"the Produce answers took {produced_after:.2f} s: held behind the long-polling Fetch")
    assert corr == n
    assert fetched_after >= wait_ms / 1000 - 0.2, f"the Fetch answered after {fetched_after:.2f} s"
