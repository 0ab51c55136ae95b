# scripts/lib.sh — helpers shared by the install scripts (sourced, not run).
# The sourcing script sets `log_name` first; `log` prefixes every line with it.

log() { echo "${log_name:-kaas}: $*" >&2; }

retry() {  # retry CMD...: three attempts with a pause, for registry hiccups
    local n
    for n in 1 2 3; do
        if "$@"; then return 0; fi
        log "attempt $n failed: $*"
        sleep $((n * 5))
    done
    return 1
}

# A component built with Go is stamped with the version it was built at, so that a rerun finds
# it. `have_build STAMP VERSION NAME BINARY...`: whether every BINARY is there and STAMP records
# VERSION (said in the log); `begin_build WHAT`: Go is needed, and the build starts;
# `end_build STAMP VERSION`: the stamp, once the build is in place, and the time it took.
have_build() {
    local stamp="$1" version="$2" name="$3" f
    shift 3
    for f in "$@"; do
        [[ -x "$f" ]] || return 1
    done
    [[ "$(cat "$stamp" 2>/dev/null)" == "$version" ]] || return 1
    log "$name $version present in $(dirname "$stamp")"
}

begin_build() {
    command -v go >/dev/null || { log "the Go toolchain is needed to build $1"; exit 1; }
    log "building $1"
    build_started=$(date +%s)
}

end_build() {
    echo "$2" > "$1"
    log "built in $(( $(date +%s) - build_started ))s"
}

# module_copy MODULE@VERSION DIR: a writable copy of a module's source from the Go module proxy
# in DIR (replaced if there), for a build that must change it first (the module cache is
# read-only).
module_copy() {
    local module_dir
    module_dir="$(cd / && retry go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
    [[ -d "$module_dir" ]] || { log "go mod download $1 gave no module directory"; return 1; }
    rm -rf "$2"
    cp -r "$module_dir" "$2"
    chmod -R u+w "$2"
}

# kube_build VERSION BUILD_DIR OUT_DIR CMD...: build k8s.io/kubernetes/cmd/CMD of Kubernetes
# VERSION (1.Y.Z) from the Go module proxy into OUT_DIR/CMD. k8s.io/kubernetes' own go.mod
# replaces its staging modules (k8s.io/api, ...) with ./staging paths, so `go install ...@v`
# cannot build it: a throwaway module in BUILD_DIR requires it and pins each staging module to
# the matching v0.Y.Z. The version is stamped as the release's own build stamps it. Every Go
# step runs under `nice -n 19`; BUILD_DIR is removed afterwards unless KAAS_KUBE_KEEP_BUILD=1.
kube_build() {
    local version="$1" build_dir="$2" out_dir="$3"
    shift 3
    rm -rf "$build_dir"
    mkdir -p "$build_dir"
    (
        cd "$build_dir"
        local staging_version="v0.${version#1.}" k8s_mod minor ldflags pkg cmd
        # the redirect inside the retried command: a failed attempt's error JSON must not stay
        # in front of the good one
        _download_json() { nice -n 19 go mod download -json "$1" > "$2"; }
        retry _download_json "k8s.io/kubernetes@v$version" kubernetes.json
        k8s_mod="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["GoMod"])' kubernetes.json)"
        {
            echo "module kaas.local/kube-build"
            echo
            grep -m1 '^go ' "$k8s_mod"
            echo
            echo "require k8s.io/kubernetes v$version"
            echo
            echo "replace ("
            sed -n '/^replace (/,/^)/p' "$k8s_mod" | grep '=> \./staging/' \
                | awk -v v="$staging_version" '{ print "\t" $1 " => " $1 " " v }'
            echo ")"
        } > go.mod
        {
            printf '//go:build tools\n\npackage tools\n\nimport (\n'
            for cmd in "$@"; do
                printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"
            done
            printf ')\n'
        } > tools.go
        retry nice -n 19 go mod tidy
        minor="${version#1.}"
        minor="${minor%%.*}"
        ldflags="-s -w"
        for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
            ldflags+=" -X $pkg.gitVersion=v$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
            ldflags+=" -X $pkg.gitTreeState=clean"
        done
        for cmd in "$@"; do
            nice -n 19 go build -trimpath -ldflags="$ldflags" -o "$out_dir/$cmd.tmp" \
                "k8s.io/kubernetes/cmd/$cmd"
            mv "$out_dir/$cmd.tmp" "$out_dir/$cmd"
        done
    )
    if [[ "${KAAS_KUBE_KEEP_BUILD:-0}" != 1 ]]; then
        rm -rf "$build_dir"
    fi
}
