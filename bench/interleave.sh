#!/usr/bin/env bash
# Wall-clock ratios against nginx on a shared machine: nginx and one or more kamal-proxy
# binaries run side by side and are loaded in interleaved rounds (the order rotates each
# round), so a compile elsewhere on the machine hits every target alike; medians are
# reported with the ratio to nginx.
#
#   KP_BINS="/tmp/kp-before /tmp/kp-after" bench/interleave.sh
#
# Knobs: ROUNDS (3), DURATION (wrk seconds per run, 8), CONNECTIONS (64), THREADS (wrk -t, 2),
# BASE_PORT (18700), NGINX_WORKERS (2). Nothing is pinned (both cores are shared by wrk,
# the backend and the proxy, as on the issue's two-core figures). kamal-proxy's access log
# goes to a file on disk, as in production. Prints the load average before and after.
#   FRESH=1   start the kamal-proxy processes anew each round, in that round's order: one
#             binary started twice and measured unpinned read 5 % apart for as long as both
#             ran (bench/README.md, "Twenty-eighth round"), so a comparison of two builds
#             is only fair across fresh starts.
set -euo pipefail

ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-8}"
CONNECTIONS="${CONNECTIONS:-64}"
THREADS="${THREADS:-2}"
BASE_PORT="${BASE_PORT:-18700}"
FRESH="${FRESH:-0}"
NGINX_WORKERS="${NGINX_WORKERS:-2}"
read -r -a BINS <<<"${KP_BINS:?set KP_BINS to one or more kamal-proxy binaries}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/kp-interleave.XXXXXX")"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { until port_open "$1"; do sleep 0.1; done; }
tree_pids() {
    local p=$1 c k
    [[ -d /proc/$p ]] || return 0
    echo "$p"
    for c in /proc/"$p"/task/*/children; do
        for k in $(cat "$c" 2>/dev/null); do tree_pids "$k"; done
    done
}
cpu_ticks() {
    local t=0 p f
    for p in $(tree_pids "$1"); do
        f=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null) || continue
        read -r -a a <<<"$f"
        t=$((t + a[11] + a[12]))
    done
    echo $t
}
rss_kb() {
    local t=0 p v
    for p in $(tree_pids "$1"); do
        v=$(awk '/^VmRSS:/{print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
        t=$((t + ${v:-0}))
    done
    echo $t
}
nginx_conf() { # dir port workers body [http-extra]
    mkdir -p "$1/tmp"
    cat >"$1/nginx.conf" <<EOF
$([[ "$(id -u)" == 0 ]] && echo "user root;")
daemon off;
worker_processes $3;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $1/tmp/body; proxy_temp_path $1/tmp/proxy;
    fastcgi_temp_path $1/tmp/fastcgi; uwsgi_temp_path $1/tmp/uwsgi; scgi_temp_path $1/tmp/scgi;
    keepalive_requests 1000000;
    ${5:-}
    server { listen 127.0.0.1:$2; $4 }
}
EOF
}

UP=$BASE_PORT
nginx_conf "$WORK/up" "$UP" 1 'location / { return 200 "hello\n"; }'
nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" &
PIDS+=($!)
wait_port "$UP"

declare -A PORT PID
NAMES=(nginx)
PORT[nginx]=$((BASE_PORT + 1))
nginx_conf "$WORK/nginx" "${PORT[nginx]}" "$NGINX_WORKERS" \
    'location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }' \
    "upstream up { server 127.0.0.1:$UP; keepalive 64; }"
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" &
PID[nginx]=$!
PIDS+=("${PID[nginx]}")
wait_port "${PORT[nginx]}"

declare -A BIN
start_kp() { # name: runs BIN[name] on PORT[name] with a service deployed, after ten requests
    local name=$1 d="$WORK/$1"
    rm -rf "$d" && mkdir -p "$d/home"
    HOME="$d/home" KAMAL_PROXY_SOCKET="$d/kp.sock" "${BIN[$name]}" run --http-port="${PORT[$name]}" \
        --https-port=$((PORT[$name] + 1)) >"$d/access.log" 2>"$d/stderr.log" &
    PID[$name]=$!
    PIDS+=("${PID[$name]}")
    wait_port "${PORT[$name]}"
    until [[ -S "$d/kp.sock" ]]; do sleep 0.1; done
    HOME="$d/home" KAMAL_PROXY_SOCKET="$d/kp.sock" "${BIN[$name]}" deploy bench --target="127.0.0.1:$UP" >/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do curl -fsS -o /dev/null "http://127.0.0.1:${PORT[$name]}/"; done
}
stop_kp() { # name
    kill -TERM "${PID[$1]}" 2>/dev/null || true
    wait "${PID[$1]}" 2>/dev/null || true
}
i=0
for bin in "${BINS[@]}"; do
    i=$((i + 1))
    name="kp$i"
    NAMES+=("$name")
    BIN[$name]=$bin
    PORT[$name]=$((BASE_PORT + 10 + 2 * i))
    start_kp "$name"
    echo "$name = $bin (idle RSS $(rss_kb "${PID[$name]}") KiB)"
done

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A RPS P99 CPU RSS
for ((r = 0; r < ROUNDS; r++)); do
    n=${#NAMES[@]}
    if [[ "$FRESH" == 1 && $r -gt 0 ]]; then
        for ((k = 0; k < n; k++)); do
            t=${NAMES[$(((k + r) % n))]}
            [[ $t == nginx ]] && continue
            stop_kp "$t"
        done
        for ((k = 0; k < n; k++)); do
            t=${NAMES[$(((k + r) % n))]}
            [[ $t == nginx ]] || start_kp "$t"
        done
    fi
    for ((k = 0; k < n; k++)); do
        t=${NAMES[$(((k + r) % n))]}
        wrk -t"$THREADS" -c"$CONNECTIONS" -d1s "http://127.0.0.1:${PORT[$t]}/" >/dev/null
        c0=$(cpu_ticks "${PID[$t]}")
        (sleep $((DURATION / 2)); rss_kb "${PID[$t]}" >"$WORK/rss") &
        sampler=$!
        out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency "http://127.0.0.1:${PORT[$t]}/")
        wait "$sampler"
        c1=$(cpu_ticks "${PID[$t]}")
        rps=$(awk '/Requests\/sec/{print $2}' <<<"$out")
        p99=$(awk '$1=="99%"{v=$2; if (v ~ /us$/) {sub("us","",v); v/=1000} else if (v ~ /ms$/) {sub("ms","",v)} else if (v ~ /s$/) {sub("s","",v); v*=1000}; print v}' <<<"$out")
        total=$(awk '/requests in/{print $1}' <<<"$out")
        cpu=$(awk -v d=$((c1 - c0)) -v n="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.1f", d/hz*1e6/n}')
        RPS[$t]+="$rps "
        P99[$t]+="$p99 "
        CPU[$t]+="$cpu "
        RSS[$t]+="$(cat "$WORK/rss") "
        printf 'round %d %-6s %10s req/s  p99 %7s ms  cpu %6s us/req  rss %s KiB\n' "$r" "$t" "$rps" "$p99" "$cpu" "$(cat "$WORK/rss")"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
printf '\n%-6s %10s %8s %10s %9s %10s %10s\n' target req/s p99_ms cpu_us/r load_KiB "req/s÷ng" "p99÷ng"
for t in "${NAMES[@]}"; do
    m=$(median "${RPS[$t]}")
    p=$(median "${P99[$t]}")
    printf '%-6s %10s %8s %10s %9s %10s %10s\n' "$t" "$m" "$p" "$(median "${CPU[$t]}")" "$(median "${RSS[$t]}")" \
        "$(awk -v a="$m" -v b="$(median "${RPS[nginx]}")" 'BEGIN{printf "%.2f", a/b}')" \
        "$(awk -v a="$p" -v b="$(median "${P99[nginx]}")" 'BEGIN{printf "%.2f", a/b}')"
done
