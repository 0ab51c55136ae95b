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
    create_topic(b.bootstrap, "retained", 1, {"segment.bytes": "20000", "retention.bytes": "60000"})
    create_topic(b.bootstrap, "compacted", 1, {
        "cleanup.policy": "compact", "segment.bytes": "4096", "min.compaction.lag.ms": "0",
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
    assert len(types) == len(FAMILIES), sorted(set(types) - set(FAMILIES))
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
    assert len(families) == len(FAMILIES), sorted(families)
    # without Accept, the same families in the classic text
    _, classic = fetch_metrics(kaas)
    assert "# EOF" not in classic and "# UNIT" not in classic
