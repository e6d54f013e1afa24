"""The finished Python client (`AsyncClient` and `Client`) against a live scheduler over a real socket: the
event-order contract, retries that honour RetryInfo and never follow a token, deadline propagation, and
cancellation, for the asyncio and the blocking variant alike (the blocking one runs in a worker thread). The
client waits out RetryInfo's delays on real time against the live service, so those waits are timed on the
wall clock."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from backends.base import Accepted, BackendLoad, GenerationEvent, GenerationRequest, TextDelta
from backends.base import Finished as EngineFinished
from backends.errors import BackendUnavailable
from backends.fake import FakeBackend
from backends.sim import SimConfig, running_simulator
from clients import (
    NO_RETRY,
    AsyncClient,
    Client,
    DeadlineExceededError,
    Delta,
    Dispatched,
    Event,
    Finished,
    Queued,
    ResourceExhaustedError,
    RetryAttempt,
    RetryPolicy,
    UnavailableError,
)
from scheduler_svc.app.cli import _QueueLine
from scheduler_svc.app.server import SchedulerServer
from tests.helpers import (
    ControlledEngine,
    client_for,
    eventually,
    make_config,
    outcome_count,
    queue_depth,
    serving,
    until_settled,
)
from tests.stream_events import next_event

FAST = SimConfig(decode_base_ms=2.0, decode_per_seq_ms=0.5)


def check_event_order(events: list[Event]) -> None:
    """Queued first, Queued only while waiting, Dispatched once per wait, Deltas, Finished last and once."""
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "Queued" and kinds[-1] == "Finished", kinds
    assert kinds.count("Finished") == 1
    first_delta = kinds.index("Delta") if "Delta" in kinds else len(kinds) - 1
    before, after = kinds[:first_delta], kinds[first_delta:-1]
    assert set(after) <= {"Delta"}, kinds
    assert before[-1] == "Dispatched", kinds
    for i, kind in enumerate(before):  # every Dispatched ends one wait (a failover or retry waits again)
        if kind == "Dispatched":
            assert before[i - 1] == "Queued", kinds


def _sync_client(server: SchedulerServer, **kwargs: Any) -> Client:
    return Client(server.address, **{"user": "alice", **kwargs})


def _async_client(server: SchedulerServer, **kwargs: Any) -> AsyncClient:
    return AsyncClient(server.address, **{"user": "alice", **kwargs})


async def test_stream_follows_the_event_order_contract_async_and_sync() -> None:
    async with (
        running_simulator(FAST) as sim,
        serving(make_config(backend_url=sim.url)) as server,
        _async_client(server) as client,
    ):
        events = [e async for e in client.stream("m", "hello", max_tokens=6, ignore_eos=True)]

        def sync_run() -> list[Event]:
            with _sync_client(server) as sync_client:
                return list(sync_client.stream("m", "hello", max_tokens=6, ignore_eos=True))

        sync_events = await asyncio.to_thread(sync_run)
        completion = await client.submit("m", "hi", max_tokens=4, ignore_eos=True)
        sync_completion = await asyncio.to_thread(
            lambda: _sync_client(server).submit("m", "hi", max_tokens=4, ignore_eos=True)
        )
    for run in (events, sync_events):
        check_event_order(run)
        assert isinstance(run[0], Queued) and run[0].position == 1 and run[0].request_id
        dispatched = [e for e in run if isinstance(e, Dispatched)]
        assert len(dispatched) == 1 and dispatched[0].backend == "b0"
        finished = run[-1]
        assert isinstance(finished, Finished) and finished.completion_tokens == 6
        assert sum(e.tokens for e in run if isinstance(e, Delta)) == 6
        assert finished.timings.time_to_first_token is not None
        accepted = finished.timings.engine_accept  # the simulator answers over real HTTP
        assert accepted is not None and 0 <= accepted <= finished.timings.time_to_first_token
    for done in (completion, sync_completion):
        assert done.completion_tokens == 4 and done.backend == "b0" and done.finish_reason == "length"


async def _held_queue(server: SchedulerServer, engine: ControlledEngine) -> Any:
    """Close the gate (the engine reports a deep queue) and park one request of alice's in the queue."""
    engine.waiting = 10
    estimator = server.scheduler.dispatchers["m"].backends[0].estimator

    def closed() -> bool:
        return estimator.reading is not None and estimator.reading.waiting == 10

    await eventually(closed, what="a reading of the deep engine queue")
    raw = client_for(server)
    call = raw.stream("m", "parked")
    assert (await next_event(call)).HasField("queued")
    return raw, call


