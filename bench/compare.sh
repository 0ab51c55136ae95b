#!/usr/bin/env bash
# bench/compare.sh — kaas and Apache Kafka 4.x side by side: one machine, one run, same clients.
#
# Starts both brokers (their data in one directory, so on the same disk; Kafka single-node KRaft
# through scripts/run-apache-kafka.sh with a fixed heap), runs the same workloads against each
# with the same clients — kaas-bench, librdkafka's rdkafka_performance (built by
# bench/build-rdkafka-performance.sh from the rdkafka-sys crate's librdkafka), and Kafka's own
# ProducerPerformance / ConsumerPerformance from the Kafka jars — alternating which broker goes
# first, measuring each broker's CPU seconds per GiB moved, records each broker's resident
# memory from /proc after every workload, and prints a table of figures and kaas/Kafka ratios
# with the durability of each row. Every process it starts is stopped when it exits.
#
# Usage: bench/compare.sh [--duration SECONDS] [--warmup SECONDS] [--long] [--quick]
#                         [--e2e-rate MSG_PER_S] [--only kaas|kafka] [--workloads LIST]
#                         [--kaas-bin PATH] [--bench-bin PATH] [--kafka-heap OPTS]
#                         [--shards N] [--pinned] [--memory-limit MIB] [--hold-host-memory]
#                         [--retain-mib MIB] [--workdir DIR] [--keep] [--markdown FILE]
#   --duration   measured seconds per workload and broker (default 10; --long = 60, --quick = 3)
#   --warmup     warm-up seconds before each measurement (default 2)
#   --e2e-rate   fixed rate of the end-to-end workload, below both brokers' saturation (10000)
#   --only       run one broker (the other's columns read n/a); kaas is skipped automatically,
#                with a note, when its binary does not exist
#   --workloads  comma-separated subset of: produce-acks1,produce-acksall,produce-flush,
#                consume,e2e,partitions1000 (default: all); consume reads the topic the
#                produce workloads filled, twice (first read, then again)
#   --kaas-bin   default: $KAAS_BIN, else ~/.cache/kaas-target/release/kaas, else target/release/kaas
#   --bench-bin  default: built here with `cargo build --release -p kaas-bench`
#                (CARGO_TARGET_DIR=${KAAS_BENCH_TARGET_DIR:-~/.cache/kaas-target-bench})
#   --kafka-heap JVM heap of the Kafka broker (default "-Xmx1g -Xms1g", Kafka's own default)
#   --shards     kaas shards (default: nproc)
#   --pinned     broker on core 0 (kaas --shards 1; Kafka's JVM confined to core 0 and told it
#                has one processor), every client on core 1: CPU per core, without the client
#                and the broker competing for cores
#   --memory-limit  run each broker in its own memory cgroup of this many MiB (cgroup v2
#                memory.max, or v1 memory.limit_in_bytes; needs root), as a pod limit would;
#                the table then shows each broker's OOM kills and peak cgroup memory
#   --hold-host-memory  on a VM guest that hands free memory back to its host (free page
#                reporting), keep it for the run (bench/host_memory.py hold; restored at exit):
#                otherwise each page-cache drop hands pages back, and both brokers' writes pay
#                the host's fault on every fresh page (see bench/README.md); needs root
#   --retain-mib segment.bytes and retention.bytes of the 100-partition topic, per partition
#                (default 64): each broker keeps up to 100 × 2 × this on disk, which the run
#                checks is free before it starts
#   --workdir    where data, logs and results go (default ~/.cache/kaas/compare/<timestamp>);
#                broker data is deleted at the end unless --keep
#   --markdown   also write the table (markdown) to this file
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

duration=10
warmup=2
e2e_rate=10000
only=""
workloads="produce-acks1,produce-acksall,produce-flush,consume,e2e,partitions1000"
kaas_bin=""
bench_bin=""
kafka_heap="-Xmx1g -Xms1g"
shards="$(nproc)"
memory_limit=""
pinned=0
hold_host_memory=0
retain_mib=64
workdir=""
keep=0
markdown=""

