"""The TGI flavour over real HTTP: stream shape, overload, in-stream errors, validation, metrics."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from backends.sim import running_simulator
from tests.helpers import eventually
from tests.sim.support import fast_config, scrape, sse_lines, sse_payloads, value

TGI = {"flavor": "tgi"}


async def generate_stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with session.post(url + "/generate_stream", json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        lines = await sse_lines(response)
    assert all(line.startswith("data:{") for line in lines)  # TGI (axum) writes no space after the colon
    return [json.loads(p) for p in sse_payloads(lines)]


async def test_stream_shape_with_and_without_details(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(**TGI)) as sim:
        params = {"max_new_tokens": 4, "seed": 9, "details": True}
        events = await generate_stream(session, sim.url, {"inputs": "What is up?", "parameters": params})
        plain = await generate_stream(session, sim.url, {"inputs": "What is up?", "parameters": {"max_new_tokens": 4}})
    assert [e["index"] for e in events] == [1, 2, 3, 4]
    for event in events:
        assert set(event) == {"index", "token", "generated_text", "details"}
        assert set(event["token"]) == {"id", "text", "logprob", "special"}
        assert event["token"]["special"] is False and isinstance(event["token"]["id"], int)
    assert all(e["generated_text"] is None and e["details"] is None for e in events[:-1])
    last = events[-1]
    assert last["generated_text"] == "".join(e["token"]["text"] for e in events)
    assert last["details"] == {"finish_reason": "length", "generated_tokens": 4, "seed": 9, "input_length": 3}
    assert plain[-1]["generated_text"] is not None and plain[-1]["details"] is None


async def test_generate_non_streaming_with_details(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(**TGI)) as sim:
        body = {"inputs": "abc", "parameters": {"max_new_tokens": 3, "details": True}}
        async with session.post(sim.url + "/generate", json=body) as response:
            assert response.status == 200
            full = await response.json()
        async with session.post(
            sim.url + "/generate", json={"inputs": "abc", "parameters": {"max_new_tokens": 3}}
        ) as r:
            bare = await r.json()
    assert set(full) == {"generated_text", "details"}
    assert full["details"]["finish_reason"] == "length" and full["details"]["generated_tokens"] == 3
    assert "".join(t["text"] for t in full["details"]["tokens"]) == full["generated_text"]
    assert bare == {"generated_text": full["generated_text"]}


async def test_stop_sequence_is_kept_in_generated_text(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(**TGI)) as sim:
        base: dict[str, Any] = {"inputs": "Once", "parameters": {"max_new_tokens": 10, "seed": 5, "details": True}}
        text = (await generate_stream(session, sim.url, base))[-1]["generated_text"]
        stop = " " + text.split(" ")[5]
        params = {**base["parameters"], "stop": [stop]}
        events = await generate_stream(session, sim.url, {**base, "parameters": params})
    assert events[-1]["details"]["finish_reason"] == "stop_sequence"
    assert events[-1]["generated_text"] == text.split(stop)[0] + stop


async def test_over_concurrency_limit_is_overloaded(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(max_concurrent_requests=2, **TGI)) as sim:

        async def hold_open() -> None:
            body = {"inputs": "x", "parameters": {"max_new_tokens": 5000}}
            async with session.post(sim.url + "/generate_stream", json=body) as r:
                async for _ in r.content:
                    pass

        holders = [asyncio.create_task(hold_open()) for _ in range(2)]
        await eventually(lambda: sim.engine.num_running == 2, what="two requests in flight")
        small = {"inputs": "y", "parameters": {"max_new_tokens": 2}}
        async with session.post(sim.url + "/generate", json=small) as response:
            assert response.status == 429
            assert await response.json() == {"error": "Model is overloaded", "error_type": "overloaded"}
        # As in TGI's router, the streaming endpoint answers 200 and reports overload inside the stream.
        events = await generate_stream(session, sim.url, small)
        assert events == [{"error": "Model is overloaded", "error_type": "overloaded"}]
        samples = await scrape(session, sim.url)  # the parser adds "_total" to counters; the text has none
        assert value(samples, "tgi_request_failure_total", err="overloaded") == 2
        assert value(samples, "tgi_request_count_total") == 4
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
        await eventually(lambda: sim.engine.num_running == 0, what="holders aborted")
        async with session.post(sim.url + "/generate", json=small) as response:
            assert response.status == 200


async def test_injected_error_arrives_inside_the_stream(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(**TGI)) as sim:
        async with session.post(sim.url + "/sim/faults", json={"stream_error_after_tokens": 3}) as r:
            assert r.status == 200
        events = await generate_stream(session, sim.url, {"inputs": "x", "parameters": {"max_new_tokens": 10}})
        async with session.post(sim.url + "/generate", json={"inputs": "x", "parameters": {"max_new_tokens": 10}}) as r:
            assert r.status == 424
            assert (await r.json())["error_type"] == "generation"
        samples = await scrape(session, sim.url)
    assert [e["index"] for e in events[:3]] == [1, 2, 3]
    assert set(events[3]) == {"error", "error_type"} and events[3]["error_type"] == "generation"
    assert len(events) == 4
    assert value(samples, "tgi_request_failure_total", err="generation") == 2
    assert sim.engine.stats()["aborted_total"] == 2


async def test_validation_errors(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(**TGI)) as sim:
        bad = {"inputs": "x", "parameters": {"max_new_tokens": 0}}
        async with session.post(sim.url + "/generate", json=bad) as response:
            assert response.status == 422
            body = await response.json()
        too_many_stops = {"inputs": "x", "parameters": {"stop": ["a", "b", "c", "d", "e"]}}
        events = await generate_stream(session, sim.url, too_many_stops)
    assert body == {
        "error": "Input validation error: `max_new_tokens` must be strictly positive",
        "error_type": "validation",
    }
    assert events == [
        {
            "error": "Input validation error: `stop` supports up to 4 stop sequences. Given: 5",
            "error_type": "validation",
        }
    ]


async def test_metrics_use_tgi_names(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config(**TGI)) as sim:
        await generate_stream(session, sim.url, {"inputs": "x", "parameters": {"max_new_tokens": 3}})
        async with session.get(sim.url + "/metrics") as response:
            text = await response.text()
        samples = await scrape(session, sim.url)
        async with session.get(sim.url + "/info") as response:
            info = await response.json()
    for name in ("tgi_queue_size", "tgi_batch_current_size", "tgi_batch_current_max_tokens"):
        assert f"# TYPE {name} gauge" in text
    assert "\ntgi_request_count 1\n" in text and "\ntgi_request_success 1\n" in text  # no _total suffix
    assert "_created" not in text
    assert value(samples, "tgi_request_mean_time_per_token_duration_count") == 1
    assert value(samples, "tgi_request_queue_duration_count") == 1
    assert value(samples, "tgi_batch_forward_duration_count", method="decode") == 3
    assert value(samples, "tgi_batch_forward_duration_count", method="prefill") == 1
    assert info["max_concurrent_requests"] == 128 and info["model_id"] == "sim-model"
