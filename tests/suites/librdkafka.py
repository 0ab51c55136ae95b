"""librdkafka's own integration test suite (`tests/` of librdkafka 2.12.1) against kaas.

The source is the copy of librdkafka vendored in the rdkafka-sys crate
(`~/.cargo/registry/src/*/rdkafka-sys-4.10.0+2.12.1/librdkafka`; fetched with `cargo fetch`
through a throw-away manifest when the registry does not have it). It is copied to
~/.cache/kaas/suites/librdkafka-2.12.1/src, made writable, and built once:

    ./configure --disable-curl --disable-sasl --disable-lz4-ext
    make -j2 libs && make -C tests -j2 build

(Debian: build-essential, pkg-config, libssl-dev, zlib1g-dev, python3.) `python3
tests/suites/librdkafka.py` does only that, for the install step.

Every test number runs in its own `test-runner` process (TESTS=0nnn) with a time cap, so one
hang cannot hide the others, JOBS (3) of them at a time against the same brokers (librdkafka's
own `make` runs up to 5 tests at once against one cluster). The runner's JSON report
(TEST_REPORT) gives each entry of test.c's table its state; a number can hold several entries
(0045 has seven), and their names are the test names here. 0081_admin and
0137_barrier_batch_consume run one sub-test function at a time (SUBTESTS), named
`<test>/<function>`, because one of their sub-tests needs a feature kaas does not serve (ACLs,
transactions) and would hide the others.

The brokers are librdkafka's test scenarios (tests/scenarios/*.json) on kaas: `default`
auto-creates topics with 4 partitions, `noautocreate` (0045's topic-removal tests, 0107, 0111)
does not create topics at all. Tests that shell out to Apache Kafka's kafka-topics.sh
(0045, 0052, 0077) get a KAFKA_PATH whose bin/ scripts run the tool classes from
scripts/fetch-kafka.sh's jars (see kafka_path()).

The modes, and the suffix each gives the test names in expected-librdkafka.txt:

    (none)      quick mode (-Q) over every test: the broker tests (-L) in their scenario, and
                the local ones (-l), which use no broker or only librdkafka's mock cluster: they
                say nothing about kaas, but most take a second and they show that the build
                works (the slower ones are LONG).
    @full       full mode (no -Q) for the consumer-group tests (a source that subscribes or asks
                for the group protocol) and the idempotent-producer tests (0090, 0094).
    @consumer   the consumer-group tests in quick mode with TEST_CONSUMER_GROUP_PROTOCOL=consumer
                (KIP-848: every consumer the tests create gets group.protocol=consumer).

TEST_KAFKA_VERSION is 4.0.0, the Kafka whose API versions kaas serves (Produce from v3,
OffsetCommit from v2, KIP-848). With 3.9.0 the tests also try what Kafka 4 removed and kaas
never served (0052 and 0092 produce message format v0/v1 and fail), and 0081 stops asking for
group configs. The environment's CI variable is dropped: librdkafka would stretch timeouts and
skip its latency test (0055) on CI, and the results should not depend on where they run.

expected-librdkafka.txt is the ratchet (the format of expected-franz-go.txt, read by
franz_go.load_expected): `PASS <test>` must pass, `UNSUPPORTED <test> <why>` is not required.
A PASS line whose comment contains `LONG` names a test that passes but is too slow for the
default run (which stays within about 6 minutes), or one that times the client alone, with no
broker, and fails when CI's parallel suites starve the CPU; KAAS_LONG_TESTS=1 runs those and the
excluded ones too, to notice new passes.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from franz_go import CACHE, HERE, SuiteRun

VERSION = "2.12.1"
CRATE = f"rdkafka-sys-4.10.0+{VERSION}"
ROOT = CACHE / f"librdkafka-{VERSION}"
SRC = ROOT / "src"
TESTS = SRC / "tests"
RUNNER = TESTS / "test-runner"
KAFKA_VERSION = os.environ.get("KAAS_LIBRDKAFKA_KAFKA_VERSION", "4.0.0")
NAME = "librdkafka"  # expected-librdkafka.txt
# Test numbers run this many at a time (each test-runner mostly waits on the broker and on its
# own timers; librdkafka's own `make` runs up to 5 tests at once against one cluster).
JOBS = int(os.environ.get("KAAS_LIBRDKAFKA_JOBS", "5"))
CONFIGURE = ["./configure", "--disable-curl", "--disable-sasl", "--disable-lz4-ext"]


# -- fetch and build -----------------------------------------------------------------------------
def cargo() -> str:
    for cand in (shutil.which("cargo"), str(Path.home() / ".cargo" / "bin" / "cargo")):
        if cand and Path(cand).exists():
            return cand
    raise RuntimeError("cargo is needed to fetch the rdkafka-sys crate (librdkafka's source)")


def crate_source() -> Path:
    """librdkafka's source tree inside the rdkafka-sys crate, fetched if the registry lacks it."""
    home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    pattern = str(home / "registry" / "src" / "*" / CRATE / "librdkafka")
    found = sorted(glob.glob(pattern))
    if not found:
        # `cargo fetch` of a one-dependency manifest: downloads and unpacks the crate only.
        scratch = ROOT / "fetch"
        (scratch / "src").mkdir(parents=True, exist_ok=True)
        (scratch / "src" / "lib.rs").write_text("")
        (scratch / "Cargo.toml").write_text(
            '[package]\nname = "kaas-fetch-librdkafka"\nversion = "0.0.0"\nedition = "2021"\n'
            f'[dependencies]\nrdkafka-sys = {{ version = "={CRATE.split("-", 2)[2]}",'
            " default-features = false }\n")
        subprocess.run([cargo(), "fetch", "--manifest-path", str(scratch / "Cargo.toml")],
                       check=True, stdin=subprocess.DEVNULL)
        found = sorted(glob.glob(pattern))
        if not found:
            raise RuntimeError(f"cargo fetch did not unpack {CRATE} (looked for {pattern})")
    return Path(found[-1])


