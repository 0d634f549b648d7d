#!/usr/bin/env bash
# Side-by-side HTTP/1.1 benchmark on loopback: upstream direct, kamal-proxy, nginx (log off
# and, for information, log on), HAProxy (as configured by default and, for information,
# adding kamal-proxy's request headers) and (when installed) Caddy, all proxying to the
# same nginx `return 200` backend, in two settings: pinned (one core per proxy) and unpinned
# (both cores, every proxy with two workers). See bench/README.md for how to read the output.
#
# Environment knobs (all optional):
#   SETTINGS="pinned unpinned"   which settings to run, in this order
#   ROUNDS=3         rounds per setting: every target is loaded once a round, each round in
#                    another order (rotated), and each figure is the median of its rounds
#   DURATION=5       seconds per saturated run (wrk -c64), each round
#   C1_DURATION=3    seconds per one-connection latency run (wrk -t1 -c1), each round
#   WARMUP=1         seconds of unmeasured c64 load before each target's runs (0 = none)
#   QUICK=1          smoke mode: ROUNDS=1 DURATION=2 C1_DURATION=2 WARMUP=0
#   CONNECTIONS=64   connections of the saturated run
#   IDLE_CONNS=10000 idle keep-alive connections held open for the "RSS with idle connections" column (0 = skip)
#   KP_BIN=path      use this kamal-proxy binary instead of building the shipped one
#                    (`bash scripts/pgo build`: the release build with the committed profile)
#   KP_STDOUT=path   where kamal-proxy's stdout (its access log) goes, appended; default a
#                    file in the run's temporary directory (a file on disk, as in production)
#   TARGETS="direct kamal-proxy nginx nginx-log haproxy haproxy-hdr caddy"   subset / order (caddy only when installed)
#   BASE_PORT=18400  ports BASE_PORT..BASE_PORT+7 on 127.0.0.1 are used
#   PROXY_CPUS=0  LOAD_CPUS=1  UPSTREAM_CPUS=$LOAD_CPUS   taskset CPU lists of the pinned setting
#   RESULTS_DIR=bench/results   where the JSON goes
#   PERF=1           also `perf record` kamal-proxy during its c64 runs (flat profile saved next to the JSON)
#   KEEP_WORK=1      keep the temporary directory (configs, logs, raw wrk output)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ "${QUICK:-0}" == 1 ]]; then
    ROUNDS="${ROUNDS:-1}"
    DURATION="${DURATION:-2}"
    C1_DURATION="${C1_DURATION:-2}"
    WARMUP="${WARMUP:-0}"
fi
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-5}"
C1_DURATION="${C1_DURATION:-3}"
WARMUP="${WARMUP:-1}"
CONNECTIONS="${CONNECTIONS:-64}"
IDLE_CONNS="${IDLE_CONNS:-10000}"
if [[ -n "${PIN:-}" && -z "${SETTINGS:-}" ]]; then
    # PIN was the knob before the two settings: PIN=0 meant the unpinned run.
    [[ "$PIN" == 0 ]] && SETTINGS=unpinned || SETTINGS=pinned
    echo "bench: PIN=$PIN is obsolete; running SETTINGS=$SETTINGS (the default runs both)" >&2
fi
SETTINGS="${SETTINGS:-pinned unpinned}"
KP_STDOUT="${KP_STDOUT:-}"
BASE_PORT="${BASE_PORT:-18400}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/bench/results}"
PERF="${PERF:-0}"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)

log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf '[bench] ERROR: %s\n' "$*" >&2; exit 1; }

for v in ROUNDS DURATION C1_DURATION WARMUP CONNECTIONS IDLE_CONNS BASE_PORT; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "bench: $v must be a whole number, got '${!v}'" >&2; exit 2; }
done
((DURATION > 0 && DURATION <= 600 && C1_DURATION > 0 && C1_DURATION <= 600 && WARMUP <= 60)) ||
    { echo "bench: durations must be 1..600 s (warmup 0..60 s)" >&2; exit 2; }
((ROUNDS >= 1 && ROUNDS <= 9)) || { echo "bench: ROUNDS must be 1..9" >&2; exit 2; }
((IDLE_CONNS <= 20000)) || { echo "bench: IDLE_CONNS must be at most 20000" >&2; exit 2; }
for s in $SETTINGS; do
    [[ $s == pinned || $s == unpinned ]] || { echo "bench: unknown setting '$s' (known: pinned unpinned)" >&2; exit 2; }
done
[[ -n "${SETTINGS// /}" ]] || { echo "bench: SETTINGS is empty" >&2; exit 2; }

# Caddy is optional: in the default targets only when installed, skipped when asked for but absent.
if [[ -z "${TARGETS:-}" ]]; then
    TARGETS="direct kamal-proxy nginx nginx-log haproxy haproxy-hdr"
    if command -v caddy >/dev/null 2>&1; then
        TARGETS="$TARGETS caddy"
    else
        log "caddy is not installed: not benchmarked (apt-get install -y caddy to add it)"
    fi
elif [[ " $TARGETS " == *" caddy "* ]] && ! command -v caddy >/dev/null 2>&1; then
    log "caddy is not installed: skipping the caddy target (apt-get install -y caddy to add it)"
    TARGETS=$(printf '%s\n' $TARGETS | grep -vx caddy | tr '\n' ' ')
    TARGETS=${TARGETS% }
fi

PORT_UPSTREAM=$BASE_PORT
PORT_KP=$((BASE_PORT + 1))
PORT_KP_HTTPS=$((BASE_PORT + 2)) # passed so kamal-proxy never tries :443; not loaded
PORT_NGINX=$((BASE_PORT + 3))
PORT_HAPROXY=$((BASE_PORT + 4))
PORT_CADDY=$((BASE_PORT + 5))
PORT_NGINX_LOG=$((BASE_PORT + 6))
PORT_HAPROXY_HDR=$((BASE_PORT + 7))
ALL_PORTS="$PORT_UPSTREAM $PORT_KP $PORT_KP_HTTPS $PORT_NGINX $PORT_HAPROXY $PORT_CADDY $PORT_NGINX_LOG $PORT_HAPROXY_HDR"

