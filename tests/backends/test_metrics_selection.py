"""The vLLM adapter asks the engine for its few samples (Prometheus `name[]` at `/metrics/`), and reads the
whole /metrics when an engine does not understand that: over real HTTP on loopback.

Why it matters: vLLM's front end spends 11-12 ms of CPU writing its 50 KB /metrics, and 1.3-1.9 ms for the
selected samples (CPU vLLM 0.32, bench/tools/scrape_cost.py: 0.15x), several times a second, in the process that
also streams every token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

from backends.adapters.vllm import VllmBackend
from backends.base import BackendSpec
from backends.metrics import MetricSamples
from backends.sim import SimConfig, running_simulator
from engines import free_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RECORDED = (Path(__file__).resolve().parents[1] / "engines" / "data" / "vllm_metrics.txt").read_text()


@asynccontextmanager
async def engine(routes: dict[str, Handler]) -> AsyncIterator[tuple[str, list[str]]]:
    """A stand-in engine serving `routes` (path -> handler); yields its URL and the paths asked, in order."""
    asked: list[str] = []

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        asked.append(request.path_qs)
        return await handler(request)

    app = web.Application(middlewares=[record])
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", asked
    finally:
        await runner.cleanup()


async def recorded(request: web.Request) -> web.Response:
    return web.Response(text=RECORDED, content_type="text/plain")


async def read_twice(url: str) -> tuple[VllmBackend, list[float | None]]:
    backend = VllmBackend(BackendSpec(name="b", url=url, engine_model="tiny-llama"))
    try:
        loads = [await backend.load(), await backend.load()]
    finally:
        await backend.aclose()
    assert all(load.ok for load in loads), loads
    return backend, [load.waiting for load in loads]


async def test_the_simulator_selects_and_the_adapter_reads_the_same_load_as_from_everything() -> None:
    async with running_simulator(SimConfig(model_name="tiny-llama")) as sim:
        backend = VllmBackend(BackendSpec(name="b", url=sim.url, engine_model="tiny-llama"))
        try:
            selected = await backend.load()
            async with aiohttp.ClientSession() as session, session.get(sim.url + "/metrics") as response:
                whole = await response.text()
            full = backend._parse(MetricSamples.parse(whole, VllmBackend.METRICS), selected.read_at)
        finally:
            await backend.aclose()
    assert backend._engine.metrics_selected_on_server is True
    assert selected == full


async def test_an_engine_without_the_mount_is_read_whole_at_once_and_from_then_on() -> None:
    async with engine({"/metrics": recorded}) as (url, asked):
        backend, waiting = await read_twice(url)
    assert waiting == [8, 8]  # the recording's gauge: the first scrape already answered
    assert backend._engine.metrics_selected_on_server is False
    assert asked[0].startswith("/metrics/?name") and asked[1:] == ["/metrics", "/metrics"]


async def test_a_mount_that_ignores_the_selection_or_lacks_the_samples_is_given_up() -> None:
    async def other_app(request: web.Request) -> web.Response:
        return web.Response(text="# another exporter\nup 1\n", content_type="text/plain")

    async with engine({"/metrics": recorded, "/metrics/": other_app}) as (url, asked):
        backend, waiting = await read_twice(url)
    assert waiting == [8, 8] and backend._engine.metrics_selected_on_server is False
    assert [path.split("?")[0] for path in asked] == ["/metrics/", "/metrics", "/metrics"]


async def test_an_engine_in_trouble_is_not_taken_for_one_without_the_mount() -> None:
    """A 503 from the selecting path is the engine's trouble: the reading fails, and the selection is tried
    again next time (it is not given up on a failure that says nothing about it)."""
    down = {"on": True}

    async def selecting(request: web.Request) -> web.Response:
        if down["on"]:
            return web.Response(status=503, text="metrics unavailable")
        names = tuple(request.query.getall("name[]"))
        return web.Response(text="\n".join(line for line in RECORDED.splitlines() if line.startswith(names)) + "\n")

    async with engine({"/metrics": recorded, "/metrics/": selecting}) as (url, asked):
        backend = VllmBackend(BackendSpec(name="b", url=url, engine_model="tiny-llama"))
        try:
            failed = await backend.load()
            assert not failed.ok and failed.error == "HTTP 503"
            assert backend._engine.metrics_selected_on_server is None
            down["on"] = False
            load = await backend.load()
        finally:
            await backend.aclose()
    assert load.ok and load.waiting == 8 and backend._engine.metrics_selected_on_server is True
    assert [path.split("?")[0] for path in asked] == ["/metrics/", "/metrics/"]


async def test_an_unreachable_engine_is_not_taken_for_one_without_the_mount() -> None:
    backend = VllmBackend(BackendSpec(name="b", url=f"http://127.0.0.1:{free_port()}", engine_model="tiny-llama"))
    try:
        load = await backend.load()
    finally:
        await backend.aclose()
    assert not load.ok and backend._engine.metrics_selected_on_server is None


async def test_the_bench_probe_selects_its_series_and_reads_an_engine_without_the_mount_whole() -> None:
    """bench/probe.py (S2's engine sampler) asks for its three series the same way, and gives the selection
    up on a 404: the recorded vLLM text read whole gives the same figures."""
    from bench.clients import RunClock
    from bench.probe import EngineProbe

    async with engine({"/metrics": recorded}) as (url, asked), aiohttp.ClientSession() as session:
        probe = EngineProbe(session, url, RunClock())
        whole = [await probe.read(), await probe.read()]
    assert [path.split("?")[0] for path in asked] == ["/metrics/", "/metrics", "/metrics"]
    expected = MetricSamples.parse(RECORDED)
    for sample in whole:
        assert sample is not None
        assert (sample.waiting, sample.running) == (
            expected.total("vllm:num_requests_waiting"),
            expected.total("vllm:num_requests_running"),
        )
        assert sample.generated == expected.total("vllm:generation_tokens_total")

    async with running_simulator(SimConfig()) as sim, aiohttp.ClientSession() as session:
        body = {"model": "sim-model", "prompt": "hi", "max_tokens": 5, "ignore_eos": True}
        async with session.post(sim.url + "/v1/completions", json=body) as response:
            assert response.status == 200
        probe = EngineProbe(session, sim.url, RunClock())
        selected = await probe.read()
        assert probe.selects_on_server is True and selected is not None
        assert (selected.waiting, selected.running, selected.generated) == (0.0, 0.0, 5.0)
