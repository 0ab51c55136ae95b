"""A one-node Kubernetes on this machine, for installing the Helm chart for real
(tests/test_chart_on_kubernetes.py).

Every part is the real one, built or installed by scripts/install-kube-node.sh: etcd and
kube-apiserver, kube-controller-manager, kube-scheduler, the kubelet on Debian's containerd and
runc, kube-proxy (iptables mode) and CoreDNS. No image registry is reachable, so the images are
built here from files on this machine (`oci_image`) and imported into containerd: the kaas
binary under test, a kcat image for the chart's `helm test` pod, Kafka's tools for its topics
Job, prometheus-operator with Prometheus, and the pod sandbox's `pause`.

Networking: the CNI bridge `kaas-k8s0` is created first with the address 10.244.0.1/24, and the
API server, the kubelet and CoreDNS listen on that address only: the pods reach them through
their gateway and nothing outside this machine does. kube-proxy's Services are 10.96.0.0/24.

What this machine forces, and why:
- containerd's CRI plugin runs with `restrict_oom_score_adj`: the VM withholds CAP_SYS_RESOURCE
  from root, so runc could not give the pod sandbox the oom_score_adj of -998 the kubelet asks.
- The kubelet runs on cgroup v1 (`failCgroupV1: false`) with the cgroupfs driver.
- Its root directory is /var/lib/kubelet, because the chart installs its seccomp profile to
  /var/lib/kubelet/seccomp, where kubelets look for `Localhost` profiles.

Only one node runs at a time on a machine (the bridge, the kubelet's directory and kube-proxy's
iptables chains are per machine); `close` removes all of them.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import json
import os
import secrets
import shlex
import resource
import shutil
import signal
import struct
import subprocess
import tarfile
import threading
import time
import urllib.request
from pathlib import Path

from conftest import free_port

PR_SET_PDEATHSIG = 1
# The images' platform, as OCI names it.
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
BRIDGE = "kaas-k8s0"
NODE_IP = "10.244.0.1"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/24"
API_SERVICE_IP = "10.96.0.1"
NODE_NAME = "kaas-node"
KUBELET_ROOT = Path("/var/lib/kubelet")
# The kubelet's default `podLogsDir`: one directory per pod, `<namespace>_<name>_<uid>`, deleted
# with the pod.
POD_LOGS = Path("/var/log/pods")
CONTAINER_LOGS = Path("/var/log/containers")  # the kubelet's links into POD_LOGS
# Written into KUBELET_ROOT: what a killed run left there may be removed by the next.
MARKER = KUBELET_ROOT / ".kaas-test-node"
# The containerd socket's name, by which its shims are found (see _clean_machine).
SOCKET_NAME = "kaas-test-containerd.sock"
KUBE_DIR = Path(os.environ.get("KAAS_KUBE_DIR", Path.home() / ".cache" / "kaas" / "kube"))
START_TIMEOUT_S = 180.0
# What the node changes on the machine, put back by close(): forwarding and bridge filtering
# (pods and Services need them), and what the kubelet sets for itself at start.
SYSCTLS = ["net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables", "vm/overcommit_memory",
           "kernel/panic", "kernel/panic_on_oops"]
# The memlock limit systemd >= 253 gives containerd, and so every pod (deploy/README.md).
POD_MEMLOCK_BYTES = 8 << 20
BINARIES = ["kubectl", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
            "kube-proxy", "coredns", "etcd", "prometheus-operator", "prometheus-config-reloader",
            "prometheus"]
# prometheus-operator's monitoring.coreos.com CRDs (scripts/install-kube-node.sh): every one,
# as its operator expects them.
CRD_DIR = KUBE_DIR / "crds"
CRDS = ["servicemonitors", "podmonitors", "prometheusrules", "prometheuses", "prometheusagents",
        "alertmanagers", "alertmanagerconfigs", "probes", "scrapeconfigs", "thanosrulers"]


def crd_files() -> list[Path]:
    return [CRD_DIR / f"monitoring.coreos.com_{c}.yaml" for c in CRDS]


def missing() -> list[str]:
    """What this machine lacks to run a node (empty when it can)."""
    lacking = [str(KUBE_DIR / b) for b in BINARIES if not os.access(KUBE_DIR / b, os.X_OK)]
    lacking += [str(p) for p in crd_files() if not p.exists()]
    lacking += [tool for tool in ("containerd", "runc", "ctr", "iptables", "ip", "kcat", "cc",
                                  "openssl", "pgrep")
                if shutil.which(tool) is None]
    if not Path("/usr/lib/cni/bridge").exists():
        lacking.append("/usr/lib/cni/bridge (containernetworking-plugins)")
    if os.geteuid() != 0:
        lacking.append("root")
    # The node takes over the machine's kubelet directory and KUBE-* iptables chains: never on a
    # machine that runs Kubernetes of its own.
    # (what a killed run of this module left is ours, and start() removes it)
    for other in ("kubelet", "kube-proxy", "kubelite", "k3s"):
        foreign = [pid for pid in _pids(other) if not _ours(pid)]
        if foreign:
            lacking.append(f"a machine without a {other} of its own (pid {foreign[0]} runs)")
    if not MARKER.exists():
        if KUBELET_ROOT.exists() and any(KUBELET_ROOT.iterdir()):
            lacking.append(f"a machine whose {KUBELET_ROOT} is not another kubelet's")
        if shutil.which("iptables") and "-N KUBE-" in _run(
                "iptables", "-w", "10", "-t", "nat", "-S", check=False).stdout:
            lacking.append("a machine without another kube-proxy's KUBE-* iptables chains")
    return lacking


def _pids(name: str) -> list[int]:
    out = _run("pgrep", "-x", name, check=False).stdout if shutil.which("pgrep") else ""
    return [int(p) for p in out.split()]


def _ours(pid: int) -> bool:
    """A process started from this module's binaries (by this run or a killed one)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).parent == KUBE_DIR.resolve()
    except OSError:
        return False


