"""A fake Hugging Face Hub on loopback, answering the routes `larder pull` and huggingface_hub use:

  GET  /api/models/{repo}/revision/{rev}[?blobs=true]   {"sha", "siblings": [{rfilename, size, blobId, lfs}]}
  HEAD/GET /{repo}/resolve/{rev}/{path}                 small files: 200 + ETag (git blob sha1);
                                                        LFS files: 302 to /cdn/{sha256} with
                                                        X-Linked-Etag / X-Linked-Size / X-Repo-Commit
  GET  /cdn/{sha256}                                    the bytes, with Range: bytes=N- (206)

Errors as the Hub sends them: 401 without a token for gated repos, 403 for a wrong token, 404 with
X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound. Faults for tests, per file:
  "cut_once"     the first GET of the blob sends half the bytes and closes the connection
  "corrupt_once" the first GET sends a flipped byte (right size, wrong hash)
  "corrupt"      every GET sends a flipped byte
Every request is logged in .log as (method, path, headers-dict).
"""
import hashlib
import http.server
import json
import threading
import urllib.parse

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, files, commit=None, gated_token=None, revisions=None):
        self.files = dict(files)  # path -> bytes
        self.commit = commit or hashlib.sha1(repr(sorted(files)).encode()).hexdigest()
        self.gated_token = gated_token  # None: public; else the only token that may read it
        self.revisions = revisions or {"main": self.commit}
        self.faults = {}  # path -> fault name
        self.served = {}  # path -> GET count

    def is_lfs(self, path):
        return path.endswith(LFS_SUFFIXES)


class FakeHub:
    def __init__(self):
        self.repos = {}
        self.log = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        # The "CDN" is this server under another host name: another origin, so clients treat the
        # resolve redirect as leaving the Hub (metadata read from the redirect, no auth forwarded).
        self.cdn_url = "http://localhost:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def add(self, repo_id, repo):
        self.repos[repo_id] = repo
        return repo

    # ---- helpers ---------------------------------------------------------------------------
    def _send(self, h, status, body=b"", headers=None, head=False):
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head and body:
            h.wfile.write(body)

    def _error(self, h, status, code, msg, head):
        self._send(h, status, json.dumps({"error": msg}).encode(),
                   {"X-Error-Code": code, "X-Error-Message": msg, "Content-Type": "application/json"}, head)

    def _auth_ok(self, h, repo, head):
        if repo.gated_token is None:
            return True
        auth = h.headers.get("Authorization", "")
        if not auth:
            self._error(h, 401, "GatedRepo", "Access to this model is restricted: you must be authenticated.", head)
            return False
        if auth != "Bearer " + repo.gated_token:
            self._error(h, 403, "GatedRepo", "Your token has not been granted access to this model.", head)
            return False
        return True

    def _handle(self, h, head):
        url = urllib.parse.urlsplit(h.path)
        path = urllib.parse.unquote(url.path)
        self.log.append((h.command, path, dict(h.headers.items())))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
            return self._api(h, "/".join(parts[2:4]), "/".join(parts[5:]), head)
        if parts[0] == "cdn" and len(parts) == 2:
            return self._cdn(h, parts[1], head)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(h, "/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
        self._error(h, 404, "NotFound", "no route", head)

    def _repo(self, h, repo_id, head):
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "RepoNotFound", "Repository Not Found for url: %s." % h.path, head)
        return repo

    def _commit(self, h, repo, rev, head):
        commit = repo.revisions.get(rev, rev if rev == repo.commit else None)
        if commit is None:
            self._error(h, 404, "RevisionNotFound", "Invalid rev id: %s" % rev, head)
        return commit

    def _api(self, h, repo_id, rev, head):
        repo = self._repo(h, repo_id, head)
        if repo is None or not self._auth_ok(h, repo, head):
            return
        commit = self._commit(h, repo, rev, head)
        if commit is None:
            return
        siblings = []
        for name, data in sorted(repo.files.items()):
            s = {"rfilename": name, "blobId": git_blob_sha1(data), "size": len(data)}
            if repo.is_lfs(name):
                s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            siblings.append(s)
        body = json.dumps({"id": repo_id, "modelId": repo_id, "sha": commit, "siblings": siblings}).encode()
        self._send(h, 200, body, {"Content-Type": "application/json"}, head)

    def _resolve(self, h, repo_id, rev, fname, head):
        repo = self._repo(h, repo_id, head)
        if repo is None or not self._auth_ok(h, repo, head):
            return
        commit = self._commit(h, repo, rev, head)
        if commit is None:
            return
        data = repo.files.get(fname)
        if data is None:
            self._error(h, 404, "EntryNotFound", "%s does not exist on %s" % (fname, rev), head)
            return
        common = {"X-Repo-Commit": commit}
        if repo.is_lfs(fname):
            sha = hashlib.sha256(data).hexdigest()
            hdrs = dict(common)
            hdrs.update({"Location": "%s/cdn/%s?repo=%s&file=%s" % (self.cdn_url, sha, urllib.parse.quote(repo_id, safe=""),
                                                                      urllib.parse.quote(fname, safe="")),
                         "X-Linked-Etag": '"%s"' % sha, "X-Linked-Size": str(len(data)),
                         "ETag": '"%s"' % git_blob_sha1(b"pointer " + sha.encode())})
            self._send(h, 302, b"", hdrs, head)
            return
        hdrs = dict(common)
        hdrs.update({"ETag": '"%s"' % git_blob_sha1(data), "Content-Type": "application/octet-stream"})
        self._send(h, 200, data, hdrs, head)

    def _cdn(self, h, sha, head):
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(h.path).query)
        repo = self.repos.get(q.get("repo", [""])[0])
        fname = q.get("file", [""])[0]
        if repo is None or fname not in repo.files:
            self._error(h, 404, "NotFound", "no such blob", head)
            return
        data = repo.files[fname]
        fault = repo.faults.get(fname)
        n = repo.served.get(fname, 0)
        if not head:
            repo.served[fname] = n + 1
        if fault == "corrupt" or (fault == "corrupt_once" and n == 0):
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
        if start >= len(data) and start > 0:
            self._send(h, 416, b"", {"Content-Range": "bytes */%d" % len(data)}, head)
            return
        body = data[start:]
        hdrs = {"Content-Type": "application/octet-stream", "Content-Length": str(len(body)), "Accept-Ranges": "bytes"}
        if start:
            hdrs["Content-Range"] = "bytes %d-%d/%d" % (start, len(data) - 1, len(data))
        h.send_response(206 if start else 200)
        for k, v in hdrs.items():
            h.send_header(k, v)
        h.end_headers()
        if head:
            return
        if fault == "cut_once" and n == 0:
            h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            h.close_connection = True
            import socket
            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        h.wfile.write(body)
