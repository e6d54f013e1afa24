"""The vLLM flavour over real HTTP: wire shapes, validation, metrics, disconnects, batching latency."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from typing import Any

import aiohttp
import pytest

from backends.sim import running_simulator
from tests.helpers import eventually
from tests.sim.support import fast_config, scrape, sse_lines, sse_payloads, stats, value

COMPLETION_CHOICE_KEYS = {"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"}


async def post_json(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json()


async def stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[str]:
    async with session.post(url, json={**body, "stream": True}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        return await sse_lines(response)


async def test_completion_stream_shape_with_usage(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config()) as sim:
        body = {
            "model": "sim-model",
            "prompt": "Hello there",
            "max_tokens": 5,
            "stream_options": {"include_usage": True},
        }
        lines = await stream(session, sim.url + "/v1/completions", body)
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(p) for p in sse_payloads(lines[:-1])]
    token_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert len(token_chunks) == 5
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("cmpl-")
    for i, chunk in enumerate(token_chunks):
        assert set(chunk) == {"id", "object", "created", "model", "choices"}  # vLLM 0.32: no "usage": null
        assert chunk["object"] == "text_completion" and chunk["model"] == "sim-model"
        assert isinstance(chunk["created"], int)
        (choice,) = chunk["choices"]
        assert set(choice) == COMPLETION_CHOICE_KEYS
        assert choice["index"] == 0 and choice["logprobs"] is None and choice["stop_reason"] is None
        assert choice["finish_reason"] == ("length" if i == 4 else None)
    assert usage_chunk["choices"] == []
    assert usage_chunk["system_fingerprint"].startswith("vllm-")
    prompt_tokens = math.ceil(len("Hello there") / 4)
    assert usage_chunk["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 5,
        "total_tokens": prompt_tokens + 5,
    }


async def test_chat_stream_shape_matches_non_streamed_text(session: aiohttp.ClientSession) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "seed": 11}
    async with running_simulator(fast_config()) as sim:
        lines = await stream(session, sim.url + "/v1/chat/completions", body)
        status, full = await post_json(session, sim.url + "/v1/chat/completions", body)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(p) for p in sse_payloads(lines[:-1])]
    assert len(chunks) == 7  # role chunk + one per token, no usage chunk unless asked
    assert all(c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-") for c in chunks)
    assert chunks[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[1:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    streamed = "".join(c["choices"][0]["delta"]["content"] for c in chunks[1:])

    assert status == 200
    assert full["object"] == "chat.completion"
    (choice,) = full["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == streamed
    assert choice["finish_reason"] == "length"
    assert full["usage"]["completion_tokens"] == 6


async def test_non_streaming_completion_and_request_id_header(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config()) as sim:
        async with session.post(
            sim.url + "/v1/completions",
            json={"prompt": "abcdefghi", "max_tokens": 3},
            headers={"X-Request-Id": "job-1"},
        ) as response:
            assert response.status == 200
            body = await response.json()
        served = (await stats(session, sim.url))["served_order"]
    assert body["id"] == "cmpl-job-1" and body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert served == [{"request_id": "job-1", "priority": 0}]


async def test_ignore_eos_gives_exact_length_and_seed_is_deterministic(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(eos_probability=0.2)) as sim:
        url = sim.url + "/v1/completions"
        exact = [
            await post_json(session, url, {"prompt": "x", "max_tokens": 40, "ignore_eos": True, "seed": s})
            for s in (1, 1, 2)
        ]
        early = [await post_json(session, url, {"prompt": "x", "max_tokens": 40, "seed": s}) for s in range(5)]
    assert [b["usage"]["completion_tokens"] for _, b in exact] == [40, 40, 40]
    assert exact[0][1]["choices"][0]["text"] == exact[1][1]["choices"][0]["text"]
    assert exact[0][1]["choices"][0]["text"] != exact[2][1]["choices"][0]["text"]
    stopped = [b for _, b in early if b["choices"][0]["finish_reason"] == "stop"]
    assert stopped, "with eos_probability 0.2 some of 5 requests of 40 tokens must end on EOS"
    assert all(b["usage"]["completion_tokens"] < 40 and b["choices"][0]["stop_reason"] is None for b in stopped)


async def test_stop_string_cuts_text_streamed_and_not(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config()) as sim:
        url = sim.url + "/v1/completions"
        base = {"prompt": "Once", "max_tokens": 12, "seed": 5}
        _, plain = await post_json(session, url, base)
        words = plain["choices"][0]["text"].split(" ")  # ["", "w1", "w2", ...]
        stop = " " + words[6]  # a word in the middle
        cut = plain["choices"][0]["text"].split(stop)[0]
        _, stopped = await post_json(session, url, {**base, "stop": [stop, "never-matches"]})
        lines = await stream(session, url, {**base, "stop": stop})
    assert stopped["choices"][0]["text"] == cut
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["stop_reason"] == stop
    chunks = [json.loads(p) for p in sse_payloads(lines[:-1])]
    assert "".join(c["choices"][0]["text"] for c in chunks) == cut
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("body", "status", "err_type", "message_part"),
    [
        ({"model": "other", "prompt": "x"}, 404, "NotFoundError", "The model `other` does not exist."),
        ({"prompt": "x", "max_tokens": 0}, 400, "BadRequestError", "max_tokens must be at least 1"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "BadRequestError", "stream=True"),
        ({"prompt": "x", "max_tokens": 10_000}, 400, "BadRequestError", "maximum context length"),
        ({"prompt": 5}, 400, "BadRequestError", "prompt"),
    ],
)
async def test_invalid_requests_get_vllm_error_shape(
    session: aiohttp.ClientSession, body: dict[str, Any], status: int, err_type: str, message_part: str
) -> None:
    async with running_simulator(fast_config()) as sim:
        got_status, got = await post_json(session, sim.url + "/v1/completions", body)
    assert got_status == status
    assert set(got) == {"error"}
    assert got["error"]["type"] == err_type and got["error"]["code"] == status and got["error"]["param"] is None
    assert message_part in got["error"]["message"]


async def test_priority_accepted_and_ignored_under_fcfs(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config()) as sim:
        status, body = await post_json(
            session, sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 2, "priority": 5}
        )
        served = (await stats(session, sim.url))["served_order"]
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"  # as vLLM 0.32 does
    assert served[0]["priority"] == 5


async def test_priority_accepted_under_priority_policy(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(scheduling_policy="priority")) as sim:
        status, body = await post_json(
            session,
            sim.url + "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "priority": -3},
        )
        served = (await stats(session, sim.url))["served_order"]
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert served[0]["priority"] == -3


async def test_models_and_health(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(model_name="tiny")) as sim:
        async with session.get(sim.url + "/health") as health:
            assert health.status == 200 and await health.read() == b""
        async with session.get(sim.url + "/v1/models") as models:
            body = await models.json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in body["data"]] == [("tiny", "model", "vllm")]


async def test_metrics_show_running_capped_and_waiting_then_drain_on_disconnect(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(max_num_seqs=2)) as sim:

        async def hold_open() -> None:
            async with session.post(
                sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5000, "stream": True}
            ) as r:
                async for _ in r.content:
                    pass

        clients = [asyncio.create_task(hold_open()) for _ in range(6)]

        async def loaded() -> bool:
            samples = await scrape(session, sim.url)
            return value(samples, "vllm:num_requests_running") == 2 and value(samples, "vllm:num_requests_waiting") == 4

        await eventually(loaded, what="2 running, 4 waiting in /metrics")
        samples = await scrape(session, sim.url)
        assert 0 < value(samples, "vllm:kv_cache_usage_perc") < 1
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)

        async def drained() -> bool:
            samples = await scrape(session, sim.url)
            return value(samples, "vllm:num_requests_running") == 0 and value(samples, "vllm:num_requests_waiting") == 0

        await eventually(drained, what="engine drained after disconnects")
        samples = await scrape(session, sim.url)
        assert value(samples, "vllm:request_success_total", finished_reason="abort") == 6
        assert (await stats(session, sim.url))["aborted_total"] == 6


async def test_disconnect_aborts_running_and_waiting_requests(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(max_num_seqs=1)) as sim:
        response = await session.post(
            sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5000, "stream": True}
        )
        await response.content.readline()  # the first token has arrived: it is running
        queued = asyncio.create_task(session.post(sim.url + "/v1/completions", json={"prompt": "y", "max_tokens": 5}))
        await eventually(lambda: sim.engine.num_waiting == 1, what="second request waiting")
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        await eventually(lambda: sim.engine.num_waiting == 0, what="waiting request aborted")
        assert sim.engine.num_running == 1
        response.close()
        await eventually(lambda: sim.engine.num_running == 0, what="running request aborted")
        assert sim.engine.stats()["aborted_total"] == 2
        assert sim.engine.stats()["completed_total"] == 0


async def test_time_per_token_grows_with_batch_size(session: aiohttp.ClientSession) -> None:
    config = fast_config(max_num_seqs=8, decode_base_ms=2.0, decode_per_seq_ms=3.0)

    async def mean_gap(url: str) -> float:
        stamps: list[float] = []
        async with session.post(url, json={"prompt": "x", "max_tokens": 15, "stream": True}) as response:
            async for line in response.content:
                if line.startswith(b"data: {"):
                    stamps.append(time.monotonic())
        gaps = [b - a for a, b in itertools.pairwise(stamps[1:])]  # skip the first token (TTFT)
        return sum(gaps) / len(gaps)

    async with running_simulator(config) as sim:
        url = sim.url + "/v1/completions"
        alone = await mean_gap(url)

        async def background() -> None:
            async with session.post(url, json={"prompt": "x", "max_tokens": 5000, "stream": True}) as r:
                async for _ in r.content:
                    pass

        others = [asyncio.create_task(background()) for _ in range(7)]
        await eventually(lambda: sim.engine.num_running == 7, what="7 background requests running")
        crowded = await mean_gap(url)
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
    # Step time: 2 + 3 * batch ms, so 5 ms alone and 26 ms with 8; allow for a busy machine.
    assert crowded > 2.5 * alone


async def test_waiting_queue_limit_answers_503(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(max_num_seqs=1, max_num_queued_reqs=1)) as sim:
        url = sim.url + "/v1/completions"
        first = asyncio.create_task(post_json(session, url, {"prompt": "a", "max_tokens": 5000}))
        await eventually(lambda: sim.engine.num_running == 1, what="first running")
        second = asyncio.create_task(post_json(session, url, {"prompt": "b", "max_tokens": 5000}))
        await eventually(lambda: sim.engine.num_waiting == 1, what="second waiting")
        status, body = await post_json(session, url, {"prompt": "c", "max_tokens": 5})
        assert status == 503 and body["error"]["code"] == 503
        assert sim.engine.stats()["rejected_total"] == 1
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)


async def test_stream_interval_groups_tokens_after_the_first_and_sends_the_last_at_once(
    session: aiohttp.ClientSession,
) -> None:
    """vLLM's per-request `stream_interval`: the first token alone, then groups of that many, the remainder
    with the finish; with `continuous_usage_stats` every chunk carries the usage so far."""
    async with running_simulator(fast_config()) as sim:
        body = {
            "model": "sim-model",
            "prompt": "Hello there",
            "max_tokens": 11,
            "ignore_eos": True,
            "stream_interval": 4,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        grouped = [json.loads(p) for p in sse_payloads((await stream(session, sim.url + "/v1/completions", body))[:-1])]
        whole = {**body, "stream_interval": None, "stream_options": None}
        single = [json.loads(p) for p in sse_payloads((await stream(session, sim.url + "/v1/completions", whole))[:-1])]
        status, error = await post_json(
            session, sim.url + "/v1/completions", {**body, "stream": True, "stream_interval": 0}
        )
    token_chunks, usage_chunk = grouped[:-1], grouped[-1]
    carried = [c["usage"]["completion_tokens"] for c in token_chunks]
    assert carried == [1, 5, 9, 11]  # 1, then 4 and 4, then the last 2 with the finish
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None, None, None, "length"]
    assert "".join(c["choices"][0]["text"] for c in token_chunks) == "".join(c["choices"][0]["text"] for c in single)
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 11
    assert all("usage" not in c for c in single)  # without the options: one token a chunk, no usage on them
    assert len(single) == 11
    assert status == 400 and "stream_interval" in error["error"]["message"]
