"""Deployment checks (issue 7): the Helm chart in deploy/helm/kaas, its seccomp profile, the
container image definition, and the broker's io_uring start-up check.

The chart is rendered with `helm template` (and `helm lint`) in every shape of ci/*.yaml,
every rendered object is validated offline against the Kubernetes schemas
(`kubernetes-validate --strict`), and the rendered objects are asserted on. The seccomp profile
and the memlock sizing are exercised for real: the kaas binary is started under the profile
(loaded with libseccomp) and as a non-root user with a pod-like RLIMIT_MEMLOCK. The chart's
hooks (issue 15) run for real too: the `helm test` pod's script and the topic Job's script are
taken from the rendering and run against a kaas broker on loopback. Installing the chart on a
real kubelet is tests/test_chart_on_kubernetes.py.

Tools come from scripts/install-deploy-deps.sh (CI runs it). Without it and without helm on
PATH the chart tests skip; once the script has run, a missing tool fails them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy" / "helm" / "kaas"
PROFILE = CHART / "files" / "kaas-io-uring.json"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DEPS_ENV = Path.home() / ".cache" / "kaas" / "deploy-deps.env"
# Kubernetes versions whose schemas kubernetes-validate bundles: the oldest we support, the newest.
K8S_VERSIONS = ["1.30.0", "1.37.0"]
IO_URING_SYSCALLS = {"io_uring_setup", "io_uring_enter", "io_uring_register"}
LEASE_VERBS = {"get", "list", "watch", "create", "update", "patch"}
POD_MEMLOCK = 8 << 20  # what pods get on systemd >= 253 nodes; the chart's ioUring.podMemlockBytes
RING_HEADROOM = 1 << 20  # the chart's ioUring.ringHeadroomBytes

SCENARIOS = {
    "default": [],
    "cluster": ["-f", str(CHART / "ci" / "cluster-values.yaml")],
    "nodeport": ["-f", str(CHART / "ci" / "nodeport-values.yaml")],
    "options": ["-f", str(CHART / "ci" / "options-values.yaml")],
}


# -- tools ------------------------------------------------------------------------------------


def _deps_installed() -> bool:
    return DEPS_ENV.exists()


def _missing(what: str):
    if _deps_installed():
        pytest.fail(f"{what} is missing although scripts/install-deploy-deps.sh has run")
    pytest.skip(f"{what} not available: run scripts/install-deploy-deps.sh (CI does)")


@lru_cache(maxsize=None)
def _helm_path() -> str | None:
    if os.environ.get("KAAS_HELM"):
        return os.environ["KAAS_HELM"]
    if DEPS_ENV.exists():
        for line in DEPS_ENV.read_text().splitlines():
            if line.startswith("KAAS_HELM=") and os.access(line.split("=", 1)[1], os.X_OK):
                return line.split("=", 1)[1]
    return shutil.which("helm")


def helm() -> str:
    path = _helm_path()
    if not path:
        _missing("helm")
    return path


def kubernetes_validate_cmd() -> list[str]:
    try:
        import kubernetes_validate  # noqa: F401
    except ImportError:
        _missing("kubernetes-validate (PyPI)")
    return [sys.executable, "-m", "kubernetes_validate"]


def kaas_binary() -> Path | None:
    candidates = []
    if os.environ.get("KAAS_BIN"):
        candidates.append(Path(os.environ["KAAS_BIN"]))
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "release" / "kaas")
    candidates.append(Path.home() / ".cache" / "kaas-target" / "release" / "kaas")
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


# -- rendering --------------------------------------------------------------------------------


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}")
    return p


@lru_cache(maxsize=None)
def rendered_text(scenario: str, extra: tuple[str, ...] = ()) -> str:
    return run_helm("template", "kaas", str(CHART), "--namespace", "streaming",
                    *SCENARIOS[scenario], *extra).stdout


def render(scenario: str, *extra: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(rendered_text(scenario, tuple(extra))) if d]


def render_fails(*values: str) -> str:
    p = run_helm("template", "kaas", str(CHART), *values, check=False)
    assert p.returncode != 0, f"rendering with {values} should fail"
    return p.stderr


def one(docs: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def broker_container(docs: list[dict]) -> dict:
    sts = one(docs, "StatefulSet")
    (c,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "kaas"]
    return c


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def pod_templates(docs: list[dict]) -> dict[str, dict]:
    """The metadata of every pod the rendering creates, by "<kind>/<name>": the templates of
    StatefulSets, DaemonSets and Jobs, and bare Pods (the helm test hook)."""
    pods = {}
    for d in docs:
        key = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "Pod":
            pods[key] = d["metadata"]
        elif d["kind"] in ("StatefulSet", "DaemonSet", "Job"):
            pods[key] = d["spec"]["template"]["metadata"]
    return pods


def selected_pods(docs: list[dict], match_labels: dict) -> list[str]:
    """The rendered pods a matchLabels selector picks."""
    return sorted(k for k, meta in pod_templates(docs).items()
                  if match_labels.items() <= meta.get("labels", {}).items())


def hook(docs: list[dict], kind: str, event: str) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind and
                event in d["metadata"].get("annotations", {}).get("helm.sh/hook", "").split(",")]
    return found


def kube_expand(text: str, env: dict) -> str:
    """What the kubelet does to a container's command: "$$" becomes "$", "$(NAME)" becomes the
    value of the container's variable NAME, and an unknown "$(NAME)" stays as written."""
    def one_ref(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one_ref, text)


