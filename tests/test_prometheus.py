"""The alert rules and the Grafana dashboard the chart ships (deploy/helm/kaas/files/) against
Prometheus itself (issue 15, items 1 and 2).

`promtool test rules` checks that each alert fires on the series meant to fire it and stays
quiet otherwise. Then a real Prometheus server (Debian's `prometheus` package, the version
scripts/install-test-deps.sh installs) scrapes three real kaas brokers with the rule file
loaded: every rule evaluates without error, every metric a rule reads exists (a renamed metric
fails here, not in someone's pager), the control-state series agree with /healthz, and killing
a broker turns its KaasBrokerDown alert pending while the survivors count it dead. Every
dashboard panel's query (Grafana's `$__rate_interval` as 1m) returns data from the same server.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from confluent_kafka import Producer

from conftest import free_port, poll
from kcheck import create_topic
from test_cluster import read_all
from kcluster import logs_on_failure, make_cluster  # noqa: F401  (the fixture)

# The chart ships both (its PrometheusRule and dashboard ConfigMap read them); the rules' unit
# tests live beside the chart, in deploy/prometheus/.
FILES = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "kaas" / "files"
RULES = FILES / "kaas-alerts.yaml"
DASHBOARD = FILES / "kaas-dashboard.json"
RULES_DIR = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="Prometheus is not installed (Debian package prometheus; "
           "scripts/install-test-deps.sh installs it)")


def test_alert_rules_pass_their_unit_tests():
    """promtool: the rule file is valid, and each alert fires exactly where its unit test says."""
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(["promtool", "test", "rules", "kaas-alerts.test.yaml"], cwd=RULES_DIR,
                          capture_output=True, text=True, timeout=120)
    assert test.returncode == 0, test.stdout + test.stderr


def prometheus_api(address: str, path: str, **params):
    """The `data` of a successful answer from Prometheus's HTTP API at `address` (host:port)."""
    url = f"http://{address}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as r:
        doc = json.load(r)
    assert doc["status"] == "success", doc
    return doc["data"]


class Prometheus:
    """A Prometheus server scraping `targets` every second as job "kaas", with the rules."""

    def __init__(self, root: Path, targets: list[str]):
        self.root = root
        self.port = free_port()
        config = root / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "900ms"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "kaas", "static_configs": [{"targets": targets}]}],
        }))
        self.log = open(root / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def api(self, path: str, **params):
        return prometheus_api(f"127.0.0.1:{self.port}", path, **params)

    def query(self, expr: str) -> list[tuple[dict, float]]:
        data = self.api("query", query=expr)
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def wait(self, check, timeout: float, what: str):
        def alive_and_check():
            assert self.proc.poll() is None, f"prometheus exited: {self.tail()}"
            return check()
        return poll(alive_and_check, timeout, what, context=self.tail)

    def tail(self) -> str:
        self.log.flush()
        return (self.root / "prometheus.log").read_text(errors="replace")[-3000:]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def rule_count() -> int:
    """How many alert and recording rules the chart's rule file holds."""
    return len(re.findall(r"^\s+- (?:alert|record): ", RULES.read_text(), re.M))


def rule_metrics() -> set[str]:
    """Every metric name the rule expressions read."""
    text = RULES.read_text()
    exprs = re.findall(r"expr: >-\n((?:\s{10}.*\n)+)|expr: (.*)", text)
    names = set()
    for block, line in exprs:
        names |= set(re.findall(r"\b(up|kaas_[a-z_]+)\b", block or line))
    return names


def commit_half(bootstrap: str, group: str, topic: str, partitions: int, per_partition: int):
    """Commits offset `per_partition` for every partition of `topic` as group `group`."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, per_partition) for p in range(partitions)],
                 asynchronous=False)
    finally:
        c.close()


def dashboard_queries() -> list[tuple[str, str]]:
    """(expression, panel title) of every dashboard target, as Prometheus would get it."""
    dash = json.loads(DASHBOARD.read_text())
    return [(t["expr"].replace("$__rate_interval", "1m"), panel["title"])
            for panel in dash["panels"] for t in panel["targets"]]


def test_dashboard_is_valid_grafana_json():
    """The dashboard imports: unique panel ids and target refIds, a Prometheus datasource
    variable every panel uses, and the rule file's metrics all on some panel."""
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), ids
    for panel in dash["panels"]:
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and refs, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource"]
    shown = " ".join(e for e, _ in dashboard_queries())
    missing = {m for m in rule_metrics() if m != "up" and m.removesuffix("_bucket") not in shown}
    assert not missing, f"alerted on but not on the dashboard: {missing}"


