#!/usr/bin/env bash
# bench/run.sh: bearerd's benchmark. Compares, in one run with alternating rounds:
#   origin   the origin nginx, directly                         127.0.0.1:18081
#   nginx    nginx as a reverse proxy adding a static
#            `Authorization: Bearer bench-static-token`          127.0.0.1:18082
#   haproxy  HAProxy (nbthread 1) adding the same static header  127.0.0.1:18086
#   bearerd  bearerd in front of the same origin, default
#            settings (no `loops:`/`io:` in its config)          127.0.0.1:18080
#   bearerd_log  the same bearerd with its JSON access log on     127.0.0.1:18085
#            (small_c64 only: the cost of the log line)
#
# Scenarios (wrk, one thread):
#   small_c64  GET /small (100-byte body), 64 connections  -> requests/s
#   small_c1   GET /small, 1 connection                    -> latency p50/p99 in µs (and req/s)
#   big_c8     GET /big (1 MiB body), 8 connections        -> MiB/s (bytes read / duration)
#   newconn_c16  GET /small with `Connection: close`, 16 connections: a new TCP connection
#              per request -> requests/s
#   newconn_c64t2  the same with 64 connections from two wrk threads (`-t2`, NEWCONN_LOAD_CPUS):
#              a load generator with CPU to spare, so the proxy, not wrk, is the bottleneck
#   h2c_c4m16  GET /small over prior-knowledge HTTP/2 (h2load -c4 -m16: 4 connections, 16
#              streams each) -> requests/s. nginx takes it on an h2c listener (127.0.0.1:18083)
#              proxying to the same origin over HTTP/1.1; bearerd on its usual port (every
#              bearerd listener accepts h2c next to HTTP/1.1); the origin on its own h2c port.
#   TLS upstream (the proxies only): the origin also serves /small over TLS 1.3 with an ECDSA
#   P-256 certificate (127.0.0.1:18087), and from a second TLS server that closes the
#   connection after every response (127.0.0.1:18088). Clients speak plain HTTP to the proxy:
#   tls_small_c64    GET /tls/small, 64 keep-alive connections -> requests/s
#   tls_close_c16    GET /tls/small with `Connection: close` from the client, 16 connections
#   tls_newconn_c16  GET /tlsclose/small, 16 keep-alive client connections; the origin closes
#                    after each response, so every request needs a new upstream TLS connection
#                    -> requests/s, CPU per request and the share of upstream TLS sessions
#                    resumed (the origin logs $ssl_session_reused). nginx proxies with
#                    proxy_ssl_session_reuse on (its default), HAProxy with its default reuse.
#
# Pinning (taskset): with N cores, the proxy under test (nginx proxy worker or bearerd) runs
# on core 0; wrk and the origin share cores 1..N-1. On a 2-core machine that is: proxies on
# core 0, wrk + origin on core 1, so each proxy gets exactly one core. On a 1-core machine
# nothing is pinned (numbers are then only roughly comparable). PROXY_CPUS and LOAD_CPUS
# (taskset -c lists) override the split.
#
# Rounds: a warm-up run of every (scenario, target) first, then ROUNDS rounds; each round
# runs every scenario against every target in turn, the target order rotating by one each
# round, so background noise hits all targets alike. The table shows medians across rounds.
#
# Environment knobs:
#   ROUNDS=5          number of measured rounds
#   DURATION=5        seconds per wrk run (warm-up runs take 1 s)
#   TARGETS="origin nginx haproxy bearerd bearerd_log"   subset/order of targets
#   IDLE_CONNS=10000  idle keep-alive connections held against each proxy (0: skip)
#   BEARERD=path      use this bearerd binary instead of building it (swift build -c release
#                     --static-swift-stdlib)
#   BEARERD_AUTH=session|none   session (default): bearerd injects a token of a
#                     client_credentials session whose token endpoint is the origin's /token,
#                     so it does what nginx does (add an Authorization header); none: plain
#                     proxying route without a session
#   BEARERD_ACCESS_LOG=1   keep bearerd's per-request log line (off by default, as nginx's is)
#   BEARERD_IO=poller|sources   set bearerd's `io:` mode (default: unset, bearerd's own default)
#   BEARERD_LOOPS=N   set bearerd's `loops:` (default: unset, one per CPU it may use: 1 when
#                     pinned to one core)
#   PROXY_CPUS, LOAD_CPUS   taskset CPU lists (default 0 and 1-(N-1))
#   NEWCONN_LOAD_CPUS  where wrk runs for newconn_c64t2 (default LOAD_CPUS; on a machine with
#                     4+ cores e.g. PROXY_CPUS=0 LOAD_CPUS=1 NEWCONN_LOAD_CPUS=2-3)
#   KEEP=1            keep the temporary directory (configs, logs, raw wrk output)
#   ONLY="s1 s2"      run only these scenarios
#
# Besides requests/s and latency, each run records the proxy's CPU time per request (utime +
# stime of the bearerd process or the nginx/HAProxy worker, from /proc, divided by requests)
# and the origin's new connections per 1,000 requests (nginx stub_status `accepts`): upstream
# keep-alive reuse. After the rounds: idle RSS (VmRSS after start-up and the sanity checks)
# and IDLE_CONNS (10000) idle keep-alive client connections held open by bench/idle_conns.py
# against each proxy, RSS growth per connection.
#
# Output: a table on stdout, raw results as CSV plus the table in bench/out/ (gitignored).
# All processes started here are stopped on exit, including Ctrl-C.
set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
TARGETS=${TARGETS:-origin nginx haproxy bearerd bearerd_log}
IDLE_CONNS=${IDLE_CONNS:-10000}
BEARERD_LOOPS=${BEARERD_LOOPS:-}
BEARERD=${BEARERD:-}
BEARERD_AUTH=${BEARERD_AUTH:-session}
BEARERD_IO=${BEARERD_IO:-}
KEEP=${KEEP:-0}