# ---------------------------------------------------------------- cleanup ---
WORK=""
PIDS=()    # every long-running process we started (servers, samplers, clients)
NAMES=()
track() { PIDS+=("$1"); NAMES+=("$2"); }
untrack() { # pid: a process we stopped and waited for ourselves, so its pid may be reused
    local i
    for i in "${!PIDS[@]}"; do
        if [[ "${PIDS[i]}" == "$1" ]]; then
            PIDS=("${PIDS[@]:0:i}" "${PIDS[@]:i+1}")
            NAMES=("${NAMES[@]:0:i}" "${NAMES[@]:i+1}")
            return 0
        fi
    done
}
# Stops every tracked process from index $1 on, newest first: SIGTERM, 5 s, then SIGKILL.
stop_from() {
    local from=$1 i deadline
    for ((i = ${#PIDS[@]} - 1; i >= from; i--)); do
        kill -TERM "${PIDS[i]}" 2>/dev/null || true
    done
    deadline=$((SECONDS + 5))
    for ((i = ${#PIDS[@]} - 1; i >= from; i--)); do
        while kill -0 "${PIDS[i]}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
        if kill -0 "${PIDS[i]}" 2>/dev/null; then
            log "${NAMES[i]} (pid ${PIDS[i]}) ignored SIGTERM; sending SIGKILL"
            kill -KILL "${PIDS[i]}" 2>/dev/null || true
        fi
        wait "${PIDS[i]}" 2>/dev/null || true
    done
    PIDS=("${PIDS[@]:0:from}")
    NAMES=("${NAMES[@]:0:from}")
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_from 0
    if [[ -n "$WORK" && -d "$WORK" ]]; then
        if ((rc != 0 && rc != 130 && rc != 143)); then
            # Show the tail of every server log to explain the failure.
            local f
            for f in "$WORK"/*/*.log "$WORK"/*/*/*.log; do
                [[ -s "$f" && "$f" != */access.log ]] || continue
                echo "----- ${f#"$WORK"/} (last 15 lines) -----" >&2
                tail -n 15 "$f" >&2 || true
            done
        fi
        if [[ "${KEEP_WORK:-0}" == 1 ]]; then log "kept work dir $WORK"; else rm -rf "$WORK"; fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'printf "[bench] ERROR: command failed (line %s): %s\n" "$LINENO" "$BASH_COMMAND" >&2' ERR
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

# ------------------------------------------------------------ prerequisites ---
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found; install with: apt-get install -y nginx haproxy wrk python3 (caddy optional)"; }
need wrk
for t in $TARGETS; do
    case $t in
        direct | kamal-proxy) ;;
        nginx | nginx-log) need nginx ;;
        haproxy | haproxy-hdr) need haproxy ;;
        caddy) need caddy ;;
        *) die "unknown target '$t' (known: direct kamal-proxy nginx nginx-log haproxy haproxy-hdr caddy)" ;;
    esac
done
need nginx # the upstream backend
((IDLE_CONNS == 0)) || need python3

NCPU=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
if [[ " $SETTINGS " == *" pinned "* ]] && { ! command -v taskset >/dev/null 2>&1 || ((NCPU < 2)); }; then
    log "taskset unavailable or fewer than 2 CPUs: skipping the pinned setting"
    SETTINGS=$(printf '%s\n' $SETTINGS | grep -vx pinned | tr '\n' ' ')
    SETTINGS=${SETTINGS% }
    [[ -n "$SETTINGS" ]] || die "no setting left to run (SETTINGS=unpinned runs without taskset)"
fi
PROXY_CPUS="${PROXY_CPUS:-0}"
LOAD_CPUS="${LOAD_CPUS:-1}"
UPSTREAM_CPUS="${UPSTREAM_CPUS:-$LOAD_CPUS}"

# Descriptors: IDLE_CONNS client connections to one proxy, plus its upstream side. The peers
# and the client inherit this limit (root may raise the hard limit; others get their hard limit).
if ((IDLE_CONNS > 0)); then
    ulimit -Hn 65536 2>/dev/null || true
    hard=$(ulimit -Hn)
    [[ "$hard" == unlimited ]] && hard=65536
    ulimit -Sn $((hard < 65536 ? hard : 65536))
    (($(ulimit -Sn) >= IDLE_CONNS + 1000)) ||
        die "open files limit $(ulimit -Sn) is too low for IDLE_CONNS=$IDLE_CONNS (raise the hard limit, or lower IDLE_CONNS)"
fi
NOFILE=$(ulimit -Sn)
NGX_RLIMIT=$((NOFILE < 40000 ? NOFILE : 40000))
NGX_CONNS=$((IDLE_CONNS + 4096))
HAP_MAXCONN=$((IDLE_CONNS + 1000))