def _step(cmd: list[str], cwd: Path, log: str) -> None:
    with open(ROOT / log, "w") as out:
        p = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        tail = (ROOT / log).read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}); {ROOT / log}:\n{tail}")


def test_runner() -> Path:
    """librdkafka's tests/test-runner, built on first use."""
    if RUNNER.exists():
        return RUNNER
    ROOT.mkdir(parents=True, exist_ok=True)
    if SRC.exists():
        shutil.rmtree(SRC)
    shutil.copytree(crate_source(), SRC, symlinks=True)
    for p in [SRC, *SRC.rglob("*")]:  # the registry copy is read-only
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | 0o200)
    jobs = f"-j{os.cpu_count() or 2}"
    _step(CONFIGURE, SRC, "configure.log")
    _step(["make", jobs, "libs"], SRC, "make.log")
    _step(["make", "-C", "tests", jobs, "build"], SRC, "make-tests.log")
    if not RUNNER.exists():
        raise RuntimeError(f"the build did not produce {RUNNER}")
    return RUNNER


# -- Apache Kafka's tools, for the tests that shell out to them -----------------------------------
TOOLS = {  # bin/<script> -> main class; kafka-run-class.sh takes the class as its first argument
    "kafka-topics.sh": "org.apache.kafka.tools.TopicCommand",
    "kafka-configs.sh": "org.apache.kafka.tools.ConfigCommand",
    "kafka-acls.sh": "org.apache.kafka.tools.AclCommand",
    "kafka-run-class.sh": None,
}


def kafka_path() -> Path | None:
    """A KAFKA_PATH for test_kafka_topics()/test_kafka_cmd() (0045, 0052, 0077, ...): bin/
    scripts that run the tools' main classes from scripts/fetch-kafka.sh's jars, as the
    distribution's scripts do. None without java or the jars (those tests then fail)."""
    libs = Path(os.environ.get("KAAS_KAFKA_LIBS", Path.home() / ".cache" / "kaas" / "kafka-libs"))
    java = shutil.which("java")
    if not java or not any(libs.glob("kafka-tools-*.jar")):
        return None
    out = ROOT / "kafka-path"
    (out / "bin").mkdir(parents=True, exist_ok=True)
    for script, cls in TOOLS.items():
        p = out / "bin" / script
        p.write_text("#!/bin/sh\n"
                     f'exec "{java}" -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC'
                     f' -cp "{libs}/*" {cls or ""} "$@"\n')
        p.chmod(0o755)
    return out


