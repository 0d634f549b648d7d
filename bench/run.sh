#!/usr/bin/env bash
# Side-by-side HTTP/1.1 benchmark on loopback: upstream direct, kamal-proxy,
# nginx, HAProxy and Caddy, all proxying to the same nginx `return 200` backend.
# See bench/README.md for how to run it and how to read the output.
#
# Environment knobs (all optional):
#   DURATION=10      seconds per saturated run (wrk -t1 -c64)
#   C1_DURATION=5    seconds per one-connection latency run (wrk -t1 -c1)
#   WARMUP=1         seconds of unmeasured c64 load before each target's runs (0 = none)
#   QUICK=1          smoke mode: DURATION=2 C1_DURATION=2 WARMUP=0
#   CONNECTIONS=64   connections of the saturated run
#   KP_BIN=path      use this kamal-proxy binary instead of `cargo build --release`
#   KP_STDOUT=path   where kamal-proxy's stdout (its access log) goes; default /dev/null
#   TARGETS="direct kamal-proxy nginx haproxy caddy"   subset / order of targets
#   BASE_PORT=18400  ports BASE_PORT..BASE_PORT+5 on 127.0.0.1 are used
#   PIN=1            pin with taskset (needs >= 2 CPUs); PIN=0 leaves scheduling to the kernel
#   PROXY_CPUS=0  LOAD_CPUS=1  UPSTREAM_CPUS=$LOAD_CPUS   taskset CPU lists
#   RESULTS_DIR=bench/results   where the JSON goes
#   PERF=1           also `perf record` kamal-proxy during its c64 run (flat profile saved next to the JSON)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ "${QUICK:-0}" == 1 ]]; then
    DURATION="${DURATION:-2}"
    C1_DURATION="${C1_DURATION:-2}"
    WARMUP="${WARMUP:-0}"
fi
DURATION="${DURATION:-10}"
C1_DURATION="${C1_DURATION:-5}"
WARMUP="${WARMUP:-1}"
CONNECTIONS="${CONNECTIONS:-64}"
KP_STDOUT="${KP_STDOUT:-/dev/null}"
TARGETS="${TARGETS:-direct kamal-proxy nginx haproxy caddy}"
BASE_PORT="${BASE_PORT:-18400}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/bench/results}"
PERF="${PERF:-0}"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)

for v in DURATION C1_DURATION WARMUP CONNECTIONS BASE_PORT; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "bench: $v must be a whole number, got '${!v}'" >&2; exit 2; }
done
((DURATION > 0 && DURATION <= 600 && C1_DURATION > 0 && C1_DURATION <= 600 && WARMUP <= 60)) ||
    { echo "bench: durations must be 1..600 s (warmup 0..60 s)" >&2; exit 2; }

PORT_UPSTREAM=$BASE_PORT
PORT_KP=$((BASE_PORT + 1))
PORT_KP_HTTPS=$((BASE_PORT + 2)) # passed so kamal-proxy never tries :443; not loaded
PORT_NGINX=$((BASE_PORT + 3))
PORT_HAPROXY=$((BASE_PORT + 4))
PORT_CADDY=$((BASE_PORT + 5))

log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf '[bench] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- cleanup ---
WORK=""
PIDS=()    # every long-running process we started (servers, samplers)
NAMES=()
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local i
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        kill -TERM "${PIDS[i]}" 2>/dev/null || true
    done
    local deadline=$((SECONDS + 5))
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        while kill -0 "${PIDS[i]}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
        if kill -0 "${PIDS[i]}" 2>/dev/null; then
            log "${NAMES[i]} (pid ${PIDS[i]}) ignored SIGTERM; sending SIGKILL"
            kill -KILL "${PIDS[i]}" 2>/dev/null || true
        fi
        wait "${PIDS[i]}" 2>/dev/null || true
    done
    if [[ -n "$WORK" && -d "$WORK" ]]; then
        if ((rc != 0 && rc != 130 && rc != 143)); then
            # Show the tail of every server log to explain the failure.
            local f
            for f in "$WORK"/*.log "$WORK"/*/*.log; do
                [[ -s "$f" ]] || continue
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

track() { PIDS+=("$1"); NAMES+=("$2"); }

