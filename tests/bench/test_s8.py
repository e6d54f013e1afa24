"""S8's pieces that need no engine: its figures, its scheduler configs, its prompts, and the command lines of
the two real vLLM replicas (built here, never started)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from backends.sim.prefix_cache import block_hashes
from backends.sim.tokens import count_tokens
from bench.records import RequestRecord
from bench.registry import BY_ID, defaults
from bench.scenarios.s8 import measures, setups
from bench.scenarios.s8.replicas import Replica, vllm_kv_blocks, vllm_replica_process, vllm_specs


def test_s8_is_in_the_default_runs_of_the_simulator_and_real_vllm() -> None:
    assert BY_ID["S8"].produces == ("S8",)
    assert "S8" in defaults("sim") and "S8" in defaults("vllm")


def test_jain_index_and_largest_deficit() -> None:
    assert measures.jain_index([5, 5, 5, 5]) == pytest.approx(1.0)
    assert measures.jain_index([8, 0, 0, 0]) == pytest.approx(0.25)  # one user gets everything: 1/n
    assert measures.jain_index([]) is None
    assert measures.largest_deficit([10, 10, 4]) == pytest.approx(4.0)  # mean 8, least served 4


def _record(user: str, tag: str, sent: float, first: float | None, tokens: list[tuple[float, int]]) -> RequestRecord:
    record = RequestRecord(user=user, tag=tag, sent=sent, max_tokens=64)
    record.first_token = first
    record.token_times = tokens
    record.tokens = sum(n for _, n in tokens)
    return record


def test_figures_count_only_the_window_and_the_engines_counter_deltas() -> None:
    records = [
        _record("u0", "backlog", 0.0, 1.0, [(1.0, 10), (5.0, 10)]),  # 10 tokens inside [2, 12)
        _record("u1", "backlog", 3.0, 4.0, [(4.0, 10)]),
        _record("late0", "latecomer", 6.0, 6.5, [(6.5, 1)]),
        _record("late1", "latecomer", 7.0, 8.0, [(8.0, 1)]),
    ]
    before = {measures.GENERATED: 100.0, measures.QUERIES: 1000.0, measures.HITS: 100.0}
    after = {measures.GENERATED: 300.0, measures.QUERIES: 3000.0, measures.HITS: 1100.0}
    out = measures.figures(records, ["u0", "u1"], (2.0, 12.0), before, after)
    assert out["tokens"] == {"u0": 10, "u1": 10}  # latecomers are not backlogged users
    assert out["jain"] == pytest.approx(1.0)
    assert out["hit_rate"] == pytest.approx(0.5)  # 1000 hits of 2000 queries in the window
    assert out["tokens_per_second"] == pytest.approx(20.0)
    assert out["ttft_mean"] == pytest.approx(1.0)  # only u1's first token fell in the window
    assert out["latecomer_median"] == pytest.approx(0.75)
    missing = [*records, _record("late2", "latecomer", 9.0, None, [])]
    assert measures.figures(missing, ["u0", "u1"], (2.0, 12.0), before, after)["latecomer_median"] is None


def test_hit_rate_ratio_against_the_baseline() -> None:
    assert measures.hit_rate_ratio({"hit_rate": 0.6}, {"hit_rate": 0.2}) == pytest.approx(3.0)
    assert measures.hit_rate_ratio({"hit_rate": 0.6}, {"hit_rate": 0.0}) == float("inf")
    assert measures.hit_rate_ratio({"hit_rate": None}, {"hit_rate": 0.2}) is None


def test_every_setup_gets_a_config_the_service_accepts_with_both_replicas() -> None:
    p = setups.S8Params()
    replicas = [Replica("http://127.0.0.1:1", "m0"), Replica("http://127.0.0.1:2", "m1")]
    for setup in setups.setup_list(p):
        text = setups.scheduler_toml(setup, replicas, 16).replace("{GRPC_PORT}", "1")
        model = tomllib.loads(text)["models"][0]
        assert [(b["url"], b["engine_model"]) for b in model["backends"]] == [(r.url, r.model) for r in replicas]
        assert model["backend_policy"] == setup.backend_policy
        assert tomllib.loads(text)["scheduling"]["fairness"] == "vtc"
        assert model.get("locality", {}).get("deficit_bound", 0.0) == setup.deficit_bound
        assert model.get("locality", {}).get("index_max_bytes", 0) == setup.index_max_bytes
    assert [s.deficit_bound > 0 for s in setups.setup_list(p)] == [False, False, True]
    # the locality index is left to follow each engine's cache (its size read from the engine's metrics)
    assert [s.index_max_bytes for s in setups.setup_list(p)] == [0, 0, 0]


def test_simulator_prompts_fill_whole_cache_blocks_and_differ_per_user() -> None:
    p = setups.S8Params()
    prompts = {user: setups.system_prompt(user, p) + setups.question(user, 123_456) for user in setups.users(p)}
    chains = {user: block_hashes(text, count_tokens(text), 16) for user, text in prompts.items()}
    blocks = p.system_tokens // 16
    assert all(len(chain) == blocks for chain in chains.values())  # the question adds no cached block
    assert len({chain[0] for chain in chains.values()}) == p.users  # no two users share a first block
    assert blocks * p.users / 2 <= p.prefix_cache_blocks < blocks * (p.users / 2 + 1)  # about half fits


def test_vllm_kv_cache_holds_about_half_the_working_set_plus_a_full_batch() -> None:
    blocks = vllm_kv_blocks(users=8, system_tokens=1000, request_tokens=80, max_num_seqs=4, block_size=32)
    assert blocks == 125 + 4 * 4  # 4,000 prompt tokens in 32-token blocks, and 3 + 1 blocks per slot


def test_vllm_replicas_are_pinned_one_per_core_with_prefix_caching_and_the_kv_override(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("engines.launch.ensure_hf_model", lambda: tmp_path / "tiny-llama")
    p = setups.VLLM_PARAMS
    specs = vllm_specs(users=p.users, system_tokens=p.system_tokens, request_tokens=p.question_tokens + p.answer_tokens)
    processes = [vllm_replica_process(spec) for spec in specs]
    for core, (spec, process) in enumerate(zip(specs, processes, strict=True)):
        argv = process.argv
        assert argv[:3] == ["taskset", "-c", str(core)]
        assert argv[argv.index("--num-gpu-blocks-override") + 1] == str(spec.kv_blocks) == "141"
        assert argv[argv.index("--block-size") + 1] == "32"
        assert "--enable-prefix-caching" in argv
        assert argv[argv.index("--max-num-seqs") + 1] == "4"
        assert int(argv[argv.index("--max-model-len") + 1]) >= p.system_tokens + p.question_tokens + p.answer_tokens
        assert argv[argv.index("--served-model-name") + 1] == f"tiny-llama-r{core}"
        assert process.env["VLLM_SERVER_DEV_MODE"] == "1"  # POST /reset_prefix_cache between runs
        assert process.env["VLLM_CPU_OMP_THREADS_BIND"] == str(core)
        assert process.env["OMP_NUM_THREADS"] == "1"
    assert processes[0].port != processes[1].port