ORIGIN_PORT=18081
NGINX_PORT=18082
BEARERD_PORT=18080
SMALL_BODY_BYTES=100
BIG_BYTES=$((1024 * 1024))
STATIC_TOKEN=bench-static-token
SESSION_TOKEN=bench-session-token
NGINX_H2C_PORT=18083
ORIGIN_H2C_PORT=18084
BEARERD_LOG_PORT=18085
HAPROXY_PORT=18086
ORIGIN_TLS_PORT=18087
ORIGIN_TLSCLOSE_PORT=18088
SCENARIOS=(small_c64 small_c1 big_c8 newconn_c16 newconn_c64t2 h2c_c4m16 tls_small_c64 tls_close_c16 tls_newconn_c16)
# ONLY="tls_newconn_c16 …": run just these scenarios (a quick look; the table shows "-" for the rest).
if [ -n "${ONLY:-}" ]; then read -r -a SCENARIOS <<<"$ONLY"; fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT_DIR=$REPO/bench/out
STAMP=$(date -u +%Y%m%dT%H%M%SZ)

log() { printf '[bench] %s\n' "$*" >&2; }
die() { printf '[bench] error: %s\n' "$*" >&2; exit 1; }

case "$ROUNDS" in ''|*[!0-9]*|0) die "ROUNDS must be a positive integer" ;; esac
case "$DURATION" in ''|*[!0-9]*|0) die "DURATION must be a positive integer (seconds)" ;; esac
case "$IDLE_CONNS" in ''|*[!0-9]*) die "IDLE_CONNS must be a non-negative integer" ;; esac
case "$BEARERD_AUTH" in session|none) ;; *) die "BEARERD_AUTH must be session or none" ;; esac
read -r -a TARGET_LIST <<<"$TARGETS"
for t in "${TARGET_LIST[@]}"; do
    case "$t" in origin|nginx|haproxy|bearerd|bearerd_log) ;; *) die "unknown target '$t' (origin, nginx, haproxy, bearerd, bearerd_log)" ;; esac
done
[ "${#TARGET_LIST[@]}" -gt 0 ] || die "TARGETS is empty"
wants() { [[ " ${TARGET_LIST[*]} " == *" $1 "* ]]; }

# --------------------------------------------------------------------------- tools
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

find_nginx() { command -v nginx 2>/dev/null || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; } || true; }

ensure_tools() {
    local missing=()
    [ -n "$(find_nginx)" ] || missing+=(nginx-light)
    command -v wrk >/dev/null || missing+=(wrk)
    command -v h2load >/dev/null || missing+=(nghttp2-client)
    command -v curl >/dev/null || missing+=(curl)
    command -v taskset >/dev/null || missing+=(util-linux)
    if wants haproxy; then command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy); fi
    command -v python3 >/dev/null || missing+=(python3)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${missing[*]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >&2 || {
            as_root apt-get update >&2
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >&2
        }
    fi
    NGINX=$(find_nginx)
    [ -n "$NGINX" ] || die "nginx not found after installation"
    HAPROXY=$(command -v haproxy 2>/dev/null || echo /usr/sbin/haproxy)
}

