"""pytest fixtures for the kaas real-client suites.

Which broker the tests talk to:

* default: the kaas binary at $KAAS_BIN (scripts/test.sh sets it; otherwise
  $CARGO_TARGET_DIR/release/kaas, then ~/.cache/kaas-target/release/kaas), started by the
  `broker` fixture on free 127.0.0.1 ports with a temporary data dir and `--shards 2`.
* KAAS_TEST_APACHE_KAFKA=1: a real single-node Apache Kafka started the same way through
  scripts/run-apache-kafka.sh (restart/kill work too). Used to check that the tests
  themselves are right.
* KAAS_TEST_BOOTSTRAP=host:port: an already running external broker. Tests that need to
  restart, kill or inspect the broker process are skipped.

The `broker` fixture is module-scoped: each test module gets a fresh broker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
sys.path.insert(0, str(TESTS_DIR))

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
READY_TIMEOUT_S = float(os.environ.get("KAAS_TEST_READY_TIMEOUT", "30"))
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def kaas_bin() -> Path:
    if os.environ.get("KAAS_BIN"):
        return Path(os.environ["KAAS_BIN"])
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/kaas-target")
    return Path(target) / "release" / "kaas"


def poll(check, timeout: float, what: str, interval: float = 0.25, context=lambda: "",
         tolerate: tuple = (OSError, ValueError, KeyError)):
    """`check()`'s first true value within `timeout` seconds; an AssertionError naming `what`,
    the last value and `context()` otherwise. A check that raises one of `tolerate` (a server
    not answering yet) counts as false."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except tolerate:
            pass
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last})"
                         f"\n{context()}")


def report(line: str) -> None:
    """Prints a measured figure, and appends it to $KAAS_THROUGHPUT_FILE (scripts/test.sh shows
    that file at the end of the run)."""
    print(line)
    path = os.environ.get("KAAS_THROUGHPUT_FILE")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


@contextlib.contextmanager
def temporary_env(env: dict[str, str]):
    """Sets `env` in os.environ (which brokers started meanwhile inherit), then restores it."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class BrokerError(RuntimeError):
    pass


class Broker:
    """A broker process owned by the test run (kaas, or Apache Kafka for validation)."""

    external = False

    def __init__(self, workdir: Path, kind: str = "kaas", shards: int = 2,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, extra_args=(), preexec_fn=None):
        self.kind = kind
        self.preexec_fn = preexec_fn
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / f"{kind}.log"
        self.shards = shards
        self.max_frame_bytes = max_frame_bytes
        self.extra_args = list(extra_args)
        self.host = "127.0.0.1"
        self.port = free_port()
        # HOST:PORT told to clients, when not the listen address (a suite that expects a name)
        self.advertised: str | None = None
        self.health_port = free_port() if kind == "kaas" else None
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self._log_file = None

    # -- addresses ---------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def health_url(self) -> str | None:
        return f"http://127.0.0.1:{self.health_port}" if self.health_port else None

    # -- lifecycle ---------------------------------------------------------------------
    def command(self) -> list[str]:
        if self.kind == "kaas":
            return [
                str(kaas_bin()),
                "--listen", self.bootstrap,
                "--advertised-listener", self.advertised or self.bootstrap,
                "--data-dir", str(self.data_dir),
                "--shards", str(self.shards),
                "--health-listen", f"127.0.0.1:{self.health_port}",
                # extra_args may say otherwise (clap refuses a flag given twice)
                *([] if "--auto-create-topics" in self.extra_args
                  else ["--auto-create-topics", "true"]),
                "--num-partitions", "1",
                "--max-frame-bytes", str(self.max_frame_bytes),
                *self.extra_args,
            ]
        return [str(REPO / "scripts" / "run-apache-kafka.sh"), str(self.port), str(self.data_dir)]

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.kind == "kaas" and not kaas_bin().exists():
            raise BrokerError(f"kaas binary not found at {kaas_bin()} (set KAAS_BIN)")
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f"\n===== start #{self.starts + 1}: {' '.join(self.command())}\n".encode())
        self._log_file.flush()
        env = dict(os.environ)
        env.setdefault("RUST_BACKTRACE", "1")
        env.setdefault("NO_COLOR", "1")
        if self.kind == "apache-kafka":
            env.setdefault("KAFKA_HEAP_OPTS", "-Xmx1g -Xms512m")
        self.proc = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=self._log_file,
            stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=self.preexec_fn,
        )
        self.starts += 1
        self.wait_ready(timeout)

    def ready(self) -> bool:
        if self.kind == "kaas":
            try:
                with urllib.request.urlopen(self.health_url + "/readyz", timeout=1) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError, ValueError):
                return False
        if not port_open(self.host, self.port):
            return False
        # Apache Kafka accepts connections before it can serve metadata; ask for it.
        try:
            from confluent_kafka.admin import AdminClient
            md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=3)
            return len(md.brokers) > 0
        except Exception:
            return False

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(
                    f"{self.kind} exited with code {self.proc.returncode} before it was ready;"
                    f" log:\n{self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.1)
        raise BrokerError(f"{self.kind} not ready after {timeout:.0f}s; log:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def status_kib(self, field: str) -> int:
        """A memory figure of the broker process from /proc/PID/status (VmRSS, VmHWM,
        RssFile, ...), in KiB."""
        with open(f"/proc/{self.pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields[field].split()[0])

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait up to `timeout`, SIGKILL if it is still there. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._note(f"did not stop within {timeout}s of SIGTERM; sending SIGKILL")
                self.proc.kill()
                self.proc.wait(10)
                self._close_log()
                raise BrokerError(f"{self.kind} ignored SIGTERM for {timeout}s")
        self._close_log()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: an abrupt crash, no chance to flush anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._note("killed with SIGKILL")
        self._close_log()

    def restart(self, timeout: float = READY_TIMEOUT_S) -> int | None:
        """Clean stop (SIGTERM) and start again on the same data dir and ports.

        Returns the exit code of the stopped process."""
        code = self.stop()
        self.start(timeout)
        return code

    def close(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
        finally:
            self._close_log()

    # -- logs --------------------------------------------------------------------------
    def _note(self, msg: str) -> None:
        if self._log_file and not self._log_file.closed:
            self._log_file.write(f"===== test harness: {msg}\n".encode())
            self._log_file.flush()

    def _close_log(self) -> None:
        if self._log_file and not self._log_file.closed:
            self._log_file.close()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, max_chars: int = 8000) -> str:
        text = self.log_text()
        return text[-max_chars:]


class ExternalBroker:
    """A broker someone else runs (KAAS_TEST_BOOTSTRAP). It cannot be restarted."""

    external = True
    kind = "external"
    health_url = None
    health_port = None
    pid = None

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        host, port = bootstrap.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.max_frame_bytes = int(os.environ.get("KAAS_TEST_MAX_FRAME_BYTES",
                                                  DEFAULT_MAX_FRAME_BYTES))

    def alive(self) -> bool:
        return port_open(self.host, self.port, timeout=2)

    def _skip(self, *_a, **_k):
        pytest.skip("needs a broker started by the tests (KAAS_TEST_BOOTSTRAP is set)")

    restart = kill = stop = start = wait_ready = _skip

    def close(self) -> None:
        pass

    def log_tail(self, max_chars: int = 8000) -> str:
        return "(external broker: no log)"


def broker_kind() -> str:
    if os.environ.get("KAAS_TEST_BOOTSTRAP"):
        return "external"
    if os.environ.get("KAAS_TEST_APACHE_KAFKA", "") not in ("", "0"):
        return "apache-kafka"
    return "kaas"


def make_broker(tmp_root: Path, **kwargs):
    kind = broker_kind()
    if kind == "external":
        return ExternalBroker(os.environ["KAAS_TEST_BOOTSTRAP"])
    b = Broker(tmp_root, kind=kind, **kwargs)
    try:
        b.start()
    except BaseException:
        b.close()
        sys.stderr.write(f"\n----- {b.kind} log ({b.log_path}) -----\n{b.log_tail()}\n")
        raise
    return b


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A running broker for this test module (fresh per module)."""
    b = make_broker(tmp_path_factory.mktemp("broker"))
    yield b
    b.close()


