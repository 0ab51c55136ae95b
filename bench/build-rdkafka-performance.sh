#!/usr/bin/env bash
# bench/build-rdkafka-performance.sh — librdkafka's own benchmark client, rdkafka_performance,
# built from the librdkafka source that the `rdkafka-sys` crate ships (crates.io), and printed
# as a path. A client neither kaas nor Apache Kafka wrote: bench/compare.sh runs it as its third
# client.
#
# The crate is fetched with `cargo vendor` into a scratch project, and the build is cached in
# ~/.cache/kaas/rdkafka-performance/<version>/ (a second call prints the path at once).
# Needs a C compiler and make (Debian: build-essential); the optional codecs and SASL/TLS are
# left out, as the benchmark uses none of them.
set -euo pipefail

version="${RDKAFKA_SYS_VERSION:-4.10.0+2.12.1}"
cache="$HOME/.cache/kaas/rdkafka-performance/$version"
bin="$cache/librdkafka/examples/rdkafka_performance"
if [[ -x "$bin" ]]; then echo "$bin"; exit 0; fi

mkdir -p "$cache"
scratch="$cache/vendor-project"
rm -rf "$scratch" "$cache/librdkafka"
mkdir -p "$scratch/src"
cat > "$scratch/Cargo.toml" <<EOF
[package]
name = "fetch-rdkafka-sys"
version = "0.0.0"
edition = "2021"
[dependencies]
rdkafka-sys = "=$version"
[workspace]
EOF
echo 'fn main() {}' > "$scratch/src/main.rs"
(cd "$scratch" && cargo vendor --quiet vendor > /dev/null) \
    || { echo "build-rdkafka-performance.sh: cargo vendor of rdkafka-sys $version failed" >&2; exit 1; }
src="$(find "$scratch/vendor" -maxdepth 1 -type d -name 'rdkafka-sys*' | head -1)/librdkafka"
[[ -f "$src/configure" ]] || { echo "build-rdkafka-performance.sh: no librdkafka source in $src" >&2; exit 1; }
cp -r "$src" "$cache/librdkafka"
rm -rf "$scratch"
cd "$cache/librdkafka"
chmod +x configure lds-gen.py 2>/dev/null || true
./configure --disable-curl --disable-sasl --disable-lz4-ext --disable-ssl --disable-gssapi \
    --disable-zstd > "$cache/configure.log" 2>&1 \
    || { tail -20 "$cache/configure.log" >&2; exit 1; }
make -j"$(nproc)" libs > "$cache/make.log" 2>&1 || { tail -20 "$cache/make.log" >&2; exit 1; }
make -C examples rdkafka_performance >> "$cache/make.log" 2>&1 || { tail -20 "$cache/make.log" >&2; exit 1; }
[[ -x "$bin" ]] || { echo "build-rdkafka-performance.sh: $bin was not built" >&2; exit 1; }
echo "$bin"
