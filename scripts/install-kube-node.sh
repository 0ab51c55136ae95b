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
#   prometheus-operator $KAAS_PROMETHEUS_OPERATOR_VERSION (default v0.85.0) from the module
#           proxy: its monitoring.coreos.com CRDs (example/prometheus-operator-crd/ ->
#           $KAAS_KUBE_DIR/crds/), the operator and its config reloader (built -> $KAAS_KUBE_DIR/
#           prometheus-operator, prometheus-config-reloader)
#   prometheus  Prometheus $KAAS_PROMETHEUS_VERSION (default 3.5.0) with Kubernetes service
#           discovery, built from the module proxy -> $KAAS_KUBE_DIR/prometheus
#   apt     containerd and runc (the container runtime), containernetworking-plugins (the CNI
#           bridge), busybox-static (the shell in the test images), iptables (kube-proxy)
#
# Cost on the project's 2-core machine, after install-kube-apiserver.sh filled the Go build
# cache: ~3 min for the five Kubernetes commands, ~3 min for CoreDNS, ~1.5 min each for
# prometheus-operator and Prometheus; ~600 MB of binaries.
# Every Go step runs under `nice -n 19`.
#
# Environment:
#   KAAS_KUBE_DIR          where the binaries go, default $HOME/.cache/kaas/kube
#   KAAS_KUBE_VERSION      Kubernetes version, default 1.36.3
#   KAAS_COREDNS_VERSION   default v1.15.0
#   KAAS_PROMETHEUS_OPERATOR_VERSION  default v0.85.0
#   KAAS_PROMETHEUS_VERSION           default 3.5.0
#   KAAS_SKIP_APT=1        do not apt-get (the packages must then be installed already)
set -euo pipefail

kube_dir="${KAAS_KUBE_DIR:-$HOME/.cache/kaas/kube}"
version="${KAAS_KUBE_VERSION:-1.36.3}"
version="${version#v}"
coredns_version="${KAAS_COREDNS_VERSION:-v1.15.0}"
prom_op_version="${KAAS_PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
# the newest Prometheus prometheus-operator v0.85.0 is tested with
prom_version="${KAAS_PROMETHEUS_VERSION:-3.5.0}"
prom_version="${prom_version#v}"
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
if ! have_build "$kube_dir/kube-node.version" "$version" "${commands[*]}" \
        "${commands[@]/#/$kube_dir/}"; then
    begin_build "${commands[*]} $version in $build_dir"
    kube_build "$version" "$build_dir" "$kube_dir" "${commands[@]}"
    end_build "$kube_dir/kube-node.version" "$version"
fi

# -- CoreDNS -----------------------------------------------------------------------------------
if ! have_build "$kube_dir/coredns.version" "$coredns_version" coredns "$kube_dir/coredns"; then
    begin_build "coredns $coredns_version"
    GOBIN="$kube_dir" retry nice -n 19 go install -trimpath -ldflags "-s -w" \
        "github.com/coredns/coredns@$coredns_version"
    end_build "$kube_dir/coredns.version" "$coredns_version"
fi

# -- prometheus-operator: its CRDs, the operator and its config reloader -----------------------
# The chart's monitoring objects are checked against the CRDs by a real API server (strict field
# validation), and the operator runs on the node: it turns the ServiceMonitor, PodMonitor and
# PrometheusRule into a Prometheus's configuration (tests/test_chart_on_kubernetes.py).
crd_dir="$kube_dir/crds"
if ! have_build "$kube_dir/prometheus-operator.version" "$prom_op_version" \
        "prometheus-operator (CRDs, operator, config reloader)" \
        "$kube_dir/prometheus-operator" "$kube_dir/prometheus-config-reloader"; then
    begin_build "prometheus-operator $prom_op_version"
    op_build="$HOME/.cache/kaas/prometheus-operator-build"
    module_copy "github.com/prometheus-operator/prometheus-operator@$prom_op_version" "$op_build"
    rm -rf "$crd_dir"
    mkdir -p "$crd_dir"
    cp "$op_build"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml "$crd_dir/"
    # The module's go.mod points its API and client modules at directories its module zip
    # leaves out; the proxy serves them as modules of their own at the same version.
    (
        cd "$op_build"
        go mod edit \
            -dropreplace=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring \
            -dropreplace=github.com/prometheus-operator/prometheus-operator/pkg/client
        CGO_ENABLED=0 GOFLAGS=-mod=mod retry nice -n 19 go build -trimpath -ldflags "-s -w" \
            -o "$op_build/bin/" ./cmd/operator ./cmd/prometheus-config-reloader
    )
    install -m 0755 "$op_build/bin/operator" "$kube_dir/prometheus-operator"
    install -m 0755 "$op_build/bin/prometheus-config-reloader" "$kube_dir/prometheus-config-reloader"
    rm -rf "$op_build"
    end_build "$kube_dir/prometheus-operator.version" "$prom_op_version"
fi

# -- Prometheus, for the operator to run -----------------------------------------------------------
# Debian's Prometheus is built without Kubernetes service discovery, which the operator's
# configurations use; this one has that alone among the discovery plugins (the others cost
# minutes of build). Prometheus X.Y.Z is Go module version v0.(100X+Y).Z.
prom_module_version="v0.$(( ${prom_version%%.*} * 100 + $(echo "$prom_version" | cut -d. -f2) )).${prom_version##*.}"
if ! have_build "$kube_dir/prometheus.version" "$prom_version" prometheus "$kube_dir/prometheus"; then
    begin_build "prometheus $prom_version (module $prom_module_version)"
    prom_build="$HOME/.cache/kaas/prometheus-build"
    module_copy "github.com/prometheus/prometheus@$prom_module_version" "$prom_build"
    printf 'package plugins\n\nimport _ "github.com/prometheus/prometheus/discovery/kubernetes"\n' \
        > "$prom_build/plugins/plugins.go"
    (
        cd "$prom_build"
        CGO_ENABLED=0 GOFLAGS=-mod=mod retry nice -n 19 go build -trimpath \
            -ldflags "-s -w -X github.com/prometheus/common/version.Version=$prom_version" \
            -o "$prom_build/prometheus" ./cmd/prometheus
    )
    install -m 0755 "$prom_build/prometheus" "$kube_dir/prometheus"
    rm -rf "$prom_build"
    end_build "$kube_dir/prometheus.version" "$prom_version"
fi