die() { echo "compare.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --duration) duration="$2"; shift 2 ;;
        --warmup) warmup="$2"; shift 2 ;;
        --long) duration=60; shift ;;
        --quick) duration=3; warmup=1; shift ;;
        --e2e-rate) e2e_rate="$2"; shift 2 ;;
        --only) only="$2"; shift 2 ;;
        --workloads) workloads="$2"; shift 2 ;;
        --kaas-bin) kaas_bin="$2"; shift 2 ;;
        --bench-bin) bench_bin="$2"; shift 2 ;;
        --kafka-heap) kafka_heap="$2"; shift 2 ;;
        --shards) shards="$2"; shift 2 ;;
        --memory-limit) memory_limit="$2"; shift 2 ;;
        --pinned) pinned=1; shift ;;
        --hold-host-memory) hold_host_memory=1; shift ;;
        --retain-mib) retain_mib="$2"; shift 2 ;;
        --workdir) workdir="$2"; shift 2 ;;
        --keep) keep=1; shift ;;
        --markdown) markdown="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ "$duration" =~ ^[0-9]+$ && "$warmup" =~ ^[0-9]+$ && "$e2e_rate" =~ ^[0-9]+$ ]] \
    || die "--duration, --warmup and --e2e-rate take whole numbers"
[[ -z "$only" || "$only" == kaas || "$only" == kafka ]] || die "--only takes kaas or kafka"
[[ -z "$memory_limit" || "$memory_limit" =~ ^[0-9]+$ ]] || die "--memory-limit takes MiB"
[[ "$retain_mib" =~ ^[0-9]+$ ]] && (( retain_mib >= 1 )) || die "--retain-mib takes MiB (1 or more)"
has_workload() { [[ ",$workloads," == *",$1,"* ]]; }
# --pinned: commands run under taskset; the broker on core 0, clients on core 1.
broker_cpu=(); client_cpu=()
if [[ $pinned == 1 ]]; then
    (( $(nproc) >= 2 )) || die "--pinned needs two cores"
    command -v taskset > /dev/null || die "--pinned needs taskset (util-linux)"
    broker_cpu=(taskset -c 0); client_cpu=(taskset -c 1); shards=1
fi

log() { echo "[compare $(date +%H:%M:%S)] $*" >&2; }

# ---- binaries ---------------------------------------------------------------------------------
if [[ -z "$kaas_bin" ]]; then
    for c in "${KAAS_BIN:-}" "$HOME/.cache/kaas-target/release/kaas" "$root/target/release/kaas"; do
        if [[ -n "$c" && -x "$c" ]]; then kaas_bin="$c"; break; fi
    done
fi
brokers=()
notes=()
if [[ "$only" != kafka ]]; then
    if [[ -n "$kaas_bin" && -x "$kaas_bin" ]]; then
        brokers+=(kaas)
    else
        notes+=("kaas binary not found (looked at \$KAAS_BIN, ~/.cache/kaas-target/release/kaas, target/release/kaas): kaas columns are n/a")
        log "${notes[-1]}"
    fi