# --------------------------------------------------------------------------- processes
WORK=""
PIDS=()      # every long-running process we started
WRK_PID=""

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$WRK_PID" ]; then kill -TERM "$WRK_PID" 2>/dev/null || true; fi
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    # Give them up to 5 s (nginx fast shutdown, bearerd graceful stop), then SIGKILL.
    local i
    for i in $(seq 50); do
        local alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" -eq 0 ] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            log "pid $pid did not stop; killing"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    wait 2>/dev/null || true
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then
        if [ "$KEEP" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

# Starts "$@" in the background, records its pid in PIDS and in the named variable.
start_bg() {
    local var=$1 logfile=$2; shift 2
    "$@" >"$logfile" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    printf -v "$var" '%s' "$pid"
}

# Waits until GET http://127.0.0.1:PORT/small answers 200, or fails showing the log.
wait_ready() {
    local name=$1 port=$2 pid=$3 logfile=$4 i
    for i in $(seq 100); do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$logfile" >&2 || true
            die "$name exited during startup (log above)"
        fi
        if [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$port/small" || true)" = 200 ]; then
            return 0
        fi
        sleep 0.1
    done
    tail -n 20 "$logfile" >&2 || true
    die "$name not ready on port $port after 10 s"
}

# --------------------------------------------------------------------------- pinning
NCPU=$(nproc)
# Command prefixes (arrays, not functions, so that `$!` is the benchmarked process itself:
# taskset execs its command).
if [ "$NCPU" -ge 2 ]; then
    PROXY_CPUS=${PROXY_CPUS:-0}
    if [ "$NCPU" -eq 2 ]; then LOAD_CPUS=${LOAD_CPUS:-1}; else LOAD_CPUS=${LOAD_CPUS:-1-$((NCPU - 1))}; fi
    PIN_PROXY=(taskset -c "$PROXY_CPUS")
    PIN_LOAD=(taskset -c "$LOAD_CPUS")
    NEWCONN_LOAD_CPUS=${NEWCONN_LOAD_CPUS:-$LOAD_CPUS}
    PIN_NEWCONN_LOAD=(taskset -c "$NEWCONN_LOAD_CPUS")
    # Number of CPUs in LOAD_CPUS: the origin's worker count.
    ORIGIN_WORKERS=$(taskset -c "$LOAD_CPUS" nproc)
else
    PROXY_CPUS=${PROXY_CPUS:-unpinned}
    LOAD_CPUS=${LOAD_CPUS:-unpinned}
    log "warning: 1 CPU, nothing pinned; proxy, origin and wrk compete for the same core"
    PIN_PROXY=()
    PIN_LOAD=()
    NEWCONN_LOAD_CPUS=${NEWCONN_LOAD_CPUS:-unpinned}
    PIN_NEWCONN_LOAD=()
    ORIGIN_WORKERS=1
fi

# --------------------------------------------------------------------------- setup
ensure_tools
# 10,000 idle client connections (and the proxies' own) need descriptors.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if wants bearerd || wants bearerd_log; then
    if [ -z "$BEARERD" ]; then
        log "building bearerd (release)"
        # As README and deploy/ build it: the Swift runtime linked in (static stdlib).
        (cd "$REPO" && swift build -c release --static-swift-stdlib --product bearerd >&2)
        BEARERD="$(cd "$REPO" && swift build -c release --show-bin-path)/bearerd"
    fi
    [ -x "$BEARERD" ] || die "bearerd binary not found or not executable: $BEARERD (set BEARERD=, or TARGETS=\"origin nginx\")"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bearerd-bench.XXXXXX")
# nginx workers drop to an unprivileged user when started as root: they must read our files.
chmod 0755 "$WORK"
mkdir -p "$OUT_DIR" "$WORK/origin/www" "$WORK/origin/tmp" "$WORK/nginx/tmp" "$WORK/bearerd-state" "$WORK/bearerd-log-state" "$WORK/wrk" "$WORK/haproxy"
chmod 0700 "$WORK/bearerd-state" "$WORK/bearerd-log-state"

SMALL_BODY=$(printf 'x%.0s' $(seq "$SMALL_BODY_BYTES"))
# The TLS origin's certificate: ECDSA P-256, for the IP address the proxies connect to.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=bench-origin \
    -addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout "$WORK/origin/tls.key" -out "$WORK/origin/tls.crt" 2>/dev/null \
    || die "openssl could not make the origin's certificate"
chmod 0644 "$WORK/origin/tls.key" "$WORK/origin/tls.crt"
: >"$WORK/origin/tls-reused.log"
chmod 0666 "$WORK/origin/tls-reused.log"
head -c "$BIG_BYTES" /dev/urandom >"$WORK/origin/www/big"
chmod 0644 "$WORK/origin/www/big"

# nginx directives shared by both instances. As root, workers run as nobody (Debian has no
# "nobody" group, which is nginx's default, so name the group).
nginx_common() {
    local prefix=$1
    if [ "$(id -u)" -eq 0 ]; then echo "user nobody $(id -gn nobody 2>/dev/null || echo nogroup);"; fi
    cat <<EOF
pid $prefix/nginx.pid;
error_log $prefix/error.log warn;
worker_rlimit_nofile 65536;
EOF
}
nginx_http_common() {
    local prefix=$1
    cat <<EOF
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    tcp_nodelay on;
    client_body_temp_path $prefix/tmp/body;
    proxy_temp_path $prefix/tmp/proxy;
    fastcgi_temp_path $prefix/tmp/fastcgi;
    uwsgi_temp_path $prefix/tmp/uwsgi;
    scgi_temp_path $prefix/tmp/scgi;
EOF
}

# Origin: /small, /big, plus /auth-echo (sanity check that the header arrives) and /token
# (a client_credentials token endpoint for bearerd's session).
{
    nginx_common "$WORK/origin"
    cat <<EOF
worker_processes $ORIGIN_WORKERS;
events { worker_connections 30000; }
http {
$(nginx_http_common "$WORK/origin")
    sendfile on;
    tcp_nopush on;
    server {
        listen 127.0.0.1:$ORIGIN_PORT backlog=4096;
        listen 127.0.0.1:$ORIGIN_H2C_PORT http2 backlog=4096;
        location = /small { default_type text/plain; return 200 "$SMALL_BODY"; }
        location = /big { root $WORK/origin/www; default_type application/octet-stream; }
        location = /auth-echo { default_type text/plain; return 200 "\$http_authorization"; }
        location = /nginx_status { stub_status; }
        location = /token {
            default_type application/json;
            return 200 '{"access_token":"$SESSION_TOKEN","token_type":"Bearer","expires_in":86400}';
        }
    }
    ssl_certificate $WORK/origin/tls.crt;
    ssl_certificate_key $WORK/origin/tls.key;
    ssl_protocols TLSv1.3;
    ssl_session_cache shared:bench:4m;
    log_format reused \$ssl_session_reused;
    server {
        listen 127.0.0.1:$ORIGIN_TLS_PORT ssl backlog=4096;
        location = /small { default_type text/plain; return 200 "$SMALL_BODY"; }
    }
    server {
        listen 127.0.0.1:$ORIGIN_TLSCLOSE_PORT ssl backlog=4096;
        keepalive_timeout 0;
        access_log $WORK/origin/tls-reused.log reused;
        location = /small { default_type text/plain; return 200 "$SMALL_BODY"; }
    }
}
EOF
} >"$WORK/origin/nginx.conf"

# nginx reverse proxy: one worker, keep-alive pool to the origin, static bearer header.
# proxy_max_temp_file_size 0: never spool a 1 MiB response to disk (stream it like bearerd).
{
    nginx_common "$WORK/nginx"
    cat <<EOF
worker_processes 1;
events { worker_connections 30000; }
http {
$(nginx_http_common "$WORK/nginx")
    upstream origin {
        server 127.0.0.1:$ORIGIN_PORT;
        keepalive 128;
        keepalive_requests 10000000;
        keepalive_timeout 300s;
    }
    upstream origin_tls {
        server 127.0.0.1:$ORIGIN_TLS_PORT;
        keepalive 128;
        keepalive_requests 10000000;
        keepalive_timeout 300s;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT backlog=4096;
        listen 127.0.0.1:$NGINX_H2C_PORT http2 backlog=4096;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "Bearer $STATIC_TOKEN";
            proxy_buffers 8 64k;
            proxy_max_temp_file_size 0;
        }
        location /tls/ {
            proxy_pass https://origin_tls/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "Bearer $STATIC_TOKEN";
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate $WORK/origin/tls.crt;
            proxy_ssl_session_reuse on;
            proxy_ssl_protocols TLSv1.2 TLSv1.3;
            proxy_ssl_name localhost;
        }
        location /tlsclose/ {
            proxy_pass https://127.0.0.1:$ORIGIN_TLSCLOSE_PORT/;
            proxy_http_version 1.1;
            proxy_set_header Authorization "Bearer $STATIC_TOKEN";
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate $WORK/origin/tls.crt;
            proxy_ssl_session_reuse on;
            proxy_ssl_protocols TLSv1.2 TLSv1.3;
            proxy_ssl_name localhost;
        }
    }
}
EOF
} >"$WORK/nginx/nginx.conf"