# -- images -------------------------------------------------------------------------------------

def _ldd(binary: str) -> list[str]:
    # ldd exits 1 for a static executable ("not a dynamic executable"): no libraries then
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs.append(parts[2])
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])
    return libs


class Layer:
    """One image layer: a tar of files taken from this machine."""

    def __init__(self):
        self._buf = io.BytesIO()
        self._tar = tarfile.open(fileobj=self._buf, mode="w", format=tarfile.PAX_FORMAT)
        self._dirs: set[str] = set()
        self._files: set[str] = set()

    def _parents(self, path: str) -> None:
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self._dirs:
                self.directory("/" + d)

    def directory(self, path: str, mode: int = 0o755, owner: int = 0) -> None:
        self._parents(path)
        self._dirs.add(path.strip("/"))
        info = tarfile.TarInfo(path.strip("/"))
        info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, owner, owner
        self._tar.addfile(info)

    def data(self, path: str, content: bytes, mode: int = 0o644,
             xattrs: dict[str, bytes] | None = None) -> None:
        self._parents(path)
        self._files.add(path.strip("/"))
        info = tarfile.TarInfo(path.strip("/"))
        info.size, info.mode = len(content), mode
        if xattrs:
            # PAX records, as docker and buildah write them; containerd applies them on unpack.
            info.pax_headers = {f"SCHILY.xattr.{k}": v.decode("utf-8", "surrogateescape")
                                for k, v in xattrs.items()}
        self._tar.addfile(info, io.BytesIO(content))

    def file(self, path: str, host: str, xattrs: dict[str, bytes] | None = None) -> None:
        self.data(path, Path(host).read_bytes(), os.stat(host).st_mode & 0o7777, xattrs)

    def program(self, path: str, host: str, xattrs: dict[str, bytes] | None = None) -> None:
        """A dynamically linked program and the libraries ldd finds for it."""
        self.file(path, host, xattrs)
        self.libraries(host)

    def libraries(self, host: str) -> None:
        """The libraries ldd finds for `host` that the layer lacks, at the paths ldd names."""
        for lib in map(os.path.normpath, _ldd(host)):  # $ORIGIN paths hold `..`
            if lib.strip("/") not in self._files:
                self.file(lib, os.path.realpath(lib))

    def busybox(self, applets: list[str]) -> None:
        """Debian's busybox as /bin/sh and the given applets (with its libraries, if the
        machine's busybox is not the static one)."""
        self.program("/bin/busybox", "/bin/busybox")
        for applet in applets:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            self._tar.addfile(info)

    def close(self) -> bytes:
        self._tar.close()
        return self._buf.getvalue()


