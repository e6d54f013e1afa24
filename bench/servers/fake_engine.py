"""An engine that answers instantly, for S6: every completion streams N pre-rendered tokens at once.

With no decode time and next to no CPU of its own, whatever latency a request shows through the scheduler
beyond the direct path is the scheduler's. It speaks just enough of vLLM's API: streamed
`/v1/completions` (tokens, usage chunk, `[DONE]`), `/metrics` with the queue gauges (never a waiting
queue; running = requests being answered) and `/health`.

    python -m bench.servers.fake_engine --port 8001 --tokens 16
"""

from __future__ import annotations

import argparse
import json

from aiohttp import web


def _chunks(tokens: int, model: str) -> bytes:
    """The whole SSE body of one answer, rendered once."""

    def chunk(text: str, finish: str | None) -> str:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        body = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": model, "choices": [choice]}
        return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"

    parts = [chunk(f" t{i}", "length" if i == tokens - 1 else None) for i in range(tokens)]
    usage = {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": tokens + 4}
    parts.append(f"data: {json.dumps({'id': 'cmpl-fake', 'choices': [], 'usage': usage})}\n\n")
    parts.append("data: [DONE]\n\n")
    return "".join(parts).encode()


class FakeEngine:
    """Counts what it serves so /metrics looks like a live engine's."""

    def __init__(self, tokens: int, model: str) -> None:
        self._body = _chunks(tokens, model)
        self._tokens = tokens
        self._running = 0
        self._generated = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self._running += 1
        try:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(self._body)
            await response.write_eof()
            self._generated += self._tokens
            return response
        finally:
            self._running -= 1

    async def metrics(self, request: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="fake",engine="0"} 0.0\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="fake",engine="0"}} {float(self._running)}\n'
            "# TYPE vllm:generation_tokens counter\n"
            f'vllm:generation_tokens_total{{model_name="fake",engine="0"}} {float(self._generated)}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--model", default="fake-model")
    args = parser.parse_args()
    engine = FakeEngine(args.tokens, args.model)
    app = web.Application()
    app.router.add_post("/v1/completions", engine.completions)
    app.router.add_get("/metrics", engine.metrics)
    app.router.add_get("/health", engine.health)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
