#!/usr/bin/env bash
# Instructions per proxied request, per new connection and per 1 MiB response, counted by
# valgrind (callgrind), for one or more bearerd binaries (and nginx doing the same job): a
# measure of the proxy's own work that the shared machine's noise does not move (repeat runs
# agree within ~0.1 %), for A/B comparisons of a change before the wall-clock bench (run.sh).
# It counts user-space instructions only: system calls, wake-ups and cache misses are not in
# it, so it complements run.sh, never replaces it.
#
#   bash bench/instructions.sh [BINARY ...]     default: .build/release/bearerd
#   DURATION=8 CONNS=16 bash bench/instructions.sh old/bearerd new/bearerd
#   bash bench/instructions.sh nginx .build/release/bearerd    # nginx as the reference row
#   SCENARIOS=keepalive bash bench/instructions.sh             # the per-request column only
#   SCENARIOS="keepalive sign" bash bench/instructions.sh      # per request without and with sign:
#   PORT=18380 bash bench/instructions.sh                      # proxy port (origin PORT+1, h2 ports PORT+2/+3), for two runs at once
#   ACCESS_LOG=1 bash bench/instructions.sh                    # bearerd with its access log on (run.sh's bearerd_log)
#   TRACING=0.01 bash bench/instructions.sh                    # bearerd with `tracing:` at that sample_ratio
#                                                              #   (spans exported to the origin nginx, which answers 200)
#
# Scenarios (SCENARIOS, default "keepalive newconn big"), each a wrk run of DURATION seconds:
#   keepalive  GET /small over CONNS keep-alive connections       -> instructions per request
#   newconn    GET /small, `Connection: close`, CONNS connections  -> instructions per connection
#   big        GET /big (1 MiB body), BIG_CONNS connections        -> instructions per MiB
#   h2c        GET /small over prior-knowledge HTTP/2, h2load -c4 -m16 -t1 (4 connections, 16
#              streams each, as run.sh's h2c_c4m16)                -> instructions per request
#              (every bearerd listener takes h2c; the nginx row gets an `http2` listener on
#              its own port, H2C_PORT; both proxy to the origin over HTTP/1.1 keep-alive)
#   h2up       the same h2load run on /h2/small, which bearerd routes to the origin's h2c
#              listener (H2_ORIGIN_PORT) with `http2: prior_knowledge`: HTTP/2 on both sides
#                                                                  -> instructions per request
#              (no nginx row: nginx proxies to HTTP/1.x upstreams only; it prints n/a)
#   sign       GET /signed/small over CONNS keep-alive connections, on a route with
#              `sign: { service: s3 }` (AWS Signature V4, UNSIGNED-PAYLOAD) whose grant aws
#              session reads static keys from files; the origin ignores Authorization
#                                                                  -> instructions per signed request
#              (compare with keepalive in the same run: the cost of signing, docs/guides/signing.md;
#              no nginx row: nginx does not sign, it prints n/a)
#   obo        GET /obo/small over CONNS keep-alive connections carrying one caller's
#              `Authorization: Bearer`, on a route whose session acts on behalf of callers
#              (`grant: token_exchange`, `subject: caller`; the origin's /token answers the one
#              exchange): every request but the first is a per-caller cache hit
#                                                                  -> instructions per request
#              (compare with keepalive in the same run: the cost of the caller's token, its hash,
#              the cache and the Authorization it replaces, docs/guides/on-behalf-of.md; no nginx row)
#
# For each binary: a copy without debug information (valgrind cannot read the static
# binary's DWARF) runs under callgrind against a local nginx origin with a client_credentials
# session, once with no load (start-up) and once per scenario; the difference of the
# instruction totals over the responses served is printed, with the ratio to the first row.
# The word `nginx` in place of a binary measures nginx as the proxy the same way (one process,
# `master_process off`; a keep-alive pool to the origin and a static Authorization header, as
# in run.sh). Under valgrind a proxy is ~50x slower, so batches are smaller than in run.sh and
# the figures include more per-event overhead; compare rows, not these numbers with run.sh's
# CPU time. KEEP=1 keeps the callgrind profiles (cg.<row>.<scenario>.<pid> in the temp
# directory) for `callgrind_annotate`.
set -euo pipefail

