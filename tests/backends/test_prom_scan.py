"""The adapters' reading of a few named series gives prometheus-client's numbers: on every recorded engine
text, on the simulator's TGI text, and on generated texts with escapes, comments, NaN/Inf, timestamps,
exemplars, histograms, counter renames and names given inside the braces."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from backends import GenerationRequest, SamplingParams
from backends._prom_scan import Samples, samples_named, whole_text_samples
from backends.adapters.llamacpp import LlamaCppBackend
from backends.adapters.tgi import TgiBackend
from backends.adapters.vllm import VllmBackend
from backends.base import BackendSpec
from backends.metrics import MetricSamples
from backends.sim import SimConfig, running_simulator

DATA = Path(__file__).resolve().parents[1] / "engines" / "data"
RECORDED = sorted(DATA.glob("*_metrics*.txt"))
ADAPTER_NAMES = (VllmBackend.METRICS, LlamaCppBackend.METRICS, TgiBackend.METRICS)


def exact(samples: Samples) -> dict[str, list[tuple[dict[str, str], str]]]:
    """Samples with each value as float.hex: NaN equals NaN, and -0.0 differs from 0.0."""
    return {name: [(labels, value.hex()) for labels, value in found] for name, found in samples.items()}


def reference(text: str, names: tuple[str, ...]) -> Samples:
    """prometheus-client's parse of the whole text, kept to `names`."""
    return {name: found for name, found in whole_text_samples(text).items() if name in names}


def assert_same(text: str, names: tuple[str, ...]) -> None:
    assert exact(samples_named(text, names)) == exact(reference(text, names))


class Replayed:
    """A collector that writes parsed families again (what vLLM's prometheus-client app serves)."""

    def __init__(self, text: str) -> None:
        self.families: list[Metric] = list(text_string_to_metric_families(text))

    def collect(self) -> list[Metric]:
        return self.families


def selected_text(text: str, names: tuple[str, ...]) -> str:
    """What a prometheus-client exposition app answers to `name[]=...` for `names`, from recorded text."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(Replayed(text))
    return generate_latest(registry.restricted_registry(names)).decode()


@pytest.mark.parametrize("recording", RECORDED, ids=lambda path: path.name)
def test_every_recorded_text_reads_as_prometheus_client_reads_it(recording: Path) -> None:
    text = recording.read_text()
    every_name = tuple(whole_text_samples(text))
    for names in (*ADAPTER_NAMES, every_name, *((name,) for name in every_name)):
        assert_same(text, names)
    assert_same(selected_text(text, VllmBackend.METRICS), VllmBackend.METRICS)


def test_the_adapters_read_the_same_load_as_with_prometheus_clients_parse() -> None:
    for adapter, model, recording in (
        (VllmBackend, "tiny-llama", "vllm_metrics.txt"),
        (LlamaCppBackend, "tiny-llama-gguf", "llamacpp_metrics.txt"),
    ):
        text = (DATA / recording).read_text()
        names = adapter.METRICS
        assert names is not None
        backend = adapter(BackendSpec(name="b", url="http://127.0.0.1:1", engine_model=model))
        assert backend._parse(MetricSamples.parse(text, names), 1.0) == backend._parse(
            MetricSamples(reference(text, names)), 1.0
        )


async def test_the_simulators_tgi_text_reads_as_prometheus_client_reads_it() -> None:
    """TGI's exporter writes counters without `_total` (prometheus-client renames them) and 35-bucket
    histograms; no real TGI recording exists here, so the simulator's imitation stands in."""
    async with running_simulator(SimConfig(flavor="tgi", decode_base_ms=1.0, decode_per_seq_ms=0.1)) as sim:
        backend = TgiBackend(BackendSpec(name="b", url=sim.url, engine_model="sim-model"))
        try:
            request = GenerationRequest(request_id="r", prompt="hi", params=SamplingParams(max_tokens=3))
            await asyncio.wait_for(_drain(backend, request), 10)
            async with aiohttp.ClientSession() as session, session.get(sim.url + "/metrics") as response:
                text = await response.text()
        finally:
            await backend.aclose()
    assert TgiBackend.METRICS is not None
    assert "\ntgi_request_count 1\n" in text
    every_name = tuple(whole_text_samples(text))
    assert "tgi_request_count_total" in every_name  # the rename the scan must follow
    for names in (TgiBackend.METRICS, every_name, ("tgi_request_count_total", "tgi_queue_size")):
        assert_same(text, names)
    assert samples_named(text, TgiBackend.METRICS)["tgi_request_mean_time_per_token_duration_count"] == [({}, 1.0)]


