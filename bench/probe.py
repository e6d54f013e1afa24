"""Samples the engine's own Prometheus gauges during a run: queue length, batch size, tokens generated.

The same vLLM metric names are served by the simulator and the real vLLM, so one probe serves both. The
series feed the "engine queue and batch over time" plot; exact reads at window edges feed throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import aiohttp

from bench.clients import RunClock
from bench.product import MetricSamples, MetricsReader, MetricsStatus

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
GENERATED = "vllm:generation_tokens_total"
NAMES = (WAITING, RUNNING, GENERATED)


@dataclass
class EngineSample:
    t: float
    waiting: float
    running: float
    generated: float


@dataclass
class EngineProbe:
    """Reads `url/metrics` every `interval` seconds while running (a bounded background task).

    It asks for its three series only (`name[]` at `/metrics/`, through the adapters' own
    `MetricsReader`): the whole text costs vLLM's front end about 12 ms of CPU a read, every 0.1 s, beside
    the work measured. An engine without that mount (404/405) is read whole from then on."""

    session: aiohttp.ClientSession
    url: str
    clock: RunClock
    interval: float = 0.1
    samples: list[EngineSample] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _reader: MetricsReader = field(init=False)

    def __post_init__(self) -> None:
        self._reader = MetricsReader(self.url + "/metrics", select_on_server=True)

    @property
    def selects_on_server(self) -> bool | None:
        """Whether the engine answered the `name[]` selection (None: not read yet)."""
        return self._reader.selected_on_server

    async def read(self, timeout: float = 2.0) -> EngineSample | None:
        """One reading now; None if the engine did not answer within `timeout` seconds (per try), answered
        with a status other than 200, or with text that does not parse."""

        def sample(samples: MetricSamples) -> EngineSample:
            if samples.total(RUNNING) is None and self._reader.selected_on_server is not False:
                raise KeyError(RUNNING)  # a selection without the engine's series: read whole (the reader's rule)
            return EngineSample(
                t=self.clock.now(),
                waiting=samples.total(WAITING) or 0.0,
                running=samples.total(RUNNING) or 0.0,
                generated=samples.total(GENERATED) or 0.0,
            )

        try:
            return await self._reader.read(self.session, NAMES, sample, aiohttp.ClientTimeout(total=timeout))
        except (aiohttp.ClientError, TimeoutError, MetricsStatus, KeyError, ValueError):
            return None

    async def generated_tokens(self) -> tuple[float, float]:
        """(run time, engine output tokens so far), read now; raises if the engine does not answer.

        Retried, because a busy machine can delay one answer by seconds; the time is taken when the answer
        is read, so a slow answer shifts the window a little but does not bias the rate.
        """
        for _ in range(3):
            sample = await self.read(timeout=5.0)
            if sample is not None:
                return sample.t, sample.generated
        raise RuntimeError(f"engine at {self.url} did not answer /metrics three times in a row")

    def mean_running(self, start: float, end: float) -> float | None:
        """Mean batch size the samples saw in [start, end): how full the engine was kept."""
        seen = [s.running for s in self.samples if start <= s.t < end]
        return sum(seen) / len(seen) if seen else None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            sample = await self.read()
            if sample is not None:
                self.samples.append(sample)
            # a fixed period (a slow read eats into the wait, ticks it overran are skipped), not a synchronisation
            due = max(due + self.interval, loop.time())
            await asyncio.sleep(due - loop.time())

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until the engine has nothing waiting or running (a reused engine between runs)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            sample = await self.read()
            if sample is not None and sample.waiting == 0 and sample.running == 0:
                return True
            await asyncio.sleep(0.2)  # polling another process's gauges: no event to wait on
        return False
