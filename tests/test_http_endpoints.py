"""The health address of a kaas broker: /readyz, /healthz (JSON) and /metrics (Prometheus
text, or OpenMetrics on request), as an operator, a Kubernetes probe or Prometheus would use
them."""

from __future__ import annotations

import glob
import http.client
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from kcheck import create_topic, rdkafka_produce, rdkafka_read_all, unique_topic


def get(broker, path):
    try:
        with urllib.request.urlopen(broker.health_url + path, timeout=5) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


@pytest.fixture(scope="module")
def kaas(broker):
    if broker.kind != "kaas":
        pytest.skip("health endpoints are kaas's own")
    return broker


def test_readyz_and_healthz(kaas):
    """/readyz answers 200 on a serving broker and /healthz is a JSON document naming the
    shards and the version."""
    status, _, _ = get(kaas, "/readyz")
    assert status == 200
    status, ctype, body = get(kaas, "/healthz")
    assert status == 200, body
    doc = json.loads(body)
    assert isinstance(doc, dict), doc
    text = json.dumps(doc).lower()
    assert "shard" in text and "version" in text, doc
    status, _, _ = get(kaas, "/no-such-path")
    assert status == 404


METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+\d+)?$')


def parse_metrics(body):
    samples, types = [], {}
    for line in body.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            m = re.match(r"# TYPE (\S+) (\S+)", line)
            if m:
                types[m.group(1)] = m.group(2)
            continue
        m = METRIC_LINE.match(line)
        assert m, f"not Prometheus text format: {line!r}"
        float(m.group(3).replace("+Inf", "inf").replace("-Inf", "-inf"))
        samples.append((m.group(1), m.group(2) or "", float(m.group(3).replace("Inf", "inf"))))
    return samples, types


def test_metrics_count_traffic(kaas):
    """/metrics is valid Prometheus text; after produce and fetch traffic it shows request
    counts, bytes in and out, and at least one latency histogram."""
    topic = unique_topic("metrics")
    create_topic(kaas.bootstrap, topic, 2)
    rdkafka_produce(kaas.bootstrap, topic, ((b"k%d" % i, b"x" * 100) for i in range(2000)))
    rdkafka_read_all(kaas.bootstrap, topic, 2)
    status, _, body = get(kaas, "/metrics")
    assert status == 200
    samples, types = parse_metrics(body)
    assert samples, "no samples"
    names = {n for n, _, _ in samples}
    assert any("request" in n for n in names), sorted(names)
    assert any("bytes" in n and v > 200_000 for n, _, v in samples), \
        "no byte counter reached the ~200 KB produced"
    assert "histogram" in types.values(), types
    # Per topic (Kafka's BrokerTopicMetrics): exactly the records produced, their bytes in, and
    # at least as many bytes out as the consumer read.
    per_topic = {n: v for n, labels, v in samples if labels == f'{{topic="{topic}"}}'}
    assert per_topic.get("kaas_topic_records_in_total") == 2000, per_topic
    assert per_topic.get("kaas_topic_bytes_in_total", 0) > 200_000, per_topic
    assert per_topic.get("kaas_topic_bytes_out_total", 0) >= per_topic["kaas_topic_bytes_in_total"], per_topic


OPENMETRICS = "application/openmetrics-text"

