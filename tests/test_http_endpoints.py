"""The health address of a kaas broker: /readyz, /healthz (JSON) and /metrics (Prometheus
text), as an operator or a Kubernetes probe would use them."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

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
