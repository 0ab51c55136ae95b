"""Shards run on the CPUs the broker is given. A broker started under `taskset`, or in a
container whose cpuset holds other CPUs than the first ones (Kubernetes' static CPU manager
hands a pod, say, CPUs 5 and 6), pinned shard i to CPU i all the same: under `taskset` the
shard left the core it was given (the kernel lets a thread widen its own affinity), and in a
cpuset the kernel refused the affinity and the broker did not start. Each case gives the broker
one CPU that is not CPU 0, checks that it serves a producer and a consumer, and that every one
of its threads — the shard, its blocking threads, the control thread — may run only there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import Broker
from kcheck import create_topic, rdkafka_produce, rdkafka_read_all, unique_topic

CPUSET = Path("/sys/fs/cgroup/cpuset")


def cpu_list(text: str) -> set[int]:
    """`0-2,5` → {0, 1, 2, 5}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def threads_cpus(pid: int) -> dict[str, set[int]]:
    """Each thread of `pid` (name/tid) → the CPUs it may run on."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            status = (task / "status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        line = next(l for l in status.splitlines() if l.startswith("Cpus_allowed_list:"))
        out[f"{name}/{task.name}"] = cpu_list(line.split(":", 1)[1])
    return out


@pytest.mark.parametrize("how", ["taskset", "cpuset"])
def test_shards_run_on_the_cpus_the_broker_is_given(tmp_path, how):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs, to give the broker one that is not the first")
    given = cpus[-1]
    group = CPUSET / f"kaas-test-{os.getpid()}"
    if how == "taskset":
        def confine():
            os.sched_setaffinity(0, {given})
    else:
        if os.geteuid() != 0 or not (CPUSET / "cpuset.cpus").exists():
            pytest.skip("needs root and the cgroup-v1 cpuset controller")
        group.mkdir()
        (group / "cpuset.cpus").write_text(f"{given}\n")
        (group / "cpuset.mems").write_text((CPUSET / "cpuset.mems").read_text())
        procs = str(group / "cgroup.procs")

        def confine():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
    # One shard, as many as CPUs given: it is pinned.
    b = Broker(tmp_path, shards=1, preexec_fn=confine)
    try:
        b.start()
        topic = unique_topic("placed")
        create_topic(b.bootstrap, topic, 2)
        sent = [b"v%d" % i for i in range(200)]
        rdkafka_produce(b.bootstrap, topic, ((None, v) for v in sent))
        records, _ = rdkafka_read_all(b.bootstrap, topic, 2)
        assert sorted(r[3] for r in records) == sorted(sent)
        placed = threads_cpus(b.pid)
        assert any(name.startswith("kaas-shard") for name in placed), placed
        astray = {name: sorted(c) for name, c in placed.items() if not c <= {given}}
        assert not astray, f"given CPU {given}, threads that may run elsewhere: {astray}"
    finally:
        b.close()
        if group.exists():
            group.rmdir()
