"""Smoke tests against REAL engines: token streaming, queue gauges under load, kill + restart."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from engines import EngineProcess, llamacpp_process, vllm_process
from engines.wire import metric_value, post_raw, sse_data

pytestmark = pytest.mark.engines

ENGINES = ["vllm_engine", "llamacpp_engine"]
# (waiting gauge, running gauge) per engine fixture.
GAUGES = {
    "vllm_engine": ("vllm:num_requests_waiting", "vllm:num_requests_running"),
    "llamacpp_engine": ("llamacpp:requests_deferred", "llamacpp:requests_processing"),
}
SLOTS = 4
FLOOD_SEEN_TIMEOUT = 120.0  # generous: a cold engine on a busy 2-core machine; passing runs take seconds


def _engine(request: pytest.FixtureRequest, name: str) -> EngineProcess:
    """Resolve an engine fixture by name."""
    eng = request.getfixturevalue(name)
    assert isinstance(eng, EngineProcess)
    return eng


# The stream killed midway must outlast a starved client: on 2 cores vLLM's CPU threads can hold the test's
# event loop back while a 900-token answer finishes, so vLLM gets its model's whole context to fill.
KILL_STREAM_CONTEXT = 4096
KILL_STREAM_TOKENS = {"vllm_engine": KILL_STREAM_CONTEXT - 16, "llamacpp_engine": 900}


def _dedicated(name: str) -> EngineProcess:
    """A fresh instance of the engine (not yet started) for a test that kills it. The session's engines
    are shared by the tests after this module, and on a vLLM killed and restarted here a later flood
    through the scheduler read 0 running and 0 waiting at every /metrics while its generated-tokens
    counter moved (seen in fresh-clone CI runs; not reproduced with kill and restart alone)."""
    return vllm_process(max_model_len=KILL_STREAM_CONTEXT) if name == "vllm_engine" else llamacpp_process()


def _chunks(raw: str) -> list[dict[str, Any]]:
    """Parse an OpenAI SSE body: JSON chunks, asserting it ends with ``[DONE]``."""
    data = sse_data(raw)
    assert data, f"empty SSE body: {raw[:500]!r}"
    assert data[-1] == "[DONE]", f"stream did not end with [DONE]: {data[-3:]!r}"
    return [json.loads(d) for d in data[:-1]]


@pytest.mark.parametrize("engine_name", ENGINES)
async def test_completions_stream(request: pytest.FixtureRequest, engine_name: str) -> None:
    """/v1/completions streams many small text chunks and a final usage chunk."""
    eng = _engine(request, engine_name)
    payload = {
        "model": eng.served_model_name,
        "prompt": "hello the world",
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, raw = await post_raw(eng.url + "/v1/completions", payload)
    assert status == 200, raw
    chunks = _chunks(raw)
    texts = [str(c["choices"][0]["text"]) for c in chunks if c.get("choices")]
    # Usually one chunk per token (the tiny model never samples byte/control tokens), but a busy
    # vLLM merges several tokens into one chunk: count tokens from usage, chunks only loosely.
    assert len([t for t in texts if t]) >= 4, texts
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == 16, usage


@pytest.mark.parametrize("engine_name", ENGINES)
async def test_chat_stream(request: pytest.FixtureRequest, engine_name: str) -> None:
    """/v1/chat/completions streams delta.content chunks (chat template works)."""
    eng = _engine(request, engine_name)
    payload = {
        "model": eng.served_model_name,
        "messages": [{"role": "user", "content": "say hello"}],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, raw = await post_raw(eng.url + "/v1/chat/completions", payload)
    assert status == 200, raw
    chunks = _chunks(raw)
    contents = [c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices")]
    assert len([t for t in contents if t]) >= 4, contents
    finish = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    assert "length" in finish, finish


@pytest.mark.parametrize("engine_name", ENGINES)
async def test_queue_gauges_move_under_flood(request: pytest.FixtureRequest, engine_name: str) -> None:
    """12 concurrent requests on 4 slots: running reaches 4 and the waiting gauge goes above 0.

    The test reads the gauges until it has seen both, while the flood is still outstanding, then cancels
    the flood: the requests are long enough (900 tokens, 3 waves) to outlast a cold engine's first steps
    and a /metrics endpoint that a busy CPU engine on 2 cores answers in seconds, so no sampling window
    can close before the engine shows the load. Cancelled, they must leave the engine."""
    eng = _engine(request, engine_name)
    waiting_name, running_name = GAUGES[engine_name]
    text = await eng.ametrics_text()
    assert metric_value(text, waiting_name) == 0, text
    assert metric_value(text, running_name) == 0, text

    payload = {
        "model": eng.served_model_name,
        "prompt": "the queue",
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    flood = [asyncio.create_task(post_raw(eng.url + "/v1/completions", payload)) for _ in range(12)]
    samples: list[tuple[float, float]] = []
    try:
        async with asyncio.timeout(FLOOD_SEEN_TIMEOUT):
            while not any(w > 0 and r == SLOTS for w, r in samples):
                assert not all(f.done() for f in flood), f"the flood ended unseen: {samples}; {flood[0]!r}"
                t = await eng.ametrics_text(timeout=FLOOD_SEEN_TIMEOUT)
                samples.append((metric_value(t, waiting_name) or 0.0, metric_value(t, running_name) or 0.0))
                await asyncio.sleep(0.02)  # sampling another process's gauges: no event to wait on
    finally:
        for f in flood:
            f.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
    assert max(r for _, r in samples) <= SLOTS, samples
    await _gauges_back_to_zero(eng, waiting_name, running_name)


async def _gauges_back_to_zero(eng: EngineProcess, waiting_name: str, running_name: str) -> None:
    """Wait until the engine's queue gauges read 0 again (aborts take a step or two to show)."""
    deadline = asyncio.get_running_loop().time() + FLOOD_SEEN_TIMEOUT
    while True:
        text = await eng.ametrics_text(timeout=FLOOD_SEEN_TIMEOUT)
        gauges = (metric_value(text, waiting_name), metric_value(text, running_name))
        if gauges == (0, 0):
            return
        assert asyncio.get_running_loop().time() < deadline, f"the engine kept {gauges} after the flood was cancelled"
        await asyncio.sleep(0.1)  # sampling another process's gauges: no event to wait on


