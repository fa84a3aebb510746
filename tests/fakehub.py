"""Loopback fake of the Hugging Face Hub HTTP API, for testing the real `huggingface_hub` client.

Point the client at it with `HF_ENDPOINT` (read by `huggingface_hub` when it is *imported*, so
set it before the first import), or pass `endpoint=` to `HfApi` / `hf_hub_download` /
`snapshot_download`.

Only model repos are served. Endpoints implemented (what `huggingface_hub` 2.4.0 calls for
`model_info`, `list_repo_files`/`list_repo_tree`, `hf_hub_download` and `snapshot_download`):

- `GET /api/models/{repo_id}` and `GET /api/models/{repo_id}/revision/{revision}`: repo info
  (`id`, `sha`, `siblings` with `rfilename`; `size`/`blobId`/`lfs` too when `?blobs=true`).
- `GET /api/models/{repo_id}/tree/{revision}[/{path}]`: tree listing (`?recursive=true`), one page.
- `HEAD|GET /{repo_id}/resolve/{revision}/{filename}`: file metadata (`X-Repo-Commit`, `ETag`,
  `Content-Length`, plus `X-Linked-Etag`/`X-Linked-Size` for LFS-like files) and content (with
  `Range` support). Served directly with 200, never redirected, and without any Xet header, so the
  client always takes the plain HTTP download path even when `hf_xet` is installed.
- `GET /api/agent-harnesses`: empty registry (the client fetches it once per process to build its
  user agent, unless `HF_HUB_DISABLE_TELEMETRY=1`).

A revision is addressed by its name (branch or tag, the keys of `FakeRepo.revisions`) or by its
full 40-hex commit sha (see `FakeHub.commit_sha`). Errors mirror the Hub: `X-Error-Code`
`RepoNotFound`, `RevisionNotFound` or `EntryNotFound` on a 404 with a JSON `{"error": ...}` body,
which the client turns into `RepositoryNotFoundError`, `RevisionNotFoundError` and
`RemoteEntryNotFoundError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["FakeHub", "FakeRepo", "serve_fake_hub"]

# Files stored with Git LFS on a real Hub repo: they get an `lfs` entry in listings and their
# ETag is the sha256 of the content (as on the Hub) instead of the git blob sha1.
_LFS_SUFFIXES = frozenset(
    {".bin", ".safetensors", ".onnx", ".data", ".gguf", ".pt", ".pth", ".h5", ".msgpack", ".ckpt"}
)
_LFS_MIN_SIZE = 10 * 1024 * 1024
_LFS_POINTER_SIZE = 134
_FAKE_DATE = "2024-01-01T00:00:00.000Z"
_COMMIT_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
_CHUNK = 1024 * 1024


@dataclass
class FakeRepo:
    """A model repo: revision name (branch such as "main", or tag) -> folder holding its files."""

    revisions: dict[str, Path]


@dataclass(frozen=True)
class _FileInfo:
    path: str  # posix path inside the repo
    local: Path
    size: int
    git_sha1: str
    sha256: str
    is_lfs: bool

    @property
    def etag(self) -> str:
        return self.sha256 if self.is_lfs else self.git_sha1


class _NotFoundError(Exception):
    def __init__(self, error_code: str | None, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message
        self.commit = commit


class FakeHub:
    """State of a running fake Hub: its endpoint, and a log of the requests it received."""

    def __init__(self, repos: dict[str, FakeRepo]) -> None:
        for repo_id, repo in repos.items():
            for revision, folder in repo.revisions.items():
                if not Path(folder).is_dir():
                    raise ValueError(f"{repo_id}@{revision}: {folder} is not a directory")
        self.endpoint: str = ""
        # (method, path without query string as sent on the wire, Authorization header or None)
        self.requests: list[tuple[str, str, str | None]] = []
        self._repos = dict(repos)
        self._lock = threading.Lock()
        self._hash_cache: dict[tuple[Path, int, int], tuple[str, str]] = {}

    def commit_sha(self, repo_id: str, revision: str) -> str:
        """The deterministic 40-hex commit sha of `revision` (a name in `FakeRepo.revisions`)."""
        if repo_id not in self._repos:
            raise KeyError(f"unknown repo {repo_id!r}")
        if revision not in self._repos[repo_id].revisions:
            raise KeyError(f"unknown revision {revision!r} of {repo_id!r}")
        return hashlib.sha1(f"{repo_id}@{revision}".encode(), usedforsecurity=False).hexdigest()

    # -- lookups used by the request handler ---------------------------------------------------

    def _record(self, method: str, path: str, authorization: str | None) -> None:
        with self._lock:
            self.requests.append((method, path, authorization))

    def _resolve(self, repo_id: str, revision: str) -> tuple[str, Path]:
        """(commit sha, folder) of a revision given by name or by full commit sha."""
        repo = self._repos.get(repo_id)
        if repo is None:
            raise _NotFoundError("RepoNotFound", "Repository not found")
        if revision in repo.revisions:
            return self.commit_sha(repo_id, revision), Path(repo.revisions[revision])
        if _COMMIT_SHA_RE.match(revision):
            for name, folder in repo.revisions.items():
                if self.commit_sha(repo_id, name) == revision:
                    return revision, Path(folder)
        raise _NotFoundError("RevisionNotFound", f"Invalid rev id: {revision}")

    def _hashes(self, local: Path, size: int, mtime_ns: int) -> tuple[str, str]:
        key = (local, size, mtime_ns)
        with self._lock:
            cached = self._hash_cache.get(key)
        if cached is not None:
            return cached
        git = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
        sha256 = hashlib.sha256()
        with local.open("rb") as f:
            while chunk := f.read(_CHUNK):
                git.update(chunk)
                sha256.update(chunk)
        result = (git.hexdigest(), sha256.hexdigest())
        with self._lock:
            self._hash_cache[key] = result
        return result

    def _file_info(self, folder: Path, local: Path) -> _FileInfo:
        stat = local.stat()
        git_sha1, sha256 = self._hashes(local, stat.st_size, stat.st_mtime_ns)
        return _FileInfo(
            path=local.relative_to(folder).as_posix(),
            local=local,
            size=stat.st_size,
            git_sha1=git_sha1,
            sha256=sha256,
            is_lfs=local.suffix in _LFS_SUFFIXES or stat.st_size >= _LFS_MIN_SIZE,
        )

    def _files(self, folder: Path) -> list[_FileInfo]:
        return [
            self._file_info(folder, local)
            for local in sorted(folder.rglob("*"))
            if local.is_file() and ".git" not in local.relative_to(folder).parts
        ]

    def _file(self, folder: Path, filename: str, commit: str) -> _FileInfo:
        parts = filename.split("/")
        if not filename or any(p in ("", ".", "..", ".git") for p in parts):
            raise _NotFoundError("EntryNotFound", f"{filename} does not exist", commit)
        local = folder.joinpath(*parts)
        if not local.is_file():
            raise _NotFoundError("EntryNotFound", f"{filename} does not exist", commit)
        return self._file_info(folder, local)

    # -- JSON payloads ---------------------------------------------------------------------------

    def _model_info(self, repo_id: str, revision: str, blobs: bool) -> dict[str, Any]:
        commit, folder = self._resolve(repo_id, revision)
        siblings: list[dict[str, Any]] = []
        used_storage = 0
        for info in self._files(folder):
            used_storage += info.size
            sibling: dict[str, Any] = {"rfilename": info.path}
            if blobs:
                sibling["size"] = info.size
                sibling["blobId"] = info.git_sha1
                if info.is_lfs:
                    sibling["lfs"] = {
                        "size": info.size,
                        "sha256": info.sha256,
                        "pointerSize": _LFS_POINTER_SIZE,
                    }
            siblings.append(sibling)
        author = repo_id.split("/", maxsplit=1)[0] if "/" in repo_id else None
        return {
            "_id": hashlib.sha1(repo_id.encode(), usedforsecurity=False).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": author,
            "sha": commit,
            "lastModified": _FAKE_DATE,
            "createdAt": _FAKE_DATE,
            "private": False,
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": used_storage,
        }

    def _tree(
        self, repo_id: str, revision: str, path: str, recursive: bool
    ) -> list[dict[str, Any]]:
        commit, folder = self._resolve(repo_id, revision)
        prefix = path.strip("/")
        if prefix:
            target = folder.joinpath(*prefix.split("/"))
            if ".." in prefix.split("/") or not target.is_dir():
                raise _NotFoundError("EntryNotFound", f"{prefix} does not exist", commit)
        files = self._files(folder)
        if prefix:
            files = [f for f in files if f.path.startswith(prefix + "/")]
        depth = prefix.count("/") + 1 if prefix else 0
        entries: list[dict[str, Any]] = []
        seen_dirs: set[str] = set()
        for info in files:
            parts = info.path.split("/")
            # Folders between the listed path and the file (all of them when recursive).
            last_dir = len(parts) - 1 if recursive else min(depth + 1, len(parts) - 1)
            for i in range(depth + 1, last_dir + 1):
                directory = "/".join(parts[:i])
                if directory not in seen_dirs:
                    seen_dirs.add(directory)
                    tree_id = hashlib.sha1(
                        f"tree {commit} {directory}".encode(), usedforsecurity=False
                    ).hexdigest()
                    entries.append(
                        {"type": "directory", "oid": tree_id, "size": 0, "path": directory}
                    )
            if not recursive and len(parts) > depth + 1:
                continue
            entry: dict[str, Any] = {
                "type": "file",
                "oid": info.git_sha1,
                "size": info.size,
                "path": info.path,
            }
            if info.is_lfs:
                entry["lfs"] = {
                    "oid": info.sha256,
                    "size": info.size,
                    "pointerSize": _LFS_POINTER_SIZE,
                }
            entries.append(entry)
        return entries


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: FakeHub) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = hub


def _split_repo(segments: list[str], keywords: tuple[str, ...]) -> tuple[str, str, list[str]]:
    """Split `[*repo_id_parts, keyword, *rest]` at the first keyword after the repo id."""
    for i in range(1, min(len(segments), 3)):
        if segments[i] in keywords:
            return "/".join(segments[:i]), segments[i], segments[i + 1 :]
    return "/".join(segments), "", []


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so no keep-alive thread outlives the server.
    protocol_version = "HTTP/1.0"
    server_version = "FakeHub/1.0"

    @property
    def _hub(self) -> FakeHub:
        server = self.server
        assert isinstance(server, _Server)
        return server.hub

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle(head=False)

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def do_POST(self) -> None:
        self._unsupported()

    def do_PUT(self) -> None:
        self._unsupported()

    def do_DELETE(self) -> None:
        self._unsupported()

    def do_PATCH(self) -> None:
        self._unsupported()

    # -- dispatch ----------------------------------------------------------------------------------

    def _unsupported(self) -> None:
        path = urlsplit(self.path).path
        self._hub._record(self.command, path, self.headers.get("Authorization"))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self._send_json(
            HTTPStatus.METHOD_NOT_ALLOWED,
            {"error": f"{self.command} {path} is not implemented by fakehub"},
            head=False,
        )

    def _handle(self, *, head: bool) -> None:
        split = urlsplit(self.path)
        self._hub._record(self.command, split.path, self.headers.get("Authorization"))
        query = parse_qs(split.query)
        segments = [unquote(s) for s in split.path.split("/")[1:]]
        try:
            if segments[:2] == ["api", "agent-harnesses"] and len(segments) == 2:
                self._send_json(HTTPStatus.OK, {"standardEnvVars": [], "harnesses": {}}, head=head)
            elif segments[:2] == ["api", "models"] and len(segments) > 2:
                self._handle_api(segments[2:], query, head=head)
            elif len(segments) >= 2:
                self._handle_resolve(segments, head=head)
            else:
                raise _NotFoundError(None, f"{split.path} is not served by fakehub")
        except _NotFoundError as e:
            self._send_not_found(e, head=head)

    def _handle_api(self, segments: list[str], query: dict[str, list[str]], *, head: bool) -> None:
        repo_id, keyword, rest = _split_repo(segments, ("revision", "tree"))
        if keyword == "":
            info = self._hub._model_info(repo_id, "main", blobs=_truthy(query, "blobs"))
            self._send_json(HTTPStatus.OK, info, head=head)
        elif keyword == "revision" and len(rest) >= 1:
            revision = "/".join(rest)  # the client quotes "/" but tolerate it unquoted
            info = self._hub._model_info(repo_id, revision, blobs=_truthy(query, "blobs"))
            self._send_json(HTTPStatus.OK, info, head=head)
        elif keyword == "tree" and len(rest) >= 1:
            tree = self._hub._tree(
                repo_id, rest[0], "/".join(rest[1:]), recursive=_truthy(query, "recursive")
            )
            self._send_json(HTTPStatus.OK, tree, head=head)
        else:
            self._hub._resolve(repo_id, "main")  # RepoNotFound beats "unknown route"
            raise _NotFoundError(None, f"/api/models/{'/'.join(segments)} is not served by fakehub")

    def _handle_resolve(self, segments: list[str], *, head: bool) -> None:
        repo_id, keyword, rest = _split_repo(segments, ("resolve",))
        if keyword != "resolve" or len(rest) < 2:
            raise _NotFoundError(None, f"/{'/'.join(segments)} is not served by fakehub")
        commit, folder = self._hub._resolve(repo_id, rest[0])
        info = self._hub._file(folder, "/".join(rest[1:]), commit)

        start, end = 0, info.size - 1
        status = HTTPStatus.OK
        range_header = self.headers.get("Range")
        if range_header is not None and not head and info.size > 0:
            match = _RANGE_RE.match(range_header.strip())
            if match and (match.group(1) or match.group(2)):
                if match.group(1):
                    start = int(match.group(1))
                    end = min(int(match.group(2)), info.size - 1) if match.group(2) else end
                else:  # suffix range: the last N bytes
                    start = max(info.size - int(match.group(2)), 0)
                if start > end:
                    self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                    self.send_header("Content-Range", f"bytes */{info.size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = HTTPStatus.PARTIAL_CONTENT
        length = end - start + 1 if info.size > 0 else 0

        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{info.etag}"')
        self.send_header("X-Repo-Commit", commit)
        if info.is_lfs:
            self.send_header("X-Linked-Etag", f'"{info.sha256}"')
            self.send_header("X-Linked-Size", str(info.size))
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end}/{info.size}")
        name = info.path.rsplit("/", 1)[-1]
        self.send_header("Content-Disposition", f'inline; filename="{name}"')
        self.end_headers()
        if head:
            return
        with info.local.open("rb") as f:
            f.seek(start)
            remaining = length
            while remaining > 0:
                chunk = f.read(min(_CHUNK, remaining))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)

    # -- responses ---------------------------------------------------------------------------------

    def _send_json(self, status: HTTPStatus, payload: object, *, head: bool) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _send_not_found(self, error: _NotFoundError, *, head: bool) -> None:
        body = json.dumps({"error": error.message}).encode()
        self.send_response(HTTPStatus.NOT_FOUND)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if error.error_code is not None:
            self.send_header("X-Error-Code", error.error_code)
        self.send_header("X-Error-Message", error.message)
        if error.commit is not None:
            self.send_header("X-Repo-Commit", error.commit)
        self.end_headers()
        if not head:
            self.wfile.write(body)


def _truthy(query: dict[str, list[str]], name: str) -> bool:
    values = query.get(name) or ["false"]
    return values[-1].lower() in ("1", "true", "yes")


@contextlib.contextmanager
def serve_fake_hub(repos: dict[str, FakeRepo]) -> Iterator[FakeHub]:
    """Serve `repos` (repo_id -> FakeRepo) on 127.0.0.1:<ephemeral port> until the block exits."""
    hub = FakeHub(repos)
    server = _Server(hub)
    host, port = server.server_address[:2]
    assert isinstance(host, str)
    hub.endpoint = f"http://{host}:{port}"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fakehub", daemon=True
    )
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