# bearerd, one loop.
{
    cat <<EOF
listen: [127.0.0.1:$BEARERD_PORT]
state_dir: $WORK/bearerd-state
EOF
    if [ -n "$BEARERD_LOOPS" ]; then echo "loops: $BEARERD_LOOPS"; fi
    if [ -n "$BEARERD_IO" ]; then echo "io: $BEARERD_IO"; fi
    if [ "$BEARERD_AUTH" = session ]; then
        cat <<EOF
sessions:
  bench:
    grant: client_credentials
    token_url: http://127.0.0.1:$ORIGIN_PORT/token
    client_id: bench
    client_secret: bench-secret
routes:
  - { match: /tls/, strip_prefix: true, upstream: "https://127.0.0.1:$ORIGIN_TLS_PORT", tls: { ca_file: $WORK/origin/tls.crt }, session: bench }
  - { match: /tlsclose/, strip_prefix: true, upstream: "https://127.0.0.1:$ORIGIN_TLSCLOSE_PORT", tls: { ca_file: $WORK/origin/tls.crt }, session: bench }
  - match: /
    upstream: http://127.0.0.1:$ORIGIN_PORT
    session: bench
EOF
    else
        cat <<EOF
routes:
  - { match: /tls/, strip_prefix: true, upstream: "https://127.0.0.1:$ORIGIN_TLS_PORT", tls: { ca_file: $WORK/origin/tls.crt } }
  - { match: /tlsclose/, strip_prefix: true, upstream: "https://127.0.0.1:$ORIGIN_TLSCLOSE_PORT", tls: { ca_file: $WORK/origin/tls.crt } }
  - match: /
    upstream: http://127.0.0.1:$ORIGIN_PORT
EOF
    fi
} >"$WORK/bearerd.yaml"
# The access-log variant: same settings, its own port and state directory.
sed -e "s|127.0.0.1:$BEARERD_PORT|127.0.0.1:$BEARERD_LOG_PORT|" -e "s|$WORK/bearerd-state|$WORK/bearerd-log-state|" \
    "$WORK/bearerd.yaml" >"$WORK/bearerd-log.yaml"

# HAProxy: one thread, keep-alive to the origin (http-reuse always), the static header.
# It reserves two descriptors per connection: with a low `ulimit -n` its idle-connection run
# holds fewer connections (the table says how many).
HAPROXY_MAXCONN=$(( (IDLE_CONNS > 4000 ? IDLE_CONNS : 4000) + 200 ))
HAPROXY_FD_CAP=$(( ($(ulimit -n) - 14) / 2 - 16 ))
[ "$HAPROXY_MAXCONN" -gt "$HAPROXY_FD_CAP" ] && HAPROXY_MAXCONN=$HAPROXY_FD_CAP
cat >"$WORK/haproxy/haproxy.cfg" <<EOF
global
    nbthread 1
    ulimit-n $(ulimit -n)
    maxconn $HAPROXY_MAXCONN
defaults
    mode http
    timeout connect 5s
    timeout client 300s
    timeout server 300s
    timeout http-keep-alive 300s
    http-reuse always
frontend fe
    bind 127.0.0.1:$HAPROXY_PORT
    use_backend be_tls if { path_beg /tls/ }
    use_backend be_tlsclose if { path_beg /tlsclose/ }
    default_backend be
backend be
    http-request set-header Authorization "Bearer $STATIC_TOKEN"
    server origin 127.0.0.1:$ORIGIN_PORT maxconn 20000
backend be_tls
    http-request set-header Authorization "Bearer $STATIC_TOKEN"
    http-request replace-path /tls(/.*) \1
    server origin 127.0.0.1:$ORIGIN_TLS_PORT ssl verify required ca-file $WORK/origin/tls.crt maxconn 20000
backend be_tlsclose
    http-request set-header Authorization "Bearer $STATIC_TOKEN"
    http-request replace-path /tlsclose(/.*) \1
    server origin 127.0.0.1:$ORIGIN_TLSCLOSE_PORT ssl verify required ca-file $WORK/origin/tls.crt maxconn 20000
EOF

# wrk hook: one machine-readable line per run (latency in µs).
cat >"$WORK/report.lua" <<'EOF'
done = function(summary, latency, requests)
  local secs = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d bytes=%d rps=%.1f p50_us=%d p99_us=%d mib_s=%.2f errors=%d non2xx=%d\n",
    summary.requests, summary.duration, summary.bytes, summary.requests / secs,
    latency:percentile(50), latency:percentile(99), summary.bytes / secs / 1048576,
    e.connect + e.read + e.write + e.timeout, e.status))
end
EOF

# --------------------------------------------------------------------------- start
ORIGIN_PID="" NGINX_PID="" BEARERD_PID=""
start_bg ORIGIN_PID "$WORK/origin/stdout.log" \
    "${PIN_LOAD[@]}" "$NGINX" -p "$WORK/origin" -e "$WORK/origin/error.log" -c "$WORK/origin/nginx.conf" -g 'daemon off;'
wait_ready origin "$ORIGIN_PORT" "$ORIGIN_PID" "$WORK/origin/error.log"
if wants nginx; then
    start_bg NGINX_PID "$WORK/nginx/stdout.log" \
        "${PIN_PROXY[@]}" "$NGINX" -p "$WORK/nginx" -e "$WORK/nginx/error.log" -c "$WORK/nginx/nginx.conf" -g 'daemon off;'
    wait_ready nginx "$NGINX_PORT" "$NGINX_PID" "$WORK/nginx/error.log"
