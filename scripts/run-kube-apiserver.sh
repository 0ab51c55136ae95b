#!/usr/bin/env bash
# scripts/run-kube-apiserver.sh — run a throwaway etcd + kube-apiserver on 127.0.0.1, for
# testing the kube Lease backend against the real API server (control/tests/lease_kube_real.rs).
#
#   scripts/run-kube-apiserver.sh [COMMAND ARGS...]
#
# Starts etcd and kube-apiserver (binaries from scripts/install-kube-apiserver.sh) on free
# loopback ports with everything in a fresh temporary directory: a CA and a serving cert for
# 127.0.0.1/localhost, a service-account signing key pair, and a static token whose user is in
# system:masters (authorization is RBAC, so that group may do everything). It waits (bounded)
# until /readyz answers ok, writes a kubeconfig, and then
#   - with COMMAND: runs it with KAAS_KUBE_APISERVER_KUBECONFIG (and KUBECONFIG) set to that
#     kubeconfig, stops everything and exits with COMMAND's status;
#   - without: prints `KAAS_KUBE_APISERVER_KUBECONFIG=<path>` (then URL, token and CA lines) on
#     stdout and waits until SIGTERM/SIGINT, or until KAAS_KUBE_MAX_SECONDS (default 3600)
#     have passed, or until etcd or the apiserver dies (exit 1).
# On every exit both processes are stopped (SIGTERM, then SIGKILL after 10 s) and the temporary
# directory is removed (KAAS_KUBE_KEEP=1 keeps it, for the logs). Both run under `nice -n 19`.
#
# Environment:
#   KAAS_KUBE_DIR            binaries, default $HOME/.cache/kaas/kube (kube-apiserver, etcd)
#   KAAS_KUBE_START_TIMEOUT  seconds to wait for etcd and then for /readyz, default 180 each
#   KAAS_KUBE_MAX_SECONDS    lifetime without COMMAND, default 3600
#   KAAS_KUBE_KEEP=1         keep the temporary directory (logs: etcd.log, kube-apiserver.log)
# Exit status: 3 when the binaries are missing, 1 when startup fails (logs tail on stderr).
set -euo pipefail

kube_dir="${KAAS_KUBE_DIR:-$HOME/.cache/kaas/kube}"
start_timeout="${KAAS_KUBE_START_TIMEOUT:-180}"
max_seconds="${KAAS_KUBE_MAX_SECONDS:-3600}"

log() { echo "run-kube-apiserver: $*" >&2; }

apiserver="$kube_dir/kube-apiserver"
etcd="$kube_dir/etcd"
[[ -x "$etcd" ]] || etcd="$(command -v etcd || true)"
if [[ ! -x "$apiserver" || -z "$etcd" || ! -x "$etcd" ]]; then
    log "kube-apiserver or etcd missing in $kube_dir: run scripts/install-kube-apiserver.sh"
    exit 3
fi

dir="$(mktemp -d "${TMPDIR:-/tmp}/kaas-kube.XXXXXX")"
etcd_pid=""
api_pid=""
cmd_pid=""

