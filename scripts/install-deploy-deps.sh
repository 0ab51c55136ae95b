#!/usr/bin/env bash
# scripts/install-deploy-deps.sh — install what tests/test_deploy.py needs, on a fresh Debian
# machine, as root. Idempotent: a rerun finds the cached binary and the installed package.
#
#   helm                 built from the Go module proxy (helm.sh/helm/v3, pinned below) into
#                        $HOME/.cache/kaas/helm-<version>/helm; needs Go (apt golang-go if absent;
#                        GOTOOLCHAIN=auto fetches a newer toolchain as a Go module when needed)
#   kubernetes-validate  from PyPI (offline Kubernetes JSON schemas)
#
# Writes $HOME/.cache/kaas/deploy-deps.env (KAAS_HELM=...), which the tests read: once this
# script has run, a missing tool is a test failure, not a skip.
# Environment: KAAS_SKIP_APT=1 skips apt-get.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

HELM_VERSION=v3.22.0
# helm's Makefile stamps the Kubernetes version it assumes offline (client-go's minor + 1.0 -> 1.N)
# and its own version; `go install` alone would leave v1.20 and an empty version.
HELM_K8S_MINOR=37
KUBERNETES_VALIDATE_VERSION=1.37.0

cache="${HOME}/.cache/kaas"
helm_dir="$cache/helm-$HELM_VERSION"
helm_bin="$helm_dir/helm"
mkdir -p "$cache"

log_name=install-deploy-deps
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# -- helm ---------------------------------------------------------------------------------------
if [[ -x "$helm_bin" ]] && "$helm_bin" version --short 2>/dev/null | grep -q "^$HELM_VERSION"; then
    log "helm $HELM_VERSION present ($helm_bin)"
else
    if ! command -v go >/dev/null; then
        for d in /usr/local/go/bin /usr/lib/go/bin; do
            [[ -x "$d/go" ]] && export PATH="$d:$PATH" && break
        done
    fi
    if ! command -v go >/dev/null; then
        if [[ "${KAAS_SKIP_APT:-0}" == 1 ]]; then
            log "no Go toolchain and KAAS_SKIP_APT=1"; exit 1
        fi
        log "apt-get install golang-go"
        retry apt-get update -qq
        retry apt-get install -y -qq --no-install-recommends golang-go ca-certificates git >/dev/null
    fi
    log "building helm $HELM_VERSION with $(go version) (a few minutes the first time)"
    tmp="$helm_dir.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    for p in pkg/lint/rules pkg/chartutil; do
        ldflags+=" -X helm.sh/helm/v3/$p.k8sVersionMajor=1 -X helm.sh/helm/v3/$p.k8sVersionMinor=$HELM_K8S_MINOR"
    done
    # GOTOOLCHAIN=auto: an older Go fetches the toolchain helm's go.mod asks for (as a Go module).
    retry env GOBIN="$tmp" GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=auto \
        nice go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    rm -rf "$helm_dir"
    mv "$tmp" "$helm_dir"
    "$helm_bin" version --short
fi

# -- kubernetes-validate ---------------------------------------------------------------------------
if python3 -c "import sys; from importlib.metadata import version; sys.exit(version('kubernetes-validate') != '$KUBERNETES_VALIDATE_VERSION')" 2>/dev/null; then
    log "kubernetes-validate $KUBERNETES_VALIDATE_VERSION present"
else
    pip_flags=(-q --disable-pip-version-check --root-user-action=ignore)
    if python3 -c 'import sys; sys.exit(0 if sys.prefix == sys.base_prefix else 1)' \
       && [[ -e "$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED" ]]; then
        pip_flags+=(--break-system-packages)
    fi
    log "pip install kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    retry python3 -m pip install "${pip_flags[@]}" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
python3 -m kubernetes_validate --version >/dev/null 2>&1 || command -v kubernetes-validate >/dev/null \
    || { log "kubernetes-validate is not runnable"; exit 1; }

echo "KAAS_HELM=$helm_bin" > "$cache/deploy-deps.env"
log "done (helm: $helm_bin)"