fi
HAPROXY_PID="" BEARERD_LOG_PID=""
if wants haproxy; then
    start_bg HAPROXY_PID "$WORK/haproxy/haproxy.log" "${PIN_PROXY[@]}" "$HAPROXY" -db -f "$WORK/haproxy/haproxy.cfg"
    wait_ready haproxy "$HAPROXY_PORT" "$HAPROXY_PID" "$WORK/haproxy/haproxy.log"
fi
if wants bearerd_log; then
    start_bg BEARERD_LOG_PID "$WORK/bearerd-log.out" "${PIN_PROXY[@]}" "$BEARERD" run -c "$WORK/bearerd-log.yaml" --log-format json
    wait_ready bearerd_log "$BEARERD_LOG_PORT" "$BEARERD_LOG_PID" "$WORK/bearerd-log.out"
fi
if wants bearerd; then
    "$BEARERD" check -c "$WORK/bearerd.yaml" >&2 || die "bearerd check rejected $WORK/bearerd.yaml"
    # Like the nginx proxy (access_log off), bearerd writes no per-request log line here;
    # BEARERD_ACCESS_LOG=1 keeps it, to measure its cost.
    access_flag=(--no-access-log)
    [ "${BEARERD_ACCESS_LOG:-0}" = 1 ] && access_flag=()
    start_bg BEARERD_PID "$WORK/bearerd.log" "${PIN_PROXY[@]}" "$BEARERD" run -c "$WORK/bearerd.yaml" "${access_flag[@]}"
    wait_ready bearerd "$BEARERD_PORT" "$BEARERD_PID" "$WORK/bearerd.log"
fi

pid_of() { case "$1" in origin) echo "$ORIGIN_PID" ;; nginx) echo "$NGINX_PID" ;; haproxy) echo "$HAPROXY_PID" ;; bearerd) echo "$BEARERD_PID" ;; bearerd_log) echo "$BEARERD_LOG_PID" ;; esac; }
log_of() { case "$1" in origin) echo "$WORK/origin/error.log" ;; nginx) echo "$WORK/nginx/error.log" ;; haproxy) echo "$WORK/haproxy/haproxy.log" ;; bearerd) echo "$WORK/bearerd.log" ;; bearerd_log) echo "$WORK/bearerd-log.out" ;; esac; }
port_of() { case "$1" in origin) echo "$ORIGIN_PORT" ;; nginx) echo "$NGINX_PORT" ;; haproxy) echo "$HAPROXY_PORT" ;; bearerd) echo "$BEARERD_PORT" ;; bearerd_log) echo "$BEARERD_LOG_PORT" ;; esac; }
# The process doing the work: nginx's worker (child of the master we started), else the pid.
work_pid_of() {
    local pid
    pid=$(pid_of "$1")
    case "$1" in origin|nginx) pgrep -P "$pid" | head -n 1 ;; *) echo "$pid" ;; esac
}
# cpu_ticks PID: utime + stime in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
vm_rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || true; }
# origin_accepts: connections the origin accepted so far (stub_status), or empty.
origin_accepts() { curl -s --max-time 2 "http://127.0.0.1:$ORIGIN_PORT/nginx_status" | awk 'NR == 3 { print $1 }'; }
CLK_TCK=$(getconf CLK_TCK)

# Sanity: sizes and status through every target; the proxies deliver the header.
for t in "${TARGET_LIST[@]}"; do
    url="http://127.0.0.1:$(port_of "$t")"
    got=$(curl -s -o /dev/null -w '%{http_code} %{size_download}' "$url/small")
    [ "$got" = "200 $SMALL_BODY_BYTES" ] || die "$t /small: expected '200 $SMALL_BODY_BYTES', got '$got'"
    got=$(curl -s -o /dev/null -w '%{http_code} %{size_download}' "$url/big")
    [ "$got" = "200 $BIG_BYTES" ] || die "$t /big: expected '200 $BIG_BYTES', got '$got'"
    if [ "$t" != origin ]; then
        for p in /tls/small /tlsclose/small; do
            got=$(curl -s -o /dev/null -w '%{http_code} %{size_download}' "$url$p")
            [ "$got" = "200 $SMALL_BODY_BYTES" ] || die "$t $p: expected '200 $SMALL_BODY_BYTES', got '$got'"
        done
    fi
    auth=$(curl -s "$url/auth-echo")
    case "$t" in
        nginx) want="Bearer $STATIC_TOKEN" ;;
        haproxy) want="Bearer $STATIC_TOKEN" ;;
        bearerd|bearerd_log) if [ "$BEARERD_AUTH" = session ]; then want="Bearer $SESSION_TOKEN"; else want=""; fi ;;
        *) want="" ;;
    esac
    [ "$auth" = "$want" ] || die "$t: origin saw Authorization '$auth', expected '$want'"
done
log "sanity checks passed for: ${TARGET_LIST[*]}"

# Idle RSS: after start-up and the sanity requests, before any load.
declare -A IDLE_RSS=()
for t in "${TARGET_LIST[@]}"; do
    [ "$t" = origin ] && continue
    IDLE_RSS[$t]=$(vm_rss_kib "$(work_pid_of "$t")")
done

# --------------------------------------------------------------------------- runs
CSV=$OUT_DIR/bench-$STAMP.csv
echo "round,scenario,target,connections,duration_s,requests,rps,p50_us,p99_us,bytes,mib_s,errors,non2xx,cpu_us_per_req,origin_conns_per_1k,tls_resumed_pct" >"$CSV"

# h2c_port TARGET: where the target takes prior-knowledge HTTP/2.
h2c_port() { case "$1" in origin) echo "$ORIGIN_H2C_PORT" ;; nginx) echo "$NGINX_H2C_PORT" ;; bearerd) echo "$BEARERD_PORT" ;; esac; }