stop_pid() {  # stop_pid PID: TERM, wait up to 10 s, then KILL
    local pid="$1" i
    [[ -n "$pid" ]] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    stop_pid "$cmd_pid"
    stop_pid "$api_pid"
    stop_pid "$etcd_pid"
    if [[ "${KAAS_KUBE_KEEP:-0}" == 1 ]]; then
        log "kept $dir"
    else
        rm -rf "$dir"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

fail() {
    log "$*"
    for f in etcd.log kube-apiserver.log; do
        if [[ -s "$dir/$f" ]]; then
            log "--- last lines of $f"
            tail -n 25 "$dir/$f" >&2
        fi
    done
    exit 1
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
etcd_port="$(free_port)"
peer_port="$(free_port)"
api_port="$(free_port)"
while [[ "$peer_port" == "$etcd_port" ]]; do peer_port="$(free_port)"; done
while [[ "$api_port" == "$etcd_port" || "$api_port" == "$peer_port" ]]; do api_port="$(free_port)"; done

# -- credentials -----------------------------------------------------------------------------
# A CA and a leaf serving cert (not one self-signed cert: rustls refuses a CA certificate as
# the server's own certificate).
(
    cd "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=kaas-test-ca" \
        -keyout ca.key -out ca.crt \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
        -keyout apiserver.key -out apiserver.csr
    cat > apiserver.ext <<'EXT'
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default
EXT
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
        -extfile apiserver.ext -out apiserver.crt
    openssl genrsa -out sa.key 2048
    openssl rsa -in sa.key -pubout -out sa.pub
) >"$dir/openssl.log" 2>&1 || { cat "$dir/openssl.log" >&2; fail "openssl failed"; }
token="$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
echo "$token,kaas-test,kaas-test-uid,\"system:masters\"" > "$dir/tokens.csv"
chmod 600 "$dir"/*.key "$dir/tokens.csv"

# -- etcd ------------------------------------------------------------------------------------
nice -n 19 "$etcd" --name kaas-test --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "kaas-test=http://127.0.0.1:$peer_port" \
    --logger zap --log-level warn \
    >"$dir/etcd.log" 2>&1 &
etcd_pid=$!

deadline=$(( $(date +%s) + start_timeout ))
until curl -fsS --max-time 5 "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep -q '"health":"true"'; do
    kill -0 "$etcd_pid" 2>/dev/null || fail "etcd exited"
    (( $(date +%s) < deadline )) || fail "etcd not healthy within ${start_timeout}s"
    sleep 0.5
done
log "etcd $("$etcd" --version | head -1 | awk '{print $3}') on 127.0.0.1:$etcd_port"

# -- kube-apiserver --------------------------------------------------------------------------
# --endpoint-reconciler-type=none: the apiserver would otherwise keep trying to publish its
# loopback address as the endpoints of the `kubernetes` Service, which validation refuses.
# The service CIDR is only a setting here (no Service traffic is ever sent).
nice -n 19 "$apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --cert-dir "$dir/certs" \
    --tls-cert-file "$dir/apiserver.crt" --tls-private-key-file "$dir/apiserver.key" \
    --client-ca-file "$dir/ca.crt" \
    --token-auth-file "$dir/tokens.csv" \
    --authorization-mode RBAC \
    --service-account-issuer "https://kubernetes.default.svc" \
    --service-account-key-file "$dir/sa.pub" \
    --service-account-signing-key-file "$dir/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --endpoint-reconciler-type none \
    --profiling=false \
    --v 1 \
    >"$dir/kube-apiserver.log" 2>&1 &
api_pid=$!

url="https://127.0.0.1:$api_port"
deadline=$(( $(date +%s) + start_timeout ))
until [[ "$(curl -sS --max-time 5 --cacert "$dir/ca.crt" -H "Authorization: Bearer $token" \
            "$url/readyz" 2>/dev/null)" == ok ]]; do
    kill -0 "$api_pid" 2>/dev/null || fail "kube-apiserver exited"
    (( $(date +%s) < deadline )) || fail "kube-apiserver not ready within ${start_timeout}s"
    sleep 1
done
version="$(curl -sS --max-time 5 --cacert "$dir/ca.crt" -H "Authorization: Bearer $token" \
    "$url/version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["gitVersion"])' \
    2>/dev/null || echo '?')"
log "kube-apiserver $version ready at $url"

kubeconfig="$dir/kubeconfig"
cat > "$kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kaas-test
  cluster:
    server: $url
    certificate-authority: $dir/ca.crt
users:
- name: kaas-test
  user:
    token: $token
contexts:
- name: kaas-test
  context:
    cluster: kaas-test
    user: kaas-test
    namespace: default
current-context: kaas-test
EOF
chmod 600 "$kubeconfig"

if [[ $# -gt 0 ]]; then
    # In the background, so that a TERM to this script is handled at once (and stops COMMAND).
    KAAS_KUBE_APISERVER_KUBECONFIG="$kubeconfig" KUBECONFIG="$kubeconfig" "$@" &
    cmd_pid=$!
    status=0
    wait "$cmd_pid" || status=$?
    cmd_pid=""
    exit "$status"
fi

echo "KAAS_KUBE_APISERVER_KUBECONFIG=$kubeconfig"
echo "KAAS_KUBE_APISERVER_URL=$url"
echo "KAAS_KUBE_APISERVER_TOKEN=$token"
echo "KAAS_KUBE_APISERVER_CA=$dir/ca.crt"
deadline=$(( $(date +%s) + max_seconds ))
while (( $(date +%s) < deadline )); do
    kill -0 "$etcd_pid" 2>/dev/null || fail "etcd exited"
    kill -0 "$api_pid" 2>/dev/null || fail "kube-apiserver exited"
    sleep 1 &
    wait $! || true
done
log "stopping after KAAS_KUBE_MAX_SECONDS=$max_seconds"
