"""kafka-python's own `test/integration` suite against a running broker.

The source is kafka-python's PyPI sdist (`pip download --no-binary :all: --no-deps`), cached and
extracted under ~/.cache/kaas/suites/kafka-python-<version>/. The sdist ships the integration
tests and their fixtures but not `test/__init__.py` (without it `test` is the standard
library's package), `test/conftest.py` or `test/service.py`; `kafka_python_conftest.py`
becomes `test/conftest.py` and fills those gaps (read its docstring). The suite's optional
codec libraries (python-snappy, lz4, zstandard: without them the snappy/lz4/zstd cases skip)
are installed with pip into a directory of the cache that only this suite's run puts on
PYTHONPATH.

The tests run in one pytest process over the whole `test/integration` directory, with
pytest-timeout's per-test cap (signal method, so that a hung test fails and the run goes on)
and a JUnit XML report, parsed into pass / fail / skip / timeout per test. Test ids are pytest
node ids relative to `test/integration/`, e.g.
`test_producer_integration.py::test_end_to_end[gzip]`.

KAFKA_VERSION, which the fixtures use both to gate tests and as the clients' `api_version`
(kafka-python still asks ApiVersions and clamps to what the broker answers), is 4.2.0: the
default of the sdist's own fixtures, i.e. the version upstream's CI runs the suite against,
so every version gate up to 4.2 opens as it does against Apache Kafka 4.2.

`expected-kafka-python.txt` is the ratchet, same format and helpers as franz-go's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from franz_go import CACHE, SuiteRun, check_ratchet, load_expected, new_passes  # noqa: E402,F401

VERSION = os.environ.get("KAAS_KAFKA_PYTHON_VERSION", "3.0.12")
KAFKA_VERSION = os.environ.get("KAAS_KAFKA_PYTHON_KAFKA_VERSION", "4.2.0")
# the codec libraries kafka-python's own extras name (snappy, lz4, zstd)
CODEC_PACKAGES = ["python-snappy==0.7.3", "lz4==4.4.5", "zstandard==0.25.0"]
ROOT = CACHE / f"kafka-python-{VERSION}"
SRC = ROOT / "src"
DEPS = ROOT / "deps"
CONFTEST = HERE / "kafka_python_conftest.py"
CLIENT_FIXES = HERE / "kafka_python_client_fixes.py"
SUITE_DIR = "test/integration"


def _sdist() -> Path:
    found = sorted(ROOT.glob(f"kafka_python-{VERSION}.tar.gz")) + sorted(
        ROOT.glob(f"kafka-python-{VERSION}.tar.gz"))
    if found:
        return found[0]
    ROOT.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                    "--disable-pip-version-check", "-q", "-d", str(ROOT),
                    f"kafka-python=={VERSION}"], check=True, stdin=subprocess.DEVNULL)
    found = sorted(ROOT.glob("kafka*python-*.tar.gz"))
    if not found:
        raise RuntimeError(f"pip download left no kafka-python sdist in {ROOT}")
    return found[0]


def _extract(sdist: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="extract-", dir=ROOT))
    try:
        with tarfile.open(sdist) as tf:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(tmp, filter="data")
            else:  # Python < 3.11.4
                tf.extractall(tmp)
        (top,) = [p for p in tmp.iterdir() if p.is_dir()]
        if not (top / SUITE_DIR).is_dir():
            raise RuntimeError(f"{sdist.name} has no {SUITE_DIR}")
        if SRC.exists():
            shutil.rmtree(SRC)
        top.rename(SRC)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _codec_deps() -> None:
    marker = DEPS / ".installed"
    want = " ".join(CODEC_PACKAGES)
    if marker.exists() and marker.read_text() == want:
        return
    if DEPS.exists():
        shutil.rmtree(DEPS)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-warn-script-location", "--root-user-action=ignore",
                    "--target", str(DEPS), *CODEC_PACKAGES], check=True, stdin=subprocess.DEVNULL)
    marker.write_text(want)


def prepare() -> Path:
    """The extracted sdist with our conftest in place (fetched and extracted once)."""
    if not (SRC / SUITE_DIR).is_dir():
        _extract(_sdist())
    (SRC / "test" / "__init__.py").touch()  # upstream has it; the sdist leaves it out
    conftest = SRC / "test" / "conftest.py"
    for ours, theirs in ((CONFTEST, conftest), (CLIENT_FIXES, SRC / "test" / "kaas_client_fixes.py")):
        if not theirs.exists() or theirs.read_bytes() != ours.read_bytes():
            shutil.copyfile(ours, theirs)
    _codec_deps()
    return SRC


def _env(bootstrap: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("KAFKA_URI", "ZOOKEEPER_URI", "PYTEST_ADDOPTS", "KAFKA_ROOT", "PROJECT_ROOT"):
        env.pop(k, None)
    env["KAAS_SUITE_BOOTSTRAP"] = bootstrap
    env["KAFKA_URI"] = f"PLAINTEXT://{bootstrap}"
    env["KAFKA_VERSION"] = KAFKA_VERSION
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(DEPS)]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _pytest(src: Path, env: dict, args: list[str], timeout: float):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--rootdir", str(src), *args],
                          cwd=src, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _short(nodeid: str) -> str:
    prefix = SUITE_DIR + "/"
    return nodeid[len(prefix):] if nodeid.startswith(prefix) else nodeid


def list_tests(bootstrap: str = "127.0.0.1:9") -> list[str]:
    """Test ids of the suite (collection needs no broker)."""
    src = prepare()
    p = _pytest(src, _env(bootstrap), ["--collect-only", "-q", SUITE_DIR], timeout=300)
    ids = [line.strip() for line in p.stdout.splitlines() if "::" in line]
    if p.returncode != 0 or not ids:
        raise RuntimeError(f"collecting kafka-python's suite failed ({p.returncode}):\n"
                           f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return [_short(t) for t in ids]


def _case_id(case: ET.Element, by_junit: dict[tuple[str, str], str]) -> str:
    key = (case.get("classname", ""), case.get("name", ""))
    if key in by_junit:
        return by_junit[key]
    return f"{key[0]}::{key[1]}"


def run_suite(bootstrap: str, only: list[str] | None = None, cap_s: int = 120,
              log_dir: Path | None = None, total_timeout_s: float = 2400) -> SuiteRun:
    """Run the suite (or the given test ids) against `bootstrap` (host:port)."""
    everything = list_tests(bootstrap)
    tests = only if only is not None else everything
    out_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="kp-suite-"))
    return _run_once(bootstrap, tests, everything, cap_s, out_dir, "", total_timeout_s)


def _run_once(bootstrap: str, tests: list[str], everything: list[str], cap_s: int,
              out_dir: Path, tag: str, total_timeout_s: float) -> SuiteRun:
    src = prepare()
    env = _env(bootstrap)
    # JUnit names a test by (dotted module[.Class], name); map them back to node ids
    by_junit = {}
    for t in everything:
        path, _, rest = (SUITE_DIR + "/" + t).partition("::")
        parts = rest.split("::")
        classname = ".".join([path[:-3].replace("/", "."), *parts[:-1]])
        by_junit[(classname, parts[-1])] = t
    out_dir.mkdir(parents=True, exist_ok=True)
    xml_path = out_dir / f"kafka-python-junit{tag}.xml"
    xml_path.unlink(missing_ok=True)
    args = ["-q", "-rfE", f"--timeout={cap_s}", "--timeout-method=signal",
            f"--junitxml={xml_path}", "-o", "junit_family=xunit1",
            *[SUITE_DIR + "/" + t for t in tests]]
    started = time.monotonic()
    try:
        p = _pytest(src, env, args, timeout=total_timeout_s)
        out = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes)
               else (e.stdout or "")) + f"\n(the run was killed after {total_timeout_s}s)"
    elapsed = time.monotonic() - started
    (out_dir / f"kafka-python-pytest{tag}.log").write_text(out)

    run = SuiteRun()
    if xml_path.exists():
        for case in ET.parse(xml_path).getroot().iter("testcase"):
            t = _case_id(case, by_junit)
            failed = case.find("failure")
            errored = case.find("error")
            skipped = case.find("skipped")
            if failed is not None or errored is not None:
                bad = failed if failed is not None else errored
                text = (bad.get("message") or "") + "\n" + (bad.text or "")
                outcome = "timeout" if re.search(r"Timeout \(?>", text) else "fail"
                if errored is not None and failed is None:
                    text = "(error in a fixture)\n" + text
                run.tails[t] = text[-3000:]
            elif skipped is not None:
                outcome = "skip"
                run.tails[t] = skipped.get("message") or ""
            else:
                outcome = "pass"
            # a teardown error is a second entry for the same test: the worse outcome wins
            if run.results.get(t) in ("fail", "timeout") and outcome in ("pass", "skip"):
                continue
            run.results[t] = outcome
            run.seconds[t] = run.seconds.get(t, 0.0) + float(case.get("time") or 0)
    for t in tests:
        if t not in run.results:
            run.results[t] = "fail"
            run.seconds[t] = 0.0
            run.tails[t] = (f"no result: the pytest run ended early after {elapsed:.0f}s\n"
                            f"{out[-3000:]}")
    return run


if __name__ == "__main__":
    # scripts/install-test-deps.sh: fetch and extract the sdist ahead of the test run.
    print(f"kafka-python {VERSION} integration suite: {prepare() / SUITE_DIR}")