def oci_image(dest: Path, name: str, layer: Layer, config: dict) -> Path:
    """Write `layer` as a one-layer OCI image archive named `name` (for `ctr images import`)."""
    content = layer.close()
    with tarfile.open(dest, "w") as out:
        def blob(data: bytes) -> dict:
            digest = hashlib.sha256(data).hexdigest()
            info = tarfile.TarInfo(f"blobs/sha256/{digest}")
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
            return {"digest": f"sha256:{digest}", "size": len(data)}

        layer_ref = blob(content)
        config_ref = blob(json.dumps({
            "architecture": ARCH, "os": "linux", "config": config,
            "rootfs": {"type": "layers", "diff_ids": [layer_ref["digest"]]}}).encode())
        manifest_ref = blob(json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_ref},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        **layer_ref}]}).encode())
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_ref,
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]}
        for fname, data in (("index.json", json.dumps(index).encode()),
                            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')):
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return dest


# The file capability the Dockerfile sets on the binary (`setcap cap_ipc_lock=p`): a version-2
# security.capability xattr with CAP_IPC_LOCK (14) permitted and nothing inheritable.
CAP_IPC_LOCK_PERMITTED = struct.pack("<IIIII", 0x02000000, 1 << 14, 0, 0, 0)


def kaas_image(dest: Path, kaas_binary: Path) -> Path:
    """What deploy/Dockerfile builds, from the binary under test: /usr/local/bin/kaas with
    cap_ipc_lock=p, user 10001 owning /data, its environment and entrypoint. A static busybox
    stands in for Debian-slim's shell and coreutils, which the chart's seccomp installer uses."""
    layer = Layer()
    layer.data("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"
                              b"kaas:x:10001:10001::/data:/usr/sbin/nologin\n")
    layer.data("/etc/group", b"root:x:0:\nkaas:x:10001:\n")
    layer.directory("/data", 0o750, owner=10001)
    layer.directory("/tmp", 0o1777)
    layer.program("/usr/local/bin/kaas", str(kaas_binary),
                  xattrs={"security.capability": CAP_IPC_LOCK_PERMITTED})
    layer.busybox(["sh", "cp", "mv", "rm", "mkdir", "cat", "cmp", "ls", "sleep", "echo", "test"])
    return oci_image(dest, "docker.io/library/kaas:test", layer, {
        "Entrypoint": ["/usr/local/bin/kaas"], "User": "10001:10001", "WorkingDir": "/data",
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "KAAS_LISTEN=0.0.0.0:9092",
                "KAAS_HEALTH_LISTEN=0.0.0.0:8080", "KAAS_DATA_DIR=/data"]})


def kcat_image(dest: Path, name: str) -> Path:
    """Debian's kcat and a shell: what the chart's `helm test` pod runs."""
    layer = Layer()
    layer.program("/usr/bin/kcat", shutil.which("kcat") or "/usr/bin/kcat")
    layer.busybox(["sh", "date", "od", "tr", "grep", "printf", "echo", "cat"])
    layer.directory("/tmp", 0o1777)
    return oci_image(dest, name, layer, {"Entrypoint": ["/usr/bin/kcat"],
                                         "Env": ["PATH=/usr/bin:/bin"]})


# What of the JDK an image of Kafka's tools leaves out: sources, modules for javac, GUI libraries.
_JDK_SKIPPED = ("src.zip", "ct.sym", "jmods", "awt", "atk", "splash", "jsound", "fontmanager",
                "lcms", "jpeg", "mlib", "jawt", "j2pcsc", "saproc")