KP_WANTED=0
[[ " $TARGETS " == *" kamal-proxy "* ]] && KP_WANTED=1
if ((KP_WANTED)); then
    if [[ -n "${KP_BIN:-}" ]]; then
        [[ -x "$KP_BIN" ]] || die "KP_BIN=$KP_BIN is not an executable file"
    else
        need cargo
        # The binary we ship: the release build with the committed profile.
        log "building kamal-proxy (bash scripts/pgo build)"
        KP_BIN=$(bash "$ROOT/scripts/pgo" build | tail -n 1) || die "bash scripts/pgo build failed"
        [[ "$KP_BIN" == /* ]] || KP_BIN="$ROOT/$KP_BIN"
        [[ -x "$KP_BIN" ]] || die "build finished but $KP_BIN is missing"
    fi
fi
if [[ "$PERF" == 1 ]]; then
    command -v perf >/dev/null 2>&1 || die "PERF=1 but perf is not installed (apt-get install -y linux-perf)"
    ((KP_WANTED)) || die "PERF=1 profiles kamal-proxy, which is not in TARGETS"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/kamal-proxy-bench.XXXXXX")"
if ((KP_WANTED)); then
    # Run a copy written now. The kernel maps code 64 KiB around each page a process
    # touches, but only pages already in the page cache, so the same binary's RSS moves by
    # about half a MiB with its file's history: every page cached just after it was written,
    # fewer once it has aged. A copy made now is the state a proxy starts in after an image
    # pull, and the same for every build measured (bench/README.md, "Thirty-first round").
    KP_RUN="$WORK/kamal-proxy"
    cp "$KP_BIN" "$KP_RUN"
fi

# ------------------------------------------------------------------ helpers ---
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

check_ports_free() {
    local p
    for p in $ALL_PORTS; do
        if port_open "$p"; then die "127.0.0.1:$p is already in use; pick other ports with BASE_PORT=..."; fi
    done
}

wait_port() { # port name pid [timeout_s]
    local port=$1 name=$2 pid=$3 deadline=$((SECONDS + ${4:-20}))
    until port_open "$port"; do
        kill -0 "$pid" 2>/dev/null || die "$name exited before listening on 127.0.0.1:$port"
        ((SECONDS < deadline)) || die "$name did not accept connections on 127.0.0.1:$port within ${4:-20}s"
        sleep 0.1
    done
}

# One HTTP/1.1 GET over bash's /dev/tcp; prints the status code (or nothing).
http_status() {
    local port=$1 line=""
    {
        exec 3<>"/dev/tcp/127.0.0.1/$port" || return 0
        printf 'GET / HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nConnection: close\r\n\r\n' "$port" >&3
        IFS= read -r -t 5 line <&3 || true
        exec 3<&- 3>&-
    } 2>/dev/null
    line=${line%$'\r'}
    [[ "$line" =~ ^HTTP/1\.[01]\ ([0-9]{3}) ]] && echo "${BASH_REMATCH[1]}"
    return 0
}

check_200() { # port name
    local code deadline=$((SECONDS + 10))
    while :; do
        code=$(http_status "$1")
        [[ "$code" == 200 ]] && return 0
        ((SECONDS < deadline)) || die "$2 on 127.0.0.1:$1 answered '${code:-no response}' instead of 200"
        sleep 0.2
    done
}

# pid and all of its descendants (nginx/haproxy/caddy workers).
tree_pids() {
    local p=$1 c kids
    [[ -d /proc/$p ]] || return 0
    echo "$p"
    for c in /proc/"$p"/task/*/children; do
        { kids=$(<"$c"); } 2>/dev/null || continue
        for k in $kids; do tree_pids "$k"; done
    done
}

rss_kb() { # sum of VmRSS over the process tree, in KiB
    local total=0 p k v rest
    for p in $(tree_pids "$1"); do
        while read -r k v rest; do
            if [[ "$k" == VmRSS: ]]; then total=$((total + v)); break; fi
        done <"/proc/$p/status" 2>/dev/null || true
    done
    echo "$total"
}

cpu_ticks() { # utime+stime (all threads) over the process tree, in clock ticks
    local total=0 p s f
    for p in $(tree_pids "$1"); do
        { s=$(<"/proc/$p/stat"); } 2>/dev/null || continue
        s=${s##*) }
        read -r -a f <<<"$s"
        total=$((total + f[11] + f[12]))
    done
    echo "$total"
}
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)

core_ticks() { # cpu-number -> "busy total" ticks of that CPU from /proc/stat
    local name v rest
    while read -r name rest; do
        if [[ "$name" == "cpu$1" ]]; then
            read -r -a v <<<"$rest" # user nice system idle iowait irq softirq steal ...
            echo "$((v[0] + v[1] + v[2] + v[5] + v[6] + v[7])) $((v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]))"
            return 0
        fi
    done </proc/stat
    echo "0 0"
}

# Background RSS sampler: every 200 ms, writes the peak so far to a file.
SAMPLER_PID=""
start_sampler() { # pid outfile
    local pid=$1 out=$2
    (
        trap 'exit 0' TERM
        peak=0
        while :; do
            r=$(rss_kb "$pid")
            ((r > peak)) && peak=$r
            echo "$peak" >"$out.tmp" && mv -f "$out.tmp" "$out"
            sleep 0.2
        done
    ) &
    SAMPLER_PID=$!
    track "$SAMPLER_PID" "rss-sampler"
}
stop_sampler() {
    [[ -n "$SAMPLER_PID" ]] || return 0
    kill -TERM "$SAMPLER_PID" 2>/dev/null || true
    wait "$SAMPLER_PID" 2>/dev/null || true
    untrack "$SAMPLER_PID"
    SAMPLER_PID=""
}

USER_LINE=""
[[ "$(id -u)" == 0 ]] && USER_LINE="user root;"

nginx_conf() { # dir port workers server-block-body [http-extra]
    local dir=$1
    mkdir -p "$dir/tmp"
    cat >"$dir/nginx.conf" <<EOF
$USER_LINE
daemon off;
master_process on;
worker_processes $3;
worker_rlimit_nofile $NGX_RLIMIT;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections $NGX_CONNS; }
http {
    access_log off;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    ${5:-}
    server {
        listen 127.0.0.1:$2;
        $4
    }
}
EOF
}

declare -A PORT_OF
PORT_OF[direct]=$PORT_UPSTREAM
PORT_OF[kamal-proxy]=$PORT_KP
PORT_OF[nginx]=$PORT_NGINX
PORT_OF[nginx-log]=$PORT_NGINX_LOG
PORT_OF[haproxy]=$PORT_HAPROXY
PORT_OF[haproxy-hdr]=$PORT_HAPROXY_HDR
PORT_OF[caddy]=$PORT_CADDY

# Per setting, set by configure_setting: pinning, wrk threads, peers' workers/threads.
PIN_PROXY=() PIN_LOAD=() PIN_UPSTREAM=()
WORKERS=1 WRK_THREADS=1 SW="" SETTING=""
declare -A PID_OF
configure_setting() { # setting
    SETTING=$1
    SW="$WORK/$1"
    mkdir -p "$SW"
    case $1 in
        pinned)
            PIN_PROXY=(taskset -c "$PROXY_CPUS")
            PIN_LOAD=(taskset -c "$LOAD_CPUS")
            PIN_UPSTREAM=(taskset -c "$UPSTREAM_CPUS")
            WORKERS=1 WRK_THREADS=1
            ;;
        unpinned)
            PIN_PROXY=() PIN_LOAD=() PIN_UPSTREAM=()
            WORKERS=2 WRK_THREADS=2
            ;;
    esac
}
describe_setting() {
    case $SETTING in
        pinned) echo "each proxy on CPU $PROXY_CPUS (nginx 1 worker, HAProxy nbthread 1, kamal-proxy and Caddy size their runtimes from the affinity mask: 1 worker); wrk -t1 on CPU $LOAD_CPUS, backend (1 worker) on CPU $UPSTREAM_CPUS" ;;
        unpinned) echo "nothing pinned, $NCPU CPUs shared by all; nginx worker_processes 2, HAProxy nbthread 2, kamal-proxy and Caddy use every CPU by themselves; wrk -t2; backend 2 workers" ;;
    esac
}

# --------------------------------------------------------------- servers ---
start_upstream() {
    local d="$SW/upstream"
    log "[$SETTING] starting upstream nginx ($WORKERS worker(s)) on 127.0.0.1:$PORT_UPSTREAM"
    nginx_conf "$d" "$PORT_UPSTREAM" "$WORKERS" 'location / { return 200 "hello\n"; }'
    "${PIN_UPSTREAM[@]}" nginx -p "$d" -e "$d/error.log" -c "$d/nginx.conf" >"$d/stdout.log" 2>&1 &
    PID_OF[direct]=$!
    track "${PID_OF[direct]}" "upstream nginx"
    wait_port "$PORT_UPSTREAM" "upstream nginx" "${PID_OF[direct]}"
    check_200 "$PORT_UPSTREAM" "upstream nginx"
}