# Every family /metrics had before it was built with prometheus-client, plus kaas_build_info,
# by the name of its samples (a histogram's are <name>_bucket, _sum and _count).
FAMILIES = {
    "kaas_build_info": "gauge",
    "kaas_requests_total": "counter",
    "kaas_request_errors_total": "counter",
    "kaas_errors_total": "counter",
    "kaas_connections_closed_total": "counter",
    "kaas_data_dir_free_bytes": "gauge",
    "kaas_data_dir_size_bytes": "gauge",
    "kaas_min_free_bytes": "gauge",
    "kaas_produce_refused_disk_full_total": "counter",
    "kaas_open_fds": "gauge",
    "kaas_fd_limit": "gauge",
    "kaas_heartbeat_refused_total": "counter",
    "kaas_request_memory_bytes": "gauge",
    "kaas_request_memory_limit_bytes": "gauge",
    "kaas_request_memory_waits_total": "counter",
    "kaas_accept_paused_total": "counter",
    "kaas_logs_evicted_total": "counter",
    "kaas_bytes_in_total": "counter",
    "kaas_bytes_out_total": "counter",
    "kaas_protocol_errors_total": "counter",
    "kaas_connections_total": "counter",
    "kaas_connections_open": "gauge",
    "kaas_partitions_open": "gauge",
    "kaas_log_files_open": "gauge",
    "kaas_shard_alive": "gauge",
    "kaas_produce_latency_seconds": "histogram",
    "kaas_fetch_latency_seconds": "histogram",
    "kaas_request_duration_seconds": "histogram",
    # the log engine (issue 15): group commit, rolls, retention, compaction
    "kaas_log_sync_duration_seconds": "histogram",
    "kaas_log_syncs_total": "counter",
    "kaas_log_sync_errors_total": "counter",
    "kaas_log_synced_bytes_total": "counter",
    "kaas_log_segment_rolls_total": "counter",
    "kaas_log_retention_deleted_segments_total": "counter",
    "kaas_log_retention_reclaimed_bytes_total": "counter",
    "kaas_log_compactions_total": "counter",
    "kaas_log_compaction_reclaimed_bytes_total": "counter",
    # the control state (issue 15): the same series on a single node and in a cluster
    "kaas_controller_active": "gauge",
    "kaas_controller_id": "gauge",
    "kaas_lease_epoch": "gauge",
    "kaas_assignment_version": "gauge",
    "kaas_partitions_led": "gauge",
    "kaas_partitions_pending_handover": "gauge",
    "kaas_partitions_offline": "gauge",
    "kaas_write_fence_open": "gauge",
    "kaas_draining": "gauge",
    "kaas_brokers": "gauge",
    "kaas_topic_bytes_in_total": "counter",
    "kaas_topic_records_in_total": "counter",
    "kaas_topic_bytes_out_total": "counter",
    "kaas_groups": "gauge",
    "kaas_metrics_partition_series_omitted": "gauge",
    "process_cpu_seconds_total": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_start_time_seconds": "gauge",
}


def totals(broker) -> dict[str, float]:
    """Every unlabelled sample of /metrics, by name."""
    samples, _ = parse_metrics(get(broker, "/metrics")[2])
    return {n: v for n, labels, v in samples if not labels}


def test_storage_metrics_follow_group_commit_rolls_retention_and_compaction(broker_factory):
    """An operator reads the log engine's work from /metrics: every byte an acks=all producer
    had acknowledged was made durable by a counted, timed sync; small segments roll;
    retention.bytes deletes segments and the bytes freed are counted; compaction of
    overwritten keys frees bytes. Before, none of this was exposed."""
    from confluent_kafka import Producer
    b = broker_factory(extra_args=["--retention-check-interval-ms", "200"])
    before = totals(b)
    assert before["kaas_log_syncs_total"] == 0 and before["kaas_log_segment_rolls_total"] == 0
    create_topic(b.bootstrap, "retained", 1, {"internal.segment.bytes": "20000", "retention.bytes": "60000"})
    create_topic(b.bootstrap, "compacted", 1, {
        "cleanup.policy": "compact", "internal.segment.bytes": "4096", "min.compaction.lag.ms": "0",
        "min.cleanable.dirty.ratio": "0.01"})
    # Small batches, so that segments fill one batch at a time and roll many times.
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 2,
                  "batch.size": 4000})
    delivered = []
    for i in range(3000):
        p.produce("retained", value=b"%05d" % i * 20, on_delivery=lambda e, m: delivered.append(e))
        p.produce("compacted", key=b"key-%d" % (i % 10), value=b"v" * 50,
                  on_delivery=lambda e, m: delivered.append(e))
        if i % 300 == 0:
            p.poll(0)
    assert p.flush(60) == 0 and delivered.count(None) == 6000, [e for e in delivered if e][:3]
    samples, _ = parse_metrics(get(b, "/metrics")[2])
    bytes_in = sum(v for n, _, v in samples if n == "kaas_topic_bytes_in_total")
    # Until retention and compaction have run and a further pass (200 ms) changed nothing.
    deadline = time.monotonic() + 30
    t, last = {}, None
    while time.monotonic() < deadline:
        t = {n: v for n, v in totals(b).items() if n.startswith("kaas_log_")}
        if (t["kaas_log_retention_deleted_segments_total"] > 0
                and t["kaas_log_compactions_total"] > 0 and t == last):
            break
        last = t
        time.sleep(0.5)
    assert t["kaas_log_synced_bytes_total"] >= bytes_in > 0, (t, bytes_in)
    assert t["kaas_log_syncs_total"] > 0, t
    assert t["kaas_log_sync_errors_total"] == 0
    assert t["kaas_log_sync_duration_seconds_count"] == t["kaas_log_syncs_total"]
    # Every segment file but each log's first came from a roll; retention deleted some since
    # (the samples are taken once retention has run: nothing rolls after the last write).
    files = {topic: len(glob.glob(f"{b.data_dir}/{topic}~*/0/*.log"))
             for topic in ("retained", "compacted")}
    deleted = t["kaas_log_retention_deleted_segments_total"]
    assert t["kaas_log_segment_rolls_total"] == sum(files.values()) - 2 + deleted, (t, files)
    assert t["kaas_log_segment_rolls_total"] >= 20, t
    assert t["kaas_log_retention_deleted_segments_total"] > 0, t
    assert t["kaas_log_retention_reclaimed_bytes_total"] >= 20000 * 0.9, t
    assert t["kaas_log_compactions_total"] > 0, t
    assert t["kaas_log_compaction_reclaimed_bytes_total"] > 0, t


