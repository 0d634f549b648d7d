#!/usr/bin/env bash
# RSS around connection bursts (idle, peak, 1 s and 12 s after 5,000 connections closed;
# then 2,000 oversized heads): the trim after bursts and the 64 KiB head limit at work.
#   bash bench/rss_bursts.sh                  # builds release, 5,000 connections
#   KP_BIN=path CONNECTIONS=2000 bash bench/rss_bursts.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${KP_BIN:-}" ]]; then
  cargo build --release --quiet --bin kamal-proxy
  KP_BIN=target/release/kamal-proxy
fi
cargo build --release --quiet --example test_backend
exec python3 bench/rss_bursts.py --kp-bin "$KP_BIN" --backend-bin target/release/examples/test_backend \
  --connections "${CONNECTIONS:-5000}"