KP_LOG=""
start_kamal_proxy() {
    local d="$SW/kamal-proxy"
    mkdir -p "$d/home"
    KP_LOG=${KP_STDOUT:-$d/access.log}
    log "[$SETTING] starting kamal-proxy ($KP_BIN, run as $KP_RUN) on 127.0.0.1:$PORT_KP, access log (stdout) -> $KP_LOG"
    HOME="$d/home" KAMAL_PROXY_SOCKET="$d/kamal-proxy.sock" \
        "${PIN_PROXY[@]}" "$KP_RUN" run --http-port="$PORT_KP" --https-port="$PORT_KP_HTTPS" \
        >>"$KP_LOG" 2>"$d/stderr.log" &
    PID_OF[kamal-proxy]=$!
    track "${PID_OF[kamal-proxy]}" "kamal-proxy"
    wait_port "$PORT_KP" kamal-proxy "${PID_OF[kamal-proxy]}"
    local deadline=$((SECONDS + 10))
    until [[ -S "$d/kamal-proxy.sock" ]]; do
        ((SECONDS < deadline)) || die "kamal-proxy control socket $d/kamal-proxy.sock never appeared"
        sleep 0.1
    done
    HOME="$d/home" KAMAL_PROXY_SOCKET="$d/kamal-proxy.sock" \
        timeout 60 "$KP_RUN" deploy bench --target="127.0.0.1:$PORT_UPSTREAM" >"$d/deploy.log" 2>&1 ||
        die "kamal-proxy deploy bench --target=127.0.0.1:$PORT_UPSTREAM failed: $(tail -n 5 "$d/deploy.log")"
}

# nginx-log's access line: the fields of kamal-proxy's line that nginx has, in its order
# (duration in seconds here, nanoseconds there). nginx expands the $ variables per request.
NGINX_LOG_FORMAT='{"time":"$time_iso8601","level":"INFO","msg":"Request","host":"$http_host","port":$server_port,'\
'"path":"$uri","request_id":"$http_x_request_id","status":$status,"target":"$upstream_addr",'\
'"duration":$request_time,"method":"$request_method","req_content_length":"$content_length",'\
'"resp_content_length":$body_bytes_sent,"resp_content_type":"$sent_http_content_type",'\
'"client_addr":"$remote_addr","client_port":"$remote_port","remote_addr":"$remote_addr",'\
'"user_agent":"$http_user_agent","proto":"$server_protocol","scheme":"$scheme","query":"$args"}'
NGINX_PROXY_LOCATION='location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header Host $host; }'
start_nginx_proxy() { # target (nginx | nginx-log)
    local t=$1 d="$SW/$1" extra body=$NGINX_PROXY_LOCATION
    extra="upstream app { server 127.0.0.1:$PORT_UPSTREAM; keepalive 64; keepalive_requests 1000000; }"
    if [[ $t == nginx-log ]]; then
        # JSON-escaped and buffered, as a production nginx writes its log.
        extra+="
    log_format bench_json escape=json '$NGINX_LOG_FORMAT';"
        # In the server block: nginx_conf's http-level `access_log off` would cancel it there.
        body="access_log $d/access.log bench_json buffer=64k flush=1s; $body"
    fi
    log "[$SETTING] starting $t reverse proxy ($WORKERS worker(s)) on 127.0.0.1:${PORT_OF[$t]}"
    nginx_conf "$d" "${PORT_OF[$t]}" "$WORKERS" "$body" "$extra"
    "${PIN_PROXY[@]}" nginx -p "$d" -e "$d/error.log" -c "$d/nginx.conf" >"$d/stdout.log" 2>&1 &
    PID_OF[$t]=$!
    track "${PID_OF[$t]}" "$t proxy"
    wait_port "${PORT_OF[$t]}" "$t proxy" "${PID_OF[$t]}"
}

# haproxy-hdr's additions: the request headers kamal-proxy adds to every request it forwards
# (kamal-proxy-upstream.md §3.8), each set as kamal-proxy sets it, so the backend parses the
# same request. Its row is for information: how much of the gap to HAProxy is the work
# these headers cost HAProxy and the backend.
HAPROXY_HDR_RULES='    option forwardfor
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    http-request set-header X-Forwarded-Proto http
    http-request set-header X-Request-ID %[uuid] unless { req.hdr(x-request-id) -m found }
    http-request set-header X-Request-Start t=%[date(0,ms)] unless { req.hdr(x-request-start) -m found }
    http-request set-header X-Kamal-Target 127.0.0.1:'"$PORT_UPSTREAM"
start_haproxy() { # target (haproxy | haproxy-hdr)
    local t=$1 d="$SW/$1" rules=""
    if [[ $t == haproxy-hdr ]]; then rules=$HAPROXY_HDR_RULES; fi
    mkdir -p "$d"
    log "[$SETTING] starting $t (nbthread $WORKERS) on 127.0.0.1:${PORT_OF[$t]}"
    cat >"$d/haproxy.cfg" <<EOF
global
    nbthread $WORKERS
    maxconn $HAP_MAXCONN
    # HAProxy wants two descriptors per connection (client and server); idle keep-alive
    # connections hold one. Without this it refuses to start below 2 x maxconn descriptors.
    no strict-limits
defaults
    mode http
    maxconn $HAP_MAXCONN
    option http-keep-alive
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 75s
frontend fe
    bind 127.0.0.1:${PORT_OF[$t]}
$rules
    default_backend be
backend be
    http-reuse always
    server s1 127.0.0.1:$PORT_UPSTREAM
EOF
    "${PIN_PROXY[@]}" haproxy -db -f "$d/haproxy.cfg" >"$d/stdout.log" 2>&1 &
    PID_OF[$t]=$!
    track "${PID_OF[$t]}" "$t"
    wait_port "${PORT_OF[$t]}" "$t" "${PID_OF[$t]}"
}

start_caddy() {
    local d="$SW/caddy"
    mkdir -p "$d/home"
    log "[$SETTING] starting caddy on 127.0.0.1:$PORT_CADDY"
    cat >"$d/Caddyfile" <<EOF
{
	admin off
	auto_https off
	log {
		output discard
	}
}

http://127.0.0.1:$PORT_CADDY {
	reverse_proxy 127.0.0.1:$PORT_UPSTREAM
}
EOF
    HOME="$d/home" XDG_CONFIG_HOME="$d/home/.config" XDG_DATA_HOME="$d/home/.local/share" \
        "${PIN_PROXY[@]}" caddy run --config "$d/Caddyfile" --adapter caddyfile >"$d/stdout.log" 2>&1 &
    PID_OF[caddy]=$!
    track "${PID_OF[caddy]}" "caddy"
    wait_port "$PORT_CADDY" caddy "${PID_OF[caddy]}"
}

