#!/usr/bin/env python3
"""How much code a request runs: distinct 64-byte lines of machine code executed, by function,
from a callgrind dump recorded with `--dump-instr=yes` (bench/callgrind.sh with FOOTPRINT=1).

    bench/cg_footprint.py <callgrind.out> <requests> [rows]

A request's code that does not fit the level-1 instruction cache (64 KiB here) is fetched
again from the level-2 cache for every request: with CACHE_SIM=1 the misses a request show
how far over it is. Functions are listed when they run at least one instruction a request
(on average), largest first; the totals count every line run in the window.
"""
import collections
import sys

from cg_dump import instruction_costs

path, requests = sys.argv[1], int(sys.argv[2])
rows = int(sys.argv[3]) if len(sys.argv) > 3 else 40
LINE = 64

lines = collections.defaultdict(set)  # (object, function) -> line numbers (address // 64)
cost = collections.Counter()          # (object, function) -> instructions
for obj, fn, addr, n in instruction_costs(path):
    key = (obj.rsplit("/", 1)[-1], fn)
    lines[key].add(addr // LINE)
    cost[key] += n

by_object = collections.defaultdict(set)
for (o, _), s in lines.items():
    by_object[o] |= s
print(f"code run in the window ({LINE}-byte lines):")
for o, s in sorted(by_object.items(), key=lambda kv: -len(kv[1])):
    print(f"  {o:<24} {len(s):6d} lines  {len(s) * LINE / 1024:7.1f} KiB")
hot = [(len(s), cost[k] / requests, k) for k, s in lines.items() if cost[k] / requests >= 1]
hot.sort(key=lambda h: -h[0])
total = sum(h[0] for h in hot)
print(f"run by every request (>= 1 instruction a request): {len(hot)} functions, "
      f"{total} lines, {total * LINE / 1024:.1f} KiB")
print(f"  {'lines':>5}  {'instr/req':>9}  function")
for n, c, (o, f) in hot[:rows]:
    print(f"  {n:5d}  {c:9.0f}  {f[:140]}")
