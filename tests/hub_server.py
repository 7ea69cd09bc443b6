"""A Hugging Face Hub stand-in on 127.0.0.1 for the tests: the HTTP API as huggingface_hub 2.x calls it.

Routes, read from the installed huggingface_hub (hf_api.py model_info / _iter_repo_tree_pages,
file_download.py get_hf_file_metadata / hf_hub_download, utils/_http.py hf_raise_for_status):

- GET /api/models/{org}/{name}[/revision/{rev}] (?blobs=True): the repository's `sha` and `siblings`
  (rfilename, size, blobId and, for an LFS file, lfs {sha256, size, pointerSize});
- GET /api/models/{org}/{name}/tree/{rev}?recursive=True: [{type, path, size, oid, lfs {oid, size, pointerSize}}];
- HEAD/GET /{org}/{name}/resolve/{rev}/{path}: a regular file answers itself (ETag its git blob id,
  X-Repo-Commit); an LFS file answers 302 to the CDN (another origin: a second server) with
  X-Linked-Etag (its sha256) and X-Linked-Size, as the Hub does; GET /cdn/{sha256} serves the bytes;
- refusals as the Hub sends them: 401 and 404 with X-Error-Code RepoNotFound, 403 GatedRepo,
  404 RevisionNotFound, 429 (rate limit).

`served` counts the body bytes of every file download (resolve and CDN); `requests` logs each request.
A file given as an int is a sparse file of that size: listed with its size, never servable.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_FROM = 100_000  # bytes: larger files, and the weights kinds, are LFS files (as .gitattributes makes them)
LFS_SUFFIXES = (".bin", ".data", ".onnx", ".safetensors")


class Repo:
    def __init__(self, files: dict, commit: str | None = None, refusal: int | None = None):
        self.files = files  # rel -> bytes, or int (a size with no bytes)
        self.commit = commit or hashlib.sha1(json.dumps(sorted(files)).encode()).hexdigest()
        self.refusal = refusal  # 401, 403, 429: every request for the repository is refused so

    @classmethod
    def from_folder(cls, folder: Path, big: dict | None = None, **kw) -> "Repo":
        """A repository of a folder's files; `big` adds files by size only (rel -> size)."""
        files: dict = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        files.update(big or {})
        return cls(files, **kw)

    def meta(self, rel: str) -> dict:
        body = self.files[rel]
        size = body if isinstance(body, int) else len(body)
        data = b"" if isinstance(body, int) else body
        blob = hashlib.sha1(b"blob %d\0" % size + data).hexdigest()
        out = {"size": size, "blob": blob, "lfs": None}
        if isinstance(body, int) or size >= LFS_FROM or rel.endswith(LFS_SUFFIXES):
            out["lfs"] = hashlib.sha256(data).hexdigest() if data or not isinstance(body, int) else hashlib.sha256(rel.encode()).hexdigest()
        return out


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.served = 0
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self.api = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self.api, self.cdn)]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.api.server_address[1]}"

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        for s in (self.api, self.cdn):
            s.shutdown()
            s.server_close()

    def count(self, n: int) -> None:
        with self._lock:
            self.served += n

    def blob(self, sha: str) -> bytes | None:
        for repo in self.repos.values():
            for rel, body in repo.files.items():
                if isinstance(body, bytes) and repo.meta(rel)["lfs"] == sha:
                    return body
        return None