fi
[[ "$only" == kaas ]] || brokers+=(kafka)
[[ ${#brokers[@]} -gt 0 ]] || die "no broker to run"

# ---- work directory, and room for the logs (checked before anything is built or started) -----
# The 1,000-partition topic's segment and retention size per partition, MiB (p1000_cfg).
p1000_segment_mib=8
p1000_retain_mib=4
workdir="${workdir:-$HOME/.cache/kaas/compare/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$workdir"
workdir="$(cd "$workdir" && pwd)"
res="$workdir/results"
mkdir -p "$res"
log "work directory $workdir"
# Disk: a topic's partition holds up to retention.bytes plus the segment being written (a sealed
# segment goes only once the rest still hold retention.bytes), so the 100-partition topic takes
# up to 100 × 2 × --retain-mib per broker, and the 1,000-partition one, which replaces it, up to
# 1,000 × (4 + 8) MiB (p1000_cfg below). Refuse to start without that room (plus 2 GiB for everything else): a
# broker that runs out of disk halfway through a run fails its writes (Kafka) or refuses them
# (kaas), and the table would compare errors.
if has_workload produce-acks1 || has_workload produce-acksall || has_workload consume \
    || has_workload partitions1000; then
    per_broker_mib=$(( 100 * 2 * retain_mib ))
    p1000_mib=$(( 1000 * (p1000_segment_mib + p1000_retain_mib) ))
    if has_workload partitions1000 && (( per_broker_mib < p1000_mib )); then
        per_broker_mib=$p1000_mib
    fi
    need_kib=$(( (${#brokers[@]} * per_broker_mib + 2048) * 1024 ))
    avail_kib="$(df -Pk "$workdir" | awk 'NR==2 {print $4}')"
    (( avail_kib >= need_kib )) || die "$workdir has $((avail_kib / 1048576)) GiB free; this run \
needs about $((need_kib / 1048576)) GiB (${#brokers[@]} broker(s) × $((per_broker_mib / 1024)) GiB of retained \
log + 2 GiB): free space, lower --retain-mib, pass --workdir on a larger disk, or run one broker (--only)"
fi

if [[ -z "$bench_bin" ]]; then
    log "building kaas-bench (release)"
    CARGO_TARGET_DIR="${KAAS_BENCH_TARGET_DIR:-$HOME/.cache/kaas-target-bench}" \
        cargo build --release -q -p kaas-bench --manifest-path "$root/Cargo.toml"
    bench_bin="${KAAS_BENCH_TARGET_DIR:-$HOME/.cache/kaas-target-bench}/release/kaas-bench"
fi
[[ -x "$bench_bin" ]] || die "kaas-bench binary $bench_bin not found"
kafka_libs="$("$root/scripts/fetch-kafka.sh")"
rdperf="$("$here/build-rdkafka-performance.sh")" || {
    rdperf=""
    notes+=("rdkafka_performance could not be built (bench/build-rdkafka-performance.sh): its rows are n/a")
    log "${notes[-1]}"
}
kafka_version="$(cat "$kafka_libs/.kafka-version" 2>/dev/null || echo unknown)"

# ---- process control -----------------------------------------------------------------------------

declare -A pid addr
started=()
stop_all() {
    local p
    for p in "${started[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${started[@]}"; do
        for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    started=()
    if [[ -n "$memory_limit" ]]; then remove_cgroups; fi
    if [[ $keep == 0 ]]; then rm -rf "$workdir/kaas-data" "$workdir/kafka-data"; fi
    if [[ $hold_host_memory == 1 ]]; then python3 "$here/host_memory.py" release >&2 || true; fi
}
trap stop_all EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
wait_port() { # PORT SECONDS PID
    local i
    for i in $(seq 1 $(($2 * 5))); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.2
    done
    return 1
}
# utime + stime of a process (fields 14 and 15 of /proc/PID/stat; the name field has no spaces
# for kaas or java), in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# The broker's CPU ticks since CPU0 into FILE ("ticks clk_tck"); nothing if it died meanwhile.
record_cpu() { # BROKER CPU0 FILE
    local now; now="$(cpu_ticks "${pid[$1]}")"
    if kill -0 "${pid[$1]}" 2>/dev/null && (( now >= $2 )); then
        echo "$(( now - $2 )) $(getconf CLK_TCK)" > "$3"
    fi
}
rss_kib() { awk '/^VmRSS:/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
hwm_kib() { awk '/^VmHWM:/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# The process's own memory, without the page cache of files it maps (kaas maps the segments it
# serves, which VmRSS counts; Kafka's JVM heap is anonymous either way).
anon_kib() { awk '/^RssAnon:/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# ---- memory cgroups (--memory-limit) -------------------------------------------------------------
# Each broker gets its own cgroup, entered by the launching shell before it execs the broker, so
# every process and thread it starts is inside. Works with cgroup v2 (memory.max, memory.events)
# and v1 (memory.limit_in_bytes, memory.oom_control).
cgroup_root=""
if [[ -n "$memory_limit" ]]; then
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then cgroup_root=/sys/fs/cgroup; cgroup_v=2
    elif [[ -d /sys/fs/cgroup/memory ]]; then cgroup_root=/sys/fs/cgroup/memory; cgroup_v=1
    else die "--memory-limit: no memory cgroup hierarchy under /sys/fs/cgroup"; fi
fi
declare -A cgroup
make_cgroup() { # BROKER -> path
    local cg="$cgroup_root/kaas-compare-$1-$$"
    mkdir -p "$cg" || die "--memory-limit: cannot create $cg (root needed)"
    if [[ $cgroup_v == 2 ]]; then
        echo "$((memory_limit * 1048576))" > "$cg/memory.max"
    else
        echo "$((memory_limit * 1048576))" > "$cg/memory.limit_in_bytes"
    fi
    cgroup[$1]="$cg"
}
in_cgroup() { # BROKER CMD... : runs CMD inside the broker's cgroup (plain when no limit)
    local b="$1"; shift
    if [[ -z "$memory_limit" ]]; then exec "$@"; fi
    make_cgroup "$b"
    # $BASHPID: this subshell (the broker once it execs), not the script ($$).
    echo "$BASHPID" > "${cgroup[$b]}/cgroup.procs"
    exec "$@"
}
oom_kills() { # BROKER
    local cg="$cgroup_root/kaas-compare-$1-$$"
    if [[ $cgroup_v == 2 ]]; then awk '/^oom_kill /{print $2}' "$cg/memory.events" 2>/dev/null || echo "?"
    else awk '/^oom_kill /{print $2}' "$cg/memory.oom_control" 2>/dev/null || echo "?"; fi
}
peak_cgroup_kib() { # BROKER
    local cg="$cgroup_root/kaas-compare-$1-$$" f
    if [[ $cgroup_v == 2 ]]; then f="$cg/memory.peak"; else f="$cg/memory.max_usage_in_bytes"; fi
    [[ -r "$f" ]] && echo $(($(cat "$f") / 1024)) || echo 0
}
remove_cgroups() {
    local b
    # A killed broker leaves its cgroup a moment after it is reaped: retry for up to 5 s.
    for b in kaas kafka; do
        local cg="$cgroup_root/kaas-compare-$b-$$" i
        [[ -d "$cg" ]] || continue
        for i in $(seq 1 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
        if [[ -d "$cg" ]]; then log "could not remove the cgroup $cg (rmdir it by hand)"; fi
    done
}

start_kaas() {
    local port hport
    port="$(free_port)"; hport="$(free_port)"
    mkdir -p "$workdir/kaas-data"
    (in_cgroup kaas "${broker_cpu[@]}" "$kaas_bin" --listen "127.0.0.1:$port" --advertised-listener "127.0.0.1:$port" \
        --data-dir "$workdir/kaas-data" --shards "$shards" --health-listen "127.0.0.1:$hport" \
        --retention-check-interval-ms 1000) > "$workdir/kaas.log" 2>&1 &
    pid[kaas]=$!; started+=("$!"); addr[kaas]="127.0.0.1:$port"
    local i
    for i in $(seq 1 300); do
        if curl -sf -o /dev/null "http://127.0.0.1:$hport/readyz"; then
            log "kaas ready on ${addr[kaas]} (pid ${pid[kaas]})"; return 0
        fi
        kill -0 "${pid[kaas]}" 2>/dev/null || break
        sleep 0.1
    done
    tail -20 "$workdir/kaas.log" >&2
    die "kaas did not become ready within 30 s"
}

# Disk: at these rates a full run writes ~45 GB per broker, more than this machine's disk has
# free. Each topic therefore keeps a bounded tail (retention.bytes per partition, checked every
# second by both brokers; Kafka also deletes segments 1 s after retiring them instead of 60 s),
# topics are deleted once no later workload reads them, and the 1,000-partition topic is created
# only after that. Segments are small enough that retention applies within a run, large enough
# that a partition rolls about once per run (rolling costs both brokers something).
kafka_retention_props=$'log.retention.check.interval.ms=1000\nlog.segment.delete.delay.ms=1000'
p100_cfg=(--topic-config segment.bytes=$((retain_mib << 20)) --topic-config retention.bytes=$((retain_mib << 20)))
p1000_cfg=(--topic-config segment.bytes=$((p1000_segment_mib << 20))
           --topic-config retention.bytes=$((p1000_retain_mib << 20)))

start_kafka() {
    local port
    port="$(free_port)"
    (export KAFKA_HEAP_OPTS="$kafka_heap" KAFKA_EXTRA_PROPS="$kafka_retention_props"
     if [[ $pinned == 1 ]]; then
         # Kafka's default JVM options, plus one processor: GC and pool sizes follow the core.
         export KAFKA_JVM_OPTS="-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true -XX:ActiveProcessorCount=1"
     fi
     in_cgroup kafka "${broker_cpu[@]}" "$root/scripts/run-apache-kafka.sh" "$port" "$workdir/kafka-data") \
        > "$workdir/kafka.log" 2>&1 &
    pid[kafka]=$!; started+=("$!"); addr[kafka]="127.0.0.1:$port"
    if ! wait_port "$port" 120 "${pid[kafka]}"; then
        tail -20 "$workdir/kafka.log" >&2
        die "Apache Kafka did not start within 120 s"
    fi
    # Wait until it answers metadata (the listener opens before the broker is unfenced).
    local i
    for i in $(seq 1 60); do
        if "$bench_bin" produce --bootstrap "${addr[kafka]}" --topic compare-probe --partitions 1 \
            --duration 0s --warmup 0s --quiet > /dev/null 2>&1; then
            log "Apache Kafka $kafka_version ready on ${addr[kafka]} (pid ${pid[kafka]})"; return 0
        fi
        sleep 1
    done
    die "Apache Kafka did not answer within 60 s"
}

if [[ $hold_host_memory == 1 ]]; then
    python3 "$here/host_memory.py" hold >&2 || die "--hold-host-memory: bench/host_memory.py hold failed"
    notes+=("--hold-host-memory: $(python3 "$here/host_memory.py" status)")
fi
for b in "${brokers[@]}"; do "start_$b"; done
load="$(cut -d' ' -f1-3 /proc/loadavg)"
log "load average before the run: $load"
if awk -v l="${load%% *}" -v n="$(nproc)" 'BEGIN{exit !(l > n / 2)}'; then
    notes+=("load average was $load when the run started: other work shared the machine, so figures are noisy")
    log "warning: ${notes[-1]}"
fi

# Before every measured run: write back what earlier runs left dirty in the page cache, so one
# run's writeback does not land in the next run's fsyncs (which only kaas does on acks=all).
# Before a run that writes (`settle write`), also drop the clean page cache when allowed (root):
# otherwise whichever broker runs later finds memory full of the other's cached segments and
# pays for reclaiming it on every page it writes — kaas alone wrote 688,000 msg/s at acks=1
# where, after ~10 GB of both brokers' data, it wrote 316,000 in the same run as Kafka.
settle() {
    sync
    if [[ "${1:-}" == write && -w /proc/sys/vm/drop_caches ]]; then
        echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
    fi
    sleep 1
}

# ---- runners ------------------------------------------------------------------------------------
# Each writes its raw output to $res/<workload>.<broker>.<tool>.{txt,json}; failures are
# recorded and the run goes on (the table shows n/a). Each client runs under /usr/bin/time
# (when present) into <...>.time ("user system" seconds): the client's own CPU per GiB tells
# a client that is the limit (pinned, its one core busy) from a broker that is.
set_timer() { # BASE: sets the caller's array `timer` to that prefix (empty without the tool)
    timer=()
    if [[ -x /usr/bin/time ]]; then timer=(/usr/bin/time -f "%U %S" -o "$1.time"); fi
}
kb() { # WORKLOAD BROKER MODE kaas-bench-args... (later options override the defaults here)
    local w="$1" b="$2" mode="$3"; shift 3
    local base="$res/$w.$b.kb"
    if [[ "$mode" == consume ]]; then settle; else settle write; fi
    log "$w on $b: kaas-bench $mode $*"
    local cpu0; cpu0="$(cpu_ticks "${pid[$b]}")"
    local -a timer; set_timer "$base"
    if ! "${client_cpu[@]}" "${timer[@]}" timeout $((duration * 3 + warmup + 120)) "$bench_bin" "$mode" --bootstrap "${addr[$b]}" \
        --warmup "${warmup}s" --duration "${duration}s" --quiet --json "$base.json" "$@" \
        > "$base.txt" 2>&1; then
        log "  kaas-bench failed, see $base.txt"; tail -5 "$base.txt" >&2 || true
    fi
    # The broker's CPU over the whole run (warm-up included), against the bytes the tool moved
    # over the whole run (`total_bytes`): broker CPU seconds per GiB.
    record_cpu "$b" "$cpu0" "$base.cpu"
    grep -E '^(produce|consume)' "$base.txt" | sed 's/^/    /' >&2 || true
}

json_field() { # FILE PYTHON-EXPR-ON-d
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null || echo ""
}

pp() { # WORKLOAD BROKER TOPIC ACKS RECORDS THROUGHPUT WARMUP_RECORDS
    local w="$1" b="$2" topic="$3" acks="$4" records="$5" tput="$6" wrec="$7"
    local base="$res/$w.$b.pp"
    [[ -n "$records" && "$records" -gt 0 ]] || { log "$w on $b: ProducerPerformance skipped (no record count)"; return; }
    settle write
    log "$w on $b: ProducerPerformance acks=$acks records=$records throughput=$tput"
    # --print-metrics: the client's own view of the batches it sent (batch-size-avg,
    # records-per-request-avg, ...), which is what this broker received; /usr/bin/time: the
    # JVM's CPU seconds, to tell a CPU-bound client from a slow broker.
    local cpu0; cpu0="$(cpu_ticks "${pid[$b]}")"
    local -a timer; set_timer "$base"
    "${client_cpu[@]}" "${timer[@]}" \
        timeout $((duration * 6 + warmup + 120)) java -Xmx512m -cp "$kafka_libs/*" \
        org.apache.kafka.tools.ProducerPerformance --topic "$topic" --num-records "$records" \
        --record-size 1024 --throughput "$tput" --warmup-records "$wrec" --print-metrics \
        --command-property "bootstrap.servers=${addr[$b]}" "acks=$acks" batch.size=16384 \
        linger.ms=5 compression.type=none \
        > "$base.txt" 2>&1 || log "  ProducerPerformance failed or timed out, see $base.txt"
    record_cpu "$b" "$cpu0" "$base.cpu"
    grep -E 'records sent' "$base.txt" | tail -1 | sed 's/^/    /' >&2 || true
    grep -E ':(batch-size-avg|records-per-request-avg):' "$base.txt" | sed 's/^/    /' >&2 || true
}

# librdkafka's rdkafka_performance: produce COUNT 1 KiB messages to random partitions (acks as
# given, batch.size and linger.ms as the other clients), or consume COUNT messages as a group
# member from the beginning. The broker's CPU over the run is recorded as for kaas-bench.
rp() { # WORKLOAD BROKER produce|consume TOPIC COUNT [ACKS]
    local w="$1" b="$2" mode="$3" topic="$4" n="$5" acks="${6:-1}"
    local base="$res/$w.$b.rp"
    [[ -n "$rdperf" ]] || return 0
    [[ -n "$n" && "$n" -gt 0 ]] || { log "$w on $b: rdkafka_performance skipped (no count)"; return; }
    local -a args
    if [[ "$mode" == produce ]]; then
        settle write
        args=(-P -t "$topic" -s 1024 -a "${acks/all/-1}" -c "$n" -X batch.size=16384 -X linger.ms=5)
    else
        settle
        args=(-G "compare-rp-$w-$RANDOM" -t "$topic" -c "$n" -e -X auto.offset.reset=earliest)
    fi
    log "$w on $b: rdkafka_performance ${args[*]}"
    local cpu0; cpu0="$(cpu_ticks "${pid[$b]}")"
    local -a timer; set_timer "$base"
    "${client_cpu[@]}" "${timer[@]}" timeout $((duration * 6 + warmup + 120)) "$rdperf" -b "${addr[$b]}" -q \
        "${args[@]}" > "$base.txt" 2>&1 || log "  rdkafka_performance failed or timed out, see $base.txt"
    record_cpu "$b" "$cpu0" "$base.cpu"
    grep -E '^% [0-9]+ messages' "$base.txt" | tail -1 | sed 's/^/    /' >&2 || true
}

cperf() { # WORKLOAD BROKER TOPIC MESSAGES
    local w="$1" b="$2" topic="$3" n="$4"
    local base="$res/$w.$b.cp"
    [[ -n "$n" && "$n" -gt 0 ]] || { log "$w on $b: ConsumerPerformance skipped (nothing stored)"; return; }
    settle
    log "$w on $b: ConsumerPerformance num-records=$n"
    "${client_cpu[@]}" timeout $((duration * 6 + 120)) java -Xmx512m -cp "$kafka_libs/*" \
        org.apache.kafka.tools.ConsumerPerformance --bootstrap-server "${addr[$b]}" \
        --topic "$topic" --num-records "$n" --timeout 15000 --group "compare-$w-$RANDOM" \
        > "$base.txt" 2>&1 || log "  ConsumerPerformance failed or timed out, see $base.txt"
    tail -1 "$base.txt" | sed 's/^/    /' >&2 || true
}

memory() { # WORKLOAD
    local b
    for b in "${brokers[@]}"; do
        echo "$1 $b $(rss_kib "${pid[$b]}") $(hwm_kib "${pid[$b]}") $(anon_kib "${pid[$b]}")" >> "$res/memory.txt"
        if [[ -n "$memory_limit" ]]; then
            echo "$1 $b $memory_limit $(oom_kills "$b") $(peak_cgroup_kib "$b") $(kill -0 "${pid[$b]}" 2>/dev/null && echo alive || echo dead)" >> "$res/cgroup.txt"
        fi
    done
}

# ABBA: even-numbered workloads run kaas first, odd ones Kafka first; the Kafka tools then run
# in the reverse order, so neither broker always goes first.
turn=0
order() {
    if [[ ${#brokers[@]} -eq 1 ]]; then echo "${brokers[0]}"; return; fi
    if (( turn % 2 == 0 )); then echo "kaas kafka"; else echo "kafka kaas"; fi
}
reverse() { local out="" x; for x in "$@"; do out="$x $out"; done; echo "$out"; }
kb_rate() { json_field "$res/$1.$2.kb.json" "int(d['produce']['msg_per_s'])"; }

# ProducerPerformance has no duration option: it writes what kaas-bench sustained on the same
# broker in the same time (at least 2000 msg/s worth, so a slow row is still a real run),
# unthrottled, after the same warm-up.
pp_records() { local r="${1:-0}"; (( r < 2000 )) && r=2000; echo $((r * (duration + warmup))); }
pp_warmup() { local r="${1:-0}"; (( r < 2000 )) && r=2000; echo $((r * warmup)); }

produce_workload() { # WORKLOAD TOPIC PARTITIONS ACKS AGAIN [kaas-bench extra args...]
    # AGAIN=1 runs kaas-bench a second time right after the first (workload "<name>-again").
    local w="$1" topic="$2" parts="$3" acks="$4" again="$5"; shift 5
    local b rate
    local -a bs
    read -r -a bs <<< "$(order)"
    for b in "${bs[@]}"; do
        kb "$w" "$b" produce --topic "$topic" --partitions "$parts" --message-size 1024 \
            --acks "$acks" "$@"
        if [[ "$again" == 1 ]]; then
            kb "$w-again" "$b" produce --topic "$topic" --partitions "$parts" \
                --message-size 1024 --acks "$acks" "$@"
        fi
    done
    for b in $(reverse "${bs[@]}"); do
        rate="$(kb_rate "$w" "$b")"
        pp "$w" "$b" "$topic" "$acks" "$(pp_records "$rate")" -1 "$(pp_warmup "$rate")"
        rp "$w" "$b" produce "$topic" "$(pp_records "$rate")" "$acks"
    done
    memory "$w"
    turn=$((turn + 1))
}

# Every topic is created and loaded (unmeasured) on every broker before anything is measured,
# so rows compare steady states. A just-created 1000-partition topic on Kafka runs at ~1000
# msg/s (about one 1 MiB produce request per second) for its first ~5-15 s of traffic, until
# each partition has taken some full batches; kaas shows no such phase, but gets the same
# treatment.
prime() { # BROKER TOPIC PARTITIONS SECONDS [extra kaas-bench args]
    local b="$1" topic="$2" parts="$3" secs="$4"; shift 4
    log "pre-loading $topic ($parts partitions) on $b for ${secs}s"
    timeout 180 "$bench_bin" produce --bootstrap "${addr[$b]}" --topic "$topic" \
        --partitions "$parts" --message-size 1024 --acks 1 --buffer-memory 4MiB \
        --warmup 0s --duration "${secs}s" --quiet "$@" \
        > "$res/prime.$b.$topic.txt" 2>&1 || log "  pre-loading $topic on $b failed, see $res/prime.$b.$topic.txt"
    grep -E '^produce' "$res/prime.$b.$topic.txt" | sed 's/^/    /' >&2 || true
}
for b in "${brokers[@]}"; do
    if has_workload produce-acks1 || has_workload produce-acksall || has_workload consume; then
        prime "$b" c-p100 100 3 "${p100_cfg[@]}"
    fi
    if has_workload e2e; then prime "$b" c-e2e 100 3; fi
    if has_workload produce-flush && [[ "$b" == kafka ]]; then
        prime "$b" c-p100-flush 100 3 --topic-config flush.messages=1
    fi
done

drop_topics() { # TOPIC... — on every broker, with Kafka's own TopicCommand (kaas serves DeleteTopics)
    local b t
    for b in "${brokers[@]}"; do
        for t in "$@"; do
            timeout 60 java -Xmx256m -cp "$kafka_libs/*" org.apache.kafka.tools.TopicCommand \
                --bootstrap-server "${addr[$b]}" --delete --if-exists --topic "$t" \
                > "$res/drop.$b.$t.txt" 2>&1 || log "  deleting $t on $b failed, see $res/drop.$b.$t.txt"
        done
    done
    sleep 2
}

echo "duration=$duration warmup=$warmup e2e_rate=$e2e_rate brokers=${brokers[*]} kafka=$kafka_version" \
    > "$res/params.txt"
: > "$res/memory.txt"
memory start

if has_workload produce-acks1; then
    produce_workload produce-acks1 c-p100 100 1 0
fi
if has_workload produce-acksall; then
    produce_workload produce-acksall c-p100 100 all 0
fi
if has_workload produce-flush && [[ " ${brokers[*]} " == *" kafka "* ]]; then
    # Like-for-like durability: Kafka fsyncs every append (flush.messages=1 on the topic).
    kb produce-flush kafka produce --topic c-p100-flush --partitions 100 --message-size 1024 \
        --acks all --topic-config flush.messages=1
    rate="$(kb_rate produce-flush kafka)"
    pp produce-flush kafka c-p100-flush all "$(pp_records "$rate")" -1 "$(pp_warmup "$rate")"
    memory produce-flush
fi
if has_workload consume; then
    # Reads what the produce workloads stored in c-p100 (from the log start).
    read -r -a bs <<< "$(order)"
    for b in "${bs[@]}"; do
        kb consume "$b" consume --topic c-p100 --partitions 100 --from earliest --warmup 0s
        kb consume-again "$b" consume --topic c-p100 --partitions 100 --from earliest --warmup 0s
    done
    for b in $(reverse "${bs[@]}"); do
        n="$(json_field "$res/consume.$b.kb.json" "d['consume']['expected_messages']")"
        cperf consume "$b" c-p100 "${n:-0}"
        rp consume "$b" consume c-p100 "${n:-0}"
    done
    memory consume
    turn=$((turn + 1))
fi
if has_workload e2e; then
    read -r -a bs <<< "$(order)"
    for b in "${bs[@]}"; do
        kb e2e "$b" e2e --topic c-e2e --partitions 100 --message-size 1024 --acks all \
            --rate "$e2e_rate"
    done
    for b in $(reverse "${bs[@]}"); do
        pp e2e "$b" c-e2e all $((e2e_rate * (duration + warmup))) "$e2e_rate" $((e2e_rate * warmup))
    done
    memory e2e
    turn=$((turn + 1))
fi
if has_workload partitions1000; then
    drop_topics c-p100 c-p100-flush c-e2e
    for b in "${brokers[@]}"; do prime "$b" c-p1000 1000 8 "${p1000_cfg[@]}"; done
    # Run twice: Kafka's first writes to 1000 partitions after ~30 s without traffic are slow
    # (see bench/README.md), the second run shows its steady state.
    produce_workload partitions1000 c-p1000 1000 1 1
fi
memory end

# ---- report -------------------------------------------------------------------------------------
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
notes+=("load average at start $load, at end $load_end")
machine="$(nproc) cores ($(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)), $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, kernel $(uname -r), disk $(df -h "$workdir" | awk 'NR==2{print $1" ("$2")"}')"
printf '%s\n' "${notes[@]}" > "$res/notes.txt"
python3 "$here/compare_table.py" "$res" --machine "$machine" --kafka-version "$kafka_version" \
    --kafka-heap "$kafka_heap" --shards "$shards" --duration "$duration" --warmup "$warmup" \
    --e2e-rate "$e2e_rate" > "$res/table.md"
cat "$res/table.md"
if [[ -n "$markdown" ]]; then cp "$res/table.md" "$markdown"; fi
log "results in $res"
