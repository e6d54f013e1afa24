"""llm-scheduler in front of REAL engines (vLLM on CPU, llama.cpp's server), over gRPC.

Each test starts the scheduler on a free port pointed at a session engine from conftest.py and checks
what the simulator can only imitate: streaming and unary generation, the gate holding the engine's own
waiting queue at the target, scenario S1, a batch class held to its running limits, cancellation reaching
the engine, an engine dying mid-stream, and vLLM's priority scheduling following the priorities the
scheduler sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
import pytest

from backends.metrics import MetricSamples
from clients import pb
from engines import EngineProcess, layout
from tests.helpers import client_for, eventually, make_config, outcome_count, serving, until_settled
from tests.stream_events import event_or_end

pytestmark = pytest.mark.engines

WAITING = {"vllm": "vllm:num_requests_waiting", "llamacpp": "llamacpp:requests_deferred"}
RUNNING = {"vllm": "vllm:num_requests_running", "llamacpp": "llamacpp:requests_processing"}
GENERATED = {"vllm": "vllm:generation_tokens_total", "llamacpp": "llamacpp:tokens_predicted_total"}
# one class without a TPOT limit: CPU engines are slow per token, the waiting queue is what is tested
ONE_CLASS = {"classes": [{"name": "interactive", "rank": 0}], "default_class": "interactive"}
# How long a test waits for the engine's own gauges to show a load it keeps outstanding: generous, for a
# cold engine on a busy 2-core machine (passing runs see it within seconds).
ENGINE_SHOWS_TIMEOUT = 120.0


@pytest.fixture(params=["vllm", "llamacpp"])
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, EngineProcess]]:
    kind = request.param
    yield kind, request.getfixturevalue(f"{kind}_engine")


def scheduler_config(
    kind: str, eng: EngineProcess, waiting_target: int = 2, scheduling: dict[str, Any] | None = None, **backend: Any
) -> Any:
    models = [
        {
            "name": "m",
            "max_tokens_limit": 1000,
            "gate": {"waiting_target": waiting_target, "stale_after_seconds": 2.0},
            "backends": [
                {"name": f"{kind}-0", "kind": kind, "url": eng.url, "engine_model": eng.served_model_name,
                 "scrape_interval_seconds": 0.1, "max_num_seqs": 4, **backend},
            ],
        }
    ]  # fmt: skip
    return make_config(models=models, scheduling=scheduling or ONE_CLASS)


async def engine_gauge(eng: EngineProcess, name: str) -> float:
    """One gauge of the engine's own /metrics (a busy CPU engine may take seconds to answer)."""
    return MetricSamples.parse(await eng.ametrics_text(timeout=30.0, names=(name,)), (name,)).total(name) or 0.0


async def engine_idle(eng: EngineProcess, kind: str) -> None:
    """Wait until the engine's own gauges show nothing running or waiting (cancelled requests take a step
    or two to leave it), so the next test starts on an idle engine."""
    deadline = time.monotonic() + ENGINE_SHOWS_TIMEOUT
    while True:
        text = MetricSamples.parse(
            await eng.ametrics_text(timeout=ENGINE_SHOWS_TIMEOUT, names=(WAITING[kind], RUNNING[kind]))
        )
        gauges = (text.total(WAITING[kind]) or 0.0, text.total(RUNNING[kind]) or 0.0)
        if gauges == (0.0, 0.0):
            return
        assert time.monotonic() < deadline, f"the engine still shows {gauges} (waiting, running)"
        await asyncio.sleep(0.1)  # sampling another process's gauges: no event to wait on


async def first_delta(call: grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]) -> float:
    """Read events until the first generated text; returns the time it arrived."""
    while True:
        event = await event_or_end(call)
        assert event is not None, "stream ended before a token"
        if event.HasField("delta"):
            return time.monotonic()


