#!/usr/bin/env python3
"""Holds N idle keep-alive connections open to a proxy on 127.0.0.1, for bench/run.sh's
"RSS with 10,000 idle connections" column.

Each connection sends one `GET /` (HTTP/1.1, keep-alive), reads the whole answer and then
stays open, silent. At most --parallel requests are in flight at once, so the proxy's
upstream side sees a bounded burst rather than N simultaneous requests (which would measure
its upstream pool, not idle client connections). When every connection has been tried, the
line `ready <open>` is written to --ready-file; the caller then reads the proxy's RSS and
sends SIGTERM. On SIGTERM (or after --hold seconds, so nothing is left behind if the caller
dies) the client counts how many connections the proxy still holds open, prints one JSON
object and exits, which closes them all.
"""
import argparse, asyncio, json, os, resource, signal, socket, time

HEAD_END = b"\r\n\r\n"


def raise_nofile(wanted):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def read_answer(loop, s):
    """Reads one response; returns its status. Handles Content-Length and chunked bodies."""
    buf = b""
    while HEAD_END not in buf:
        chunk = await loop.sock_recv(s, 4096)
        if not chunk:
            raise ConnectionError("closed before the response head")
        buf += chunk
    head, _, body = buf.partition(HEAD_END)
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower()] = v.strip().lower()
    if headers.get(b"transfer-encoding") == b"chunked":
        while not body.endswith(b"0\r\n\r\n"):
            chunk = await loop.sock_recv(s, 4096)
            if not chunk:
                raise ConnectionError("closed inside a chunked body")
            body += chunk
    else:
        length = int(headers.get(b"content-length", b"0"))
        while len(body) < length:
            chunk = await loop.sock_recv(s, 4096)
            if not chunk:
                raise ConnectionError("closed inside the body")
            body += chunk
    if headers.get(b"connection") == b"close":
        raise ConnectionError("the proxy answered Connection: close")
    return status


async def one(loop, port, request, gate, held, stats):
    async with gate:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(s, ("127.0.0.1", port)), 10)
            await asyncio.wait_for(loop.sock_sendall(s, request), 10)
            status = await asyncio.wait_for(read_answer(loop, s), 10)
        except (OSError, ConnectionError, ValueError, IndexError, asyncio.TimeoutError) as e:
            s.close()
            key = type(e).__name__ + (f"({e.errno})" if isinstance(e, OSError) and e.errno else "")
            stats["errors"][key] = stats["errors"].get(key, 0) + 1
            return
        if status == 200:
            stats["ok"] += 1
        else:
            stats["non_200"] += 1
        held.append(s)


def still_open(socks):
    """A socket the proxy closed reads as EOF (or an error); an idle open one would block."""
    n = 0
    for s in socks:
        try:
            if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b"":
                n += 1  # unexpected bytes, but the connection is open
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--parallel", type=int, default=200)
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--hold", type=float, default=300, help="give up waiting for SIGTERM after this many seconds")
    args = ap.parse_args()

    limit = raise_nofile(args.count + 256)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)

    request = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{args.port}\r\nUser-Agent: bench-idle-conns\r\n\r\n".encode()
    gate = asyncio.Semaphore(args.parallel)
    held, stats = [], {"ok": 0, "non_200": 0, "errors": {}}
    t0 = time.monotonic()
    await asyncio.gather(*(one(loop, args.port, request, gate, held, stats) for _ in range(args.count)))
    open_s = time.monotonic() - t0
    open_at_ready = still_open(held)

    tmp = args.ready_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"ready {open_at_ready}\n")
    os.replace(tmp, args.ready_file)

    try:
        await asyncio.wait_for(stop.wait(), args.hold)
        timed_out = False
    except asyncio.TimeoutError:
        timed_out = True
    report = {
        "wanted": args.count,
        "ok_200": stats["ok"],
        "non_200": stats["non_200"],
        "errors": stats["errors"],
        "open_at_ready": open_at_ready,
        "open_at_end": still_open(held),
        "seconds_to_open": round(open_s, 2),
        "nofile_limit": limit,
        "hold_timed_out": timed_out,
    }
    print(json.dumps(report), flush=True)
    for s in held:
        s.close()


if __name__ == "__main__":
    asyncio.run(main())
