#!/usr/bin/env bash
# Instructions per proxied request, counted by valgrind's callgrind: the user-space cost of
# kamal-proxy, repeatable on a busy machine (instruction counts do not depend on who else
# uses the CPU), so a before/after of a change can be read to a percent.
#
#   KP_BIN=/tmp/kp-perf/release/kamal-proxy bench/callgrind.sh
#
# Knobs: DURATION (wrk seconds, default 20), CONNECTIONS (default 16), BASE_PORT (18600),
# THREADS (TOKIO_WORKER_THREADS for the proxy, default 2), OUT (callgrind.out path, default
# bench/results/<stamp>.callgrind.out), KP_ARGS (extra `run` flags).
#   PEER=nginx    count nginx as the proxy instead (one worker, access log off, keep-alive
#                 upstream as in bench/run.sh): the same load, the peer's instructions
#   CACHE_SIM=1   also simulate this machine's caches and branch predictor: misses a request
#   FOOTPRINT=1   also record each instruction's address, and print how much code a request
#                 runs, by function (bench/cg_footprint.py)
#   ATOMICS=1     also record each instruction's address, and print the atomic
#                 read-modify-write instructions a request runs, by site (bench/cg_atomics.py)
# Prints: requests served (counted from the access log, one line each; wrk's count for the
# peer), instructions in the measured window, instructions per request, then a breakdown by
# component (bench/README.md, "Where the time goes").
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DURATION="${DURATION:-20}"
CONNECTIONS="${CONNECTIONS:-16}"
BASE_PORT="${BASE_PORT:-18600}"
THREADS="${THREADS:-2}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$ROOT/bench/results"
OUT="${OUT:-$ROOT/bench/results/$STAMP.callgrind.out}"
PEER="${PEER:-}"
[[ -z "$PEER" || "$PEER" == nginx ]] || { echo "callgrind.sh: PEER is nginx or unset" >&2; exit 1; }
[[ -n "$PEER" ]] || KP_BIN="${KP_BIN:?set KP_BIN to a release kamal-proxy built with symbols (see bench/README.md)}"
VG_OPTS=(--tool=callgrind --instr-atstart=no)
[[ "${CACHE_SIM:-}" == 1 ]] && VG_OPTS+=(--cache-sim=yes --branch-sim=yes)
[[ "${FOOTPRINT:-}" == 1 || "${ATOMICS:-}" == 1 ]] && VG_OPTS+=(--dump-instr=yes)
for tool in valgrind callgrind_control callgrind_annotate wrk nginx; do
    command -v "$tool" >/dev/null || { echo "callgrind.sh: $tool is missing" >&2; exit 1; }
done

PORT_UP=$BASE_PORT
PORT_KP=$((BASE_PORT + 1))
PORT_KPS=$((BASE_PORT + 2))
WORK="$(mktemp -d "${TMPDIR:-/tmp}/kp-callgrind.XXXXXX")"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
    local deadline=$((SECONDS + 120))
    until port_open "$1"; do
        ((SECONDS < deadline)) || { echo "port $1 never opened" >&2; exit 1; }
        sleep 0.2
    done
}

mkdir -p "$WORK/up/tmp" "$WORK/kp/home"
cat >"$WORK/up/nginx.conf" <<EOF
$([[ "$(id -u)" == 0 ]] && echo "user root;")
daemon off;
worker_processes 1;
pid $WORK/up/nginx.pid;
error_log $WORK/up/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/up/tmp/body;
    proxy_temp_path $WORK/up/tmp/proxy;
    fastcgi_temp_path $WORK/up/tmp/fastcgi;
    uwsgi_temp_path $WORK/up/tmp/uwsgi;
    scgi_temp_path $WORK/up/tmp/scgi;
    keepalive_requests 1000000;
    server { listen 127.0.0.1:$PORT_UP; location / { return 200 "hello\n"; } }
}
EOF
nginx -p "$WORK/up" -e "$WORK/up/error.log" -c "$WORK/up/nginx.conf" &
PIDS+=($!)
wait_port "$PORT_UP"

