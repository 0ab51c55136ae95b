#!/usr/bin/env python3
"""Turns the raw results of bench/compare.sh into one markdown table of figures and ratios.

Reads RESULTS_DIR/<workload>.<broker>.<tool>.{json,txt} (kb = kaas-bench JSON, pp =
ProducerPerformance output, cp = ConsumerPerformance output) and memory.txt, and prints the
table on stdout. A figure that is missing (a tool failed, a broker was not run) reads n/a.
"""

import argparse
import json
import os
import re
import sys

BROKERS = ("kaas", "kafka")

DURABILITY = {
    "produce-acks1": "both ack after the write, before any fsync",
    "produce-acksall": "kaas fsyncs before the ack; Kafka acks from the page cache (no fsync)",
    "produce-flush": "both fsync before the ack (Kafka topic flush.messages=1; kaas row = its acks=all)",
    "consume": "reads (stored data, mostly page cache)",
    "e2e": "acks=all: kaas fsyncs before the ack; Kafka does not",
    "partitions1000": "both ack after the write, before any fsync",
    "partitions1000-again": "both ack after the write, before any fsync",
}

TITLES = {
    "produce-acks1": "produce acks=1, 1 KiB, 100 partitions",
    "produce-acksall": "produce acks=all, 1 KiB, 100 partitions",
    "produce-flush": "produce acks=all, fsync per write on both",
    "consume": "consume stored data, 100 partitions",
    "e2e": "end-to-end at a fixed rate, acks=all, 100 partitions",
    "partitions1000": "produce acks=1, 1 KiB, 1000 partitions",
    "partitions1000-again": "same, run again right away",
}

PP_RE = re.compile(
    r"(?P<n>\d+) (?:steady state )?records sent, (?P<rate>[\d.]+) records/sec \((?P<mb>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99.9th"
)


