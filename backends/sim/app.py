"""Putting a simulator together: the aiohttp application, and ways to run it.

`create_app` wires one engine, its metrics and faults to the flavour's routes. `running_simulator`
serves it on a real socket for tests; `serve_forever` is what `llmsched sim` runs. Both run aiohttp with
`handler_cancellation=True`, so a client that disconnects aborts its request at once. Stopping the server
aborts every request in the engine and cuts their connections, as a killed engine would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog
from aiohttp import web

from backends.sim.config import SimConfig
from backends.sim.control import ControlApi
from backends.sim.engine import SimEngine
from backends.sim.faults import Faults
from backends.sim.journal import Journal
from backends.sim.metrics import MetricsExporter, TgiMetrics, VllmMetrics
from backends.sim.tgi_api import TgiApi
from backends.sim.vllm_api import VllmApi

log = structlog.get_logger(__name__)

ENGINE_KEY = web.AppKey("sim_engine", SimEngine)
FAULTS_KEY = web.AppKey("sim_faults", Faults)


def create_app(config: SimConfig | None = None) -> web.Application:
    """The simulator as an aiohttp application; the engine starts and stops with the app."""
    config = config or SimConfig()
    app = web.Application()
    faults = Faults()
    journal = Journal(config.journal)  # opened here (a boot line) so a bad path fails at start-up
    metrics: MetricsExporter
    if config.flavor == "vllm":
        metrics = VllmMetrics(
            config.model_name,
            # the blocks a prefix can stay cached in: the prefix cache when modelled, else the KV cache
            cache_blocks=config.prefix_cache_blocks or config.kv_cache_blocks,
            block_size=config.kv_block_size,
            prefix_caching=config.prefix_cache_blocks > 0,
        )
        engine = SimEngine(config, metrics, journal=journal)
        VllmApi(config, engine, faults).add_routes(app)
    else:
        tgi_metrics = TgiMetrics()
        metrics = tgi_metrics
        engine = SimEngine(config, metrics, journal=journal)
        TgiApi(config, engine, faults, tgi_metrics).add_routes(app)
        # TGI's Messages API is OpenAI-compatible chat; the shapes are the ones the vLLM flavour serves.
        app.router.add_post("/v1/chat/completions", VllmApi(config, engine, faults).chat_completions)
    app.router.add_get("/health", _healthy)
    ControlApi(engine, faults, metrics, selecting_mount=config.flavor == "vllm").add_routes(app)
    app[ENGINE_KEY] = engine
    app[FAULTS_KEY] = faults
    app.on_startup.append(_start_engine)
    app.on_shutdown.append(_stop_engine)
    return app


async def _healthy(request: web.Request) -> web.Response:
    """`GET /health` as both engines answer it: 200 with an empty body."""
    return web.Response(status=200)


async def _start_engine(app: web.Application) -> None:
    app[ENGINE_KEY].start()


async def _stop_engine(app: web.Application) -> None:
    await app[ENGINE_KEY].aclose()
    app[ENGINE_KEY].journal.close()  # after aclose, so the shutdown aborts are journaled


@dataclass(frozen=True)
class SimServer:
    """A simulator listening on a socket."""

    url: str
    """Base URL, e.g. http://127.0.0.1:40123."""
    host: str
    """The address it listens on."""
    port: int
    """The port actually bound (useful with port 0)."""
    engine: SimEngine
    """The engine core, for in-process inspection."""
    faults: Faults
    """The live faults; the same object `POST /sim/faults` changes."""
    app: web.Application
    """The aiohttp application."""


@asynccontextmanager
async def running_simulator(
    config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[SimServer]:
    """Serve a simulator on `host:port` for the duration of the block (port 0: a free port)."""
    app = create_app(config)
    keep_alive = (config or SimConfig()).keep_alive_seconds
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0, keepalive_timeout=keep_alive
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        yield SimServer(
            url=f"http://{host}:{bound}",
            host=host,
            port=bound,
            engine=app[ENGINE_KEY],
            faults=app[FAULTS_KEY],
            app=app,
        )
    finally:
        await runner.cleanup()


async def serve_forever(config: SimConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run a simulator until cancelled (Ctrl-C in `llmsched sim`)."""
    async with running_simulator(config, host, port) as server:
        log.info(
            "sim.listening",
            url=server.url,
            flavor=config.flavor,
            model=config.model_name,
            max_num_seqs=config.max_num_seqs,
            scheduling_policy=config.scheduling_policy,
        )
        await asyncio.Event().wait()
