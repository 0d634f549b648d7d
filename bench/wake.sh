#!/usr/bin/env bash
# Scale-to-zero benchmark: wake overhead (1/10/100 concurrent first requests, an app that
# listens at once and one that boots in 0.3 s) and the hot-path cost of idle tracking.
# Needs a Docker Engine, /bin/busybox (busybox-static) and wrk. WAKE_CYCLES=10 by default.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo bench --bench wake