# Which targets take part in a scenario: the access-log variant only where its cost shows
# (small_c64); h2c for origin, nginx and bearerd (HAProxy's h2c needs its own listener).
takes_part() {
    case "$1:$2" in
        small_c64:*) return 0 ;;
        h2c_c4m16:origin|h2c_c4m16:nginx|h2c_c4m16:bearerd) return 0 ;;
        h2c_c4m16:*) return 1 ;;
        tls_*:origin) return 1 ;;
        *:bearerd_log) return 1 ;;
        *) return 0 ;;
    esac
}

# run_h2load ROUND TARGET SECONDS: the h2c scenario with h2load (4 connections x 16 streams);
# a CSV row with req/s (no latency percentiles: h2load reports none). A failed run is recorded
# as n/a (0 req/s) with a warning instead of aborting the benchmark.
run_h2load() {
    local round=$1 target=$2 secs=$3
    local out="$WORK/wrk/$round-h2c_c4m16-$target.txt"
    "${PIN_LOAD[@]}" h2load -c4 -m16 -t1 -D "$secs" "http://127.0.0.1:$(h2c_port "$target")/small" >"$out" 2>&1 &
    WRK_PID=$!
    wait "$WRK_PID" || log "warning: h2load failed ($target, round $round)"
    WRK_PID=""
    local rps done failed bytes
    rps=$(awk '/^finished in/ { for (i = 1; i <= NF; i++) if ($(i + 1) == "req/s,") { print $i; exit } }' "$out")
    done=$(awk '/^requests:/ { for (i = 1; i <= NF; i++) if ($(i + 1) == "done,") { print $i; exit } }' "$out")
    failed=$(awk '/^requests:/ { for (i = 1; i <= NF; i++) if ($(i + 1) == "failed,") { print $i; exit } }' "$out")
    bytes=$(awk '/^traffic:/ { gsub(/[()]/, "", $3); print $3; exit }' "$out")
    if [ -z "$rps" ] || [ "${done:-0}" = 0 ]; then
        log "warning: $target h2c round $round: no successful requests (n/a)"
        rps=0 done=0
    fi
    [ "${failed:-0}" != 0 ] && log "warning: $target h2c round $round: $failed failed requests"
    [ "$round" = warmup ] && return 0
    printf '%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,,\n' "$round" h2c_c4m16 "$target" 4 "$secs" "$done" "$rps" 0 0 "${bytes:-0}" 0 "${failed:-0}" 0 >>"$CSV"
    log "round $round h2c_c4m16 $target: rps=$rps"
}

# run_wrk ROUND SCENARIO TARGET SECONDS: runs wrk pinned, appends a CSV row unless warm-up.
run_wrk() {
    local round=$1 scenario=$2 target=$3 secs=$4 conns path
    if [ "$scenario" = h2c_c4m16 ]; then
        run_h2load "$round" "$target" "$secs"
        return
    fi
    local extra=() threads=1 pin=("${PIN_LOAD[@]}")
    case "$scenario" in
        small_c64) conns=64 path=/small ;;
        small_c1) conns=1 path=/small ;;
        big_c8) conns=8 path=/big ;;
        newconn_c16) conns=16 path=/small extra=(-H "Connection: close") ;;
        newconn_c64t2) conns=64 threads=2 path=/small extra=(-H "Connection: close") pin=("${PIN_NEWCONN_LOAD[@]}") ;;
        tls_small_c64) conns=64 path=/tls/small ;;
        tls_close_c16) conns=16 path=/tls/small extra=(-H "Connection: close") ;;
        tls_newconn_c16) conns=16 path=/tlsclose/small ;;
    esac
    local reused0
    reused0=$(wc -l <"$WORK/origin/tls-reused.log")
    local out="$WORK/wrk/$round-$scenario-$target.txt"
    local wpid ticks0 ticks1 acc0 acc1
    wpid=$(work_pid_of "$target")
    ticks0=$(cpu_ticks "$wpid")
    acc0=$(origin_accepts)
    # In the background + wait, so a signal to this script interrupts at once (trap).
    "${pin[@]}" wrk -t"$threads" -c"$conns" -d"${secs}s" --timeout 10s -s "$WORK/report.lua" "${extra[@]}" \
        "http://127.0.0.1:$(port_of "$target")$path" >"$out" 2>&1 &
    WRK_PID=$!
    wait "$WRK_PID" || { cat "$out" >&2; die "wrk failed ($scenario, $target)"; }
    WRK_PID=""
    ticks1=$(cpu_ticks "$wpid")
    acc1=$(origin_accepts)
    # Upstream TLS connections of this run that resumed a session (nginx logs "r" for those).
    local resumed_pct=""
    if [ "$scenario" = tls_newconn_c16 ]; then
        resumed_pct=$(tail -n +"$((reused0 + 1))" "$WORK/origin/tls-reused.log" |
            awk '{ n++; if ($1 == "r") r++ } END { if (n) printf "%.1f", 100 * r / n }')
    fi
    local line
    line=$(grep '^BENCH ' "$out") || { cat "$out" >&2; die "no BENCH line from wrk"; }
    # Parse key=value pairs into local variables r_<key>.
    local kv r_requests r_duration_us r_bytes r_rps r_p50_us r_p99_us r_mib_s r_errors r_non2xx
    # shellcheck disable=SC2086 # split the key=value words on purpose
    for kv in ${line#BENCH }; do printf -v "r_${kv%%=*}" '%s' "${kv#*=}"; done
    local pid
    pid=$(pid_of "$target")
    if ! kill -0 "$pid" 2>/dev/null; then
        tail -n 20 "$(log_of "$target")" >&2 || true
        die "$target (pid $pid) died during $scenario round $round (log above)"
    fi
    if [ "$r_errors" != 0 ] || [ "$r_non2xx" != 0 ]; then
        log "warning: $target $scenario round $round: $r_errors socket errors, $r_non2xx non-2xx responses"
    fi
    [ "$round" = warmup ] && return 0
    local cpu_us="" conns_1k=""
    if [ "$target" != origin ] && [ "${r_requests:-0}" -gt 0 ]; then
        cpu_us=$(awk -v t=$((ticks1 - ticks0)) -v hz="$CLK_TCK" -v n="$r_requests" 'BEGIN { printf "%.2f", t / hz / n * 1e6 }')
        if [ -n "$acc0" ] && [ -n "$acc1" ]; then
            conns_1k=$(awk -v a=$((acc1 - acc0)) -v n="$r_requests" 'BEGIN { printf "%.3f", a / n * 1000 }')
        fi
    fi
    printf '%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$round" "$scenario" "$target" "$conns" \
        "$(awk -v d="$r_duration_us" 'BEGIN { printf "%.3f", d / 1e6 }')" \
        "$r_requests" "$r_rps" "$r_p50_us" "$r_p99_us" "$r_bytes" "$r_mib_s" "$r_errors" "$r_non2xx" "$cpu_us" "$conns_1k" "$resumed_pct" >>"$CSV"
    log "round $round $scenario $target: rps=$r_rps p50=${r_p50_us}us p99=${r_p99_us}us MiB/s=$r_mib_s cpu/req=${cpu_us}us origin conns/1k=${conns_1k}"
}

