#!/usr/bin/env bash
# scripts/install-test-deps.sh — install what the kaas test suites need on a fresh Debian
# machine, as root. Idempotent: a rerun only checks that everything is in place.
#
#   apt:    kcat (librdkafka CLI), maven + a JDK (for the Java client and Kafka tools),
#           python3/pip if missing, curl, build essentials for cargo, fuse3 (kaas-lazyfs),
#           prometheus (its promtool checks /metrics)
#   PyPI:   tests/requirements.txt (pytest, kafka-python, confluent-kafka, requests, ...)
#   Maven:  Apache Kafka 4.x jars into $HOME/.cache/kaas/kafka-libs (scripts/fetch-kafka.sh)
#   Rust:   rustfmt and clippy components, when rustup is present
#   Go:     helm (scripts/install-deploy-deps.sh), kube-apiserver and the rest of a one-node
#           Kubernetes with prometheus-operator and Prometheus (scripts/install-kube-node.sh),
#           the kgo (franz-go) and
#           kafka-go test binaries, sarama's functional test binary and toxiproxy
#   C:      librdkafka's test-runner (its tests/ suite), built from the rdkafka-sys crate's source
#
# Environment: KAAS_SKIP_APT=1 skips apt-get (e.g. when not root).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
export DEBIAN_FRONTEND=noninteractive

log_name=install-test-deps
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# -- Debian packages --------------------------------------------------------------------------
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
need=()
installed kcat || need+=(kcat)
# tools that may come from elsewhere on the image (pyenv python, a JDK under /usr/lib/jvm, ...)
command -v mvn >/dev/null || need+=(maven)
{ command -v java >/dev/null && command -v javac >/dev/null; } || need+=(default-jdk-headless)
command -v python3 >/dev/null || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
command -v curl >/dev/null || need+=(curl ca-certificates)
command -v cc >/dev/null || need+=(build-essential pkg-config)
# librdkafka's test suite is built from source (tests/suites/librdkafka.py)
command -v c++ >/dev/null || need+=(g++)
installed libssl-dev || need+=(libssl-dev)
installed zlib1g-dev || need+=(zlib1g-dev)
# the full-disk tests mount a small ext4 loop volume (tests/test_full_disk.py)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v losetup >/dev/null || need+=(mount)
# the power-loss test mounts kaas-lazyfs (tests/test_power_loss.py): the daemon mounts with
# mount(2) as root, fusermount3 is the fallback and the tool to detach a dead mount by hand
command -v fusermount3 >/dev/null || need+=(fuse3)
# promtool checks the health endpoint's /metrics text (tests/test_http_endpoints.py); Debian
# ships it in the prometheus package, whose server the tests never start
command -v promtool >/dev/null || need+=(prometheus)

if [[ ${#need[@]} -gt 0 && "${KAAS_SKIP_APT:-0}" != 1 ]]; then
    log "apt-get install ${need[*]}"
    retry apt-get update -qq
    retry apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
    log "Debian packages present"
fi
command -v kcat >/dev/null || { log "kcat still missing"; exit 1; }

# -- Python packages --------------------------------------------------------------------------
pip_flags=(-q --disable-pip-version-check --root-user-action=ignore)
# Debian's own python refuses system-wide pip installs unless told otherwise
if python3 -c 'import sys; sys.exit(0 if sys.prefix == sys.base_prefix else 1)' \
   && [[ -e "$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED" ]]; then
    pip_flags+=(--break-system-packages)
fi
if python3 - "$repo/tests/requirements.txt" <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
ok = True
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, _, want = line.partition("==")
    try:
        if version(name) != want:
            ok = False
    except PackageNotFoundError:
        ok = False
sys.exit(0 if ok else 1)
PY
then
    log "Python packages present"
else
    log "pip install -r tests/requirements.txt"
    retry python3 -m pip install "${pip_flags[@]}" -r "$repo/tests/requirements.txt"
fi

# -- Rust components used by scripts/test.sh ------------------------------------------------
if command -v rustup >/dev/null; then
    for c in rustfmt clippy; do
        rustup component list --installed 2>/dev/null | grep -q "^$c" \
            || retry rustup component add "$c"
    done
fi
# cargo-fuzz for scripts/fuzz.sh (its targets build with the nightly toolchain the machines carry)
if ! command -v cargo-fuzz >/dev/null; then
    log "cargo install cargo-fuzz"
    retry cargo install cargo-fuzz --locked --version 0.13.2 >/dev/null 2>&1
fi

# -- Apache Kafka jars --------------------------------------------------------------------------
libs="$(retry "$here/fetch-kafka.sh")"
log "Kafka jars in $libs ($(cat "$libs/.kafka-version" 2>/dev/null || echo '?'))"
# A real kube-apiserver (built from the Go module proxy, with Debian's etcd) for the kube
# Lease backend's test (tests/test_kube_lease.py); ~6.5 min the first time, seconds after.
"$here/install-kube-apiserver.sh"
# The rest of a one-node Kubernetes (kubelet, controller-manager, scheduler, kube-proxy, kubectl,
# CoreDNS; containerd and runc from Debian) for installing the chart for real
# (tests/test_chart_on_kubernetes.py); ~6 min the first time after the API server, seconds after.
"$here/install-kube-node.sh"
# helm and kubernetes-validate for the chart's tests (tests/test_deploy.py).
bash "$here/install-deploy-deps.sh"
# franz-go's kgo test binary for the client-suite ratchet (tests/test_client_suites.py):
# module source from the Go module proxy, built once into ~/.cache/kaas/suites.
python3 "$repo/tests/suites/franz_go.py"
# segmentio/kafka-go's test binary, the same way (tests/suites/kafka_go.py).
python3 "$repo/tests/suites/kafka_go.py"
# IBM/sarama's functional test binary and Shopify's toxiproxy server (tests/suites/sarama.py).
python3 "$repo/tests/suites/sarama.py"
# kafka-python's own integration suite (tests/test_suite_kafka_python.py): its PyPI sdist,
# extracted into ~/.cache/kaas/suites with its codec libraries beside it.
python3 "$repo/tests/suites/kafka_python.py"
# librdkafka's own test suite (tests/test_suite_librdkafka.py): the source vendored in the
# rdkafka-sys crate, built once into ~/.cache/kaas/suites (~4 min the first time).
python3 "$repo/tests/suites/librdkafka.py"
log "done"
