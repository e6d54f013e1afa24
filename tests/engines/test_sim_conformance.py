"""The simulator's vLLM flavour against the REAL vLLM, side by side.

Both engines get the same requests; the tests compare structure, never values that legitimately differ
(ids, timestamps, token text, fingerprints, error messages):

- endpoints: `/health`, `/v1/models`, `/v1/completions` and `/v1/chat/completions` (status, content type);
- the metrics the scheduler reads: family names, types, label names per sample, histogram buckets;
- the SSE chunk sequence: the kind of each chunk (role, token, finish, usage, error, [DONE]) with its key sets
  at top level, per choice, in the chat delta and in usage;
- error bodies (status and JSON key structure).

The real engine is the session fixture `vllm_engine` (vLLM CPU, fcfs, 4 sequences, max_model_len 1024); the
simulator runs in-process with the same served name and limits. Token runs are collapsed before comparing,
because a busy vLLM may merge several tokens into one chunk.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.adapters.vllm import VllmBackend
from backends.base import BackendSpec
from backends.sim import SimConfig, SimServer, running_simulator
from engines import EngineProcess
from engines.wire import sse_data

pytestmark = pytest.mark.engines

MAX_TOKENS = 12
PROMPT = "Tell me a story about the sea"
MESSAGES = [{"role": "user", "content": "Tell me a story about the sea"}]

# What backends/vllm.py reads, plus the request-level series next to it (parser names: counters lose `_total`).
METRICS = {
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:generation_tokens": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:request_success": "counter",
}

# A difference kept on purpose: the non-streamed `usage` object. Real vLLM adds `prompt_tokens_details` and
# `completion_tokens_details` (both null); the simulator's own tests pin the three counts, and the scheduler
# only streams, so the simulator leaves them out.
_NON_STREAMED_USAGE_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens"}


@dataclass(frozen=True)
class Reply:
    """One HTTP answer, read to the end."""

    status: int
    content_type: str
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


@dataclass(frozen=True)
class Pair:
    """The same endpoint on both engines."""

    real: str
    sim: str
    model: str


@pytest.fixture
async def pair(vllm_engine: EngineProcess) -> AsyncIterator[Pair]:
    """The real vLLM and a simulator with the same served name and limits."""
    config = SimConfig(model_name=vllm_engine.served_model_name, max_num_seqs=4, max_model_len=1024)
    server: SimServer
    async with running_simulator(config) as server:
        yield Pair(real=vllm_engine.url, sim=server.url, model=vllm_engine.served_model_name)


async def call(method: str, url: str, body: dict[str, Any] | None = None) -> Reply:
    """One request on a fresh connection (no keep-alive surprises between two servers)."""
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=120)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        session.request(method, url, json=body) as response,
    ):
        return Reply(response.status, response.headers.get("Content-Type", ""), await response.text())


async def both(pair: Pair, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[Reply, Reply]:
    """The same request to the real engine, then to the simulator."""
    return await call(method, pair.real + path, body), await call(method, pair.sim + path, body)


def structure(value: Any) -> Any:
    """Keys all the way down; lists by their first element; every scalar (null included) is a leaf."""
    if isinstance(value, dict):
        return {key: structure(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [structure(value[0])] if value else []
    return "leaf"


def media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


# SSE chunk shapes


def chunk_shape(payload: str) -> tuple[Any, ...]:
    """(kind, top-level keys, choice keys, delta keys, usage keys) of one `data:` payload."""
    if payload == "[DONE]":
        return ("done",)
    chunk = json.loads(payload)
    top = tuple(sorted(chunk))
    if "error" in chunk:
        return ("error", top, tuple(sorted(chunk["error"])))
    usage = chunk.get("usage")
    usage_keys = tuple(sorted(usage)) if isinstance(usage, dict) else None
    choices = chunk["choices"]
    if not choices:
        return ("usage", top, (), (), usage_keys)
    (choice,) = choices
    delta = choice.get("delta")
    if isinstance(delta, dict) and "role" in delta:
        kind = "role"
    elif choice.get("finish_reason") is not None:
        kind = "finish"
    else:
        kind = "token"
    delta_keys = tuple(sorted(delta)) if isinstance(delta, dict) else ()
    return (kind, top, tuple(sorted(choice)), delta_keys, usage_keys)


def stream_shape(reply: Reply) -> list[tuple[Any, ...]]:
    """The chunk shapes in order, each run of equal shapes collapsed to one (vLLM may merge tokens)."""
    out: list[tuple[Any, ...]] = []
    for payload in sse_data(reply.text):
        shape = chunk_shape(payload)
        if not out or out[-1] != shape:
            out.append(shape)
    return out


def raw_blocks_are_data_lines(text: str) -> bool:
    """Every SSE event is exactly one `data: ...` line."""
    blocks = [b for b in text.replace("\r\n", "\n").split("\n\n") if b.strip()]
    return all(len(b.split("\n")) == 1 and b.startswith("data: ") for b in blocks)


def generation_body(kind: str, model: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.0}
    if kind == "completions":
        body["prompt"] = PROMPT
    else:
        body["messages"] = MESSAGES
    body.update(extra)
    return body


# 1. Endpoints


async def test_health(pair: Pair) -> None:
    real, sim = await both(pair, "GET", "/health")
    assert (sim.status, sim.text) == (real.status, real.text) == (200, "")


async def test_models(pair: Pair) -> None:
    real, sim = await both(pair, "GET", "/v1/models")
    assert sim.status == real.status == 200
    assert media_type(sim.content_type) == media_type(real.content_type)
    assert structure(sim.json()) == structure(real.json())
    assert [m["id"] for m in sim.json()["data"]] == [m["id"] for m in real.json()["data"]] == [pair.model]
    for field in ("object", "owned_by", "max_model_len"):
        assert sim.json()["data"][0][field] == real.json()["data"][0][field], field


@pytest.mark.parametrize("kind", ["completions", "chat/completions"])
async def test_streaming_endpoint_status_and_content_type(pair: Pair, kind: str) -> None:
    body = generation_body(kind, pair.model, stream=True)
    real, sim = await both(pair, "POST", f"/v1/{kind}", body)
    assert real.status == 200, real.text
    assert sim.status == real.status
    assert sim.content_type == real.content_type
    assert raw_blocks_are_data_lines(real.text) and raw_blocks_are_data_lines(sim.text)


@pytest.mark.parametrize("kind", ["completions", "chat/completions"])
async def test_non_streamed_response_shape(pair: Pair, kind: str) -> None:
    real, sim = await both(pair, "POST", f"/v1/{kind}", generation_body(kind, pair.model))
    assert real.status == 200, real.text
    assert sim.status == real.status
    assert media_type(sim.content_type) == media_type(real.content_type)
    real_body, sim_body = real.json(), sim.json()
    assert set(real_body["usage"]) >= _NON_STREAMED_USAGE_KEYS == set(sim_body["usage"])
    real_body.pop("usage")
    sim_body.pop("usage")
    assert structure(sim_body) == structure(real_body)
    assert sim.json()["usage"]["completion_tokens"] == real.json()["usage"]["completion_tokens"] == MAX_TOKENS


# 2. Metrics


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample_labels(family: Any) -> set[tuple[str, frozenset[str]]]:
    """(sample name, label names) for every sample of a family."""
    return {(s.name, frozenset(s.labels)) for s in family.samples}


def bucket_bounds(family: Any) -> list[str]:
    return sorted({s.labels["le"] for s in family.samples if s.name.endswith("_bucket")}, key=float)


async def test_metric_names_types_and_labels(pair: Pair) -> None:
    # Traffic first, so that every histogram and counter has been touched on both sides.
    for kind in ("completions", "chat/completions"):
        real, sim = await both(pair, "POST", f"/v1/{kind}", generation_body(kind, pair.model))
        assert real.status == sim.status == 200, (real.text, sim.text)
    real_metrics, sim_metrics = await both(pair, "GET", "/metrics")
    assert real_metrics.status == sim_metrics.status == 200
    assert media_type(sim_metrics.content_type) == media_type(real_metrics.content_type) == "text/plain"
    real_families, sim_families = families(real_metrics.text), families(sim_metrics.text)

    for name, metric_type in METRICS.items():
        assert name in real_families, f"real vLLM does not export {name}"
        assert name in sim_families, f"simulator does not export {name}"
        real_family, sim_family = real_families[name], sim_families[name]
        assert (sim_family.type, real_family.type) == (metric_type, metric_type), name
        assert sample_labels(sim_family) == sample_labels(real_family), name
        for sample in (*real_family.samples, *sim_family.samples):
            assert sample.labels["model_name"] == pair.model and sample.labels["engine"] == "0", sample
        if metric_type == "histogram":
            assert bucket_bounds(sim_family) == bucket_bounds(real_family), name

    itl = "vllm:inter_token_latency_seconds"
    assert "0.15" in bucket_bounds(real_families[itl]) and "0.15" in bucket_bounds(sim_families[itl])
    reasons = "vllm:request_success"
    assert {s.labels["finished_reason"] for s in sim_families[reasons].samples} == {
        s.labels["finished_reason"] for s in real_families[reasons].samples
    }

    # Nothing invented: every vllm:* family the simulator exports exists in vLLM with the same type and labels.
    for name, sim_family in sim_families.items():
        if not name.startswith("vllm:"):
            continue
        assert name in real_families, f"simulator exports {name}, real vLLM does not"
        assert sim_family.type == real_families[name].type, name
        assert {labels for _, labels in sample_labels(sim_family)} <= {
            labels for _, labels in sample_labels(real_families[name])
        }, name


def sample_names(text: str) -> set[str]:
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


async def test_metric_selection_by_name_under_the_metrics_mount(pair: Pair) -> None:
    """What the vLLM adapter scrapes: Prometheus' `name[]` selection at `/metrics/` (prometheus-client's
    exposition app, mounted there) answers only the samples asked for, on both engines; the bare `/metrics`
    route ignores the selection on both. The adapter, against the real engine, reads its load that way."""
    query = "?" + "&".join(f"name[]={name}" for name in VllmBackend.METRICS)
    real, sim = await both(pair, "GET", "/metrics/" + query)
    assert real.status == sim.status == 200, (real.text[:200], sim.text[:200])
    assert sample_names(real.text) == sample_names(sim.text)
    assert sample_names(real.text) <= set(VllmBackend.METRICS)
    assert {"vllm:num_requests_waiting", "vllm:inter_token_latency_seconds_count"} <= sample_names(real.text)
    real_bare, sim_bare = await both(pair, "GET", "/metrics" + query)
    assert sample_names(real_bare.text) > set(sample_names(real.text))
    assert sample_names(sim_bare.text) > set(sample_names(sim.text))

    backend = VllmBackend(BackendSpec(name="real", url=pair.real, engine_model=pair.model))
    try:
        load = await backend.load()
    finally:
        await backend.aclose()
    assert load.ok and load.waiting == 0 and load.running == 0, load
    assert backend._engine.metrics_selected_on_server is True


# 3. SSE chunk shapes


def _expected_kinds(kind: str, include_usage: bool) -> list[str]:
    kinds = ["role"] if kind == "chat/completions" else []
    kinds += ["token", "finish"]
    kinds += ["usage"] if include_usage else []
    return [*kinds, "done"]


@pytest.mark.parametrize("include_usage", [True, False], ids=["usage", "no_usage"])
@pytest.mark.parametrize("kind", ["completions", "chat/completions"])
async def test_sse_chunk_shapes(pair: Pair, kind: str, include_usage: bool) -> None:
    extra: dict[str, Any] = {"stream": True}
    if include_usage:
        extra["stream_options"] = {"include_usage": True}
    real, sim = await both(pair, "POST", f"/v1/{kind}", generation_body(kind, pair.model, **extra))
    assert real.status == sim.status == 200, (real.text, sim.text)
    real_shape, sim_shape = stream_shape(real), stream_shape(sim)
    assert [s[0] for s in real_shape] == _expected_kinds(kind, include_usage), real_shape
    assert sim_shape == real_shape

    for reply in (real, sim):
        chunks = [json.loads(p) for p in sse_data(reply.text)[:-1]]
        finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
        assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "length"
    # As in vLLM, the last token's text rides in the finish chunk: one text-carrying chunk per token (the
    # simulator never merges tokens, a busy vLLM may, so this is checked on the simulator only).
    sim_chunks = [json.loads(p) for p in sse_data(sim.text)[:-1]]
    texts = [
        c["choices"][0]["text"] if "text" in c["choices"][0] else c["choices"][0]["delta"]["content"]
        for c in sim_chunks
        if c["choices"] and "role" not in c["choices"][0].get("delta", {})
    ]
    assert len(texts) == MAX_TOKENS and all(texts), texts
    if include_usage:
        for reply in (real, sim):
            usage_chunk = json.loads(sse_data(reply.text)[-2])
            assert usage_chunk["usage"]["completion_tokens"] == MAX_TOKENS


@pytest.mark.parametrize("kind", ["completions", "chat/completions"])
async def test_stream_interval_groups_tokens_like_vllm(pair: Pair, kind: str) -> None:
    """What the vLLM adapter asks a busy engine for (`stream_interval` with `continuous_usage_stats`): the
    first token alone, then groups of that many, the rest with the finish, and the usage so far on every
    chunk; the same chunk shapes and token counts on both. An interval under 1 is refused alike."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = generation_body(kind, pair.model, stream=True, max_tokens=11, stream_interval=4, stream_options=options)
    real, sim = await both(pair, "POST", f"/v1/{kind}", body)
    assert real.status == sim.status == 200, (real.text, sim.text)
    carried = []
    for reply in (real, sim):
        chunks = [json.loads(p) for p in sse_data(reply.text)[:-1]]
        text_chunks = [c for c in chunks if c["choices"] and "role" not in c["choices"][0].get("delta", {})]
        carried.append([c["usage"]["completion_tokens"] for c in text_chunks])
    assert carried[0] == carried[1] == [1, 5, 9, 11], carried
    assert stream_shape(sim) == stream_shape(real)
    bad_real, bad_sim = await both(pair, "POST", f"/v1/{kind}", {**body, "stream_interval": 0})
    assert bad_real.status == bad_sim.status == 400, (bad_real.text, bad_sim.text)


