#!/usr/bin/env python3
"""Broker CPU per GiB consumed, kaas alone, pinned (issue 16).

Starts kaas with one shard on core 0, fills a topic with `kaas-bench produce` (acks=1, 1 KiB
records, 100 partitions) from core 1, then reads it back with `kaas-bench consume` from core 1:
once after dropping the page cache (a first read, from disk) and `--cached-reads` times more
(from the page cache). For the fill and each read it reports the client's msg/s and MiB/s, the
broker's user + system CPU seconds (/proc/PID/stat) per GiB (of message payload acknowledged
for the fill, of record-batch bytes for a read), and its VmRSS. `kaas-floor` measures what the
same work costs a program that does nothing else.

    bench/consume_cpu.py                       # 20 s of produce, one read from disk, two cached
    bench/consume_cpu.py --produce-seconds 40 --cached-reads 3 --json out.json

Needs root for the page-cache drop (otherwise the first read is reported as not from disk).
Binaries: $KAAS_BIN (else $CARGO_TARGET_DIR/release/kaas) and $KAAS_BENCH_BIN (else
$CARGO_TARGET_DIR/release/kaas-bench); build both with
`cargo build --release -p kaas -p kaas-bench`. One run per figure: single runs move by ±10%.
"""

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

TICKS = os.sysconf("SC_CLK_TCK")


def binary(env_name: str, name: str) -> str:
    if os.environ.get(env_name):
        return os.environ[env_name]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/kaas-target"))
    path = os.path.join(target, "release", name)
    if not os.path.exists(path):
        sys.exit(f"{path} not found: build with `cargo build --release -p kaas -p kaas-bench` "
                 f"or set {env_name}")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def vmrss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def drop_page_cache() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def children_cpu_seconds() -> float:
    """User + system CPU of the waited-for children so far (the client runs are children)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def row(label: str, report: str, side_name: str, cpu: float, pid: int, client_cpu: float) -> dict:
    """One printed result: kaas-bench's `side_name` side from the `report` JSON, with the
    broker's `cpu` and the client's `client_cpu` seconds per GiB of that side's total bytes."""
    with open(report) as f:
        side = json.load(f)[side_name]
    gib = side["total_bytes"] / 2**30
    r = {
        "read": label,
        "msg_per_s": round(side["msg_per_s"]),
        "mib_per_s": round(side["mb_per_s"], 1),
        "gib": round(gib, 3),
        "broker_cpu_s": round(cpu, 2),
        "broker_cpu_s_per_gib": round(cpu / gib, 3) if gib else None,
        "client_cpu_s_per_gib": round(client_cpu / gib, 3) if gib else None,
        "vmrss_mib": round(vmrss_mib(pid)),
        "caught_up": side.get("caught_up"),
    }
    print(json.dumps(r), flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--produce-seconds", type=int, default=20)
    ap.add_argument("--cached-reads", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--dir", default=None, help="parent of the data directory (default: $TMPDIR)")
    ap.add_argument("--broker-flag", action="append", default=[], help="extra kaas flag (repeatable)")
    ap.add_argument("--broker-env", action="append", default=[], help="NAME=VALUE for kaas (repeatable)")
    ap.add_argument("--hold-host-memory", action="store_true",
                    help="keep a VM guest's free memory for the run (bench/host_memory.py)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    kaas, bench = binary("KAAS_BIN", "kaas"), binary("KAAS_BENCH_BIN", "kaas-bench")
    host_memory = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_memory.py")
    if args.hold_host_memory:
        subprocess.run([sys.executable, host_memory, "hold"], check=True, stdout=sys.stderr)
    work = tempfile.mkdtemp(prefix="kaas-consume-cpu-", dir=args.dir)
    port, http = free_port(), free_port()
    bootstrap = f"127.0.0.1:{port}"
    log = open(os.path.join(work, "kaas.log"), "w")
    broker = subprocess.Popen(
        ["taskset", "-c", "0", kaas, "--shards", "1", "--listen", bootstrap,
         "--health-listen", f"127.0.0.1:{http}", "--data-dir", os.path.join(work, "data"),
         *args.broker_flag],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **dict(e.split("=", 1) for e in args.broker_env)})
    rows = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http}/readyz", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or broker.poll() is not None:
                    sys.exit(f"kaas did not become ready; see {work}/kaas.log")
                time.sleep(0.1)
        client = ["taskset", "-c", "1", bench]
        common = ["--bootstrap", bootstrap, "--topic", "cpu", "--partitions", str(args.partitions)]
        cpu0, client0 = cpu_seconds(broker.pid), children_cpu_seconds()
        subprocess.run([*client, "produce", *common, "--acks", "1", "--message-size", "1024",
                        "--warmup", "0s", "--duration", f"{args.produce_seconds}s",
                        "--json", os.path.join(work, "produce.json")],
                       check=True, stdout=subprocess.DEVNULL)
        # Per GiB of message payload acknowledged.
        rows.append(row("produce acks=1 (the fill)", os.path.join(work, "produce.json"),
                        "produce", cpu_seconds(broker.pid) - cpu0, broker.pid,
                        children_cpu_seconds() - client0))
        for i in range(1 + args.cached_reads):
            from_disk = i == 0 and drop_page_cache()
            out = os.path.join(work, f"consume{i}.json")
            cpu0, client0 = cpu_seconds(broker.pid), children_cpu_seconds()
            subprocess.run([*client, "consume", *common, "--duration", "600s", "--json", out],
                           check=True, stdout=subprocess.DEVNULL)
            # Per GiB of record-batch bytes of the whole read.
            label = "from disk" if from_disk else ("first (cache not dropped)" if i == 0 else "cached")
            rows.append(row(label, out, "consume", cpu_seconds(broker.pid) - cpu0, broker.pid,
                            children_cpu_seconds() - client0))
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            broker.kill()
        log.close()
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"flags": args.broker_flag, "reads": rows}, f, indent=1)
        shutil.rmtree(work, ignore_errors=True)
        if args.hold_host_memory:
            subprocess.run([sys.executable, host_memory, "release"], stdout=sys.stderr)


if __name__ == "__main__":
    main()