# -------------------------------------------------------------- measuring ---
to_ms() { # wrk duration (e.g. 245.00us, 1.23ms, 2.00s, 1.00m) -> milliseconds
    awk -v x="$1" 'BEGIN {
        if (x == "") { print "null"; exit }
        n = x + 0; u = x; sub(/^[0-9.]+/, "", u)
        if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000; else if (u == "h") n *= 3600000
        printf "%.3f", n }'
}
wrk_field() { # file what
    local f=$1
    case $2 in
        rps) awk '/^Requests\/sec:/ {print $2}' "$f" ;;
        requests) awk '/requests in/ {print $1}' "$f" ;;
        p50) to_ms "$(awk '$1 == "50%" {print $2}' "$f")" ;;
        p99) to_ms "$(awk '$1 == "99%" {print $2}' "$f")" ;;
        errors) awk '/Socket errors:/ {gsub(/,/, ""); s += $4 + $6 + $8 + $10} /Non-2xx or 3xx/ {s += $NF} END {print s + 0}' "$f" ;;
    esac
}

run_wrk() { # out threads connections duration url
    "${PIN_LOAD[@]}" timeout $(($4 + 30)) wrk -t"$2" -c"$3" -d"$4"s --latency "$5" >"$1" 2>&1 ||
        die "wrk failed against $5: $(tail -n 5 "$1")"
    grep -q '^Requests/sec:' "$1" || die "wrk produced no result against $5: $(tail -n 5 "$1")"
}

# Results, keyed "setting/target".
declare -A RPS P50 P99 C1P50 IDLE_KB LOAD_KB CONNS_KB CONNS_OPEN CONNS_JSON CPU_US CPU_PCT OTHER_PCT ERRS
declare -A RPS_R P50_R P99_R C1P50_R CPU_US_R CPU_PCT_R OTHER_PCT_R # one value per round, space separated
declare -A S_DESC S_LOADAVG S_KPLOG

# RSS of the target with IDLE_CONNS idle keep-alive connections open to it, each having
# carried one request: the peak of five readings over the second after all were opened.
measure_idle_conns() { # target
    local t=$1 k="$SETTING/$1" pid=${PID_OF[$1]} ready="$SW/$1.conns.ready" out="$SW/$1.conns.json" cpid deadline peak=0 r i
    log "[$SETTING] $t: opening $IDLE_CONNS idle keep-alive connections"
    "${PIN_LOAD[@]}" python3 "$ROOT/bench/idle_conns.py" --port "${PORT_OF[$t]}" --count "$IDLE_CONNS" \
        --ready-file "$ready" >"$out" 2>"$SW/$t.conns.log" &
    cpid=$!
    track "$cpid" "idle-connections client"
    deadline=$((SECONDS + 180))
    until [[ -s "$ready" ]]; do
        kill -0 "$cpid" 2>/dev/null || die "the idle-connections client exited early: $(tail -n 5 "$SW/$t.conns.log")"
        ((SECONDS < deadline)) || die "$IDLE_CONNS connections to $t were not opened within 180 s"
        sleep 0.2
    done
    for i in 1 2 3 4 5; do
        r=$(rss_kb "$pid")
        ((r > peak)) && peak=$r
        sleep 0.2
    done
    CONNS_KB[$k]=$peak
    kill -TERM "$cpid" 2>/dev/null || true
    wait "$cpid" || die "the idle-connections client failed: $(tail -n 5 "$SW/$t.conns.log")"
    untrack "$cpid"
    CONNS_JSON[$k]=$(head -n 1 "$out")
    [[ "${CONNS_JSON[$k]}" == "{"* ]] || die "the idle-connections client printed no report: $(tail -n 5 "$SW/$t.conns.log")"
    # Open at the end of the hold: the proxy kept them all while its RSS was read.
    CONNS_OPEN[$k]=$(sed -E 's/.*"open_at_end": ([0-9]+).*/\1/' <<<"${CONNS_JSON[$k]}")
    if ((CONNS_OPEN[$k] < IDLE_CONNS)); then
        log "[$SETTING] $t: only ${CONNS_OPEN[$k]} of $IDLE_CONNS connections stayed open: ${CONNS_JSON[$k]}"
    fi
}

