"""Fetch responses leave kaas through `sendfile` (issue 16): large record sets go from the page
cache to the socket without being copied. What a consumer reads must still be exactly what was
acknowledged, batch for batch and in offset order — also when the consumer reads slowly, so
that the broker's socket fills in the middle of a record set and the rest waits for room, when
one response carries partitions that different shards own (a slice mapped by one shard is sent
by another), and when a read spans sealed segments and the active one. A consumer reading
history from a slow disk must not stall the shard's other work while `sendfile` waits for it.

The check is a raw Fetch v4 client with a 4 KiB receive buffer that sleeps as it reads, and it
verifies every batch's CRC-32C and every record's value against what the producer sent."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import Broker

from kcheck import create_topic, unique_topic
from kwire import (connect, crc32c, fetch_v4_request, parse_produce_response, produce_request,
                   read_uvarint, recv_exact, record_batch)

PARTITIONS = 4
BATCHES_PER_PARTITION = 40
RECORDS_PER_BATCH = 64
VALUE_BYTES = 1000
FETCH_PARTITION_MAX_BYTES = 4 << 20


def value(partition: int, batch: int, record: int) -> bytes:
    return f"p{partition}-b{batch:04d}-r{record:03d}-".encode().ljust(VALUE_BYTES, b"x")


def produce_all(broker, topic: str, partitions: int = PARTITIONS,
                batches: int = BATCHES_PER_PARTITION) -> None:
    """Every batch acknowledged with acks=all, one request at a time (so offsets are known:
    batch b of a partition holds offsets b * RECORDS_PER_BATCH onwards)."""
    s = connect(broker, timeout=30)
    corr = 0
    for b in range(batches):
        for p in range(partitions):
            batch = record_batch([(None, value(p, b, r)) for r in range(RECORDS_PER_BATCH)])
            corr += 1
            s.sendall(produce_request(7, corr, topic, p, batch, acks=-1))
            (size,) = struct.unpack(">i", recv_exact(s, 4))
            got_corr, _, _, err, base = parse_produce_response(7, recv_exact(s, size))
            assert (got_corr, err) == (corr, 0), (got_corr, err)
            assert base == b * RECORDS_PER_BATCH, (p, b, base)
    s.close()


def recv_slowly(s: socket.socket, n: int) -> bytes:
    """Reads n bytes 4 KiB at a time, pausing every 32 KiB, so the broker's socket stays full."""
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(4096, n - len(buf)))
        assert chunk, f"connection closed after {len(buf)} of {n} bytes"
        buf += chunk
        if len(buf) % (32 << 10) < len(chunk):
            time.sleep(0.001)
    return bytes(buf)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint, as record fields are encoded."""
    u, pos = read_uvarint(buf, pos)
    return (u >> 1) ^ -(u & 1), pos


def batches(records: bytes):
    """(base offset, [values]) for each whole batch, after checking its CRC-32C."""
    pos = 0
    while pos + 12 <= len(records):
        base, length = struct.unpack_from(">qi", records, pos)
        end = pos + 12 + length
        if end > len(records):
            return  # a partial batch at the end of a response is allowed; fetched again
        (crc,) = struct.unpack_from(">I", records, pos + 17)
        assert crc32c(records[pos + 21:end]) == crc, f"CRC mismatch in the batch at {base}"
        (count,) = struct.unpack_from(">i", records, pos + 57)
        rpos, values = pos + 61, []
        for _ in range(count):
            _len, rpos = read_varint(records, rpos)
            rpos += 1                                    # attributes
            _, rpos = read_varint(records, rpos)         # timestamp delta
            _, rpos = read_varint(records, rpos)         # offset delta
            klen, rpos = read_varint(records, rpos)
            rpos += max(klen, 0)
            vlen, rpos = read_varint(records, rpos)
            values.append(records[rpos:rpos + vlen])
            rpos += vlen
            _, rpos = read_varint(records, rpos)         # headers (none)
        assert rpos == end, f"batch at {base} has {end - rpos} bytes after its records"
        yield base, values
        pos = end


def parse_fetch_v4(frame: bytes) -> dict[int, tuple[int, bytes]]:
    """partition → (error code, records) of a one-topic Fetch v4 response."""
    pos = 4 + 4                                          # correlation id, throttle
    (n_topics,) = struct.unpack_from(">i", frame, pos)
    assert n_topics == 1
    (ln,) = struct.unpack_from(">h", frame, pos + 4)
    pos += 6 + ln
    (n_parts,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    out = {}
    for _ in range(n_parts):
        p, err, _hw, _lso, n_aborted = struct.unpack_from(">ihqqi", frame, pos)
        pos += 4 + 2 + 8 + 8 + 4 + max(n_aborted, 0) * 16
        (rlen,) = struct.unpack_from(">i", frame, pos)
        pos += 4
        out[p] = (err, frame[pos:pos + max(rlen, 0)])
        pos += max(rlen, 0)
    assert pos == len(frame), f"{len(frame) - pos} bytes after the last partition"
    return out


def test_a_slow_consumer_reads_exactly_what_was_acknowledged(broker):
    topic = unique_topic("sendfile")
    # 1 MiB segments: each partition's 2.6 MB is two sealed segments and the active one.
    create_topic(broker.bootstrap, topic, PARTITIONS, {"segment.bytes": str(1 << 20)})
    produce_all(broker, topic)
    end = BATCHES_PER_PARTITION * RECORDS_PER_BATCH

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect((broker.host, broker.port))
    responses = read_back(s, topic, end, recv_slowly)
    s.close()
    # Each response carried several MiB: the slow reads really did wait on a full socket.
    assert responses < BATCHES_PER_PARTITION, responses


def read_back(s: socket.socket, topic: str, end: int, recv=recv_exact) -> int:
    """Fetches every partition from offset 0 to `end` on `s`, checking each batch's CRC and
    every record against what `produce_all` sent, in offset order; returns the responses."""
    offsets = {p: 0 for p in range(PARTITIONS)}
    corr = 0
    deadline = time.monotonic() + 120
    while any(o < end for o in offsets.values()):
        assert time.monotonic() < deadline, f"not read back in time: {offsets}"
        corr += 1
        s.sendall(fetch_v4_request(corr, topic, {p: o for p, o in offsets.items() if o < end},
                                    FETCH_PARTITION_MAX_BYTES))
        (size,) = struct.unpack(">i", recv_exact(s, 4))
        frame = recv(s, size)
        assert struct.unpack_from(">i", frame)[0] == corr
        for p, (err, records) in parse_fetch_v4(frame).items():
            assert err == 0, (p, err)
            for base, vals in batches(records):
                assert base == offsets[p], f"partition {p}: batch at {base}, expected {offsets[p]}"
                b = base // RECORDS_PER_BATCH
                assert vals == [value(p, b, r) for r in range(RECORDS_PER_BATCH)], (p, base)
                offsets[p] = base + len(vals)
    assert offsets == {p: end for p in range(PARTITIONS)}
    return corr


def test_a_segment_cut_under_a_reader_closes_the_connection(broker_factory):
    """A segment file that ends before the data the broker knows of (something truncated it:
    another broker's recovery in cluster mode, or a hand on the volume) cannot complete a
    response. The broker must close the connection at once, so the client sees the failure
    and retries, instead of leaving half a frame on a live connection until the client's
    request timeout (which is what happened before: the writer stopped, the socket stayed
    open)."""
    b = broker_factory(shards=1)
    topic = unique_topic("sendfile-cut")
    create_topic(b.bootstrap, topic, 1, {"segment.bytes": str(1 << 20)})
    produce_all(b, topic, partitions=1)
    segments = sorted(b.data_dir.glob(f"{topic}~*/0/*.log"))
    assert len(segments) >= 2, segments
    first = segments[0]
    os.truncate(first, first.stat().st_size - 100)

    s = connect(b, timeout=15)
    s.sendall(fetch_v4_request(1, topic, {0: 0}, FETCH_PARTITION_MAX_BYTES))
    started = time.monotonic()
    (size,) = struct.unpack(">i", recv_exact(s, 4))
    got = 0
    try:
        while got < size:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += len(chunk)
    except ConnectionResetError:
        pass
    except socket.timeout:
        raise AssertionError(f"the connection stayed open with {got} of {size} bytes of a "
                             f"response for {time.monotonic() - started:.0f} s")
    s.close()
    assert got < size, "a whole response from a segment that was cut short"
    assert "could not be read from its segment file" in b.log_text()


def resident_bytes(files) -> int | None:
    """How many bytes of the files are in the page cache (util-linux `fincore`), or None
    without the tool."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES",
                              *map(str, files)], capture_output=True, text=True, check=True)
    except (FileNotFoundError, subprocess.CalledProcessError):
        return None
    return sum(int(line) for line in out.stdout.split())


