"""The vLLM adapter asks a busy engine to send its streamed tokens in groups (vLLM's `stream_interval`),
sized from the engine's time per output token so the first token of a group waits at most the allowed
delay, and counts each group's tokens from the usage on every chunk: over real HTTP to the simulator."""

from __future__ import annotations

from backends import Finished, GenerationRequest, SamplingParams, TextDelta
from backends.adapters.vllm import MAX_CHUNK_TOKENS, VllmBackend, tokens_per_chunk
from backends.base import BackendSpec
from backends.sim import SimConfig, running_simulator


def test_a_group_is_as_long_as_the_allowed_delay_covers_tokens_after_its_first() -> None:
    assert tokens_per_chunk(0.0, 0.005) == 1  # no delay allowed
    assert tokens_per_chunk(0.02, None) == 1  # no current reading (an idle engine)
    assert tokens_per_chunk(0.02, 0.005) == 5  # the first of five waits for four more: 20 ms
    assert tokens_per_chunk(0.02, 0.03) == 1  # slower than the delay: one at a time
    assert tokens_per_chunk(1.0, 0.001) == MAX_CHUNK_TOKENS


async def stream(backend: VllmBackend, rid: str, tokens: int, delay: float) -> tuple[list[int], Finished]:
    request = GenerationRequest(
        request_id=rid,
        prompt="Hello world",
        params=SamplingParams(max_tokens=tokens, ignore_eos=True),
        max_token_delay=delay,
    )
    counts: list[int] = []
    finished = None
    async for event in backend.generate(request):
        if isinstance(event, TextDelta):
            counts.append(event.tokens)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return counts, finished


async def test_a_busy_engine_sends_groups_and_every_token_is_counted() -> None:
    async with running_simulator(SimConfig(decode_base_ms=4.0, decode_per_seq_ms=0.0)) as sim:
        backend = VllmBackend(BackendSpec(name="b", url=sim.url, engine_model="sim-model"))
        try:
            await backend.load()  # the baseline of the engine's inter-token histogram
            ungrouped, _ = await stream(backend, "warm", 40, delay=0.2)  # no reading yet: one a chunk
            load = await backend.load()  # now: about 4 ms a token
            grouped, finished = await stream(backend, "grouped", 100, delay=0.2)
        finally:
            await backend.aclose()
    assert load.tpot_seconds is not None and 0.003 < load.tpot_seconds < 0.2, load  # a slow machine: slower
    assert sum(ungrouped) == 40
    group = tokens_per_chunk(0.2, load.tpot_seconds)
    assert group > 1
    assert sum(grouped) == finished.completion_tokens == 100
    # the first token alone, then whole groups (two arriving together may be read as one), the rest last
    assert grouped[0] % group == 1 and all(n % group == 0 for n in grouped[1:-1]), grouped
    assert len(grouped) <= 2 + 99 // group < len(ungrouped), (grouped, ungrouped)
