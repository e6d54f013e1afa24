# Shared by the engine install scripts (sourced, not run): make the engine's own venv ready for pip.
#
# ensure_venv VENV PYTHON: create VENV with PYTHON unless it is whole; a venv whose creation was killed has
# a python but no pip, so it is made again rather than failing later; pip is upgraded either way.
ensure_venv() {
  local venv="$1" py="$2"
  if [[ -x "$venv/bin/python" ]] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    echo "$(basename "$0"): $venv is half made (no pip): creating it again"
    rm -rf "$venv"
  fi
  if [[ ! -x "$venv/bin/python" ]]; then
    "$py" -m venv "$venv" || die "could not create venv with $py"
  fi
  "$venv/bin/python" -m pip install --quiet --upgrade pip >/dev/null || die "pip upgrade failed"
}
