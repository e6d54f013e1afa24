"""Past its first tokens, a long answer is read from its engine at most once per interval, so the tokens
that arrive in between leave in one message (server.stream_read_interval_seconds): over real gRPC and HTTP
against the simulator. The pacing grid is the event loop's own time, so lateness is measured on the wall
clock (the simulator's engine steps run on it too)."""

from __future__ import annotations

import time

import pytest

from backends.sim import SimConfig, running_simulator
from bench.scenarios.r1 import setups as r1_setups
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import Config, ServerConfig
from scheduler_svc.core.stream_pacing import NO_PACING, StreamPacing
from tests.helpers import (
    client_for,
    eventually,
    example_config,
    make_config,
    outcome_count,
    run_engine_config,
    serving,
    until_settled,
)
from tests.stream_events import event_or_end, next_event

FAST_ENGINE = SimConfig(decode_base_ms=2.0, decode_per_seq_ms=0.0)  # a token every 2 ms


def test_the_first_tokens_are_never_held_and_later_reads_meet_on_one_grid() -> None:
    pacing = StreamPacing(interval=0.02, after_tokens=4)
    assert pacing.delay(3, 10.005) == 0.0  # still among the first tokens
    assert NO_PACING.delay(10_000, 10.005) == 0.0
    # the engine may group the tokens of an answer that can run past the first ones, not of a short one
    assert pacing.engine_allowance(4) == 0.0 and pacing.engine_allowance(5) == 0.02
    # with engine grouping off the engine sends every token and only the reads here are paced
    assert StreamPacing(interval=0.02, after_tokens=4, group_at_engine=False).engine_allowance(5) == 0.0
    first, second = 10.005, 10.017  # two answers, read at different moments of one interval
    assert 0 < pacing.delay(4, first) <= 0.02 and 0 < pacing.delay(500, second) <= 0.02
    assert first + pacing.delay(4, first) == pytest.approx(second + pacing.delay(500, second))


async def _late_messages(config: Config, model: str, after: int, max_tokens: int) -> tuple[int, float]:
    """Stream one long answer through `config`: the messages that carried its tokens after the first
    `after`, and the seconds they took."""
    async with serving(config) as server, client_for(server) as client:
        call = client.stream(model, "a long story", max_tokens=max_tokens, ignore_eos=True)
        carried, late_messages, late_since = 0, 0, 0.0
        while (event := await event_or_end(call)) is not None:
            if not event.HasField("delta"):
                continue
            if carried >= after:
                late_messages += 1
            carried += event.delta.tokens
            if carried >= after and not late_since:
                late_since = time.monotonic()
        late_seconds = time.monotonic() - late_since
    assert carried == max_tokens
    return late_messages, late_seconds


@pytest.mark.parametrize("interval", [0.05, 0.0])
async def test_a_long_answer_leaves_in_one_message_per_interval_after_its_first_tokens(interval: float) -> None:
    after, max_tokens = 16, 300
    server_settings = {"stream_read_interval_seconds": interval, "stream_read_after_tokens": after}
    async with running_simulator(FAST_ENGINE) as sim:
        config = make_config(backend_url=sim.url, server=server_settings)
        late_messages, late_seconds = await _late_messages(config, "m", after, max_tokens)
    if interval:  # one read per tick of the grid, and one more for the end of the answer
        assert late_messages <= late_seconds / interval + 3, (late_messages, late_seconds)
    else:  # the control: read as the tokens arrive, many more messages than ticks of 50 ms would allow
        assert late_messages > late_seconds / 0.05 + 2, (late_messages, late_seconds)


async def test_make_run_on_a_cpu_engine_sends_long_answers_in_groups() -> None:
    """`make run ENGINE=vllm` puts the engine on the scheduler's own cores, where a cycle spent per token is
    the engine's: its config groups the tokens of long answers (what that config says it does)."""
    raw = run_engine_config("vllm")
    async with running_simulator(FAST_ENGINE) as sim:
        raw["server"].update(listen="127.0.0.1:0", metrics_listen="", http_listen="", log_level="warning")
        raw["models"][0]["backends"][0]["url"] = sim.url
        config = config_from_dict(raw)
        interval, after = config.server.stream_read_interval_seconds, config.server.stream_read_after_tokens
        assert interval > 0
        late_messages, late_seconds = await _late_messages(config, config.models[0].name, after, 600)
    assert late_messages <= late_seconds / interval + 3, (late_messages, late_seconds)


async def test_a_client_that_leaves_while_its_answer_is_held_aborts_the_engine_request() -> None:
    server_settings = {"stream_read_interval_seconds": 0.5, "stream_read_after_tokens": 1}
    async with (
        running_simulator(FAST_ENGINE) as sim,
        serving(make_config(backend_url=sim.url, server=server_settings)) as server,
        client_for(server) as client,
    ):
        call = client.stream("m", "a long story", max_tokens=2000, ignore_eos=True)
        while not (await next_event(call)).HasField("delta"):
            pass
        call.cancel()  # the run now waits up to half a second before its next read
        await eventually(lambda: sim.engine.stats()["aborted_total"] == 1, what="engine abort")
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        assert sim.engine.stats()["running"] == 0


def test_the_bench_the_example_config_and_make_run_ship_one_interval() -> None:
    """R1's scheduler setups run the shipped default in every layout, so its all-shared layout measures what
    `make run ENGINE=vllm` serves and its GPU-host layout what configs/example.toml does."""
    default = ServerConfig().stream_read_interval_seconds
    assert default > 0
    assert run_engine_config("vllm")["server"]["stream_read_interval_seconds"] == default
    assert example_config()["server"]["stream_read_interval_seconds"] == default
    assert r1_setups.SCHED.read_interval is None and r1_setups.SCHED_PACED.read_interval == default
    assert r1_setups.SCHED_EVERY_TOKEN.read_interval == 0.0
