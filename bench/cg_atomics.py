#!/usr/bin/env python3
"""Atomic read-modify-write instructions a request runs: `lock`-prefixed instructions and
`xchg` with memory (locked implicitly), counted from a callgrind dump recorded with
`--dump-instr=yes` (bench/callgrind.sh with ATOMICS=1 or FOOTPRINT=1).

    bench/cg_atomics.py <callgrind.out> <requests> [rows]

nginx's single-threaded worker runs none; each of ours waits for the store buffer to
drain (5 ns for a `lock xadd`, 8 ns for a load and `lock cmpxchg` on this machine's Xeon,
in a loop of nothing else), so their number is a cost of its own that instruction counts
hide. Prints the total a request by object (our binary, libc), then the sites (innermost
source line and the three frames around it, from `addr2line` over the binary's line
tables) that run at least 0.5 a request.
"""
import collections
import re
import subprocess
import sys

from cg_dump import instruction_costs

path, requests = sys.argv[1], int(sys.argv[2])
rows = int(sys.argv[3]) if len(sys.argv) > 3 else 40
cost = collections.Counter()  # (object, address) -> times run
for obj, _, addr, n in instruction_costs(path):
    cost[(obj, addr)] += n


def locked_instructions(path):
    """Address -> mnemonic of every atomic read-modify-write in the object."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path],
                         capture_output=True, text=True, check=True).stdout
    found, starts = {}, set()
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)(.*)", line)
        if not m:
            continue
        a, op, rest = int(m.group(1), 16), m.group(2), m.group(3)
        starts.add(a)
        if op == "lock":
            found[a] = rest.split()[0]
        elif op.startswith("xchg") and "(" in rest:
            found[a] = op
    return found, starts


def bias(addresses, starts):
    """The load bias (0 for a fixed-address binary): the page-aligned shift that puts the
    most executed addresses on instruction starts."""
    sample = addresses[:400]
    best = (0, sum(a in starts for a in sample))
    for a in sample[:20]:
        for s in starts:
            b = a - s
            if b % 4096 == 0 and b > 0:
                hits = sum((x - b) in starts for x in sample)
                if hits > best[1]:
                    best = (b, hits)
        if best[1] == len(sample):
            break
    return best[0]


totals = collections.Counter()
sites = []
for o in sorted({o for o, _ in cost}):
    short = o.rsplit("/", 1)[-1]
    if "vgpreload" in short or "valgrind" in o or short == "???":
        continue
    locked, starts = locked_instructions(o)
    addresses = [a for (oo, a) in cost if oo == o]
    b = bias(addresses, starts)
    for a in addresses:
        op = locked.get(a - b)
        if op:
            n = cost[(o, a)] / requests
            totals[short] += n
            if n >= 0.5:
                sites.append((n, short, o, a - b, op))

print("atomic read-modify-write instructions a request: "
      + ", ".join(f"{k} {v:.1f}" for k, v in totals.most_common())
      + f", total {sum(totals.values()):.1f}")
sites.sort(reverse=True)
where = {}
for short in {s[1] for s in sites}:
    chosen = [s for s in sites[:rows] if s[1] == short]
    if not chosen:
        continue
    out = subprocess.run(["addr2line", "-a", "-f", "-i", "-C", "-e", chosen[0][2]]
                         + [hex(s[3]) for s in chosen], capture_output=True, text=True).stdout
    for block in re.split(r"\n(?=0x[0-9a-f]+\n)", out.strip()):
        lines = block.split("\n")
        where[(short, int(lines[0], 16))] = [lines[i + 1] for i in range(1, len(lines) - 1, 2)]


def shown(frames):
    """The innermost frame outside `core::sync::atomic`, then the first two of our own."""
    def short(f):
        return re.sub(r".*/(src/|library/)", "", f)
    inner = [f for f in frames if not short(f).startswith("sync/atomic.rs")][:1]
    ours = [f for f in frames[1:] if "/.cargo/" not in f and "/rustc/" not in f and f not in inner][:2]
    return " <- ".join(short(f) for f in inner + ours)


for n, short_name, _, a, op in sites[:rows]:
    print(f"{n:6.1f}  {op:8} {shown(where.get((short_name, a), []))[:170] or short_name}")
