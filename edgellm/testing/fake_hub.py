"""A local stand-in for the Hugging Face Hub, for tests: the routes huggingface_hub calls, on loopback.

`FakeHub` serves model repositories held in memory from a thread (`with FakeHub() as hub:`), at
`hub.endpoint`, which tests hand to huggingface_hub through HF_ENDPOINT. It answers what huggingface_hub
(2.4) asks of the real hub for a plain Git-LFS repository (never a Xet one: no X-Xet-Hash header, so the
client downloads over HTTP):

- `GET /api/models/ORG/REPO[/revision/REV]` (HfApi.model_info; with `?blobs=true` the siblings carry
  size, blobId and LFS sha256),
- `GET /api/models/ORG/REPO/tree/REV` (HfApi.list_repo_tree),
- `HEAD` and `GET /ORG/REPO/resolve/REV/PATH` (hf_hub_download): ETag (the LFS sha256, quoted),
  X-Repo-Commit, Content-Length, Accept-Ranges; a `Range: bytes=N-` GET gets a 206 with Content-Range;
- errors as the hub marks them (404 with X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound,
  401 without the token when `token` is set), which huggingface_hub turns into its typed errors.

Faults for the error paths: `cut_transfers = K` ends the first K file downloads after `cut_at` (a fraction)
of their bytes (the connection is closed before Content-Length bytes: huggingface_hub resumes with a Range
request when it has written a chunk, 10 MiB, of it), a repo's `corrupt` files are served with other bytes
than the listing's sha256 names.
`requests` logs every request (method, path, headers) to check what the client did or did not ask.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

DEFAULT_COMMIT = "0123456789abcdef0123456789abcdef01234567"  # a 40-hex commit id, as the hub's


@dataclass
class LoggedRequest:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case


@dataclass
class FakeRepo:
    files: dict[str, bytes]  # path in the repo -> content
    commit: str = DEFAULT_COMMIT
    corrupt: set[str] = field(default_factory=set)  # served altered: the sha256 no longer matches


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FakeHub:
    def __init__(self, token: str | None = None) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.token = token  # when set, every request must carry "Authorization: Bearer TOKEN"
        self.cut_transfers = 0
        self.cut_at = 0.5
        self.requests: list[LoggedRequest] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def add_repo(
        self, repo_id: str, files: dict[str, bytes | Path], commit: str = DEFAULT_COMMIT
    ) -> FakeRepo:
        data = {name: f.read_bytes() if isinstance(f, Path) else f for name, f in files.items()}
        self.repos[repo_id] = FakeRepo(data, commit)
        return self.repos[repo_id]

    def downloads(self, name: str | None = None) -> list[LoggedRequest]:
        """The file GETs (transfers) logged so far, of `name` (a file's path in its repo) or of any."""
        return [
            r
            for r in self.requests
            if r.method == "GET" and "/resolve/" in r.path and (name is None or r.path.endswith("/" + name))
        ]

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start the hub first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fake-hub", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _take_cut(self) -> bool:
        with self._lock:
            if self.cut_transfers > 0:
                self.cut_transfers -= 1
                return True
            return False


def _sibling(name: str, data: bytes, sha: str) -> dict:
    return {
        "rfilename": name,
        "size": len(data),
        "blobId": hashlib.sha1(data).hexdigest(),
        "lfs": {"sha256": sha, "size": len(data), "pointerSize": 134},
    }


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet: the log is hub.requests
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _error(self, status: int, code: str, commit: str | None = None) -> None:
            payload = json.dumps({"error": code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _json(self, obj: object, commit: str) -> None:
            payload = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            headers = {k.lower(): v for k, v in self.headers.items()}
            hub.requests.append(LoggedRequest(self.command, path, headers))
            if hub.token is not None and self.headers.get("Authorization") != f"Bearer {hub.token}":
                return self._error(401, "RepoNotFound")  # as the hub answers for a private repo
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                return self._api(parts[2] + "/" + parts[3], parts[4:])
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]), body)
            self._error(404, "RepoNotFound")

        def _repo(self, repo_id: str, revision: str) -> FakeRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound")
            elif revision not in ("main", repo.commit):
                self._error(404, "RevisionNotFound")
                return None
            return repo

        def _api(self, repo_id: str, rest: list[str]) -> None:
            revision = rest[1] if len(rest) >= 2 and rest[0] in ("revision", "tree") else "main"
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            shas = {name: sha256_of(data) for name, data in repo.files.items()}
            if rest[:1] == ["tree"]:
                tree = [
                    {"type": "file", "path": n, "size": len(d), "oid": hashlib.sha1(d).hexdigest(),
                     "lfs": {"oid": shas[n], "size": len(d), "pointerSize": 134}}
                    for n, d in sorted(repo.files.items())
                ]  # fmt: skip
                return self._json(tree, repo.commit)
            siblings = [_sibling(n, d, shas[n]) for n, d in sorted(repo.files.items())]
            info = {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "siblings": siblings}
            self._json(info, repo.commit)

        def _resolve(self, repo_id: str, revision: str, name: str, body: bool) -> None:
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            if name not in repo.files:
                return self._error(404, "EntryNotFound", repo.commit)
            data = repo.files[name]
            sha = sha256_of(data)
            if name in repo.corrupt:  # same length, other bytes: only a checksum notices
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes=") and ranged.endswith("-"):
                start = int(ranged[len("bytes=") : -1])
            self.send_response(206 if start else 200)
            self.send_header("ETag", f'"{sha}"')
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            if hub._take_cut():  # part of the promised bytes, then the connection goes
                self.wfile.write(data[start : start + int((len(data) - start) * hub.cut_at)])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(data[start:])

    return Handler
