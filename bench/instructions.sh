#!/usr/bin/env bash
# Instructions per proxied request, counted by valgrind (callgrind), for one or more bearerd
# binaries: a measure of bearerd's own work that the shared machine's noise does not move
# (repeat runs agree within ~0.1 %), for A/B comparisons of a change before the wall-clock
# bench (run.sh). It counts user-space instructions only: system calls, wake-ups and cache
# misses are not in it, so it complements run.sh, never replaces it.
#
#   bash bench/instructions.sh [BINARY ...]     default: .build/release/bearerd
#   DURATION=8 CONNS=16 bash bench/instructions.sh old/bearerd new/bearerd
#
# For each binary: a copy without debug information (valgrind cannot read the static
# binary's DWARF) runs under callgrind against a local nginx origin with a client_credentials
# session, once with no load (start-up) and once under `wrk -c$CONNS -d$DURATION`; the
# difference of the instruction totals over the requests served is printed, with the ratio
# to the first binary. Under valgrind bearerd is ~50x slower, so batches are smaller than in
# run.sh and the per-request figure includes more per-event overhead; compare binaries, not
# this number with run.sh's CPU time. The callgrind profiles are kept in the temp directory
# (KEEP=1) for `callgrind_annotate`.
set -euo pipefail

DURATION=${DURATION:-8}
CONNS=${CONNS:-16}
KEEP=${KEEP:-0}
PORT=18180
ORIGIN_PORT=18181
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

log() { printf '[instructions] %s\n' "$*" >&2; }
die() { printf '[instructions] error: %s\n' "$*" >&2; exit 1; }

case "$DURATION" in ''|*[!0-9]*|0) die "DURATION must be a positive integer (seconds)" ;; esac
case "$CONNS" in ''|*[!0-9]*|0) die "CONNS must be a positive integer" ;; esac
if [ "$#" -eq 0 ]; then set -- "$REPO/.build/release/bearerd"; fi
for b in "$@"; do [ -x "$b" ] || die "not an executable: $b (build with: swift build -c release --static-swift-stdlib --product bearerd)"; done

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v wrk >/dev/null || missing+=(wrk)
command -v curl >/dev/null || missing+=(curl)
command -v strip >/dev/null || missing+=(binutils)
NGINX=$(command -v nginx 2>/dev/null || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; } || true)
[ -n "$NGINX" ] || missing+=(nginx-light)
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >&2 || {
        as_root apt-get update >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >&2
    }
    NGINX=$(command -v nginx 2>/dev/null || echo /usr/sbin/nginx)
fi

WORK=$(mktemp -d /tmp/bearerd-instructions.XXXXXX)
BEARERD_PID=""
cleanup() {
    [ -n "$BEARERD_PID" ] && kill -INT "$BEARERD_PID" 2>/dev/null || true
    [ -f "$WORK/origin/nginx.pid" ] && kill "$(cat "$WORK/origin/nginx.pid")" 2>/dev/null || true
    if [ "$KEEP" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM

mkdir -p "$WORK/origin/tmp" "$WORK/state"
cat >"$WORK/origin/nginx.conf" <<EOF
pid $WORK/origin/nginx.pid;
error_log $WORK/origin/error.log warn;
worker_processes 1;
events { worker_connections 1024; }
http {
    access_log off; keepalive_requests 10000000; keepalive_timeout 300s;
    client_body_temp_path $WORK/origin/tmp/b; proxy_temp_path $WORK/origin/tmp/p;
    fastcgi_temp_path $WORK/origin/tmp/f; uwsgi_temp_path $WORK/origin/tmp/u; scgi_temp_path $WORK/origin/tmp/s;
    server {
        listen 127.0.0.1:$ORIGIN_PORT;
        location = /small { default_type text/plain; return 200 "$(printf 'x%.0s' $(seq 100))"; }
        location = /token { default_type application/json; return 200 '{"access_token":"instructions-token","token_type":"Bearer","expires_in":3600}'; }
    }
}
EOF
"$NGINX" -p "$WORK/origin" -c "$WORK/origin/nginx.conf"
cat >"$WORK/bearerd.yaml" <<EOF
listen: [127.0.0.1:$PORT]
state_dir: $WORK/state
sessions:
  bench:
    grant: client_credentials
    token_url: http://127.0.0.1:$ORIGIN_PORT/token
    client_id: bench
    client_secret: bench-secret
routes:
  - match: /
    upstream: http://127.0.0.1:$ORIGIN_PORT
    session: bench
EOF

# count BINARY idle|load N: sets REQUESTS and INSTRUCTIONS for one callgrind run.
count() {
    local bin=$1 load=$2 out="$WORK/cg.$3.$2"
    valgrind --tool=callgrind --callgrind-out-file="$out.%p" "$bin" run -c "$WORK/bearerd.yaml" --no-access-log \
        >"$WORK/valgrind.log" 2>&1 &
    BEARERD_PID=$!
    local i
    for i in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$PORT/small" && break; sleep 0.2; done
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/small" || die "bearerd did not answer under valgrind (see $WORK/valgrind.log; KEEP=1)"
    local requests=0
    if [ "$load" = load ]; then
        requests=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$PORT/small" | awk '/requests in/ {print $1}')
    fi
    kill -INT "$BEARERD_PID"
    wait "$BEARERD_PID" 2>/dev/null || true
    BEARERD_PID=""
    REQUESTS=$requests
    INSTRUCTIONS=$(grep -h '^totals:\|^summary:' "$out".* | head -1 | awk '{print $2}')
    [ -n "$INSTRUCTIONS" ] || die "no callgrind totals for $bin (see $WORK/valgrind.log; KEEP=1)"
}

first=""
n=0
printf '%-40s %10s %14s %8s\n' binary requests "instr/request" ratio
for b in "$@"; do
    n=$((n + 1))
    mkdir -p "$WORK/bin.$n"
    s="$WORK/bin.$n/bearerd"  # named bearerd: the process shows as `bearerd run`
    strip --strip-debug -o "$s" "$b"
    count "$s" idle "$n"
    base=$INSTRUCTIONS
    count "$s" load "$n"
    requests=$REQUESTS loaded=$INSTRUCTIONS
    [ "${requests:-0}" -gt 0 ] || die "no requests served under load for $b"
    per=$(( (loaded - base) / requests ))
    [ -n "$first" ] || first=$per
    printf '%-40s %10d %14d %7.3fx\n' "$b" "$requests" "$per" "$(awk -v a="$per" -v b="$first" 'BEGIN{print a/b}')"
done
