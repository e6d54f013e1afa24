"""What every HTTP engine adapter shares: construction, identity, the metrics scrape, closing.

An adapter subclasses `HttpAdapter`, sets its class-level facts (`CAPABILITIES`, `FORCE_CLOSE`), and
writes only what differs between engines: `generate` (the wire format) and `_parse` (the metric names).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from typing import ClassVar

from backends.base import BackendCapabilities, BackendLoad, BackendSpec, GenerationEvent, GenerationRequest
from backends.http import HttpEngine
from backends.metrics import MetricSamples, RateTracker


class HttpAdapter:
    """Base of the engine adapters (satisfies the `Backend` protocol once `generate`/`_parse` exist)."""

    CAPABILITIES: ClassVar[BackendCapabilities] = BackendCapabilities()
    FORCE_CLOSE: ClassVar[bool] = False  # never reuse connections (llama.cpp closes them after a response)
    METRICS: ClassVar[tuple[str, ...] | None] = None  # the sample names `_parse` reads; None: all
    # METRICS are exact sample names the engine selects itself (Prometheus `name[]`): see HttpEngine.scrape
    SELECT_METRICS_ON_SERVER: ClassVar[bool] = False

    def __init__(self, spec: BackendSpec) -> None:
        self._engine = HttpEngine(
            name=spec.name,
            url=spec.url,
            settings=spec.http,
            force_close=self.FORCE_CLOSE,
            select_metrics_on_server=self.SELECT_METRICS_ON_SERVER,
        )
        self._engine_model = spec.engine_model
        self._priority_scheduling = spec.priority_scheduling and self.CAPABILITIES.supports_priority
        self._tpot = RateTracker()
        self._capabilities = dataclasses.replace(self.CAPABILITIES, supports_priority=self._priority_scheduling)

    @property
    def name(self) -> str:
        return self._engine.name

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._capabilities

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        raise NotImplementedError

    async def load(self) -> BackendLoad:
        return await self._engine.scrape(self._parse, self.METRICS)

    def _parse(self, samples: MetricSamples, read_at: float) -> BackendLoad:
        raise NotImplementedError

    async def aclose(self) -> None:
        await self._engine.aclose()


def queue_counts(samples: MetricSamples, waiting: str, running: str, hint: str, **labels: str) -> tuple[int, int]:
    """The engine's waiting and running request counts from the samples called `waiting` and `running`;
    KeyError with `hint` (what is likely wrong with the engine) when either is not exposed."""
    waiting_now = samples.total(waiting, **labels)
    running_now = samples.total(running, **labels)
    if waiting_now is None or running_now is None:
        raise KeyError(f"{waiting} / {running} not exposed: {hint}")
    return int(waiting_now), int(running_now)
