"""Several real kaas broker processes sharing one data directory with the `file` Lease: a
cluster for tests (tests/test_cluster.py, and the client suites against a cluster). Each
broker can be killed, paused and started again with the same id, ports and shared data dir.
Logs go to `broker-<id>.log` under the cluster's root."""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from conftest import free_port, kaas_bin

LEASE_ARGS = ["--lease-duration-ms", "3000", "--lease-renew-deadline-ms", "2000",
              "--lease-retry-period-ms", "500"]
DRAIN_TIMEOUT_MS = 30000
START_TIMEOUT_S = 60.0
# How long a partition may go without a leader after its leader dies. With 3 s Leases, a 2.5 s
# write fence and a 1 s handover margin the design needs about 4–7 s; the rest is slack for a
# loaded 2-core machine running debug builds.
FAILOVER_BOUND_S = 15.0
SETTLE_TIMEOUT_S = 60.0

# -- processes ---------------------------------------------------------------------------------

class Node:
    """One kaas broker process of a cluster (it can be killed, paused and started again with
    the same id, ports and shared data dir)."""

    def __init__(self, cluster: "Cluster", broker_id: int):
        self.cluster = cluster
        self.id = broker_id
        self.port, self.health_port, self.heartbeat_port = (cluster.port() for _ in range(3))
        self.log_path = cluster.root / f"broker-{broker_id}.log"
        # The address in Metadata, when not the one it listens on (a proxy in front of it).
        self.advertised: str | None = None
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self.starts = 0
        self._log = None

    host = "127.0.0.1"  # every broker of a test cluster listens on loopback (kwire.connect)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def index(self) -> int:
        """Its place in the cluster's list (its id, unless the ids start above 0)."""
        return self.id - self.cluster.first_id

    def command(self) -> list[str]:
        return [
            str(kaas_bin()), "--lease", "file", "--broker-id", str(self.id),
            "--data-dir", str(self.cluster.data_dir),
            "--listen", self.bootstrap,
            *(["--advertised-listener", self.advertised] if self.advertised else []),
            "--health-listen", f"127.0.0.1:{self.health_port}",
            "--heartbeat-listen", f"127.0.0.1:{self.heartbeat_port}",
            "--shards", "1", *self.cluster.lease_args,
            "--drain-timeout-ms", str(DRAIN_TIMEOUT_MS),
            # Explicit, so a test never depends on the binary's default; tests that restart
            # brokers and wait for an even spread run without a hold, and
            # test_cluster_rebalance_hold.py tests the hold itself.
            "--rebalance-hold-ms", str(self.cluster.rebalance_hold_ms),
            *(["--auto-create-topics", "true", "--num-partitions", str(self.cluster.auto_create)]
              if self.cluster.auto_create else ["--auto-create-topics", "false"]),
            # KAAS_TEST_BROKER_LOG: a debug filter for a run that needs one.
            "--log", os.environ.get("KAAS_TEST_BROKER_LOG", "info"), *self.cluster.extra_args,
            *(["--rack", self.cluster.racks[self.index]] if self.index < len(self.cluster.racks)
              else []),
        ]

    def start(self) -> None:
        assert not self.alive(), f"broker {self.id} already running"
        if not kaas_bin().exists():
            raise RuntimeError(f"kaas binary not found at {kaas_bin()} (set KAAS_BIN)")
        self._close_log()
        self._log = open(self.log_path, "ab")
        self._log.write(f"\n===== start #{self.starts + 1}: {' '.join(self.command())}\n".encode())
        self._log.flush()
        env = dict(os.environ, RUST_BACKTRACE="1", NO_COLOR="1", **self.cluster.env)
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.paused = False
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def running(self) -> bool:
        """Alive and not paused: expected to answer."""
        return self.alive() and not self.paused

    def note(self, msg: str) -> None:
        if self._log and not self._log.closed:
            self._log.write(f"===== test harness {time.strftime('%H:%M:%S')}: {msg}\n".encode())
            self._log.flush()

    def signal(self, sig: int) -> None:
        assert self.alive(), f"broker {self.id} is not running"
        self.note(f"sending {signal.Signals(sig).name}")
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.alive():
            self.note("SIGKILL")
            self.proc.kill()
            self.proc.wait(10)
        self.paused = False

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def _get(self, path: str, timeout: float = 2.0):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}{path}", timeout=timeout) as r:
            return r.status, r.read()

    def healthz(self) -> dict | None:
        """The `cluster` object of /healthz, or None if the broker does not answer."""
        if not self.running():
            return None
        try:
            _, body = self._get("/healthz")
            return json.loads(body)["cluster"]
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return None

    def ready(self) -> bool:
        if not self.running():
            return False
        try:
            return self._get("/readyz")[0] == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def close(self) -> None:
        if self.alive():
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self._close_log()

    def _close_log(self) -> None:
        if self._log and not self._log.closed:
            self._log.close()

    def log_tail(self, max_chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except FileNotFoundError:
            return ""


class Cluster:
    """N brokers sharing one data dir, with helpers to read the shared state."""

    def __init__(self, root: Path, n: int, extra_args=(), auto_create: int = 0,
                 env: dict[str, str] | None = None, racks: list[str] | None = None,
                 first_id: int = 0, lease_args=tuple(LEASE_ARGS), rebalance_hold_ms: int = 0):
        """`auto_create`: create unknown topics with this many partitions (0: don't);
        `racks`: the i-th broker's `--rack`; `first_id`: the first broker's id (the others
        follow it); `lease_args`: the Lease timings (default: short ones, for quick
        failovers; `()` for the binary's own, as the chart runs it); `rebalance_hold_ms`:
        how long a restarted broker gets no partition another broker leads (default none)."""
        self.lease_args = list(lease_args)
        self.rebalance_hold_ms = rebalance_hold_ms
        self.auto_create = auto_create
        self.racks = list(racks or [])
        self.env = dict(env or {})
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.root / "data"
        self.data_dir.mkdir(exist_ok=True)
        self.extra_args = list(extra_args)
        self._ports: set[int] = set()
        self.first_id = first_id
        self.nodes = [Node(self, first_id + i) for i in range(n)]

    def port(self) -> int:
        while True:
            p = free_port()
            if p not in self._ports:
                self._ports.add(p)
                return p

    @property
    def assignment_path(self) -> Path:
        return self.data_dir / "__cluster" / "assignment.json"

    @property
    def lease_path(self) -> Path:
        return self.data_dir / "__cluster" / "lease.json"

    def bootstrap(self, nodes=None) -> str:
        return ",".join(n.bootstrap for n in (nodes or self.nodes))

    def running(self) -> list[Node]:
        return [n for n in self.nodes if n.running()]

    def start(self) -> None:
        for n in self.nodes:
            n.start()
        self.wait_all_ready()
        self.wait_controller()

    def wait_all_ready(self, nodes=None, timeout: float = START_TIMEOUT_S) -> None:
        nodes = nodes or self.nodes

        def ready():
            for n in nodes:
                if not n.alive():
                    raise AssertionError(f"broker {n.id} exited with {n.proc.returncode} while starting")
            return all(n.ready() for n in nodes)
        self.wait(ready, timeout, f"brokers {[n.id for n in nodes]} ready")

    def assignment(self) -> dict | None:
        try:
            return json.loads(self.assignment_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def health(self) -> dict[int, dict | None]:
        return {n.id: n.healthz() for n in self.running()}

    def controller(self) -> Node | None:
        """The one running broker reporting is_controller, if all running brokers agree on it."""
        hs = self.health()
        if any(h is None for h in hs.values()):
            return None
        ctl = [i for i, h in hs.items() if h["is_controller"]]
        if len(ctl) != 1 or any(h["controller_id"] != ctl[0] for h in hs.values()):
            return None
        return self.nodes[ctl[0] - self.first_id]

    def wait_controller(self, timeout: float = START_TIMEOUT_S, newer_than: int = -1) -> Node:
        def check():
            c = self.controller()
            if c is None:
                return None
            h = c.healthz()
            return c if h and h["lease_epoch"] > newer_than else None
        return self.wait(check, timeout, f"one controller agreed by all (lease epoch > {newer_than})")

    def settled(self, total: int, balanced: bool = False):
        """The assignment file with `total` partitions, nothing pending, every partition on a
        running broker, and every running broker having applied that file and leading exactly
        its share. Returns (assignment, {id: led}) or None."""
        a = self.assignment()
        if a is None or a.get("pending") or len(a["partitions"]) != total:
            return None
        live = {n.id for n in self.running()}
        counts = Counter(p["leader"] for p in a["partitions"])
        if not set(counts) <= live:
            return None
        led = {}
        for i, h in self.health().items():
            if h is None or (h["controller_epoch"], h["assignment_version"]) != (a["controller_epoch"], a["assignment_version"]):
                return None
            if h["partitions_led"] != counts.get(i, 0) or h["partitions_pending_handover"]:
                return None
            led[i] = h["partitions_led"]
        if sum(led.values()) != total:
            return None
        if balanced and max(led.values()) - min(led.values()) > 1:
            return None
        return a, led

    def wait_settled(self, total: int, balanced: bool = False, timeout: float = SETTLE_TIMEOUT_S):
        return self.wait(lambda: self.settled(total, balanced), timeout,
                         f"{total} partitions led by running brokers{' evenly' if balanced else ''}")

    def describe(self) -> str:
        a = self.assignment()
        lines = []
        if a is not None:
            counts = Counter(p["leader"] for p in a["partitions"])
            lines.append(f"assignment.json: epoch {a['controller_epoch']} version {a['assignment_version']}"
                         f" leaders {dict(sorted(counts.items()))} pending {a.get('pending')}"
                         f" brokers {[(b['id'], b['health']) for b in a['brokers']]}")
        try:
            lines.append(f"lease.json: {json.loads(self.lease_path.read_text())}")
        except (FileNotFoundError, ValueError):
            pass
        for n in self.nodes:
            state = "paused" if n.paused else ("alive" if n.alive() else "down")
            h = n.healthz()
            if h:
                h = {k: v for k, v in h.items() if k != "brokers"}
            lines.append(f"broker {n.id} ({state}): {h}")
        return "\n".join(lines)

    def wait(self, check, timeout: float, what: str, interval: float = 0.1):
        deadline = time.monotonic() + timeout
        while True:
            v = check()
            if v:
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.describe()}")
            time.sleep(interval)

    def close(self) -> None:
        for n in self.nodes:
            n.close()

    def log_tails(self) -> str:
        return "".join(f"\n----- broker {n.id} log ({n.log_path}) -----\n{n.log_tail()}\n" for n in self.nodes)


_CLUSTERS: list[Cluster] = []


@pytest.fixture
def make_cluster(tmp_path):
    """Starts clusters for one test; every broker is killed at teardown."""
    made: list[Cluster] = []

    def factory(n: int = 3, extra_args=(), racks=None, lease_args=tuple(LEASE_ARGS),
                rebalance_hold_ms: int = 0) -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(made)}", n, extra_args, racks=racks,
                    lease_args=lease_args, rebalance_hold_ms=rebalance_hold_ms)
        made.append(c)
        _CLUSTERS.append(c)
        c.start()
        return c

    yield factory
    for c in made:
        c.close()
        _CLUSTERS.remove(c)


def logs_on_failure(fn):
    """Prints the brokers' state and log tails (into the failing test's captured output)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BaseException:
            for c in list(_CLUSTERS):
                try:
                    sys.stderr.write(f"\n===== cluster state at failure ({c.root})\n{c.describe()}\n")
                except Exception as e:  # the state dump must not hide the failure
                    sys.stderr.write(f"(state unavailable: {e})\n")
                sys.stderr.write(c.log_tails())
            raise
    return wrapper