# 3b. Error bodies


def _error_cases(model: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    yield "unknown model", "completions", generation_body("completions", "no-such-model")
    yield "unknown model (chat)", "chat/completions", generation_body("chat/completions", "no-such-model")
    yield "unknown model (stream)", "completions", generation_body("completions", "no-such-model", stream=True)
    yield "missing prompt", "completions", {"model": model, "max_tokens": 4}
    yield "max_tokens too large", "completions", generation_body("completions", model, max_tokens=5000)


@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in _error_cases("m")])
async def test_error_bodies(pair: Pair, case: int) -> None:
    _, kind, body = list(_error_cases(pair.model))[case]
    real, sim = await both(pair, "POST", f"/v1/{kind}", body)
    assert real.status >= 400, real.text
    assert sim.status == real.status
    assert media_type(sim.content_type) == media_type(real.content_type) == "application/json"
    assert structure(sim.json()) == structure(real.json())
    assert sim.json()["error"]["type"] == real.json()["error"]["type"]
    assert sim.json()["error"]["code"] == real.json()["error"]["code"] == real.status


async def test_priority_under_fcfs(pair: Pair) -> None:
    """vLLM 0.32 with `--scheduling-policy fcfs` accepts a non-zero priority and ignores it."""
    body = generation_body("completions", pair.model, priority=5)
    real, sim = await both(pair, "POST", "/v1/completions", body)
    assert sim.status == real.status, (real.text, sim.text)
    assert real.status == 200, real.text
    real_body, sim_body = real.json(), sim.json()
    real_body.pop("usage")
    sim_body.pop("usage")
    assert structure(sim_body) == structure(real_body)

    streamed = generation_body("completions", pair.model, priority=5, stream=True)
    real, sim = await both(pair, "POST", "/v1/completions", streamed)
    assert sim.status == real.status
    assert stream_shape(sim) == stream_shape(real)