@logs_on_failure
def test_prometheus_scrapes_a_cluster_and_evaluates_every_rule(make_cluster, tmp_path):
    c = make_cluster(3)
    create_topic(c.nodes[0].bootstrap, "watched", 6)
    c.wait_settled(6, balanced=True)
    instance = {n.id: f"127.0.0.1:{n.health_port}" for n in c.nodes}
    prom = Prometheus(tmp_path, list(instance.values()))
    try:
        prom.wait(lambda: len([v for _, v in prom.query('up{job="kaas"}') if v == 1]) == 3,
                  60, "three kaas targets up")
        # Every rule evaluated, without error.
        alerts = rule_count()
        assert alerts >= 12, alerts

        def rules_ok():
            groups = prom.api("rules")["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return rules if len(rules) == alerts and all(
                r["health"] == "ok" and r.get("lastEvaluation", "").startswith("20")
                for r in rules) else None
        prom.wait(rules_ok, 30, f"all {alerts} rules evaluated healthy")
        # Every metric a rule reads is scraped (a histogram by its buckets) from every broker;
        # the per-partition and per-group ones once there are led partitions and groups (below).
        per_partition = {"kaas_partition_end_offset", "kaas_group_committed_offset"}
        for name in sorted(rule_metrics() - per_partition):
            series = prom.query(f'count({{__name__="{name}", job="kaas"}})')
            assert series and series[0][1] >= 3, f"rule metric {name} not scraped from the brokers: {series}"
        # The control state agrees with /healthz: one controller, all agree on its id, three
        # brokers alive, every partition led, every fence open.
        controller = c.wait_controller()
        assert prom.wait(lambda: prom.query('sum(kaas_controller_active{job="kaas"})') == [({}, 1.0)],
                         10, "exactly one active controller")
        active = prom.query('kaas_controller_active{job="kaas"} == 1')
        assert [m["instance"] for m, _ in active] == [instance[controller.id]], active
        ids = {m["instance"]: v for m, v in prom.query('kaas_controller_id{job="kaas"}')}
        assert set(ids.values()) == {float(controller.id)}, ids
        alive = prom.query('kaas_brokers{job="kaas", state="alive"}')
        assert sorted(v for _, v in alive) == [3.0, 3.0, 3.0], alive
        assert prom.query('sum(kaas_partitions_led{job="kaas"})') == [({}, 6.0)]
        assert prom.query('max(kaas_partitions_offline{job="kaas"})') == [({}, 0.0)]
        assert sorted(v for _, v in prom.query('kaas_write_fence_open{job="kaas"}')) == [1.0] * 3
        assert prom.query('ALERTS{alertstate="firing"}') == []

        # Every dashboard query answers with data once there has been some traffic.
        p = Producer({"bootstrap.servers": c.bootstrap(), "acks": "all"})
        for i in range(600):
            p.produce("watched", value=b"x" * 100, partition=i % 6)
        assert p.flush(30) == 0
        assert sum(len(r) for _, r in read_all(c.bootstrap(), "watched", 6).values()) == 600
        # A group reads half of every partition and commits: its lag is the other half, as
        # the lag rule computes it from the leaders' end offsets and the coordinator's
        # committed offsets (different brokers).
        commit_half(c.bootstrap(), "watchers", "watched", 6, 50)
        want = [({"__name__": "kaas:group_lag", "group": "watchers"}, 300.0)]
        last = []

        def lag():
            last[:] = [prom.query('kaas:group_lag{group="watchers"}')]
            return last[0] == want

        try:
            prom.wait(lag, 30, "the lag rule reporting 300 records behind for group watchers")
        except AssertionError as e:
            raise AssertionError(f"{e}\nlast lag {last}, end offsets "
                                 f"{prom.query('kaas_partition_end_offset')}") from None
        assert len(prom.query('kaas_partition_end_offset{job="kaas", topic="watched"}')) == 6
        for expr, title in dashboard_queries():
            prom.wait(lambda: prom.query(expr), 30, f"data for dashboard panel {title!r}: {expr}")

        # A broker dies: Prometheus sees it down and its alert goes pending; the survivors
        # count it dead, take its partitions over, and none is left without a leader.
        victim = next(n for n in c.nodes if n.id != controller.id)
        victim.kill()
        pending = prom.wait(
            lambda: [m for m, _ in prom.query('ALERTS{alertname="KaasBrokerDown"}')
                     if m.get("instance") == instance[victim.id] and m["alertstate"] == "pending"],
            30, f"KaasBrokerDown pending for broker {victim.id}")
        assert pending
        c.wait_settled(6)
        prom.wait(lambda: prom.query('min(kaas_brokers{job="kaas", state="dead"})') == [({}, 1.0)],
                  30, "both survivors counting one dead broker")
        prom.wait(lambda: prom.query('sum(kaas_partitions_led{job="kaas"})') == [({}, 6.0)]
                  and prom.query('max(kaas_partitions_offline{job="kaas"})') == [({}, 0.0)],
                  30, "the six partitions led by the survivors, none offline")
    finally:
        prom.close()
