"""CL's and CN's setups: the models (one, then several on the same engine), the replicas (enough that one leads
nothing), and the config of the leader CN loads."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from bench.cluster import ClusterOptions
from bench.configs import SCHEDULED_MODEL, STANDARD_CLASS, Toml, for_engine
from bench.engines import Engine
from bench.runner import ConfigBuilder, Mode

ID, TITLE = "CL", "the leader's cost per follower request"
LOAD_ID, LOAD_TITLE = "CN", "one leader under many followers' load"
TARGET = 0.10  # a leader's CPU per follower-owned request <= 10% of the follower's own: it serves ten
GATE_TARGET = 3


@dataclass(frozen=True)
class CLParams:
    rate: float = 20.0  # requests per second over all models
    duration: float = 8.0  # seconds of sending (the load window runs on until the last request ends)
    tokens: int = 64
    users: int = 8
    models: int = 2  # the per-model layout's models (one leader each); 1: that layout is not run
    timeout: float = 90.0
    # CN, one leader under synthetic followers (`followers`): offered rates, each for `step` seconds
    load_rates: tuple[float, ...] = (100.0, 200.0, 400.0, 800.0)
    load_step: float = 5.0
    load_followers: int = 10
    load_engines: int = 8  # the model's backends (one instant fake engine behind them all)
    load_engine_slots: int = 256
    sustained_latency: float = 0.1  # a step counts while the median Admit -> Grant stays under this


def model_name(index: int, models: int) -> str:
    return SCHEDULED_MODEL if models == 1 else f"{SCHEDULED_MODEL}-{index + 1}"


def config_for(models: int) -> ConfigBuilder:
    """The bench's usual one-model config, its model repeated `models` times under its own names, all on the
    same engine (each model has its own dispatcher, queues and lease)."""

    def build(engine: Engine) -> Toml:
        config = for_engine(engine, fairness="vtc", classes=STANDARD_CLASS, waiting_target=GATE_TARGET)
        template = config["models"][0]
        config["models"] = [{**copy.deepcopy(template), "name": model_name(i, models)} for i in range(models)]
        return config

    return build


def load_config(engine_url: str, engines: int, slots: int) -> Toml:
    """One model behind `engines` backends (all the same instant fake engine, each of `slots` slots): the
    leader's decisions and scrapes as for that many engines, without their decode time."""
    config = config_for(1)(Engine(engine_url, "fake-model", "fcfs", max_num_seqs=slots))
    # vtc may hold a choice up to its return grace for a user about to return: a deliberate wait, which
    # would hide in the grant latency whether the leader keeps up
    config["scheduling"]["vtc_return_grace_seconds"] = 0.0
    template = config["models"][0]["backends"][0]
    config["models"][0]["backends"] = [{**template, "name": f"engine-{i}"} for i in range(engines)]
    return config


def modes(options: ClusterOptions, p: CLParams) -> list[tuple[Mode, int]]:
    """The one-model layout, and the per-model one; enough replicas that at least one leads nothing."""
    replicas = max(options.replicas, p.models + 1)
    layout = options.layout(replicas, "redis")
    out = [(Mode(f"{replicas} replicas, redis, 1 model", config=config_for(1), layout=layout), 1)]
    if p.models > 1:
        label = f"{replicas} replicas, redis, {p.models} models"
        out.append((Mode(label, config=config_for(p.models), layout=layout), p.models))
    return out
