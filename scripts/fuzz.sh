#!/usr/bin/env bash
# scripts/fuzz.sh — coverage-guided fuzzing of request decoding and record-batch verification
# (fuzz/, cargo-fuzz with libFuzzer and AddressSanitizer on the nightly toolchain).
#
#   scripts/fuzz.sh              each target for KAAS_FUZZ_SECONDS (default 30; 600 with
#                                KAAS_LONG_TESTS=1)
#   scripts/fuzz.sh request      one target
#
# Each run starts from the committed seeds (fuzz/seeds/<target>, frames captured from real
# clients by fuzz/capture_seeds.py) plus the corpus earlier runs grew under
# $HOME/.cache/kaas-fuzz/corpus. A crash, a leak, an out-of-memory or a timeout fails the run;
# the input is kept under $HOME/.cache/kaas-fuzz/artifacts/<target>/ — reproduce it with
#   cd fuzz && cargo +nightly fuzz run -O <target> <file>
# and turn it into a regression test beside the code it broke (see wire/src/codec.rs).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo/fuzz"
export CARGO_TARGET_DIR="${KAAS_FUZZ_TARGET_DIR:-$HOME/.cache/kaas-fuzz-target}"
long="${KAAS_LONG_TESTS:-0}"
seconds="${KAAS_FUZZ_SECONDS:-$([[ "$long" != 0 ]] && echo 600 || echo 30)}"
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(request record_batch)
cache="$HOME/.cache/kaas-fuzz"

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz: the nightly Rust toolchain is missing (rustup toolchain install nightly)" >&2
    exit 1
fi
command -v cargo-fuzz >/dev/null || { echo "fuzz: cargo-fuzz is missing (scripts/install-test-deps.sh installs it)" >&2; exit 1; }

cargo +nightly fuzz build -O 2>&1 | tail -3
status=0
for t in "${targets[@]}"; do
    mkdir -p "$cache/corpus/$t" "$cache/artifacts/$t"
    echo "fuzz: $t for ${seconds}s"
    # -rss_limit_mb: a decoder that allocates what an attacker declares fails the run.
    rc=0
    cargo +nightly fuzz run -O "$t" "$cache/corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
        -artifact_prefix="$cache/artifacts/$t/" >"$cache/$t.log" 2>&1 || rc=$?
    grep -E "^#[0-9]+\s+DONE|^Done" "$cache/$t.log" || true
    if [[ $rc -ne 0 ]]; then
        grep -E "==[0-9]+==|SUMMARY|panicked|Test unit written" -A3 "$cache/$t.log" | head -40 >&2
        echo "fuzz: $t FAILED (exit $rc); the input is in $cache/artifacts/$t/, the log in $cache/$t.log" >&2
        status=1
    fi
done
exit $status
