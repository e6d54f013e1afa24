"""Helpers for the simulator tests: fast configs, SSE and metrics parsing, bounded polling."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from backends.sim import SimConfig

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def fast_config(**overrides: Any) -> SimConfig:
    """A config whose steps take a few milliseconds, so tests stay short on a busy 2-core machine."""
    values: dict[str, Any] = {"decode_base_ms": 2.0, "decode_per_seq_ms": 0.5, "prefill_per_token_ms": 0.0}
    values.update(overrides)
    return SimConfig(**values)


async def sse_lines(response: aiohttp.ClientResponse) -> list[str]:
    """The non-empty lines of an SSE body, exactly as sent (prefix included)."""
    lines = []
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line:
            lines.append(line)
    return lines


def sse_payloads(lines: list[str]) -> list[str]:
    """The `data:` payloads of SSE lines, with the optional space after the colon removed."""
    return [line[5:].removeprefix(" ") for line in lines if line.startswith("data:")]


async def scrape(session: aiohttp.ClientSession, base_url: str) -> Samples:
    """Every sample of `GET /metrics`, keyed by (name, sorted labels)."""
    async with session.get(base_url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; vLLM series get their constant labels added."""
    if name.startswith("vllm:"):
        labels = {"model_name": "sim-model", "engine": "0", **labels}
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"no sample {key}; have {sorted(k for k in samples if k[0] == name)}"
    return samples[key]


async def stats(session: aiohttp.ClientSession, base_url: str) -> dict[str, Any]:
    """`GET /sim/stats`."""
    async with session.get(base_url + "/sim/stats") as response:
        assert response.status == 200
        result: dict[str, Any] = await response.json()
        return result