# Appends one round's value to a target's list (NAME_R[key], space separated).
add_round() { # array key value
    local -n list=$1
    list[$2]+="$3 "
}
# The median of a list of numbers; "-" when any round had none (other% unpinned).
median_of() {
    [[ " $1 " == *" - "* || -z "${1// /}" ]] && { printf -- -; return; }
    tr ' ' '\n' <<<"$1" | grep . | sort -g |
        awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

measure_target() { # target round: one round's loads of a target, added to its lists
    local t=$1 round=$2 k="$SETTING/$1" url="http://127.0.0.1:${PORT_OF[$1]}/" pid=${PID_OF[$1]}
    local ticks0 ticks1 cb0=0 ct0=0 cb1=0 ct1=0 t0 t1 r f reqs cu cp perf_pid="" single_cpu=""
    [[ $SETTING == pinned && "$PROXY_CPUS" =~ ^[0-9]+$ ]] && single_cpu=$PROXY_CPUS
    if ((WARMUP > 0)); then run_wrk "$SW/$t.warmup.txt" "$WRK_THREADS" "$CONNECTIONS" "$WARMUP" "$url"; fi

    log "[$SETTING] round $round/$ROUNDS, $t: c$CONNECTIONS for ${DURATION}s"
    start_sampler "$pid" "$SW/$t.peak"
    if [[ "$PERF" == 1 && $t == kamal-proxy && "${PERF_DONE:-}" != "$SETTING" ]]; then
        "${PIN_LOAD[@]}" perf record -F 999 -p "$pid" -o "$SW/kp.perf.data" -- sleep "$DURATION" \
            >"$SW/perf-record.log" 2>&1 &
        perf_pid=$!
        track "$perf_pid" "perf record"
    fi
    ticks0=$(cpu_ticks "$pid")
    [[ -n "$single_cpu" ]] && read -r cb0 ct0 < <(core_ticks "$single_cpu")
    t0=$(date +%s.%N)
    run_wrk "$SW/$t.c$CONNECTIONS.txt" "$WRK_THREADS" "$CONNECTIONS" "$DURATION" "$url"
    t1=$(date +%s.%N)
    ticks1=$(cpu_ticks "$pid")
    [[ -n "$single_cpu" ]] && read -r cb1 ct1 < <(core_ticks "$single_cpu")
    stop_sampler
    # "other%": CPU time on the proxy's core used by anything but the proxy (other
    # processes, plus interrupt/softirq time not charged to it). Only when pinned to one CPU.
    local other="-"
    if [[ -n "$single_cpu" && $t != direct ]] && ((ct1 > ct0)); then
        other=$(((100 * (cb1 - cb0 - (ticks1 - ticks0))) / (ct1 - ct0)))
        ((other >= 0)) || other=0
    fi
    add_round OTHER_PCT_R "$k" "$other"
    if [[ -n "$perf_pid" ]]; then
        # One profile a setting: its first round's (a later one would overwrite it).
        PERF_DONE=$SETTING
        wait "$perf_pid" || log "perf record failed: $(tail -n 3 "$SW/perf-record.log")"
        untrack "$perf_pid"
        if [[ -s "$SW/kp.perf.data" ]]; then
            mkdir -p "$RESULTS_DIR"
            local perf_out="$RESULTS_DIR/$STAMP-$SETTING-kamal-proxy.perf.txt"
            {
                echo "# perf record -F 999 -p <kamal-proxy> during wrk -t$WRK_THREADS -c$CONNECTIONS -d${DURATION}s ($SETTING); flat profile"
                echo "## by shared object"
                perf report -i "$SW/kp.perf.data" --stdio --no-children --sort dso 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 20 || true
                echo "## by symbol (top 80)"
                perf report -i "$SW/kp.perf.data" --stdio --no-children --sort dso,symbol 2>/dev/null | grep -v '^#' | grep -v '^$' |
                    sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//; s/[[:space:]]+$//' | head -n 80 || true
                echo "## user space only (binary + libc), by symbol (top 40)"
                perf report -i "$SW/kp.perf.data" --stdio --no-children --sort dso,symbol 2>/dev/null | grep -v '^#' | grep -v '^$' |
                    grep -v kernel.kallsyms | sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//; s/[[:space:]]+$//' | head -n 40 || true
            } >"$perf_out"
            log "perf profile written to ${perf_out#"$ROOT"/} (req/s of this run is lowered by perf)"
        fi
    fi
    # RSS under load: the highest of every round's peak.
    local peak
    peak=$(cat "$SW/$t.peak" 2>/dev/null || echo 0)
    r=$(rss_kb "$pid")
    ((r > peak)) || r=$peak
    ((r > ${LOAD_KB[$k]:-0})) && LOAD_KB[$k]=$r
    f="$SW/$t.c$CONNECTIONS.txt"
    add_round RPS_R "$k" "$(wrk_field "$f" rps)"
    add_round P50_R "$k" "$(wrk_field "$f" p50)"
    add_round P99_R "$k" "$(wrk_field "$f" p99)"
    ERRS[$k]=$((${ERRS[$k]:-0} + $(wrk_field "$f" errors)))
    reqs=$(wrk_field "$f" requests)
    read -r cu cp < <(awk -v d=$((ticks1 - ticks0)) -v hz="$CLK_TCK" -v n="$reqs" -v a="$t0" -v b="$t1" \
        'BEGIN { s = d / hz; printf "%.1f %.0f\n", (n > 0 ? s * 1e6 / n : 0), (b > a ? 100 * s / (b - a) : 0) }')
    add_round CPU_US_R "$k" "$cu"
    add_round CPU_PCT_R "$k" "$cp"

    log "[$SETTING] round $round/$ROUNDS, $t: c1 for ${C1_DURATION}s"
    run_wrk "$SW/$t.c1.txt" 1 1 "$C1_DURATION" "$url"
    add_round C1P50_R "$k" "$(wrk_field "$SW/$t.c1.txt" p50)"
    ERRS[$k]=$((ERRS[$k] + $(wrk_field "$SW/$t.c1.txt" errors)))

    # Once, after the last round's loads: holding 10,000 connections is slow, and its RSS
    # varies little from round to round.
    if ((round == ROUNDS)) && [[ $t != direct ]] && ((IDLE_CONNS > 0)); then measure_idle_conns "$t"; fi
    kill -0 "$pid" 2>/dev/null || die "$t exited during the run"
}

# Each figure of a target in a setting: the median of its rounds (req/s, latencies, CPU).
settle_rounds() { # setting
    local t k
    for t in $TARGETS; do
        k="$1/$t"
        RPS[$k]=$(median_of "${RPS_R[$k]}")
        P50[$k]=$(median_of "${P50_R[$k]}")
        P99[$k]=$(median_of "${P99_R[$k]}")
        CPU_US[$k]=$(median_of "${CPU_US_R[$k]}")
        CPU_PCT[$k]=$(median_of "${CPU_PCT_R[$k]}")
        OTHER_PCT[$k]=$(median_of "${OTHER_PCT_R[$k]}")
        C1P50[$k]=$(median_of "${C1P50_R[$k]}")
    done
}

run_setting() { # setting
    local first=${#PIDS[@]} t i
    configure_setting "$1"
    S_DESC[$SETTING]=$(describe_setting)
    log "=== setting $SETTING: ${S_DESC[$SETTING]}"
    check_ports_free
    start_upstream
    for t in $TARGETS; do
        case $t in
            kamal-proxy) start_kamal_proxy ;;
            nginx | nginx-log) start_nginx_proxy "$t" ;;
            haproxy | haproxy-hdr) start_haproxy "$t" ;;
            caddy) start_caddy ;;
        esac
    done
    for t in $TARGETS; do check_200 "${PORT_OF[$t]}" "$t"; done
    S_KPLOG[$SETTING]=$KP_LOG
    # Idle RSS: a fresh server (kamal-proxy with its one service deployed) after ten requests.
    for t in $TARGETS; do
        for i in 1 2 3 4 5 6 7 8 9 10; do
            [[ "$(http_status "${PORT_OF[$t]}")" == 200 ]] || die "$t stopped answering 200 during its ten idle requests"
        done
    done
    log "[$SETTING] all targets answer 200; idle RSS after ten requests each"
    sleep 1
    for t in $TARGETS; do IDLE_KB[$SETTING/$t]=$(rss_kb "${PID_OF[$t]}"); done

    log "[$SETTING] load: $ROUNDS round(s) of wrk -t$WRK_THREADS -c$CONNECTIONS -d${DURATION}s, then wrk -t1 -c1 -d${C1_DURATION}s; warmup ${WARMUP}s; $IDLE_CONNS idle connections after the last"
    # Interleaved: round r starts r-1 targets further along the list, so no target is always
    # loaded first or last (a machine's noise drifts over minutes).
    local -a order=($TARGETS)
    local round n=${#order[@]}
    for ((round = 1; round <= ROUNDS; round++)); do
        for ((i = 0; i < n; i++)); do measure_target "${order[(i + round - 1) % n]}" "$round"; done
    done
    settle_rounds "$SETTING"
    S_LOADAVG[$SETTING]=$(cut -d' ' -f1-3 /proc/loadavg)
    stop_from "$first"
}

# ---------------------------------------------------------------- report ---
mib() { [[ -z "$1" ]] && { printf -- -; return; }; awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
# The added c1 latency can be ~0 or negative on a noisy machine: no ratio then.
div_pos() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "null" || b == "null" || b + 0 <= 0) print "null"; else printf "%.2f", a / b }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "null" || b == "null" || a == "-" || b == "-" || b + 0 == 0) print "null"; else printf "%.2f", a / b }'; }
added() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "null" || b == "null" || a == "" || b == "") print "null"; else printf "%.0f", (a - b) * 1000 }'; }
has() { [[ " $TARGETS " == *" $1 "* ]]; }
added_c1() { # setting target -> µs added to the direct c1 median, or null
    if [[ $2 == direct ]] || ! has direct; then echo null; else added "${C1P50[$1/$2]}" "${C1P50[$1/direct]}"; fi
}
peer_label() { # target -> label of its ratio row
    case $1 in
        nginx | haproxy) echo "$1" ;;
        nginx-log) echo "nginx-log (info)" ;;
        *) echo "$1 (info)" ;;
    esac
}

