"""The scrape tool's child process: `--engines` endpoints per kind on loopback, each answering as its engine
does (vLLM's selection chunked and gzipped, as under uvicorn), until its stdin closes."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
from collections.abc import Sequence

from aiohttp import web

from bench.tools.scrape_scale.texts import engine_texts, selected_text


def metrics_app(kind: str, text: str) -> web.Application:
    """One kind's /metrics (with a Content-Length); vLLM's also answers `name[]` selections at /metrics/ as
    its prometheus-client app does under uvicorn: chunked, and gzipped when the client accepts gzip."""
    body = text.encode()
    selections: dict[tuple[tuple[str, ...], bool], bytes] = {}

    async def whole(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def selected(request: web.Request) -> web.StreamResponse:
        names = tuple(request.query.getall("name[]", ()))
        gzipped = "gzip" in request.headers.get("Accept-Encoding", "")
        if (names, gzipped) not in selections:
            answer = selected_text(text, names).encode()
            selections[names, gzipped] = gzip.compress(answer) if gzipped else answer
        response = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
        if gzipped:
            response.headers["Content-Encoding"] = "gzip"
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            await response.write(selections[names, gzipped])
            await response.write_eof()
        except ConnectionResetError:  # the scheduler of a window that just ended closed its connections
            pass
        return response

    app = web.Application()
    app.router.add_get("/metrics", whole)
    if kind == "vllm":
        app.router.add_get("/metrics/", selected)
    return app


async def serve(engines: int, kinds: Sequence[str]) -> None:
    """`engines` endpoints per kind; prints their URLs as one JSON line, serves until stdin closes."""
    texts = await engine_texts()
    urls: dict[str, list[str]] = {}
    runners = []
    for kind in kinds:
        runner = web.AppRunner(metrics_app(kind, texts[kind]), access_log=None)
        await runner.setup()
        runners.append(runner)
        for _ in range(engines):
            await web.TCPSite(runner, "127.0.0.1", 0).start()
        urls[kind] = [f"http://127.0.0.1:{address[1]}" for address in runner.addresses]
    print(json.dumps(urls), flush=True)
    try:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        for runner in runners:
            await runner.cleanup()
