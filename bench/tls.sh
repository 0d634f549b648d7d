#!/usr/bin/env bash
# HTTPS side by side on loopback: kamal-proxy and nginx with TLS, both proxying to the same
# nginx `return 200` upstream, with the same self-signed ECDSA P-256 certificate.
#
#   1. HTTP/2 over TLS, kept-alive connections:   h2load -c 10 -m 10
#   2. HTTP/1.1 over TLS, kept-alive connections: h2load --h1 -c 64
#   3. resumed TLS handshakes/s: one request per connection (wrk over https with
#      `Connection: close`: every request is a new TCP connection and handshake; wrk offers
#      the session of its previous connection, and both proxies resume it)
#   4. full TLS handshakes/s: one request per connection, no resumption (8 `openssl s_time
#      -new` clients, each one connection at a time)
#
# Prints req/s for each and the ratio kamal-proxy ÷ nginx, then each proxy's CPU time per
# request (its process's user + system time over the run), and the load generator's (where
# it is the limit, as for new handshakes, its cost a request is what req/s measures).
# openssl's `s_time` sends `GET <page> HTTP/1.0` with no Host; its page here carries the
# request line's end and a Host header, so both proxies route the request to the upstream.
# Knobs (optional):
#   DURATION=10   seconds per run        KP_BIN=path   skip `bash scripts/pgo build`
#   ROUNDS=3      rounds, alternating kamal-proxy and nginx; the median of each is reported
#   KP_STDOUT=path   where kamal-proxy's access log goes; default a file in the run's temporary
#                    directory (a file on disk, as in production and bench/run.sh; nginx logs nothing)
#   BASE_PORT=18740 (uses BASE_PORT..+3)  PIN=1  taskset: proxy on CPU 0, load+upstream on CPU 1
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DURATION="${DURATION:-10}"
ROUNDS="${ROUNDS:-3}"
[[ "$ROUNDS" =~ ^[1-9][0-9]?$ ]] || { echo "ROUNDS must be 1..99" >&2; exit 2; }
BASE_PORT="${BASE_PORT:-18740}"
PIN="${PIN:-1}"
[[ "$DURATION" =~ ^[0-9]+$ ]] && ((DURATION > 0 && DURATION <= 600)) || { echo "DURATION must be 1..600" >&2; exit 2; }
PORT_UPSTREAM=$BASE_PORT
PORT_KP_HTTP=$((BASE_PORT + 1))
PORT_KP=$((BASE_PORT + 2))
PORT_NGINX=$((BASE_PORT + 3))

