"""Config, CLI flags and the deterministic text helpers."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from backends.sim import SimConfig, add_cli_arguments, config_from_args
from backends.sim.tokens import StopBufferedText, count_tokens, find_stop, render_chat


def test_every_field_has_a_default_and_a_description() -> None:
    for field in dataclasses.fields(SimConfig):
        assert field.default is not dataclasses.MISSING, field.name
        doc = field.metadata.get("doc", "")
        assert doc and "\n" not in doc, field.name


def test_defaults() -> None:
    config = SimConfig()
    assert (config.flavor, config.model_name, config.max_num_seqs, config.scheduling_policy) == (
        "vllm",
        "sim-model",
        8,
        "fcfs",
    )
    assert (config.decode_base_ms, config.decode_per_seq_ms, config.prefill_per_token_ms) == (10, 2, 0.05)
    assert (config.max_concurrent_requests, config.seed, config.eos_probability) == (128, 0, 0.0)


def test_cli_flags_build_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    ns = parser.parse_args(
        [
            "--flavor", "vllm", "--port", "8123", "--max-num-seqs", "4", "--scheduling-policy", "priority",
            "--served-model-name", "m", "--decode-base-ms", "1.5", "--max-num-queued-reqs", "none",
        ]
    )  # fmt: skip
    assert (ns.host, ns.port) == ("127.0.0.1", 8123)
    config = config_from_args(ns)
    assert config == SimConfig(
        flavor="vllm", max_num_seqs=4, scheduling_policy="priority", model_name="m", decode_base_ms=1.5
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--flavor", "sglang"])


def test_cli_can_leave_listen_flags_to_the_caller() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port")
    add_cli_arguments(parser, include_listen=False)  # no clash with the caller's own --port
    assert config_from_args(parser.parse_args(["--max-num-seqs", "2"])).max_num_seqs == 2


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"flavor": "tgi", "scheduling_policy": "priority"}, "TGI has no priority"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"decode_base_ms": -1.0}, "decode_base_ms"),
        ({"eos_probability": 1.5}, "eos_probability"),
        ({"kv_cache_tokens": 100, "max_model_len": 200}, "kv_cache_tokens"),
    ],
)
def test_invalid_configs_are_refused(overrides: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        SimConfig(**overrides)  # type: ignore[arg-type]


def test_tokenizer_rule() -> None:
    assert [count_tokens(t) for t in ("", "a", "abcd", "abcde", "x" * 400)] == [1, 1, 1, 2, 100]
    assert (
        render_chat([("system", "Be brief."), ("user", "Hi")]) == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    )


def test_find_stop_only_looks_at_new_text_and_picks_the_earliest() -> None:
    assert find_stop(" the cat sat", 4, [" sat", " cat"]) == (4, " cat")
    assert find_stop(" the cat", 8, [" the"]) is None  # already checked before
    assert find_stop(" the ca", 5, ["cat"]) is None


def test_stop_buffer_never_streams_part_of_a_stop_string() -> None:
    buffer = StopBufferedText(["STOP"])
    sent = buffer.push("abc") + buffer.push("dST")
    assert "S" not in sent
    assert sent + buffer.finish("OPxyz", cut_at=len("abcd")) == "abcd"
    no_stops = StopBufferedText([])
    assert no_stops.push(" hi") == " hi"
