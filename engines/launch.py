"""Command lines for the engines: real vLLM (CPU) and llama-server on the tiny models, and the simulator.

Each factory builds an :class:`EngineProcess` (not started: call ``.start()``, or use it as a context
manager) on a free loopback port unless given one. The ``start_*`` variants build and start, returning once
``/health`` answers 200::

    from engines import start_vllm

    with start_vllm(scheduling_policy="priority") as eng:   # waits until /health answers 200
        print(eng.url, eng.served_model_name)                # http://127.0.0.1:PORT, "tiny-llama"
        eng.kill()                                           # SIGKILL the whole process group
        eng.restart()                                        # same port, waits for /health again

Environment knobs, read at import: ``LLAMACPP_LAYERS`` (depth of the GGUF, default 64),
``VLLM_STARTUP_TIMEOUT`` (300 s) and ``LLAMACPP_STARTUP_TIMEOUT`` (60 s).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import ParamSpec

from engines.install import ensure_gguf_model, ensure_hf_model, llamacpp_binary, llamacpp_missing_reason
from engines.paths import ROOT, cache
from engines.process import EngineError, EngineProcess, free_port

# Depth of the llama.cpp model: its speed knob (~4000 tok/s with 2 layers is too fast to observe
# queueing or to kill a stream midway).
LLAMACPP_LAYERS = int(os.environ.get("LLAMACPP_LAYERS", "64"))

VLLM_STARTUP_TIMEOUT = float(os.environ.get("VLLM_STARTUP_TIMEOUT", "300"))
LLAMACPP_STARTUP_TIMEOUT = float(os.environ.get("LLAMACPP_STARTUP_TIMEOUT", "60"))
SIM_STARTUP_TIMEOUT = 30.0
LLAMACPP_HTTP_THREADS = 64  # llama-server --threads-http (see llamacpp_process)

_P = ParamSpec("_P")


def vllm_process(
    *,
    scheduling_policy: str = "fcfs",
    served_model_name: str = "tiny-llama",
    port: int | None = None,
    max_num_seqs: int = 4,
    max_model_len: int = 1024,
    kv_cache_gib: int = 1,
    enforce_eager: bool = True,
    extra_args: Sequence[str] = (),
) -> EngineProcess:
    """Build (not start) a vLLM OpenAI-compatible server on the tiny HF model.

    ``enforce_eager`` (default) skips torch.compile: ready in ~45 s instead of ~80 s, and faster
    under concurrency on this CPU (measured: 8 streams ~1500 tok/s eager vs ~700 compiled).
    Raises :class:`EngineError` (with the install command) when vLLM is not installed.
    """
    model = ensure_hf_model()
    port = port or free_port()
    argv = [
        str(cache().vllm_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--served-model-name", served_model_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32",
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--scheduling-policy", scheduling_policy,
        *(["--enforce-eager"] if enforce_eager else []),
        *extra_args,
    ]  # fmt: skip
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    name = "vllm" if scheduling_policy == "fcfs" else f"vllm-{scheduling_policy}"
    return EngineProcess(name, argv, port, served_model_name, env, startup_timeout=VLLM_STARTUP_TIMEOUT)


def llamacpp_process(
    *,
    served_model_name: str = "tiny-llama-gguf",
    port: int | None = None,
    slots: int = 4,
    ctx_size: int = 4096,
    threads: int = 1,
    layers: int = LLAMACPP_LAYERS,
    extra_args: Sequence[str] = (),
) -> EngineProcess:
    """Build (not start) a llama-server on the tiny GGUF with ``slots`` parallel slots and /metrics.

    ``threads`` defaults to 1: ggml's worker threads spin on barriers, so 2 threads on this shared
    2-core machine collapse (170 ms/token, /metrics unanswered for seconds) as soon as another
    process takes a core. One thread gives ~170 tok/s single-stream with the 64-layer model.
    Raises :class:`EngineError` (with the install command) when llama-server is not installed.
    """
    binary = llamacpp_binary()
    if binary is None:
        raise EngineError(llamacpp_missing_reason() or "llama-server missing")
    model = ensure_gguf_model(layers)
    port = port or free_port()
    argv = [
        str(binary),
        "--model", str(model),
        "--alias", served_model_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--ctx-size", str(ctx_size),
        "-np", str(slots),
        "--cont-batching",
        "--metrics",
        "--threads", str(threads),
        # Every streamed request holds one HTTP thread while it waits for a slot and while it runs; with
        # the default (-np + 2 threads) a flood of 12 on 4 slots took them all and /metrics went
        # unanswered for seconds (the scheduler's gate reads it). Room for the floods we send, and more.
        "--threads-http", str(max(LLAMACPP_HTTP_THREADS, 4 * slots)),
        *extra_args,
    ]  # fmt: skip
    env = {"LD_LIBRARY_PATH": f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    return EngineProcess("llamacpp", argv, port, served_model_name, env, startup_timeout=LLAMACPP_STARTUP_TIMEOUT)


def sim_process(
    *,
    port: int | None = None,
    max_num_seqs: int = 4,
    scheduling_policy: str = "priority",
    extra_args: Sequence[str] = (),
) -> EngineProcess:
    """Build (not start) the project's vLLM simulator (``llmsched sim``) from this checkout's code.

    Stands in for a real engine where only the process handling matters (trying the bench itself quickly,
    testing this package): it starts in a second and serves model "sim-model".
    """
    port = port or free_port()
    argv = [
        sys.executable, "-m", "scheduler_svc.app.cli", "sim",
        "--port", str(port),
        "--max-num-seqs", str(max_num_seqs),
        "--scheduling-policy", scheduling_policy,
        *extra_args,
    ]  # fmt: skip
    return EngineProcess("sim", argv, port, "sim-model", {"PYTHONPATH": str(ROOT)}, SIM_STARTUP_TIMEOUT)


def _started(build: Callable[_P, EngineProcess]) -> Callable[_P, EngineProcess]:
    """A factory that builds with ``build``'s arguments and starts, returning once the engine is ready."""

    def start(*args: _P.args, **kwargs: _P.kwargs) -> EngineProcess:
        return build(*args, **kwargs).start()

    start.__name__ = f"start_{build.__name__.removesuffix('_process')}"
    start.__doc__ = f"Build (see :func:`{build.__name__}`) and start; returns once ``/health`` answers 200."
    return start


start_vllm = _started(vllm_process)
start_llamacpp = _started(llamacpp_process)
start_sim = _started(sim_process)
