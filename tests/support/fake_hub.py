"""A Hugging Face Hub on 127.0.0.1 for tests: the few routes huggingface_hub uses, with the headers it reads.

Starlette routes served by uvicorn in a thread. Repos hold bytes in memory. What a test can arrange:
- a gated repo (401 GatedRepo without a token, 403 with one that was not granted) or a private one
  (401 RepoNotFound), as the real Hub answers;
- a file served with other bytes than its listed sha256 (``lie``);
- a download cut after N bytes, once (``cut_after``), or held after N bytes until ``release()``
  (``hold_after``), to test resume and Cancel; a file whose Range requests are answered with the whole
  file (``ignore_range``), as some proxies do;
- every request is logged with its Range header (``requests``).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.model_library import COMMIT

CHUNK = 64 * 1024


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    downloads: int = 0
    gated: bool = False
    private: bool = False
    granted_tokens: frozenset[str] = frozenset()
    lie: frozenset[str] = frozenset()  # files served with other bytes than listed

    def sha(self, name: str) -> str:
        return hashlib.sha256(self.files[name]).hexdigest()

    def served(self, name: str) -> bytes:
        data = self.files[name]
        return bytes(b ^ 0xFF for b in data[:4096]) + data[4096:] if name in self.lie else data


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, Range header
    cut_after: dict[str, int] = field(default_factory=dict)
    hold_after: dict[str, int] = field(default_factory=dict)
    ignore_range: set[str] = field(default_factory=set)
    url: str = ""

    def __post_init__(self) -> None:
        self._released = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def add(self, repo: FakeRepo) -> FakeRepo:
        self.repos[repo.repo_id] = repo
        return repo

    def release(self) -> None:
        self._released.set()

    def downloads_of(self, name: str) -> list[str]:
        """The Range headers of the GETs of ``name`` ("" for none)."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + name) and "/resolve/" in p]

    # --- routes ---------------------------------------------------------------------------------------

    def _access(self, request: Request, repo: FakeRepo | None) -> Response | None:
        auth = request.headers.get("authorization", "")
        token = auth.removeprefix("Bearer ").strip()
        if repo is None or (repo.private and token not in repo.granted_tokens):
            return Response(status_code=401, headers={"X-Error-Code": "RepoNotFound",
                                                      "X-Error-Message": "Repository not found"})
        if repo.gated and token not in repo.granted_tokens:
            status = 403 if token else 401
            return Response(status_code=status, headers={
                "X-Error-Code": "GatedRepo", "X-Error-Message": "Access to this model is restricted"})
        return None

    async def list_models(self, request: Request) -> Response:
        search = (request.query_params.get("search") or "").lower()
        wanted = request.query_params.getlist("filter")
        limit = int(request.query_params.get("limit") or 1000)
        found = [r for r in self.repos.values() if not r.private and search in r.repo_id.lower()
                 and ("gguf" not in wanted or any(n.endswith(".gguf") for n in r.files))]
        found.sort(key=lambda r: -r.downloads)
        return JSONResponse([{"_id": r.repo_id, "id": r.repo_id, "modelId": r.repo_id,
                              "downloads": r.downloads, "likes": 0, "gated": "manual" if r.gated else False,
                              "private": False,
                              "tags": ["gguf"], "library_name": "gguf"} for r in found[:limit]])

    async def model_info(self, request: Request) -> Response:
        repo_id = f"{request.path_params['owner']}/{request.path_params['name']}"
        repo = self.repos.get(repo_id)
        if repo is None or repo.private:
            denied = self._access(request, repo)
            if denied is not None:
                return denied
        assert repo is not None
        siblings = [{"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest(),
                     "lfs": {"sha256": repo.sha(name), "size": len(data), "pointerSize": 134}}
                    for name, data in sorted(repo.files.items())]
        return JSONResponse({"_id": repo_id, "id": repo_id, "modelId": repo_id, "sha": COMMIT,
                             "private": repo.private, "gated": "manual" if repo.gated else False,
                             "downloads": repo.downloads, "likes": 0, "tags": ["gguf"], "siblings": siblings})

    async def resolve(self, request: Request) -> Response:
        p = request.path_params
        repo_id, name = f"{p['owner']}/{p['name']}", p["filename"]
        repo = self.repos.get(repo_id)
        denied = self._access(request, repo)
        if denied is not None:
            return denied
        assert repo is not None
        if name not in repo.files:
            headers = {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found",
                       "X-Repo-Commit": COMMIT}
            return Response(status_code=404, headers=headers)
        data = repo.served(name)
        sha = repo.sha(name)
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"',
                   "X-Linked-Size": str(len(data)), "Accept-Ranges": "bytes"}
        if request.method == "HEAD":
            return Response(headers={**headers, "Content-Length": str(len(data))})
        start, end = 0, len(data) - 1
        ranged = "" if name in self.ignore_range else request.headers.get("range", "")
        if ranged.startswith("bytes="):
            first, _, last = ranged[6:].partition("-")
            start = int(first or 0)
            end = min(int(last), end) if last else end
        body = data[start: end + 1]
        headers["Content-Length"] = str(len(body))
        status = 200
        if ranged:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        return StreamingResponse(self._stream(name, body, start), status_code=status, headers=headers,
                                 media_type="application/octet-stream")

    async def _stream(self, name: str, body: bytes, offset: int) -> AsyncIterator[bytes]:
        cut = self.cut_after.get(name)
        hold = self.hold_after.get(name)
        sent = 0
        while sent < len(body):
            at = offset + sent
            if cut is not None and at >= cut:
                del self.cut_after[name]  # once
                raise ConnectionAbortedError("fake hub: connection cut")
            if hold is not None and at >= hold:
                while not self._released.is_set():
                    await asyncio.sleep(0.02)
                hold = None
            step = CHUNK
            for limit in (cut, hold):
                if limit is not None and at < limit:
                    step = min(step, limit - at)
            piece = body[sent: sent + step]
            sent += len(piece)
            yield piece

    # --- server ---------------------------------------------------------------------------------------

    def start(self) -> FakeHub:
        def logged(handler):  # type: ignore[no-untyped-def]
            async def route(request: Request) -> Response:
                self.requests.append((request.method, request.url.path, request.headers.get("range", "")))
                return await handler(request)
            return route

        app = Starlette(routes=[
            Route("/api/models", logged(self.list_models)),
            Route("/api/models/{owner}/{name}", logged(self.model_info)),
            Route("/api/models/{owner}/{name}/revision/{revision}", logged(self.model_info)),
            Route("/{owner}/{name}/resolve/{revision}/{filename:path}", logged(self.resolve),
                  methods=["GET", "HEAD"]),
        ])
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="fake-hub")
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the fake hub did not start")
            threading.Event().wait(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