@pytest.mark.parametrize("engine_name", ENGINES)
async def test_kill_mid_stream_then_restart_same_port(request: pytest.FixtureRequest, engine_name: str) -> None:
    """Killing the engine cuts an open stream; restart() brings it back on the same port."""
    _engine(request, engine_name)  # installed (or the test fails with the install command)
    with _dedicated(engine_name) as eng:
        await _kill_mid_stream_then_restart(eng, KILL_STREAM_TOKENS[engine_name])


async def _kill_mid_stream_then_restart(eng: EngineProcess, max_tokens: int) -> None:
    port = eng.port
    # ignore_eos: a random-weight model may end its answer after a token or two, before the kill
    payload = {
        "model": eng.served_model_name,
        "prompt": "hello",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    got: list[bytes] = []
    conn = aiohttp.TCPConnector(force_close=True)
    with pytest.raises((aiohttp.ClientError, asyncio.TimeoutError)):
        async with (
            aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as s,
            s.post(eng.url + "/v1/completions", json=payload) as resp,
        ):
            assert resp.status == 200
            async for line in resp.content:
                got.append(line)
                if len(got) == 1:
                    await asyncio.to_thread(eng.kill)
                assert b"[DONE]" not in line, "stream completed although the engine was killed"
            raise aiohttp.ClientPayloadError("stream ended without [DONE]")
    assert not eng.is_running()

    await eng.arestart()
    assert eng.port == port and eng.is_running()
    status, raw = await post_raw(
        eng.url + "/v1/completions", {"model": eng.served_model_name, "prompt": "hi", "max_tokens": 4}
    )
    assert status == 200, raw
