#!/usr/bin/env bash
# Soak: DURATION seconds (default 600) of mixed traffic against one kamal-proxy on
# loopback — steady load with wrk, a zero-downtime redeploy every 10 s, a scale-to-zero
# service put to sleep and woken every 8 s (a busybox container, when Docker answers),
# and hostile clients (slowloris, oversized heads, garbage, bodies cut short, bad chunk
# sizes, smuggling attempts, silent control connections). Prints a JSON report with the
# failed requests, RSS and open descriptors at the start and the end; exit 1 when a
# legitimate request or deploy failed or the proxy died. See bench/README.md.
#
#   bash bench/soak.sh                 # 10 minutes
#   DURATION=60 bash bench/soak.sh     # a short one
#   KP_BIN=path SOAK_DOCKER=0 ...      # a given binary; no sleep/wake part
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-600}"
[[ "$DURATION" =~ ^[0-9]+$ ]] || { echo "soak: DURATION must be a whole number of seconds" >&2; exit 2; }
command -v wrk >/dev/null || { echo "soak: wrk is missing (apt-get install wrk)" >&2; exit 2; }
if [[ -z "${KP_BIN:-}" ]]; then
  cargo build --release --quiet --bin kamal-proxy
  KP_BIN=target/release/kamal-proxy
fi
cargo build --release --quiet --example test_backend
exec python3 bench/soak.py --kp-bin "$KP_BIN" --backend-bin target/release/examples/test_backend \
  --duration "$DURATION" --docker "${SOAK_DOCKER:-1}" --docker-required "${SOAK_DOCKER:-1}"
