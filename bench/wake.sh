#!/usr/bin/env bash
# Scale-to-zero benchmark: wake latency and overhead from each tier, stopped and frozen
# (1/10/100 concurrent first requests, an app that listens at once and one that boots in
# 0.3 s), the hot-path cost of idle tracking, and RSS and idle CPU with 0, 100 and 1,000
# services asleep. Needs a Docker Engine, /bin/busybox (busybox-static) and wrk.
# WAKE_CYCLES=10, SCALE_IDLE_SECONDS=30 by default; WAKE_SKIP=1 / TRACKING_SKIP=1 / SCALE_SKIP=1
# skip parts; KAMAL_PROXY_BIN picks the proxy binary (default: the bench build's).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo bench --bench wake
