#!/usr/bin/env python3
"""bench/durable_vs_raw.py — durable produce against the disk's own fsync-bounded bandwidth,
measured in the same minutes (issue 16: acks=all should reach at least 70% of it).

The disk's speed moves through the day (on this VM a 64 KiB write + fdatasync loop measured
58 MB/s one morning and 282 MB/s that afternoon), so a ratio is only meaningful between runs
taken back to back. This script alternates, on the same filesystem:

  raw   one process appends CHUNK bytes to a new file and calls fdatasync after each write,
        for DURATION seconds (what a program gets from the disk when every write must be
        durable before the next; each fdatasync also commits the file's growth), and
  kaas  `kaas-bench produce --acks all` (1 KiB records, 100 partitions, 16 KiB batches: the
        client defaults) against a kaas broker whose data directory is beside the raw file,
        for DURATION seconds after a 2 s warm-up. kaas acknowledges acks=all only after a
        sync covering the write (`syncfs` group commit by default).

in the order raw, kaas, raw, kaas, ..., raw, and reports each kaas run against the mean of the
raw runs just before and after it. Between runs `sync` flushes what the last run left dirty.

Usage: bench/durable_vs_raw.py [--rounds N] [--duration S] [--chunk BYTES] [--pinned] [--producers N]
                               [--workdir DIR] [--kaas-bin PATH] [--bench-bin PATH]
                               [--sync-scope filesystem|file]
--pinned: the broker on core 0 (--shards 1), kaas-bench and the raw writer on core 1.
A benchmark: it reports figures and asserts nothing. MB/s is MiB/s, as kaas-bench counts.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOME = Path.home()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_run(path: Path, chunk: int, duration: float) -> float:
    """MiB/s of append + fdatasync, CHUNK bytes per write, into a new file at `path`."""
    buf = os.urandom(chunk)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < duration:
            n = os.write(fd, buf)
            os.fdatasync(fd)
            written += n
        elapsed = time.monotonic() - started
    finally:
        os.close(fd)
        path.unlink()
    return written / elapsed / (1 << 20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="kaas runs (raw runs: one more)")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--chunk", type=int, default=1 << 20, help="raw write size, bytes")
    ap.add_argument("--pinned", action="store_true")
    ap.add_argument("--producers", type=int, default=1,
                    help="kaas-bench producers (each with its own connection and 5 requests in flight)")
    ap.add_argument("--sync-scope", default="filesystem", choices=("filesystem", "file"))
    ap.add_argument("--workdir", help="on the filesystem to measure (default: a new directory "
                    "under $TMPDIR, which must then be on that disk: on a tmpfs the raw "
                    "figure means nothing)")
    ap.add_argument("--kaas-bin", default=os.environ.get(
        "KAAS_BIN", str(HOME / ".cache/kaas-target/release/kaas")))
    ap.add_argument("--bench-bin", default=os.environ.get(
        "KAAS_BENCH_BIN", str(HOME / ".cache/kaas-target/release/kaas-bench")))
    a = ap.parse_args()
    for what, path in (("kaas", a.kaas_bin), ("kaas-bench", a.bench_bin)):
        if not os.access(path, os.X_OK):
            sys.exit(f"no {what} binary at {path}: build it (cargo build --release -p {what}) "
                     f"or pass --{'kaas' if what == 'kaas' else 'bench'}-bin")
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="kaas-durable-"))
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "kaas-data"
    broker_cpu, client_cpu = (["taskset", "-c", "0"], ["taskset", "-c", "1"]) if a.pinned else ([], [])
    if a.pinned:
        os.sched_setaffinity(0, {1})  # the raw writer shares the client's core
    port = free_port()
    cmd = [*broker_cpu, a.kaas_bin, "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
           "--health-listen", f"127.0.0.1:{free_port()}", "--sync-scope", a.sync_scope]
    if a.pinned:
        cmd += ["--shards", "1"]
    log = open(workdir / "kaas.log", "ab")
    broker = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    raw, kaas = [], []
    try:
        deadline = time.monotonic() + 60
        while True:
            if broker.poll() is not None:
                sys.exit(f"kaas exited ({broker.returncode}); see {log.name}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("kaas did not listen within 60 s")
                time.sleep(0.05)

        def settle() -> None:
            subprocess.run(["sync"], check=True)
            time.sleep(1)

        for r in range(a.rounds + 1):
            settle()
            raw.append(raw_run(workdir / "raw.bin", a.chunk, a.duration))
            print(f"raw {r}: {raw[-1]:.1f} MiB/s", flush=True)
            if r == a.rounds:
                break
            settle()
            report = workdir / f"kaas-{r}.json"
            subprocess.run([*client_cpu, a.bench_bin, "produce", "--bootstrap",
                            f"127.0.0.1:{port}", "--topic", "durable", "--partitions", "100",
                            "--acks", "all", "--producers", str(a.producers),
                            "--duration", f"{a.duration:g}s", "--json",
                            str(report)], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=a.duration + 120)
            produced = json.loads(report.read_text())["produce"]
            kaas.append(produced["mb_per_s"])
            print(f"kaas {r}: {kaas[-1]:.1f} MiB/s ({produced['msg_per_s']:.0f} msg/s, "
                  f"p99 {produced['latency_ms']['p99_ms']:.1f} ms)", flush=True)
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(60)
        except subprocess.TimeoutExpired:
            broker.kill()
        if not a.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nraw: append {a.chunk} B + fdatasync; kaas: acks=all, {a.producers} producer(s), "
          f"--sync-scope {a.sync_scope}"
          f"{', pinned' if a.pinned else ''}\n")
    print("| run | raw before, MiB/s | kaas acks=all, MiB/s | raw after, MiB/s | kaas ÷ raw mean |")
    print("|---|---:|---:|---:|---:|")
    for r, k in enumerate(kaas):
        mean = (raw[r] + raw[r + 1]) / 2
        print(f"| {r + 1} | {raw[r]:.1f} | {k:.1f} | {raw[r + 1]:.1f} | {k / mean:.0%} |")


if __name__ == "__main__":
    main()
