# A stand-in for S3 on the lent 16-core machine (no SeaweedFS there): answers lastresort's
# requests from objects recorded off the local topology's S3 (NAME.hdr, NAME.body):
# HEAD /bucket (its readiness ping), GET|HEAD /bucket/KEY, and an empty ListObjectsV2 (the
# change journal: nothing changed). Signatures are not checked.
import http.server, os, sys, urllib.parse
addr, root = sys.argv[1], sys.argv[2]
SKIP = {"date", "server", "connection", "content-length", "transfer-encoding", "keep-alive"}
EMPTY = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
         b'<Name>links</Name><Prefix></Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>')
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def send(self, code, headers, body, head):
        self.send_response(code)
        for k, v in headers: self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head: self.wfile.write(body)
    def answer(self, head):
        u = urllib.parse.urlsplit(self.path)
        parts = u.path.lstrip("/").split("/", 1)
        if len(parts) == 1 or parts[1] == "":
            if "list-type=2" in u.query:
                return self.send(200, [("Content-Type", "application/xml")], EMPTY, head)
            return self.send(200, [], b"", head)
        key = urllib.parse.unquote(parts[1]).replace("/", "%2F")
        p = os.path.join(root, key)
        if not os.path.exists(p + ".body"):
            return self.send(404, [("Content-Type", "application/xml")],
                             b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code></Error>', head)
        hdrs = []
        for line in open(p + ".hdr", encoding="latin-1").read().splitlines()[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                if k.strip().lower() not in SKIP: hdrs.append((k.strip(), v.strip()))
        self.send(200, hdrs, open(p + ".body", "rb").read(), head)
    def do_GET(self): self.answer(False)
    def do_HEAD(self): self.answer(True)
http.server.ThreadingHTTPServer.daemon_threads = True
h, p = addr.rsplit(":", 1)
http.server.ThreadingHTTPServer((h, int(p)), H).serve_forever()
