#!/usr/bin/env python3
"""Cluster failover benchmark: how long until every partition is served again.

Starts N kaas brokers (separate processes, `--lease file`, one shared temporary directory) on
127.0.0.1, creates one topic with N x PER_BROKER partitions, waits until the cluster is balanced
and every partition is served, then SIGKILLs one broker and measures the time until the
survivors serve every partition again (sum of `partitions_led` over their /healthz equals the
partition count and no handover is pending). Two scenarios:

  broker      kill a broker that is not the controller
  controller  kill the controller (the Lease must expire first: --lease-duration-ms)

It also reports what the new controller read before its first assignment (the size of
assignment.json, from the controller's log line `wrote assignment.json ... read_bytes=`) and
how long after its election that first file was written.

Usage:
  bench/failover.py [--brokers 3] [--per-broker 1000] [--lease-duration-ms 15000 ...]

Needs: the release binary ($KAAS_BIN or $CARGO_TARGET_DIR/release/kaas) and confluent-kafka.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kaas_bin() -> str:
    if os.environ.get("KAAS_BIN"):
        return os.environ["KAAS_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/kaas-target")
    return str(Path(target) / "release" / "kaas")


class Broker:
    def __init__(self, i: int, shared: Path, work: Path, args):
        self.id = i
        self.kport, self.hport, self.gport = free_port(), free_port(), free_port()
        self.log = work / f"broker-{i}.log"
        self.cmd = [
            kaas_bin(), "--lease", "file", "--broker-id", str(i),
            "--data-dir", str(shared),
            "--listen", f"127.0.0.1:{self.kport}",
            "--health-listen", f"127.0.0.1:{self.hport}",
            "--heartbeat-listen", f"127.0.0.1:{self.gport}",
            "--shards", str(args.shards),
            "--lease-duration-ms", str(args.lease_duration_ms),
            "--lease-renew-deadline-ms", str(args.lease_renew_deadline_ms),
            "--lease-retry-period-ms", str(args.lease_retry_period_ms),
            "--write-fence-ms", str(args.write_fence_ms),
            "--handover-margin-ms", str(args.handover_margin_ms),
            "--auto-create-topics", "false",
        ]
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "ab"))

    def health(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.hport}/healthz", timeout=1) as r:
                return json.load(r).get("cluster")
        except Exception:
            return None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def wait(what: str, cond, timeout: float, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(step)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}")


def all_served(brokers, total):
    hs = [b.health() for b in brokers]
    if any(h is None for h in hs):
        return False
    led = sum(h["partitions_led"] for h in hs)
    pending = max(h["partitions_pending_handover"] for h in hs)
    versions = {h["assignment_version"] for h in hs}
    return led == total and pending == 0 and len(versions) == 1


def controller_log_line(b: Broker, after: int):
    text = b.log.read_text(errors="replace")[after:]
    for line in text.splitlines():
        if "wrote assignment.json" in line:
            rb = re.search(r"read_bytes=(\d+)", line)
            ms = re.search(r"ms_since_elected=(\d+)", line)
            if rb and ms:
                return int(rb.group(1)), int(ms.group(1))
    return None


def scenario(kind: str, args) -> dict:
    from confluent_kafka.admin import AdminClient, NewTopic

    work = Path(tempfile.mkdtemp(prefix="kaas-failover-"))
    shared = work / "shared"
    brokers = [Broker(i, shared, work, args) for i in range(args.brokers)]
    total = args.brokers * args.per_broker
    try:
        for b in brokers:
            b.start()
        wait("a controller", lambda: any(
            (h := b.health()) and h["is_controller"] for b in brokers), 60)
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{brokers[0].kport}"})
        admin.create_topics([NewTopic("failover", total, 1)])["failover"].result(60)
        wait("every partition served", lambda: all_served(brokers, total), 120)
        wait("balance", lambda: all(
            b.health()["partitions_led"] == args.per_broker for b in brokers), 60)
        controller = next(b for b in brokers if b.health()["is_controller"])
        victim = controller if kind == "controller" else next(
            b for b in brokers if b is not controller)
        survivors = [b for b in brokers if b is not victim]
        offsets = {b.id: b.log.stat().st_size for b in survivors}
        led = victim.health()["partitions_led"]
        t0 = time.monotonic()
        victim.kill()
        # Meanwhile: are the survivors still allowed to acknowledge writes (write fence open)?
        samples, closed = 0, 0

        def served_and_sample():
            nonlocal samples, closed
            for b in survivors:
                h = b.health()
                if h is not None:
                    samples += 1
                    closed += 0 if h["write_fence_open"] else 1
            return all_served(survivors, total)

        wait("failover", served_and_sample, 120, step=0.02)
        elapsed = time.monotonic() - t0
        out = {"scenario": kind, "brokers": args.brokers, "partitions": total,
               "victim_led": led, "seconds_to_all_served": round(elapsed, 3),
               "lease_duration_ms": args.lease_duration_ms, "write_fence_ms": args.write_fence_ms,
               "survivor_fence_closed_fraction": round(closed / max(samples, 1), 3)}
        if kind == "controller":
            new = wait("new controller", lambda: next(
                (b for b in survivors if (h := b.health()) and h["is_controller"]), None), 30)
            first = controller_log_line(new, offsets[new.id])
            if first:
                out["new_controller_read_bytes"], out["first_assignment_ms_after_election"] = first
        return out
    finally:
        for b in brokers:
            b.kill()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--brokers", type=int, default=3)
    p.add_argument("--per-broker", type=int, default=1000)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--lease-duration-ms", type=int, default=15000)
    p.add_argument("--lease-renew-deadline-ms", type=int, default=10000)
    p.add_argument("--lease-retry-period-ms", type=int, default=2000)
    p.add_argument("--write-fence-ms", type=int, default=2500)
    p.add_argument("--handover-margin-ms", type=int, default=1000)
    p.add_argument("--scenario", choices=["broker", "controller", "both"], default="both")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    kinds = ["broker", "controller"] if args.scenario == "both" else [args.scenario]
    for kind in kinds:
        print(json.dumps(scenario(kind, args)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