DURATION=${DURATION:-8}
CONNS=${CONNS:-16}
BIG_CONNS=${BIG_CONNS:-4}
SCENARIOS=${SCENARIOS:-keepalive newconn big}
KEEP=${KEEP:-0}
# ACCESS_LOG=1: bearerd writes its JSON access log (to valgrind's log file), as run.sh's bearerd_log.
ACCESS_LOG=${ACCESS_LOG:-0}
ACCESS_FLAG=(--no-access-log)
# TRACING=RATIO: a `tracing:` section with that sample_ratio (docs/operations.md "Traces"); empty: off.
TRACING=${TRACING:-}
[ "$ACCESS_LOG" = 1 ] && ACCESS_FLAG=(--log-format json)
PORT=${PORT:-18180}
ORIGIN_PORT=${ORIGIN_PORT:-$((PORT + 1))}
H2C_PORT=${H2C_PORT:-$((PORT + 2))}
H2_ORIGIN_PORT=${H2_ORIGIN_PORT:-$((PORT + 3))}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

log() { printf '[instructions] %s\n' "$*" >&2; }
die() { printf '[instructions] error: %s\n' "$*" >&2; exit 1; }

case "$DURATION" in ''|*[!0-9]*|0) die "DURATION must be a positive integer (seconds)" ;; esac
case "$CONNS" in ''|*[!0-9]*|0) die "CONNS must be a positive integer" ;; esac
case "$BIG_CONNS" in ''|*[!0-9]*|0) die "BIG_CONNS must be a positive integer" ;; esac
[ -n "$SCENARIOS" ] || die "SCENARIOS is empty"
for sc in $SCENARIOS; do
    case "$sc" in keepalive|newconn|big|h2c|h2up|sign|obo) ;; *) die "unknown scenario '$sc' (keepalive, newconn, big, h2c, h2up, sign, obo)" ;; esac
done
if [ "$#" -eq 0 ]; then set -- "$REPO/.build/release/bearerd"; fi
for b in "$@"; do
    [ "$b" = nginx ] || [ -x "$b" ] || die "not an executable: $b (build with: swift build -c release --static-swift-stdlib --product bearerd)"
