#!/usr/bin/env python3
"""A stand-in for the Hugging Face hub, for tests: serves one folder as the repository
ORG/NAME the way the hub does it.

  GET /api/models/ORG/NAME/revision/REV[?blobs=true]   model info: sha, siblings (with
                                                       size and lfs.sha256 when blobs=true)
  GET /ORG/NAME/resolve/REV/PATH                       plain files directly (ETag = git blob
                                                       id); LFS files (*.safetensors, or
                                                       larger than 64 kB) as a 302 to the "CDN"
  GET /blobs/SHA256 on a second port (the CDN)         range requests (206, Content-Range,
                                                       If-Range), ETag

Faults are switched on at run time with POST /_ctl (JSON) on the hub port:
  {"token": "T"}          every request needs "Authorization: Bearer T" (401 otherwise)
  {"cut": {"PATH": N}}    the next CDN response for PATH stops after N bytes (connection closed)
  {"corrupt": ["PATH"]}   one byte of PATH is flipped in every CDN response
  {"fail": {"PATH": K}}   the next K requests for PATH answer 503
  {"reset": true}         all faults off, request log cleared
GET /_ctl/log returns the request log: [{"port", "path", "range", "auth"}].
Usage: fake_hub.py ROOT ORG/NAME PORTFILE   (writes "HUBPORT CDNPORT" to PORTFILE)
"""
import hashlib, json, os, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit, unquote

root, repo, portfile = sys.argv[1], sys.argv[2], sys.argv[3]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
files = {}
for dp, _, fns in os.walk(root):
    for fn in fns:
        full = os.path.join(dp, fn)
        rel = os.path.relpath(full, root)
        data = open(full, "rb").read()
        lfs = rel.endswith(".safetensors") or len(data) > 65536
        files[rel] = dict(data=data, lfs=lfs, sha256=hashlib.sha256(data).hexdigest(),
                          blob=hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
by_sha = {f["sha256"]: p for p, f in files.items()}
state = dict(token=None, cut={}, corrupt=set(), fail={}, log=[])
lock = threading.Lock()


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def authorized(self):
        if state["token"] is None:
            return True
        return self.headers.get("Authorization") == "Bearer " + state["token"]

    def fault(self, path):
        with lock:
            k = state["fail"].get(path, 0)
            if k > 0:
                state["fail"][path] = k - 1
                return True
        return False

    def do_POST(self):
        if self.path != "/_ctl":
            return self.send(404)
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with lock:
            if req.get("reset"):
                state.update(token=None, cut={}, corrupt=set(), fail={}, log=[])
            if "token" in req:
                state["token"] = req["token"]
            state["cut"].update(req.get("cut", {}))
            state["corrupt"].update(req.get("corrupt", []))
            state["fail"].update(req.get("fail", {}))
        self.send(200, b"{}")

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        u = urlsplit(self.path)
        path = unquote(u.path)
        port = self.server.server_address[1]
        with lock:
            state["log"].append(dict(port=port, path=path, range=self.headers.get("Range"),
                                     auth=self.headers.get("Authorization") is not None))
        if path == "/_ctl/log":
            return self.send(200, json.dumps(state["log"]).encode())
        if self.server.cdn:
            return self.cdn(path)
        api = "/api/models/%s/revision/" % repo
        res = "/%s/resolve/" % repo
        if path.startswith(api):
            if not self.authorized():
                return self.send(401, b'{"error":"Invalid credentials"}',
                                 [("X-Error-Code", "GatedRepo"), ("X-Error-Message", "Access to model %s is restricted." % repo)])
            if path[len(api):] not in ("main", COMMIT):
                return self.send(404, b'{"error":"Invalid rev id"}', [("X-Error-Code", "RevisionNotFound"),
                                                                      ("X-Error-Message", "Invalid rev id: " + path[len(api):])])
            blobs = "blobs=true" in (u.query or "")
            sib = []
            for p in sorted(files):
                f = files[p]
                e = {"rfilename": p}
                if blobs:
                    e["blobId"] = f["blob"] if not f["lfs"] else hashlib.sha1(p.encode()).hexdigest()
                    e["size"] = len(f["data"])
                    if f["lfs"]:
                        e["lfs"] = {"sha256": f["sha256"], "size": len(f["data"]), "pointerSize": 134}
                sib.append(e)
            body = json.dumps({"_id": "x", "id": repo, "sha": COMMIT, "private": False, "siblings": sib}).encode()
            return self.send(200, body, [("Content-Type", "application/json")])
        if path.startswith(res):
            rest = path[len(res):]
            rev, _, fp = rest.partition("/")
            if not self.authorized():
                return self.send(401, b"Unauthorized", [("X-Error-Code", "GatedRepo"),
                                                         ("X-Error-Message", "Access to model %s is restricted." % repo)])
            if rev not in ("main", COMMIT) or fp not in files:
                return self.send(404, b"Entry not found", [("X-Error-Code", "EntryNotFound"),
                                                            ("X-Error-Message", "Entry not found")])
            if self.fault(fp):
                return self.send(503, b"busy")
            f = files[fp]
            if f["lfs"]:
                loc = "http://127.0.0.1:%d/blobs/%s?sig=abc" % (cdn_port, f["sha256"])
                return self.send(302, b"Found. Redirecting to " + loc.encode(), [("Location", loc), ("X-Linked-Etag", '"%s"' % f["sha256"]),
                                            ("X-Linked-Size", str(len(f["data"]))), ("X-Repo-Commit", COMMIT)])
            return self.send(200, f["data"], [("ETag", '"%s"' % f["blob"]), ("X-Repo-Commit", COMMIT)])
        return self.send(404, b"not found")

    def cdn(self, path):
        if self.headers.get("Authorization") is not None:
            return self.send(400, b"the Authorization header must not reach the CDN")
        sha = path.rsplit("/", 1)[-1]
        if not path.startswith("/blobs/") or sha not in by_sha:
            return self.send(404, b"NoSuchKey")
        fp = by_sha[sha]
        data = files[fp]["data"]
        if fp in state["corrupt"]:
            i = len(data) // 2
            data = data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1:]
        etag = '"%s"' % sha
        start = 0
        rng = self.headers.get("Range")
        ifr = self.headers.get("If-Range")
        if rng and rng.startswith("bytes=") and (ifr is None or ifr == etag):
            start = int(rng[6:].split("-")[0])
            if start >= len(data):
                return self.send(416, b"", [("Content-Range", "bytes */%d" % len(data))])
        body = data[start:]
        with lock:
            cut = state["cut"].pop(fp, None)
        self.send_response(206 if start else 200)
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        if start:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if cut is not None:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


def serve(cdn):
    s = ThreadingHTTPServer(("127.0.0.1", 0), H)
    s.cdn = cdn
    s.daemon_threads = True
    return s


hub, cdn = serve(False), serve(True)
cdn_port = cdn.server_address[1]
threading.Thread(target=cdn.serve_forever, daemon=True).start()
with open(portfile + ".tmp", "w") as f:
    f.write("%d %d\n" % (hub.server_address[1], cdn_port))
os.rename(portfile + ".tmp", portfile)
hub.serve_forever()