# ------------------------------------------------------------ prerequisites ---
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found; install with: apt-get install -y nginx haproxy caddy wrk nghttp2-client"; }
need wrk
for t in $TARGETS; do
    case $t in
        direct | kamal-proxy) ;;
        nginx) need nginx ;;
        haproxy) need haproxy ;;
        caddy) need caddy ;;
        *) die "unknown target '$t' (known: direct kamal-proxy nginx haproxy caddy)" ;;
    esac
done
need nginx # the upstream backend

NCPU=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
PIN="${PIN:-1}"
if [[ "$PIN" == 1 ]] && { ! command -v taskset >/dev/null 2>&1 || ((NCPU < 2)); }; then
    log "taskset unavailable or fewer than 2 CPUs: running unpinned"
    PIN=0
fi
PROXY_CPUS="${PROXY_CPUS:-0}"
LOAD_CPUS="${LOAD_CPUS:-1}"
UPSTREAM_CPUS="${UPSTREAM_CPUS:-$LOAD_CPUS}"
if [[ "$PIN" == 1 ]]; then
    PIN_PROXY=(taskset -c "$PROXY_CPUS")
    PIN_LOAD=(taskset -c "$LOAD_CPUS")
    PIN_UPSTREAM=(taskset -c "$UPSTREAM_CPUS")
else
    PIN_PROXY=() PIN_LOAD=() PIN_UPSTREAM=()
fi

