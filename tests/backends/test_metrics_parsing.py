"""The adapters read real engines' /metrics, recorded from vLLM 0.32 and llama-server under load."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.adapters.llamacpp import LlamaCppBackend
from backends.adapters.vllm import VllmBackend, cache_tokens
from backends.base import BackendSpec
from backends.metrics import MetricSamples

DATA = Path(__file__).resolve().parents[1] / "engines" / "data"
RECORDED_BLOCKS = 4096  # num_gpu_blocks in the recording (blocks of 128 tokens)


@pytest.mark.parametrize(
    ("adapter", "model", "recording", "waiting", "running"),
    [
        (VllmBackend, "tiny-llama", "vllm_metrics.txt", 8, 4),
        (LlamaCppBackend, "tiny-llama-gguf", "llamacpp_metrics.txt", 8, 4),
    ],
)
def test_adapters_read_recorded_engine_metrics_and_the_filtered_parse_agrees(
    adapter: type[VllmBackend] | type[LlamaCppBackend], model: str, recording: str, waiting: int, running: int
) -> None:
    text = (DATA / recording).read_text()
    backend = adapter(BackendSpec(name="b", url="http://127.0.0.1:1", engine_model=model))
    load = backend._parse(MetricSamples.parse(text, adapter.METRICS), 1.0)
    assert (load.ok, load.waiting, load.running) == (True, waiting, running)
    full, filtered = MetricSamples.parse(text), MetricSamples.parse(text, adapter.METRICS)
    for name, samples in filtered.by_name.items():
        assert full.by_name[name] == samples
    assert len(filtered.by_name) < len(full.by_name)


def test_vllm_cache_size_comes_from_its_cache_config_info_labels() -> None:
    """num_gpu_blocks x block_size of the recorded engine; an engine still profiling ("None") or without the
    info gauge says nothing; of several engines, the smallest cache counts."""
    recorded = MetricSamples.parse((DATA / "vllm_metrics.txt").read_text(), VllmBackend.METRICS)
    assert cache_tokens(recorded) == RECORDED_BLOCKS * 128

    def info(*engines: tuple[str, str]) -> MetricSamples:
        lines = [
            f'vllm:cache_config_info{{block_size="{size}",engine="{i}",num_gpu_blocks="{blocks}"}} 1.0'
            for i, (blocks, size) in enumerate(engines)
        ]
        return MetricSamples.parse("\n".join(lines) + "\n")

    assert cache_tokens(info(("None", "16"))) is None
    assert cache_tokens(MetricSamples.parse("vllm:num_requests_waiting 0\n")) is None
    assert cache_tokens(info(("100", "16"), ("50", "32"))) == 1600