async def _drain(backend: TgiBackend, request: GenerationRequest) -> None:
    async for _ in backend.generate(request):
        pass


def test_a_counter_without_total_is_renamed_as_prometheus_client_renames_it() -> None:
    text = "# TYPE jobs counter\njobs 5\n# TYPE up gauge\nup 1\n"
    assert samples_named(text, ("jobs_total", "jobs", "up")) == {"jobs_total": [({}, 5.0)], "up": [({}, 1.0)]}


def test_a_family_typed_a_counter_again_has_all_its_samples_renamed() -> None:
    """prometheus-client keeps one family across TYPE lines of one name and renames all of a counter's
    samples: a histogram's bucket becomes `..._bucket_total`."""
    text = '# TYPE h histogram\nh_bucket{le="1"} 2\nh_sum 3\n# TYPE h counter\nh 4\nup 1\n'
    assert samples_named(text, ("h_bucket", "h_sum_total", "h_total", "up")) == {
        "h_sum_total": [({}, 3.0)],
        "h_total": [({}, 4.0)],
        "up": [({}, 1.0)],
    }
    assert_same(text, ("h_bucket", "h_bucket_total", "h_sum", "h_count", "h"))


def test_names_given_inside_the_braces_exemplars_and_odd_spacing_are_read() -> None:
    text = (
        '{__name__="w",a="1"} 1\n'
        '{"w", a="2"} 2\n'
        'w {a="3"} 3\n'
        '  w{a="4"} 4 1700000000000\r\n'
        'w{a="5"} 5 # {trace_id="x y"} 0.5 1700000000.5\n'
        "w 6 # {} 7\n"
        "w\t8\n"
        "w_sum 9\n"
    )
    assert exact(samples_named(text, ("w",))) == exact(
        {"w": [({"a": str(i)}, float(i)) for i in range(1, 6)] + [({}, 6.0), ({}, 8.0)]}
    )
    assert_same(text, ("w", "w_sum"))


def test_escapes_special_values_and_integers_follow_prometheus_client() -> None:
    text = (
        'w{path="C:\\\\dir\\\\",quote="say \\"hi\\"",nl="a\\nb",tab="a\\tb",odd="}{,=#"} -0\n'
        "w NaN\nw +Inf\nw -Inf\nw 12345678901234567890\nw -0.0\nw 1e3\n"
    )
    found = samples_named(text, ("w",))["w"]
    assert found[0][0] == {"path": "C:\\dir\\", "quote": 'say "hi"', "nl": "a\nb", "tab": "a\\tb", "odd": "}{,=#"}
    values = [value for _, value in found]
    assert math.copysign(1, values[0]) == 1 and math.isnan(values[1])  # "-0" goes through int(): 0.0
    assert values[2:] == [math.inf, -math.inf, 12345678901234567890.0, -0.0, 1000.0]
    assert math.copysign(1, values[5]) == -1
    assert_same(text, ("w",))


@pytest.mark.parametrize(
    "line",
    ['w{a="1"} x', 'w{a="1",a="2"} 1', 'w{__x="1"} 1', "w 1_000", 'w{a="1" 2', "w", "w 1 2 x", "w " + "9" * 400],
)
def test_a_malformed_wanted_line_raises_value_error(line: str) -> None:
    with pytest.raises(ValueError):
        samples_named(f"up 1\n{line}\n", ("w",))


def test_other_series_are_not_read() -> None:
    """Lines of other series are never parsed: a malformed one there does not fail the scrape."""
    assert samples_named("other{{{ garbage\nw 1\n", ("w",)) == {"w": [({}, 1.0)]}


