#!/usr/bin/env bash
# `make run-cluster`: one redis-server (its own data directory, no persistence), the simulated vLLM engine on
# 127.0.0.1:8000, and three scheduler replicas r1..r3 meeting on that Redis ([cluster] store = "redis"):
# gRPC :50051-50053, the OpenAI-compatible HTTP door :8081-8083, metrics :9464-9466. Each replica's config is
# configs/example.toml with its own listeners and [cluster] store = "redis", written under the run's temp directory.
# REDIS_PORT picks Redis's port (default: a free one). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
run_dir="$(mktemp -d "${TMPDIR:-/tmp}/llmsched-cluster.XXXXXX")"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$run_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v redis-server >/dev/null || { echo "redis-server is missing: make redis" >&2; exit 1; }
redis_port="${REDIS_PORT:-$("$bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"

wait_until() {  # what, seconds, python condition over `socket`/`urllib`
  "$bin/python" - "$2" "$3" <<'PY' || { echo "$1 did not become ready" >&2; exit 1; }
import socket, sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    try:
        if eval(sys.argv[2]):
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.1)
sys.exit(1)
PY
}

mkdir -p "$run_dir/redis"
redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$run_dir/redis" --save '' --appendonly no \
  --protected-mode no --daemonize no --logfile "$run_dir/redis/redis.log" &
pids+=($!)
wait_until "redis-server on :$redis_port" 10 \
  "(lambda c: (c.sendall(b'PING\r\n'), c.recv(16).startswith(b'+PONG'))[1])(socket.create_connection(('127.0.0.1', $redis_port), 1))"

"$bin/llmsched" sim --flavor vllm --port 8000 --max-num-seqs 8 --served-model-name sim-model &
pids+=($!)
wait_until "the simulated engine on :8000" 30 "urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=1)"

# One config per replica: the example's listeners moved, its [cluster] store set to Redis; each is loaded (validated)
# here so a mistake stops the script before anything serves.
"$bin/python" - "$run_dir" "$redis_port" <<'PY'
import re, sys
from pathlib import Path
from scheduler_svc.app.settings import load_config

run_dir, redis_port = Path(sys.argv[1]), int(sys.argv[2])
example = Path("configs/example.toml").read_text()
for i in (1, 2, 3):
    text = example
    for key, value in (("listen", 50050 + i), ("http_listen", 8080 + i), ("metrics_listen", 9463 + i)):
        text, n = re.subn(rf'(?m)^{key} = "127\.0\.0\.1:\d+"', f'{key} = "127.0.0.1:{value}"', text)
        assert n == 1, f"configs/example.toml: expected one {key} line"
    cluster = (
        f'store = "redis"\nredis_url = "redis://127.0.0.1:{redis_port}/0"\n'
        f'replica_name = "r{i}"\nkey_prefix = "llmsched-run"'
    )
    text, n = re.subn(r'(?m)^store = "memory".*$', lambda _: cluster, text)  # the [cluster] section's line
    assert n == 1, "configs/example.toml: expected one [cluster] store line"
    path = run_dir / f"r{i}.toml"
    path.write_text(text)
    config = load_config(path)
    assert config.server.listen == f"127.0.0.1:{50050 + i}" and config.cluster.replica_name == f"r{i}"
PY

for i in 1 2 3; do
  "$bin/llmsched" serve --config "$run_dir/r$i.toml" &
  pids+=($!)
done
for i in 1 2 3; do
  wait_until "replica r$i" 30 "urllib.request.urlopen('http://127.0.0.1:$((8080 + i))/healthz', timeout=1)"
done

cat <<MSG

  llm-scheduler cluster: replicas r1, r2, r3 on Redis 127.0.0.1:$redis_port (key prefix llmsched-run),
  in front of the simulated vLLM engine on 127.0.0.1:8000. Configs: $run_dir/r{1,2,3}.toml
    r1: gRPC 127.0.0.1:50051   HTTP http://127.0.0.1:8081/v1   metrics http://127.0.0.1:9464/metrics
    r2: gRPC 127.0.0.1:50052   HTTP http://127.0.0.1:8082/v1   metrics http://127.0.0.1:9465/metrics
    r3: gRPC 127.0.0.1:50053   HTTP http://127.0.0.1:8083/v1   metrics http://127.0.0.1:9466/metrics
  Call any replica, in another shell:
MSG
for i in 1 2 3; do
  cat <<MSG
    .venv/bin/llmsched stream --target 127.0.0.1:$((50050 + i)) --model sim-model --user alice "Tell me a story"
    .venv/bin/grpcurl -plaintext -H 'x-user-id: bob' -d '{"params": {"model": "sim-model", "prompt": "Hello", "max_tokens": 16}}' 127.0.0.1:$((50050 + i)) llmsched.v1.SchedulerService/Submit
    curl -N localhost:$((8080 + i))/v1/chat/completions -H 'Content-Type: application/json' -H 'x-user-id: carol' -d '{"model": "sim-model", "stream": true, "messages": [{"role": "user", "content": "Hi"}]}'
MSG
done
cat <<MSG
  Who leads sim-model: redis-cli -p $redis_port GET llmsched-run:leader:sim-model    members: redis-cli -p $redis_port ZRANGE llmsched-run:members 0 -1
  Ctrl-C stops everything.

MSG
wait -n "${pids[@]}" || true
echo "a process of the cluster exited; stopping the others" >&2