for port in $PORT_UPSTREAM $PORT_KP_HTTP $PORT_KP $PORT_NGINX; do
    if (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port is already in use; pick another BASE_PORT" >&2
        exit 1
    fi
done

log() { printf '[bench-tls %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
for tool in nginx h2load wrk openssl curl; do
    command -v "$tool" >/dev/null 2>&1 || { echo "'$tool' not found: apt-get install -y nginx nghttp2-client wrk openssl curl" >&2; exit 1; }
done
if [[ "$PIN" == 1 ]] && { ! command -v taskset >/dev/null || (($(getconf _NPROCESSORS_ONLN) < 2)); }; then PIN=0; fi
# Prefixes, not functions: a backgrounded function would leave `$!` naming a subshell.
CPU0=() CPU1=()
if [[ "$PIN" == 1 ]]; then CPU0=(taskset -c 0) CPU1=(taskset -c 1); fi

WORK=$(mktemp -d /tmp/kp-bench-tls.XXXXXX)
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "bench-tls: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

if [[ -z "${KP_BIN:-}" ]]; then
    # The binary we ship: the release build with the committed profile.
    log "bash scripts/pgo build"
    KP_BIN=$(bash "$ROOT/scripts/pgo" build --quiet | tail -n 1)
fi

# One certificate for both proxies.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost \
    -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null

mkdir -p "$WORK/nginx"
cat >"$WORK/nginx/upstream.conf" <<EOF
daemon off; worker_processes 1; pid $WORK/nginx/upstream.pid; error_log $WORK/nginx/upstream.err;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:$PORT_UPSTREAM; location / { return 200 "hello\n"; } } }
EOF
cat >"$WORK/nginx/proxy.conf" <<EOF
daemon off; worker_processes 1; pid $WORK/nginx/proxy.pid; error_log $WORK/nginx/proxy.err;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  upstream app { server 127.0.0.1:$PORT_UPSTREAM; keepalive 64; }
  server { listen 127.0.0.1:$PORT_NGINX ssl http2;
    ssl_certificate $WORK/cert.pem; ssl_certificate_key $WORK/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    location / { proxy_pass http://app; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_set_header Host \$host; } } }
EOF
"${CPU1[@]}" nginx -c "$WORK/nginx/upstream.conf" -p "$WORK/nginx" >"$WORK/upstream.log" 2>&1 &
PIDS+=($!)
"${CPU0[@]}" nginx -c "$WORK/nginx/proxy.conf" -p "$WORK/nginx" >"$WORK/nginx.log" 2>&1 &
PIDS+=($!)

export HOME="$WORK/home" KAMAL_PROXY_SOCKET="$WORK/kp.sock"
mkdir -p "$HOME"
"${CPU0[@]}" "$KP_BIN" run --http-port="$PORT_KP_HTTP" --https-port="$PORT_KP" >>"${KP_STDOUT:-$WORK/kp.log}" 2>"$WORK/kp.err" &
KP_PID=$!
PIDS+=($KP_PID)
for _ in $(seq 1 100); do [[ -S "$KAMAL_PROXY_SOCKET" ]] && curl -s -o /dev/null "http://127.0.0.1:$PORT_UPSTREAM/" && break; sleep 0.1; done
"$KP_BIN" deploy bench --target="127.0.0.1:$PORT_UPSTREAM" --host=localhost --tls \
    --tls-certificate-path="$WORK/cert.pem" --tls-private-key-path="$WORK/key.pem" \
    --health-check-path=/ >/dev/null
for port in $PORT_KP $PORT_NGINX; do
    curl -sk --fail -o /dev/null "https://localhost:$port/" || { echo "no answer on :$port" >&2; cat "$WORK/kp.err" >&2; exit 1; }
done

h2load_rps() { # args...: prints req/s, fails the script on any failed request
    local out
    out=$("${CPU1[@]}" h2load -D "$DURATION" -t 1 "$@" 2>&1)
    local failed
    grep -E '^(finished|requests:|time for request)' <<<"$out" | sed 's/^/    /' >&2
    failed=$(sed -n 's/^requests: .* \([0-9]*\) failed.*/\1/p' <<<"$out")
    [[ "${failed:-0}" == 0 ]] || { echo "$out" >&2; echo "h2load: $failed failed requests" >&2; exit 1; }
    sed -n 's/^finished in .*, \([0-9.]*\) req\/s.*/\1/p' <<<"$out"
}
wrk_rps() {
    local out
    out=$("${CPU1[@]}" wrk -t1 -c "$1" -d "${DURATION}s" -H 'Connection: close' "$2" 2>&1)
    if grep -q 'Non-2xx' <<<"$out"; then echo "$out" >&2; exit 1; fi
    grep 'Socket errors' <<<"$out" >&2 || true
    sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p' <<<"$out"
}
# Full handshakes: `s_time -new` makes a new session for every connection (wrk and h2load
# resume theirs). Eight clients at once, each one connection at a time; req/s is all their
# connections over the wall time.
STIME_CLIENTS=8
STIME_PAGE=$'/ HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nX-Pad: x'
stime_rps() { # port
    local pids=() i t0 t1 total=0 n
    t0=$(date +%s.%N)
    for ((i = 1; i <= STIME_CLIENTS; i++)); do
        "${CPU1[@]}" openssl s_time -connect "localhost:$1" -new -time "$DURATION" -www "$STIME_PAGE" \
            >"$WORK/stime.$i" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[i]}" || { cat "$WORK/stime.$((i + 1))" >&2; echo "openssl s_time failed" >&2; exit 1; }
    done
    t1=$(date +%s.%N)
    for ((i = 1; i <= STIME_CLIENTS; i++)); do
        n=$(sed -n 's/^\([0-9]*\) connections in [0-9]* real seconds.*/\1/p' "$WORK/stime.$i")
        [[ -n "$n" ]] || { cat "$WORK/stime.$i" >&2; echo "openssl s_time printed no count" >&2; exit 1; }
        total=$((total + n))
    done
    awk -v n="$total" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f\n", n / (b - a) }'
}

# s_time counts connections, not answers: once per proxy, its exact request must be answered
# 200 (through to the upstream), or the full-handshake row would count error pages.
stime_check() { # port
    local status
    status=$(printf 'GET %s HTTP/1.0\r\n\r\n' "$STIME_PAGE" |
        "${CPU1[@]}" timeout 10 openssl s_client -quiet -connect "localhost:$1" 2>/dev/null | head -n 1 || true)
    [[ "$status" == "HTTP/1.1 200"* ]] || { echo "s_time's request to :$1 was answered '${status%$'\r'}', not 200" >&2; exit 1; }
}
for port in $PORT_KP $PORT_NGINX; do stime_check "$port"; done

# CPU time a proxy spent per request: its process's user + system time over the run
# (/proc/PID/stat), divided by the requests served. Where the load generator rather than
# the proxy is the limit (new handshakes: the client's side of a handshake costs as much),
# req/s shows the client; this shows what each request cost the proxy.
TICK_US=$((1000000 / $(getconf CLK_TCK)))
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
NGINX_WORKER=$(pgrep -P "$(cat "$WORK/nginx/proxy.pid")" | head -n 1)
[[ -n "$NGINX_WORKER" ]] || { echo "nginx's worker process not found" >&2; exit 1; }

declare -A R # "<target>,<metric>" -> space-separated req/s of every round
declare -A C # "<target>,<metric>" -> space-separated CPU µs per request of every round
declare -A L # "<target>,<metric>" -> the load generator's CPU µs per request, every round
measure() { # target metric load-function args...: one run, its req/s and CPU per request
    local target=$1 metric=$2 pid=$KP_PID c0 rps out client
    shift 2
    [[ $target == nginx ]] && pid=$NGINX_WORKER
    c0=$(cpu_ticks "$pid")
    # `times` in the same subshell: its second line is the user and system time of the
    # subshell's children, the load generator (and the greps that read its output).
    out=$("$@"; times)
    rps=$(head -n 1 <<<"$out")
    client=$(sed -n 3p <<<"$out" | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } print t }')
    R[$target,$metric]+="$rps "
    C[$target,$metric]+="$(awk -v t=$(($(cpu_ticks "$pid") - c0)) -v us="$TICK_US" -v r="$rps" -v d="$DURATION" \
        'BEGIN { if (r > 0) printf "%.1f", t * us / (r * d); else print 0 }') "
    L[$target,$metric]+="$(awk -v s="$client" -v r="$rps" -v d="$DURATION" \
        'BEGIN { if (r > 0) printf "%.1f", s * 1e6 / (r * d); else print 0 }') "
}
for ((round = 1; round <= ROUNDS; round++)); do
    order="kamal-proxy nginx"
    ((round % 2 == 0)) && order="nginx kamal-proxy"
    for target in $order; do
        port=$PORT_KP; [[ $target == nginx ]] && port=$PORT_NGINX
        url="https://localhost:$port/"
        log "round $round/$ROUNDS $target: h2 c10 m10"; measure "$target" h2 h2load_rps -c 10 -m 10 "$url"
        log "round $round/$ROUNDS $target: h1.1 over TLS c64"; measure "$target" h1 h2load_rps --h1 -c 64 -m 1 "$url"
        log "round $round/$ROUNDS $target: resumed handshake per request c32"; measure "$target" hs wrk_rps 32 "$url"
        log "round $round/$ROUNDS $target: full handshake per request, $STIME_CLIENTS clients"; measure "$target" full stime_rps "$port"
    done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for key in "${!R[@]}"; do R[$key]=$(median "${R[$key]}"); done
