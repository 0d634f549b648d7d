"""Reads a callgrind dump recorded with `--dump-instr=yes`: the self cost of each instruction,
with its object and function. Shared by bench/cg_footprint.py and bench/cg_atomics.py."""
import re

COMPRESSED = re.compile(r"(c?)(fn|ob)=\((\d+)\)(?: (.*))?")


def _position(token, previous):
    """A position of callgrind's format: absolute, relative to the previous (+n, -n) or `*`."""
    if token == "*":
        return previous
    if token[0] in "+-":
        return previous + int(token, 0)
    return int(token, 0)


def instruction_costs(path):
    """Yields (object path, function, address, instructions run) for every cost line of the
    dump, calls' inclusive costs left out. Exits when the dump has no addresses."""
    names, objects = {}, {}
    positions = ["line"]
    fn = obj = None
    addr = 0
    after_calls = False
    for raw in open(path):
        raw = raw.rstrip("\n")
        m = COMPRESSED.match(raw)
        if m:
            called, kind, ident, name = m.groups()
            table = names if kind == "fn" else objects
            if name:
                table[ident] = name
            if not called:
                if kind == "fn":
                    fn = table.get(ident, ident)
                else:
                    obj = table.get(ident)
            continue
        if raw.startswith("positions:"):
            positions = raw.split()[1:]
            if positions[0] != "instr":
                raise SystemExit(f"{path}: the dump has no instruction addresses "
                                 "(record with --dump-instr=yes)")
            continue
        if raw.startswith("calls="):
            # The next cost line is the call's inclusive cost, charged at the call instruction.
            after_calls = True
            continue
        if not raw or not (raw[0].isdigit() or raw[0] in "+-*"):
            continue
        fields = raw.split()
        addr = _position(fields[0], addr)
        if after_calls:
            after_calls = False
            continue
        events = fields[len(positions):]
        if events and int(events[0]) != 0 and obj is not None:
            yield obj, fn, addr, int(events[0])