# -- the tests -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One entry of test.c's tests[] table."""
    name: str  # 0045_subscribe_update_mock
    number: str  # 0045
    local: bool  # TEST_F_LOCAL: no broker (or librdkafka's mock cluster)
    known_issue: bool  # TEST_F_KNOWN_ISSUE: the runner skips it unless told (-k)
    manual: bool  # TEST_F_MANUAL: 8000-series, run by hand
    scenarios: tuple[str, ...]  # ("default",), ("noautocreate",), ("default", "ak23")
    subtest: str = ""  # one sub-test function of a SPLIT test: run alone with SUBTESTS

    @property
    def runner_name(self) -> str:
        """The name test-runner reports (a split entry's is its test's)."""
        return self.name.split("/", 1)[0]


# Tests run one sub-test function at a time (SUBTESTS=<function>:), as <test>/<function>,
# because one sub-test needs a feature kaas does not serve and would hide the others' results:
# 0081_admin goes through every Admin API, and its CreateAcls fails without an authorizer;
# 0137_barrier_batch_consume ends with a transactional producer.
SPLIT = {"0081_admin", "0137_barrier_batch_consume"}


def subtest_functions(number: str) -> list[str]:
    """The functions of a test's source that open a sub-test (SUB_TEST*()), in source order."""
    out: list[str] = []
    for src in source_files(number):
        text = src.read_text(errors="replace")
        defs = [(m.start(), m.group(1)) for m in
                re.finditer(r"^static\s+void\s+(\w+)\s*\(", text, re.M)]
        for m in re.finditer(r"\bSUB_TEST(?:_QUICK)?\(", text):
            owner = [name for pos, name in defs if pos < m.start()]
            if owner and owner[-1] not in out:
                out.append(owner[-1])
    return out


def list_entries() -> list[Entry]:
    text = (TESTS / "test.c").read_text()
    table = text[text.index("struct test tests[] = {"):]
    table = table[:table.index("{NULL}")]
    entries = []
    for chunk in table.split("_TEST(")[1:]:
        m = re.match(r"\s*(\w+)\s*,\s*([^,)]*)", chunk)
        if not m:
            continue
        name, flags = m.group(1), set(re.findall(r"TEST_F_\w+", m.group(2)))
        scen = re.search(r'\.scenario\s*=\s*"([^"]*)"', chunk)
        e = Entry(
            name=name, number=name.split("_", 1)[0], local="TEST_F_LOCAL" in flags,
            known_issue="TEST_F_KNOWN_ISSUE" in flags,  # _WIN32/_OSX variants are 0 on Linux
            manual="TEST_F_MANUAL" in flags,
            scenarios=tuple(scen.group(1).split(",")) if scen else ("default",))
        if name in SPLIT:
            entries += [replace(e, name=f"{name}/{fn}", subtest=fn)
                        for fn in subtest_functions(e.number)]
        else:
            entries.append(e)
    return entries


def source_files(number: str) -> list[Path]:
    return sorted(p for p in TESTS.glob(f"{number}-*") if p.suffix in (".c", ".cpp"))


GROUPS = re.compile(r"rd_kafka_subscribe|test_consumer_subscribe|->subscribe\("
                    r"|test_consumer_group_protocol")


def is_group_test(e: Entry) -> bool:
    """A broker test whose source joins a consumer group (subscribe, not only assign) or
    depends on the group protocol."""
    return not e.local and any(GROUPS.search(p.read_text(errors="replace"))
                               for p in source_files(e.number))


def is_idempotence_test(e: Entry) -> bool:
    return not e.local and "idempotence" in e.name


