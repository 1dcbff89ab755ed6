#!/usr/bin/env python3
"""Attack-shaped load on one HTTP listener, with a normal client probing it meanwhile.

    slowclients.py --target 127.0.0.1:PORT --mode header|body|idle --conns N
                   --addrs 127.0.0.2[-127.0.0.201] [--procs K] [--secs S]
                   [--probe URL --probe-from 127.0.0.1 --probe-every 0.05]

Opens N connections spread evenly over the source addresses (a range of 127.0.0.0/8 only: the
script refuses any other target or source) and keeps them open for S seconds the way an
attacker would, reconnecting (after --reconnect-delay) whenever the server closes one:

  header  a request line and then one header line every --line-every seconds, never the
          blank line that ends the header (slowloris);
  body    a whole header announcing a 60,000-byte body, then one body byte every
          --line-every seconds (slow POST);
  idle    a whole GET, its answer read, then nothing: a keep-alive connection hoarded until
          the server closes it.

Meanwhile the probe (a normal client, its own source address) GETs --probe every
--probe-every seconds without following redirects and records each answer's status and time.
Every load is bounded by --secs and --conns. Prints one JSON object: the attackers' counts
(connections opened, closed by the server within a second of opening — refused at accept —
or later, connect errors, the most open at once) and the probe's (sent, answered by status,
failed, p50/p99/max ms).
"""
import argparse
import asyncio
import ipaddress
import json
import multiprocessing
import resource
import sys
import time
import urllib.parse


def loopback(ip):
    a = ipaddress.ip_address(ip)
    if not a.is_loopback:
        sys.exit(f"slowclients: {ip} is not a loopback address; load goes to 127.0.0.0/8 only")
    return a


def addr_range(spec):
    first, _, last = spec.partition("-")
    lo = loopback(first)
    hi = loopback(last) if last else lo
    if int(hi) < int(lo):
        sys.exit(f"slowclients: empty address range {spec}")
    return [str(ipaddress.ip_address(i)) for i in range(int(lo), int(hi) + 1)]


class Counts:
    def __init__(self):
        self.opened = 0
        self.closed_early = 0
        self.closed_later = 0
        self.connect_errors = 0
        self.open_now = 0
        self.peak_open = 0


async def attacker(args, src, c, deadline):
    host, port = args.target.rsplit(":", 1)
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), local_addr=(src, 0)), 5
            )
        except (OSError, asyncio.TimeoutError):
            c.connect_errors += 1
            await asyncio.sleep(args.reconnect_delay)
            continue
        c.opened += 1
        c.open_now += 1
        c.peak_open = max(c.peak_open, c.open_now)
        opened = time.monotonic()
        closed = asyncio.ensure_future(drain(reader))
        try:
            if args.mode == "header":
                writer.write(f"GET {args.path} HTTP/1.1\r\nHost: {args.host}\r\n".encode())
            elif args.mode == "body":
                writer.write(
                    f"POST /api/v1/links HTTP/1.1\r\nHost: {args.host}\r\n"
                    "Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n{".encode()
                )
            else:
                writer.write(f"GET {args.path} HTTP/1.1\r\nHost: {args.host}\r\n\r\n".encode())
            n = 0
            while time.monotonic() < deadline and not closed.done():
                await asyncio.wait([closed], timeout=args.line_every)
                if closed.done():
                    break
                n += 1
                if args.mode == "header":
                    writer.write(f"X-Pad-{n}: {n}\r\n".encode())
                elif args.mode == "body":
                    writer.write(b" ")
                await writer.drain()
        except OSError:
            pass
        if closed.done() or time.monotonic() < deadline:
            if time.monotonic() - opened < 1.0:
                c.closed_early += 1
            else:
                c.closed_later += 1
        closed.cancel()
        writer.close()
        c.open_now -= 1
        if time.monotonic() < deadline:
            await asyncio.sleep(args.reconnect_delay)


async def drain(reader):
    """Returns when the server closes the connection (reading and discarding what it sends)."""
    try:
        while await reader.read(4096):
            pass
    except OSError:
        pass