report_setting() { # setting
    local s=$1 t k c1us add mark v
    local -a cols
    echo
    echo "== $s: ${S_DESC[$s]}"
    echo "   wrk -t$([[ $s == pinned ]] && echo 1 || echo 2) -c$CONNECTIONS -d${DURATION}s (req/s, p50, p99, cpu, load RSS); wrk -t1 -c1 -d${C1_DURATION}s (c1 p50);" \
        "medians of $ROUNDS interleaved round(s); load avg at end: ${S_LOADAVG[$s]}"
    echo
    local HDR="%-12s %9s %8s %8s %8s %9s %8s %5s %6s %8s %8s %8s %6s\n"
    printf "$HDR" target req/s p50_ms p99_ms c1p50_us +c1p50_us cpu_us/r cpu% other% idle_MiB load_MiB 10k_MiB errors
    printf "$HDR" ------------ --------- -------- -------- -------- --------- -------- ----- ------ -------- -------- -------- ------
    for t in $TARGETS; do
        k="$s/$t"
        c1us=$(awk -v x="${C1P50[$k]}" 'BEGIN { printf "%.0f", x * 1000 }')
        add=$(added_c1 "$s" "$t")
        [[ $add == null ]] && add="-"
        mark=""
        [[ -n "${CONNS_OPEN[$k]:-}" ]] && ((CONNS_OPEN[$k] < IDLE_CONNS)) && mark="*"
        printf "$HDR" "$t" "$(printf %.0f "${RPS[$k]}")" "${P50[$k]}" "${P99[$k]}" "$c1us" "$add" \
            "${CPU_US[$k]}" "${CPU_PCT[$k]}" "${OTHER_PCT[$k]}" "$(mib "${IDLE_KB[$k]}")" "$(mib "${LOAD_KB[$k]}")" \
            "$(mib "${CONNS_KB[$k]:-}")$mark" "${ERRS[$k]}"
    done
    ((IDLE_CONNS > 0)) && [[ "$IDLE_CONNS" != 10000 ]] && echo "(10k_MiB: RSS with $IDLE_CONNS idle connections, not 10,000)"
    for t in $TARGETS; do
        k="$s/$t"
        if [[ -n "${CONNS_OPEN[$k]:-}" ]] && ((CONNS_OPEN[$k] < IDLE_CONNS)); then
            echo "NOTE: * $t kept only ${CONNS_OPEN[$k]} of the $IDLE_CONNS idle connections open: ${CONNS_JSON[$k]}"
        fi
    done

    # A pinned proxy that neither used its whole core nor reached the load side's ceiling was starved.
    if [[ $s == pinned && "$PROXY_CPUS" =~ ^[0-9]+$ ]] && has direct; then
        for t in $TARGETS; do
            [[ $t == direct ]] && continue
            k="$s/$t"
            if awk -v c="${CPU_PCT[$k]}" -v r="${RPS[$k]}" -v d="${RPS[$s/direct]}" 'BEGIN { exit !(c < 80 && r < 0.85 * d) }'; then
                echo "NOTE: $t used ${CPU_PCT[$k]}% of a core and stayed below the direct ceiling: its core was shared" \
                    "with other work (other% ${OTHER_PCT[$k]}); its req/s and latency are disturbed — compare cpu_us/r, or rerun on a quiet machine."
            fi
        done
    fi

    if ((KP_WANTED)) && [[ "$TARGETS" != kamal-proxy ]]; then
        echo
        echo "kamal-proxy ÷ peer, $s. req/s: above 1 = kamal-proxy better; every other column: below 1 = kamal-proxy better."
        echo "nginx and haproxy run with their access logs off (kamal-proxy's is on, to ${KP_STDOUT:-a file}): those are the ratios to meet."
        echo "Rows marked (info) are for information: nginx-log is nginx writing a JSON access log like kamal-proxy's;"
        echo "haproxy-hdr is HAProxy adding the request headers kamal-proxy adds (X-Forwarded-For/-Host/-Proto, X-Request-ID, X-Request-Start, X-Kamal-Target)."
        local RHDR="%-19s %7s %7s %8s %8s %8s %8s %8s\n"
        printf "$RHDR" peer req/s p99 +c1p50 cpu_us/r idle_RSS load_RSS 10k_RSS
        for t in $TARGETS; do
            [[ $t == kamal-proxy || $t == direct ]] && continue
            cols=()
            for v in $(ratio_cols "$s" "$t"); do
                if [[ $v == null ]]; then cols+=("-"); else cols+=("${v}x"); fi
            done
            printf "$RHDR" "$(peer_label "$t")" "${cols[@]}"
        done
    fi
}

ratio_cols() { # setting peer -> the seven ratios, space separated (null when not computable)
    local s=$1 p=$2 kp="$1/kamal-proxy" k="$1/$2"
    echo "$(div "${RPS[$kp]}" "${RPS[$k]}") $(div "${P99[$kp]}" "${P99[$k]}")" \
        "$(div_pos "$(added_c1 "$s" kamal-proxy)" "$(added_c1 "$s" "$p")") $(div "${CPU_US[$kp]}" "${CPU_US[$k]}")" \
        "$(div "${IDLE_KB[$kp]}" "${IDLE_KB[$k]}") $(div "${LOAD_KB[$kp]}" "${LOAD_KB[$k]}")" \
        "$(div "${CONNS_KB[$kp]:-}" "${CONNS_KB[$k]:-}")"
}

# ------------------------------------------------------------------- run ---
log "targets: $TARGETS; settings: $SETTINGS; open files limit $NOFILE"
for s in $SETTINGS; do run_setting "$s"; done

REPORT="$WORK/report.txt"
{
    echo
    echo "kamal-proxy bench — $(date -u +%Y-%m-%dT%H:%M:%SZ), ${NCPU} CPUs; all on 127.0.0.1, HTTP/1.1 keep-alive, 6-byte body from an nginx backend"
    if ((KP_WANTED)); then
        where=${KP_STDOUT:-"a file in the run's temporary directory"}
        echo "kamal-proxy's access log is on, written to $where; the peers' logs are off, except nginx-log's (JSON, buffer=64k flush=1s)"
    fi
    echo "RSS summed over each server's processes: idle (fresh, after ten requests), peak under the c$CONNECTIONS load, and with $IDLE_CONNS idle keep-alive connections (10k_MiB; 0 = skipped)"
    for s in $SETTINGS; do report_setting "$s"; done
} >"$REPORT"
cat "$REPORT"

