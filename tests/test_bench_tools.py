"""The benchmark tools of issue 16 that decide what a comparison reports (bench/).

- `compare_table.py` turns each client's `/usr/bin/time` output into a client CPU per GiB row,
  next to the broker's, so a reader can tell a client-bound row from a broker-bound one.
- `compare.sh` refuses to start when the work directory's disk cannot hold the logs the run
  keeps (a run that filled the disk left Kafka failing writes halfway and compared errors).
- `host_memory.py` turns a VM guest's free page reporting off for a run and restores it.
"""

import json
import os
import runpy
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
GIB = 1 << 30


def table_rows(results_dir) -> dict:
    """compare_table.py's rows as {(workload title, tool, figure): (kaas, kafka)}."""
    out = subprocess.run([sys.executable, os.path.join(BENCH, "compare_table.py"), str(results_dir)],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0] and not cells[0].startswith("---"):
            rows[(cells[0], cells[1], cells[2])] = (cells[3], cells[4])
    return rows


def test_the_table_reports_each_clients_cpu_per_gib(tmp_path):
    res = tmp_path
    # kaas-bench moved 2 GiB against each broker; the broker used 1 s (kaas) and 3 s (Kafka)
    # of CPU, the client 4 s and 2 s.
    for broker, broker_ticks, client in (("kaas", 100, "3.00 1.00"), ("kafka", 300, "1.50 0.50")):
        (res / f"produce-acks1.{broker}.kb.json").write_text(json.dumps(
            {"produce": {"msg_per_s": 100000, "mb_per_s": 100.0, "total_bytes": 2 * GIB,
                         "latency_ms": {"p50_ms": 1.0, "p99_ms": 2.0, "p999_ms": 3.0}}}))
        (res / f"produce-acks1.{broker}.kb.cpu").write_text(f"{broker_ticks} 100\n")
        (res / f"produce-acks1.{broker}.kb.time").write_text(client + "\n")
    # rdkafka_performance moved 1 GiB; GNU time notes a non-zero exit before its figures.
    line = ("% 1048576 messages produced ({b} bytes), 1048576 delivered (offset 0, 0 failed) in "
            "1000ms: 1048576 msgs/s and 1073.74 MB/s, 0 produce failures, 0 in queue, "
            "no compression\n").format(b=GIB)
    (res / "produce-acks1.kaas.rp.txt").write_text(line)
    (res / "produce-acks1.kaas.rp.cpu").write_text("150 100\n")
    (res / "produce-acks1.kaas.rp.time").write_text("Command exited with non-zero status 1\n2.25 0.25\n")

    rows = table_rows(res)
    title = "produce acks=1, 1 KiB, 100 partitions"
    assert rows[(title, "kaas-bench", "broker CPU s/GiB")] == ("0.50", "1.50")
    assert rows[(title, "kaas-bench", "client CPU s/GiB")] == ("2.00", "1.00")
    assert rows[(title, "rdkafka_performance", "broker CPU s/GiB")] == ("1.50", "n/a")
    assert rows[(title, "rdkafka_performance", "client CPU s/GiB")] == ("2.50", "n/a")


def test_compare_refuses_to_start_without_room_for_the_logs(tmp_path):
    # 10 TiB per partition cannot fit: the script must stop before it builds or starts anything.
    work = tmp_path / "work"
    proc = subprocess.run(
        [os.path.join(BENCH, "compare.sh"), "--only", "kaas", "--kaas-bin", "/bin/true",
         "--bench-bin", "/bin/true", "--retain-mib", str(10 << 20), "--workloads", "consume",
         "--workdir", str(work)],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "GiB free; this run needs about" in proc.stderr
    assert "--retain-mib" in proc.stderr
    assert not (work / "kaas-data").exists()
    assert "building kaas-bench" not in proc.stderr


KNOB = "/sys/module/page_reporting/parameters/page_reporting_order"


def host_memory(*args, state):
    return subprocess.run([sys.executable, os.path.join(BENCH, "host_memory.py"), *args,
                           "--state", str(state)],
                          capture_output=True, text=True, timeout=120)


def test_host_memory_hold_turns_reporting_off_and_release_restores_it(tmp_path):
    state = tmp_path / "order"
    if not os.path.exists(KNOB):
        held = host_memory("hold", state=state)
        assert held.returncode == 0 and "no free page reporting here" in held.stdout
        assert not state.exists()
        return
    if not os.access(KNOB, os.W_OK):
        pytest.skip(f"{KNOB} needs root to change")
    before = open(KNOB).read().strip()
    try:
        held = host_memory("hold", "--touch-mib", "16", state=state)
        assert held.returncode == 0, held.stderr
        assert state.read_text() == before
        # Above the largest order of free blocks, so none is reported (the machine may
        # already be held by a benchmark, in which case the order stays where it was).
        largest = runpy.run_path(os.path.join(BENCH, "host_memory.py"))["max_buddy_order"]()
        assert int(open(KNOB).read()) > largest
        assert "reporting off" in host_memory("status", state=state).stdout
        # A second hold keeps the value saved by the first.
        assert host_memory("hold", "--touch-mib", "0", state=state).returncode == 0
        assert state.read_text() == before
    finally:
        released = host_memory("release", state=state)
    assert released.returncode == 0, released.stderr
    assert open(KNOB).read().strip() == before
    assert not state.exists()
