"""Fault injection and the /sim endpoints, plus what clients see when the simulator stops."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from backends.sim import running_simulator
from backends.sim.journal import read_journal
from tests.helpers import eventually
from tests.sim.support import fast_config, sse_lines, sse_payloads, stats


async def set_faults(session: aiohttp.ClientSession, url: str, **faults: object) -> dict[str, object]:
    async with session.post(url + "/sim/faults", json=faults) as response:
        assert response.status == 200
        body: dict[str, object] = await response.json()
        return body


@pytest.mark.parametrize("flavor", ["vllm", "tgi"])
async def test_metrics_down_and_back(session: aiohttp.ClientSession, flavor: str) -> None:
    async with running_simulator(fast_config(flavor=flavor)) as sim:
        assert (await set_faults(session, sim.url, metrics_down=True))["metrics_down"] is True
        async with session.get(sim.url + "/metrics") as response:
            assert response.status == 503
        async with session.delete(sim.url + "/sim/faults") as response:
            assert (await response.json())["metrics_down"] is False
        async with session.get(sim.url + "/metrics") as response:
            assert response.status == 200


async def test_reject_all_with_status(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config()) as sim:
        await set_faults(session, sim.url, reject_all_with_status=503)
        async with session.post(sim.url + "/v1/completions", json={"prompt": "x"}) as response:
            assert response.status == 503
            body = await response.json()
        assert body["error"]["type"] == "ServiceUnavailableError" and body["error"]["code"] == 503
        assert (await stats(session, sim.url))["rejected_total"] == 1
        async with session.get(sim.url + "/health") as response:
            assert response.status == 200  # only generation is refused


async def test_vllm_stream_error_after_tokens(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config()) as sim:
        await set_faults(session, sim.url, stream_error_after_tokens=2)
        body = {"prompt": "x", "max_tokens": 10, "stream": True}
        async with session.post(sim.url + "/v1/completions", json=body) as response:
            assert response.status == 200
            lines = await sse_lines(response)
        async with session.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 10}) as response:
            assert response.status == 500
            error = await response.json()
        short = {"prompt": "x", "max_tokens": 2}
        async with session.post(sim.url + "/v1/completions", json=short) as response:
            assert response.status == 200  # finishes before the fault's threshold
    payloads = sse_payloads(lines)
    assert payloads[-1] == "[DONE]"
    assert len(payloads) == 4
    assert [json.loads(p)["object"] for p in payloads[:2]] == ["text_completion"] * 2
    assert json.loads(payloads[2])["error"]["type"] == "InternalServerError"
    assert error["error"]["code"] == 500
    assert sim.engine.stats()["aborted_total"] == 2


@pytest.mark.parametrize("flavor", ["vllm", "tgi"])
async def test_stream_cut_after_tokens(session: aiohttp.ClientSession, flavor: str) -> None:
    async with running_simulator(fast_config(flavor=flavor)) as sim:
        await set_faults(session, sim.url, stream_cut_after_tokens=3)
        if flavor == "vllm":
            path, body = "/v1/completions", {"prompt": "x", "max_tokens": 10, "stream": True}
        else:
            path, body = "/generate_stream", {"inputs": "x", "parameters": {"max_new_tokens": 10}}
        received: list[bytes] = []
        with pytest.raises(aiohttp.ClientPayloadError):
            async with session.post(sim.url + path, json=body) as response:
                assert response.status == 200
                async for line in response.content:
                    if line.strip():
                        received.append(line)
    assert len(received) == 3
    assert sim.engine.stats()["aborted_total"] == 1


async def test_bad_fault_requests_are_refused(session: aiohttp.ClientSession) -> None:
    async with running_simulator(fast_config()) as sim:
        for bad in ({"no_such_fault": 1}, {"metrics_down": "yes"}, {"reject_all_with_status": 200}):
            async with session.post(sim.url + "/sim/faults", json=bad) as response:
                assert response.status == 400
        async with session.get(sim.url + "/sim/faults") as response:
            assert await response.json() == {
                "metrics_down": False,
                "stream_error_after_tokens": None,
                "stream_cut_after_tokens": None,
                "reject_all_with_status": None,
                "intake_delay_ms": None,
                "answer_delay_ms": None,
            }


async def test_stopping_the_simulator_cuts_open_streams(session: aiohttp.ClientSession) -> None:
    errors: list[BaseException] = []
    async with running_simulator(fast_config(max_num_seqs=1)) as sim:
        url = sim.url + "/v1/completions"

        async def consume(body: dict[str, object]) -> None:
            try:
                async with session.post(url, json=body) as response:
                    await response.read()
            except aiohttp.ClientError as exc:
                errors.append(exc)

        tasks = [
            asyncio.create_task(consume({"prompt": "a", "max_tokens": 5000, "stream": True})),
            asyncio.create_task(consume({"prompt": "b", "max_tokens": 5000})),
        ]
        await eventually(lambda: sim.engine.num_running == 1 and sim.engine.num_waiting == 1, what="both queued")
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)
    assert len(errors) == 2  # neither client mistakes the cut for a finished answer
    assert sim.engine.stats()["aborted_total"] == 2


async def test_restart_on_the_same_port(session: aiohttp.ClientSession) -> None:
    """An engine 'killed and restarted' comes back at the same URL with fresh state."""
    async with running_simulator(fast_config()) as first:
        port = first.port
        async with session.post(first.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as response:
            assert response.status == 200
    async with running_simulator(fast_config(), port=port) as second:
        assert second.url == f"http://127.0.0.1:{port}"
        async with session.post(second.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as response:
            assert response.status == 200
        assert (await stats(session, second.url))["completed_total"] == 1


async def test_a_client_gone_during_an_injected_intake_or_answer_delay(
    session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Leaving while the body waits to be read: the engine never gets the request. Leaving while its answer
    is held: the engine got it (journaled) and aborts it."""
    path = tmp_path / "journal.jsonl"
    body = {"prompt": "x", "max_tokens": 500, "stream": True}
    async with running_simulator(fast_config(journal=str(path))) as sim:
        for fault, request_id in (("intake_delay_ms", "in-transit"), ("answer_delay_ms", "unanswered")):
            await set_faults(session, sim.url, **{fault: 10_000})
            post = session.post(sim.url + "/v1/completions", json=body, headers={"X-Request-Id": request_id})
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await post
            await set_faults(session, sim.url, **{fault: None})
        await eventually(lambda: sim.engine.stats()["aborted_total"] == 1, what="the unanswered request aborted")
    events = [(line["event"], line.get("id")) for line in read_journal(path) if line["event"] != "boot"]
    assert {request_id for _, request_id in events} == {"unanswered"}  # the engine generates while it holds
    assert events[0][0] == "received" and events[-1][0] == "aborted"  # its answer, and then aborts
