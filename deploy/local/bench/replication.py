#!/usr/bin/env python3
"""Replication benchmark (stdlib only): create N links on primary-1 and time how long each takes
to become readable, unsigned, from S3.

  replication.py N [CONCURRENCY]
prints: creates/s, replication throughput (links/s until the last object is visible), and the
create→S3-visible latency p50/p99/max (measured from the 201, polling every 5 ms).
"""
import concurrent.futures
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

base = os.environ["ZLINK_PRIMARY_1"]
key = os.environ["ZLINK_ADMIN_KEY"]
s3 = urllib.parse.urlsplit(os.environ["ZLINK_S3_ENDPOINT"])
bucket = os.environ["ZLINK_S3_BUCKET"]
local = threading.local()


def conn(u):
    attr = f"c_{u.port}"
    c = getattr(local, attr, None)
    if c is None:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        setattr(local, attr, c)
    return c


def create_and_wait(i, run):
    c = conn(urllib.parse.urlsplit(base))
    body = json.dumps({"url": f"https://example.com/repl/{run}/{i}"})
    c.request("POST", "/api/v1/links", body, {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 201:
        raise SystemExit(f"create failed: {r.status} {data[:200]!r}")
    created = time.perf_counter()
    slug = json.loads(data)["slug"]
    sc = conn(s3)
    deadline = created + 30
    while time.perf_counter() < deadline:
        sc.request("GET", f"/{bucket}/{slug}")
        rr = sc.getresponse()
        rr.read()
        if rr.status == 200:
            return created, time.perf_counter() - created
        time.sleep(0.005)
    raise SystemExit(f"{slug} not visible in S3 after 30 s")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    conc = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    run = int(time.time())
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(conc) as pool:
        results = list(pool.map(lambda i: create_and_wait(i, run), range(n)))
    end = time.perf_counter()
    lat = sorted(r[1] * 1000 for r in results)
    last_create = max(r[0] for r in results)
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
    print(f"RESULT links={n} concurrency={conc} creates_per_s={n / (last_create - start):.0f} "
          f"replicated_per_s={n / (end - start):.0f} visible_p50_ms={pick(0.5):.0f} "
          f"visible_p99_ms={pick(0.99):.0f} visible_max_ms={lat[-1]:.0f}")


if __name__ == "__main__":
    main()