@pytest.mark.parametrize("variant", ["async", "sync"])
async def test_queue_full_is_retried_after_the_retry_info_delay(variant: str) -> None:
    engine = ControlledEngine(auto_release=True)
    config = make_config(models=[{"name": "m", "max_queued_per_user": 1, "backends": [_backend()]}])
    async with serving(config, engine.factory()) as server:
        raw, parked = await _held_queue(server, engine)
        loop = asyncio.get_running_loop()
        retries: list[tuple[float, RetryAttempt]] = []

        def on_retry(attempt: RetryAttempt) -> None:
            retries.append((time.monotonic(), attempt))

            def make_room() -> None:  # the parked request leaves and the gate opens: the retry fits
                parked.cancel()
                engine.waiting = 0

            loop.call_soon_threadsafe(make_room)

        if variant == "async":
            async with _async_client(server, on_retry=on_retry) as client:
                done = await client.submit("m", "retried")
        else:
            done = await asyncio.to_thread(lambda: _sync_client(server, on_retry=on_retry).submit("m", "retried"))
        finished_at = time.monotonic()
        await raw.close()
    assert done.completion_tokens == engine.tokens
    assert len(retries) == 1
    refused_at, attempt = retries[0]
    error = attempt.error
    assert isinstance(error, ResourceExhaustedError) and error.reason == "QUEUE_FULL"
    assert error.retry_delay is not None and error.retry_delay > 0
    assert error.retry_delay <= attempt.delay <= error.retry_delay * 1.2 + 1e-9  # honoured, jitter on top
    assert finished_at - refused_at >= error.retry_delay  # it did wait before sending again
    assert attempt.attempt == 2


def _backend() -> dict[str, Any]:
    return {"name": "b0", "kind": "vllm", "url": "http://127.0.0.1:1", "scrape_interval_seconds": 0.05}


def _flaky_engine(fail_after_tokens: int, failures: int) -> tuple[FakeBackend, list[GenerationRequest]]:
    """An engine that drops its first `failures` generations after `fail_after_tokens` tokens."""
    seen: list[GenerationRequest] = []

    async def generate(request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        seen.append(request)
        yield Accepted()  # the engine took it (the client hears `dispatched`), then drops it
        for i in range(fail_after_tokens if len(seen) <= failures else 3):
            yield TextDelta(f"t{i}")
        if len(seen) <= failures:
            raise BackendUnavailable("connection dropped", backend="b0")
        yield EngineFinished("length", prompt_tokens=2, completion_tokens=3)

    return FakeBackend(generate, lambda: BackendLoad(ok=True, read_at=time.monotonic()), name="b0"), seen


def _no_failover_config() -> Any:
    model = {"name": "m", "failover_attempts": 0, "failover_cooldown_seconds": 0.0, "backends": [_backend()]}
    return make_config(models=[model])


@pytest.mark.parametrize("variant", ["async", "sync"])
async def test_a_stream_is_retried_before_its_first_token_and_never_after(variant: str) -> None:
    fast = RetryPolicy(initial_backoff=0.01)

    async def run(engine: FakeBackend) -> tuple[list[Event], BaseException | None]:
        async with serving(_no_failover_config(), lambda model, backend: engine) as server:
            events: list[Event] = []
            if variant == "async":
                async with _async_client(server, retry=fast) as client:
                    try:
                        async for event in client.stream("m", "x"):
                            events.append(event)
                    except UnavailableError as exc:
                        return events, exc
                return events, None

            def sync_run() -> tuple[list[Event], BaseException | None]:
                try:
                    for event in _sync_client(server, retry=fast).stream("m", "x"):
                        events.append(event)
                except UnavailableError as exc:
                    return events, exc
                return events, None

            return await asyncio.to_thread(sync_run)

    # dropped before any token, once: the client sends it again and the stream goes on as after a failover
    engine, seen = _flaky_engine(fail_after_tokens=0, failures=1)
    events, error = await run(engine)
    assert error is None and len(seen) == 2
    check_event_order(events)
    assert sum(isinstance(e, Dispatched) for e in events) == 2
    # dropped after a token: retryable by the table, but the request produced tokens, so never sent again
    engine, seen = _flaky_engine(fail_after_tokens=1, failures=1)
    events, error = await run(engine)
    assert isinstance(error, UnavailableError) and error.reason == "BACKEND_UNAVAILABLE" and error.retryable
    assert len(seen) == 1 and any(isinstance(e, Delta) for e in events)


@pytest.mark.parametrize("variant", ["async", "sync"])
async def test_the_deadline_reaches_the_server_and_a_retry_never_extends_it(variant: str) -> None:
    engine = ControlledEngine(auto_release=True)
    config = make_config(models=[{"name": "m", "max_queued_per_user": 1, "backends": [_backend()]}])
    async with serving(config, engine.factory()) as server:
        raw, parked = await _held_queue(server, engine)
        loop = asyncio.get_running_loop()

        def submit(timeout: float, retry: RetryPolicy | None = None, on_retry: Any = None) -> float:
            """Submit with `timeout`; the seconds until it failed with DeadlineExceededError."""
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError):
                if variant == "sync":
                    _sync_client(server, retry=retry, on_retry=on_retry).submit("m", "late", timeout=timeout)
                else:
                    asyncio.run_coroutine_threadsafe(_async_submit(server, timeout, retry, on_retry), loop).result()
            return time.monotonic() - started

        # the call's deadline becomes the request's: it expires in the queue, at the deadline
        parked.cancel()
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        elapsed = await asyncio.to_thread(submit, 0.5, NO_RETRY)
        await until_settled(server, lambda: outcome_count(server, "expired") == 1)
        assert 0.5 <= elapsed < 2.0
        # QUEUE_FULL asks for ~1 s, the deadline has 0.5 s left: no retry, the real error at once
        raw2 = client_for(server)
        parked2 = raw2.stream("m", "parked again")
        assert (await next_event(parked2)).HasField("queued")

        def too_short() -> None:
            started = time.monotonic()
            client_kwargs: dict[str, Any] = {"on_retry": lambda a: pytest.fail("retried past the deadline")}
            with pytest.raises(ResourceExhaustedError) as err:
                if variant == "sync":
                    _sync_client(server, **client_kwargs).submit("m", "no room", timeout=0.5)
                else:
                    asyncio.run_coroutine_threadsafe(
                        _async_submit(server, 0.5, None, client_kwargs["on_retry"]), loop
                    ).result()
            assert err.value.retry_delay is not None and err.value.retry_delay > 0.5
            assert time.monotonic() - started < err.value.retry_delay

        await asyncio.to_thread(too_short)

        # a retry gets what is left of the deadline: refused, retried after ~1 s, then it expires in the
        # queue at the original deadline (3 s), not at a fresh one (the retry's start + 3 s)
        retried_at: list[float] = []  # when the retry is sent: on_retry hears of it before its wait

        def make_room(attempt: RetryAttempt) -> None:
            retried_at.append(time.monotonic() + attempt.delay)
            loop.call_soon_threadsafe(parked2.cancel)  # room in the queue, the gate stays closed

        first_sent = time.monotonic()
        elapsed = await asyncio.to_thread(submit, 3.0, None, make_room)
        assert len(retried_at) == 1
        assert 3.0 <= elapsed < (retried_at[0] - first_sent) + 3.0
        await until_settled(server, lambda: outcome_count(server, "expired") == 2)
        await raw.close()
        await raw2.close()


