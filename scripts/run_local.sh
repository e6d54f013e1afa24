#!/usr/bin/env bash
# `make run [ENGINE=sim|vllm|llamacpp]`: start an engine on 127.0.0.1:8000 and the scheduler on :50051 (gRPC)
# and :8080 (the OpenAI-compatible HTTP door, from configs/example.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
engine="${1:-sim}"
bin=.venv/bin
config=configs/example.toml
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

wait_http() {  # url, seconds
  "$bin/python" - "$1" "$2" <<'PY' || { echo "engine at $1 did not become ready" >&2; exit 1; }
import sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        urllib.request.urlopen(sys.argv[1], timeout=1)
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(1)
PY
}

case "$engine" in
  sim)
    "$bin/llmsched" sim --flavor vllm --port 8000 --max-num-seqs 8 --served-model-name sim-model &
    pids+=($!)
    wait_http http://127.0.0.1:8000/health 30
    ;;
  vllm|llamacpp)
    exec "$bin/python" scripts/run_engine.py "$engine"
    ;;
  *) echo "ENGINE must be sim, vllm or llamacpp" >&2; exit 2 ;;
esac

cat <<MSG

  llm-scheduler on 127.0.0.1:50051 (gRPC) and http://127.0.0.1:8080/v1 (OpenAI-compatible HTTP)
  (engine: $engine on 127.0.0.1:8000, scheduler metrics on :9464/metrics)
  Try, in another shell:
    .venv/bin/llmsched stream --model sim-model --user alice "Tell me a story"
    .venv/bin/llmsched submit --model sim-model --user bob --max-tokens 32 "Hello"
    .venv/bin/grpcurl -plaintext 127.0.0.1:50051 list
    curl -N localhost:8080/v1/chat/completions -H 'Content-Type: application/json' -H 'x-user-id: carol' -H 'x-queue-updates: true' -d '{"model": "sim-model", "stream": true, "messages": [{"role": "user", "content": "Hi"}]}'
  (README.md's quick start has the OpenAI Python SDK too.) Ctrl-C stops both.

MSG
"$bin/llmsched" serve --config "$config" &
pids+=($!)
wait "${pids[-1]}"
