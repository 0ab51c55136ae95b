#!/usr/bin/env bash
# scripts/install-kube-apiserver.sh — build a real kube-apiserver (and get etcd) for the
# opt-in test of the kube Lease backend against a real apiserver (control/tests/lease_kube_real.rs,
# tests/test_kube_lease.py). Idempotent: when the binaries are already there it only says so.
#
#   kube-apiserver  built from the Go module proxy: k8s.io/kubernetes $KAAS_KUBE_VERSION
#                   (default 1.36.3) through a throwaway module that pins every k8s.io/*
#                   staging module to the matching v0.Y.Z (k8s.io/kubernetes' own go.mod
#                   replaces them with ./staging paths, so `go install ...@v` cannot build it).
#                   -> $KAAS_KUBE_DIR/kube-apiserver
#   etcd            Debian's etcd-server (3.4.x; kube-apiserver 1.36 runs on it) via apt-get,
#                   linked as $KAAS_KUBE_DIR/etcd.
#
# Cost on the project's 2-core machine (measured from an empty Go build cache, niced, while the
# machine was shared): ~14 s to download ~0.55 GB of modules, ~6 min to build (4.5 min CPU),
# ~2.2 GB of Go build cache ($(go env GOCACHE)); the binary is ~100 MB. A rerun with the
# cache warm takes seconds. Every Go step runs under `nice -n 19`.
#
# Environment:
#   KAAS_KUBE_DIR       where the binaries go, default $HOME/.cache/kaas/kube
#   KAAS_KUBE_VERSION   Kubernetes version, default 1.36.3 (needs Go >= 1.26)
#   KAAS_SKIP_APT=1     do not apt-get etcd-server (then etcd must already be on PATH)
#   KAAS_KUBE_KEEP_BUILD=1  keep the throwaway build module (default: removed after success)
set -euo pipefail

kube_dir="${KAAS_KUBE_DIR:-$HOME/.cache/kaas/kube}"
version="${KAAS_KUBE_VERSION:-1.36.3}"
version="${version#v}"
build_dir="$HOME/.cache/kaas/kube-apiserver-build"

log_name=install-kube-apiserver
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mkdir -p "$kube_dir"

# -- etcd ------------------------------------------------------------------------------------
if [[ ! -x "$kube_dir/etcd" ]]; then
    if ! command -v etcd >/dev/null; then
        [[ "${KAAS_SKIP_APT:-0}" == 1 ]] && { log "etcd missing and KAAS_SKIP_APT=1"; exit 1; }
        log "apt-get install etcd-server"
        export DEBIAN_FRONTEND=noninteractive
        retry apt-get update -qq
        retry apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
        # Debian enables an etcd service; on a machine with systemd it would hold port 2379.
        # Our runs use their own ports and data dirs, so that does not matter.
    fi
    ln -sf "$(command -v etcd)" "$kube_dir/etcd"
fi
log "etcd: $("$kube_dir/etcd" --version 2>/dev/null | head -1)"

# -- kube-apiserver --------------------------------------------------------------------------
if have_build "$kube_dir/kube-apiserver.version" "$version" kube-apiserver \
        "$kube_dir/kube-apiserver"; then
    exit 0
fi

begin_build "kube-apiserver $version in $build_dir"
kube_build "$version" "$build_dir" "$kube_dir" kube-apiserver
end_build "$kube_dir/kube-apiserver.version" "$version"
log "$("$kube_dir/kube-apiserver" --version)"