async def _async_submit(server: SchedulerServer, timeout: float, retry: RetryPolicy | None, on_retry: Any) -> None:
    async with _async_client(server, retry=retry, on_retry=on_retry) as client:
        await client.submit("m", "late", timeout=timeout)


@pytest.mark.parametrize("variant", ["async", "sync"])
async def test_cancel_aborts_the_request_in_the_engine_and_ends_the_stream(variant: str) -> None:
    async with (
        running_simulator(SimConfig(decode_base_ms=10.0)) as sim,
        serving(make_config(backend_url=sim.url)) as server,
    ):
        if variant == "async":
            async with _async_client(server) as client:
                stream = client.stream("m", "a long story", max_tokens=2000, ignore_eos=True)
                seen = []
                async for event in stream:
                    seen.append(event)
                    if isinstance(event, Delta):
                        assert sim.engine.stats()["running"] == 1
                        stream.cancel()
        else:

            def sync_run() -> list[Event]:
                stream = _sync_client(server).stream("m", "a long story", max_tokens=2000, ignore_eos=True)
                seen = []
                for event in stream:  # the iteration simply ends after cancel()
                    seen.append(event)
                    if isinstance(event, Delta):
                        stream.cancel()
                return seen

            seen = await asyncio.to_thread(sync_run)
        await eventually(lambda: sim.engine.stats()["aborted_total"] == 1, what="engine abort")
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        assert not any(isinstance(e, Finished) for e in seen)
        assert sim.engine.stats()["running"] == 0


async def test_cli_stream_shows_the_live_queue_position_while_waiting() -> None:
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(), engine.factory()) as server:
        raw, parked = await _held_queue(server, engine)  # alice's first request waits at position 1
        cli = [sys.executable, "-m", "scheduler_svc.app.cli", "stream", "--target", server.address]
        process = await asyncio.create_subprocess_exec(
            *cli, "--model", "m", "--user", "alice", "Hi", stdout=PIPE, stderr=PIPE, env=_env()
        )
        await eventually(lambda: queue_depth(server, "alice") == 2, what="the CLI's request queued second")
        parked.cancel()  # it moves up to position 1
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        engine.waiting = 0  # and goes
        out, err = await asyncio.wait_for(process.communicate(), 60)
        await raw.close()
    assert process.returncode == 0, err.decode()
    lines = err.decode().splitlines()
    queued = [line for line in lines if line.startswith("[queued: position")]
    assert queued[0].startswith("[queued: position 2,") and queued[-1].startswith("[queued: position 1,")
    assert "\r" not in err.decode()  # not a terminal: plain lines, nothing rewritten
    assert "[dispatched to b0]" in lines and "hello t1 t2" in out.decode()


def test_the_queue_line_is_rewritten_in_place_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    line = _QueueLine(terminal)
    line.show(Queued("r", 3, 40, "interactive", 2.1))
    line.show(Queued("r", 2, 39, "interactive", None))
    line.clear()
    assert terminal.getvalue() == (
        "\r\x1b[K[queued: position 3, 40 queued for the model, about 2.1s to go]"
        "\r\x1b[K[queued: position 2, 39 queued for the model]\r\x1b[K"
    )


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