KP_WANTED=0
[[ " $TARGETS " == *" kamal-proxy "* ]] && KP_WANTED=1
if ((KP_WANTED)); then
    if [[ -n "${KP_BIN:-}" ]]; then
        [[ -x "$KP_BIN" ]] || die "KP_BIN=$KP_BIN is not an executable file"
    else
        need cargo
        log "building kamal-proxy (cargo build --release)"
        (cd "$ROOT" && cargo build --release) || die "cargo build --release failed"
        KP_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/kamal-proxy"
        [[ "$KP_BIN" == /* ]] || KP_BIN="$ROOT/$KP_BIN"
        [[ -x "$KP_BIN" ]] || die "build finished but $KP_BIN is missing"
    fi
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/kamal-proxy-bench.XXXXXX")"

# ------------------------------------------------------------------ helpers ---
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

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
    SAMPLER_PID=""
}

for p in $PORT_UPSTREAM $PORT_KP $PORT_KP_HTTPS $PORT_NGINX $PORT_HAPROXY $PORT_CADDY; do
    if port_open "$p"; then die "127.0.0.1:$p is already in use; pick other ports with BASE_PORT=..."; fi
done

USER_LINE=""
[[ "$(id -u)" == 0 ]] && USER_LINE="user root;"

nginx_conf() { # dir port server-block-body [http-extra]
    local dir=$1
    mkdir -p "$dir/tmp"
    cat >"$dir/nginx.conf" <<EOF
$USER_LINE
daemon off;
master_process on;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    ${4:-}
    server {
        listen 127.0.0.1:$2;
        $3
    }
}
EOF
}

declare -A PID_OF PORT_OF
PORT_OF[direct]=$PORT_UPSTREAM
PORT_OF[kamal-proxy]=$PORT_KP
PORT_OF[nginx]=$PORT_NGINX
PORT_OF[haproxy]=$PORT_HAPROXY
PORT_OF[caddy]=$PORT_CADDY

# --------------------------------------------------------------- upstream ---
log "starting upstream nginx on 127.0.0.1:$PORT_UPSTREAM"
nginx_conf "$WORK/upstream" "$PORT_UPSTREAM" 'location / { return 200 "hello\n"; }'
"${PIN_UPSTREAM[@]}" nginx -p "$WORK/upstream" -e "$WORK/upstream/error.log" -c "$WORK/upstream/nginx.conf" \
    >"$WORK/upstream/stdout.log" 2>&1 &
PID_OF[direct]=$!
track "${PID_OF[direct]}" "upstream nginx"
wait_port "$PORT_UPSTREAM" "upstream nginx" "${PID_OF[direct]}"
check_200 "$PORT_UPSTREAM" "upstream nginx"

# ---------------------------------------------------------------- proxies ---
start_kamal_proxy() {
    local d="$WORK/kamal-proxy"
    mkdir -p "$d/home"
    log "starting kamal-proxy ($KP_BIN) on 127.0.0.1:$PORT_KP, stdout -> $KP_STDOUT"
    HOME="$d/home" KAMAL_PROXY_SOCKET="$d/kamal-proxy.sock" \
        "${PIN_PROXY[@]}" "$KP_BIN" run --http-port="$PORT_KP" --https-port="$PORT_KP_HTTPS" \
        >"$KP_STDOUT" 2>"$d/stderr.log" &
    PID_OF[kamal-proxy]=$!
    track "${PID_OF[kamal-proxy]}" "kamal-proxy"
    wait_port "$PORT_KP" kamal-proxy "${PID_OF[kamal-proxy]}"
    local deadline=$((SECONDS + 10))
    until [[ -S "$d/kamal-proxy.sock" ]]; do
        ((SECONDS < deadline)) || die "kamal-proxy control socket $d/kamal-proxy.sock never appeared"
        sleep 0.1
    done
    HOME="$d/home" KAMAL_PROXY_SOCKET="$d/kamal-proxy.sock" \
        timeout 60 "$KP_BIN" deploy bench --target="127.0.0.1:$PORT_UPSTREAM" >"$d/deploy.log" 2>&1 ||
        die "kamal-proxy deploy bench --target=127.0.0.1:$PORT_UPSTREAM failed: $(tail -n 5 "$d/deploy.log")"
}

start_nginx_proxy() {
    local d="$WORK/nginx"
    log "starting nginx reverse proxy on 127.0.0.1:$PORT_NGINX"
    nginx_conf "$d" "$PORT_NGINX" \
        'location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header Host $host; }' \
        "upstream app { server 127.0.0.1:$PORT_UPSTREAM; keepalive 64; keepalive_requests 1000000; }"
    "${PIN_PROXY[@]}" nginx -p "$d" -e "$d/error.log" -c "$d/nginx.conf" >"$d/stdout.log" 2>&1 &
    PID_OF[nginx]=$!
    track "${PID_OF[nginx]}" "nginx proxy"
    wait_port "$PORT_NGINX" "nginx proxy" "${PID_OF[nginx]}"
}

start_haproxy() {
    local d="$WORK/haproxy"
    mkdir -p "$d"
    log "starting haproxy on 127.0.0.1:$PORT_HAPROXY"
    cat >"$d/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4000
defaults
    mode http
    option http-keep-alive
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 75s
frontend fe
    bind 127.0.0.1:$PORT_HAPROXY
    default_backend be
backend be
    http-reuse always
    server s1 127.0.0.1:$PORT_UPSTREAM
EOF
    "${PIN_PROXY[@]}" haproxy -db -f "$d/haproxy.cfg" >"$d/stdout.log" 2>&1 &
    PID_OF[haproxy]=$!
    track "${PID_OF[haproxy]}" "haproxy"
    wait_port "$PORT_HAPROXY" haproxy "${PID_OF[haproxy]}"
}

start_caddy() {
    local d="$WORK/caddy"
    mkdir -p "$d/home"
    log "starting caddy on 127.0.0.1:$PORT_CADDY"
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

for t in $TARGETS; do
    case $t in
        kamal-proxy) start_kamal_proxy ;;
        nginx) start_nginx_proxy ;;
        haproxy) start_haproxy ;;
        caddy) start_caddy ;;
    esac
done
for t in $TARGETS; do
    check_200 "${PORT_OF[$t]}" "$t"
done
log "all targets answer 200"

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

run_wrk() { # out connections duration url
    "${PIN_LOAD[@]}" timeout $(($3 + 30)) wrk -t1 -c"$2" -d"$3"s --latency "$4" >"$1" 2>&1 ||
        die "wrk failed against $4: $(tail -n 5 "$1")"
    grep -q '^Requests/sec:' "$1" || die "wrk produced no result against $4: $(tail -n 5 "$1")"
}

declare -A RPS P50 P99 C1P50 IDLE_KB LOAD_KB CPU_US CPU_PCT OTHER_PCT ERRS
# "other%": CPU time on the proxy's core used by anything but the proxy (other
# processes, plus interrupt/softirq time not charged to it). Only when pinned to one CPU.
SINGLE_PROXY_CPU=""
[[ "$PIN" == 1 && "$PROXY_CPUS" =~ ^[0-9]+$ ]] && SINGLE_PROXY_CPU=$PROXY_CPUS
if [[ "$PERF" == 1 ]]; then
    command -v perf >/dev/null 2>&1 || die "PERF=1 but perf is not installed (apt-get install -y linux-perf)"
    ((KP_WANTED)) || die "PERF=1 profiles kamal-proxy, which is not in TARGETS"
fi

log "load: wrk -t1 -c$CONNECTIONS -d${DURATION}s, then wrk -t1 -c1 -d${C1_DURATION}s; warmup ${WARMUP}s; pinning: $(
    [[ $PIN == 1 ]] && echo "proxies cpu $PROXY_CPUS, wrk cpu $LOAD_CPUS, upstream cpu $UPSTREAM_CPUS" || echo off)"
sleep 1 # let start-up settle before the idle RSS reading
for t in $TARGETS; do IDLE_KB[$t]=$(rss_kb "${PID_OF[$t]}"); done

for t in $TARGETS; do
    url="http://127.0.0.1:${PORT_OF[$t]}/"
    pid=${PID_OF[$t]}
    if ((WARMUP > 0)); then run_wrk "$WORK/$t.warmup.txt" "$CONNECTIONS" "$WARMUP" "$url"; fi

    log "$t: c$CONNECTIONS for ${DURATION}s"
    start_sampler "$pid" "$WORK/$t.peak"
    PERF_PID=""
    if [[ "$PERF" == 1 && $t == kamal-proxy ]]; then
        "${PIN_LOAD[@]}" perf record -F 999 -p "$pid" -o "$WORK/kp.perf.data" -- sleep "$DURATION" \
            >"$WORK/perf-record.log" 2>&1 &
        PERF_PID=$!
        track "$PERF_PID" "perf record"
    fi
    ticks0=$(cpu_ticks "$pid")
    [[ -n "$SINGLE_PROXY_CPU" ]] && read -r cb0 ct0 < <(core_ticks "$SINGLE_PROXY_CPU")
    t0=$(date +%s.%N)
    run_wrk "$WORK/$t.c$CONNECTIONS.txt" "$CONNECTIONS" "$DURATION" "$url"
    t1=$(date +%s.%N)
    ticks1=$(cpu_ticks "$pid")
    [[ -n "$SINGLE_PROXY_CPU" ]] && read -r cb1 ct1 < <(core_ticks "$SINGLE_PROXY_CPU")
    stop_sampler
    OTHER_PCT[$t]="-"
    if [[ -n "$SINGLE_PROXY_CPU" && $t != direct ]] && ((ct1 > ct0)); then
        OTHER_PCT[$t]=$(( (100 * (cb1 - cb0 - (ticks1 - ticks0))) / (ct1 - ct0) ))
        ((${OTHER_PCT[$t]} >= 0)) || OTHER_PCT[$t]=0
    fi
    if [[ -n "$PERF_PID" ]]; then
        wait "$PERF_PID" || log "perf record failed: $(tail -n 3 "$WORK/perf-record.log")"
        if [[ -s "$WORK/kp.perf.data" ]]; then
            mkdir -p "$RESULTS_DIR"
            perf_out="$RESULTS_DIR/$STAMP-kamal-proxy.perf.txt"
            {
                echo "# perf record -F 999 -p <kamal-proxy> during wrk -t1 -c$CONNECTIONS -d${DURATION}s; flat profile"
                echo "## by shared object"
                perf report -i "$WORK/kp.perf.data" --stdio --no-children --sort dso 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 20 || true
                echo "## by symbol (top 80)"
                perf report -i "$WORK/kp.perf.data" --stdio --no-children --sort dso,symbol 2>/dev/null | grep -v '^#' | grep -v '^$' |
                    sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//; s/[[:space:]]+$//' | head -n 80 || true
                echo "## user space only (binary + libc), by symbol (top 40)"
                perf report -i "$WORK/kp.perf.data" --stdio --no-children --sort dso,symbol 2>/dev/null | grep -v '^#' | grep -v '^$' |
                    grep -v kernel.kallsyms | sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//; s/[[:space:]]+$//' | head -n 40 || true
            } >"$perf_out"
            log "perf profile written to ${perf_out#"$ROOT"/} (req/s of this run is lowered by perf)"
        fi
    fi
    LOAD_KB[$t]=$(cat "$WORK/$t.peak" 2>/dev/null || echo 0)
    r=$(rss_kb "$pid")
    if ((r > ${LOAD_KB[$t]})); then LOAD_KB[$t]=$r; fi
    f="$WORK/$t.c$CONNECTIONS.txt"
    RPS[$t]=$(wrk_field "$f" rps)
    P50[$t]=$(wrk_field "$f" p50)
    P99[$t]=$(wrk_field "$f" p99)
    ERRS[$t]=$(wrk_field "$f" errors)
    reqs=$(wrk_field "$f" requests)
    read -r cu cp < <(awk -v d=$((ticks1 - ticks0)) -v hz="$CLK_TCK" -v n="$reqs" -v a="$t0" -v b="$t1" \
        'BEGIN { s = d / hz; printf "%.1f %.0f\n", (n > 0 ? s * 1e6 / n : 0), (b > a ? 100 * s / (b - a) : 0) }')
    CPU_US[$t]=$cu CPU_PCT[$t]=$cp

    log "$t: c1 for ${C1_DURATION}s"
    run_wrk "$WORK/$t.c1.txt" 1 "$C1_DURATION" "$url"
    C1P50[$t]=$(wrk_field "$WORK/$t.c1.txt" p50)
    ERRS[$t]=$((${ERRS[$t]} + $(wrk_field "$WORK/$t.c1.txt" errors)))

    kill -0 "$pid" 2>/dev/null || die "$t exited during the run"
done

# ---------------------------------------------------------------- report ---
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "null" || b == "null" || b + 0 == 0) print "null"; else printf "%.2f", a / b }'; }
added() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "null" || b == "null" || a == "" || b == "") print "null"; else printf "%.0f", (a - b) * 1000 }'; }

echo
echo "kamal-proxy bench — $(date -u +%Y-%m-%dT%H:%M:%SZ), ${NCPU} CPUs, load avg at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "wrk -t1 -c$CONNECTIONS -d${DURATION}s (req/s, p50, p99) and wrk -t1 -c1 -d${C1_DURATION}s (c1 p50); 6-byte body; HTTP/1.1 keep-alive"
echo
HDR="%-12s %10s %8s %8s %9s %9s %8s %5s %6s %9s %9s %6s\n"
printf "$HDR" target req/s p50_ms p99_ms c1p50_us +c1p50_us cpu_us/r cpu% other% idle_MiB load_MiB errors
printf "$HDR" ------------ ---------- -------- -------- --------- --------- -------- ----- ------ --------- --------- ------
for t in $TARGETS; do
    c1us=$(awk -v x="${C1P50[$t]}" 'BEGIN { printf "%.0f", x * 1000 }')
    if [[ $t == direct || " $TARGETS " != *" direct "* ]]; then add="-"; else add=$(added "${C1P50[$t]}" "${C1P50[direct]}"); fi
    printf "$HDR" "$t" "$(printf %.0f "${RPS[$t]}")" "${P50[$t]}" "${P99[$t]}" "$c1us" "$add" \
        "${CPU_US[$t]}" "${CPU_PCT[$t]}" "${OTHER_PCT[$t]}" "$(mib "${IDLE_KB[$t]}")" "$(mib "${LOAD_KB[$t]}")" "${ERRS[$t]}"
done

# A proxy that neither used its whole core nor reached the load side's ceiling was starved.
if [[ -n "$SINGLE_PROXY_CPU" && " $TARGETS " == *" direct "* ]]; then
    for t in $TARGETS; do
        [[ $t == direct ]] && continue
        if awk -v c="${CPU_PCT[$t]}" -v r="${RPS[$t]}" -v d="${RPS[direct]}" 'BEGIN { exit !(c < 80 && r < 0.85 * d) }'; then
            echo "NOTE: $t used ${CPU_PCT[$t]}% of a core and stayed below the direct ceiling: its core was shared" \
                "with other work (other% ${OTHER_PCT[$t]}); its req/s and latency are disturbed — compare cpu_us/r, or rerun on a quiet machine." >&2
        fi
    done
fi

if ((KP_WANTED)); then
    echo
    echo "kamal-proxy ÷ peer (req/s: higher is better; p99, cpu/req and load RSS: lower is better)"
    printf "%-12s %8s %8s %9s %9s\n" peer req/s p99 cpu_us/r load_RSS
    for t in $TARGETS; do
        [[ $t == kamal-proxy ]] && continue
        printf "%-12s %7sx %7sx %8sx %8sx\n" "$t" "$(div "${RPS[kamal-proxy]}" "${RPS[$t]}")" \
            "$(div "${P99[kamal-proxy]}" "${P99[$t]}")" "$(div "${CPU_US[kamal-proxy]}" "${CPU_US[$t]}")" \
            "$(div "${LOAD_KB[kamal-proxy]}" "${LOAD_KB[$t]}")"
    done
fi

total_errs=0
for t in $TARGETS; do total_errs=$((total_errs + ${ERRS[$t]})); done
((total_errs == 0)) || echo "WARNING: some runs had socket errors or non-2xx responses (errors column); see wrk output with KEEP_WORK=1" >&2

# ------------------------------------------------------------------ JSON ---
mkdir -p "$RESULTS_DIR"
json="$RESULTS_DIR/$STAMP.json"
jstr() { local s=$1; s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/ }; printf '"%s"' "$s"; }
num() { [[ -z "$1" || "$1" == null ]] && printf null || printf '%s' "$1"; }
{
    printf '{\n'
    printf '  "timestamp": %s,\n' "$(jstr "$STAMP")"
    printf '  "git_rev": %s,\n' "$(jstr "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo -dirty)")"
    printf '  "kamal_proxy_bin": %s,\n' "$(jstr "${KP_BIN:-}")"
    printf '  "kamal_proxy_stdout": %s,\n' "$(jstr "$KP_STDOUT")"
    printf '  "cpus": %s,\n  "loadavg_end": %s,\n' "$NCPU" "$(jstr "$(cut -d' ' -f1-3 /proc/loadavg)")"
    printf '  "pinning": %s,\n' "$([[ $PIN == 1 ]] && printf '{"proxy": %s, "wrk": %s, "upstream": %s}' "$(jstr "$PROXY_CPUS")" "$(jstr "$LOAD_CPUS")" "$(jstr "$UPSTREAM_CPUS")" || echo null)"
    printf '  "load": {"tool": "wrk", "threads": 1, "connections": %s, "duration_s": %s, "c1_duration_s": %s, "warmup_s": %s},\n' \
        "$CONNECTIONS" "$DURATION" "$C1_DURATION" "$WARMUP"
    printf '  "versions": {"nginx": %s, "haproxy": %s, "caddy": %s, "wrk": %s},\n' \
        "$(jstr "$(nginx -v 2>&1 | sed 's/.*nginx\///')")" \
        "$(jstr "$(haproxy -v 2>/dev/null | awk 'NR==1{print $3}')")" \
        "$(jstr "$(caddy version 2>/dev/null | awk '{print $1}')")" \
        "$(jstr "$({ wrk -v 2>&1 || true; } | awk 'NR==1{print $2}')")"
    printf '  "results": {\n'
    first=1
    for t in $TARGETS; do
        ((first)) || printf ',\n'
        first=0
        add=null
        [[ $t != direct && " $TARGETS " == *" direct "* ]] && add=$(added "${C1P50[$t]}" "${C1P50[direct]}")
        printf '    %s: {"req_per_s": %s, "p50_ms": %s, "p99_ms": %s, "c1_p50_ms": %s, "c1_p50_added_us": %s, ' \
            "$(jstr "$t")" "$(num "${RPS[$t]}")" "$(num "${P50[$t]}")" "$(num "${P99[$t]}")" "$(num "${C1P50[$t]}")" "$(num "$add")"
        printf '"cpu_us_per_req": %s, "cpu_percent": %s, "other_on_core_percent": %s, "idle_rss_mib": %s, "load_rss_mib": %s, "errors": %s}' \
            "$(num "${CPU_US[$t]}")" "$(num "${CPU_PCT[$t]}")" "$(num "${OTHER_PCT[$t]/-/null}")" "$(mib "${IDLE_KB[$t]}")" "$(mib "${LOAD_KB[$t]}")" "${ERRS[$t]}"
    done
    printf '\n  }'
    if ((KP_WANTED)); then
        printf ',\n  "ratios_kamal_proxy_over_peer": {\n'
        first=1
        for t in $TARGETS; do
            [[ $t == kamal-proxy ]] && continue
            ((first)) || printf ',\n'
            first=0
            printf '    %s: {"req_per_s": %s, "p99": %s, "cpu_per_req": %s, "load_rss": %s}' "$(jstr "$t")" \
                "$(div "${RPS[kamal-proxy]}" "${RPS[$t]}")" "$(div "${P99[kamal-proxy]}" "${P99[$t]}")" \
                "$(div "${CPU_US[kamal-proxy]}" "${CPU_US[$t]}")" "$(div "${LOAD_KB[kamal-proxy]}" "${LOAD_KB[$t]}")"
        done
        printf '\n  }'
    fi
    printf '\n}\n'
} >"$json"
echo
echo "results written to ${json#"$ROOT"/}"