def read_cold_history(b, name: str) -> tuple[int, int, int]:
    """Fills a topic of `b`, evicts its segments from the page cache and reads it all back
    (every batch's CRC and every record checked). Returns the segments' size and how much of
    it was in the page cache before and after the read."""
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(b.data_dir)], capture_output=True,
                        text=True).stdout.strip()
    if fs in ("tmpfs", "ramfs", "overlayfs"):
        pytest.skip(f"the data directory is on {fs}: its page cache is its storage")
    topic = unique_topic(name)
    create_topic(b.bootstrap, topic, PARTITIONS, {"segment.bytes": str(2 << 20)})
    produce_all(b, topic)
    end = BATCHES_PER_PARTITION * RECORDS_PER_BATCH
    files = sorted(b.data_dir.glob(f"{topic}~*/*/*.log"))
    total = sum(f.stat().st_size for f in files)
    evict(files)
    before = resident_bytes(files)
    if before is None:
        pytest.skip("no fincore (util-linux) to see the page cache with")
    assert before < total // 10, f"{before} of {total} bytes still cached after eviction"
    s = connect(b, timeout=30)
    read_back(s, topic, end)
    s.close()
    after = resident_bytes(files)
    print(f"{total} bytes of history read back; in the page cache before {before}, after {after}")
    return total, before, after