def labelled(broker, name: str) -> dict[str, float]:
    """The samples of `name` on /metrics, by their label text."""
    samples, _ = parse_metrics(get(broker, "/metrics")[2])
    return {labels: v for n, labels, v in samples if n == name}


def test_partition_and_group_offsets_give_the_lag(broker_factory):
    """An operator reads consumer lag from /metrics: each partition's end offset and each
    group's committed offsets (lag is their difference, 100 records here), the members of a
    live group, its rebalances, and groups by state. Before, nothing about groups was there."""
    from confluent_kafka import Consumer, TopicPartition
    b = broker_factory()
    create_topic(b.bootstrap, "lagged", 2)
    items = [(b"k", b"v%d" % i) for i in range(200)]
    rdkafka_produce(b.bootstrap, "lagged", items, extra={"partitioner": "random"})
    ends = {}
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "readers",
                  "enable.auto.commit": False})
    for p in (0, 1):
        ends[p] = c.get_watermark_offsets(TopicPartition("lagged", p), timeout=10)[1]
    assert sum(ends.values()) == 200, ends
    committed = {0: ends[0] // 2, 1: ends[1] - 7}
    c.commit(offsets=[TopicPartition("lagged", p, o) for p, o in committed.items()],
             asynchronous=False)
    c.close()
    live = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "live",
                     "session.timeout.ms": 6000})
    live.subscribe(["lagged"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            live.poll(0.2)
            members = labelled(b, "kaas_group_members")
            end = labelled(b, "kaas_partition_end_offset")
            if (members.get('{group="live"}') == 1 and len(end) == 2
                    and len(labelled(b, "kaas_group_committed_offset")) == 2):
                break
        assert labelled(b, "kaas_partition_end_offset") == {
            f'{{topic="lagged",partition="{p}"}}': float(ends[p]) for p in (0, 1)}
        assert labelled(b, "kaas_partition_start_offset") == {
            f'{{topic="lagged",partition="{p}"}}': 0.0 for p in (0, 1)}
        got = labelled(b, "kaas_group_committed_offset")
        assert got == {f'{{group="readers",topic="lagged",partition="{p}"}}': float(o)
                       for p, o in committed.items()}, got
        lag = sum(ends[p] - committed[p] for p in (0, 1))
        assert lag == ends[0] - ends[0] // 2 + 7
        assert labelled(b, "kaas_group_members") == {'{group="readers"}': 0.0, '{group="live"}': 1.0}
        assert labelled(b, "kaas_group_rebalances_total")['{group="live"}'] >= 1
        states = labelled(b, "kaas_groups")
        assert states['{type="classic",state="Stable"}'] == 1, states
        assert states['{type="classic",state="Empty"}'] == 1, states
        assert states['{type="consumer",state="Stable"}'] == 0, states
    finally:
        live.close()


def test_request_phases_and_error_codes_by_api(broker_factory):
    """Per API an operator sees where requests spend their time (queue, process and send
    histograms: Kafka's RequestMetrics) and which error codes responses carried, by Kafka's
    names: three produces to a partition that does not exist count UNKNOWN_TOPIC_OR_PARTITION
    three times under Produce. Before, only a count of requests that failed inside the broker
    existed."""
    import kwire
    b = broker_factory()
    create_topic(b.bootstrap, "one", 1)
    ranges = kwire.api_versions(b)
    version = kwire.pick_produce_version(ranges)
    with kwire.connect(b) as s:
        for corr in range(3):
            s.sendall(kwire.produce_request(version, corr, "one", 7,
                                            kwire.record_batch([(b"k", b"v")])))
            _, _, _, err, _ = kwire.parse_produce_response(version, kwire.recv_frame(s))
            assert err == 3, err
    errors = labelled(b, "kaas_response_errors_total")
    assert errors.get('{api="Produce",error="UNKNOWN_TOPIC_OR_PARTITION"}') == 3, errors
    counts = labelled(b, "kaas_request_duration_seconds_count")
    for phase in ("queue", "process", "send"):
        assert counts[f'{{api="Produce",phase="{phase}"}}'] == 3, (phase, counts)
    assert counts['{api="Metadata",phase="process"}'] >= 1, counts


def test_per_partition_series_stop_at_the_limit_and_say_so_once(broker_factory):
    """Thousands of partitions must not swamp Prometheus: past
    --metrics-partition-series-limit the per-partition series are left out, the count left out
    is a metric, and the log says so once, not at every scrape."""
    from confluent_kafka import Consumer, TopicPartition
    b = broker_factory(extra_args=["--metrics-partition-series-limit", "3"])
    create_topic(b.bootstrap, "many", 2)
    rdkafka_produce(b.bootstrap, "many", [(b"k", b"v")] * 10, extra={"partitioner": "random"})
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("many", p, 0) for p in (0, 1)], asynchronous=False)
    c.close()
    # Two partitions: 4 offset series and 2 committed offsets, 6 in all, 3 allowed.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and totals(b).get("kaas_metrics_partition_series_omitted") != 3:
        time.sleep(0.2)
    assert totals(b)["kaas_metrics_partition_series_omitted"] == 3
    shown = (len(labelled(b, "kaas_partition_start_offset")) + len(labelled(b, "kaas_partition_end_offset"))
             + len(labelled(b, "kaas_group_committed_offset")))
    assert shown == 3, shown
    for _ in range(3):
        get(b, "/metrics")
    assert b.log_text().count("more per-partition series than") == 1, b.log_text()[-2000:]


