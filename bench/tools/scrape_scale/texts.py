"""What each kind of engine answers the scrape tool: recorded texts (vLLM, llama-server), the simulator's TGI
exporter, and vLLM's `name[]` selection as its prometheus-client app writes it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench.product import HttpAdapter, LlamaCppBackend, SimConfig, TgiBackend, VllmBackend, running_simulator

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "engines" / "data"
KINDS = ("vllm", "vllm_whole", "llamacpp", "tgi")
ADAPTERS: dict[str, type[HttpAdapter]] = {
    "vllm": VllmBackend,
    "vllm_whole": VllmBackend,
    "llamacpp": LlamaCppBackend,
    "tgi": TgiBackend,
}
ENGINE_MODEL = {"vllm": "tiny-llama", "vllm_whole": "tiny-llama", "llamacpp": "tiny-llama-gguf", "tgi": "sim-model"}
ADAPTER_KIND = {"vllm": "vllm", "vllm_whole": "vllm", "llamacpp": "llamacpp", "tgi": "tgi"}


class _Replayed:
    """A collector writing parsed families again: what prometheus-client's exposition app serves."""

    def __init__(self, text: str) -> None:
        self.families: list[Metric] = list(text_string_to_metric_families(text))

    def collect(self) -> list[Metric]:
        return self.families


def selected_text(text: str, names: Sequence[str]) -> str:
    """What vLLM's prometheus-client app answers to `name[]=...`: the samples so called, with their comments."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Replayed(text))
    return generate_latest(registry.restricted_registry(names)).decode()


async def tgi_text() -> str:
    """The simulator's TGI exporter text after a few requests (TGI writes counters without `_total` and
    35-bucket histograms, none of which a recording here shows)."""
    config = SimConfig(flavor="tgi", decode_base_ms=1.0, decode_per_seq_ms=0.1)
    async with running_simulator(config) as sim, aiohttp.ClientSession() as session:
        for n in range(5):
            body = {"inputs": f"request {n}", "parameters": {"max_new_tokens": 8}}
            async with session.post(sim.url + "/generate_stream", json=body) as response:
                await response.read()
        async with session.get(sim.url + "/metrics") as response:
            return await response.text()


async def engine_texts() -> dict[str, str]:
    """Each kind's whole /metrics text."""
    vllm = (DATA / "vllm_metrics.txt").read_text()
    return {
        "vllm": vllm,
        "vllm_whole": vllm,
        "llamacpp": (DATA / "llamacpp_metrics.txt").read_text(),
        "tgi": await tgi_text(),
    }


def text_read(kind: str, texts: dict[str, str]) -> str:
    """The text the adapter reads at each scrape of `kind`."""
    names = ADAPTERS[kind].METRICS
    return selected_text(texts[kind], names) if kind == "vllm" and names else texts[kind]