@dataclass(frozen=True)
class Mode:
    key: str  # local, quick, full, consumer
    suffix: str  # appended to the entry name in the ratchet
    args: tuple[str, ...]  # test-runner flags
    env: tuple[tuple[str, str], ...] = ()

    def selects(self, e: Entry) -> bool:
        if e.manual:
            return False  # 8000-series: by hand (8000_idle idles until killed)
        if self.key == "local":
            return e.local
        if e.local:
            return False
        if self.key == "full":
            return is_group_test(e) or is_idempotence_test(e)
        if self.key == "consumer":
            return is_group_test(e)
        return True


MODES = [
    Mode("local", "", ("-Q", "-l")),
    Mode("quick", "", ("-Q", "-L")),
    Mode("consumer", "@consumer", ("-Q", "-L"), (("TEST_CONSUMER_GROUP_PROTOCOL", "consumer"),)),
    Mode("full", "@full", ("-L",)),
]
MODE = {m.key: m for m in MODES}
# librdkafka's scenarios (tests/scenarios/*.json) as kaas brokers: which broker runs them.
SCENARIO_BROKER = {"default": "auto", "noautocreate": "noauto"}


def test_name(e: Entry, mode: Mode) -> str:
    return e.name + mode.suffix


def scenario_of(e: Entry) -> str:
    """The scenario an entry runs in: default if it may, else its first ("ak23" would be a
    Kafka 2.3 cluster)."""
    return "default" if "default" in e.scenarios else e.scenarios[0]


def plan(mode: Mode) -> dict[tuple[str, str, str], list[Entry]]:
    """{(test number, scenario, sub-test): the entries this mode runs}, in test.c order. One
    test-runner process per key (TESTS=<number>, TEST_SCENARIO, SUBTESTS)."""
    out: dict[tuple[str, str, str], list[Entry]] = {}
    for e in list_entries():
        if mode.selects(e):
            out.setdefault((e.number, scenario_of(e), e.subtest), []).append(e)
    return out


def all_tests() -> dict[str, tuple[Entry, Mode]]:
    """Every ratchet name: {name: (entry, mode)}."""
    return {test_name(e, m): (e, m) for m in MODES for es in plan(m).values() for e in es}


# -- the ratchet's LONG comments ---------------------------------------------------------------
def load_long() -> set[str]:
    """PASS lines marked LONG in their comment: they run only with KAAS_LONG_TESTS=1."""
    out = set()
    for line in (HERE / f"expected-{NAME}.txt").read_text().splitlines():
        body, _, comment = line.partition("#")
        kind, _, rest = body.strip().partition(" ")
        if kind == "PASS" and re.search(r"\bLONG\b", comment):
            out.add(rest.strip().split()[0])
    return out


