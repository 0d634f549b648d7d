#!/usr/bin/env python3
"""Which 4 KiB pages of kamal-proxy's code are resident in a running proxy, and where they
lie against the layout link/hot-text.ld places first (bench/README.md, "Thirty-second round").

    python3 bench/text_resident.py PID BINARY_WITH_SYMBOLS [link/hot-text.ld]

PID runs BINARY_WITH_SYMBOLS (a profile-guided build with its symbols kept, see
bench/README.md, "Profiling"; the shipped build is stripped), best started under
`setarch -R`. Reads /proc/PID/pagemap (needs root), prints the resident code inside and
outside the placed layout, and each 64 KiB window outside it with the functions it holds:
the kernel maps code 64 KiB around each page touched (fault-around), so one function run
outside the layout keeps up to 128 KiB resident.
"""
import bisect
import fnmatch
import os
import re
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The symbol table is read as the script that writes the layout reads it.
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from hot_text import functions  # noqa: E402


def placed_region(syms, layout):
    """The start of the code and the end of what the layout placed first: its functions in
    address order up to the first gap of more than 256 KiB (a pattern may also name a
    function the linker could not place, far from the rest)."""
    pats = [m.group(1) for m in re.finditer(r"\*\(\.text\.(\S+) ", open(layout).read())]
    rx = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in pats))
    placed = [(a, s) for a, s, n in syms if rx.match(n)]
    end = placed[0][0]
    for a, s in placed:
        if a - end > 256 * 1024:
            break
        end = max(end, a + s)
    return syms[0][0], end


def resident_pages(pid):
    """Resident pages of the executable's code, as offsets from its load address."""
    exe = os.readlink(f"/proc/{pid}/exe")
    maps = []
    for line in open(f"/proc/{pid}/maps"):
        parts = line.split()
        if len(parts) >= 6 and parts[5] == exe:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            maps.append((lo, hi, parts[1], int(parts[2], 16)))
    base = min(lo - off for lo, hi, perm, off in maps)
    pages = []
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for lo, hi, perm, off in maps:
            if "x" not in perm:
                continue
            for page in range(lo, hi, 4096):
                pagemap.seek(page // 4096 * 8)
                (entry,) = struct.unpack("<Q", pagemap.read(8))
                if entry >> 63 & 1:
                    pages.append(page - base)
    return pages


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    pid, binary = sys.argv[1], sys.argv[2]
    layout = sys.argv[3] if len(sys.argv) > 3 else os.path.join(ROOT, "link", "hot-text.ld")
    syms = functions(binary)
    start, end = placed_region(syms, layout)
    pages = resident_pages(pid)
    outside = [p for p in pages if p >= end]
    print(f"code resident: {len(pages) * 4} KiB; placed first: {start:#x}..{end:#x} "
          f"({(end - start) // 1024} KiB), {(len(pages) - len(outside)) * 4} KiB resident there, "
          f"{len(outside) * 4} KiB outside")
    starts = [a for a, s, n in syms]
    windows = {}
    for p in outside:
        windows.setdefault(p // 65536, []).append(p)
    for w in sorted(windows):
        names = set()
        for p in windows[w]:
            i = max(bisect.bisect_right(starts, p) - 1, 0)
            j = bisect.bisect_right(starts, p + 4096)
            names.update(n for a, s, n in syms[i:j])
        shown = ", ".join(sorted(names, key=len)[:3])
        print(f"  {w * 65536:#x}: {len(windows[w]) * 4} KiB, {len(names)} functions, e.g. {shown}")


if __name__ == "__main__":
    main()
