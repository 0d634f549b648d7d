#!/usr/bin/env python3
"""Instructions per request by component, from a callgrind dump (bench/callgrind.sh).

    bench/cg_breakdown.py <callgrind.out> <requests>

Inclusive costs of the functions that bound each component, divided by the request count.
With LTO, inlined code is charged to the function it was inlined into, so the figures are
approximate (a few percent); the allocator line is the self cost of libc's malloc family,
which every other line also includes.
"""
import re
import subprocess
import sys

path, requests = sys.argv[1], int(sys.argv[2])
out = subprocess.run(
    ["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
    capture_output=True, text=True, check=True).stdout
self_out = subprocess.run(
    ["callgrind_annotate", "--threshold=100", path],
    capture_output=True, text=True, check=True).stdout

line_re = re.compile(r"^\s*([\d,]+) \([ \d.]+%\)\s+(.*?):(.*?)(?: \[.*\])?$")


def legacy(name):
    """A v0-demangled name (the build's mangling since the seventh round) as the legacy
    demangler printed it, which the patterns below are written for: `{closure#0}` as
    `{{closure}}`, `<a::Type>::f` as `a::Type::f`, a generic function's arguments dropped."""
    name = re.sub(r"\{closure#\d+\}", "{{closure}}", name)
    name = re.sub(r"^<([\w:]+)>::", r"\1::", name)
    return re.sub(r"::<.*>$", "", name)


def table(text):
    rows = []
    for line in text.splitlines():
        m = line_re.match(line)
        if m:
            rows.append((int(m.group(1).replace(",", "")), m.group(2), legacy(m.group(3)),
                         m.group(3)))
    return rows


incl, selfc = table(out), table(self_out)
total = next(int(l.split()[0].replace(",", "")) for l in out.splitlines()
             if "PROGRAM TOTALS" in l and l.split()[0][0].isdigit())


def inclusive(pattern):
    """Largest inclusive cost among the entries of functions matching `pattern`."""
    r = re.compile(pattern)
    return max((c for c, _, f, raw in incl if r.search(f) or r.search(raw)), default=0)


def self_cost(file_pattern):
    r = re.compile(file_pattern)
    return sum(c for c, f, _, _ in selfc if r.search(f))


# The connection's task: an async block in accept_loop, then the `Connection` future.
conn_task = max(inclusive(r"^kamal_proxy::server::accept_loop::\{\{closure\}\}::\{\{closure\}\}$"),
                inclusive(r"^<kamal_proxy::server::Connection<.*> as core::future::future::Future>::poll$"))
handle = inclusive(r"^kamal_proxy::server::handle::\{\{closure\}\}$")
body_drop = inclusive(r"^core::ptr::drop_in_place<kamal_proxy::proxy::body::ResponseBody>$")
# Our own server connection reads the response body to its end (the exchange ends there,
# with the access line) instead of dropping it: the body's polls are the pipeline's.
body_poll = inclusive(r"^<kamal_proxy::proxy::body::ResponseBody as http_body::Body>::poll_frame$")
log_line = inclusive(r"^kamal_proxy::observe::access::log_request(::\{\{closure\}\})?$")
# tracing_appender's worker until the sixth round, our own since.
log_writer = max(inclusive(r"^tracing_appender::worker::Worker<T>::work$"),
                 inclusive(r"^std::sys::backtrace::__rust_begin_short_backtrace::<<kamal_proxy::observe::log::sink::Sink>::new"))
# hyper-util's client; then our pool over hyper's connections (its take and give-back);
# now our pool and our own HTTP/1 connection (`Pools::send`: checkout, the head written,
# the response head parsed; a body read later is in the hyper server line, which polls it).
client = max(inclusive(r"^hyper_util::client::legacy::client::Client<C,B>::send_request::\{\{closure\}\}$"),
             inclusive(r"^kamal_proxy::proxy::pool::Inner::take$")
             + inclusive(r"^kamal_proxy::proxy::pool::Inner::give_back$"),
             inclusive(r"^kamal_proxy::proxy::pool::Pools::send::\{\{closure\}\}$"))
# hyper's client connection task (requests with a body, and before our own connection, all).
upstream_conn = max(
    inclusive(r"^<hyper::client::conn::http1::upgrades::UpgradeableConnection<I,B> as core::future::future::Future>::poll$"),
    inclusive(r"^<hyper::client::conn::http1::Connection<T,B> as core::future::future::Future>::poll$"),
    inclusive(r"^kamal_proxy::proxy::pool::Pool::connect::\{\{closure\}\}::\{\{closure\}\}$"),
    inclusive(r"^kamal_proxy::proxy::pool::Pools::connect::\{\{closure\}\}::\{\{closure\}\}$"))
headers = sum(inclusive(p) for p in [
    r"^kamal_proxy::proxy::headers::remove_hop_by_hop$",
    r"^kamal_proxy::proxy::headers::set_forwarded$",
    r"^kamal_proxy::proxy::headers::set_target_header$",
    r"^kamal_proxy::server::ensure_request_id$",
    r"^kamal_proxy::server::ensure_request_start$",
    r"^kamal_proxy::server::access_record$",
])
retry = sum(inclusive(p) for p in [
    r"^kamal_proxy::proxy::forward::Replay::of$",
    r"^kamal_proxy::proxy::retry::Replay::of$",
    r"^core::ptr::drop_in_place<kamal_proxy::proxy::forward::Replay>$",
    r"^core::ptr::drop_in_place<kamal_proxy::proxy::retry::Replay>$",
    r"^kamal_proxy::proxy::keep_alive::Hosts::rung$",
    r"^kamal_proxy::proxy::keep_alive::Hosts::learn$",
])
metrics = inclusive(r"^kamal_proxy::observe::metrics::ServiceMetrics::record$")
alloc = self_cost(r"malloc/(malloc|arena)\.c")
memcpy = self_cost(r"memmove|memcpy")
pipeline = handle - client - headers - retry

rows = [
    ("total (all threads)", total),
    ("server connection (hyper's; ours since the fourth round): parse, encode, I/O (minus handler, body)",
     conn_task - handle - max(body_drop, body_poll)),
    ("our pipeline: routing, gates, forward (minus client, headers, retry)", pipeline),
    ("upstream client: pool checkout/checkin, send (now with our HTTP/1 exchange)", client),
    ("hyper's upstream connection task: encode, parse, I/O", upstream_conn),
    ("header building: request id, X-Request-Start, X-Forwarded-*, hop-by-hop, access record", headers),
    ("retry + keep-alive: replay copy, rung look-up, Keep-Alive learn", retry),
    ("metrics (off unless --metrics-port)", metrics),
    ("access log: the line (request side)", log_line),
    ("access log: writer thread", log_writer),
    ("response body: drop or polls to its end (exchange end, incl. access line)", max(body_drop, body_poll)),
    ("allocator (libc malloc/free self cost, inside the above)", alloc),
    ("memcpy (future moves, buffers; inside the above)", memcpy),
]
print(f"requests: {requests}")
for name, cost in rows:
    print(f"{cost / requests:10.0f}  {name}")