done

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v wrk >/dev/null || missing+=(wrk)
command -v curl >/dev/null || missing+=(curl)
case " $SCENARIOS " in *" h2c "*|*" h2up "*) command -v h2load >/dev/null || missing+=(nghttp2-client) ;; esac
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
PROXY_PID=""
cleanup() {
    [ -n "$PROXY_PID" ] && kill -INT "$PROXY_PID" 2>/dev/null || true
    [ -f "$WORK/origin/nginx.pid" ] && kill "$(cat "$WORK/origin/nginx.pid")" 2>/dev/null || true
    if [ "$KEEP" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM

mkdir -p "$WORK/origin/tmp" "$WORK/origin/www" "$WORK/proxy/tmp" "$WORK/state" "$WORK/keys"
# The sign scenario's static keys (plain test values; the origin does not check signatures).
printf 'AKIDBENCHSIGNING0001\n' >"$WORK/keys/ak"
printf 'bench/secret+key/for/instructions/only0000\n' >"$WORK/keys/sk"
chmod 0600 "$WORK/keys/ak" "$WORK/keys/sk"
chmod 0755 "$WORK"  # an nginx worker started as root reads the origin's files as nobody
head -c $((1024 * 1024)) /dev/urandom >"$WORK/origin/www/big"
chmod 0755 "$WORK/origin" "$WORK/origin/www"
chmod 0644 "$WORK/origin/www/big"
cat >"$WORK/origin/nginx.conf" <<EOF
pid $WORK/origin/nginx.pid;
error_log $WORK/origin/error.log warn;
worker_processes 1;
events { worker_connections 1024; }
http {
    access_log off; keepalive_requests 10000000; keepalive_timeout 300s;
    sendfile on; tcp_nopush on; tcp_nodelay on;
    client_body_temp_path $WORK/origin/tmp/b; proxy_temp_path $WORK/origin/tmp/p;
    fastcgi_temp_path $WORK/origin/tmp/f; uwsgi_temp_path $WORK/origin/tmp/u; scgi_temp_path $WORK/origin/tmp/s;
    server {
        listen 127.0.0.1:$ORIGIN_PORT backlog=4096;
        listen 127.0.0.1:$H2_ORIGIN_PORT http2 backlog=4096;
        location = /small { default_type text/plain; return 200 "$(printf 'x%.0s' $(seq 100))"; }
        location = /big { root $WORK/origin/www; default_type application/octet-stream; }
        location = /token { default_type application/json; return 200 '{"access_token":"instructions-token","token_type":"Bearer","expires_in":3600}'; }
        location = /v1/traces { default_type application/x-protobuf; return 200 ""; }
    }
}
EOF
"$NGINX" -p "$WORK/origin" -c "$WORK/origin/nginx.conf"
cat >"$WORK/bearerd.yaml" <<EOF
listen: [127.0.0.1:$PORT]
state_dir: $WORK/state
# One loop, as in run.sh (there the proxy is pinned to one CPU, and one loop per CPU is the
# default) and as nginx's one process here: with two, half the connections would also pay
# for the hand-over from the accepting loop to the other one.
loops: 1
sessions:
  bench:
    grant: client_credentials
    token_url: http://127.0.0.1:$ORIGIN_PORT/token
    client_id: bench
    client_secret: bench-secret
$(case " $SCENARIOS " in *" sign "*) printf '%s\n' \
    "  signer:            # sign only: static keys, AWS Signature V4" \
    "    grant: aws" \
    "    region: us-east-1" \
    "    credentials:" \
    "      static: { access_key_id_file: $WORK/keys/ak, secret_access_key_file: $WORK/keys/sk }" ;; esac)
$(case " $SCENARIOS " in *" obo "*) printf '%s\n' \
    "  callers:           # obo only: on behalf of each caller (RFC 8693)" \
    "    grant: token_exchange" \
    "    token_url: http://127.0.0.1:$ORIGIN_PORT/token" \
    "    client_id: bench" \
    "    client_secret: bench-secret" \
    "    subject: caller" ;; esac)
routes:
$(case " $SCENARIOS " in *" h2up "*) printf '%s\n' \
    "  - match: /h2/    # h2up only (another route would add to every other scenario's routing)" \
    "    strip_prefix: true" \
    "    upstream: http://127.0.0.1:$H2_ORIGIN_PORT" \
    "    http2: prior_knowledge" \
    "    session: bench" ;; esac)
$(case " $SCENARIOS " in *" sign "*) printf '%s\n' \
    "  - match: /signed/    # sign only" \
    "    strip_prefix: true" \
    "    upstream: http://127.0.0.1:$ORIGIN_PORT" \
    "    session: signer" \
    "    sign: { service: s3 }" ;; esac)
$(case " $SCENARIOS " in *" obo "*) printf '%s\n' \
    "  - match: /obo/    # obo only" \
    "    strip_prefix: true" \
    "    upstream: http://127.0.0.1:$ORIGIN_PORT" \
    "    session: callers" ;; esac)
  - match: /
    upstream: http://127.0.0.1:$ORIGIN_PORT
    session: bench
$(if [ -n "$TRACING" ]; then printf '%s\n' \
    "tracing:" \
    "  otlp_endpoint: http://127.0.0.1:$ORIGIN_PORT/v1/traces" \
    "  sample_ratio: $TRACING"; fi)
