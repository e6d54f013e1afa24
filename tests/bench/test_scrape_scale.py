"""bench.tools.scrape_scale compares like with like: every kind's endpoint answers as its engine does, and both
parsers read the same load from what it answers."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from backends.base import BackendSpec
from backends.metrics import MetricSamples
from bench.tools.scrape_scale import measuring, serving
from bench.tools.scrape_scale import texts as engines


async def test_every_kind_reads_the_same_load_with_the_former_parse_and_the_scan() -> None:
    texts = await engines.engine_texts()
    for kind in engines.KINDS:
        adapter = engines.ADAPTERS[kind]
        backend = adapter(BackendSpec(name="b", url="http://127.0.0.1:1", engine_model=engines.ENGINE_MODEL[kind]))
        text, names = engines.text_read(kind, texts), adapter.METRICS
        before = backend._parse(measuring.prometheus_client_parse(text, names), 1.0)
        assert backend._parse(MetricSamples.parse(text, names), 1.0) == before
        assert before.ok and before.running == (0 if kind == "tgi" else 4), (kind, before)  # recorded under load


async def test_the_vllm_endpoint_selects_by_name_and_the_whole_one_does_not() -> None:
    texts = await engines.engine_texts()
    served = {}
    for kind in ("vllm", "vllm_whole"):
        runner = web.AppRunner(serving.metrics_app(kind, texts[kind]))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics/"
        try:
            async with aiohttp.ClientSession() as session:
                query = [("name[]", "vllm:num_requests_waiting"), ("name[]", "vllm:num_requests_running")]
                async with session.get(url, params=query) as response:
                    served[kind] = (response.status, await response.text())
        finally:
            await runner.cleanup()
    status, text = served["vllm"]
    samples = MetricSamples.parse(text)
    assert status == 200 and set(samples.by_name) == {"vllm:num_requests_waiting", "vllm:num_requests_running"}
    assert samples.total("vllm:num_requests_waiting") == 8.0 and "# TYPE vllm:num_requests_running gauge" in text
    assert served["vllm_whole"][0] == 404
