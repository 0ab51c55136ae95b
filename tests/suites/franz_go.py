"""franz-go's own `pkg/kgo` test suite against a running kaas (issue 12, item 7).

The module source comes from the Go module proxy (`go mod download`), is copied somewhere
writable under ~/.cache/kaas, and its test binary is built once (`go test -c`). Every top-level
test then runs on its own, with a time cap, so that one hang cannot hide the others' results.

`expected-franz-go.txt` is the ratchet: `PASS <test>` lines must pass; every other test is
listed with the unsupported feature that excludes it. A test that passes but is not listed as
PASS is reported so that the list only grows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

VERSION = os.environ.get("KAAS_FRANZ_GO_VERSION", "v1.22.3")
CACHE = Path(os.environ.get("KAAS_SUITES_CACHE", Path.home() / ".cache" / "kaas" / "suites"))
HERE = Path(__file__).resolve().parent


def go() -> str:
    for cand in (shutil.which("go"), "/usr/local/go/bin/go", "/usr/lib/go/bin/go"):
        if cand and Path(cand).exists():
            return cand
    raise RuntimeError("go is not installed (scripts/install-test-deps.sh installs it)")


def go_test_binary(module: str, version: str, package: str, name: str,
                   build_args: list[str] | None = None,
                   patch: Callable[[Path], None] | None = None) -> Path:
    """`go test -c` of `package` in `module`@`version`, built on first use under CACHE: the
    source from the Go module proxy, copied where it is writable (the tests write files beside
    themselves), the binary beside it. `build_args` go to `go test -c` (build tags); `patch`
    changes the copied source before the build (name the binary after it)."""
    home = CACHE / f"{module.rsplit('/', 1)[-1]}-{version}"
    out = home / name
    if out.exists():
        return out
    info = json.loads(subprocess.run(
        [go(), "mod", "download", "-json", f"{module}@{version}"],
        check=True, capture_output=True, text=True, cwd="/tmp").stdout)
    src = home / "src"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(info["Dir"], src)
    for p in src.rglob("*"):  # the module cache is read-only
        p.chmod(p.stat().st_mode | 0o200)
    if patch is not None:
        patch(src)
    subprocess.run([go(), "test", "-c", *(build_args or []), "-o", str(out), package],
                   check=True, cwd=src,
                   env={**os.environ, "GOFLAGS": "-mod=mod"})
    return out


def test_binary() -> Path:
    """The kgo test binary for VERSION, built on first use."""
    return go_test_binary("github.com/twmb/franz-go", VERSION, "./pkg/kgo", "kgo.test")


def list_tests(binary: Path) -> list[str]:
    out = subprocess.run([str(binary), "-test.list", "^Test"], check=True, capture_output=True,
                         text=True).stdout
    return [line.strip() for line in out.splitlines() if line.startswith("Test")]


def _entries(name: str):
    """(kind, test, why) for each line of expected-<name>.txt."""
    for line in (HERE / f"expected-{name}.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        test, _, why = rest.strip().partition(" ")
        if kind not in ("PASS", "UNSUPPORTED", "SKIPPED", "RACY"):
            raise ValueError(f"expected-{name}.txt: bad line {line!r}")
        yield kind, test, why.strip()


def load_expected(name: str) -> tuple[set[str], dict[str, str]]:
    """(tests that must pass, {excluded test: why}) from expected-<name>.txt. Excluded are
    UNSUPPORTED, SKIPPED (the suite skips it itself) and RACY (a test of the client alone, no
    broker, whose outcome depends on goroutine scheduling, so it fails on a loaded machine)."""
    passing, excluded = set(), {}
    for kind, test, why in _entries(name):
        if kind == "PASS":
            passing.add(test)
        else:
            excluded[test] = why or "(no reason given)"
    return passing, excluded


@dataclass
class SuiteRun:
    results: dict[str, str] = field(default_factory=dict)  # test -> pass | fail | skip | timeout
    seconds: dict[str, float] = field(default_factory=dict)
    tails: dict[str, str] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.results.values() if r == outcome)

    def summary(self) -> str:
        return (f"{self.count('pass')} passed, {self.count('fail') + self.count('timeout')} failed,"
                f" {self.count('skip')} skipped")


def run_go_tests(binary: Path, tests: list[str], env: dict[str, str], cwd: Path,
                 cap_s: int, log_dir: Path | None = None,
                 extra: Callable[[str], list[str]] = lambda t: []) -> SuiteRun:
    """Runs each top-level test of a Go test binary alone (`extra(test)`: more flags for it),
    so that one hang cannot hide the others' results."""
    run = SuiteRun()
    for t in tests:
        started = time.monotonic()
        try:
            p = subprocess.run([str(binary), "-test.run", f"^{re.escape(t)}$", "-test.v",
                                "-test.timeout", f"{cap_s}s", "-test.count", "1", *extra(t)],
                               capture_output=True, text=True, env=env, timeout=cap_s + 30,
                               cwd=cwd)
            out = p.stdout + p.stderr
            if re.search(rf"^--- SKIP: {re.escape(t)}\b", out, re.M):
                outcome = "skip"
            elif p.returncode == 0:
                outcome = "pass"
            elif "panic: test timed out" in out:
                outcome = "timeout"
            else:
                outcome = "fail"
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            outcome = "timeout"
        run.results[t] = outcome
        run.seconds[t] = time.monotonic() - started
        if outcome in ("fail", "timeout"):
            run.tails[t] = out[-3000:]
        if log_dir is not None:
            (log_dir / f"{t}.log").write_text(out)
    return run