@pytest.fixture
def broker_factory(tmp_path_factory):
    """Start extra brokers with custom flags (kaas only); all are stopped at teardown."""
    started = []

    def factory(**kwargs):
        if broker_kind() != "kaas":
            pytest.skip("custom broker flags apply to kaas only")
        b = make_broker(tmp_path_factory.mktemp("broker"), **kwargs)
        started.append(b)
        return b

    factory.started = started
    yield factory
    for b in started:
        b.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failing test, print the tail of its broker's log."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when in ("setup", "call") and rep.failed:
        brokers = []
        funcargs = getattr(item, "funcargs", {})
        if funcargs.get("broker") is not None:
            brokers.append(funcargs["broker"])
        brokers.extend(getattr(funcargs.get("broker_factory"), "started", []))
        for b in brokers:
            if getattr(b, "external", True):
                continue
            alive = "alive" if b.alive() else f"exited with {b.proc.returncode if b.proc else None}"
            rep.sections.append((f"{b.kind} broker log ({b.log_path}, process {alive})",
                                 b.log_tail()))


@pytest.fixture(scope="session")
def kafka_libs():
    """The Apache Kafka jar directory (scripts/fetch-kafka.sh), for the Java tests."""
    if shutil.which("java") is None:
        pytest.skip("java not installed")
    try:
        out = subprocess.run([str(REPO / "scripts" / "fetch-kafka.sh")], check=True,
                             capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"scripts/fetch-kafka.sh failed: {getattr(e, 'stderr', e)}")
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def java_classes(kafka_libs, tmp_path_factory):
    """tests/java/*.java compiled against the Kafka jars; returns a classpath string."""
    if shutil.which("javac") is None:
        pytest.skip("javac not installed")
    out = tmp_path_factory.mktemp("java-classes")
    sources = sorted(str(p) for p in (TESTS_DIR / "java").glob("*.java"))
    subprocess.run(["javac", "-nowarn", "-d", str(out), "-cp", f"{kafka_libs}/*", *sources],
                   check=True, timeout=300, stdin=subprocess.DEVNULL)
    return f"{out}:{kafka_libs}/*"


def pytest_configure(config):
    config.addinivalue_line("markers", "long: long-running test, opt-in with KAAS_LONG_TESTS=1")
    config.addinivalue_line("markers", "restart: restarts or kills the broker")


def pytest_report_header(config):
    kind = broker_kind()
    if kind == "kaas":
        return f"broker under test: kaas ({kaas_bin()})"
    if kind == "external":
        return f"broker under test: external at {os.environ['KAAS_TEST_BOOTSTRAP']}"
    return "broker under test: Apache Kafka (scripts/run-apache-kafka.sh)"
