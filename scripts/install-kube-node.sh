#!/usr/bin/env bash
# scripts/install-kube-node.sh — what a one-node Kubernetes needs besides the API server, for
# installing the Helm chart for real (tests/kube_node.py, tests/test_chart_on_kubernetes.py).
# Run after scripts/install-kube-apiserver.sh (etcd, kube-apiserver). Idempotent: when
# everything is there it only says so.
#
#   kubelet, kube-controller-manager, kube-scheduler, kube-proxy, kubectl
#           built from the Go module proxy: k8s.io/kubernetes $KAAS_KUBE_VERSION (the API
#           server's version, default 1.36.3), as the API server is (kube_build in
#           scripts/lib.sh) -> $KAAS_KUBE_DIR/
#   coredns CoreDNS $KAAS_COREDNS_VERSION (default v1.15.0), `go install` from the module proxy
#   crds    the monitoring.coreos.com CRDs (ServiceMonitor, PodMonitor, PrometheusRule) of
#           prometheus-operator $KAAS_PROMETHEUS_OPERATOR_VERSION (default v0.85.0), from its
#           module's example/prometheus-operator-crd/ through the module proxy -> $KAAS_KUBE_DIR/crds/
#   apt     containerd and runc (the container runtime), containernetworking-plugins (the CNI
#           bridge), busybox-static (the shell in the test images), iptables (kube-proxy)
#
# Cost on the project's 2-core machine, after install-kube-apiserver.sh filled the Go build
# cache: ~3 min for the five Kubernetes commands, ~3 min for CoreDNS; ~420 MB of binaries.
# Every Go step runs under `nice -n 19`.
#
# Environment:
#   KAAS_KUBE_DIR          where the binaries go, default $HOME/.cache/kaas/kube
#   KAAS_KUBE_VERSION      Kubernetes version, default 1.36.3
#   KAAS_COREDNS_VERSION   default v1.15.0
#   KAAS_PROMETHEUS_OPERATOR_VERSION  default v0.85.0
#   KAAS_SKIP_APT=1        do not apt-get (the packages must then be installed already)
set -euo pipefail

kube_dir="${KAAS_KUBE_DIR:-$HOME/.cache/kaas/kube}"
version="${KAAS_KUBE_VERSION:-1.36.3}"
version="${version#v}"
coredns_version="${KAAS_COREDNS_VERSION:-v1.15.0}"
prom_op_version="${KAAS_PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
build_dir="$HOME/.cache/kaas/kube-node-build"
commands=(kubelet kube-controller-manager kube-scheduler kube-proxy kubectl)

log_name=install-kube-node
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mkdir -p "$kube_dir"

# -- Debian packages ---------------------------------------------------------------------------
need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
/bin/busybox --list 2>/dev/null | grep -qx sh || need+=(busybox-static)
command -v iptables >/dev/null || need+=(iptables)
if [[ ${#need[@]} -gt 0 ]]; then
    [[ "${KAAS_SKIP_APT:-0}" == 1 ]] && { log "missing ${need[*]} and KAAS_SKIP_APT=1"; exit 1; }
    log "apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    retry apt-get update -qq
    retry apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # Debian starts a containerd service where systemd runs; the tests start their own, with
    # their own socket and directories, so it does not matter.
fi

# -- the Kubernetes commands -----------------------------------------------------------------------
present=1
for c in "${commands[@]}"; do
    [[ -x "$kube_dir/$c" ]] || present=0
done
if [[ $present == 1 && "$(cat "$kube_dir/kube-node.version" 2>/dev/null)" == "$version" ]]; then
    log "${commands[*]} $version present in $kube_dir"
else
    command -v go >/dev/null || { log "the Go toolchain is needed to build ${commands[*]}"; exit 1; }
    log "building ${commands[*]} $version in $build_dir"
    start=$(date +%s)
    kube_build "$version" "$build_dir" "$kube_dir" "${commands[@]}"
    echo "$version" > "$kube_dir/kube-node.version"
    log "built in $(( $(date +%s) - start ))s"
fi

# -- CoreDNS -----------------------------------------------------------------------------------
if [[ -x "$kube_dir/coredns" && "$(cat "$kube_dir/coredns.version" 2>/dev/null)" == "$coredns_version" ]]; then
    log "coredns $coredns_version present in $kube_dir"
else
    command -v go >/dev/null || { log "the Go toolchain is needed to build coredns"; exit 1; }
    log "building coredns $coredns_version"
    start=$(date +%s)
    GOBIN="$kube_dir" retry nice -n 19 go install -trimpath -ldflags "-s -w" \
        "github.com/coredns/coredns@$coredns_version"
    echo "$coredns_version" > "$kube_dir/coredns.version"
    log "built in $(( $(date +%s) - start ))s"
fi

# -- the prometheus-operator CRDs --------------------------------------------------------------
# The chart's monitoring objects are checked against these by a real API server (strict field
# validation), not only rendered.
crd_dir="$kube_dir/crds"
crds=(servicemonitors podmonitors prometheusrules)
if [[ "$(cat "$crd_dir/version" 2>/dev/null)" == "$prom_op_version" ]]; then
    log "prometheus-operator $prom_op_version CRDs present in $crd_dir"
else
    command -v go >/dev/null || { log "the Go toolchain is needed to fetch the CRDs"; exit 1; }
    log "fetching the prometheus-operator $prom_op_version CRDs"
    module_dir="$(cd / && retry go mod download -json \
        "github.com/prometheus-operator/prometheus-operator@$prom_op_version" \
        | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
    [[ -d "$module_dir" ]] || { log "go mod download gave no module directory"; exit 1; }
    mkdir -p "$crd_dir"
    for c in "${crds[@]}"; do
        cp "$module_dir/example/prometheus-operator-crd/monitoring.coreos.com_$c.yaml" "$crd_dir/"
    done
    echo "$prom_op_version" > "$crd_dir/version"
fi