class Handler(BaseHTTPRequestHandler):
    hub: FakeHub  # set by _handler

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, doc, head=False):
        self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, head)

    def _error(self, status: int, code: str | None, head: bool, message: str = ""):
        headers = {"X-Error-Code": code} if code else {}
        if message:
            headers["X-Error-Message"] = message
        self._send(status, json.dumps({"error": message or code or "error"}).encode(), headers, head)

    def _route(self, head: bool):
        url = urlparse(self.path)
        path = unquote(url.path)
        self.hub.requests.append(f"{self.command} {path}")
        if path.startswith("/cdn/"):
            return self._cdn(path[len("/cdn/"):], head)
        api = re.match(r"^/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(?:/(.*))?)?$", path)
        resolve = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        repo_id = (api or resolve).group(1) if (api or resolve) else None
        if repo_id is None:
            return self._error(404, None, head)
        return self._repo(repo_id, api, resolve, head)

    def _repo(self, repo_id, api, resolve, head: bool):
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", head)
        if repo.refusal == 401:
            return self._error(401, "RepoNotFound", head)
        if repo.refusal == 403:
            return self._error(403, "GatedRepo", head, "Access to this model is restricted")
        if repo.refusal == 429:
            return self._error(429, None, head, "rate limited")
        rev = (api.group(3) if api else resolve.group(2)) or "main"
        if rev not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", head)
        if api and api.group(2) == "tree":
            return self._json([{"type": "file", "path": rel, "size": m["size"], "oid": m["blob"],
                                **({"lfs": {"oid": m["lfs"], "size": m["size"], "pointerSize": 134}} if m["lfs"] else {})}
                               for rel in sorted(repo.files) for m in [repo.meta(rel)]], head)
        if api:
            return self._json({"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False, "gated": False,
                               "siblings": [{"rfilename": rel, "size": m["size"], "blobId": m["blob"],
                                             **({"lfs": {"sha256": m["lfs"], "size": m["size"], "pointerSize": 134}} if m["lfs"] else {})}
                                            for rel in sorted(repo.files) for m in [repo.meta(rel)]]}, head)
        return self._resolve(repo, resolve.group(3), head)

    def _resolve(self, repo: Repo, rel: str, head: bool):
        if rel not in repo.files:
            return self._error(404, "EntryNotFound", head)
        m = repo.meta(rel)
        body = repo.files[rel]
        common = {"X-Repo-Commit": repo.commit}
        if m["lfs"]:
            location = f"http://127.0.0.1:{self.hub.cdn.server_address[1]}/cdn/{m['lfs']}"
            return self._send(302, b"", {**common, "Location": location, "X-Linked-Etag": f'"{m["lfs"]}"', "X-Linked-Size": str(m["size"]),
                                         "ETag": f'"{m["blob"]}"'}, head)
        if not head:
            self.hub.count(len(body))
        return self._send(200, body, {**common, "ETag": f'"{m["blob"]}"'}, head)

    def _cdn(self, sha: str, head: bool):
        body = self.hub.blob(sha)
        if body is None:
            return self._error(404, "EntryNotFound", head)
        if not head:
            self.hub.count(len(body))
        return self._send(200, body, {"ETag": f'"{sha}"'}, head)


def _handler(hub: FakeHub) -> type:
    return type("BoundHandler", (Handler,), {"hub": hub})


# ------------------------------------------------------------------------------ helpers of the tests that use the stand-in

SIZE_ONLY_FROM = 1 << 20  # served files larger than this are listed by size only (never downloadable)


def env_for(tmp: Path, hub_: FakeHub | None = None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_OFFLINE="0", NO_COLOR="1", **extra)  # the tests set offline
    if hub_ is not None:
        env["HF_ENDPOINT"] = hub_.endpoint
    return env


def served_repo(folder: Path, big: dict | None = None, **kw) -> Repo:
    """A repository of `folder`: files up to SIZE_ONLY_FROM with their bytes, larger ones (sparse weights) by size."""
    files: dict = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            rel = p.relative_to(folder).as_posix()
            files[rel] = p.stat().st_size if p.stat().st_size > SIZE_ONLY_FROM else p.read_bytes()
    files.update(big or {})
    return Repo(files, **kw)


def snapshot_download(env: dict, repo_id: str) -> Path:
    code = "import sys, huggingface_hub; print(huggingface_hub.snapshot_download(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, repo_id], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(done.stdout.strip().splitlines()[-1])
