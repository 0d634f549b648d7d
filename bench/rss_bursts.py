#!/usr/bin/env python3
"""RSS of kamal-proxy around connection bursts: idle baseline, the peak while N
connections are open, just after they closed, and after the next trim check (10 s).

Phase 1: N connections (default 5,000) each send a GET with a 32 KiB header through the
proxy to a backend and stay open until all have been answered, then all close.
Phase 2: 2,000 connections each send a 390 KB head (the issue's attack): 431 at 64 KiB.
Prints a JSON report. Run through bench/rss_bursts.sh."""
import argparse, asyncio, json, os, resource, subprocess, sys, tempfile, time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def one(port, head, held, answered):
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None
    w.write(head)
    try:
        await w.drain()
        status = (await r.readline()).split(b" ")[1:2]
        status = int(status[0]) if status else 0
    except (OSError, ValueError, IndexError):
        status = 0
    answered.append(status)
    await held.wait()
    w.close()
    return status


async def burst(pid, port, n, head, sample):
    held = asyncio.Event()
    answered = []
    tasks = [asyncio.create_task(one(port, head, held, answered)) for _ in range(n)]
    peak = 0
    while len(answered) < n and not all(t.done() for t in tasks):
        peak = max(peak, rss_kib(pid))
        await asyncio.sleep(0.05)
    peak = max(peak, rss_kib(pid))
    held.set()
    statuses = await asyncio.gather(*tasks)
    await asyncio.sleep(1)
    closed = rss_kib(pid)
    await asyncio.sleep(sample)
    trimmed = rss_kib(pid)
    counts = {}
    for s in statuses:
        counts[str(s)] = counts.get(str(s), 0) + 1
    return {"connections": n, "statuses": counts, "peak_kib": peak,
            "closed_1s_kib": closed, f"closed_{int(sample)+1}s_kib": trimmed}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kp-bin", required=True)
    ap.add_argument("--backend-bin", required=True)
    ap.add_argument("--connections", type=int, default=5000)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tmp = tempfile.mkdtemp(prefix="kp-rss-")
    env = {"PATH": os.environ["PATH"], "HOME": tmp, "KAMAL_PROXY_SOCKET": f"{tmp}/kp.sock", "TMPDIR": tmp}
    backend = subprocess.Popen([args.backend_bin, "--listen", "127.0.0.1:39401", "--name", "app"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kp = subprocess.Popen([args.kp_bin, "run", "--http-port=39402", "--https-port=39403"], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if os.path.exists(f"{tmp}/kp.sock"):
                break
            time.sleep(0.1)
        subprocess.run([args.kp_bin, "deploy", "app", "--target=127.0.0.1:39401", "--host=app.test"],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        time.sleep(2)
        report = {"idle_kib": rss_kib(kp.pid)}
        head = (b"GET / HTTP/1.1\r\nHost: app.test\r\nX-Pad: " + b"x" * 32 * 1024 + b"\r\n\r\n")
        report["burst_32k_heads"] = asyncio.run(burst(kp.pid, 39402, args.connections, head, 11))
        big = (b"GET / HTTP/1.1\r\nHost: app.test\r\nX-Pad: " + b"x" * 390 * 1000 + b"\r\n\r\n")
        report["burst_390k_heads"] = asyncio.run(burst(kp.pid, 39402, 2000, big, 11))
        report["idle_end_kib"] = rss_kib(kp.pid)
        last = report["burst_32k_heads"]
        report["after_burst_over_idle"] = round(last["closed_12s_kib"] / report["idle_kib"], 2)
        print(json.dumps(report, indent=2))
    finally:
        kp.terminate()
        backend.terminate()
        kp.wait()
        backend.wait()


if __name__ == "__main__":
    sys.exit(main())