# -- running ---------------------------------------------------------------------------------------
STATES = {"PASSED": "pass", "FAILED": "fail", "SKIPPED": "skip"}
LINE = re.compile(r"=+ Test (\w+) (PASSED|FAILED|SKIPPED)\b")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\x1b\(B")


def run_tag(number: str, mode: Mode, scenario: str, subtest: str = "") -> str:
    return (f"{number}-{mode.key}" + ("" if scenario == "default" else f"-{scenario}")
            + (f"-{subtest}" if subtest else ""))


def run_number(number: str, entries: list[Entry], mode: Mode, scenario: str,
               bootstrap: str | None, work: Path, cap_s: int, kpath: Path | None = None,
               subtest: str = "", cwd: Path = TESTS) -> tuple[dict[str, str], str, float]:
    """Runs one test number (or one sub-test function of it) in `mode` and `scenario`;
    ({entry name: outcome}, output, seconds)."""
    work.mkdir(parents=True, exist_ok=True)
    tag = run_tag(number, mode, scenario, subtest)
    conf = work / f"{tag}.conf"
    report = work / f"{tag}.json"
    lines = [f"test.topic.prefix=rdk{mode.key}"]
    # Without a broker, bootstrap.servers stays unset: the local tests set their own (mock).
    if bootstrap:
        lines.insert(0, f"bootstrap.servers={bootstrap}")
    conf.write_text("\n".join(lines) + "\n")
    report.unlink(missing_ok=True)
    libs = f"{SRC / 'src'}:{SRC / 'src-cpp'}"  # not the system's librdkafka (kcat's)
    env = {**os.environ, "TESTS": number, "TEST_KAFKA_VERSION": KAFKA_VERSION,
           "TEST_SCENARIO": scenario, "RDKAFKA_TEST_CONF": str(conf),
           "TEST_REPORT": str(report),
           "LD_LIBRARY_PATH": libs + (":" + os.environ["LD_LIBRARY_PATH"]
                                      if os.environ.get("LD_LIBRARY_PATH") else ""),
           **dict(mode.env)}
    if subtest:
        env["SUBTESTS"] = f"{subtest}:"  # sub-test names are "<function>:<line>: <what>"
    if kpath and bootstrap:
        env.update(KAFKA_PATH=str(kpath), BROKERS=bootstrap)
    # CI (set by CI services) makes the runner skip latency checks and stretch its timeouts;
    # the results should not depend on where they run.
    for var in ("CI", "TESTS_SKIP", "SUBTESTS", "TEST_DEBUG", "TEST_CONSUMER_GROUP_PROTOCOL"):
        if var not in dict(mode.env) and not (var == "SUBTESTS" and subtest):
            env.pop(var, None)  # only what the mode says
    args = [str(test_runner()), *mode.args]
    started = time.monotonic()
    timed_out = False
    p = subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        raw, _ = p.communicate(timeout=cap_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(p.pid, 9)
        raw, _ = p.communicate()
    seconds = time.monotonic() - started
    out = ANSI.sub("", raw.decode(errors="replace"))
    states: dict[str, str] = {}
    try:
        tests = json.loads(report.read_text())["tests"]
        states = {n: STATES.get(t["state"], "fail") for n, t in tests.items()}
    except (OSError, ValueError, KeyError):
        for m in LINE.finditer(out):
            states[m.group(1)] = STATES[m.group(2)]
    results = {}
    for e in entries:
        outcome = states.get(e.runner_name)
        if outcome is None or (timed_out and outcome != "pass"):
            # not reached: the process was killed or crashed before the report
            outcome = "timeout" if timed_out else "fail"
        results[e.name] = outcome
    if not timed_out and p.returncode not in (0,) and all(r == "pass" for r in results.values()):
        # e.g. a crash after the last test, or an unexpected exit: do not call that a pass
        results = {n: "fail" for n in results}
    return results, out, seconds


def mirror_tests_dir(cwd: Path) -> Path:
    """A working directory for test-runner: the tests find interceptor_test/, fixtures/ and
    ../src/ relative to librdkafka's tests/, and leave files in it (a failed test's
    stats_*.json, 0014's offset files); a directory of symlinks to tests/ (and a ../src) keeps
    those out of the cached build."""
    cwd.mkdir(parents=True, exist_ok=True)
    links = [(cwd / p.name, p) for p in TESTS.iterdir()]
    links += [(cwd.parent / d, SRC / d) for d in ("src", "src-cpp")]
    for link, target in links:
        if not link.exists() and not link.is_symlink():
            link.symlink_to(target)
    return cwd


@dataclass
class Brokers:
    """Bootstrap addresses by SCENARIO_BROKER kind."""
    auto: str | None = None
    noauto: str | None = None

    def get(self, kind: str) -> str | None:
        return getattr(self, kind)


def run_suite(brokers: Brokers, only: set[str] | None = None, modes: list[str] | None = None,
              cap_s: int = 300, log_dir: Path | None = None, work: Path | None = None,
              jobs: int = JOBS, long_cap_s: int = 900) -> SuiteRun:
    """Runs every test number that holds a selected test (`only`: ratchet names), `jobs`
    numbers at a time. Results are keyed by ratchet name (entry name + mode suffix)."""
    work = work or (log_dir or Path("/tmp")) / "librdkafka-work"
    todo = []
    for mode in MODES:
        if modes is not None and mode.key not in modes:
            continue
        for (number, scenario, subtest), entries in plan(mode).items():
            broker = brokers.get(SCENARIO_BROKER[scenario]) if mode.key != "local" else None
            if mode.key != "local" and broker is None:
                continue
            if only is None or any(test_name(e, mode) in only for e in entries):
                todo.append((mode, number, scenario, subtest, broker, entries))
    # The slow ones (LONG in the ratchet) first, so that none of them is left running alone
    # at the end.
    slow = load_long()
    def is_slow(item) -> bool:
        return any(test_name(e, item[0]) in slow for e in item[-1])

    todo.sort(key=lambda item: not is_slow(item))
    kpath = kafka_path()
    cwd = mirror_tests_dir(work / "tests")

    def one(item):
        mode, number, scenario, subtest, broker, entries = item
        cap = max(cap_s, long_cap_s) if is_slow(item) else cap_s
        return item, run_number(number, entries, mode, scenario, broker, work, cap, kpath,
                                subtest, cwd)

    run = SuiteRun()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = list(pool.map(one, todo))
    for (mode, number, scenario, subtest, _, entries), (results, out, secs) in done:
        for e in entries:
            t = test_name(e, mode)
            run.results[t] = results[e.name]
            run.seconds[t] = secs  # the whole number's time: its entries run together
            if results[e.name] in ("fail", "timeout"):
                run.tails[t] = failure_excerpt(out, e.runner_name)
            elif results[e.name] == "skip":
                run.tails[t] = "\n".join(ln for ln in out.splitlines()
                                         if "SKIPPING TEST" in ln and e.runner_name in ln)
        if log_dir is not None:
            (log_dir / f"{run_tag(number, mode, scenario, subtest)}.log").write_text(out)
    return run


# librdkafka's 0057 produces to an invalid topic name four times in a tight loop and expects
# each produce() to succeed (the error deferred to the delivery report) or to return
# TOPIC_EXCEPTION. If the broker's Metadata answer arrives while the loop still runs, librdkafka
# marks the topic "not exists" for TOPIC_EXCEPTION too (rdkafka_topic.c,
# rd_kafka_topic_metadata_update) and produce() returns Local: Unknown topic, whatever the
# broker answered. The test assumes the loop beats one metadata round trip (a fraction of a
# millisecond to kaas on loopback); a runner preempted for longer than that on CI's loaded two
# cores loses. Run alone it passed 40 times of 40 (2026-12-07); in CI it failed once in its
# first 31 runs, with the broker answering TOPIC_EXCEPTION (17) as Kafka does.
INVALID_TOPIC_RACE = ("test_invalid_topic:90: Expected Broker: Invalid topic, got Local: Unknown"
                      " topic")
EXPECTATION = re.compile(r"Expected .*, got ")


def excused_invalid_topic_race(run: SuiteRun) -> dict[str, str]:
    """{test: why} for 0057_invalid_topic when its only failed expectation is the produce()
    that lost the race above; empty otherwise."""
    out = {}
    for t, outcome in run.results.items():
        if not t.startswith("0057_invalid_topic") or outcome != "fail":
            continue
        expected = [ln for ln in run.tails.get(t, "").splitlines() if EXPECTATION.search(ln)]
        if expected and all(INVALID_TOPIC_RACE in ln for ln in expected):
            out[t] = ("librdkafka's produce() loop lost the race with the broker's Metadata "
                      "answer (TOPIC_EXCEPTION), which turns the topic 'not exists' client-side")
    return out


def failure_excerpt(out: str, name: str, limit: int = 3000) -> str:
    """The runner's failure lines for `name`, else the output's tail."""
    lines = [ln for ln in out.splitlines() if name in ln and ("FAIL" in ln or "fail" in ln)]
    tail = out[-limit:]
    return ("\n".join(lines[-10:]) + "\n...\n" + tail[-1500:]) if lines else tail


if __name__ == "__main__":
    # scripts/install-test-deps.sh: fetch the source and build test-runner ahead of the tests.
    print(f"librdkafka {VERSION} test-runner: {test_runner()}")