async def test_stream_and_submit_through_the_scheduler(engine: tuple[str, EngineProcess]) -> None:
    kind, eng = engine
    async with serving(scheduler_config(kind, eng)) as server, client_for(server) as client:
        response = await client.submit("m", "Once upon a time", max_tokens=12, ignore_eos=True)
        kinds, text = [], []
        async for event in client.stream("m", messages=[("user", "Tell me a story")], max_tokens=8, ignore_eos=True):
            kinds.append(event.WhichOneof("event"))
            if event.HasField("delta"):
                text.append(event.delta.text)
            if event.HasField("finished"):
                finished = event.finished
    assert response.usage.completion_tokens == 12 and response.text
    assert response.backend == f"{kind}-0" and response.usage.prompt_tokens > 0
    assert kinds[0] == "queued" and "dispatched" in kinds and kinds[-1] == "finished"
    assert "".join(text) and finished.usage.completion_tokens == 8


def _outcomes(tasks: Sequence[asyncio.Task[Any]]) -> dict[str, int]:
    """How the done tasks of a load ended: "ok" or the exception's type, counted (failure diagnostics)."""
    ended = [t for t in tasks if t.done() and not t.cancelled()]
    return dict(Counter("ok" if t.exception() is None else type(t.exception()).__name__ for t in ended))


class EngineSampler:
    """Reads the engine's own waiting and running gauges, one /metrics answer after the other, in the
    background; `until` waits (on each new sample, not a sleep) for a sample that shows a condition."""

    def __init__(self, eng: EngineProcess, kind: str) -> None:
        self._eng = eng
        self._kind = kind
        self.samples: list[tuple[float, float, float]] = []  # (seconds since start, waiting, running)
        self.generated: list[float] = []  # the engine's generated-tokens counter at each sample (diagnostics)
        self._new = asyncio.Condition()
        self._t0 = time.monotonic()
        self._cpu0 = self._cpu_seconds()
        self._task: asyncio.Task[None] | None = None

    def _cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds the engine's front end (its main process) and everything below it have used so far."""
        pid = self._eng.pid
        if pid is None:  # not started: nothing to count (pid 0's descendants would be every process)
            return 0.0, 0.0
        return layout.cpu_seconds(pid), sum(layout.cpu_seconds(child) for child in layout.descendants(pid))

    def cpu_used(self) -> str:
        """Cores the front end and the rest of the engine used on average since the sampler began (failure
        diagnostics: a front end starved by its own compute reads its outputs late)."""
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        now = self._cpu_seconds()
        front, rest = ((b - a) / elapsed for a, b in zip(self._cpu0, now, strict=True))
        return f"front end {front:.2f} cores, engine core and worker {rest:.2f} cores"

    async def __aenter__(self) -> EngineSampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        while True:
            names = (WAITING[self._kind], RUNNING[self._kind], GENERATED[self._kind])
            text = MetricSamples.parse(await self._eng.ametrics_text(timeout=30.0, names=names), names)
            sample = (
                round(time.monotonic() - self._t0, 2),
                text.total(WAITING[self._kind]) or 0.0,
                text.total(RUNNING[self._kind]) or 0.0,
            )
            async with self._new:
                self.generated.append(text.total(GENERATED[self._kind]) or 0.0)
                self.samples.append(sample)
                self._new.notify_all()
            await asyncio.sleep(0.05)  # sampling another process's gauges: no event to wait on

    async def until(self, shows: Callable[[float, float], bool], load: Sequence[asyncio.Task[Any]], what: str) -> None:
        """Wait for a sample where `shows(waiting, running)`, failing if `load` ends before one does."""
        async with asyncio.timeout(ENGINE_SHOWS_TIMEOUT), self._new:
            while not any(shows(w, r) for _, w, r in self.samples):
                assert self._task is not None and not self._task.done(), "the sampler died"
                assert not all(t.done() for t in load), (
                    f"the load ended before the engine showed {what}: {self.samples}; its generated-tokens "
                    f"counter at those samples {self.generated}; the load's outcomes {_outcomes(load)}; CPU: "
                    f"{self.cpu_used()}"
                )
                await self._new.wait()


