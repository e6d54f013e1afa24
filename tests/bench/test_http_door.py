"""The bench's HTTP-door client and figures: SSE lines parsed as the door writes them, a request through a
real scheduler's door measured like a gRPC one, and the door-against-gRPC ratios S1 and S6 report."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from bench import harness
from bench.clients import HttpSchedulerClient, RunClock, SseChunk, parse_sse_line
from bench.configs import scheduler_config, validated_toml, with_http_door
from bench.records import RequestRecord
from bench.report import compact_table
from bench.results import ScenarioResult, Target
from bench.scenarios import s1
from bench.scenarios.s6 import setups as s6
from bench.scenarios.s6.summary import added_ratio


def test_sse_lines_give_text_usage_the_end_and_in_stream_errors() -> None:
    chunk = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" hi"}]}\n'
    assert parse_sse_line(chunk) == SseChunk(text=" hi")
    last = b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}\n'
    assert parse_sse_line(last) == SseChunk()
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":16,"total_tokens":19}}\n'
    assert parse_sse_line(usage) == SseChunk(completion_tokens=16)
    assert parse_sse_line(b"data: [DONE]\n") == SseChunk(done=True)
    error = (
        b'data: {"error":{"message":"engine down","type":"server_error","param":null,"code":"backend_unavailable"}}\n'
    )
    assert parse_sse_line(error) == SseChunk(error="backend_unavailable: engine down")


def test_lines_that_carry_nothing_are_skipped_and_garbage_is_an_error() -> None:
    assert parse_sse_line(b"\n") is None
    assert parse_sse_line(b": queued position=3 depth=40 eta=2.1s\n") is None
    assert parse_sse_line(b"event: ping\n") is None
    with pytest.raises(ValueError):
        parse_sse_line(b"data: {not json\n")
    with pytest.raises(ValueError):
        parse_sse_line(b"data: [1, 2]\n")


async def test_a_request_through_the_schedulers_http_door_is_recorded_like_a_grpc_one() -> None:
    async with harness.fake_engine(16) as engine_url:
        config = scheduler_config(engine_url=engine_url, model="bench-model", engine_model="fake-model")
        async with (
            harness.scheduler_process(validated_toml(with_http_door(config))) as scheduler,
            aiohttp.ClientSession() as session,
        ):
            assert scheduler.http_url.startswith("http://127.0.0.1:")
            client = HttpSchedulerClient(session, scheduler.http_url, "bench-model", RunClock(), "http")
            record = RequestRecord(user="alice", tag="t", sent=0.0, max_tokens=16)
            await client.run(record, "hi")
            refused = RequestRecord(user="alice", tag="t", sent=0.0, max_tokens=16)
            await HttpSchedulerClient(session, scheduler.http_url, "no-such-model", RunClock(), "http").run(
                refused, "hi"
            )
    assert record.error is None and record.completed
    assert record.tokens == 16  # the usage chunk's count
    assert record.first_token is not None and record.finished is not None
    assert record.sent <= record.first_token <= record.finished
    assert refused.error is not None and refused.error.startswith("HTTP 404")


def test_the_http_door_is_opened_only_where_asked() -> None:
    config = scheduler_config(engine_url="http://127.0.0.1:1", model="m", engine_model="e")
    assert "http_listen" not in validated_toml(config)
    assert '"http_listen" = "127.0.0.1:{HTTP_PORT}"' in validated_toml(with_http_door(config))
    assert "http_listen" not in config["server"]  # the original is left as it was


def test_s1_compares_the_latecomer_medians() -> None:
    assert s1.latecomer_median({"latecomer_ttft": {"B": 0.4, "C": 0.6}}) == pytest.approx(0.5)
    assert s1.latecomer_median({"latecomer_ttft": {"B": 0.4, "C": None}}) is None  # a median would hide it
    assert s1.latecomer_median({"latecomer_ttft": {}}) is None


def _round(direct: float, grpc: float, http: float | None) -> dict[str, dict[str, Any]]:
    def phase(p50: float) -> dict[str, Any]:
        return {"target": {"latency_p50": p50}, "low": {"latency_p50": p50}}

    out = {s6.DIRECT: phase(direct), s6.SCHEDULED: phase(grpc)}
    if http is not None:
        out[s6.HTTP] = phase(http)
    return out


def test_s6_compares_each_doors_latency_added_over_the_engine_alone_of_the_same_round() -> None:
    rounds = [_round(0.010, 0.012, 0.013), _round(0.020, 0.024, 0.026), _round(0.010, 0.013, None)]
    http_added, grpc_added, ratio = added_ratio(rounds, "target", s6.HTTP)
    assert http_added == pytest.approx(0.0045)  # median of 3 ms and 6 ms
    assert grpc_added == pytest.approx(0.003)  # the same two rounds: median of 2 ms and 4 ms
    assert ratio == pytest.approx(1.5)


def test_s6_gives_no_ratio_when_grpc_added_nothing_measurable() -> None:
    rounds = [_round(0.010, 0.009, 0.012)]
    assert added_ratio(rounds, "target", s6.HTTP)[2] is None


def test_ratios_near_one_show_two_decimals() -> None:
    def shown(value: float) -> str:
        return Target("f", "t", "r", value, 1.1, 1.25, False, "x").format(value)

    assert shown(1.04) == "1.04x"
    assert shown(28.94) == "28.9x"


def test_the_readme_table_names_the_door_and_the_policy_without_the_word_scheduler() -> None:
    result = ScenarioResult("S1", "flood + latecomers", "w")
    for run in ("scheduler, vtc", "scheduler through HTTP, vtc"):
        result.targets.append(Target("worst latecomer TTFT", "<= 1 s", run, 0.5, 1.0, 1.25, False, " s"))
    assert compact_table([result]).rows[0][3] == "vtc 500.0 ms, through HTTP, vtc 500.0 ms"