# --------------------------------------------------------------------------- idle connections
# IDLE_CONNS keep-alive connections, one request each, then held idle: RSS growth per connection.
# Before any load, so that memory freed by earlier runs cannot hide the growth.
declare -A IDLE_KIB_PER_CONN=() IDLE_OK=()
if [ "$IDLE_CONNS" -gt 0 ]; then
    for t in "${TARGET_LIST[@]}"; do
        case "$t" in origin|bearerd_log) continue ;; esac
        wpid=$(work_pid_of "$t")
        before=$(vm_rss_kib "$wpid")
        fifo="$WORK/idle-$t.fifo"
        mkfifo "$fifo"
        n_idle=$IDLE_CONNS
        if [ "$t" = haproxy ] && [ "$n_idle" -gt $((HAPROXY_MAXCONN - 100)) ]; then n_idle=$((HAPROXY_MAXCONN - 100)); fi
        "${PIN_LOAD[@]}" python3 "$REPO/bench/idle_conns.py" 127.0.0.1 "$(port_of "$t")" "$n_idle" <"$fifo" >"$WORK/idle-$t.out" 2>&1 &
        idle_pid=$!
        exec 9>"$fifo"   # hold the script's stdin open until the measurement is taken
        for i in $(seq 600); do
            grep -q '^READY' "$WORK/idle-$t.out" 2>/dev/null && break
            kill -0 "$idle_pid" 2>/dev/null || break
            sleep 0.1
        done
        sleep 1
        after=$(vm_rss_kib "$wpid")
        ready=$(grep '^READY' "$WORK/idle-$t.out" || echo "READY ok=0 errors=$n_idle")
        exec 9>&-
        wait "$idle_pid" 2>/dev/null || true
        ok=$(sed -n 's/.*ok=\([0-9]*\).*/\1/p' <<<"$ready")
        errs=$(sed -n 's/.*errors=\([0-9]*\).*/\1/p' <<<"$ready")
        IDLE_OK[$t]="$ok/$n_idle ok, $errs errors"
        if [ "${ok:-0}" -gt 0 ] && [ -n "$before" ] && [ -n "$after" ]; then
            IDLE_KIB_PER_CONN[$t]=$(awk -v a="$after" -v b="$before" -v n="$ok" 'BEGIN { printf "%.1f", (a - b) / n }')
        fi
        log "idle connections $t: ${IDLE_OK[$t]}, RSS $before -> $after KiB"
        sleep 2   # let the proxy notice the closes
    done
fi

log "cores: $NCPU; proxies on cpu $PROXY_CPUS, wrk + origin ($ORIGIN_WORKERS worker(s)) on cpu $LOAD_CPUS"
log "warm-up"
for scenario in "${SCENARIOS[@]}"; do
    for t in "${TARGET_LIST[@]}"; do if takes_part "$scenario" "$t"; then run_wrk warmup "$scenario" "$t" 1; fi; done
done

n_targets=${#TARGET_LIST[@]}
for ((round = 1; round <= ROUNDS; round++)); do
    for scenario in "${SCENARIOS[@]}"; do
        for ((i = 0; i < n_targets; i++)); do
            # Rotate the starting target each round.
            t=${TARGET_LIST[$(((i + round - 1) % n_targets))]}
            takes_part "$scenario" "$t" || continue
            run_wrk "$round" "$scenario" "$t" "$DURATION"
        done
    done
done

# --------------------------------------------------------------------------- memory
vm_hwm_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status" 2>/dev/null || true; }

# --------------------------------------------------------------------------- report
# median SCENARIO TARGET COLUMN: median of a CSV column over the rounds ("" if none).
median() {
    awk -F, -v s="$1" -v t="$2" -v c="$3" 'NR > 1 && $2 == s && $3 == t && $c != "" { print $c }' "$CSV" |
        sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) exit; if (NR % 2) printf "%.2f", v[(NR + 1) / 2]; else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# Column numbers in the CSV.
COL_RPS=7 COL_P50=8 COL_P99=9 COL_MIBS=11 COL_CPU=14 COL_CONNS=15 COL_RESUMED=16

# ratio KIND B REF: "0.93x" (KIND higher, lower or latency: lower, with the µs difference).
ratio() {
    local kind=$1 b=$2 n=$3
    [ -n "$b" ] && [ -n "$n" ] || { echo "-"; return; }
    awk -v n="$n" -v b="$b" -v k="$kind" 'BEGIN {
        r = (n > 0) ? sprintf("%.2fx", b / n) : "n/a"
        if (k == "latency") printf "%s (%+.0f us)", r, b - n; else printf "%s", r }'
}