def cold_reads_past_page_cache(b) -> bool:
    """What the broker says (/healthz) it does now with history that is not cached."""
    with urllib.request.urlopen(b.health_url + "/healthz", timeout=5) as r:
        storage = json.load(r)["storage"]
    return storage["cold_reads_past_page_cache"]


def test_history_read_back_stays_out_of_the_page_cache(broker_factory):
    """With `--cold-reads direct` (what `auto` does under a memory limit the broker is close
    to), history whose pages left the page cache is read past it (`O_DIRECT`), so a consumer
    catching up does not fill the page cache with pages read once. In a pod the page cache is
    charged to the broker's memory limit: reading 5 GiB back in a 1 GiB cgroup made every page
    read reclaim one first, on the broker's threads, and the read ran at 36-39% of the same read
    from an unlimited page cache. Before, `sendfile` left every page it sent in the page cache
    (and each read of batch headers brought up to the disk's readahead, 8 MiB on the benchmark
    machine, along with it). What the consumer reads must still be exactly what was
    acknowledged, with the response's record sets cut into windows that are read from disk
    while earlier ones are written, across both shards."""
    b = broker_factory(shards=2, extra_args=["--cold-reads", "direct"])
    assert cold_reads_past_page_cache(b)
    total, before, after = read_cold_history(b, "cold-direct")
    # What a read still brings into the page cache is the batch headers it looks up: with
    # 64 KB batches and 4 MiB per partition per fetch, a few percent.
    assert after - before < total // 4, (
        f"reading the history back left {after - before} of its {total} bytes in the page cache")


def test_history_read_back_stays_cached_where_memory_allows(broker_factory):
    """By default (`--cold-reads auto`) history is read past the page cache only under a
    memory limit the broker is close to. Without one, what a consumer read stays in the page
    cache, so the next reader of it reads memory, as with Kafka. When every cold read went
    past the page cache (cc09311 to f041c14), a second read of 3 GB of history went to the
    disk again: 1.04M msg/s against 2.41M, pinned, and 0.49x Kafka's rate."""
    b = broker_factory(shards=2)
    if cold_reads_past_page_cache(b):
        pytest.skip("this machine's memory cgroup is within a quarter of its limit: "
                    "the broker reads cold history past the page cache here, as it should")
    total, before, after = read_cold_history(b, "cold-cached")
    assert after - before > total * 9 // 10, (
        f"reading the history back left only {after - before} of its {total} bytes in the "
        "page cache, with room to spare")


