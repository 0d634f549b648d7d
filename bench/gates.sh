#!/usr/bin/env bash
# Hot-path cost of the access gates: one proxy, one backend, two services on it —
# plain.test (no gates) and gated.test (allow list, rate limit, basic auth, a redirect and a
# rewrite rule that do not match, a request deadline) — loaded alternately with wrk.
# Reports req/s and p50/p99 for each and the ratio gated/plain.
# With BASE_BIN=<a kamal-proxy built without the gates>, a second proxy of that binary
# serves the same backend as base.test (no gates), to show what the gate checks cost a
# service that has none (ratio plain/base).
#   PROFILE=release bench/gates.sh     (default: debug — fine for ratios, not for figures)
#   ROUNDS=3 SECONDS_EACH=5
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-debug}
ROUNDS=${ROUNDS:-3}
SECS=${SECONDS_EACH:-5}
if [ "$PROFILE" = release ]; then flag=--release; else flag=; fi
cargo build -q $flag --bin kamal-proxy --example test_backend
BIN=$PWD/target/$PROFILE/kamal-proxy
BACKEND=$PWD/target/$PROFILE/examples/test_backend

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
bport=$(free_port)
pport=$(free_port)
"$BACKEND" --listen "127.0.0.1:$bport" --name bench >/dev/null 2>&1 &
pids+=($!)
export HOME=$work KAMAL_PROXY_SOCKET=$work/kp.sock
"$BIN" run --http-port="$pport" >"$work/proxy.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$work/kp.sock" ] && break; sleep 0.1; done
if [ -n "${BASE_BIN:-}" ]; then
  bport2=$(free_port)
  mkdir -p "$work/base"
  HOME=$work/base KAMAL_PROXY_SOCKET=$work/base.sock "$BASE_BIN" run --http-port="$bport2" >"$work/base.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$work/base.sock" ] && break; sleep 0.1; done
  HOME=$work/base KAMAL_PROXY_SOCKET=$work/base.sock "$BASE_BIN" deploy base --target="127.0.0.1:$bport" --host=base.test
fi

"$BIN" deploy plain --target="127.0.0.1:$bport" --host=plain.test
"$BIN" deploy gated --target="127.0.0.1:$bport" --host=gated.test \
  --allow-ip=127.0.0.1,::1 --rate-limit=1000000000 --basic-auth=bench:secret \
  --redirect='/old/(.*)=/new/$1' --rewrite='/legacy/(.*)=/$1' --request-timeout=30s

auth="Authorization: Basic $(printf bench:secret | base64)"
run() { # host [port] → "rps p50_us p99_us"
  wrk -t2 -c64 -d"${SECS}s" --latency -H "Host: $1" -H "$auth" "http://127.0.0.1:${2:-$pport}/" |
    awk '/Requests\/sec/ {r=$2} / 50%/ {p50=$2} / 99%/ {p99=$2}
         function us(v) { if (v ~ /ms$/) return v*1000; if (v ~ /us$/) return v+0; if (v ~ /s$/) return v*1000000; return v }
         END {printf "%s %d %d\n", r, us(p50), us(p99)}'
}
curl -sf -H "Host: gated.test" -u bench:secret "http://127.0.0.1:$pport/" >/dev/null
echo "profile=$PROFILE rounds=$ROUNDS ${SECS}s each, wrk -t2 -c64"
for i in $(seq "$ROUNDS"); do
  # Rotate the order each round so no service always runs first (or last).
  order=(plain gated base)
  [ -n "${BASE_BIN:-}" ] || order=(plain gated)
  n=${#order[@]}
  for j in $(seq 0 $((n - 1))); do
    k=${order[$(( (i + j) % n ))]}
    if [ "$k" = base ]; then echo "base $(run base.test "$bport2")"; else echo "$k $(run "$k.test")"; fi
  done
done | tee "$work/results"
awk '{n[$1]++; r[$1]+=$2; p50[$1]+=$3; p99[$1]+=$4}
     END {for (k in n) printf "%s: %.0f req/s, p50 %d us, p99 %d us\n", k, r[k]/n[k], p50[k]/n[k], p99[k]/n[k];
          printf "gated/plain throughput = %.3f\n", (r["gated"]/n["gated"])/(r["plain"]/n["plain"]);
          if (n["base"]) printf "plain/base throughput = %.3f\n", (r["plain"]/n["plain"])/(r["base"]/n["base"])}' "$work/results"