def load_kb(res, w, b):
    try:
        with open(os.path.join(res, f"{w}.{b}.kb.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


PP_METRIC_RE = re.compile(r"^producer-metrics:(?P<name>[\w-]+):\{client-id=[^}]*\}\s*:\s*(?P<v>[\d.E+-]+)$")


def load_pp(res, w, b):
    """The steady-state line when there is one (after --warmup-records), else the summary;
    with --print-metrics' producer figures (`batch-size-avg`, ...), the broker's CPU seconds
    per GiB over the whole run (<w>.<b>.pp.cpu) and the client JVM's (<w>.<b>.pp.time)."""
    try:
        text = open(os.path.join(res, f"{w}.{b}.pp.txt")).read()
    except OSError:
        return None
    found, total = None, None
    for line in text.splitlines():
        m = PP_RE.search(line)
        if m and ("steady state" in line or found is None):
            found = {k: float(v) for k, v in m.groupdict().items()}
        if m and "steady state" not in line:
            total = float(m.group("n"))
    if found is None:
        return None
    for line in text.splitlines():
        m = PP_METRIC_RE.match(line.strip())
        if m:
            found[m.group("name")] = float(m.group("v"))
    gib = (total or 0) * 1024 / 2**30
    if gib > 0:
        try:
            ticks, hz = open(os.path.join(res, f"{w}.{b}.pp.cpu")).read().split()
            found["cpu_per_gib"] = (int(ticks) / int(hz)) / gib
        except (OSError, ValueError):
            pass
        found["client_cpu_per_gib"] = client_cpu(res, w, b, "pp", gib)
    return found


RP_PRODUCE_RE = re.compile(
    r"^% (?P<messages>\d+) messages produced \((?P<bytes>\d+) bytes\), (?P<delivered>\d+) delivered"
    r".* in (?P<ms>\d+)ms: (?P<msg_per_s>\d+) msgs/s and (?P<mb_per_s>[\d.]+) MB/s, (?P<failures>\d+) produce failures")
RP_CONSUME_RE = re.compile(
    r"^% (?P<messages>\d+) messages \((?P<bytes>\d+) bytes\) consumed in (?P<ms>\d+)ms: "
    r"(?P<msg_per_s>\d+) msgs/s \((?P<mb_per_s>[\d.]+) MB/s\)")


def load_rp(res, w, b):
    """The last summary line of rdkafka_performance (its MB/s are 10^6 bytes per second), and
    the broker's and the client's CPU seconds per GiB over the run (<w>.<b>.rp.cpu, .time)."""
    try:
        text = open(os.path.join(res, f"{w}.{b}.rp.txt")).read()
    except OSError:
        return None
    found = None
    for line in text.splitlines():
        m = RP_PRODUCE_RE.search(line) or RP_CONSUME_RE.search(line)
        if m:
            found = {k: float(v) for k, v in m.groupdict().items()}
    if found is None:
        return None
    try:
        ticks, hz = open(os.path.join(res, f"{w}.{b}.rp.cpu")).read().split()
        if found["bytes"] > 0:
            found["cpu_per_gib"] = (int(ticks) / int(hz)) / (found["bytes"] / 2**30)
    except (OSError, ValueError):
        pass
    found["client_cpu_per_gib"] = client_cpu(res, w, b, "rp", found["bytes"] / 2**30)
    return found


def load_cp(res, w, b):
    """fetch.nMsg.sec and fetch.MB.sec (rebalance time excluded) from the CSV line."""
    try:
        lines = open(os.path.join(res, f"{w}.{b}.cp.txt")).read().splitlines()
    except OSError:
        return None
    for i, line in enumerate(lines):
        if line.startswith("start.time"):
            cols = [c.strip() for c in line.split(",")]
            if i + 1 < len(lines):
                vals = [v.strip() for v in lines[i + 1].split(",")]
                if len(vals) == len(cols):
                    row = dict(zip(cols, vals))
                    try:
                        return {
                            "msg_per_s": float(row["fetch.nMsg.sec"]),
                            "mb_per_s": float(row["fetch.MB.sec"]),
                            "messages": float(row["data.consumed.in.nMsg"]),
                        }
                    except (KeyError, ValueError):
                        return None
    return None


def get(d, *path):
    for p in path:
        if d is None:
            return None
        d = d.get(p) if isinstance(d, dict) else None
    return d


def cpu_per_gib(res, w, b, side):
    """Broker CPU seconds per GiB of record bytes the kaas-bench run moved (its `total_bytes`,
    warm-up included, as the CPU is), from <w>.<b>.kb.cpu ("ticks clk_tck")."""
    try:
        ticks, hz = open(os.path.join(res, f"{w}.{b}.kb.cpu")).read().split()
    except (OSError, ValueError):
        return None
    total = get(load_kb(res, w, b), side, "total_bytes")
    if not total:
        return None
    return (int(ticks) / int(hz)) / (total / 2**30)


def kb_client_cpu(res, w, b, side):
    """kaas-bench's own CPU seconds per GiB of the bytes it moved (as `cpu_per_gib`)."""
    total = get(load_kb(res, w, b), side, "total_bytes")
    return client_cpu(res, w, b, "kb", (total or 0) / 2**30)


def client_cpu(res, w, b, tool, gib):
    """The client's user + system CPU seconds per GiB, from <w>.<b>.<tool>.time (GNU time's
    "%U %S", after a line saying the exit status when it was not zero)."""
    if not gib:
        return None
    try:
        user, sys_ = open(os.path.join(res, f"{w}.{b}.{tool}.time")).read().split()[-2:]
        return (float(user) + float(sys_)) / gib
    except (OSError, ValueError):
        return None


def fmt(v, kind):
    if v is None:
        return "n/a"
    if kind == "rate":
        return f"{v:,.0f}"
    if kind == "mb":
        return f"{v:,.1f}"
    if kind == "ms":
        return f"{v:,.2f}" if v < 100 else f"{v:,.0f}"
    if kind in ("mib", "count"):
        return f"{v:,.0f}"
    if kind == "cpu":
        return f"{v:,.2f}"
    return str(v)


def ratio(k, f):
    if k is None or f is None or f == 0:
        return "n/a"
    r = k / f
    return f"{r:.3f}×" if r < 0.1 else f"{r:.2f}×"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("res")
    ap.add_argument("--machine", default="")
    ap.add_argument("--kafka-version", default="")
    ap.add_argument("--kafka-heap", default="")
    ap.add_argument("--shards", default="")
    ap.add_argument("--duration", default="")
    ap.add_argument("--warmup", default="")
    ap.add_argument("--e2e-rate", default="")
    a = ap.parse_args()
    res = a.res

    rows = []  # (workload, tool, metric, kaas, kafka, kind, better)

    def add(w, tool, metric, kind, better, getter):
        vals = [getter(b) for b in BROKERS]
        if all(v is None for v in vals):
            return
        rows.append((w, tool, metric, vals[0], vals[1], kind, better))

    for w in ("produce-acks1", "produce-acksall", "produce-flush", "partitions1000", "partitions1000-again"):
        # The flush row compares Kafka with flush.messages=1 to kaas's own acks=all run.
        src = {"kaas": "produce-acksall" if w == "produce-flush" else w, "kafka": w}
        kb = lambda b, *p: get(load_kb(res, src[b], b), "produce", *p)
        pp = lambda b, k: get(load_pp(res, src[b], b), k)
        add(w, "kaas-bench", "msg/s", "rate", "higher", lambda b: kb(b, "msg_per_s"))
        add(w, "kaas-bench", "MB/s", "mb", "higher", lambda b: kb(b, "mb_per_s"))
        add(w, "kaas-bench", "p50 ms", "ms", "lower", lambda b: kb(b, "latency_ms", "p50_ms"))
        add(w, "kaas-bench", "p99 ms", "ms", "lower", lambda b: kb(b, "latency_ms", "p99_ms"))
        add(w, "kaas-bench", "p99.9 ms", "ms", "lower", lambda b: kb(b, "latency_ms", "p999_ms"))
        add(w, "kaas-bench", "broker CPU s/GiB", "cpu", "lower",
            lambda b: cpu_per_gib(res, src[b], b, "produce"))
        add(w, "kaas-bench", "client CPU s/GiB", "cpu", "lower",
            lambda b: kb_client_cpu(res, src[b], b, "produce"))
        add(w, "ProducerPerformance", "msg/s", "rate", "higher", lambda b: pp(b, "rate"))
        add(w, "ProducerPerformance", "p99 ms", "ms", "lower", lambda b: pp(b, "p99"))
        add(w, "ProducerPerformance", "broker CPU s/GiB", "cpu", "lower", lambda b: pp(b, "cpu_per_gib"))
        add(w, "ProducerPerformance", "client CPU s/GiB", "cpu", "lower",
            lambda b: pp(b, "client_cpu_per_gib"))
        add(w, "ProducerPerformance", "batch bytes, average", "mb", "higher",
            lambda b: pp(b, "batch-size-avg"))
        add(w, "ProducerPerformance", "records per request, average", "mb", "higher",
            lambda b: pp(b, "records-per-request-avg"))
        add(w, "ProducerPerformance", "request latency avg ms", "ms",
            "lower", lambda b: pp(b, "request-latency-avg"))
        rp = lambda b, k: get(load_rp(res, src[b], b), k)
        add(w, "rdkafka_performance", "msg/s delivered", "rate", "higher", lambda b: rp(b, "msg_per_s"))
        add(w, "rdkafka_performance", "broker CPU s/GiB", "cpu", "lower", lambda b: rp(b, "cpu_per_gib"))
        add(w, "rdkafka_performance", "client CPU s/GiB", "cpu", "lower",
            lambda b: rp(b, "client_cpu_per_gib"))

    w = "consume"
    for src, label in (("consume", "first read"), ("consume-again", "second read")):
        add(w, "kaas-bench", f"msg/s, {label}", "rate", "higher",
            lambda b, src=src: get(load_kb(res, src, b), "consume", "msg_per_s"))
        add(w, "kaas-bench", f"MB/s (batch bytes), {label}", "mb", "higher",
            lambda b, src=src: get(load_kb(res, src, b), "consume", "mb_per_s"))
        add(w, "kaas-bench", f"broker CPU s/GiB, {label}", "cpu", "lower",
            lambda b, src=src: cpu_per_gib(res, src, b, "consume"))
        add(w, "kaas-bench", f"client CPU s/GiB, {label}", "cpu", "lower",
            lambda b, src=src: kb_client_cpu(res, src, b, "consume"))
    add(w, "ConsumerPerformance", "msg/s (fetch time), third read", "rate", "higher",
        lambda b: get(load_cp(res, w, b), "msg_per_s"))
    add(w, "rdkafka_performance", "msg/s (group), fourth read", "rate", "higher",
        lambda b: get(load_rp(res, w, b), "msg_per_s"))
    add(w, "rdkafka_performance", "broker CPU s/GiB, fourth read", "cpu", "lower",
        lambda b: get(load_rp(res, w, b), "cpu_per_gib"))
    add(w, "rdkafka_performance", "client CPU s/GiB, fourth read", "cpu", "lower",
        lambda b: get(load_rp(res, w, b), "client_cpu_per_gib"))

    w = "e2e"
    for side, label in (("produce", "ack"), ("consume", "e2e")):
        for q, name in (("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9"), ("max_ms", "max")):
            add(w, "kaas-bench", f"{label} {name} ms", "ms", "lower",
                lambda b, side=side, q=q: get(load_kb(res, w, b), side, "latency_ms", q))
    add(w, "kaas-bench", "msg/s received", "rate", "higher",
        lambda b: get(load_kb(res, w, b), "consume", "msg_per_s"))
    add(w, "ProducerPerformance", "ack p50 ms", "ms", "lower", lambda b: get(load_pp(res, w, b), "p50"))
    add(w, "ProducerPerformance", "ack p99 ms", "ms", "lower", lambda b: get(load_pp(res, w, b), "p99"))

    # Memory: RSS after each workload, and the peak.
    mem = {}
    try:
        for line in open(os.path.join(res, "memory.txt")):
            parts = line.split()
            if len(parts) >= 4:
                anon = int(parts[4]) / 1024 if len(parts) >= 5 else None
                mem[(parts[0], parts[1])] = (int(parts[2]) / 1024, int(parts[3]) / 1024, anon)
    except OSError:
        pass
    for stage in ("start", "produce-acks1", "produce-acksall", "consume", "e2e", "partitions1000", "end"):
        vals = [mem.get((stage, b), (None, None, None))[0] for b in BROKERS]
        if any(v is not None for v in vals):
            rows.append(("memory", "/proc VmRSS", f"RSS MiB after {stage}", vals[0], vals[1], "mib", "lower"))
        vals = [mem.get((stage, b), (None, None, None))[2] for b in BROKERS]
        if any(v is not None for v in vals):
            rows.append(("memory", "/proc RssAnon", f"anonymous RSS MiB after {stage}", vals[0], vals[1], "mib", "lower"))
    vals = [mem.get(("end", b), (None, None, None))[1] for b in BROKERS]
    if any(v is not None for v in vals):
        rows.append(("memory", "/proc VmHWM", "peak RSS MiB", vals[0], vals[1], "mib", "lower"))

    # --memory-limit: each broker's cgroup after the run (OOM kills, peak charged memory).
    cg = {}
    try:
        for line in open(os.path.join(res, "cgroup.txt")):
            parts = line.split()
            if len(parts) >= 6 and parts[0] == "end":
                cg[parts[1]] = (int(parts[2]), parts[3], int(parts[4]) / 1024, parts[5])
    except OSError:
        pass
    if cg:
        limit = next(iter(cg.values()))[0]
        kills = [cg.get(b, (None, None))[1] for b in BROKERS]
        rows.append(("memory", f"cgroup {limit} MiB", "OOM kills during the run",
                     *[float(k) if k not in (None, "?") else None for k in kills], "count", "lower"))
        peaks = [cg.get(b, (None, None, None))[2] for b in BROKERS]
        rows.append(("memory", f"cgroup {limit} MiB", "peak cgroup memory MiB (page cache included)",
                     peaks[0], peaks[1], "mib", "lower"))

    out = []
    out.append(f"Machine: {a.machine}")
    out.append(
        f"Apache Kafka {a.kafka_version} (single-node KRaft, heap {a.kafka_heap}); kaas {a.shards} shards; "
        f"{a.duration} s measured after {a.warmup} s warm-up per run; e2e rate {a.e2e_rate} msg/s; "
        f"batch.size 16384, linger.ms 5, no compression, one producer / consumer."
    )
    out.append("")
    out.append("| workload | client | figure | kaas | Kafka | kaas ÷ Kafka | better | durability |")
    out.append("|---|---|---|---:|---:|---:|---|---|")
    for w, tool, metric, k, f, kind, better in rows:
        title = TITLES.get(w, w)
        dur = DURABILITY.get(w, "")
        out.append(
            f"| {title} | {tool} | {metric} | {fmt(k, kind)} | {fmt(f, kind)} | {ratio(k, f)} | {better} | {dur} |"
        )
    try:
        notes = [n for n in open(os.path.join(res, "notes.txt")).read().splitlines() if n.strip()]
    except OSError:
        notes = []
    for n in notes:
        out.append("")
        out.append(f"Note: {n}")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
