#!/usr/bin/env python3
"""Soak: minutes of mixed traffic against one kamal-proxy, on loopback.

At the same time, for DURATION seconds:
  * steady load on a service (`wrk -t1 -c16`), every answer expected 200;
  * a zero-downtime redeploy of that service between two backends every DEPLOY_EVERY s;
  * a scale-to-zero service (a busybox httpd container, when Docker answers) that falls
    asleep and is woken by a request every WAKE_EVERY s, each answer expected 200;
  * hostile clients: slowloris heads, oversized heads, garbage bytes, bodies cut short,
    half-open connections, a control connection that never sends its request.
Samples the proxy's RSS and open descriptors every 5 s and prints a JSON report: failed
requests of each kind, RSS and descriptors at the start and the end, and whether the
proxy is still up. Exit 1 when any legitimate request failed or the proxy died.

Driven by bench/soak.sh (which builds the binaries); see bench/README.md.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

LABEL = "kamal-proxy-soak=1"
IMAGE = "kamal-proxy-soak-busybox:latest"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Counter:
    def __init__(self):
        self.lock = threading.Lock()
        self.values = {}

    def add(self, key, n=1):
        with self.lock:
            self.values[key] = self.values.get(key, 0) + n

    def snapshot(self):
        with self.lock:
            return dict(self.values)


def get(port, host, path, timeout=60):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": host})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:  # connection refused, reset, timeout
        return f"{type(e).__name__}: {e}"


def docker_ok():
    return shutil.which("docker") and subprocess.run(
        ["docker", "info"], capture_output=True).returncode == 0


def ensure_image():
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode == 0:
        return
    root = tempfile.mkdtemp()
    os.makedirs(f"{root}/bin")
    os.makedirs(f"{root}/www")
    shutil.copy("/bin/busybox", f"{root}/bin/busybox")
    for applet in ["sh", "httpd"]:
        os.symlink("busybox", f"{root}/bin/{applet}")
    for name, body in [("up", "ok\n"), ("index.html", "soak\n")]:
        with open(f"{root}/www/{name}", "w") as f:
            f.write(body)
    tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["docker", "import", "--change", f"LABEL {LABEL}", "-", IMAGE],
                   stdin=tar.stdout, check=True, capture_output=True)
    tar.wait()
    shutil.rmtree(root)


class Soak:
    def __init__(self, args):
        self.args = args
        self.stop = threading.Event()
        self.count = Counter()
        self.samples = []
        self.procs = []
        self.container = None
        self.home = tempfile.mkdtemp(prefix="kp-soak-")
        self.http = free_port()
        self.https = free_port()

    # ---- set-up ------------------------------------------------------------------------
    def start_proxy(self):
        env = self.env()
        cmd = [self.args.kp_bin, "run", f"--http-port={self.http}", f"--https-port={self.https}"]
        if self.container:
            cmd.append(f"--docker-socket={self.args.docker_socket}")
        self.log = open(f"{self.home}/proxy.log", "w+")
        self.proxy = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.procs.append(self.proxy)
        deadline = time.time() + 20
        while time.time() < deadline:
            self.log.flush()
            with open(f"{self.home}/proxy.log") as f:
                if "Server started" in f.read():
                    return
            time.sleep(0.05)
        raise SystemExit("kamal-proxy did not start: " + open(f"{self.home}/proxy.log").read())

    def env(self):
        return dict(os.environ, HOME=self.home, KAMAL_PROXY_SOCKET=f"{self.home}/kamal-proxy.sock")

    def cli(self, *args):
        env = self.env()
        return subprocess.run([self.args.kp_bin, *args], env=env, capture_output=True, text=True)

    def start_backend(self, name):
        port = free_port()
        p = subprocess.Popen([self.args.backend_bin, "--listen", f"127.0.0.1:{port}", "--name", name],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        for _ in range(200):
            if get(port, "x", "/up", timeout=1) == 200:
                return f"127.0.0.1:{port}"
            time.sleep(0.05)
        raise SystemExit(f"backend {name} did not start")

    def start_container(self):
        ensure_image()
        port = free_port()
        name = f"kp-soak-{os.getpid()}"
        subprocess.run(["docker", "run", "-d", "--network", "host", "--label", LABEL, "--name", name,
                        IMAGE, "/bin/httpd", "-f", "-p", f"127.0.0.1:{port}", "-h", "/www"],
                       check=True, capture_output=True)
        self.container = (name, port)
        for _ in range(200):
            if get(port, "x", "/up", timeout=1) == 200:
                return
            time.sleep(0.05)
        raise SystemExit("soak container did not answer")

    # ---- load --------------------------------------------------------------------------
    def wrk(self):
        out = subprocess.run(
            ["wrk", "-t1", "-c16", f"-d{self.args.duration}s", "-H", "Host: web.test",
             f"http://127.0.0.1:{self.http}/"], capture_output=True, text=True).stdout
        self.wrk_out = out
        total = re.search(r"(\d+) requests in", out)
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
        self.count.add("load_requests", int(total.group(1)) if total else 0)
        self.count.add("load_non_2xx", int(non2xx.group(1)) if non2xx else 0)
        if errors:
            self.count.add("load_socket_errors", sum(int(g) for g in errors.groups()))

    def deploys(self, targets):
        i = 0
        while not self.stop.wait(self.args.deploy_every):
            i += 1
            r = self.cli("deploy", "web", f"--target={targets[i % 2]}", "--host=web.test",
                         "--drain-timeout=5s")
            self.count.add("deploys")
            if r.returncode != 0:
                self.count.add("deploys_failed")
                print(f"deploy failed: {r.stderr.strip()}", file=sys.stderr)

    def wakes(self):
        while not self.stop.wait(self.args.wake_every):
            status = get(self.http, "sleepy.test", "/")
            self.count.add("wake_requests")
            if status != 200:
                self.count.add("wake_requests_failed")
                print(f"sleepy request: {status}", file=sys.stderr)

    # ---- hostile clients --------------------------------------------------------------
    def raw(self, payload, read=True, linger=0.0):
        try:
            with socket.create_connection(("127.0.0.1", self.http), timeout=10) as s:
                s.sendall(payload)
                if linger:
                    time.sleep(linger)
                if read:
                    s.recv(4096)
        except OSError:
            pass

    def hostile(self):
        kinds = [
            ("oversized_head", lambda: self.raw(b"GET / HTTP/1.1\r\nHost: web.test\r\nX-Big: "
                                                + b"a" * 200_000 + b"\r\n\r\n")),
            ("garbage", lambda: self.raw(bytes(random.getrandbits(8) for _ in range(512)))),
            ("cut_body", lambda: self.raw(b"POST / HTTP/1.1\r\nHost: web.test\r\nContent-Length: 100000"
                                          b"\r\n\r\n" + b"x" * 1000, read=False)),
            ("bad_chunk", lambda: self.raw(b"POST / HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding: chunked"
                                           b"\r\n\r\nffffffffffffffffff\r\n")),
            ("smuggle", lambda: self.raw(b"POST / HTTP/1.1\r\nHost: web.test\r\nContent-Length: 4\r\n"
                                         b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n")),
            ("half_open", lambda: self.raw(b"GET / HTTP/1.1\r\nHost: web.test\r\n", read=False, linger=0.5)),
            ("control_silence", self.control_silence),
        ]
        while not self.stop.is_set():
            name, attack = random.choice(kinds)
            attack()
            self.count.add(f"hostile_{name}")
            self.stop.wait(0.05)

    def control_silence(self):
        """A control connection that never sends its request: the server hangs up on it."""
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(15)
                s.connect(f"{self.home}/kamal-proxy.sock")
                got = s.recv(4096)
                self.count.add("control_silence_cut_by_proxy" if got == b"" else "control_silence_answered")
        except OSError:
            pass

    def slowloris(self):
        """Keeps SLOWLORIS connections open, each sending one header byte every 5 s."""
        conns = []
        while not self.stop.is_set():
            while len(conns) < self.args.slowloris:
                try:
                    s = socket.create_connection(("127.0.0.1", self.http), timeout=5)
                    s.sendall(b"GET / HTTP/1.1\r\nHost: web.test\r\n")
                    conns.append(s)
                    self.count.add("hostile_slowloris")
                except OSError:
                    break
            self.stop.wait(5)
            alive = []
            for s in conns:
                try:
                    s.sendall(b"X")
                    alive.append(s)
                except OSError:
                    self.count.add("slowloris_cut_by_proxy")
                    s.close()
            conns = alive
        for s in conns:
            s.close()

    def sampler(self):
        while True:
            if self.proxy.poll() is not None:
                return
            self.samples.append((time.time(), rss_kib(self.proxy.pid), open_fds(self.proxy.pid)))
            if self.stop.wait(5):
                return

    # ---- run ---------------------------------------------------------------------------
    def run(self):
        if self.args.docker and docker_ok():
            self.start_container()
        elif self.args.docker_required:
            raise SystemExit("no Docker Engine answers (SOAK_DOCKER=0 to soak without sleep/wake)")
        self.start_proxy()
        targets = [self.start_backend("a"), self.start_backend("b")]
        r = self.cli("deploy", "web", f"--target={targets[0]}", "--host=web.test")
        if r.returncode != 0:
            raise SystemExit(f"deploy web: {r.stderr}")
        if self.container:
            name, port = self.container
            r = self.cli("deploy", "sleepy", f"--target=127.0.0.1:{port}", "--host=sleepy.test",
                         f"--sleep-after={self.args.sleep_after}s", f"--sleep-container={name}")
            if r.returncode != 0:
                raise SystemExit(f"deploy sleepy: {r.stderr}")
        time.sleep(1)
        start = (rss_kib(self.proxy.pid), open_fds(self.proxy.pid))
        workers = [threading.Thread(target=self.deploys, args=(targets,)),
                   *(threading.Thread(target=self.hostile) for _ in range(4)),
                   threading.Thread(target=self.slowloris),
                   threading.Thread(target=self.sampler)]
        if self.container:
            workers.append(threading.Thread(target=self.wakes))
        for w in workers:
            w.start()
        self.wrk()  # runs for DURATION
        self.stop.set()
        for w in workers:
            w.join()
        alive = self.proxy.poll() is None
        # Settle: hostile connections closed, then the end figures.
        time.sleep(2)
        end = (rss_kib(self.proxy.pid), open_fds(self.proxy.pid)) if alive else (0, 0)
        final = get(self.http, "web.test", "/") if alive else "dead"
        counts = self.count.snapshot()
        wake_lines = sleep_lines = 0
        with open(f"{self.home}/proxy.log") as f:
            for line in f:
                wake_lines += '"msg":"Service awake"' in line
                sleep_lines += '"msg":"Sleeping idle service"' in line
        report = {
            "duration_s": self.args.duration,
            "counts": counts,
            "sleeps": sleep_lines,
            "wakes": wake_lines,
            "failed_legitimate_requests": counts.get("load_non_2xx", 0)
            + counts.get("load_socket_errors", 0) + counts.get("wake_requests_failed", 0),
            "failed_deploys": counts.get("deploys_failed", 0),
            "rss_kib": {"start": start[0], "end": end[0],
                        "max": max((s[1] for s in self.samples), default=0)},
            "open_fds": {"start": start[1], "end": end[1],
                         "max": max((s[2] for s in self.samples), default=0)},
            "proxy_alive": alive,
            "final_request": final,
        }
        print(json.dumps(report, indent=2))
        ok = alive and final == 200 and report["failed_legitimate_requests"] == 0 \
            and report["failed_deploys"] == 0
        return 0 if ok else 1

    def cleanup(self):
        self.stop.set()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.container:
            subprocess.run(["docker", "rm", "-f", self.container[0]], capture_output=True)
        if os.environ.get("KEEP_WORK") == "1":
            print(f"work dir kept: {self.home}", file=sys.stderr)
        else:
            shutil.rmtree(self.home, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kp-bin", required=True)
    ap.add_argument("--backend-bin", required=True)
    ap.add_argument("--duration", type=int, default=600)
    ap.add_argument("--deploy-every", type=float, default=10)
    ap.add_argument("--wake-every", type=float, default=8)
    ap.add_argument("--sleep-after", type=int, default=3)
    ap.add_argument("--slowloris", type=int, default=200)
    ap.add_argument("--docker", type=int, default=1)
    ap.add_argument("--docker-required", type=int, default=0)
    ap.add_argument("--docker-socket", default="/var/run/docker.sock")
    args = ap.parse_args()
    if not 1 <= args.duration <= 3600:
        raise SystemExit("--duration must be 1..3600 s")
    soak = Soak(args)
    try:
        code = soak.run()
    finally:
        soak.cleanup()
    sys.exit(code)


if __name__ == "__main__":
    main()
