"""Real inference engines as child processes: install them, start them on the tiny models, stop them.

Used alike by ``make run ENGINE=vllm|llamacpp`` (``scripts/run_engine.py``), the benchmarks (``bench``) and
the engine tests (``tests/engines``); the scheduler itself never imports it (it only speaks HTTP to
engines). Modules:

- :mod:`engines.paths`: the cache folder (``$ENGINES_CACHE``) holding venvs, models and logs;
- :mod:`engines.install`: install checks (with the command that fixes them), installing, tiny models;
- :mod:`engines.process`: :class:`EngineProcess`, one server in its own process group, readiness on
  ``/health``, stop / kill / restart on the same port;
- :mod:`engines.launch`: the command lines of vLLM (CPU), llama-server and the simulator;
- :mod:`engines.layout`: core layouts and pinning an engine's processes to them;
- :mod:`engines.wire`: reading SSE bodies and Prometheus text.

The shell installers and the model generators live in ``engines/scripts/`` (run with the engines' own
venvs, not imported).
"""

from __future__ import annotations

from engines.install import (
    EngineKind,
    install,
    install_script,
    llamacpp_binary,
    llamacpp_missing_reason,
    missing_reason,
    vllm_missing_reason,
)
from engines.launch import (
    llamacpp_process,
    sim_process,
    start_llamacpp,
    start_sim,
    start_vllm,
    vllm_process,
)
from engines.process import EngineError, EngineProcess, free_port

__all__ = [
    "EngineError",
    "EngineKind",
    "EngineProcess",
    "free_port",
    "install",
    "install_script",
    "llamacpp_binary",
    "llamacpp_missing_reason",
    "llamacpp_process",
    "missing_reason",
    "sim_process",
    "start_llamacpp",
    "start_sim",
    "start_vllm",
    "vllm_missing_reason",
    "vllm_process",
]
