"""Just enough of the Kafka wire protocol, by hand, for raw-socket tests: framing, request
headers, ApiVersions, a v2 record batch with CRC-32C, and Produce (v3-v12); and `send` for any
request kafka-python's codec builds."""

from __future__ import annotations

import socket
import struct
import time

# -- CRC-32C (Castagnoli), table driven ---------------------------------------------------

_CRC_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283

# -- primitive encoders --------------------------------------------------------------------


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def varint(n: int) -> bytes:
    return uvarint((n << 1) ^ (n >> 63))


def string(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def compact_string(s: str | None) -> bytes:
    if s is None:
        return uvarint(0)
    b = s.encode()
    return uvarint(len(b) + 1) + b


def compact_bytes(b: bytes | None) -> bytes:
    if b is None:
        return uvarint(0)
    return uvarint(len(b) + 1) + b


def read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


# -- framing -------------------------------------------------------------------------------


def request(api_key: int, api_version: int, corr: int, body: bytes, flexible: bool = False,
            client_id: str | None = "kaas-raw-test") -> bytes:
    """A complete frame: int32 size + request header (v1, or v2 if flexible) + body."""
    header = struct.pack(">hhi", api_key, api_version, corr) + string(client_id)
    if flexible:
        header += uvarint(0)  # no tagged fields
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def connect(broker, timeout: float = 10.0) -> socket.socket:
    s = socket.create_connection((broker.host, broker.port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


class Closed(Exception):
    """The peer closed (or reset) the connection."""


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = s.recv(n - len(buf))
        except ConnectionResetError as e:
            raise Closed(str(e))
        if not chunk:
            raise Closed(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_frame(s: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exact(s, 4))
    assert 0 <= size < 64 * 1024 * 1024, f"response frame size {size}"
    return recv_exact(s, size)


def closed_or_response(s: socket.socket, timeout: float = 10.0):
    """Wait for the broker to either close the connection (returns None) or send one
    response frame (returns its bytes). Raises AssertionError if it does neither in time."""
    s.settimeout(timeout)
    try:
        return recv_frame(s)
    except Closed:
        return None
    except socket.timeout:
        raise AssertionError(f"broker neither answered nor closed the connection in {timeout}s")


def wait_closed(s: socket.socket, timeout: float = 10.0) -> bytes:
    """Wait until the broker closes the connection; returns whatever bytes came before it."""
    s.settimeout(timeout)
    got = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return bytes(got)
        except socket.timeout:
            raise AssertionError(f"connection still open after {timeout}s "
                                 f"(received {len(got)} bytes)")
        if not chunk:
            return bytes(got)
        got += chunk
        if time.monotonic() > deadline:
            raise AssertionError("connection kept sending data")


def send_all_tolerant(s: socket.socket, data: bytes) -> int:
    """Send as much as the peer accepts; a reset/broken pipe just stops sending."""
    sent = 0
    try:
        while sent < len(data):
            n = s.send(data[sent:sent + 65536])
            if n == 0:
                break
            sent += n
    except (BrokenPipeError, ConnectionResetError):
        pass
    except socket.timeout:
        pass
    return sent


# -- ApiVersions -----------------------------------------------------------------------------


def parse_api_versions_v0(body: bytes) -> tuple[int, dict[int, tuple[int, int]], int]:
    """ApiVersions response v0 body (after the correlation id): error_code, [key, min, max].
    Returns (error_code, {api_key: (min, max)}, bytes consumed)."""
    (err,) = struct.unpack_from(">h", body, 0)
    (n,) = struct.unpack_from(">i", body, 2)
    pos = 6
    ranges = {}
    assert 0 <= n < 1000, f"api_keys array length {n}"
    for _ in range(n):
        k, lo, hi = struct.unpack_from(">hhh", body, pos)
        ranges[k] = (lo, hi)
        pos += 6
    return err, ranges, pos


def call(broker, api_key: int, api_version: int, body: bytes, corr: int = 9) -> bytes:
    """One non-flexible request on a fresh connection; returns its response after the
    correlation id, which is checked."""
    with connect(broker) as s:
        s.sendall(request(api_key, api_version, corr, body))
        resp = recv_frame(s)
    (got,) = struct.unpack_from(">i", resp, 0)
    assert got == corr, (got, corr)
    return resp[4:]


def send(broker, request, client_id: str = "kaas-test"):
    """One request built by kafka-python's codec (`kafka.protocol`, every API at every version)
    on a fresh connection to `broker` (anything with .host and .port); returns the decoded
    response, in which a null string is None and an empty one "". """
    import io

    request.with_header(correlation_id=7, client_id=client_id)
    with connect(broker) as s:
        s.sendall(request.encode(framed=True, header=True))
        frame = recv_frame(s)
    response_class = request.header.get_response_class()
    buf = io.BytesIO(frame)
    header = response_class.parse_header(buf)
    assert header.correlation_id == 7, header
    return response_class.decode(buf)


def api_versions(broker) -> dict[int, tuple[int, int]]:
    """Ask the broker for its ApiVersions (v0) and return {api_key: (min, max)}."""
    err, ranges, _ = parse_api_versions_v0(call(broker, 18, 0, b"", corr=1))
    assert err == 0, f"ApiVersions v0 error {err}"
    return ranges


def create_topic_assigned(broker, topic: str, assignments: dict[int, list[int]]) -> int:
    """CreateTopics v2 for one topic with an explicit replica assignment {partition: [broker
    ids]}, which clients' admin APIs cannot express with gaps; returns the topic's error code."""
    body = struct.pack(">i", 1) + string(topic) + struct.pack(">ih", -1, -1)
    body += struct.pack(">i", len(assignments))
    for p, ids in assignments.items():
        body += struct.pack(">ii", p, len(ids)) + b"".join(struct.pack(">i", i) for i in ids)
    body += struct.pack(">i", 0)  # no configs
    body += struct.pack(">ib", 10000, 0)  # timeout_ms, validate_only
    resp = call(broker, 19, 2, body)
    _throttle, count = struct.unpack_from(">ii", resp, 0)
    assert count == 1, count
    (name_len,) = struct.unpack_from(">h", resp, 8)
    (error,) = struct.unpack_from(">h", resp, 10 + name_len)
    return error


def _read_string(resp: bytes, pos: int) -> tuple[str | None, int]:
    (n,) = struct.unpack_from(">h", resp, pos)
    if n < 0:
        return None, pos + 2
    return resp[pos + 2:pos + 2 + n].decode(), pos + 2 + n


def topic_admin_raw(broker, api: str, names: list[str], count: int = 1) -> list[tuple]:
    """One CreateTopics v2, DeleteTopics v1 or CreatePartitions v1 request naming `names` as
    given, duplicates included (clients' admin APIs dedupe or refuse those themselves); returns
    the response's (name, error code, error message or None) rows in order. `count` is the
    partition count (CreateTopics, CreatePartitions)."""
    if api == "create_topics":
        key, version = 19, 2
        body = struct.pack(">i", len(names)) + b"".join(
            string(n) + struct.pack(">ihii", count, 1, 0, 0) for n in names)
        body += struct.pack(">ib", 10000, 0)
    elif api == "delete_topics":
        key, version = 20, 1
        body = struct.pack(">i", len(names)) + b"".join(string(n) for n in names)
        body += struct.pack(">i", 10000)
    elif api == "create_partitions":
        key, version = 37, 1
        body = struct.pack(">i", len(names)) + b"".join(
            string(n) + struct.pack(">ii", count, -1) for n in names)
        body += struct.pack(">ib", 10000, 0)
    else:
        raise ValueError(api)
    resp = call(broker, key, version, body)
    _throttle, rows = struct.unpack_from(">ii", resp, 0)
    pos, out = 8, []
    for _ in range(rows):
        name, pos = _read_string(resp, pos)
        (error,) = struct.unpack_from(">h", resp, pos)
        pos += 2
        message = None
        if api != "delete_topics":
            message, pos = _read_string(resp, pos)
        out.append((name, error, message or None))  # null and "" alike: no message
    return out


def describe_configs_raw(broker, broker_id: str, names: list[str]) -> dict[str, str | None]:
    """DescribeConfigs v3 of broker `broker_id`'s configs `names`, documentation included
    (the admin clients do not ask for it); returns {name: documentation or None}."""
    body = struct.pack(">ib", 1, 4) + string(broker_id) + struct.pack(">i", len(names))
    body += b"".join(string(n) for n in names) + struct.pack(">bb", 0, 1)
    resp = call(broker, 32, 3, body)
    _throttle, results = struct.unpack_from(">ii", resp, 0)
    assert results == 1, results
    (error,) = struct.unpack_from(">h", resp, 8)
    message, pos = _read_string(resp, 10)
    assert error == 0, (error, message)
    _rname, pos = _read_string(resp, pos + 1)  # after the resource type
    (count,) = struct.unpack_from(">i", resp, pos)
    pos += 4
    out = {}
    for _ in range(count):
        name, pos = _read_string(resp, pos)
        _value, pos = _read_string(resp, pos)
        pos += 3  # read_only, config_source, is_sensitive
        (synonyms,) = struct.unpack_from(">i", resp, pos)
        pos += 4
        for _ in range(max(synonyms, 0)):
            _n, pos = _read_string(resp, pos)
            _v, pos = _read_string(resp, pos)
            pos += 1
        pos += 1  # config_type
        out[name], pos = _read_string(resp, pos)
    return out


# -- record batches and Produce ------------------------------------------------------------


def record_batch(records: list[tuple[bytes | None, bytes | None]], base_offset: int = 0,
                 timestamp_ms: int | None = None, magic: int = 2,
                 producer_id: int = -1, producer_epoch: int = -1,
                 base_sequence: int = -1) -> bytes:
    """An uncompressed magic-2 record batch with a correct CRC-32C."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    recs = bytearray()
    for i, (k, v) in enumerate(records):
        body = bytearray()
        body += b"\x00"                 # attributes
        body += varint(0)               # timestamp delta
        body += varint(i)               # offset delta
        body += varint(-1) if k is None else varint(len(k)) + k
        body += varint(-1) if v is None else varint(len(v)) + v
        body += varint(0)               # headers
        recs += varint(len(body)) + body
    after_crc = struct.pack(">hiqqqhii", 0, len(records) - 1, ts, ts, producer_id,
                            producer_epoch, base_sequence, len(records)) + bytes(recs)
    crc = crc32c(after_crc)
    after_len = struct.pack(">ibI", -1, magic, crc) + after_crc
    return struct.pack(">qi", base_offset, len(after_len)) + after_len


def batch_sizes(records: bytes) -> list[int]:
    """The sizes of the whole batches in a Fetch answer's records, in order (a trailing part
    of a batch, which Kafka may send, is left out)."""
    sizes, pos = [], 0
    while len(records) - pos >= 12:
        (length,) = struct.unpack_from(">i", records, pos + 8)
        if pos + 12 + length > len(records):
            break
        sizes.append(12 + length)
        pos += 12 + length
    return sizes


CRC_OFFSET = 8 + 4 + 4 + 1  # base offset, batch length, leader epoch, magic


def produce_request(version: int, corr: int, topic: str, partition: int, batch: bytes,
                    acks: int = -1, timeout_ms: int = 10000) -> bytes:
    if version >= 13:
        raise ValueError("Produce v13+ addresses topics by id; use <= 12")
    if version >= 9:
        body = (compact_string(None) + struct.pack(">hi", acks, timeout_ms)
                + uvarint(2) + compact_string(topic)
                + uvarint(2) + struct.pack(">i", partition) + compact_bytes(batch) + uvarint(0)
                + uvarint(0)
                + uvarint(0))
        return request(0, version, corr, body, flexible=True)
    body = (string(None) + struct.pack(">hi", acks, timeout_ms)
            + struct.pack(">i", 1) + string(topic)
            + struct.pack(">i", 1) + struct.pack(">i", partition)
            + struct.pack(">i", len(batch)) + batch)
    return request(0, version, corr, body)


def fetch_v4_request(corr: int, topic: str, offsets: dict[int, int], partition_max: int,
                     wait_ms: int = 500) -> bytes:
    """Fetch v4: replica -1, waiting up to `wait_ms` for 1 byte, max 64 MiB, read_uncommitted;
    up to `partition_max` bytes of each partition from its offset in `offsets`."""
    body = struct.pack(">iiiib", -1, wait_ms, 1, 64 << 20, 0)
    body += struct.pack(">i", 1) + string(topic) + struct.pack(">i", len(offsets))
    for p, off in offsets.items():
        body += struct.pack(">iqi", p, off, partition_max)
    return request(1, 4, corr, body)


def parse_produce_response(version: int, frame: bytes) -> tuple[int, str, int, int, int]:
    """Returns (correlation id, topic, partition, error_code, base_offset) of the first
    partition in a Produce response (v3-v12)."""
    (corr,) = struct.unpack_from(">i", frame, 0)
    pos = 4
    if version >= 9:
        _, pos = read_uvarint(frame, pos)          # response header tagged fields
        _n_topics, pos = read_uvarint(frame, pos)
        ln, pos = read_uvarint(frame, pos)
        name = frame[pos:pos + ln - 1].decode()
        pos += ln - 1
        _n_parts, pos = read_uvarint(frame, pos)
    else:
        pos += 4                                   # topics array length
        (ln,) = struct.unpack_from(">h", frame, pos)
        pos += 2
        name = frame[pos:pos + ln].decode()
        pos += ln
        pos += 4                                   # partitions array length
    idx, err, base = struct.unpack_from(">ihq", frame, pos)
    return corr, name, idx, err, base


def produce_log_start_offset(version: int, frame: bytes) -> int:
    """The log_start_offset of the first partition in a Produce response (v5-v8, whose
    partition entry is index, error, base offset, log append time, log start offset)."""
    assert 5 <= version <= 8, version
    (ln,) = struct.unpack_from(">h", frame, 8)
    pos = 4 + 4 + 2 + ln + 4 + 4 + 2 + 8 + 8
    (log_start,) = struct.unpack_from(">q", frame, pos)
    return log_start


def produce(s: socket.socket, version: int, corr: int, topic: str, partition: int,
            batch: bytes) -> tuple[int, int]:
    """One Produce (acks=all) of `batch` on the open connection `s`; returns (error code, base
    offset) of its answer, whose correlation id is checked."""
    s.sendall(produce_request(version, corr, topic, partition, batch))
    got, _, _, err, base = parse_produce_response(version, recv_frame(s))
    assert got == corr, (got, corr)
    return err, base


def pick_produce_version(ranges: dict[int, tuple[int, int]]) -> int:
    lo, hi = ranges[0]
    v = min(hi, 12)
    assert v >= max(lo, 3), f"broker Produce range {lo}..{hi} has no version 3..12"
    return v


# -- InitProducerId ---------------------------------------------------------------------------


def init_producer_id(broker, ranges: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """Ask for an idempotent producer id (no transactional id); returns (id, epoch)."""
    lo, hi = ranges[22]
    version = 1 if lo <= 1 <= hi else min(hi, 4)
    if version >= 2:
        body = compact_string(None) + struct.pack(">i", 60000)
        if version >= 3:
            body += struct.pack(">qh", -1, -1)
        body += uvarint(0)
        frame = request(22, version, 9, body, flexible=True)
    else:
        frame = request(22, version, 9, string(None) + struct.pack(">i", 60000))
    deadline = time.monotonic() + 30
    while True:
        with connect(broker) as s:
            s.sendall(frame)
            resp = recv_frame(s)
        pos = 4
        if version >= 2:
            _, pos = read_uvarint(resp, pos)
        _throttle, err, pid, epoch = struct.unpack_from(">ihqh", resp, pos)
        # 14/15/16: coordinator loading / not available / not coordinator: retriable
        if err in (14, 15, 16) and time.monotonic() < deadline:
            time.sleep(0.5)
            continue
        assert err == 0, f"InitProducerId v{version} error {err}"
        return pid, epoch
