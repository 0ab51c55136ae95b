#!/usr/bin/env bash
# scripts/test.sh — the one command that tests kaas (the README's test command).
#
#   1. cargo fmt --all -- --check
#   2. cargo clippy --workspace --all-targets -- -D warnings
#   3. cargo test --workspace
#   4. scripts/fuzz.sh           (each fuzz target for 30 s; 600 s with KAAS_LONG_TESTS=1)
#   5. cargo build --release -p kaas -p kaas-bench -p kaas-lazyfs
#   6. python3 -m pytest tests (real clients against the kaas binary; KAAS_BIN is set), as two
#      processes side by side: the client projects' own suites and the Kubernetes node, which
#      take fixed ports and machine-wide resources (`-m "suite or machine"`), and everything
#      else. Most tests wait on clients, timeouts and faults: one process keeps the two cores
#      about 30% busy and takes about 35 minutes, two take about 22. Each keeps its
#      temporary directories (broker logs, the suites' own logs) under $KAAS_TEST_TMP until the
#      next run, so a failure can be read after the run.
#
# Every step runs even if an earlier check failed (except that the client suites need the
# release build); the exit code is non-zero if any step failed, and a summary is printed.
#
# Environment:
#   CARGO_TARGET_DIR   default $HOME/.cache/kaas-target
#   KAAS_LONG_TESTS=1  also run the 1-million-message round trip
#   KAAS_TEST_MESSAGES messages per client suite (default 100000)
#   PYTEST_ARGS        extra pytest arguments for both processes (e.g. "-k librdkafka -x"; not -m)
#   KAAS_PYTEST_SPLIT=0   one pytest process (step 6) instead of two
#   KAAS_TEST_TMP      where step 6 keeps its temporary directories (default
#                      ${TMPDIR:-/tmp}/kaas-pytest; emptied at the start of each run)
#   KAAS_SKIP_CARGO_CHECKS=1  skip steps 1-3 (quick local iteration on the client suites)
# Needs the tools from scripts/install-test-deps.sh.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaas-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

summary=()
failed=0
step() {  # step NAME CMD...
    local name="$1"; shift
    echo
    echo "==> $name: $*"
    local t0=$SECONDS rc=0
    "$@" || rc=$?
    local dt=$((SECONDS - t0))
    if [[ $rc -eq 0 ]]; then
        summary+=("ok      ${dt}s  $name")
    else
        summary+=("FAILED  ${dt}s  $name (exit $rc)")
        failed=1
    fi
    return $rc
}

if [[ "${KAAS_SKIP_CARGO_CHECKS:-0}" != 1 ]]; then
    step "rustfmt" cargo fmt --all -- --check
    step "clippy" cargo clippy --workspace --all-targets -- -D warnings
    step "cargo test" cargo test --workspace
    step "fuzz" bash scripts/fuzz.sh
fi

# pytest exits 5 when its selection is empty (a PYTEST_ARGS -k that leaves one half nothing).
pytest_status() {
    local rc=$1
    [[ $rc == 5 ]] && rc=0
    echo "$rc"
}

run_pytest() {
    # pytest's own temporary root keeps only its three newest runs, and the client suites'
    # nested pytest runs count among them: a failure's broker logs were gone by the end of the
    # run. An explicit --basetemp per process is kept until the next run.
    local tmp_root="${KAAS_TEST_TMP:-${TMPDIR:-/tmp}/kaas-pytest}"
    mkdir -p "$tmp_root"
    echo "(temporary directories and broker logs: $tmp_root)"
    if [[ "${KAAS_PYTEST_SPLIT:-1}" == 0 ]]; then
        # shellcheck disable=SC2086
        python3 -m pytest tests -q --durations=25 --basetemp "$tmp_root/all" ${PYTEST_ARGS:-}
        return
    fi
    # The suites bind fixed ports (kafka-go 9092, sarama's proxies 29091-29095, toxiproxy 8474)
    # and the Kubernetes node takes the kubelet directory and a bridge; every other test takes
    # free ports and its own directories, so the two halves cannot collide.
    local suites_log rc_suites=0 rc_rest=0 pid
    suites_log="$tmp_root/suites.log"
    # shellcheck disable=SC2086
    python3 -m pytest tests -q --durations=10 --basetemp "$tmp_root/suites" -m "suite or machine" \
        ${PYTEST_ARGS:-} >"$suites_log" 2>&1 &
    pid=$!
    echo "(the client projects' suites and the Kubernetes node run beside these tests; their output follows)"
    # shellcheck disable=SC2086
    python3 -m pytest tests -q --durations=25 --basetemp "$tmp_root/rest" \
        -m "not suite and not machine" \
        ${PYTEST_ARGS:-} || rc_rest=$?
    wait "$pid" || rc_suites=$?
    echo
    echo "==> the client projects' suites and the Kubernetes node (pytest -m \"suite or machine\")"
    cat "$suites_log"
    rc_rest=$(pytest_status "$rc_rest")
    rc_suites=$(pytest_status "$rc_suites")
    [[ $rc_rest == 0 && $rc_suites == 0 ]]
}

built=0
step "release build" cargo build --release -p kaas -p kaas-bench -p kaas-lazyfs && built=1

if [[ $built == 1 ]]; then
    export KAAS_BIN="$CARGO_TARGET_DIR/release/kaas"
    tp="$(mktemp)"
    export KAAS_THROUGHPUT_FILE="$tp"
    # --durations: the slowest tests, to keep the whole run within its 30-minute budget.
    step "client suites (pytest)" run_pytest
    if [[ -s "$tp" ]]; then
        echo
        echo "==> measured throughput"
        cat "$tp"
    fi
    rm -f "$tp"
else
    summary+=("SKIPPED      client suites (no release build)")
fi

echo
echo "==> summary"
printf '  %s\n' "${summary[@]}"
exit $failed