# Families whose series exist only per led partition, coordinated group, error or request
# version seen: absent (by prometheus-client's rule for a family without series) until there is
# one.
PER_PARTITION_FAMILIES = {
    "kaas_request_versions_total": "counter",
    "kaas_response_errors_total": "counter",
    "kaas_partition_start_offset": "gauge",
    "kaas_partition_end_offset": "gauge",
    "kaas_group_committed_offset": "gauge",
    "kaas_group_members": "gauge",
    "kaas_group_rebalances_total": "counter",
}


def connect(broker):
    url = urlsplit(broker.health_url)
    return http.client.HTTPConnection(url.hostname, url.port, timeout=5)


def fetch_metrics(broker, accept=None):
    headers = {"Accept": accept} if accept else {}
    req = urllib.request.Request(broker.health_url + "/metrics", headers=headers)
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.headers.get("Content-Type", ""), r.read().decode()


def test_every_family_is_present_from_the_start(kaas):
    """Dashboards and alerts need each series to exist before the event it counts: every family
    is exposed with its type, and every API the broker serves has a request counter, at zero if
    no client sent it (DeleteGroups here). A topic's series exist from its creation."""
    create_topic(kaas.bootstrap, unique_topic("families"), 1)
    ctype, body = fetch_metrics(kaas)
    assert ctype == "text/plain; version=0.0.4; charset=utf-8", ctype
    samples, types = parse_metrics(body)
    for name, kind in FAMILIES.items():
        assert types.get(name) == kind, (name, types.get(name))
    extra = {n: types[n] for n in set(types) - set(FAMILIES)}
    assert extra.items() <= PER_PARTITION_FAMILIES.items(), extra
    requests = {labels for n, labels, _ in samples if n == "kaas_requests_total"}
    for api in ("Produce", "Fetch", "Metadata", "ApiVersions", "DeleteGroups"):
        assert any(f'api="{api}"' in labels for labels in requests), (api, requests)
    assert any(n == "kaas_build_info" and "version=" in labels and v == 1
               for n, labels, v in samples), "no kaas_build_info{version=...} 1"