if [[ -n "$PEER" ]]; then
    # The peer as bench/run.sh runs it, in one process (master_process off) so that
    # valgrind follows the worker.
    mkdir -p "$WORK/px/tmp"
    sed -e "s#$WORK/up#$WORK/px#g" -e "s#^daemon off;#daemon off;\nmaster_process off;#" \
        -e "s#    server { listen.*#    upstream app { server 127.0.0.1:$PORT_UP; keepalive 64; }\n    server { listen 127.0.0.1:$PORT_KP; location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }#" \
        "$WORK/up/nginx.conf" >"$WORK/px/nginx.conf"
    valgrind "${VG_OPTS[@]}" --callgrind-out-file="$OUT" \
        nginx -p "$WORK/px" -e "$WORK/px/error.log" -c "$WORK/px/nginx.conf" 2>"$WORK/px/valgrind.log" &
    KP_PID=$!
    PIDS+=("$KP_PID")
    wait_port "$PORT_KP"
    wrk -t1 -c"$CONNECTIONS" -d3s "http://127.0.0.1:$PORT_KP/" >/dev/null
    sleep 1
    callgrind_control -i on "$KP_PID" >/dev/null
    wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "http://127.0.0.1:$PORT_KP/" >"$WORK/wrk.txt"
    callgrind_control -i off "$KP_PID" >/dev/null
    before=0
    after=$(awk '/requests in/ { print $1 }' "$WORK/wrk.txt")
else
    export HOME="$WORK/kp/home" KAMAL_PROXY_SOCKET="$WORK/kp/kp.sock"
    # The access log goes to a file, as in production; its line count is the request count.
    TOKIO_WORKER_THREADS=$THREADS valgrind "${VG_OPTS[@]}" \
        --callgrind-out-file="$OUT" "$KP_BIN" run --http-port="$PORT_KP" --https-port="$PORT_KPS" \
        ${KP_ARGS:-} >"$WORK/kp/access.log" 2>"$WORK/kp/stderr.log" &
    KP_PID=$!
    PIDS+=("$KP_PID")
    wait_port "$PORT_KP"
    until [[ -S "$KAMAL_PROXY_SOCKET" ]]; do sleep 0.2; done
    "$KP_BIN" deploy bench --target="127.0.0.1:$PORT_UP" >/dev/null
    # Warm-up (uninstrumented): pool connections, lazily built tables.
    wrk -t1 -c"$CONNECTIONS" -d3s "http://127.0.0.1:$PORT_KP/" >/dev/null
    sleep 1
    before=$(grep -c '"msg":"Request"' "$WORK/kp/access.log" || true)
    callgrind_control -i on "$KP_PID" >/dev/null
    wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "http://127.0.0.1:$PORT_KP/" >"$WORK/wrk.txt"
    # Let the log writer drain what the measured requests queued.
    sleep 2
    callgrind_control -i off "$KP_PID" >/dev/null
    after=$(grep -c '"msg":"Request"' "$WORK/kp/access.log" || true)
fi
callgrind_control -d "$KP_PID" >/dev/null
kill -TERM "$KP_PID"
wait "$KP_PID" 2>/dev/null || true
requests=$((after - before))
# The dump taken by `-d` is the measured window; the file written at exit repeats nothing
# (instrumentation was off). Sum every part.
total=0
for f in "$OUT"*; do
    ir=$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1; exit}' || true)
    if [[ "$ir" =~ ^[0-9]+$ ]]; then total=$((total + ir)); fi
done
echo "requests: $requests   instructions: $total   per request: $((total / (requests > 0 ? requests : 1)))"
echo "wrk (under valgrind, meaningless as throughput): $(grep 'Requests/sec' "$WORK/wrk.txt")"
echo "callgrind output: $OUT*"
if [[ "${CACHE_SIM:-}" == 1 && -f "$OUT.1" ]]; then
    # Misses a request: level-1 instruction and data (read, write) caches, last level,
    # conditional and indirect branches mispredicted.
    callgrind_annotate "$OUT.1" 2>/dev/null | awk -v n="$requests" '
        /^Events shown:/ { for (i = 3; i <= NF; i++) ev[i - 2] = $i }
        /PROGRAM TOTALS/ { k = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9,]+$/) { gsub(",", "", $i); v[++k] = $i }
                           line = "per request:"; for (j = 1; j <= k; j++) line = line sprintf(" %s %.0f", ev[j], v[j] / n)
                           print line; exit }'
fi
if [[ "${FOOTPRINT:-}" == 1 && -f "$OUT.1" ]]; then python3 "$ROOT/bench/cg_footprint.py" "$OUT.1" "$requests"; fi
if [[ "${ATOMICS:-}" == 1 && -f "$OUT.1" ]]; then python3 "$ROOT/bench/cg_atomics.py" "$OUT.1" "$requests"; fi
if [[ -z "$PEER" && -f "$OUT.1" ]]; then python3 "$ROOT/bench/cg_breakdown.py" "$OUT.1" "$requests"; fi