EOF
# nginx as the proxy (the `nginx` row): one process doing the work, like run.sh's single worker.
cat >"$WORK/proxy/nginx.conf" <<EOF
daemon off;
master_process off;
pid $WORK/proxy/nginx.pid;
error_log $WORK/proxy/error.log warn;
events { worker_connections 1024; }
http {
    access_log off; keepalive_requests 10000000; keepalive_timeout 300s; tcp_nodelay on;
    client_body_temp_path $WORK/proxy/tmp/b; proxy_temp_path $WORK/proxy/tmp/p;
    fastcgi_temp_path $WORK/proxy/tmp/f; uwsgi_temp_path $WORK/proxy/tmp/u; scgi_temp_path $WORK/proxy/tmp/s;
    upstream origin { server 127.0.0.1:$ORIGIN_PORT; keepalive 128; keepalive_requests 10000000; keepalive_timeout 300s; }
    server {
        listen 127.0.0.1:$PORT backlog=4096;
        listen 127.0.0.1:$H2C_PORT http2 backlog=4096;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "Bearer bench-static-token";
            proxy_buffers 8 64k;
            proxy_max_temp_file_size 0;
        }
    }
}
EOF

# count BINARY idle|SCENARIO ROW: sets REQUESTS and INSTRUCTIONS for one callgrind run.
count() {
    local bin=$1 load=$2 out="$WORK/cg.$3.$2"
    if [ "$bin" = nginx ]; then
        valgrind --tool=callgrind --callgrind-out-file="$out.%p" "$NGINX" -p "$WORK/proxy" -e "$WORK/proxy/error.log" \
            -c "$WORK/proxy/nginx.conf" >"$WORK/valgrind.log" 2>&1 &
    else
        valgrind --tool=callgrind --callgrind-out-file="$out.%p" "$bin" run -c "$WORK/bearerd.yaml" "${ACCESS_FLAG[@]}" \
            >"$WORK/valgrind.log" 2>&1 &
    fi
    PROXY_PID=$!
    local i
    for i in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$PORT/small" && break; sleep 0.2; done
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/small" || die "$bin did not answer under valgrind (see $WORK/valgrind.log; KEEP=1)"
    local requests=0 wrk_args=()
    case "$load" in
        keepalive) wrk_args=(-c"$CONNS" "http://127.0.0.1:$PORT/small") ;;
        newconn) wrk_args=(-c"$CONNS" -H "Connection: close" "http://127.0.0.1:$PORT/small") ;;
        big) wrk_args=(-c"$BIG_CONNS" --timeout 30s "http://127.0.0.1:$PORT/big") ;;
        sign)
            # A route that does not sign (a build without signing, keys not readable) answers
            # 502/503 cheaply: refuse to count that.
            local code
            code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/signed/small")
            [ "$code" = 200 ] || die "$bin: GET /signed/small answered $code, not 200: the sign: route does not sign (see $WORK/valgrind.log; KEEP=1)"
            wrk_args=(-c"$CONNS" "http://127.0.0.1:$PORT/signed/small") ;;
        obo)
            local code caller="Authorization: Bearer bench-caller-0123456789abcdef0123456789abcdef"
            code=$(curl -s -o /dev/null -w '%{http_code}' -H "$caller" "http://127.0.0.1:$PORT/obo/small")
            [ "$code" = 200 ] || die "$bin: GET /obo/small answered $code, not 200 (see $WORK/valgrind.log; KEEP=1)"
            wrk_args=(-c"$CONNS" -H "$caller" "http://127.0.0.1:$PORT/obo/small") ;;
    esac
    if [ "$load" = h2c ] || [ "$load" = h2up ]; then
        # The proxy's prior-knowledge HTTP/2 port: nginx's own h2c listener, bearerd's usual one.
        local h2port=$PORT res path=/small
        [ "$bin" = nginx ] && h2port=$H2C_PORT
        [ "$load" = h2up ] && path=/h2/small
        res=$(h2load -c4 -m16 -t1 -D "$DURATION" "http://127.0.0.1:$h2port$path" 2>&1) || log "warning: $bin $load: h2load failed"
        requests=$(awk '/^requests:/ { for (i = 1; i <= NF; i++) if ($(i + 1) == "succeeded,") { print $i; exit } }' <<<"$res")
        local failed
        failed=$(awk '/^requests:/ { for (i = 1; i <= NF; i++) if ($(i + 1) == "failed,") { print $i; exit } }' <<<"$res")
        [ "${failed:-0}" = 0 ] || log "warning: $bin $load: $failed failed requests"
        [ -n "$requests" ] || requests=0
    elif [ "$load" != idle ]; then
        local res
        res=$(wrk -t1 -d"${DURATION}s" "${wrk_args[@]}")
        requests=$(awk '/requests in/ {print $1}' <<<"$res")
        if grep -q 'Socket errors\|Non-2xx' <<<"$res"; then log "warning: $bin $load: $(grep 'Socket errors\|Non-2xx' <<<"$res" | tr -s ' ')"; fi
    fi
    if [ "$bin" = nginx ]; then kill -QUIT "$PROXY_PID"; else kill -INT "$PROXY_PID"; fi
    wait "$PROXY_PID" 2>/dev/null || true
    PROXY_PID=""
    REQUESTS=$requests
    # One profile per process (a file has both a summary: and a totals: line; take one).
    local f total=0 t
    for f in "$out".*; do
        t=$(grep -h '^totals:\|^summary:' "$f" | head -1 | awk '{print $2}')
        [ -n "$t" ] && total=$((total + t))
    done
    INSTRUCTIONS=$total
    [ "$INSTRUCTIONS" -gt 0 ] || INSTRUCTIONS=""
    [ -n "$INSTRUCTIONS" ] || die "no callgrind totals for $bin (see $WORK/valgrind.log; KEEP=1)"
}