async def attack(args, sources, conns, deadline):
    c = Counts()
    tasks = [
        asyncio.ensure_future(attacker(args, sources[i % len(sources)], c, deadline))
        for i in range(conns)
    ]
    await asyncio.gather(*tasks, return_exceptions=True)
    return vars(c)


def attack_proc(args, sources, conns, deadline_wall, out):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = conns + 256
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), max(hard, want)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    deadline = time.monotonic() + (deadline_wall - time.time())
    out.put(asyncio.run(attack(args, sources, conns, deadline)))


async def probe(args, deadline):
    u = urllib.parse.urlsplit(args.probe)
    host, port = u.hostname, u.port or 80
    loopback(host)
    times, statuses, failed, sent = [], {}, 0, 0
    reader = writer = None
    while time.monotonic() < deadline:
        started = time.monotonic()
        sent += 1
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, local_addr=(args.probe_from, 0)), 5
                )
            writer.write(f"GET {u.path} HTTP/1.1\r\nHost: {args.host}\r\n\r\n".encode())
            await writer.drain()
            status = await asyncio.wait_for(read_answer(reader), 5)
            statuses[status] = statuses.get(status, 0) + 1
            times.append((time.monotonic() - started) * 1000)
        except (OSError, asyncio.TimeoutError, ValueError, asyncio.IncompleteReadError):
            failed += 1
            if writer is not None:
                writer.close()
            reader = writer = None
        await asyncio.sleep(max(0.0, args.probe_every - (time.monotonic() - started)))
    times.sort()

    def pct(p):
        return round(times[min(len(times) - 1, int(len(times) * p))], 1) if times else None

    return {
        "sent": sent,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "failed": failed,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": round(times[-1], 1) if times else None,
    }


async def read_answer(reader):
    """One HTTP/1.1 answer: its status; the body (Content-Length) is read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)
    return status


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="HOST:PORT of the listener (loopback)")
    p.add_argument("--mode", choices=["header", "body", "idle"], default="header")
    p.add_argument("--conns", type=int, default=1000)
    p.add_argument("--addrs", default="127.0.0.2", help="source address or range A-B")
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--secs", type=float, default=20)
    p.add_argument("--line-every", type=float, default=1.0)
    p.add_argument("--reconnect-delay", type=float, default=0.2)
    p.add_argument("--path", default="/nginx-health")
    p.add_argument("--host", default="localhost")
    p.add_argument("--probe", help="URL the normal client GETs meanwhile")
    p.add_argument("--probe-from", default="127.0.0.1")
    p.add_argument("--probe-every", type=float, default=0.05)
    args = p.parse_args()
    loopback(args.target.rsplit(":", 1)[0])
    loopback(args.probe_from)
    sources = addr_range(args.addrs)
    if not 0 < args.secs <= 600 or not 0 <= args.conns <= 100_000:
        sys.exit("slowclients: --secs must be in (0, 600] and --conns in [0, 100000]")
    deadline_wall = time.time() + args.secs
    out = multiprocessing.Queue()
    procs = []
    per = [args.conns // args.procs + (1 if i < args.conns % args.procs else 0) for i in range(args.procs)]
    for i in range(args.procs):
        mine = sources[i::args.procs] or sources
        pr = multiprocessing.Process(target=attack_proc, args=(args, mine, per[i], deadline_wall, out))
        pr.start()
        procs.append(pr)
    result = {"mode": args.mode, "conns": args.conns, "addresses": len(sources)}
    if args.probe:
        time.sleep(min(2.0, args.secs / 4))  # the attack builds up before the probe starts
        result["probe"] = asyncio.run(probe(args, time.monotonic() + (deadline_wall - time.time())))
    totals = {}
    for _ in procs:
        for k, v in out.get(timeout=args.secs + 60).items():
            if k == "open_now":
                continue
            totals[k] = totals.get(k, 0) + v
    for pr in procs:
        pr.join(timeout=10)
    result["attack"] = totals
    print(json.dumps(result))


if __name__ == "__main__":
    main()
