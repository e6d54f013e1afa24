"""R1's scheduler setups measure the scheduler as it ships: reading the engine's metrics as often as the
shipped config does (the bench's own sampler keeps its 0.1 s period); a user's first configs run as
written."""

from __future__ import annotations

from bench.configs import example_config as bench_example_config
from bench.configs import minimal_config, validated_toml
from bench.scenarios.r1 import setups as r1_setups
from tests.helpers import example_config


def test_the_scheduler_setups_read_the_engine_as_the_shipped_config_does() -> None:
    shipped = example_config()
    intervals = {b["scrape_interval_seconds"] for m in shipped["models"] for b in m["backends"]}
    assert intervals == {r1_setups.SCHED.scrape_interval}
    assert r1_setups.SCHED_OFF.scrape_interval == r1_setups.SCHED.scrape_interval
    assert r1_setups.SCHED_SCRAPE_01.scrape_interval == 0.1 != r1_setups.SCHED.scrape_interval


def test_a_first_configs_run_is_a_result_of_its_own() -> None:
    """Its record must not replace the latest record of the standard setups, which the docs render."""
    assert r1_setups.result_suffix([r1_setups.SCHED, r1_setups.ORACLE]) == ""
    assert r1_setups.result_suffix([r1_setups.ORACLE, r1_setups.FIRST_MINIMAL]) == ", first configs"


def test_the_minimal_config_says_only_the_model_and_a_priority_vllm() -> None:
    config = minimal_config(engine_url="http://127.0.0.1:1", model="m", engine_model="e")
    assert set(config) == {"server", "models"}
    assert set(config["server"]) == {"listen", "metrics_listen"}, "only the harness's ports"
    ((model,),) = [config["models"]]
    (backend,) = model["backends"]
    assert set(model) == {"name", "backends"}
    assert backend == {"kind": "vllm", "name": "engine-0", "url": "http://127.0.0.1:1", "engine_model": "e",
                       "priority_scheduling": True}  # fmt: skip
    slots = minimal_config(engine_url="http://127.0.0.1:1", model="m", engine_model="e", max_num_seqs=4)
    assert slots["models"][0]["backends"][0]["max_num_seqs"] == 4
    validated_toml(config)


def test_the_example_setup_runs_configs_example_toml_but_where_it_is_placed() -> None:
    shipped = example_config()
    pointed = bench_example_config(engine_url="http://127.0.0.1:1", model="m", engine_model="e", max_num_seqs=4)
    assert pointed["scheduling"] == shipped["scheduling"]
    assert {k: v for k, v in pointed["models"][0].items() if k not in ("name", "backends")} == {
        k: v for k, v in shipped["models"][0].items() if k not in ("name", "backends")
    }
    backend = pointed["models"][0]["backends"][0]
    assert backend["url"] == "http://127.0.0.1:1" and backend["priority_scheduling"] is True
    validated_toml(pointed)