header() {
    printf '%-40s' binary
    local sc
    for sc in $SCENARIOS; do
        case "$sc" in
            keepalive) printf ' %10s %14s %8s' requests "instr/request" ratio ;;
            newconn) printf ' %10s %14s %8s' conns "instr/conn" ratio ;;
            big) printf ' %10s %14s %8s' MiB "instr/MiB" ratio ;;
            h2c) printf ' %10s %14s %8s' h2-reqs "instr/h2-req" ratio ;;
            h2up) printf ' %10s %14s %8s' h2h2-reqs "instr/h2h2-req" ratio ;;
            sign) printf ' %10s %14s %8s' signed "instr/signed" ratio ;;
            obo) printf ' %10s %14s %8s' obo-reqs "instr/obo-req" ratio ;;
        esac
    done
    printf '\n'
}

declare -A FIRST=()
n=0
header
for b in "$@"; do
    n=$((n + 1))
    if [ "$b" = nginx ]; then
        s=nginx
    else
        mkdir -p "$WORK/bin.$n"
        s="$WORK/bin.$n/bearerd"  # named bearerd: the process shows as `bearerd run`
        strip --strip-debug -o "$s" "$b"
    fi
    count "$s" idle "$n"
    base=$INSTRUCTIONS
    row=$(printf '%-40s' "$b")
    for sc in $SCENARIOS; do
        if [ "$b" = nginx ] && { [ "$sc" = h2up ] || [ "$sc" = sign ] || [ "$sc" = obo ]; }; then
            row+=$(printf ' %10s %14s %8s' n/a n/a n/a)
            continue
        fi
        count "$s" "$sc" "$n"
        requests=$REQUESTS loaded=$INSTRUCTIONS
        [ "${requests:-0}" -gt 0 ] || die "no responses under load ($sc) for $b"
        per=$(( (loaded - base) / requests ))
        [ -n "${FIRST[$sc]:-}" ] || FIRST[$sc]=$per
        row+=$(printf ' %10d %14d %7.3fx' "$requests" "$per" "$(awk -v a="$per" -v b="${FIRST[$sc]}" 'BEGIN{print a/b}')")
    done
    printf '%s\n' "$row"
done