async def test_gate_holds_the_engine_queue_at_the_target_and_s1_latecomer_goes_first(
    engine: tuple[str, EngineProcess],
) -> None:
    """The engine's own gauges show it full (4 running) and its queue never past the target, and a
    latecomer sent once the flood is under way starts ahead of most of it.

    The full engine is waited for while the flood is outstanding (a cold engine takes seconds to show
    anything, and a busy one answers /metrics late); every sample, however many, must keep the target."""
    kind, eng = engine
    target, flood_size, tokens = 2, 32, 96  # long enough to drain that one request is a small part of it
    async with (
        serving(scheduler_config(kind, eng, waiting_target=target)) as server,
        client_for(server, user="flood") as flood,
        client_for(server, user="late") as late,
        EngineSampler(eng, kind) as sampler,
    ):
        calls = [
            asyncio.create_task(flood.submit("m", f"flood {i}", max_tokens=tokens, ignore_eos=True))
            for i in range(flood_size)
        ]
        await sampler.until(lambda waiting, running: running >= 4, calls, "its 4 slots full")
        await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
        sent = time.monotonic()
        call = late.stream("m", "a quick question", max_tokens=4, ignore_eos=True)
        latecomer_ttft = await first_delta(call) - sent
        flood_left = sum(not c.done() for c in calls)
        await asyncio.gather(*calls)
        drained = time.monotonic() - sent
        call.cancel()
        samples = list(sampler.samples)
    max_waiting = max(w for _, w, _ in samples)
    assert max_waiting <= target, f"engine queue exceeded the target {target}: {samples}"
    assert flood_left >= flood_size // 2, f"latecomer waited for most of the flood ({flood_left} left)"
    assert latecomer_ttft < drained / 2, (latecomer_ttft, drained)


async def test_batch_runs_small_while_interactive_is_around_and_fills_up_after(
    engine: tuple[str, EngineProcess],
) -> None:
    """The contended limit on the engine's own running gauge: 1 batch request while interactive was active
    within the window, up to 3 of the 4 slots after it.

    Every sample must keep to the limit of its phase; the phases' evidence is waited for, not hoped for:
    the window is long enough for several samples even when a busy engine answers /metrics in seconds,
    and after it the test reads the gauge until the engine shows 3 running, while batch work is still
    queued (long requests: a cold engine cannot drain them first), then cancels the rest."""
    kind, eng = engine
    window = 10.0  # a busy CPU engine answers /metrics in up to ~2 s: room for several samples
    scheduling = {
        "default_class": "interactive",
        "classes": [
            {"name": "interactive", "rank": 0},
            {
                "name": "batch",
                "rank": 1,
                "max_engine_running": 3,
                "max_engine_running_when_contended": 1,
                "contention_window_seconds": window,
            },
        ],
    }
    async with serving(scheduler_config(kind, eng, scheduling=scheduling)) as server, client_for(server) as client:
        await client.submit("m", "a quick question", max_tokens=4, ignore_eos=True)
        quiet_since = time.monotonic()  # interactive is done: batch is contended until the window passes
        calls = [
            asyncio.create_task(
                client.submit("m", f"batch {i}", max_tokens=900, ignore_eos=True, priority_class="batch")
            )
            for i in range(24)
        ]
        contended: list[float] = []  # the engine's own running gauge, before the window passes
        after: list[float] = []  # and after it, until the engine shows the class's limit
        try:
            async with asyncio.timeout(window + ENGINE_SHOWS_TIMEOUT):
                while not after or max(after) < 3:
                    assert not all(c.done() for c in calls), f"the batch ended first: {contended}, {after}"
                    running = await engine_gauge(eng, RUNNING[kind])
                    since = time.monotonic() - quiet_since
                    if since < window - 0.5:
                        contended.append(running)
                    elif since > window + 0.5:
                        after.append(running)
                    await asyncio.sleep(0.05)  # sampling another process's gauge: no event to wait on
        finally:
            for c in calls:
                c.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
        await engine_idle(eng, kind)
    assert len(contended) >= 3 and max(contended) <= 1, contended
    assert max(after) == 3, after  # fills up, and never past the class's own limit