for key in "${!C[@]}"; do C[$key]=$(median "${C[$key]}"); done
for key in "${!L[@]}"; do L[$key]=$(median "${L[$key]}"); done
RSS=$(awk '/VmRSS/ {print $2}' "/proc/$KP_PID/status" 2>/dev/null || echo "?")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
table() { # title, the array ("R", "C" or "L"), then the labels of the h2, h1 and two handshake rows
    local title=$1 labels=("$3" "$4" "$5" "$6") i=0 k
    local -n values=$2
    printf '\n%-42s %14s %14s %8s\n' "$title" kamal-proxy nginx ratio
    for k in h2 h1 hs full; do
        printf '%-42s %14s %14s %8s\n' "${labels[i++]}" "${values[kamal-proxy,$k]}" "${values[nginx,$k]}" \
            "$(ratio "${values[kamal-proxy,$k]}" "${values[nginx,$k]}")"
    done
}
table "HTTPS, median of $ROUNDS x $DURATION s" R \
    "HTTP/2 req/s (c10 m10)" "HTTP/1.1 over TLS req/s (c64)" "resumed TLS handshakes/s (c32)" \
    "full TLS handshakes/s ($STIME_CLIENTS clients)"
table "proxy CPU µs per request, median" C "HTTP/2" "HTTP/1.1 over TLS" "resumed TLS handshake + request" \
    "full TLS handshake + request"
# Where the load generator is the limit (new handshakes), its own cost a request decides
# req/s: a proxy idle between a client's packets costs the client a wake-up each time.
table "load generator CPU µs per request, median" L "HTTP/2" "HTTP/1.1 over TLS" "resumed TLS handshake + request" \
    "full TLS handshake + request"
printf 'kamal-proxy RSS after the runs: %s KiB; pinned: %s\n' "$RSS" "$PIN"