def run_suite(seeds: str, only: list[str] | None = None, cap_s: int = 300,
              log_dir: Path | None = None) -> SuiteRun:
    binary = test_binary()
    env = {**os.environ, "KGO_SEEDS": seeds, "KGO_TEST_RF": "1", "KGO_TEST_RECORDS": "20000",
           "KGO_LOG_LEVEL": "none"}
    return run_go_tests(binary, only or list_tests(binary), env,
                        binary.parent / "src" / "pkg" / "kgo", cap_s, log_dir)


def check_ratchet(run: SuiteRun, name: str) -> list[str]:
    """Problems: an expected pass that did not pass, a test listed nowhere."""
    passing, excluded = load_expected(name)
    problems = []
    for t, outcome in sorted(run.results.items()):
        if t in passing and outcome != "pass":
            # Each suite's runner bounds its excerpt and puts the lines that say why first;
            # cutting it again here kept only its tail and lost them.
            problems.append(f"{t}: expected to pass, {outcome}\n{run.tails.get(t, '')}")
        elif t not in passing and t not in excluded:
            problems.append(f"{t}: {outcome}, but listed neither as PASS nor UNSUPPORTED"
                            f" in expected-{name}.txt")
    return problems


def report_run(run: SuiteRun, name: str, title: str) -> list[str]:
    """Reports the run (its counts, slowest tests, new passes) and returns the ratchet's
    problems (check_ratchet)."""
    from conftest import report
    report(f"{title}: {run.summary()}")
    slow = sorted(run.seconds.items(), key=lambda kv: -kv[1])[:5]
    report("  slowest: " + ", ".join(f"{t} {s:.0f}s" for t, s in slow))
    fresh = new_passes(run, name)
    if fresh:
        report(f"  newly passing (add to the PASS list): {' '.join(fresh)}")
    return check_ratchet(run, name)


def new_passes(run: SuiteRun, name: str) -> list[str]:
    """Excluded tests that passed this time: candidates for the PASS list."""
    # a RACY test passes on an idle machine: its passing is not news
    candidates = {test for kind, test, _ in _entries(name) if kind in ("UNSUPPORTED", "SKIPPED")}
    return sorted(t for t, o in run.results.items() if t in candidates and o == "pass")


if __name__ == "__main__":
    # scripts/install-test-deps.sh: fetch and build the test binary ahead of the test run.
    print(f"franz-go kgo test binary: {test_binary()}")
