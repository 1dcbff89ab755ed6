#!/usr/bin/env python3
"""Benchmark helper (stdlib only): create N links, or time first (cold) GETs of slugs.

  links.py create N OUT_FILE     create N links on $ZLINK_PRIMARY_1, write their slugs to OUT_FILE
  links.py cold BASE_URL FILE    GET each slug once on BASE_URL, print p50/p99/max in ms
  links.py wait-s3 FILE          wait (at most 120 s) until every slug's blob is readable in S3
  links.py flood BASE_URL N SECONDS SOURCE_IP
                                 N creates spread over SECONDS with one new owner key, sent from
                                 SOURCE_IP (not the exempt load generator); prints the statuses
"""
import concurrent.futures
import http.client
import json
import os
import sys
import time
import urllib.parse


def conn_for(base):
    u = urllib.parse.urlsplit(base)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=10)


def create(n, out):
    base, key = os.environ["ZLINK_PRIMARY_1"], os.environ["ZLINK_ADMIN_KEY"]
    run = int(time.time())

    def one(i):
        c = conn_for(base)
        body = json.dumps({"url": f"https://example.com/bench/{run}/{i}?q={i}"})
        c.request("POST", "/api/v1/links", body,
                  {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 201:
            raise SystemExit(f"create failed: {r.status} {data[:200]!r}")
        return json.loads(data)["slug"]

    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        slugs = list(pool.map(one, range(n)))
    took = time.time() - started
    with open(out, "w") as f:
        f.write("\n".join(slugs) + "\n")
    print(f"RESULT created={n} seconds={took:.2f} creates_per_s={n / took:.0f}")


def owner_key(owner):
    """A new owner key, issued through the keys API with the admin key."""
    c = conn_for(os.environ["ZLINK_PRIMARY_1"])
    c.request("POST", "/api/v1/keys", json.dumps({"owner": owner}),
              {"Authorization": f"Bearer {os.environ['ZLINK_ADMIN_KEY']}",
               "Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 201:
        raise SystemExit(f"issuing a key failed: {r.status} {data[:200]!r}")
    return json.loads(data)["key"]


def flood(base, n, secs, source_ip):
    key = owner_key(f"flood-{int(time.time())}")
    u = urllib.parse.urlsplit(base)
    connect = lambda: http.client.HTTPConnection(u.hostname, u.port, timeout=10,
                                                 source_address=(source_ip, 0))
    c = connect()
    statuses, retry_after = {}, set()
    started = time.time()
    for i in range(n):
        # Paced: request i leaves at i * secs / n (bounded in count and time).
        delay = started + i * secs / n - time.time()
        if delay > 0:
            time.sleep(delay)
        body = json.dumps({"url": f"https://example.com/flood/{i}"})
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        for attempt in (1, 2):
            try:
                c.request("POST", "/api/v1/links", body, headers)
                r = c.getresponse()
                r.read()
                break
            except (ConnectionError, http.client.HTTPException):
                # A server may close a connection after refusing a request whose body it did
                # not read (a 429 answered before the body): reconnect and send it again.
                c.close()
                c = connect()
                if attempt == 2:
                    raise
        statuses[r.status] = statuses.get(r.status, 0) + 1
        if r.status == 429:
            retry_after.add(r.getheader("Retry-After"))
        if r.will_close:
            c.close()
            c = connect()
    took = time.time() - started
    print(f"RESULT flood_requests={n} seconds={took:.1f} "
          + " ".join(f"status_{k}={v}" for k, v in sorted(statuses.items()))
          + f" retry_after={','.join(sorted(x for x in retry_after if x))}")


def cold(base, path):
    slugs = [s for s in open(path).read().split() if s]
    c = conn_for(base)
    lat = []
    for s in slugs:
        t = time.perf_counter()
        c.request("GET", "/" + s)
        r = c.getresponse()
        r.read()
        lat.append((time.perf_counter() - t) * 1000)
        if r.status != 302:
            raise SystemExit(f"cold GET /{s} answered {r.status}")
    lat.sort()
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
    print(f"RESULT cold_requests={len(lat)} p50_ms={pick(0.50):.3f} p99_ms={pick(0.99):.3f} max_ms={lat[-1]:.3f}")


def wait_s3(path):
    base, bucket = os.environ["ZLINK_S3_ENDPOINT"], os.environ["ZLINK_S3_BUCKET"]
    prefix = os.environ.get("ZLINK_S3_PREFIX", "")
    slugs = [s for s in open(path).read().split() if s]
    c = conn_for(base)
    deadline = time.time() + 120
    for s in slugs:
        while True:
            c.request("HEAD", f"/{bucket}/{prefix}{s}")
            r = c.getresponse()
            r.read()
            if r.status == 200:
                break
            if time.time() > deadline:
                raise SystemExit(f"blob of {s} not in S3 after 120 s (replicator running?)")
            time.sleep(0.05)
    print(f"RESULT replicated={len(slugs)}")


if __name__ == "__main__":
    if sys.argv[1] == "create":
        create(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "cold":
        cold(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "wait-s3":
        wait_s3(sys.argv[2])
    elif sys.argv[1] == "flood":
        flood(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    else:
        raise SystemExit(__doc__)