def test_head_has_no_body(kaas):
    """A HEAD probe gets the GET's status and headers and no body: a body after a HEAD
    response would be read as the start of the next response on a kept-alive connection."""
    conn = connect(kaas)
    try:
        for path in ("/healthz", "/readyz", "/metrics"):
            conn.request("HEAD", path)
            r = conn.getresponse()
            assert r.status == 200, (path, r.status)
            assert int(r.getheader("Content-Length", "0")) > 0, path
            assert r.read() == b"", path
        # the bytes that follow on the connection are the next response's, not a stray body
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        assert r.status == 200
        json.loads(r.read())
    finally:
        conn.close()


def test_keep_alive(kaas):
    """Prometheus and load balancers reuse connections: two requests are answered on one TCP
    connection, which the server does not close after the first."""
    conn = connect(kaas)
    try:
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        r.read()
        assert r.status == 200 and not r.will_close, r.getheaders()
        sock = conn.sock
        assert sock is not None
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        assert r.status == 200 and "kaas_requests_total" in r.read().decode()
        assert conn.sock is sock, "the second request needed a new connection"
    finally:
        conn.close()


def test_post_is_405(kaas):
    """The endpoint is read-only: another method is refused with 405 and an Allow header that
    says what is served, rather than answered as a GET."""
    conn = connect(kaas)
    try:
        conn.request("POST", "/metrics", body=b"x")
        r = conn.getresponse()
        r.read()
        assert r.status == 405
        allowed = {m.strip() for m in r.getheader("Allow", "").split(",")}
        assert allowed == {"GET", "HEAD"}, r.getheader("Allow")
    finally:
        conn.close()


def test_promtool_accepts_classic_text(kaas):
    """What Prometheus's own linter says about the classic text format: no parse error and no
    lint problem (TYPE names matching their samples, counters ending in _total, units)."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus; "
                    "scripts/install-test-deps.sh installs it)")
    _, body = fetch_metrics(kaas)
    check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), \
        (check.returncode, check.stdout, check.stderr)


def test_openmetrics_parses(kaas):
    """A scraper that asks for OpenMetrics gets it, complete (ending with # EOF) and accepted by
    the reference parser, which refused the hand-written text (counter TYPE lines ending in
    _total clash with their samples there)."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    ctype, body = fetch_metrics(kaas, accept=f"{OPENMETRICS};version=1.0.0,text/plain;q=0.5")
    assert ctype == "application/openmetrics-text; version=1.0.0; charset=utf-8", ctype
    assert body.endswith("# EOF\n"), body[-200:]
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert families["kaas_requests"].type == "counter"
    assert any(s.name == "kaas_requests_total" and s.labels.get("api") == "ApiVersions"
               for s in families["kaas_requests"].samples)
    assert families["kaas_build"].type == "info"
    assert families["kaas_build"].samples[0].labels.get("version"), families["kaas_build"]
    assert families["kaas_produce_latency_seconds"].type == "histogram"
    assert families["kaas_produce_latency_seconds"].unit == "seconds"
    assert len(FAMILIES) <= len(families) <= len(FAMILIES) + len(PER_PARTITION_FAMILIES), \
        sorted(families)
    # without Accept, the same families in the classic text
    _, classic = fetch_metrics(kaas)
    assert "# EOF" not in classic and "# UNIT" not in classic