def validate_k8s(text: str, path: Path) -> None:
    """Strict validation of a rendering against the Kubernetes schemas of K8S_VERSIONS."""
    path.write_text(text)
    for version in K8S_VERSIONS:
        p = subprocess.run([*kubernetes_validate_cmd(), "--strict", "--quiet", "-k", version,
                            str(path)], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"{path.name} against {version}:\n{p.stdout}\n{p.stderr}"


def port_number(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    (p,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return p


# -- chart: lint, render, schemas ---------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint(scenario):
    """`helm lint --strict` passes for the default values and each non-default values file."""
    out = run_helm("lint", "--strict", str(CHART), *SCENARIOS[scenario]).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_objects_match_kubernetes_schemas(scenario, tmp_path):
    """Every object the chart renders validates strictly against the Kubernetes 1.30 and 1.37 schemas."""
    docs = render(scenario)
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "Service", "ServiceAccount", "Role", "RoleBinding",
            "PodDisruptionBudget"} <= kinds, kinds
    manifest = tmp_path / f"{scenario}.yaml"
    manifest.write_text(rendered_text(scenario))
    for version in K8S_VERSIONS:
        p = subprocess.run([*kubernetes_validate_cmd(), "--strict", "--quiet", "-k", version,
                            str(manifest)], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"{scenario} against {version}:\n{p.stdout}\n{p.stderr}"


def test_default_is_a_single_node_broker_on_the_shared_volume():
    """By default: one replica, no cluster flags, /data on a ReadWriteOnce claim (which every
    storage class offers: a ReadWriteMany default stayed Pending on kind, minikube, EKS gp2/gp3
    and GKE standard-rwo) with a settable storage class; cluster mode shares a ReadWriteMany one."""
    docs = render("default")
    sts = one(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 1
    c = broker_container(docs)
    assert "args" not in c and "command" not in c
    env = env_of(c)
    assert env["KAAS_DATA_DIR"] == "/data"
    pvc = one(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]
    nfs = one(render("cluster"), "PersistentVolumeClaim")
    assert nfs["spec"]["storageClassName"] == "nfs-client"
    assert nfs["spec"]["accessModes"] == ["ReadWriteMany"]
    # an explicit choice is kept in either mode
    pvc = one(render("default", "--set", "persistence.accessModes={ReadWriteOncePod}"), "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOncePod"]


def test_values_schema_refuses_typos_and_bad_choices():
    """values.schema.json: a misspelt key or an unknown choice fails the install with its path,
    instead of rendering silently without it."""
    assert "additional properties 'replicas' not allowed" in render_fails("--set", "replicas=3")
    assert "/persistence/accessModes/0" in render_fails("--set", "persistence.accessModes={ReadWriteMny}")
    assert "/podAntiAffinity" in render_fails("--set", "podAntiAffinity=maybe")
    assert "/metrics/serviceMonitor" in render_fails("--set", "metrics.serviceMonitor.enable=true")
    assert "/shards" in render_fails("--set", "shards=0")


MONITORING = ("--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
              "--set", "metrics.dashboard.enabled=true",
              "--set", "metrics.serviceMonitor.labels.release=kube-prometheus-stack")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_monitoring_objects_scrape_alert_and_chart_the_brokers(scenario):
    """Off by default. On: a ServiceMonitor that selects the headless Service alone (every broker,
    ready or not) on its health port as job "kaas"; a PrometheusRule holding exactly the rule file
    tests/test_prometheus.py evaluates against a real Prometheus; the dashboard in a ConfigMap
    labelled for Grafana's sidecar."""
    kinds = {d["kind"] for d in render(scenario)}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}, kinds
    docs = render(scenario, *MONITORING)
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selected = [d for d in docs if d["kind"] == "Service" and
                sm["spec"]["selector"]["matchLabels"].items() <= d["metadata"]["labels"].items()]
    assert [d["metadata"]["name"] for d in selected] == ["kaas-headless"], selected
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert {"targetLabel": "job", "replacement": "kaas"} in endpoint["relabelings"]
    rule = one(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "kaas-alerts.yaml").read_text())
    cm = one(docs, "ConfigMap", "-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["kaas-dashboard.json"]) == json.loads(
        (CHART / "files" / "kaas-dashboard.json").read_text())


def test_replicas_above_one_need_cluster_mode():
    """More than one broker without cluster mode (or cluster mode without a shared RWX volume) does not render."""
    assert "cluster.enabled=true" in render_fails("--set", "replicaCount=3")
    err = render_fails("--set", "cluster.enabled=true", "--set", "persistence.accessModes={ReadWriteOnce}")
    assert "ReadWriteMany" in err


# -- the StatefulSet ------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_probes_readyz_and_healthz_on_the_health_port(scenario):
    """Readiness polls /readyz and liveness (after a startup probe) /healthz, both on port 8080."""
    c = broker_container(render(scenario))
    for probe, path in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz"),
                        ("startupProbe", "/healthz")]:
        get = c[probe]["httpGet"]
        assert get["path"] == path, probe
        assert port_number(c, get["port"]) == 8080, probe
    assert env_of(c)["KAAS_HEALTH_LISTEN"] == "0.0.0.0:8080"


def test_seccomp_profile_permits_io_uring_and_is_installed_where_the_pod_loads_it():
    """The broker runs under a Localhost profile that allows the io_uring syscalls, copied to the kubelet's seccomp dir."""
    docs = render("default")
    c = broker_container(docs)
    sp = c["securityContext"]["seccompProfile"]
    assert sp["type"] == "Localhost"
    cm = one(docs, "ConfigMap", "-seccomp")
    profile = json.loads(cm["data"]["profile.json"])
    assert profile == json.loads(PROFILE.read_text())
    allowed = {n for s in profile["syscalls"] if s["action"] == "SCMP_ACT_ALLOW" and not s.get("args")
               for n in s["names"]}
    assert IO_URING_SYSCALLS <= allowed
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"  # an allowlist, not Unconfined in disguise
    ds = one(docs, "DaemonSet", "-seccomp-installer")
    pod = ds["spec"]["template"]["spec"]
    (inst,) = pod["containers"]
    assert env_of(inst)["PROFILE"] == sp["localhostProfile"]
    host = {v["name"]: v for v in pod["volumes"]}["host-seccomp"]["hostPath"]["path"]
    assert host == "/var/lib/kubelet/seccomp"
    # Unconfined is an explicit opt-in and then no installer is rendered.
    docs = render("nodeport")
    assert broker_container(docs)["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert not [d for d in docs if d["kind"] == "DaemonSet"]


def test_memlock_budget_or_cap_ipc_lock():
    """Default io memory fits 3 registrations per shard (plus ring headroom) in 8 MiB memlock; ipcLock adds CAP_IPC_LOCK."""
    for scenario in ("default", "cluster"):
        c = broker_container(render(scenario))
        env = env_of(c)
        io, shards = int(env["KAAS_IO_MEMORY_BYTES"]), int(env["KAAS_SHARDS"])
        assert 65536 <= io <= 2 << 20 and io % 65536 == 0
        assert 3 * shards * io + RING_HEADROOM <= POD_MEMLOCK, scenario
        sc = c["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["allowPrivilegeEscalation"] is False
    c = broker_container(render("nodeport"))
    sc = c["securityContext"]
    assert sc["capabilities"]["add"] == ["IPC_LOCK"]
    # the image's file capability (cap_ipc_lock=p) needs exec without no_new_privs
    assert sc["allowPrivilegeEscalation"] is True
    assert env_of(c)["KAAS_IO_MEMORY_BYTES"] == "4194304"
    err = render_fails("--set", "ioUring.ioMemoryBytes=4194304")
    assert "podMemlockBytes" in err and "ipcLock" in err


def test_lease_rbac_for_the_broker_service_account():
    """A Role grants coordination.k8s.io leases get/list/watch/create/update/patch to the StatefulSet's ServiceAccount."""
    for scenario in SCENARIOS:
        docs = render(scenario)
        role, binding = one(docs, "Role"), one(docs, "RoleBinding")
        rules = [r for r in role["rules"] if "coordination.k8s.io" in r["apiGroups"]]
        assert rules and all(r["resources"] == ["leases"] for r in rules)
        assert {v for r in rules for v in r["verbs"]} == LEASE_VERBS
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": role["metadata"]["name"]}
        sa = one(docs, "ServiceAccount")["metadata"]["name"]
        pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == sa
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "streaming"}]
        # only the kube Lease backend talks to the API server
        assert pod["automountServiceAccountToken"] is (scenario == "cluster")


def test_pdb_allows_one_broker_down():
    """The PodDisruptionBudget has maxUnavailable 1 and selects exactly the broker pods."""
    docs = render("default")
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    sts = one(docs, "StatefulSet")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    sel = pdb["spec"]["selector"]["matchLabels"]
    assert sel == sts["spec"]["selector"]["matchLabels"]
    assert all(labels[k] == v for k, v in sel.items())


@pytest.mark.parametrize("scenario,drain", [("default", 120), ("cluster", 300), ("nodeport", 180)])
def test_termination_grace_covers_the_drain(scenario, drain):
    """terminationGracePeriodSeconds is at least drainTimeoutSeconds, and a shorter explicit value does not render."""
    sts = one(render(scenario), "StatefulSet")
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= drain
    err = render_fails("--set", "drainTimeoutSeconds=120", "--set", "terminationGracePeriodSeconds=60")
    assert "drainTimeoutSeconds" in err


def test_rolling_update_one_broker_at_a_time_with_spread():
    """RollingUpdate with minReadySeconds, one broker per node (anti-affinity) and zone spread."""
    pod_spec = one(render("default"), "StatefulSet")
    assert pod_spec["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert pod_spec["spec"]["minReadySeconds"] >= 1
    spec = pod_spec["spec"]["template"]["spec"]
    (term,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert spec["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert spec["containers"][0]["resources"]["requests"]["cpu"]


def test_default_pod_meets_the_restricted_pod_security_standard():
    """The default broker pod needs no privilege: non-root, no capabilities, no escalation, Localhost seccomp."""
    spec = one(render("default"), "StatefulSet")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert "hostNetwork" not in spec and "hostPID" not in spec
    assert all("hostPath" not in v for v in spec["volumes"])
    sc = spec["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost")
    assert sc["readOnlyRootFilesystem"] is True


# -- flags the binary knows -----------------------------------------------------------------------


@lru_cache(maxsize=None)
def help_flags(binary: Path) -> tuple[set[str], set[str]]:
    """(long flags, KAAS_* env names) that `kaas --help` documents."""
    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30).stdout
    flags = set(re.findall(r"^\s*(?:-\w, )?(--[a-z0-9][a-z0-9-]*)", out, re.M))
    envs = set(re.findall(r"\[env: (KAAS_[A-Z0-9_]+)", out))
    assert "--data-dir" in flags and "KAAS_DATA_DIR" in envs, out
    return flags, envs


@pytest.mark.parametrize("scenario", ["default", "cluster"])
def test_rendering_uses_only_flags_the_binary_knows(scenario):
    """Every KAAS_* variable and argument of the rendering (single-node and cluster mode) is
    documented by `kaas --help`, so the pods start with the binary this repository builds."""
    c = broker_container(render(scenario))
    kaas_env = [k for k in env_of(c) if k.startswith("KAAS_")]
    assert "KAAS_IO_MEMORY_BYTES" in kaas_env and "KAAS_DRAIN_TIMEOUT_MS" in kaas_env
    binary = kaas_binary()
    if binary is None:
        pytest.skip("no kaas binary (KAAS_BIN or a release build) to read --help from")
    flags, envs = help_flags(binary)
    assert set(kaas_env) <= envs, set(kaas_env) - envs
    args = [a.split("=", 1)[0] for a in c.get("args", []) if a.startswith("--")]
    assert set(args) <= flags, set(args) - flags
    for flag in ("--io-memory-bytes", "--advertised-listener", "--shards"):
        assert flag in flags
    if scenario == "cluster":
        for flag in ("--lease", "--broker-id", "--heartbeat-listen", "--heartbeat-advertised", "--rack"):
            assert flag in args, (flag, args)


def test_cluster_mode_adds_the_cluster_flags():
    """cluster.enabled adds --lease=kube, the ordinal as --broker-id, the heartbeat listener and port, and the rack."""
    docs = render("cluster")
    sts = one(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 3
    c = broker_container(docs)
    args = c["args"]
    assert "--lease=kube" in args
    assert "--broker-id=$(POD_INDEX)" in args
    assert "--heartbeat-listen=0.0.0.0:9094" in args
    # Brokers dial the controller at its in-cluster name even when clients get external ones.
    assert "--heartbeat-advertised=$(POD_NAME).kaas-headless.$(POD_NAMESPACE).svc:9094" in args, args
    assert "--rack=$(NODE_ZONE)" in args
    # A restarted broker gets partitions other brokers lead only after the hold (values).
    assert "--rebalance-hold-ms=0" in args, args
    assert env_of(c)["KAAS_DRAIN_TIMEOUT_MS"] == "300000"
    env = env_of(c)
    assert env["POD_INDEX"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert env["NODE_ZONE"]["fieldRef"]["fieldPath"] == "metadata.labels['topology.kubernetes.io/zone']"
    assert {"name": "heartbeat", "containerPort": 9094} in c["ports"]
    headless = one(docs, "Service", "-headless")
    assert 9094 in [p["port"] for p in headless["spec"]["ports"]]
    fixed = broker_container(render("cluster", "--set", "cluster.rack=eu-west-1a"))
    assert "--rack=eu-west-1a" in fixed["args"]


# -- listeners and services -------------------------------------------------------------------------


def test_per_broker_dns_and_client_service():
    """Each broker advertises <pod>.<headless>.<ns>.svc:9092; a headless Service publishes it, a client Service bootstraps."""
    docs = render("default")
    sts = one(docs, "StatefulSet")
    headless = one(docs, "Service", "-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    env = env_of(broker_container(docs))
    assert env["KAAS_ADVERTISED_LISTENER"] == f"$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE).svc:9092"
    assert env["KAAS_LISTEN"] == "0.0.0.0:9092"
    client = one(docs, "Service", "kaas")
    assert client["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert [p["port"] for p in client["spec"]["ports"]] == [9092]
    fq = env_of(broker_container(render("default", "--set", "clusterDomain=cluster.local")))
    assert fq["KAAS_ADVERTISED_LISTENER"].endswith(".svc.cluster.local:9092")


def _external_address(container: dict, pod: str, host_ip: str = "192.0.2.7") -> str:
    """Runs the chart's start-up wrapper (after Kubernetes' $$ unescaping) and returns what it advertises."""
    cmd = container["command"]
    assert cmd[:2] == ["/bin/sh", "-ec"] and cmd[3] == "kaas"
    script = cmd[2].replace("$$", "$")
    assert 'exec /usr/local/bin/kaas "$@"' in script
    script = script.replace('exec /usr/local/bin/kaas "$@"', 'printf %s "$KAAS_ADVERTISED_LISTENER"')
    env = {k: v for k, v in env_of(container).items() if isinstance(v, str)}
    env.update(POD_NAME=pod, HOST_IP=host_ip, PATH=os.environ["PATH"])
    return subprocess.run(["/bin/sh", "-ec", script, "kaas"], env=env, capture_output=True,
                          text=True, check=True, timeout=10).stdout


def test_external_access_per_broker():
    """External access renders one Service per broker and each broker advertises its own external address."""
    docs = render("cluster")
    c = broker_container(docs)
    assert "KAAS_ADVERTISED_LISTENER" not in env_of(c)
    ext = sorted((d for d in docs if d["metadata"]["name"].endswith("-external")),
                 key=lambda d: d["metadata"]["name"])
    assert [d["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] for d in ext] == \
        ["kaas-0", "kaas-1", "kaas-2"]
    assert all(d["spec"]["type"] == "LoadBalancer" for d in ext)
    assert ext[2]["metadata"]["annotations"]["external-dns.alpha.kubernetes.io/hostname"] == \
        "kaas-2.kafka.example.com"
    assert _external_address(c, "kaas-2") == "kaas-2.kafka.example.com:9092"
    docs = render("nodeport")
    c = broker_container(docs)
    (svc,) = [d for d in docs if d["metadata"]["name"].endswith("-external")]
    assert svc["spec"]["ports"][0]["nodePort"] == 31190
    assert _external_address(c, "kaas-0") == "192.0.2.7:31190"
    assert _external_address(c, "kaas-3") == "192.0.2.7:31193"
    assert "advertisedHostPattern" in render_fails("--set", "external.enabled=true")


def test_client_service_load_balancer_ip_and_node_port():
    """The client Service takes loadBalancerIP and a Kafka node port where its type has them, sparing per-broker node ports."""
    client = one(render("options"), "Service", "kaas")
    assert client["spec"]["type"] == "LoadBalancer"
    assert client["spec"]["loadBalancerIP"] == "192.0.2.10"
    assert client["spec"]["ports"] == [{"name": "kafka", "port": 9092, "targetPort": "kafka",
                                        "nodePort": 30092}]
    client = one(render("default", "--set", "service.type=NodePort",
                        "--set", "service.nodePorts.kafka=30100"), "Service", "kaas")
    assert client["spec"]["ports"][0]["nodePort"] == 30100
    assert "loadBalancerIP" not in client["spec"]
    client = one(render("default"), "Service", "kaas")
    assert "nodePort" not in client["spec"]["ports"][0] and "loadBalancerIP" not in client["spec"]
    assert "service.type=LoadBalancer" in render_fails("--set", "service.loadBalancerIP=192.0.2.10")
    assert "NodePort or LoadBalancer" in render_fails("--set", "service.nodePorts.kafka=30100")
    assert "/service/nodePorts" in render_fails("--set", "service.nodePorts.kafka=70000")
    # Per-broker node ports (31190 + ordinal in the nodeport scenario) stay theirs.
    err = render_fails(*SCENARIOS["nodeport"], "--set", "service.type=NodePort",
                       "--set", "service.nodePorts.kafka=31190")
    assert "external.nodePortBase=31190" in err
    docs = render("nodeport", "--set", "service.type=NodePort", "--set", "service.nodePorts.kafka=31090")
    assert one(docs, "Service", "kaas")["spec"]["ports"][0]["nodePort"] == 31090
    (ext,) = [d for d in docs if d["metadata"]["name"].endswith("-external")]
    assert ext["spec"]["ports"][0]["nodePort"] == 31190
    assert _external_address(broker_container(docs), "kaas-0") == "192.0.2.7:31190"


# -- options: labels, pass-through lists, image digest, network policy, PodMonitor ----------------


NETWORK_POLICY = ("--set", "networkPolicy.enabled=true")
TOPIC = ("--set", "topics[0].name=orders", "--set", "topics[0].partitions=3")
# Every optional object on, so every kind the chart can render is checked.
ALL_OBJECTS = (*MONITORING, *NETWORK_POLICY, *TOPIC)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_common_labels_on_every_object_and_pod(scenario):
    """commonLabels reach every object and pod template, and cannot override the labels that selectors match."""
    plain = render(scenario, *ALL_OBJECTS)
    docs = render(scenario, *ALL_OBJECTS, "--set", "commonLabels.owner=team-streams",
                  "--set", r"commonLabels.app\.kubernetes\.io/name=someone-else")
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == \
        [(d["kind"], d["metadata"]["name"]) for d in plain]
    assert {"ServiceMonitor", "NetworkPolicy", "Job", "Pod", "ConfigMap"} <= {d["kind"] for d in docs}
    for d in docs:
        labels = d["metadata"]["labels"]
        assert labels["owner"] == "team-streams", (d["kind"], d["metadata"]["name"])
        assert labels["app.kubernetes.io/name"] == "kaas", (d["kind"], d["metadata"]["name"])
    for key, meta in pod_templates(docs).items():
        assert meta["labels"]["owner"] == "team-streams", key
        assert meta["labels"]["app.kubernetes.io/name"] == "kaas", key
    assert all("owner" not in d["metadata"]["labels"] for d in plain)
    # The selectors still pick the same pods as without commonLabels.
    for d in docs:
        if d["kind"] in ("StatefulSet", "DaemonSet", "PodDisruptionBudget"):
            sel = d["spec"]["selector"]["matchLabels"]
        elif d["kind"] == "Service":
            # the StatefulSet controller adds the pod-name label that per-broker Services use
            sel = {k: v for k, v in d["spec"]["selector"].items()
                   if k != "statefulset.kubernetes.io/pod-name"}
        else:
            continue
        assert selected_pods(docs, sel) == selected_pods(plain, sel) != [], d["metadata"]["name"]
    # Pod labels of the user's cannot take over the chart's either.
    sts = one(render(scenario, "--set", "podLabels.app\\.kubernetes\\.io/component=x",
                     "--set", "podLabels.tier=data"), "StatefulSet")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels["tier"] == "data" and labels["app.kubernetes.io/component"] == "broker"
    assert "/commonLabels/team" in render_fails("--set", "commonLabels.team[0]=a")


def test_extra_volumes_init_containers_and_sidecars_pass_through():
    """extraVolumes, extraVolumeMounts, initContainers and sidecars land unchanged in the broker pod."""
    values = yaml.safe_load((CHART / "ci" / "options-values.yaml").read_text())
    docs = render("options")
    pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    assert pod["volumes"][2:] == values["extraVolumes"]
    assert [v["name"] for v in pod["volumes"][:2]] == ["data", "tmp"]
    c = broker_container(docs)
    assert c["volumeMounts"][2:] == values["extraVolumeMounts"]
    assert pod["initContainers"] == values["initContainers"]
    assert pod["containers"][0]["name"] == "kaas"
    assert pod["containers"][1:] == values["sidecars"]
    pod = one(render("default"), "StatefulSet")["spec"]["template"]["spec"]
    assert "initContainers" not in pod and [c["name"] for c in pod["containers"]] == ["kaas"]
    assert [v["name"] for v in pod["volumes"]] == ["data", "tmp"]
    assert "/sidecars/0" in render_fails("--set", "sidecars={log-shipper}")


def test_image_digest_replaces_the_tag():
    """image.digest pins the broker and installer images to repository@digest, whatever the tag says."""
    digest = "sha256:" + "0123456789abcdef" * 4
    for args in ([], ["--set", "image.tag=latest"]):
        docs = render("default", "--set", f"image.digest={digest}", *args)
        assert broker_container(docs)["image"] == f"kaas@{digest}"
        (inst,) = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
        assert inst["image"] == f"kaas@{digest}"
    assert broker_container(render("default"))["image"] == "kaas:0.1.0"
    assert broker_container(render("options"))["image"].startswith("registry.example.com/kaas@sha256:")
    assert "/image/digest" in render_fails("--set", "image.digest=0.1.0")


def test_network_policy_limits_heartbeats_to_the_brokers(tmp_path):
    """The NetworkPolicy opens the Kafka and health ports, leaves egress open, and admits only brokers to heartbeats."""
    assert not [d for d in render("cluster", *TOPIC) if d["kind"] == "NetworkPolicy"]
    validate_k8s(rendered_text("cluster", (*NETWORK_POLICY, *TOPIC)), tmp_path / "cluster-networkpolicy.yaml")
    docs = render("cluster", *NETWORK_POLICY, *TOPIC)
    np = one(docs, "NetworkPolicy")
    sts = one(docs, "StatefulSet")
    c = broker_container(docs)
    assert np["spec"]["podSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    assert np["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: no Egress type
    rules = {}
    for rule in np["spec"]["ingress"]:
        assert rule.get("ports"), "a rule without ports would open every port"
        for p in rule["ports"]:
            assert p["protocol"] == "TCP" and p["port"] not in rules
            rules[port_number(c, p["port"])] = rule.get("from")
    assert rules.keys() == {9092, 8080, 9094}
    assert rules[9092] is None and rules[8080] is None  # from anywhere
    (peer,) = rules[9094]
    assert peer.keys() == {"podSelector"}  # no namespaceSelector or ipBlock: this namespace only
    assert peer["podSelector"].keys() == {"matchLabels"}
    # Among every pod the chart renders (brokers, installer, helm test, topic Job), the heartbeat
    # rule admits the brokers alone.
    assert selected_pods(docs, peer["podSelector"]["matchLabels"]) == ["StatefulSet/kaas"]
    assert len(pod_templates(docs)) == 4
    # single-node mode has no heartbeat port to open
    np = one(render("default", "--set", "networkPolicy.enabled=true"), "NetworkPolicy")
    assert [p["port"] for r in np["spec"]["ingress"] for p in r["ports"]] == [9092, 8080]
    # allowedClients: those peers, plus this release's own pods (the hooks connect too)
    docs = render("options")
    np = one(docs, "NetworkPolicy")
    kafka_rule = [r for r in np["spec"]["ingress"] if r["ports"][0]["port"] == 9092][0]
    assert kafka_rule["from"][0] == {"namespaceSelector": {"matchLabels": {"kaas-client": "true"}}}
    own = kafka_rule["from"][1]["podSelector"]["matchLabels"]
    assert {"Pod/kaas-test-produce-consume", "Job/kaas-topics", "StatefulSet/kaas"} <= \
        set(selected_pods(docs, own))


@pytest.mark.parametrize("scenario", ["default", "cluster"])
def test_pod_monitor_scrapes_the_broker_pods(scenario):
    """metrics.podMonitor scrapes exactly the broker pods' health port as job "kaas", never beside the ServiceMonitor."""
    docs = render(scenario, "--set", "metrics.podMonitor.enabled=true",
                  "--set", "metrics.podMonitor.labels.release=kube-prometheus-stack",
                  *NETWORK_POLICY, *TOPIC)
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]
    pm = one(docs, "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["streaming"]}
    assert selected_pods(docs, pm["spec"]["selector"]["matchLabels"]) == ["StatefulSet/kaas"]
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert port_number(broker_container(docs), endpoint["port"]) == 8080
    assert endpoint["path"] == "/metrics"
    assert {"targetLabel": "job", "replacement": "kaas"} in endpoint["relabelings"]
    assert not [d for d in render(scenario) if d["kind"] == "PodMonitor"]
    err = render_fails("--set", "metrics.podMonitor.enabled=true", "--set", "metrics.serviceMonitor.enabled=true")
    assert "scraped twice" in err


# -- hooks: helm test and the topic Job, run against a real broker ---------------------------------


def _hook_script(container: dict, bootstrap: str) -> tuple[list[str], dict]:
    """A hook container's command as the kubelet would run it, with the bootstrap address of a
    local broker in place of the client Service's: (argv, environment)."""
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["BOOTSTRAP_SERVERS"] == "kaas.streaming.svc:9092"
    env["BOOTSTRAP_SERVERS"] = bootstrap
    argv = [kube_expand(a, env) for a in container["command"]]
    assert argv[:2] == ["/bin/sh", "-ec"]
    return argv, env


def _run_hook(argv: list[str], env: dict, path_prefix: str = "") -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    if path_prefix:
        full_env["PATH"] = f"{path_prefix}:{os.environ['PATH']}"
    return subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=420,
                          stdin=subprocess.DEVNULL)


def test_helm_test_hook_produces_and_consumes_through_a_broker(broker_factory):
    """The `helm test` pod's script, run unchanged against a real broker, produces a record and reads it back."""
    if shutil.which("kcat") is None:
        pytest.skip("kcat not installed")
    docs = render("default")
    pod = hook(docs, "Pod", "test")
    client = one(docs, "Service", "kaas")
    (c,) = pod["spec"]["containers"]
    assert c["image"] == "edenhill/kcat:1.7.1"
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["activeDeadlineSeconds"] > 0
    # it bootstraps from the client Service
    assert env_of(c)["BOOTSTRAP_SERVERS"] == \
        f"{client['metadata']['name']}.streaming.svc:{client['spec']['ports'][0]['port']}"
    pinned = hook(render("default", "--set", "tests.image.repository=mirror.example.com/kcat",
                         "--set", "tests.image.tag=1.7.0"), "Pod", "test")
    assert pinned["spec"]["containers"][0]["image"] == "mirror.example.com/kcat:1.7.0"
    assert not [d for d in render("default", "--set", "tests.enabled=false") if d["kind"] == "Pod"]

    from kcheck import rdkafka_read_all
    broker = broker_factory()
    argv, env = _hook_script(c, broker.bootstrap)
    values = []
    for run in range(2):  # a second run must find its own record, not the first one's
        p = _run_hook(argv, env)
        assert p.returncode == 0, f"run {run}:\n{p.stdout}\n{p.stderr}"
        assert "consumed it back" in p.stdout, p.stdout
        (line,) = [l for l in p.stdout.splitlines() if l.startswith("produced to ")]
        values.append(line.split(": ", 1)[1].encode())
    assert values[0] != values[1]
    records, _ = rdkafka_read_all(broker.bootstrap, env["TOPIC"], 1, timeout=60)
    assert [v for _, _, _, v in records] == values


def _topic_state(bootstrap: str, names: list[str]) -> dict:
    """{topic: (partition count, {config: value} of the topic's own configs)} read from the broker."""
    from confluent_kafka.admin import ConfigResource, ConfigSource
    from kcheck import admin
    a = admin(bootstrap)
    md = a.list_topics(timeout=20)
    state = {}
    for name in names:
        if name not in md.topics:
            continue
        res = ConfigResource(ConfigResource.Type.TOPIC, name)
        configs = a.describe_configs([res])[res].result(20)
        own = {k: e.value for k, e in configs.items()
               if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}
        state[name] = (len(md.topics[name].partitions), own)
    return state


def test_topics_job_reconciles_a_broker_idempotently(broker_factory, kafka_libs, tmp_path):
    """The topic Job's script, run unchanged with Kafka's CLI tools, creates, grows and configures topics idempotently."""
    docs = render("options")
    job = hook(docs, "Job", "post-install")
    assert set(job["metadata"]["annotations"]["helm.sh/hook"].split(",")) == {"post-install", "post-upgrade"}
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "apache/kafka:4.1.0"
    assert hook(render("options", "--set", "topicsJob.image.tag=4.0.1"), "Job", "post-install")[
        "spec"]["template"]["spec"]["containers"][0]["image"] == "apache/kafka:4.0.1"
    assert not [d for d in render("default") if d["kind"] == "Job"]
    assert "declared twice" in render_fails("--set", "topics[0].name=a", "--set", "topics[0].partitions=1",
                                            "--set", "topics[1].name=a", "--set", "topics[1].partitions=2")
    assert "/topics/0/name" in render_fails("--set", "topics[0].name=a b", "--set", "topics[0].partitions=1")

    # The rendered script calls kafka-topics.sh and kafka-configs.sh from PATH, as in the image;
    # here they are the same tools run from the fetched jars.
    shims = tmp_path / "bin"
    shims.mkdir()
    for tool in ("kafka-topics", "kafka-configs"):
        shim = shims / f"{tool}.sh"
        shim.write_text(f'#!/bin/sh\nexec {REPO / "scripts" / "kafka-tool.sh"} {tool} "$@"\n')
        shim.chmod(0o755)

    from kcheck import create_topic
    broker = broker_factory()
    # Exists before the first run, with fewer partitions than declared and a config of its own.
    create_topic(broker.bootstrap, "payments", 2, {"retention.bytes": "1048576"})
    names = ["orders", "audit.log", "payments"]
    serial = itertools.count()

    def run(topics: list[dict]) -> subprocess.CompletedProcess:
        # a file per run: renderings are cached by their arguments
        values = tmp_path / f"topics-{next(serial)}.yaml"
        values.write_text(yaml.safe_dump({"topics": topics}))
        job = hook(render("options", "-f", str(values)), "Job", "post-install")
        argv, env = _hook_script(job["spec"]["template"]["spec"]["containers"][0], broker.bootstrap)
        return _run_hook(argv, env, path_prefix=str(shims))

    topics = [
        {"name": "orders", "partitions": 3,
         "config": {"retention.ms": 604800000, "cleanup.policy": "compact,delete"}},
        {"name": "audit.log", "partitions": 1},
        {"name": "payments", "partitions": 4, "config": {"max.message.bytes": 2097152}},
    ]
    want = {
        "orders": (3, {"retention.ms": "604800000", "cleanup.policy": "compact,delete"}),
        "audit.log": (1, {}),
        "payments": (4, {"retention.bytes": "1048576", "max.message.bytes": "2097152"}),
    }
    p = run(topics)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert "topic payments: partitions raised from 2 to 4" in p.stdout, p.stdout
    assert _topic_state(broker.bootstrap, names) == want

    p = run(topics)  # again: nothing to create or raise, and the state is the same
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert "Created topic" not in p.stdout and "raised" not in p.stdout, p.stdout
    assert _topic_state(broker.bootstrap, names) == want

    topics[0] = {"name": "orders", "partitions": 5,
                 "config": {"retention.ms": 86400000, "cleanup.policy": "compact,delete"}}
    want["orders"] = (5, {"retention.ms": "86400000", "cleanup.policy": "compact,delete"})
    p = run(topics)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert "topic orders: partitions raised from 3 to 5" in p.stdout, p.stdout
    assert _topic_state(broker.bootstrap, names) == want

    topics[0]["partitions"] = 2
    p = run(topics)
    assert p.returncode != 0
    assert "topic orders has 5 partitions, more than the 2 asked for" in p.stderr, p.stderr
    assert _topic_state(broker.bootstrap, names) == want


# -- the image definition ------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_structure():
    """Multi-stage build, pinned base tags, non-root user, ports 9092/9094/8080, /data volume, ENTRYPOINT kaas."""
    ins = dockerfile_instructions()
    args = {}
    for op, rest in ins:
        if op == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args[k] = v
        if op == "FROM":
            break
    stages = []
    for op, rest in ins:
        if op == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
            name = rest.split()[-1] if " as " in rest.lower() else None
            stages.append({"image": image, "name": name, "ins": []})
        elif stages:
            stages[-1]["ins"].append((op, rest))
    assert len(stages) >= 2, "multi-stage build"
    for st in stages:
        repo, _, tag = st["image"].rpartition(":")
        assert repo and tag and tag != "latest" and "@" not in repo, st["image"]
        assert st["name"], f"stage {st['image']} is named"
    builder, final = stages[0], stages[-1]
    assert builder["image"].startswith("rust:")
    assert any(op == "RUN" and "cargo build --release --locked -p kaas" in r for op, r in builder["ins"])
    assert re.match(r"debian:[\w.-]+-slim$", final["image"]), final["image"]
    fins = final["ins"]
    users = [r for op, r in fins if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    # nothing but the kaas binary comes from the builder; no source is copied into the runtime image
    assert not [r for op, r in fins if op in ("COPY", "ADD")], "runtime stage copies nothing from the context"
    from_builder = [r for op, r in fins if op == "RUN" and f"from={builder['name']}" in r]
    assert len(from_builder) == 1 and "install -m 0755 /mnt/out/kaas /usr/local/bin/kaas" in from_builder[0]
    assert "setcap cap_ipc_lock=p " in from_builder[0]  # permitted only: never blocks exec
    exposed = {p for op, r in fins if op == "EXPOSE" for p in r.split()}
    assert {"9092", "9094", "8080"} <= exposed
    assert ("VOLUME", '["/data"]') in fins
    (entry,) = [r for op, r in fins if op == "ENTRYPOINT"]
    assert json.loads(entry) == ["/usr/local/bin/kaas"]
    assert (REPO / "deploy" / "Dockerfile.dockerignore").exists()


# -- the profile and the memlock sizing with the real binary -------------------------------------------------


SCMP_ACT_ALLOW = 0x7FFF0000
_OPS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4, "SCMP_CMP_GE": 5,
        "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _errno_action(n: int) -> int:
    return 0x00050000 | (n & 0xFFFF)


def _seccomp_loader(profile: dict):
    """A preexec_fn that installs `profile` (OCI format, as runc would, native arch) with libseccomp."""
    name = ctypes.util.find_library("seccomp")
    if not name:
        pytest.skip("libseccomp is not installed")
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    default = _errno_action(profile.get("defaultErrnoRet", 1))
    rules = []
    for entry in profile["syscalls"]:
        action = SCMP_ACT_ALLOW if entry["action"] == "SCMP_ACT_ALLOW" else _errno_action(entry.get("errnoRet", 1))
        args = entry.get("args") or []
        for name_ in entry["names"]:
            nr = lib.seccomp_syscall_resolve_name(name_.encode())
            if nr < 0:  # unknown to this libseccomp or not on this architecture (runc skips these too)
                continue
            cmps = (_ArgCmp * max(1, len(args)))()
            for i, a in enumerate(args):
                if a["op"] == "SCMP_CMP_MASKED_EQ":
                    cmps[i] = _ArgCmp(a["index"], _OPS[a["op"]], a["value"], a.get("valueTwo", 0))
                else:
                    cmps[i] = _ArgCmp(a["index"], _OPS[a["op"]], a["value"], 0)
            rules.append((action, nr, len(args), cmps))

    def load():
        ctx = lib.seccomp_init(default)
        for action, nr, n, cmps in rules:
            rc = lib.seccomp_rule_add_array(ctx, action, nr, n, cmps)
            if rc != 0:
                os.write(2, f"seccomp_rule_add {nr}: {rc}\n".encode())
                os._exit(97)
        if lib.seccomp_load(ctx) != 0:
            os._exit(98)

    return load


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _run_kaas(binary: Path, workdir: Path, env_extra: dict, preexec, serve_s: float = 30.0):
    """Starts kaas; returns (ready?, returncode, log). Stops it with SIGTERM once /readyz answers 200."""
    kafka, health = _free_port(), _free_port()
    run = tempfile.mkdtemp(prefix="run-", dir=workdir)
    os.chmod(run, 0o777)
    env = {"PATH": "/usr/bin:/bin", "KAAS_LISTEN": f"127.0.0.1:{kafka}",
           "KAAS_HEALTH_LISTEN": f"127.0.0.1:{health}", "KAAS_DATA_DIR": f"{run}/data",
           "KAAS_SHARDS": "2", "KAAS_LOG": "info", **env_extra}
    log = Path(run) / "kaas.log"
    with open(log, "wb") as out:
        p = subprocess.Popen([str(binary)], env=env, stdout=out, stderr=subprocess.STDOUT,
                             preexec_fn=preexec, cwd=run)
        ready = False
        deadline = time.monotonic() + serve_s
        try:
            while time.monotonic() < deadline and p.poll() is None:
                try:
                    status, _ = _http(f"http://127.0.0.1:{health}/readyz")
                    if status == 200:
                        ready = True
                        break
                except OSError:
                    pass
                time.sleep(0.2)
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            rc = p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    return ready, rc, log.read_text(errors="replace")


@pytest.fixture
def kaas_for_uid():
    """A copy of the kaas binary and a work dir that non-root users can use."""
    binary = kaas_binary()
    if binary is None:
        pytest.skip("no kaas binary (KAAS_BIN or a release build)")
    if os.geteuid() != 0:
        pytest.skip("needs root to run the broker as another user and to set its limits")
    root = Path(tempfile.mkdtemp(prefix="kaas-deploy-", dir="/tmp"))
    os.chmod(root, 0o755)
    copy = root / "kaas"
    shutil.copy2(binary, copy)
    os.chmod(copy, 0o755)
    work = root / "work"
    work.mkdir()
    os.chmod(work, 0o755)
    yield copy, work
    shutil.rmtree(root, ignore_errors=True)


# io_uring charges locked memory per user id, and a process's charge is returned asynchronously
# after it exits: each run gets a user id of its own so runs cannot see each other's charges.
_next_uid = [int(os.environ.get("KAAS_TEST_FIRST_UID", "20001"))]


def _as_pod_user(memlock: int, then=None):
    uid = _next_uid[0]
    _next_uid[0] += 1

    def pre():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (memlock, memlock))
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # drops every capability, CAP_IPC_LOCK included
        if then:
            then()
    return pre


def test_profile_lets_kaas_serve_and_its_absence_of_io_uring_is_named(kaas_for_uid):
    """Under the shipped profile kaas starts and serves; with the io_uring syscalls removed it exits naming seccomp."""
    binary, work = kaas_for_uid
    profile = json.loads(PROFILE.read_text())
    ready, rc, log = _run_kaas(binary, work, {}, _as_pod_user(POD_MEMLOCK, _seccomp_loader(profile)))
    assert ready and rc == 0, log[-3000:]
    blocked = dict(profile)
    blocked["syscalls"] = [{**s, "names": [n for n in s["names"] if n not in IO_URING_SYSCALLS]}
                           for s in profile["syscalls"]]
    ready, rc, log = _run_kaas(binary, work, {}, _as_pod_user(POD_MEMLOCK, _seccomp_loader(blocked)))
    assert not ready and rc != 0
    assert "io_uring is not usable (io_uring_setup failed" in log, log[-3000:]
    assert "seccomp filter (Seccomp: 2)" in log and "kaas-io-uring.json" in log, log[-3000:]


def test_chart_io_memory_fits_a_pod_memlock_limit(kaas_for_uid):
    """As a non-root user with 8 MiB memlock, the chart's default io memory registers every shard's buffers."""
    binary, work = kaas_for_uid
    env = env_of(broker_container(render("default")))
    extra = {"KAAS_IO_MEMORY_BYTES": env["KAAS_IO_MEMORY_BYTES"], "KAAS_SHARDS": env["KAAS_SHARDS"]}
    ready, rc, log = _run_kaas(binary, work, extra, _as_pod_user(POD_MEMLOCK))
    assert ready and rc == 0, log[-3000:]
    assert "registering buffers" not in log and "RLIMIT_MEMLOCK" not in log, log[-3000:]


def test_memlock_failures_name_the_limit(kaas_for_uid):
    """Too little memlock for one shard's buffer, or below glommio's 512 KiB minimum, stops kaas with the numbers."""
    binary, work = kaas_for_uid
    ready, rc, log = _run_kaas(binary, work, {"KAAS_IO_MEMORY_BYTES": str(2 << 20)},
                               _as_pod_user(1 << 20))
    assert not ready and rc != 0
    assert "RLIMIT_MEMLOCK is too small: the limit is 1.0 MiB (1048576 bytes)" in log, log[-3000:]
    assert "io_uring_register(IORING_REGISTER_BUFFERS) failed" in log, log[-3000:]
    assert "2097152 bytes" in log and "CAP_IPC_LOCK" in log and "--io-memory-bytes" in log
    ready, rc, log = _run_kaas(binary, work, {}, _as_pod_user(256 << 10))
    assert not ready and rc != 0
    assert "soft limit is 262144 bytes and glommio needs at least 524288" in log, log[-3000:]
    # more shards than the limit covers: serves, and says why IO may be slower
    ready, rc, log = _run_kaas(binary, work, {"KAAS_IO_MEMORY_BYTES": str(2 << 20)},
                               _as_pod_user(POD_MEMLOCK))
    assert ready and rc == 0, log[-3000:]
    assert "some shards will run without registered buffers" in log, log[-3000:]


def test_image_file_capability_gives_ipc_lock_only_where_granted(kaas_for_uid):
    """With cap_ipc_lock=p on the binary (as in the image) kaas uses CAP_IPC_LOCK when the bounding set has it, and still starts when not."""
    setcap = shutil.which("setcap") or next((p for p in ("/usr/sbin/setcap", "/sbin/setcap")
                                             if os.access(p, os.X_OK)), None)
    if not setcap:
        pytest.skip("setcap (libcap2-bin) is not installed")
    binary, work = kaas_for_uid
    p = subprocess.run([setcap, "cap_ipc_lock=p", str(binary)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot set file capabilities here: {p.stderr.strip()}")
    too_big = {"KAAS_IO_MEMORY_BYTES": str(2 << 20)}  # 2 shards x 3 x 2 MiB > 8 MiB without the capability
    # Kubernetes with capabilities.add [IPC_LOCK]: nothing is charged, so no shortfall and no skipped registration.
    ready, rc, log = _run_kaas(binary, work, too_big, _as_pod_user(POD_MEMLOCK))
    assert ready and rc == 0, log[-3000:]
    assert "registering buffers" not in log and "without registered buffers" not in log, log[-3000:]

    libc = ctypes.CDLL(None, use_errno=True)

    def drop_ipc_lock_from_bounding_set():
        if libc.prctl(24, 14, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_IPC_LOCK
            os._exit(96)

    as_pod_user = _as_pod_user(POD_MEMLOCK)

    def pre():
        drop_ipc_lock_from_bounding_set()
        as_pod_user()

    # A container without IPC_LOCK: exec still works (permitted-only file capability) and the
    # memlock budget applies again.
    ready, rc, log = _run_kaas(binary, work, too_big, pre)
    assert ready and rc == 0, log[-3000:]
    assert "some shards will run without registered buffers" in log, log[-3000:]


def test_broker_configs_render_as_flags(tmp_path):
    """`config.broker` (Kafka's broker config names) becomes one `--broker-config` flag each,
    with YAML numbers written as Kafka expects them (536870912, not 5.36870912e+08), a
    fraction kept, and "$(" escaped so Kubernetes does not expand it."""
    values = tmp_path / "broker.yaml"
    values.write_text(yaml.safe_dump({"config": {"broker": {
        "log.segment.bytes": 536870912, "log.retention.ms": 604800000,
        "log.cleaner.min.cleanable.ratio": 0.5, "log.cleanup.policy": "compact,delete",
        "ssl.keystore.password": "a$(b)"}}}))
    for scenario in ("default", "cluster"):
        args = broker_container(render(scenario, "-f", str(values)))["args"]
        flags = [a for a in args if a.startswith("--broker-config=")]
        assert flags == [
            "--broker-config=log.cleaner.min.cleanable.ratio=0.5",
            "--broker-config=log.cleanup.policy=compact,delete",
            "--broker-config=log.retention.ms=604800000",
            "--broker-config=log.segment.bytes=536870912",
            "--broker-config=ssl.keystore.password=a$$(b)",
        ], flags
    assert "/config/broker" in render_fails("--set", "config.broker={a,b}")