def kafka_tools_image(dest: Path, name: str, kafka_libs: Path) -> Path:
    """What the chart's topics Job needs of the apache/kafka image (no registry serves it here):
    /opt/kafka/bin/kafka-topics.sh and kafka-configs.sh, running Apache Kafka's own tool classes
    from the jars scripts/fetch-kafka.sh fetched, on this machine's JRE with its libraries, with
    a shell and awk (busybox) for the Job's script, as the image's user appuser (uid 1000)."""
    # the JDK that runs `java` here (the tests run Kafka's tools with it)
    java_home = Path(shutil.which("java") or "java").resolve().parent.parent
    layer = Layer()
    layer.data("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"
                              b"appuser:x:1000:1000::/home/appuser:/bin/sh\n")
    layer.data("/etc/group", b"root:x:0:\nappuser:x:1000:\n")
    layer.directory("/tmp", 0o1777)
    layer.busybox(["sh", "awk", "sleep", "printf", "echo", "cat"])
    executables = []
    for host in sorted(java_home.rglob("*")):
        rel = host.relative_to(java_home)
        wanted = rel.parts[0] in ("conf", "lib") or rel == Path("bin/java")
        skipped = any(word in part for word in _JDK_SKIPPED for part in rel.parts)
        # conf/ links into /etc: the files themselves (a dangling link is left out)
        if wanted and not skipped and host.is_file():
            layer.file(str(host), str(host.resolve()))
            if host.suffix == ".so" or rel == Path("bin/java"):
                executables.append(str(host))
    for host in executables:
        layer.libraries(host)
    for jar in sorted(kafka_libs.glob("*.jar")):
        layer.file(f"/opt/kafka/libs/{jar.name}", str(jar))
    for tool, main in (("kafka-topics", "org.apache.kafka.tools.TopicCommand"),
                       ("kafka-configs", "org.apache.kafka.tools.ConfigCommand")):
        # kafka-run-class.sh's default heap for the tools
        layer.data(f"/opt/kafka/bin/{tool}.sh",
                   f'#!/bin/sh\nexec {java_home}/bin/java -Xmx256M -Dlog4j2.level=warn '
                   f'-cp "/opt/kafka/libs/*" {main} "$@"\n'.encode(), 0o755)
    return oci_image(dest, name, layer, {"User": "1000:1000", "WorkingDir": "/tmp",
                                         "Env": ["PATH=/opt/kafka/bin:/bin"]})


def program_image(dest: Path, name: str, host: str, path: str) -> Path:
    """One program (with the libraries ldd finds for it) as the image's entrypoint, run as
    nobody: prometheus-operator, its config reloader and Prometheus (built by
    install-kube-node.sh), for the operator's pods (no registry serves their images)."""
    layer = Layer()
    layer.program(path, host)
    layer.directory("/tmp", 0o1777)
    return oci_image(dest, name, layer, {"Entrypoint": [path], "User": "65534:65534"})


def pause_image(dest: Path, workdir: Path) -> Path:
    """The pod sandbox's process: waits for a signal (a static C program built here)."""
    src = workdir / "pause.c"
    src.write_text("#include <signal.h>\n#include <unistd.h>\n"
                   "static void bye(int s) { (void)s; _exit(0); }\n"
                   "int main(void) { signal(SIGTERM, bye); signal(SIGINT, bye);"
                   " for (;;) pause(); }\n")
    subprocess.run(["cc", "-static", "-O2", "-o", str(workdir / "pause"), str(src)], check=True)
    layer = Layer()
    layer.file("/pause", str(workdir / "pause"))
    return oci_image(dest, "kaas.local/pause:1", layer, {"Entrypoint": ["/pause"]})


