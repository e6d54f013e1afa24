"""A simulated LLM inference engine (vLLM or TGI flavour) for tests and benchmarks without a GPU.

It batches continuously like a real engine, so per-token latency rises with load and long prompts cost
prefill time, and it speaks the real engines' HTTP APIs and Prometheus metric names. Test hooks live under
`/sim/` (faults, stats).

    engine.py          continuous batching, queues, preemption, tokens (no HTTP)
    tokens.py          deterministic tokenizer, chat rendering, sampler, stop strings
    vllm_protocol.py   vLLM request validation and response shapes
    vllm_api.py        vLLM routes        tgi_api.py   TGI routes
    metrics.py         Prometheus metrics with each engine's names
    faults.py          injectable faults  control.py   /metrics, /sim/faults, /sim/stats
    app.py             create_app, running_simulator, serve_forever
    cli.py             `llmsched sim` flags
"""

from backends.sim.app import SimServer, create_app, running_simulator, serve_forever
from backends.sim.cli import add_cli_arguments, config_from_args
from backends.sim.config import SimConfig
from backends.sim.engine import GenerateParams, SimEngine
from backends.sim.faults import Faults

__all__ = [
    "Faults",
    "GenerateParams",
    "SimConfig",
    "SimEngine",
    "SimServer",
    "add_cli_arguments",
    "config_from_args",
    "create_app",
    "running_simulator",
    "serve_forever",
]