BLKIO = Path("/sys/fs/cgroup/blkio")
# The history the cold reader reads: 160 batches of 64 KB, about 10 MB, at 2 MiB/s.
HISTORY_BATCHES = 160
READ_BPS = 2 << 20


def evict(files) -> None:
    """Drops the files' clean pages from the page cache, so that reading them needs the disk."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.mark.parametrize("acks,readers", [(1, 1), (-1, 1), (-1, 8)],
                         ids=["acks1", "acks_all", "acks_all_8_readers"])
def test_a_consumer_reading_from_a_slow_disk_does_not_stall_the_shard(tmp_path, acks, readers):
    """`sendfile` reads pages that are not in the page cache synchronously. On the shard's
    thread, a consumer catching up on history stalled every other request on the shard for
    the disk: an acks=1 produce to another partition waited seconds (the whole 4 MiB of the
    reader's partition was sent before the shard did anything else). Here the data volume's
    reads are throttled to 2 MiB/s (a blkio cgroup on a loop-mounted ext4) and the history's
    pages evicted; while raw consumers read the 10 MB back slowly through a small receive
    buffer — every batch and record checked — a producer on the same one-shard broker must
    keep being acknowledged within 1 s. With acks=all the group commit's `syncfs` runs on the
    shard's blocking threads, where the cold reads now run too: with one such thread it
    waited behind them (1.65 s), so a shard has several; and with eight consumers reading
    eight partitions at once the cold reads took all four threads (1.65-1.80 s), so a shard
    runs only two at a time."""
    from test_full_disk import mount_volume

    throttle_file = BLKIO / "blkio.throttle.read_bps_device"
    if os.geteuid() != 0 or not throttle_file.exists():
        pytest.skip("needs root and the cgroup-v1 blkio throttle to make a slow disk")
    volume = tmp_path / "volume"
    mount_volume("ext4", volume, tmp_path / "volume.img")
    group = BLKIO / f"kaas-test-{os.getpid()}"
    (tmp_path / "broker").mkdir()
    b = Broker(tmp_path / "broker", shards=1)
    b.data_dir = volume / "data"
    try:
        b.start()
        history, live = unique_topic("cold-history"), unique_topic("cold-live")
        create_topic(b.bootstrap, history, readers, {"segment.bytes": str(8 << 20)})
        create_topic(b.bootstrap, live, 1)
        per_partition = HISTORY_BATCHES // readers
        produce_all(b, history, partitions=readers, batches=per_partition)
        end = per_partition * RECORDS_PER_BATCH
        live_conn = connect(b, timeout=30)
        corr = 0

        def produce_live() -> float:
            """One produce to the live topic; returns its round trip in seconds."""
            nonlocal corr
            corr += 1
            batch = record_batch([(None, b"live-%d" % corr)])
            t0 = time.monotonic()
            live_conn.sendall(produce_request(7, corr, live, 0, batch, acks=acks))
            (size,) = struct.unpack(">i", recv_exact(live_conn, 4))
            got_corr, _, _, err, _ = parse_produce_response(7, recv_exact(live_conn, size))
            assert (got_corr, err) == (corr, 0), (got_corr, err)
            return time.monotonic() - t0

        produce_live()  # the live partition's log is open and its tail page cached

        # A slow disk: the broker's reads from the loop device at READ_BPS, its history cold.
        dev = subprocess.run(["findmnt", "-no", "SOURCE", str(volume)], capture_output=True,
                             text=True, check=True).stdout.strip()
        rdev = os.stat(dev).st_rdev
        group.mkdir()
        (group / "blkio.throttle.read_bps_device").write_text(
            f"{os.major(rdev)}:{os.minor(rdev)} {READ_BPS}\n")
        (group / "cgroup.procs").write_text(str(b.pid))
        evict(b.data_dir.glob(f"{history}~*/*/*.log"))

        reads = [{"offset": 0, "error": None, "seconds": None} for _ in range(readers)]

        def read_history(p: int):
            read = reads[p]
            try:
                # A small receive buffer read slowly: the broker's socket fills in the middle
                # of cold record sets, and the rest waits for room.
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.settimeout(60)
                s.connect((b.host, b.port))
                t0 = time.monotonic()
                corr = 0
                while read["offset"] < end:
                    corr += 1
                    s.sendall(fetch_v4_request(corr, history, {p: read["offset"]},
                                                    FETCH_PARTITION_MAX_BYTES))
                    (size,) = struct.unpack(">i", recv_exact(s, 4))
                    frame = recv_slowly(s, size)
                    err, records = parse_fetch_v4(frame)[p]
                    assert err == 0, err
                    for base, vals in batches(records):
                        assert base == read["offset"], (base, read["offset"])
                        bi = base // RECORDS_PER_BATCH
                        assert vals == [value(p, bi, r) for r in range(RECORDS_PER_BATCH)], base
                        read["offset"] = base + len(vals)
                read["seconds"] = time.monotonic() - t0
                s.close()
            except BaseException as e:  # reported by the main thread
                read["error"] = e

        threads = [threading.Thread(target=read_history, args=(p,), daemon=True)
                   for p in range(readers)]
        for t in threads:
            t.start()
        latencies = []
        deadline = time.monotonic() + 120
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            latencies.append(produce_live())
            time.sleep(0.05)
        for t in threads:
            t.join(timeout=5)
        for p, read in enumerate(reads):
            assert read["error"] is None, (p, read["error"])
            assert read["offset"] == end, f"partition {p}: read {read['offset']} of {end} in time"
        history_bytes = readers * per_partition * RECORDS_PER_BATCH * VALUE_BYTES
        seconds = max(read["seconds"] for read in reads)
        # The disk really was slow: otherwise nothing here could have stalled.
        assert seconds > 0.5 * history_bytes / READ_BPS, seconds
        worst = max(latencies)
        print(f"history read from the throttled disk by {readers} consumers in {seconds:.1f} s; "
              f"{len(latencies)} live produces meanwhile, slowest {worst * 1000:.0f} ms")
        assert worst < 1.0, (f"an acks={acks} produce on the shard waited {worst:.2f} s while a "
                             f"consumer read from disk (latencies {sorted(latencies)[-5:]})")
        live_conn.close()
    finally:
        if group.exists():
            try:
                (BLKIO / "cgroup.procs").write_text(str(b.pid))
            except OSError:
                pass  # the broker is gone
        b.close()
        if group.exists():
            group.rmdir()
        subprocess.run(["umount", "-l", str(volume)], check=False)


def next_offset(records: bytes, offset: int) -> int:
    """The offset after the last whole batch in `records`. Only the headers are walked:
    checking 1.2 GB of CRCs in Python (`batches`) would take minutes."""
    pos = 0
    while pos + 61 <= len(records):
        base, length = struct.unpack_from(">qi", records, pos)
        if pos + 12 + length > len(records):
            break
        (last_delta,) = struct.unpack_from(">i", records, pos + 23)
        offset = base + last_delta + 1
        pos += 12 + length
    return offset


def test_reading_many_partitions_history_keeps_the_mapped_pages_bounded(broker_factory):
    """What a shard's reads leave mapped in the broker is bounded (storage/src/resident.rs: 128
    MiB of recorded ranges per shard, released in whole folios), however much history
    consumers read back. Before the budget, reading 12 GB of history left a VmRSS of 12 GB. A
    consumer of 100 partitions reads 1.2 GB of history round robin, twice:

    - from the page cache, 64 KiB of each partition per fetch: record sets that small are
      copied out of the mapping, so every page read is mapped, and the budget is what bounds
      them (RssFile grew by 385 MiB reading 395 MiB back with the budget disabled);
    - from disk (the segments evicted first), 1 MiB per fetch, sent with `sendfile`: only
      batch headers are read through the mapping, but readahead fills the page cache in large
      folios, and a fault maps the whole folio. Released by the range read alone, the folios'
      other pages stayed mapped and RssFile grew with the history read (at d9f40e4 from 272
      MiB halfway through to 333 MiB at the end); now it must not grow between the middle of
      the read and its end (220 MiB halfway, 85 MiB at the end: the budget, and up to a folio
      on either side of each partition's newest range)."""
    b = broker_factory(shards=1)
    topic = unique_topic("resident")
    partitions, batches_per_partition, records_per_batch = 100, 768, 16
    create_topic(b.bootstrap, topic, partitions)
    # One batch of 1,000-byte values, sent to every partition: the broker assigns offsets and
    # the CRC does not cover them, so the same bytes are valid everywhere.
    batch = record_batch([(None, value(0, 0, r)) for r in range(records_per_batch)])
    s = connect(b, timeout=60)
    requests = [produce_request(7, 0, topic, p, batch, acks=1) for p in range(partitions)]
    total = partitions * batches_per_partition
    failures = []

    def send_all():
        try:
            for n in range(total):
                req = requests[n % partitions]
                # The correlation id follows the frame size, api key and version.
                s.sendall(req[:8] + struct.pack(">i", n) + req[12:])
        except OSError as e:
            failures.append(e)

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    for n in range(total):
        (size,) = struct.unpack(">i", recv_exact(s, 4))
        corr, _, _, err, _ = parse_produce_response(7, recv_exact(s, size))
        assert (corr, err) == (n, 0), (corr, err)
    sender.join(timeout=30)
    assert not failures, failures
    end = batches_per_partition * records_per_batch
    stored = total * len(batch)

    buf = bytearray(64 << 20)
    view = memoryview(buf)
    corr = 0

    def read_history(partition_max: int) -> tuple[int, int]:
        """Reads every partition to its end, round robin; RssFile (KiB) once every partition
        is past the middle of its history, and at the end."""
        nonlocal corr
        offsets = dict.fromkeys(range(partitions), 0)
        middle = None
        while any(off < end for off in offsets.values()):
            corr += 1
            wanted = {p: off for p, off in offsets.items() if off < end}
            s.sendall(fetch_v4_request(corr, topic, wanted, partition_max))
            (size,) = struct.unpack(">i", recv_exact(s, 4))
            assert size <= len(buf), size
            got = 0
            while got < size:
                n = s.recv_into(view[got:size])
                assert n, f"closed after {got} of {size} bytes"
                got += n
            progressed = False
            for p, (err, records) in parse_fetch_v4(bytes(view[:size])).items():
                assert err == 0, (p, err)
                offsets[p], before = next_offset(records, offsets[p]), offsets[p]
                progressed |= offsets[p] > before
            assert progressed, f"a fetch at {wanted} returned no whole batch"
            if middle is None and min(offsets.values()) >= end // 2:
                middle = b.status_kib("RssFile")
        return middle, b.status_kib("RssFile")

    baseline = b.status_kib("RssFile")
    _, copied = read_history(64 << 10)
    evict(b.data_dir.glob(f"{topic}~*/*/*.log"))
    middle, cold = read_history(1 << 20)
    s.close()
    print(f"{stored >> 20} MiB stored; RssFile {baseline >> 10} MiB before reading it back, "
          f"{copied >> 10} MiB after reading it 64 KiB at a time, {middle >> 10} and "
          f"{cold >> 10} MiB halfway through and after reading it from disk")
    # The ranges recorded stay within the budget; each may map up to 64 KiB on either side
    # of it (the lead recorded before a range, the kernel's fault-around after it): 100
    # partitions' ranges add at most 13 MiB, and one range of up to 8 MiB may be recorded
    # before the oldest are released.
    assert copied - baseline <= (128 + 24) << 10, (
        f"RssFile grew by {(copied - baseline) >> 10} MiB reading {stored >> 20} MiB of "
        "history back: past the 128 MiB a shard keeps mapped")
    assert cold - middle <= 16 << 10, (
        f"RssFile grew from {middle >> 10} to {cold >> 10} MiB over the second half of the "
        "history read from disk: what the reads mapped was not released")
    b.close()
    shutil.rmtree(b.data_dir, ignore_errors=True)  # 1.2 GB no later test needs