def _remove_kube_chains() -> None:
    """Remove the KUBE-* iptables chains kube-proxy and the kubelet create (the kubelet's
    KUBE-FIREWALL, hooked into INPUT and OUTPUT, stays behind otherwise)."""
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            rules = _run(tool, "-w", "10", "-t", table, "-S", check=False).stdout.splitlines()
            for rule in rules:
                try:
                    parts = shlex.split(rule)  # comments are quoted
                except ValueError:
                    continue
                # a built-in chain's rule that jumps into a KUBE- chain
                if parts[:1] == ["-A"] and not parts[1].startswith("KUBE-") and \
                        any(p.startswith("KUBE-") for p in parts[2:]):
                    _run(tool, "-w", "10", "-t", table, "-D", *parts[1:], check=False)
            chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
            for chain in chains:
                _run(tool, "-w", "10", "-t", table, "-F", chain, check=False)
            for chain in chains:
                _run(tool, "-w", "10", "-t", table, "-X", chain, check=False)


# -- the node -----------------------------------------------------------------------------------

def _run(*cmd, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=check,
                          timeout=timeout, **kw)


class KubeNode:
    """etcd, the control plane, a kubelet on containerd, kube-proxy and CoreDNS, all under
    `root` (logs in root/logs). Use as a context manager."""

    def __init__(self, root: Path):
        self.root = root
        self.logs = root / "logs"
        self.pki = root / "pki"
        self.kubeconfig = root / "kubeconfig"
        self.containerd_sock = root / SOCKET_NAME
        self.procs: dict[str, subprocess.Popen] = {}
        self.api_port = free_port()
        self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        self.saved_sysctls: dict[str, str] = {}
        self.coredns_ready_port = free_port()

    def __enter__(self) -> "KubeNode":
        try:
            self.start()
        except BaseException:
            with contextlib.suppress(Exception):  # the start's failure is the one to report
                self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- processes
    def _spawn(self, name: str, cmd: list, memlock: int | None = None) -> None:
        def child() -> None:
            # Killed with the test process, so a killed run leaves no node running.
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if memlock is not None:
                resource.setrlimit(resource.RLIMIT_MEMLOCK, (memlock, memlock))

        log = open(self.logs / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen([str(c) for c in cmd], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, cwd=self.root,
                                            preexec_fn=child)
        log.close()

    def _wait(self, what: str, ready, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited ({p.returncode}) while waiting for {what}:"
                                       f"\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready within {timeout:.0f}s")
            time.sleep(0.5)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- start
    def start(self) -> None:
        if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0 or MARKER.exists():
            # what a killed run left (close() removes all of it)
            stale = MARKER.read_text().split("\n")[1:2] if MARKER.exists() else []
            self._clean_machine([Path(p) for p in stale if p.startswith("/")])
        for d in (self.logs, self.pki, KUBELET_ROOT):
            d.mkdir(parents=True, exist_ok=True)
        MARKER.write_text(f"made by kaas tests/kube_node.py for\n{self.root}\n")
        self.saved_sysctls = {k: (Path("/proc/sys") / k).read_text()
                              for k in SYSCTLS if (Path("/proc/sys") / k).exists()}
        self._network()
        self._credentials()
        self._control_plane()
        self._containerd()
        self._kubelet_and_proxy()
        self._coredns()
        self._wait("node Ready", lambda: '"Ready"' in self.kubectl(
            "get", "node", NODE_NAME, "-o",
            "jsonpath={range .status.conditions[?(@.status==\"True\")]}\"{.type}\"{end}",
            check=False))
        # Pods are refused until the controller-manager made the namespace's ServiceAccount.
        self._wait("the default ServiceAccount", lambda: self.kubectl(
            "get", "serviceaccount", "default", check=False).strip() != "")
        self._wait("CoreDNS", self._coredns_ready)

    def _network(self) -> None:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        # Pods reach each other and Services through the bridge; br_netfilter makes the bridged
        # traffic pass kube-proxy's iptables rules (hairpin: a pod to a Service backed by itself).
        if shutil.which("modprobe"):
            _run("modprobe", "br_netfilter", check=False)
        for key in ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"):
            path = Path("/proc/sys") / key
            if path.exists():
                path.write_text("1\n")

    def _credentials(self) -> None:
        pki = self.pki
        ext = pki / "apiserver.ext"
        ext.write_text(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            f"subjectAltName=IP:{NODE_IP},IP:{API_SERVICE_IP},IP:127.0.0.1,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
            "DNS:kubernetes.default.svc.cluster.local\n")
        for cmd in (
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=kaas-test-ca", "-keyout", pki / "ca.key", "-out", pki / "ca.crt",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
             "-keyout", pki / "apiserver.key", "-out", pki / "apiserver.csr"],
            ["openssl", "x509", "-req", "-in", pki / "apiserver.csr", "-CA", pki / "ca.crt",
             "-CAkey", pki / "ca.key", "-CAcreateserial", "-days", "2", "-extfile", ext,
             "-out", pki / "apiserver.crt"],
            ["openssl", "genrsa", "-out", pki / "sa.key", "2048"],
            ["openssl", "rsa", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub"],
        ):
            _run(*cmd)
        token = secrets.token_hex(24)
        (pki / "tokens.csv").write_text(f'{token},kaas-admin,kaas-admin-uid,"system:masters"\n')
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "node", "cluster": {
                "server": f"https://{NODE_IP}:{self.api_port}",
                "certificate-authority": str(pki / "ca.crt")}}],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": "node", "context": {"cluster": "node", "user": "admin",
                                                      "namespace": "default"}}]}))
        os.chmod(self.kubeconfig, 0o600)

    def _control_plane(self) -> None:
        etcd_port, peer_port = free_port(), free_port()
        self._spawn("etcd", [
            KUBE_DIR / "etcd", "--name", "node", "--data-dir", self.root / "etcd",
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"node=http://127.0.0.1:{peer_port}",
            "--logger", "zap", "--log-level", "warn"])
        pki = self.pki
        self._spawn("kube-apiserver", [
            KUBE_DIR / "kube-apiserver", "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
            "--bind-address", NODE_IP, "--advertise-address", NODE_IP,
            "--secure-port", self.api_port, "--cert-dir", pki / "certs",
            "--tls-cert-file", pki / "apiserver.crt", "--tls-private-key-file", pki / "apiserver.key",
            "--client-ca-file", pki / "ca.crt", "--token-auth-file", pki / "tokens.csv",
            "--authorization-mode", "RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", pki / "sa.pub",
            "--service-account-signing-key-file", pki / "sa.key",
            "--service-cluster-ip-range", SERVICE_CIDR,
            # the kubelet's name does not resolve here; its address does
            "--kubelet-preferred-address-types", "InternalIP",
            "--profiling=false", "--v", "1"])
        self._wait("kube-apiserver", lambda: self.kubectl("get", "--raw", "/readyz",
                                                          check=False).strip() == "ok")
        common = ["--kubeconfig", self.kubeconfig, "--authentication-kubeconfig", self.kubeconfig,
                  "--authorization-kubeconfig", self.kubeconfig, "--leader-elect=false",
                  "--bind-address", "127.0.0.1", "--v", "1"]
        self._spawn("kube-controller-manager", [
            KUBE_DIR / "kube-controller-manager", *common, "--secure-port", free_port(),
            "--service-account-private-key-file", pki / "sa.key",
            "--root-ca-file", pki / "ca.crt", "--use-service-account-credentials=false"])
        self._spawn("kube-scheduler", [KUBE_DIR / "kube-scheduler", *common,
                                       "--secure-port", free_port()])

    def _containerd(self) -> None:
        cni = self.root / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-kaas.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "kaas-test", "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                          "routes": [{"dst": "0.0.0.0/0"}],
                          "dataDir": str(self.root / "cni-ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}}]}))
        config = self.root / "containerd.toml"
        config.write_text(f"""version = 2
root = "{self.root}/containerd/root"
state = "{self.root}/containerd/state"
[grpc]
  address = "{self.containerd_sock}"
[ttrpc]
  address = "{self.containerd_sock}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "kaas.local/pause:1"
  restrict_oom_score_adj = true
  # the pods' network namespaces under our state dir, not the machine's /run/netns
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
""")
        self._spawn("containerd", ["containerd", "--config", config], memlock=POD_MEMLOCK_BYTES)
        self._wait("containerd", lambda: self.ctr("version", check=False).returncode == 0, 60)
        images = self.root / "images"
        images.mkdir(exist_ok=True)
        self.import_image(pause_image(images / "pause.tar", images))

    def _kubelet_and_proxy(self) -> None:
        config = self.root / "kubelet.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": NODE_IP, "port": free_port(), "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
            # The API server reaches the kubelet (logs, exec) without a client certificate;
            # the kubelet listens on the node's bridge address only.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "clusterDomain": "cluster.local", "clusterDNS": [NODE_IP],
            "resolvConf": "/etc/resolv.conf",
            # a test machine's disk may be fuller than a node's: never evict for it here
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            # A changed Secret or ConfigMap reaches a running pod's volume when the kubelet next
            # syncs that pod: every minute by default, plus jitter. The prometheus-operator
            # test swaps a ServiceMonitor for a PodMonitor and waits for the operator's
            # Prometheus to read the new configuration Secret; at the default that took 70-90 s
            # and in a CI run more than its 120 s (an intermediate configuration with both
            # monitors stayed projected). Every 10 s here, as a test node can afford.
            "syncFrequency": "10s"}))
        self._spawn("kubelet", [
            KUBE_DIR / "kubelet", "--config", config, "--kubeconfig", self.kubeconfig,
            "--hostname-override", NODE_NAME, "--node-ip", NODE_IP,
            "--node-labels", "topology.kubernetes.io/zone=zone-a",
            "--root-dir", KUBELET_ROOT, "--v", "1"])
        self._spawn("kube-proxy", [
            KUBE_DIR / "kube-proxy", "--kubeconfig", self.kubeconfig,
            "--hostname-override", NODE_NAME, "--proxy-mode", "iptables",
            "--cluster-cidr", POD_CIDR, "--conntrack-max-per-core", "0",
            # leave the machine's route_localnet and conntrack timeouts as they are
            "--iptables-localhost-nodeports=false", "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--metrics-bind-address", f"127.0.0.1:{free_port()}",
            "--healthz-bind-address", f"127.0.0.1:{free_port()}", "--v", "1"])

    def _coredns(self) -> None:
        corefile = self.root / "Corefile"
        corefile.write_text(f""".:53 {{
    bind {NODE_IP}
    errors
    kubernetes cluster.local in-addr.arpa {{
        kubeconfig {self.kubeconfig} node
        pods insecure
        fallthrough in-addr.arpa
    }}
    cache 5
    ready 127.0.0.1:{self.coredns_ready_port}
}}
""")
        self._spawn("coredns", [KUBE_DIR / "coredns", "-conf", corefile])

    def _coredns_ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.coredns_ready_port}/ready"
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    # -- use
    def kubectl(self, *args, check: bool = True, timeout: float = 60, stdin: str | None = None
                ) -> str:
        p = _run(KUBE_DIR / "kubectl", *args, check=False, timeout=timeout, env=self.env, input=stdin)
        if check and p.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(map(str, args))}: {p.stderr.strip()}")
        return p.stdout

    def server_version(self) -> str:
        version = json.loads(self.kubectl("version", "-o", "json"))
        return version["serverVersion"]["gitVersion"]

    def ctr(self, *args, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return _run("ctr", "--address", self.containerd_sock, "-n", "k8s.io", *args,
                    check=check, timeout=timeout)

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", archive)

    def apply(self, objects: list[dict]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                           "items": objects}))

    def pod_log(self, pod: str) -> str:
        return self.kubectl("logs", pod, "--all-containers", check=False)

    @contextlib.contextmanager
    def pod_logs_kept(self, dest: Path, name_prefix: str, every: float = 1.0):
        """Copies the logs of every pod in `default` whose name starts with `name_prefix` to
        `dest` (one directory per pod and uid) every `every` seconds while the block runs, and
        once more at its end: the kubelet deletes a pod's log with the pod, so without this
        a rolling upgrade's failure could only be read in the logs of the pods that replaced
        the ones that misbehaved."""
        stop = threading.Event()

        def copy_if_changed(src: str, dst: str) -> None:
            # copy2 keeps the mtime, so a log that has not grown since is not copied again
            if not os.path.exists(dst) or os.stat(src).st_mtime_ns != os.stat(dst).st_mtime_ns:
                shutil.copy2(src, dst)

        def copy() -> None:
            for pod_dir in POD_LOGS.glob(f"default_{name_prefix}*"):
                with contextlib.suppress(OSError):  # the pod went while this copied it
                    shutil.copytree(pod_dir, dest / pod_dir.name, dirs_exist_ok=True,
                                    copy_function=copy_if_changed)

        def run() -> None:
            while not stop.wait(every):
                copy()

        dest.mkdir(parents=True, exist_ok=True)
        copier = threading.Thread(target=run, name="pod-logs", daemon=True)
        copier.start()
        try:
            yield dest
        finally:
            stop.set()
            copier.join(timeout=30)
            copy()

    # -- stop
    def close(self) -> None:
        """Stop every pod, then every process, remove what they left on the machine and put
        its settings back. Every step runs even if one before it failed."""
        errors = []
        for step in (self._stop_pods, self._stop_processes, self._clean_own,
                     self._restore_sysctls):
            try:
                step()
            except Exception as e:  # noqa: BLE001 - the next steps must still run
                errors.append(f"{step.__name__}: {e!r}")
        if errors:
            raise RuntimeError("stopping the Kubernetes node: " + "; ".join(errors))

    def _alive(self, name: str) -> bool:
        return name in self.procs and self.procs[name].poll() is None

    def _stop(self, name: str) -> None:
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=15)

    def _stop_pods(self) -> None:
        # Nothing may bring back what is deleted: the controllers and the scheduler stop first.
        self._stop("kube-controller-manager")
        self._stop("kube-scheduler")
        if self._alive("kubelet") and self._alive("kube-apiserver"):
            # Deleted pods are stopped by the kubelet, their networks removed through CNI.
            self.kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=5",
                         "--wait=true", "--timeout=60s", check=False, timeout=90)
        if self._alive("containerd"):
            # whatever is still running: killed while containerd can still reach it
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
                self.ctr("tasks", "delete", "-f", task, check=False)

    def _stop_processes(self) -> None:
        for name in ("coredns", "kubelet", "kube-proxy", "containerd", "kube-apiserver", "etcd"):
            self._stop(name)

    def _restore_sysctls(self) -> None:
        for key, value in self.saved_sysctls.items():
            (Path("/proc/sys") / key).write_text(value)

    def _clean_own(self) -> None:
        self._clean_machine([self.root])

    def _clean_machine(self, roots: list[Path]) -> None:
        """Remove what this node (or a killed run's, under `roots`) left on the machine."""
        # A killed run's containers outlive its containerd and shims: their cgroups name them.
        for cgroup in [*Path("/sys/fs/cgroup").glob("*/kubepods"), Path("/sys/fs/cgroup/kubepods")]:
            for procs in cgroup.rglob("cgroup.procs"):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        _run("pkill", "-KILL", "-f", f"containerd-shim-runc-v2 .*-address .*/{SOCKET_NAME}",
             check=False)
        for name in BINARIES:
            for pid in _pids(name):
                if _ours(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        for root in roots:
            _run("pkill", "-KILL", "-f", f"containerd --config {root}/containerd.toml",
                 check=False)
            _run("pkill", "-KILL", "-f", f"--data-dir {root}/etcd", check=False)
        _remove_kube_chains()
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        prefixes = tuple(f"{p}/" for p in [KUBELET_ROOT, *roots])
        # the kubelet makes its own root a mount too
        ours = [m for m in mounts if m.startswith(prefixes) or m == str(KUBELET_ROOT)]
        for m in sorted(ours, key=len, reverse=True):
            _run("umount", "-l", m, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        if MARKER.exists():
            shutil.rmtree(KUBELET_ROOT, ignore_errors=True)
            # The pods' logs: a later node would otherwise find (and a test keep) this one's.
            shutil.rmtree(POD_LOGS, ignore_errors=True)
            shutil.rmtree(CONTAINER_LOGS, ignore_errors=True)
