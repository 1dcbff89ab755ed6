#!/usr/bin/env python3
"""Alertmanager webhook receiver for the local topology: appends every notification to a JSON
Lines file (one line per alert: received_at, status, alertname, labels, startsAt, endsAt), so
tests, the drill and an operator can read which alerts fired and resolved, and when.

    alert-receiver.py PORT FILE
Binds 127.0.0.1 only; accepts POST / with Alertmanager's webhook JSON (at most 1 MiB).
"""
import datetime
import http.server
import json
import sys

MAX_BODY = 1 << 20


class Handler(http.server.BaseHTTPRequestHandler):
    out = None

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY:
            self.send_error(413 if length > MAX_BODY else 411)
            return
        try:
            payload = json.loads(self.rfile.read(length))
            alerts = payload["alerts"]
        except (ValueError, KeyError, TypeError):
            self.send_error(400)
            return
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
        with open(self.out, "a", encoding="utf-8") as f:
            for a in alerts:
                labels = a.get("labels", {})
                f.write(json.dumps({
                    "received_at": now,
                    "status": a.get("status"),
                    "alertname": labels.get("alertname"),
                    "labels": labels,
                    "startsAt": a.get("startsAt"),
                    "endsAt": a.get("endsAt"),
                }) + "\n")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        # Readiness probe.
        body = b'{"status":"ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        sys.stderr.write("alert-receiver: " + (fmt % args) + "\n")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    Handler.out = sys.argv[2]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