total_errs=0
for s in $SETTINGS; do for t in $TARGETS; do total_errs=$((total_errs + ERRS[$s/$t])); done; done
((total_errs == 0)) || echo "WARNING: some runs had socket errors or non-2xx responses (errors column); see wrk output with KEEP_WORK=1" >&2

# ------------------------------------------------------------------ JSON ---
mkdir -p "$RESULTS_DIR"
json="$RESULTS_DIR/$STAMP.json"
jstr() { local s=$1; s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/ }; printf '"%s"' "$s"; }
num() { [[ -z "$1" || "$1" == null || "$1" == - ]] && printf null || printf '%s' "$1"; }
mibnum() { [[ -z "$1" ]] && printf null || mib "$1"; }
rounds_json() { local v; v=$(echo $1); printf '%s' "${v// /, }"; } # "1 2 3 " -> 1, 2, 3
version_of() { # program -> its version, or null when not installed (never fails: pipefail is on)
    local v=""
    case $1 in
        nginx) command -v nginx >/dev/null 2>&1 && v=$(nginx -v 2>&1 | sed 's/.*nginx\///' || true) ;;
        haproxy) command -v haproxy >/dev/null 2>&1 && v=$(haproxy -v 2>/dev/null | awk 'NR==1{print $3}' || true) ;;
        caddy) command -v caddy >/dev/null 2>&1 && v=$(caddy version 2>/dev/null | awk '{print $1}' || true) ;;
        wrk) v=$({ wrk -v 2>&1 || true; } | awk 'NR==1{print $2}' || true) ;;
    esac
    if [[ -n "$v" ]]; then jstr "$v"; else printf null; fi
}
{
    printf '{\n'
    printf '  "timestamp": %s,\n' "$(jstr "$STAMP")"
    printf '  "git_rev": %s,\n' "$(jstr "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo -dirty)")"
    printf '  "kamal_proxy_bin": %s,\n' "$(jstr "${KP_BIN:-}")"
    printf '  "cpus": %s,\n  "loadavg_end": %s,\n' "$NCPU" "$(jstr "$(cut -d' ' -f1-3 /proc/loadavg)")"
    printf '  "targets": %s,\n' "$(jstr "$TARGETS")"
    printf '  "load": {"tool": "wrk", "rounds": %s, "connections": %s, "duration_s": %s, "c1_duration_s": %s, "warmup_s": %s, "idle_connections": %s},\n' \
        "$ROUNDS" "$CONNECTIONS" "$DURATION" "$C1_DURATION" "$WARMUP" "$IDLE_CONNS"
    printf '  "versions": {"nginx": %s, "haproxy": %s, "caddy": %s, "wrk": %s},\n' \
        "$(version_of nginx)" "$(version_of haproxy)" "$(version_of caddy)" "$(version_of wrk)"
    printf '  "settings": {'
    sfirst=1
    for s in $SETTINGS; do
        ((sfirst)) || printf ','
        sfirst=0
        printf '\n    %s: {\n' "$(jstr "$s")"
        printf '      "description": %s,\n' "$(jstr "${S_DESC[$s]}")"
        if [[ $s == pinned ]]; then
            printf '      "pinning": {"proxy": %s, "wrk": %s, "upstream": %s},\n' "$(jstr "$PROXY_CPUS")" "$(jstr "$LOAD_CPUS")" "$(jstr "$UPSTREAM_CPUS")"
            printf '      "wrk_threads": 1, "nginx_workers": 1, "haproxy_nbthread": 1, "upstream_workers": 1,\n'
        else
            printf '      "pinning": null,\n'
            printf '      "wrk_threads": 2, "nginx_workers": 2, "haproxy_nbthread": 2, "upstream_workers": 2,\n'
        fi
        printf '      "kamal_proxy_stdout": %s,\n' "$(jstr "${S_KPLOG[$s]:-}")"
        printf '      "loadavg_end": %s,\n' "$(jstr "${S_LOADAVG[$s]}")"
        printf '      "results": {\n'
        first=1
        for t in $TARGETS; do
            k="$s/$t"
            ((first)) || printf ',\n'
            first=0
            printf '        %s: {"req_per_s": %s, "p50_ms": %s, "p99_ms": %s, "c1_p50_ms": %s, "c1_p50_added_us": %s, ' \
                "$(jstr "$t")" "$(num "${RPS[$k]}")" "$(num "${P50[$k]}")" "$(num "${P99[$k]}")" "$(num "${C1P50[$k]}")" "$(added_c1 "$s" "$t")"
            printf '"cpu_us_per_req": %s, "cpu_percent": %s, "other_on_core_percent": %s, ' \
                "$(num "${CPU_US[$k]}")" "$(num "${CPU_PCT[$k]}")" "$(num "${OTHER_PCT[$k]}")"
            printf '"rounds_req_per_s": [%s], "rounds_cpu_us_per_req": [%s], "rounds_c1_p50_ms": [%s], ' \
                "$(rounds_json "${RPS_R[$k]}")" "$(rounds_json "${CPU_US_R[$k]}")" "$(rounds_json "${C1P50_R[$k]}")"
            printf '"idle_rss_mib": %s, "load_rss_mib": %s, "idle_conns_rss_mib": %s, "idle_conns": %s, "errors": %s}' \
                "$(mibnum "${IDLE_KB[$k]}")" "$(mibnum "${LOAD_KB[$k]}")" "$(mibnum "${CONNS_KB[$k]:-}")" "${CONNS_JSON[$k]:-null}" "${ERRS[$k]}"
        done
        printf '\n      }'
        if ((KP_WANTED)); then
            printf ',\n      "ratios_kamal_proxy_over_peer": {\n'
            first=1
            for t in $TARGETS; do
                [[ $t == kamal-proxy || $t == direct ]] && continue
                ((first)) || printf ',\n'
                first=0
                read -r r_rps r_p99 r_c1 r_cpu r_idle r_load r_conns < <(ratio_cols "$s" "$t")
                printf '        %s: {"information_only": %s, "req_per_s": %s, "p99": %s, "c1_p50_added": %s, "cpu_per_req": %s, "idle_rss": %s, "load_rss": %s, "idle_conns_rss": %s}' \
                    "$(jstr "$t")" "$([[ $t == nginx || $t == haproxy ]] && echo false || echo true)" \
                    "$r_rps" "$r_p99" "$r_c1" "$r_cpu" "$r_idle" "$r_load" "$r_conns"
            done
            printf '\n      }'
        fi
        printf '\n    }'
    done
    printf '\n  }\n}\n'
} >"$json"
python3 -m json.tool "$json" >/dev/null 2>&1 || log "warning: $json is not valid JSON"
echo
echo "results written to ${json#"$ROOT"/}"