# paired SCENARIO TARGET REF COLUMN KIND: the median over rounds of TARGET/REF within each round
# (latency: the difference in us), "-" if no round has both. Rounds run the targets back to back,
# so a round's ratio is not moved by the drift of a shared machine between rounds, which the
# medians of each target taken apart can be (a target's median and another's may come from
# rounds tens of seconds and several per cent of machine speed apart).
paired() {
    awk -F, -v s="$1" -v t="$2" -v r="$3" -v c="$4" 'NR > 1 && $2 == s && $c != "" {
            if ($3 == t) b[$1] = $c; else if ($3 == r) n[$1] = $c }
        END { for (k in b) if ((k in n) && n[k] > 0) print b[k], n[k] }' "$CSV" |
        awk -v k="$5" '{ print (k == "latency") ? $1 - $2 : $1 / $2 }' |
        sort -g |
        awk -v k="$5" '{ v[NR] = $1 } END {
            if (NR == 0) { print "-"; exit }
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            if (k == "latency") printf "%+.0f us", m; else printf "%.2fx", m }'
}

fmt_row() { # LABEL METRIC COLUMN SCENARIO KIND(higher|lower|latency)
    local label=$1 metric=$2 col=$3 scenario=$4 kind=$5 o n h b
    o=$(median "$scenario" origin "$col"); n=$(median "$scenario" nginx "$col")
    h=$(median "$scenario" haproxy "$col"); b=$(median "$scenario" bearerd "$col")
    printf '%-24s %-9s %10s %10s %10s %10s   %-18s %-18s %s\n' "$label" "$metric" "${o:--}" "${n:--}" "${h:--}" "${b:--}" \
        "$(ratio "$kind" "$b" "$n")" "$(paired "$scenario" bearerd nginx "$col" "$kind")" "$(ratio "$kind" "$b" "$h")"
}

SUMMARY=$OUT_DIR/bench-$STAMP.txt
{
    echo "bearerd benchmark $STAMP  commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "rounds=$ROUNDS duration=${DURATION}s cores=$NCPU proxy_cpus=$PROXY_CPUS load_cpus=$LOAD_CPUS newconn_load_cpus=$NEWCONN_LOAD_CPUS bearerd_auth=$BEARERD_AUTH bearerd_io=${BEARERD_IO:-default} bearerd_loops=${BEARERD_LOOPS:-default}"
    echo "medians across rounds; ratios > 1 are better for req/s and MiB/s, < 1 for latency, CPU and memory;"
    echo "paired: the median over rounds of the ratio within each round (robust to drift between rounds)"
    echo
    printf '%-24s %-9s %10s %10s %10s %10s   %-18s %-18s %s\n' scenario metric origin nginx haproxy bearerd bearerd/nginx "  paired" bearerd/haproxy
    fmt_row "/small 64 conns" "req/s" "$COL_RPS" small_c64 higher
    fmt_row "/small 64 conns" "CPU us/req" "$COL_CPU" small_c64 lower
    fmt_row "/small 64 conns" "orig.conn/1k" "$COL_CONNS" small_c64 lower
    fmt_row "new conn per request" "req/s" "$COL_RPS" newconn_c16 higher
    fmt_row "new conn per request" "CPU us/req" "$COL_CPU" newconn_c16 lower
    fmt_row "new conn, wrk -t2 -c64" "req/s" "$COL_RPS" newconn_c64t2 higher
    fmt_row "new conn, wrk -t2 -c64" "CPU us/req" "$COL_CPU" newconn_c64t2 lower
    fmt_row "/small 1 conn" "p50 us" "$COL_P50" small_c1 latency
    fmt_row "/small 1 conn" "p99 us" "$COL_P99" small_c1 latency
    fmt_row "/small 1 conn" "req/s" "$COL_RPS" small_c1 higher
    fmt_row "/big 1MiB 8 conns" "MiB/s" "$COL_MIBS" big_c8 higher
    fmt_row "/big 1MiB 8 conns" "CPU us/MiB" "$COL_CPU" big_c8 lower
    fmt_row "h2c 4 conns x 16 str" "req/s" "$COL_RPS" h2c_c4m16 higher
    fmt_row "TLS upstream, 64 conns" "req/s" "$COL_RPS" tls_small_c64 higher
    fmt_row "TLS upstream, 64 conns" "CPU us/req" "$COL_CPU" tls_small_c64 lower
    fmt_row "TLS up., client closes" "req/s" "$COL_RPS" tls_close_c16 higher
    fmt_row "TLS up., client closes" "CPU us/req" "$COL_CPU" tls_close_c16 lower
    fmt_row "TLS up., origin closes" "req/s" "$COL_RPS" tls_newconn_c16 higher
    fmt_row "TLS up., origin closes" "CPU us/req" "$COL_CPU" tls_newconn_c16 lower
    fmt_row "TLS up., origin closes" "resumed %" "$COL_RESUMED" tls_newconn_c16 higher
    echo
    if wants bearerd_log && wants bearerd; then
        bl=$(median small_c64 bearerd_log "$COL_RPS"); bo=$(median small_c64 bearerd "$COL_RPS")
        echo "access log (JSON) on, /small 64 conns: $bl req/s vs $bo off: $(ratio higher "$bl" "$bo") (paired $(paired small_c64 bearerd_log bearerd "$COL_RPS" higher))"
    fi
    for t in nginx haproxy bearerd; do
        wants "$t" || continue
        printf 'idle RSS %-8s %8s KiB' "$t" "${IDLE_RSS[$t]:--}"
        if [ -n "${IDLE_OK[$t]:-}" ]; then printf '   idle conns: %s KiB per conn (%s)' "${IDLE_KIB_PER_CONN[$t]:--}" "${IDLE_OK[$t]}"; fi
        hwm=$(vm_hwm_kib "$(work_pid_of "$t")")
        printf '   peak RSS %s KiB\n' "${hwm:--}"
    done
    echo "raw results: $CSV"
} | tee "$SUMMARY"
