"""The adapters read real engines' /metrics, recorded from vLLM 0.32 and llama-server under load."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends._prom import MetricSamples
from backends.llamacpp import LlamaCppBackend
from backends.vllm import VllmBackend

DATA = Path(__file__).resolve().parents[1] / "engines" / "data"


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
    backend = adapter(name="b", url="http://127.0.0.1:1", engine_model=model)
    load = backend._parse(MetricSamples.parse(text, adapter.METRICS), 1.0)
    assert (load.ok, load.waiting, load.running) == (True, waiting, running)
    full, filtered = MetricSamples.parse(text), MetricSamples.parse(text, adapter.METRICS)
    for name, samples in filtered.by_name.items():
        assert full.by_name[name] == samples
    assert len(filtered.by_name) < len(full.by_name)