async def test_client_cancel_aborts_the_request_inside_the_engine(engine: tuple[str, EngineProcess]) -> None:
    kind, eng = engine
    max_tokens = 990  # near the longest answer the engines' 1,024-token context (a slot's) leaves room for
    async with serving(scheduler_config(kind, eng)) as server, client_for(server) as client:
        generated_before = await engine_gauge(eng, GENERATED[kind])
        call = client.stream("m", "A very long story", max_tokens=max_tokens, ignore_eos=True)
        await first_delta(call)  # the engine is generating it
        # Cancelled at once: alone on the engine the tiny model writes the whole answer in a few seconds, and
        # a scrape of the engine's whole /metrics in between (CI once: all 900 tokens written) could
        # outlast that on a loaded machine.
        call.cancel()
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        running: list[float] = [1.0]

        async def poll() -> None:
            running.append(await engine_gauge(eng, RUNNING[kind]))

        deadline = time.monotonic() + 20
        while running[-1] != 0 and time.monotonic() < deadline:
            await poll()
            await asyncio.sleep(0.05)  # sampling another process's metrics
        generated = await engine_gauge(eng, GENERATED[kind]) - generated_before
    assert running[-1] == 0, "the engine kept running the cancelled request"
    assert generated < max_tokens, f"the engine generated {generated} tokens: the request was not aborted"


async def test_engine_killed_mid_stream_gives_unavailable_then_service_resumes(
    engine: tuple[str, EngineProcess],
) -> None:
    kind, eng = engine
    async with serving(scheduler_config(kind, eng)) as server, client_for(server) as client:
        call = client.stream("m", "doomed", max_tokens=900, ignore_eos=True)
        await first_delta(call)
        eng.kill()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while await event_or_end(call) is not None:
                pass
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        await eng.arestart()
        response = await client.submit("m", "back again", max_tokens=5, ignore_eos=True)
        assert response.usage.completion_tokens == 5
        assert outcome_count(server, "failed") == 1


async def test_vllm_priority_scheduling_follows_the_priorities_the_scheduler_sends(
    vllm_priority_engine: EngineProcess,
) -> None:
    eng = vllm_priority_engine
    config = scheduler_config("vllm", eng, waiting_target=12, priority_scheduling=True)
    async with (
        serving(config) as server,
        client_for(server, user="flood") as flood,
        client_for(server, user="late") as late,
    ):
        first_token: dict[str, float] = {}

        async def flood_one(i: int) -> None:
            call = flood.stream("m", f"flood {i}", max_tokens=128, ignore_eos=True, request_id=f"flood-{i}")
            first_token[f"flood-{i}"] = await first_delta(call)
            while await event_or_end(call) is not None:
                pass

        flood_size = 24  # 4 slots: when the first 4 run, 20 wait (12 inside the engine, the rest here)
        calls = [asyncio.create_task(flood_one(i)) for i in range(flood_size)]
        await eventually(lambda: len(first_token) >= 4, timeout=120, what="the flood running")
        dispatched_before = [
            rid for rid in (f"flood-{i}" for i in range(flood_size)) if rid not in first_token
        ]  # flood requests already at the engine or queued, not yet started
        call = late.stream("m", "me first", max_tokens=4, ignore_eos=True)
        late_first = await first_delta(call)
        await asyncio.gather(*calls)
        call.cancel()
    overtaken = [rid for rid in dispatched_before if first_token[rid] > late_first]
    # vLLM's FCFS would have served every one of them first; with priorities the latecomer
    # (priority 0) goes ahead of the flood's requests that carry 1, 2, 3... for the user's in-flight ones.
    assert len(overtaken) >= 4, f"the latecomer overtook only {len(overtaken)} waiting flood requests"
