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
