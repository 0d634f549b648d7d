#!/usr/bin/env python3
"""Regenerates link/hot-text.ld: the functions kamal-proxy runs from start-up through its
first requests, which build.rs has the linker place together at the start of the code.

Why: with LTO the code of a request is spread over the whole 9 MB text, and the kernel maps
code 64 KiB at a time around each page touched, so a fresh proxy kept about 6 MiB of code
resident for 2.5 MiB used. Placed together, the used code is mapped as it is (see
bench/README.md, "Seventh round").

How: builds kamal-proxy as scripts/pgo does, profile-guided, with its symbols kept
(target/hot-text), runs it under valgrind's
callgrind (which records every instruction address executed) through a start, a deploy,
plain HTTP requests (GET, HEAD, a POST with a body, a 404 for an unknown host), `list`,
then a TLS service with its own certificate (HTTP/1.1 and HTTP/2 over TLS), and a stop.
The functions of the plain HTTP part come first, then those only TLS needed, each group
by instructions executed. Patterns leave out what changes from build to build (the hash
of a legacy symbol, the crate disambiguators of a v0 one, LTO's `.llvm.` suffixes), so the
file keeps working, a little less well, while the code moves on. Rerun it after large
changes to the request path: python3 scripts/hot_text.py

Needs valgrind (with callgrind_control), openssl, curl, nm.
"""
import bisect
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "link", "hot-text.ld")
# A pattern that also names cold instances (a generic function's others) is kept when they
# take less than the 64 KiB the kernel maps around a touched page: the hot one would cost
# that much where it lies otherwise.
SHARED_COLD_MAX = 64 * 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Backend(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, body=b"hello\n"):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        # As nginx and most app servers answer: the proxy's look-up of this header's
        # tokens is on the request path.
        self.send_header("Connection", "keep-alive")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = answer

    def log_message(self, *args):
        pass


def build():
    if not os.path.exists(OUT):
        # build.rs links with the file: an empty one to start from.
        os.makedirs(os.path.dirname(OUT), exist_ok=True)
        with open(OUT, "w") as f:
            f.write("SECTIONS { .text : { } } INSERT BEFORE .init;\n")
    target_dir = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target", "hot-text"))
    # The binary we ship is profile-guided, and the profile decides what is inlined where:
    # the functions of a plain build are not the ones the shipped binary runs. So this is
    # the shipped build (scripts/pgo, which prints the binary's path last), symbols kept:
    # `-C strip=none` in RUSTFLAGS leaves the symbol names (and so the profile's counts) as
    # they are, where CARGO_PROFILE_RELEASE_STRIP would change the hash cargo puts in them.
    env = dict(os.environ, CARGO_TARGET_DIR=target_dir, RUSTFLAGS="-C strip=none")
    built = subprocess.run(["bash", os.path.join(ROOT, "scripts", "pgo"), "build"], cwd=ROOT,
                           env=env, check=True, stdout=subprocess.PIPE, text=True)
    return built.stdout.strip().splitlines()[-1]


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, **kw)


def train(binary, work):
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{backend.server_address[1]}"
    http_port, https_port = free_port(), free_port()
    env = dict(os.environ, HOME=os.path.join(work, "home"),
               KAMAL_PROXY_SOCKET=os.path.join(work, "kp.sock"))
    os.makedirs(env["HOME"])
    out = os.path.join(work, "cg.out")
    proxy = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--dump-instr=yes", f"--callgrind-out-file={out}",
         binary, "run", f"--http-port={http_port}", f"--https-port={https_port}"],
        env=env, stdout=open(os.path.join(work, "access.log"), "w"),
        stderr=open(os.path.join(work, "stderr.log"), "w"))
    try:
        deadline = time.time() + 120
        while not os.path.exists(env["KAMAL_PROXY_SOCKET"]):
            if proxy.poll() is not None or time.time() > deadline:
                sys.exit(f"kamal-proxy did not start: see {work}/stderr.log")
            time.sleep(0.2)
        cli = [binary]
        run(cli + ["deploy", "app", f"--target={target}"], env=env)
        url = f"http://127.0.0.1:{http_port}/"
        for _ in range(10):
            run(["curl", "-sf", "-o", "/dev/null", url, url + "a/b?c=d"])
        run(["curl", "-sf", "-o", "/dev/null", "-I", url])
        run(["curl", "-sf", "-o", "/dev/null", "-d", "x" * 3000, url])
        subprocess.run(["curl", "-s", "-o", "/dev/null", "-H", "Host: nobody.test", url])
        run(cli + ["list"], env=env)
        subprocess.run(["callgrind_control", "--dump=plain", str(proxy.pid)], check=True,
                       stdout=subprocess.DEVNULL)

        cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
        run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "1", "-subj", "/CN=hot.test", "-addext",
             "subjectAltName=DNS:hot.test", "-keyout", key, "-out", cert],
            stderr=subprocess.DEVNULL)
        run(cli + ["deploy", "tls-app", f"--target={target}", "--host=hot.test", "--tls",
                   f"--tls-certificate-path={cert}", f"--tls-private-key-path={key}"], env=env)
        tls = f"https://hot.test:{https_port}/"
        resolve = f"hot.test:{https_port}:127.0.0.1"
        for version in ("--http1.1", "--http2"):
            run(["curl", "-skf", version, "--resolve", resolve, "-o", "/dev/null", tls, tls + "x"])
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=120)
        backend.shutdown()
    dumps = [os.path.join(work, f) for f in os.listdir(work) if f.startswith("cg.out")]
    return sorted(dumps, key=part)


