"""Scheduler configs for the scenarios: built as dicts, validated here, written as TOML for the subprocess.

Validating in-process with the service's own `config_from_dict` lets a scenario that needs a key or policy
the service does not have yet report "not available" with the service's message, instead of a scheduler
subprocess dying at start-up.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from bench.engines import Engine
from bench.product import ConfigRefused, validate_config

Toml = dict[str, Any]
SCHEDULED_MODEL = "bench-model"  # the model name the scenarios' clients ask the scheduler for
STANDARD_CLASS = [{"name": "standard", "rank": 0}]  # one band, no TPOT/KV limits: fairness alone decides


class NotAvailable(Exception):
    """The service cannot run what a scenario needs (unknown policy, missing key)."""


def scheduler_config(
    *,
    engine_url: str,
    model: str,
    engine_model: str,
    fairness: str = "round_robin",
    weights: dict[str, float] | None = None,
    classes: list[dict[str, Any]] | None = None,
    default_class: str | None = None,
    waiting_target: int = 3,
    priority_waiting_target: int = 0,
    priority_scheduling: bool = False,
    scrape_interval: float = 0.1,
    extra_scheduling: dict[str, Any] | None = None,
    max_num_seqs: int = 0,
    model_extra: dict[str, Any] | None = None,
) -> Toml:
    """One model behind one vLLM-API engine; `{GRPC_PORT}` (and `{HTTP_PORT}` where a run opens the HTTP door,
    `with_http_door`) is filled in by `harness.scheduler_process`."""
    scheduling: Toml = {"fairness": fairness}
    if weights:
        scheduling["weights"] = {"default": 1.0, "users": dict(weights)}
    if classes:
        scheduling["classes"] = classes
        scheduling["default_class"] = default_class or classes[0]["name"]
    scheduling.update(extra_scheduling or {})
    return {
        "server": {
            "listen": "127.0.0.1:{GRPC_PORT}",
            "metrics_listen": "",
            "log_level": "warning",
            "shutdown_grace_seconds": 1.0,
        },
        "scheduling": scheduling,
        "models": [
            {
                "name": model,
                "max_tokens_limit": 4096,
                "max_queued_per_user": 10000,
                "gate": {"waiting_target": waiting_target, "priority_waiting_target": priority_waiting_target},
                **(model_extra or {}),
                "backends": [
                    {
                        "name": "engine-0",
                        "kind": "vllm",
                        "url": engine_url,
                        "engine_model": engine_model,
                        "priority_scheduling": priority_scheduling,
                        "scrape_interval_seconds": scrape_interval,
                        "max_num_seqs": max_num_seqs,
                    }
                ],
            }
        ],
    }


def for_engine(engine: Engine, **settings: Any) -> Toml:
    """`scheduler_config` for the scenarios' model in front of `engine`: its URL and model filled in, and the
    gate told its batch size unless `settings` says otherwise."""
    settings.setdefault("max_num_seqs", engine.max_num_seqs)
    return scheduler_config(engine_url=engine.url, model=SCHEDULED_MODEL, engine_model=engine.model, **settings)


EXAMPLE = Path(__file__).resolve().parents[1] / "configs" / "example.toml"


def minimal_config(*, engine_url: str, model: str, engine_model: str, max_num_seqs: int = 0) -> Toml:
    """A user's first config: only the model and one vLLM backend started with `--scheduling-policy
    priority` (with `max_num_seqs` when given); everything else is the service's defaults. The listeners are
    the harness's ports."""
    backend: Toml = {"name": "engine-0", "url": engine_url, "engine_model": engine_model, "priority_scheduling": True}
    if max_num_seqs:
        backend["max_num_seqs"] = max_num_seqs
    return {
        "server": {"listen": "127.0.0.1:{GRPC_PORT}", "metrics_listen": "127.0.0.1:{METRICS_PORT}"},
        "models": [{"name": model, "backends": [{"kind": "vllm", **backend}]}],
    }


def example_config(*, engine_url: str, model: str, engine_model: str, max_num_seqs: int) -> Toml:
    """configs/example.toml as shipped, pointed at one priority vLLM: the listeners on the harness's ports,
    the model and backend renamed to the engine's, and a `max_num_seqs` the example sets replaced by the
    engine's own (the example states the simulator's)."""
    config = tomllib.loads(EXAMPLE.read_text())
    server = config["server"]
    server["listen"], server["metrics_listen"] = "127.0.0.1:{GRPC_PORT}", "127.0.0.1:{METRICS_PORT}"
    if server.get("http_listen"):
        server["http_listen"] = "127.0.0.1:{HTTP_PORT}"
    (shipped,) = config["models"]
    (backend,) = shipped["backends"]
    shipped["name"] = model
    backend.update(url=engine_url, engine_model=engine_model, priority_scheduling=True, kind="vllm")
    if backend.get("max_num_seqs"):
        backend["max_num_seqs"] = max_num_seqs
    return config


def with_http_door(config: Toml) -> Toml:
    """The same config with the OpenAI-compatible HTTP door open on a port the harness picks."""
    return {**config, "server": {**config["server"], "http_listen": "127.0.0.1:{HTTP_PORT}"}}


def validated_toml(config: Toml) -> str:
    """The config as TOML text, after the service's own validation; raises NotAvailable when it refuses."""
    text = json.dumps(config)
    for placeholder in ("{GRPC_PORT}", "{HTTP_PORT}", "{METRICS_PORT}"):
        text = text.replace(placeholder, "0")
    try:
        validate_config(json.loads(text))
    except ConfigRefused as exc:
        raise NotAvailable(f"the scheduler refuses this config: {exc}") from exc
    return to_toml(config)


def to_toml(config: Toml) -> str:
    """Top-level keys as `key = value` lines, nested values as inline tables/arrays (valid TOML 1.0)."""
    return "".join(f"{key} = {_value(value)}\n" for key, value in config.items())


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
