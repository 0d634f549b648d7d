#!/usr/bin/env bash
# HTTPS side by side on loopback: kamal-proxy and nginx with TLS, both proxying to the same
# nginx `return 200` upstream, with the same self-signed ECDSA P-256 certificate.
#
#   1. HTTP/2 over TLS, kept-alive connections:   h2load -c 10 -m 10
#   2. HTTP/1.1 over TLS, kept-alive connections: h2load --h1 -c 64
#   3. new TLS handshakes/s: one request per connection (wrk over https with
#      `Connection: close`: every request is a new TCP connection and a full handshake)
#
# Prints req/s for each and the ratio kamal-proxy ÷ nginx. Knobs (optional):
#   DURATION=10   seconds per run        KP_BIN=path   skip `cargo build --release`
#   BASE_PORT=18500 (uses BASE_PORT..+3)  PIN=1  taskset: proxy on CPU 0, load+upstream on CPU 1
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DURATION="${DURATION:-10}"
BASE_PORT="${BASE_PORT:-18500}"
PIN="${PIN:-1}"
[[ "$DURATION" =~ ^[0-9]+$ ]] && ((DURATION > 0 && DURATION <= 600)) || { echo "DURATION must be 1..600" >&2; exit 2; }
PORT_UPSTREAM=$BASE_PORT
PORT_KP_HTTP=$((BASE_PORT + 1))
PORT_KP=$((BASE_PORT + 2))
PORT_NGINX=$((BASE_PORT + 3))

log() { printf '[bench-tls %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
for tool in nginx h2load wrk openssl curl; do
    command -v "$tool" >/dev/null 2>&1 || { echo "'$tool' not found: apt-get install -y nginx nghttp2-client wrk openssl curl" >&2; exit 1; }
done
if [[ "$PIN" == 1 ]] && { ! command -v taskset >/dev/null || (($(getconf _NPROCESSORS_ONLN) < 2)); }; then PIN=0; fi
on() { if [[ "$PIN" == 1 ]]; then taskset -c "$1" "${@:2}"; else "${@:2}"; fi; }

WORK=$(mktemp -d /tmp/kp-bench-tls.XXXXXX)
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

if [[ -z "${KP_BIN:-}" ]]; then
    log "cargo build --release"
    (cd "$ROOT" && cargo build --release --quiet)
    KP_BIN="$ROOT/target/release/kamal-proxy"
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
on 1 nginx -c "$WORK/nginx/upstream.conf" -p "$WORK/nginx" & PIDS+=($!)
on 0 nginx -c "$WORK/nginx/proxy.conf" -p "$WORK/nginx" & PIDS+=($!)

export HOME="$WORK/home" KAMAL_PROXY_SOCKET="$WORK/kp.sock"
mkdir -p "$HOME"
on 0 "$KP_BIN" run --http-port="$PORT_KP_HTTP" --https-port="$PORT_KP" >"$WORK/kp.log" 2>&1 & PIDS+=($!)
for _ in $(seq 1 100); do [[ -S "$KAMAL_PROXY_SOCKET" ]] && curl -s -o /dev/null "http://127.0.0.1:$PORT_UPSTREAM/" && break; sleep 0.1; done
"$KP_BIN" deploy bench --target="127.0.0.1:$PORT_UPSTREAM" --host=localhost --tls \
    --tls-certificate-path="$WORK/cert.pem" --tls-private-key-path="$WORK/key.pem" \
    --health-check-path=/ >/dev/null
for port in $PORT_KP $PORT_NGINX; do
    curl -sk --fail -o /dev/null "https://localhost:$port/" || { echo "no answer on :$port" >&2; cat "$WORK/kp.log" >&2; exit 1; }
done

h2load_rps() { # args...: prints req/s, fails the script on any failed request
    local out
    out=$(on 1 h2load -D "$DURATION" -t 1 "$@" 2>&1)
    local failed
    failed=$(sed -n 's/^requests: .* \([0-9]*\) failed.*/\1/p' <<<"$out")
    [[ "${failed:-0}" == 0 ]] || { echo "$out" >&2; echo "h2load: $failed failed requests" >&2; exit 1; }
    sed -n 's/^finished in .*, \([0-9.]*\) req\/s.*/\1/p' <<<"$out"
}
wrk_rps() {
    local out
    out=$(on 1 wrk -t1 -c "$1" -d "${DURATION}s" -H 'Connection: close' "$2" 2>&1)
    if grep -q 'Socket errors\|Non-2xx' <<<"$out"; then echo "$out" >&2; fi
    sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p' <<<"$out"
}

declare -A R
for target in kamal-proxy nginx; do
    port=$PORT_KP; [[ $target == nginx ]] && port=$PORT_NGINX
    url="https://localhost:$port/"
    log "$target: h2 c10 m10"; R[$target,h2]=$(h2load_rps -c 10 -m 10 "$url")
    log "$target: h1.1 over TLS c64"; R[$target,h1]=$(h2load_rps --h1 -c 64 -m 1 "$url")
    log "$target: new handshake per request c32"; R[$target,hs]=$(wrk_rps 32 "$url")
done
RSS=$(awk '/VmRSS/ {print $2}' "/proc/${PIDS[2]}/status" 2>/dev/null || echo "?")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
printf '\n%-34s %14s %14s %8s\n' "HTTPS, $DURATION s per run" kamal-proxy nginx ratio
for k in h2 h1 hs; do
    case $k in
        h2) name="HTTP/2 req/s (c10 m10)" ;;
        h1) name="HTTP/1.1 over TLS req/s (c64)" ;;
        hs) name="new TLS handshakes/s (c32)" ;;
    esac
    printf '%-34s %14s %14s %8s\n' "$name" "${R[kamal-proxy,$k]}" "${R[nginx,$k]}" "$(ratio "${R[kamal-proxy,$k]}" "${R[nginx,$k]}")"
done
printf 'kamal-proxy RSS after the runs: %s KiB; pinned: %s\n' "$RSS" "$PIN"