# --- generated texts ---------------------------------------------------------------------------------------

BASES = ("w", "ns:w", "h")
SUFFIXES = {
    "counter": ("", "_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count"),
    "untyped": ("", "_x"),
}
NAMES = tuple(dict.fromkeys(base + suffix for base in BASES for kinds in SUFFIXES.values() for suffix in kinds))
VALUES = ("0", "-0", "1", "+1", "8.0", "0.1", "1e3", "-1.5e-3", "NaN", "nan", "+Inf", "-Inf", "Infinity", "1" * 20)
VALUE_PIECES = ("a", " ", "é", "\u2028", "\\\\", '\\"', "\\n", "\\t", "{", "}", ",", "=", "#", "\t", "w 1")

values = st.one_of(st.sampled_from(VALUES), st.sampled_from(VALUES), st.floats(allow_nan=True).map(repr))
label_values = st.lists(st.sampled_from(VALUE_PIECES), max_size=4).map("".join)
labels = st.dictionaries(
    st.sampled_from(("a", "b", "le", "quantile", "model_name", "_x", "A1")), label_values, max_size=3
)


@st.composite
def sample_line(draw: st.DrawFn, name: str) -> str:
    """One sample of `name`, written in one of the forms prometheus-client accepts."""
    pairs = [f'{key}="{value}"' for key, value in draw(labels).items()]
    form = draw(st.sampled_from(("plain", "plain", "plain", "plain", "space", "inside", "quoted_name")))
    body = ",".join(pairs) + draw(st.sampled_from(("", "", ",")))
    if form == "inside":
        head = "{" + ",".join([f'__name__="{name}"', *pairs]) + "}"
    elif form == "quoted_name":
        head = "{" + ",".join([f'"{name}"', *pairs]) + "}"
    elif not pairs and draw(st.booleans()):
        head = name
    else:
        head = name + (" " if form == "space" else "") + "{" + body + "}"
    line = f"{head} {draw(values)}"
    if draw(st.integers(0, 3)) == 0:
        line += " " + draw(st.sampled_from(("1700000000000", "-5", "1.5")))
    if draw(st.integers(0, 5)) == 0:
        line += draw(st.sampled_from((' # {trace_id="a b"} 1.0', ' # {t="x"} 2 1700000000.000', " # {} 3")))
    return draw(st.sampled_from(("", "", "", "", "  ", "\t"))) + line + draw(st.sampled_from(("", "", "", "\r", " ")))


@st.composite
def family(draw: st.DrawFn) -> list[str]:
    """A metric family: HELP and TYPE comments (either may be missing), then samples of its names."""
    base, kind = draw(st.sampled_from(BASES)), draw(st.sampled_from(tuple(SUFFIXES)))
    declared = base + draw(st.sampled_from(("", "", "_total"))) if kind == "counter" else base
    lines = []
    if draw(st.booleans()):
        lines.append(f"# HELP {declared} what it counts, with \\n and \\\\ and {{}}")
    if draw(st.integers(0, 3)):
        lines.append(f"# TYPE {declared} {kind}")
    names = st.sampled_from([base + suffix for suffix in SUFFIXES[kind]])
    return lines + draw(st.lists(names.flatmap(sample_line), min_size=1, max_size=5))


strays = st.one_of(
    st.sampled_from(NAMES).flatmap(sample_line).map(lambda line: [line]),
    st.sampled_from(("# a comment with w 1 inside", "", "#", "   ", "# TYPE w")).map(lambda line: [line]),
)
texts = st.lists(st.one_of(family(), family(), strays), min_size=1, max_size=8).map(
    lambda blocks: "\n".join(line for block in blocks for line in block) + "\n"
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(text=texts, wanted=st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
def test_generated_texts_read_as_prometheus_client_reads_them(text: str, wanted: list[str]) -> None:
    try:
        expected = reference(text, tuple(wanted))
    except ValueError:
        assume(False)  # not a text prometheus-client accepts
    assert exact(samples_named(text, tuple(wanted))) == exact(expected)
