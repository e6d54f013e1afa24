#!/usr/bin/env python3
"""Record real engine wire formats into tests/engines/data/ and measure engine performance.

Run with the project's python (needs aiohttp), after both install scripts::

    .venv/bin/python scripts/engines/record_wire_formats.py [--only vllm|llamacpp]

Writes raw SSE bodies, /metrics scrapes taken under load, error bodies, and ``manifest.json``
(HTTP status + content-type of every sample, startup times, tokens/s, priority latencies).
Engines are started one at a time (2-core machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines import EngineProcess, llamacpp_process, vllm_process  # noqa: E402
from engines.wire import metric_value  # noqa: E402

DATA = ROOT / "tests" / "engines" / "data"
MANIFEST = DATA / "manifest.json"


async def request(url: str, payload: dict[str, Any], timeout: float = 300.0) -> tuple[int, str, str]:
    """POST JSON; return (status, content-type, raw body)."""
    conn = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout)) as s,
        s.post(url, json=payload) as resp,
    ):
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def get(url: str) -> tuple[int, str, str]:
    """GET; return (status, content-type, raw body)."""
    conn = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=conn) as s, s.get(url) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def stream_timed(url: str, payload: dict[str, Any]) -> tuple[float, float, int]:
    """Stream a request; return (seconds to first token, total seconds, number of text chunks)."""
    conn = aiohttp.TCPConnector(force_close=True)
    t0 = time.monotonic()
    ttft = -1.0
    n = 0
    async with (
        aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s,
        s.post(url, json=payload) as resp,
    ):
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            obj = json.loads(line[5:])
            choices = obj.get("choices") or []
            if choices and (choices[0].get("text") or (choices[0].get("delta") or {}).get("content")):
                n += 1
                if ttft < 0:
                    ttft = time.monotonic() - t0
    return ttft, time.monotonic() - t0, n


class Recorder:
    """Collects samples and facts for one engine."""

    def __init__(self, prefix: str, eng: EngineProcess, manifest: dict[str, Any]) -> None:
        """Bind to a started engine."""
        self.prefix, self.eng, self.manifest = prefix, eng, manifest

    def save(self, name: str, status: int, ctype: str, body: str, note: str = "") -> None:
        """Write ``<prefix>_<name>`` and note its HTTP status in the manifest."""
        fname = f"{self.prefix}_{name}"
        (DATA / fname).write_text(body)
        self.manifest["samples"][fname] = {"status": status, "content_type": ctype, "note": note}
        print(f"  {fname}: HTTP {status} {ctype} ({len(body)} bytes)")

    async def sample(self, name: str, path: str, payload: dict[str, Any], note: str = "") -> str:
        """POST and save the raw body."""
        status, ctype, body = await request(self.eng.url + path, payload)
        self.save(name, status, ctype, body, note)
        return body

    async def metrics_under_load(self, waiting: str, n: int = 12, max_tokens: int = 64) -> None:
        """Flood ``n`` requests and save the first /metrics scrape that shows ``waiting`` > 0."""
        payload = {"model": self.eng.served_model_name, "prompt": "the queue", "max_tokens": max_tokens}
        url = self.eng.url + "/v1/completions"
        tasks = [asyncio.create_task(request(url, payload)) for _ in range(n)]
        saved = ""
        best = -1.0
        while not all(t.done() for t in tasks):
            text = await self.eng.ametrics_text()
            w = metric_value(text, waiting) or 0.0
            if w > best:
                best, saved = w, text
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)
        status, ctype, after = await get(self.eng.url + "/metrics")
        self.save("metrics.txt", status, ctype, saved, f"scrape under load: {waiting}={best}")
        self.save("metrics_idle.txt", status, ctype, after, "scrape after the flood finished")


async def throughput(eng: EngineProcess, concurrency: int, max_tokens: int) -> dict[str, float]:
    """Aggregate streamed tokens/s with ``concurrency`` parallel requests of ``max_tokens``."""
    payload = {"model": eng.served_model_name, "prompt": "hello", "max_tokens": max_tokens, "stream": True}
    t0 = time.monotonic()
    res = await asyncio.gather(*(stream_timed(eng.url + "/v1/completions", payload) for _ in range(concurrency)))
    wall = time.monotonic() - t0
    tokens = sum(n for _, _, n in res)
    return {
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "tok_per_s": round(tokens / wall, 1),
        "mean_ttft_s": round(sum(t for t, _, _ in res) / len(res), 3),
    }


async def record_vllm(manifest: dict[str, Any]) -> None:
    """vLLM: streams, errors, metrics, throughput, priority scheduling."""
    facts: dict[str, Any] = manifest.setdefault("vllm", {})
    eng = vllm_process(scheduling_policy="fcfs")
    print("starting vLLM (fcfs) ...")
    eng.start()
    facts["startup_s_fcfs"] = round(eng.last_startup_s or 0, 1)
    try:
        r = Recorder("vllm", eng, manifest)
        m = eng.served_model_name
        stream = {"stream": True, "stream_options": {"include_usage": True}}
        await r.sample(
            "completions_stream.txt",
            "/v1/completions",
            {"model": m, "prompt": "hello the world", "max_tokens": 8, **stream},
        )
        await r.sample(
            "chat_stream.txt",
            "/v1/chat/completions",
            {"model": m, "messages": [{"role": "user", "content": "say hello"}], "max_tokens": 8, **stream},
        )
        await r.sample(
            "completions_stream_no_usage.txt",
            "/v1/completions",
            {"model": m, "prompt": "hello", "max_tokens": 4, "stream": True},
        )
        await r.sample("completions.json", "/v1/completions", {"model": m, "prompt": "hello", "max_tokens": 4})
        await r.sample(
            "chat.json",
            "/v1/chat/completions",
            {"model": m, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        await r.sample(
            "error_unknown_model.json", "/v1/completions", {"model": "no-such-model", "prompt": "x", "max_tokens": 4}
        )
        await r.sample(
            "priority_under_fcfs.json",
            "/v1/completions",
            {"model": m, "prompt": "x", "max_tokens": 4, "priority": 5},
            "non-zero priority sent to a --scheduling-policy fcfs server: 200, no error in 0.32",
        )
        await r.sample(
            "priority_under_fcfs_stream.txt",
            "/v1/completions",
            {"model": m, "prompt": "x", "max_tokens": 4, "priority": -1, "stream": True},
            "non-zero priority, stream=true, fcfs server (accepted and ignored in 0.32)",
        )
        await r.sample(
            "error_max_tokens_too_large.json",
            "/v1/completions",
            {"model": m, "prompt": "x", "max_tokens": 5000},
            "prompt + max_tokens > --max-model-len 1024",
        )
        await r.sample(
            "error_bad_request.json", "/v1/completions", {"model": m, "max_tokens": 4}, "missing prompt field"
        )
        for path, name in (("/health", "health.txt"), ("/v1/models", "models.json")):
            r.save(name, *(await get(eng.url + path)))
        await r.metrics_under_load("vllm:num_requests_waiting")
        facts["priority_flood_under_fcfs"] = await priority_flood(eng)
        print("  priority under fcfs:", facts["priority_flood_under_fcfs"])

        await throughput(eng, 1, 16)  # warm-up
        facts["single_stream"] = await throughput(eng, 1, 256)
        facts["concurrent_4"] = await throughput(eng, 4, 256)
        facts["concurrent_8"] = await throughput(eng, 8, 256)
        print("  throughput:", facts["single_stream"], facts["concurrent_8"])
    finally:
        eng.stop()

    eng = vllm_process(scheduling_policy="priority", served_model_name="tiny-llama-prio")
    print("starting vLLM (priority) ...")
    eng.start()
    facts["startup_s_priority"] = round(eng.last_startup_s or 0, 1)
    try:
        r = Recorder("vllm_priority", eng, manifest)
        m = eng.served_model_name
        await r.sample(
            "completions_stream.txt",
            "/v1/completions",
            {"model": m, "prompt": "hi", "max_tokens": 4, "priority": -3, "stream": True},
            "priority accepted by a --scheduling-policy priority server",
        )
        await r.sample(
            "error_priority_float.json",
            "/v1/completions",
            {"model": m, "prompt": "hi", "max_tokens": 4, "priority": 1.5},
            "non-integer priority",
        )
        facts["priority_flood"] = await priority_flood(eng)
        print("  priority:", facts["priority_flood"])
    finally:
        eng.stop()

    eng = vllm_process(max_num_seqs=8)
    print("starting vLLM (fcfs, --max-num-seqs 8) ...")
    eng.start()
    try:
        await throughput(eng, 1, 16)
        facts["max_num_seqs_8"] = {
            "startup_s": round(eng.last_startup_s or 0, 1),
            "single_stream": await throughput(eng, 1, 256),
            "concurrent_8": await throughput(eng, 8, 256),
        }
        print("  8 seqs:", facts["max_num_seqs_8"])
    finally:
        eng.stop()


async def first_token_time(url: str, payload: dict[str, Any], t0: float) -> tuple[float, float]:
    """Stream a request; return (sent, first data chunk) in seconds since ``t0``. Parses nothing."""
    conn = aiohttp.TCPConnector(force_close=True)
    sent = time.monotonic() - t0
    first = -1.0
    async with (
        aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s,
        s.post(url, json=payload) as resp,
    ):
        async for line in resp.content:
            if first < 0 and line.startswith(b"data: {"):
                first = time.monotonic() - t0
    return sent, first


async def priority_flood(eng: EngineProcess, n: int = 24) -> dict[str, Any]:
    """``n`` x 128-token priority-0 requests, then 2 latecomers each at priority -1 and +1.

    Latecomers are sent once /metrics shows the flood queued. Returns the rank (0 = first) at
    which each latecomer got its first token among all requests (robust to timing noise on a
    shared machine), plus seconds to first token.
    """
    url = eng.url + "/v1/completions"
    base = {"model": eng.served_model_name, "prompt": "hello", "max_tokens": 128, "stream": True}
    t0 = time.monotonic()
    flood = [asyncio.create_task(first_token_time(url, base, t0)) for _ in range(n)]
    waiting = 0.0
    for _ in range(200):
        await asyncio.sleep(0.05)
        waiting = metric_value(await eng.ametrics_text(), "vllm:num_requests_waiting") or 0.0
        if waiting >= n - 8:
            break
    late = [asyncio.create_task(first_token_time(url, {**base, "priority": p}, t0)) for p in (-1, -1, 1, 1)]
    fl = await asyncio.gather(*flood)
    lt = await asyncio.gather(*late)
    firsts = sorted(t for _, t in fl + lt)
    return {
        "flood": n,
        "waiting_when_latecomers_sent": waiting,
        f"first_token_rank_of_{n + 4}_priority_minus1": [firsts.index(t) for _, t in lt[:2]],
        f"first_token_rank_of_{n + 4}_priority_plus1": [firsts.index(t) for _, t in lt[2:]],
        "ttft_s_priority_minus1": [round(t - s, 2) for s, t in lt[:2]],
        "ttft_s_priority_plus1": [round(t - s, 2) for s, t in lt[2:]],
        "ttft_s_flood_median": round(sorted(t - s for s, t in fl)[len(fl) // 2], 2),
    }


async def record_llamacpp(manifest: dict[str, Any]) -> None:
    """llama.cpp: streams, errors, metrics, throughput."""
    facts: dict[str, Any] = manifest.setdefault("llamacpp", {})
    eng = llamacpp_process(slots=4)
    print("starting llama-server ...")
    eng.start()
    facts["startup_s"] = round(eng.last_startup_s or 0, 1)
    try:
        r = Recorder("llamacpp", eng, manifest)
        m = eng.served_model_name
        stream = {"stream": True, "stream_options": {"include_usage": True}}
        await r.sample(
            "completions_stream.txt",
            "/v1/completions",
            {"model": m, "prompt": "hello the world", "max_tokens": 8, **stream},
        )
        await r.sample(
            "chat_stream.txt",
            "/v1/chat/completions",
            {"model": m, "messages": [{"role": "user", "content": "say hello"}], "max_tokens": 8, **stream},
        )
        await r.sample(
            "completions_stream_no_usage.txt",
            "/v1/completions",
            {"model": m, "prompt": "hello", "max_tokens": 4, "stream": True},
        )
        await r.sample("completions.json", "/v1/completions", {"model": m, "prompt": "hello", "max_tokens": 4})
        await r.sample(
            "chat.json",
            "/v1/chat/completions",
            {"model": m, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        await r.sample(
            "error_unknown_model.json",
            "/v1/completions",
            {"model": "no-such-model", "prompt": "x", "max_tokens": 4},
            "llama-server (single model) may ignore the model field",
        )
        await r.sample(
            "error_bad_request.json", "/v1/completions", {"model": m, "max_tokens": 4}, "missing prompt field"
        )
        await r.sample(
            "error_context_exceeded.json",
            "/v1/completions",
            {"model": m, "prompt": "hello " * 1500, "max_tokens": 4},
            "prompt longer than the per-slot context (4096 / 4 slots)",
        )
        await r.sample(
            "priority_field.txt",
            "/v1/completions",
            {"model": m, "prompt": "hi", "max_tokens": 4, "priority": 5, "stream": True},
            "llama-server has no priority: is the field ignored?",
        )
        for path, name in (("/health", "health.txt"), ("/v1/models", "models.json"), ("/slots", "slots.json")):
            r.save(name, *(await get(eng.url + path)))
        await r.metrics_under_load("llamacpp:requests_deferred")
        await throughput(eng, 1, 16)
        facts["single_stream"] = await throughput(eng, 1, 256)
        facts["concurrent_4"] = await throughput(eng, 4, 256)
        facts["concurrent_8"] = await throughput(eng, 8, 256)
        print("  throughput:", facts["single_stream"], facts["concurrent_8"])
    finally:
        eng.stop()


def main() -> int:
    """Record everything (or one engine) and merge into manifest.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["vllm", "llamacpp"])
    args = ap.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}
    manifest.setdefault("samples", {})
    if args.only in (None, "vllm"):
        asyncio.run(record_vllm(manifest))
    if args.only in (None, "llamacpp"):
        asyncio.run(record_llamacpp(manifest))
    manifest["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"wrote {MANIFEST}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
