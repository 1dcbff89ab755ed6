#!/usr/bin/env python3
"""Redirects of cold links during a 1,000-link bulk create, against the running local topology
(deploy/local/up; then `set -a; . .zlink/local/endpoints.env; set +a`): makes 600 links, waits
for their replication, times 300 sequential GETs through the frontend while idle and 300 more
while a bulk of 1,000 runs, and prints p50/p99/max, the tier that answered and any non-302.
Bounded: 2,600 requests, loopback only."""
import http.client, json, os, threading, time, urllib.request, uuid

fe, key = os.environ["ZLINK_FRONTEND"], os.environ["ZLINK_ADMIN_KEY"]
host = fe.split("//")[1]
if not host.startswith("127."):
    raise SystemExit(f"{fe}: load tests target 127.0.0.0/8 only")
def api(path, body=None, hdr=None):
    h = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}; h.update(hdr or {})
    req = urllib.request.Request(fe + path, method="POST" if body else "GET", headers=h, data=json.dumps(body).encode() if body else None)
    with urllib.request.urlopen(req, timeout=60) as r: return json.load(r)
# fresh links, never redirected yet (cold on every cache)
tag = uuid.uuid4().hex[:8]
out = api("/api/v1/links/bulk", {"links": [{"url": f"https://example.com/r/{tag}/{i}"} for i in range(600)]})
slugs = [r["link"]["slug"] for r in out["results"] if r["status"] == 201]
time.sleep(15)
def probe(slugs):
    c = http.client.HTTPConnection(host, timeout=10); lat, tiers, bad = [], {}, 0
    for s in slugs:
        t = time.monotonic(); c.request("GET", "/" + s); r = c.getresponse(); r.read()
        lat.append((time.monotonic() - t) * 1000)
        tiers[r.getheader("x-zlink-tier")] = tiers.get(r.getheader("x-zlink-tier"), 0) + 1
        bad += r.status != 302
    lat.sort()
    return f"n={len(lat)} p50={lat[len(lat)//2]:.1f}ms p99={lat[int(len(lat)*.99)]:.1f}ms max={lat[-1]:.1f}ms tiers={tiers} non302={bad}"
print("idle:       ", probe(slugs[:300]))
def bulk():
    t = time.monotonic()
    api("/api/v1/links/bulk", {"links": [{"url": f"https://example.com/b/{tag}/{i}"} for i in range(1000)]}, {"Idempotency-Key": "rb-" + tag})
    print(f"bulk took {(time.monotonic()-t)*1000:.0f} ms")
th = threading.Thread(target=bulk); th.start(); time.sleep(0.1)
print("during bulk:", probe(slugs[300:600])); th.join()
