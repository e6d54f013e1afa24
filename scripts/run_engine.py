"""`make run ENGINE=vllm|llamacpp`: a real CPU engine on 127.0.0.1:8000 and the scheduler in front of it.

Installs the engine on first use (cached under .cache/engines), generates the tiny model, starts the
engine, writes a scheduler config for it under .cache/ and runs `llmsched serve` until Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.engines.engines import llamacpp_process, vllm_process  # noqa: E402

CONFIG = """
[server]
listen = "127.0.0.1:50051"
metrics_listen = "127.0.0.1:9464"

[scheduling]
default_class = "interactive"

[[scheduling.classes]]
name = "interactive"
rank = 0

[[scheduling.classes]]
name = "batch"
rank = 1
engine_priority = 10
require_idle_engine = true

[[models]]
name = "{model}"
max_tokens_limit = 900

[[models.backends]]
name = "{kind}-0"
kind = "{kind}"
url = "http://127.0.0.1:{port}"
priority_scheduling = {priority}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("engine", choices=["vllm", "llamacpp"])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="sim-model", help="the name clients use (and the engine serves)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the engine on TERM as on Ctrl-C
    subprocess.run(["bash", str(ROOT / "scripts" / "engines" / f"install_{args.engine}.sh")], check=True)
    if args.engine == "vllm":
        engine = vllm_process(port=args.port, served_model_name=args.model, scheduling_policy="priority")
    else:
        engine = llamacpp_process(port=args.port, served_model_name=args.model)
    print(f"starting {args.engine} on {engine.url} (log: {engine.log_path}) ...", flush=True)
    engine.start()
    config = ROOT / ".cache" / f"run-{args.engine}.toml"
    config.write_text(
        CONFIG.format(
            model=args.model, kind=args.engine, port=args.port, priority="true" if args.engine == "vllm" else "false"
        )
    )
    print(
        f"\n  llm-scheduler on 127.0.0.1:50051 in front of real {args.engine} ({engine.url})\n"
        f"  .venv/bin/llmsched stream --model {args.model} --user alice --max-tokens 32 'Tell me a story'\n",
        flush=True,
    )
    try:
        subprocess.run([sys.executable, "-m", "scheduler_svc.cli", "serve", "--config", str(config)], check=False)
    except KeyboardInterrupt:
        pass
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