def part(dump):
    """The number callgrind gives a dump (1 for the first), from its header."""
    with open(dump) as f:
        for line in f:
            if line.startswith("part:"):
                return int(line.split()[1])
    return 0


def functions(binary):
    """(start, size, name) of every defined function, by address."""
    syms = []
    listing = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True,
                             text=True, check=True).stdout
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            syms.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
    return sorted(syms)


def executed(dump, binary, syms):
    """Instructions executed per function of `binary`, from a callgrind dump."""
    starts = [s[0] for s in syms]
    objects, current, last, cost = {}, None, 0, {}
    for line in open(dump):
        if line.startswith(("ob=", "cob=")):
            m = re.match(r"c?ob=\((\d+)\)\s*(.*)", line.strip())
            if m.group(2):
                objects[m.group(1)] = m.group(2)
            if line.startswith("ob="):
                current = objects[m.group(1)]
            continue
        if current != binary or line[0] not in "0123456789+-*":
            continue
        fields = line.split()
        pos = fields[0]
        if pos.startswith("0x"):
            addr = int(pos, 16)
        elif pos[0] == "+":
            addr = last + int(pos[1:])
        elif pos[0] == "-":
            addr = last - int(pos[1:])
        else:
            addr = last
        last = addr
        i = bisect.bisect_right(starts, addr) - 1
        if i >= 0 and addr < syms[i][0] + max(syms[i][1], 1):
            n = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 1
            cost[syms[i][2]] = cost.get(syms[i][2], 0) + n
    return cost


def pattern(name):
    """`name` without what changes from build to build: a legacy symbol's hash, a v0 one's
    crate disambiguators (and the back-references past them, which count bytes), LTO's
    suffix for a local function it made global."""
    name = re.sub(r"17h[0-9a-f]{16}E", "17h*", name)
    name = re.sub(r"Cs[0-9a-zA-Z]+_", "Cs*_", name)
    name = re.sub(r"B[0-9a-zA-Z]*_", "B*_", name) if name.startswith("_R") else name
    return re.sub(r"\.llvm\.\d+$", ".llvm.*", name)


def main():
    binary = build()
    syms = functions(binary)
    # Bytes of code behind each pattern in this build: a generic function's instances
    # share their name but for the hash, so a pattern may name cold instances too.
    size_of = {}
    for _, size, name in syms:
        size_of[pattern(name)] = size_of.get(pattern(name), 0) + size
    work = tempfile.mkdtemp(prefix="hot-text.")
    try:
        dumps = train(binary, work)
        if len(dumps) < 2:
            sys.exit(f"expected two callgrind dumps in {work}, found {dumps}")
        sizes = {name: size for _, size, name in syms}
        exact, shared, seen, dropped = [], [], set(), 0
        for dump in dumps:
            cost = executed(dump, binary, syms)
            hot = {}
            for name in cost:
                hot[pattern(name)] = hot.get(pattern(name), 0) + sizes[name]
            for name in sorted(cost, key=lambda n: (-cost[n], n)):
                p = pattern(name)
                if p in seen:
                    continue
                seen.add(p)
                cold = size_of.get(p, 0) - hot[p]
                if cold <= 0:
                    exact.append(p)
                elif cold <= SHARED_COLD_MAX:
                    # After every exact one: the cold instances stay out of the way.
                    shared.append(p)
                else:
                    dropped += 1
        order = exact + shared
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(OUT, "w") as f:
        f.write("/* Generated by scripts/hot_text.py: the functions kamal-proxy runs from start-up\n"
                "   through its first requests (plain HTTP first, then TLS), placed together at the\n"
                "   start of the code so that the pages mapped for them hold little else. Passed\n"
                "   to the linker by build.rs; see bench/README.md (\"Seventh round\"). */\n")
        # The start of `.text` itself, which the linker then fills with everything else
        # (a section of its own would hide these functions' names from valgrind).
        f.write("SECTIONS {\n  .text : {\n")
        for p in order:
            # A function LLVM judged cold lands in `.text.unlikely.<name>`.
            f.write(f"    *(.text.{p} .text.unlikely.{p})\n")
        f.write("  }\n}\nINSERT BEFORE .init;\n")
    print(f"{OUT}: {len(exact)} patterns of hot functions only, then {len(shared)} that also "
          f"name cold instances; {dropped} left out (more than {SHARED_COLD_MAX} cold bytes)")


if __name__ == "__main__":
    main()
