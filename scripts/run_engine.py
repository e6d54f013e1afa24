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

from engines import install, llamacpp_process, vllm_process  # noqa: E402

CONFIG = """
[server]
listen = "127.0.0.1:50051"
metrics_listen = "127.0.0.1:9464"
http_listen = "127.0.0.1:8080"
# The CPU engine shares this machine's cores with the scheduler and its clients, so every cycle spent per
# streamed token is the engine's: past an answer's first 32 tokens its tokens leave in groups within 50 ms,
# the shipped default (real vLLM, all on 2 shared cores: the flood's span 1.13-1.22x FIFO's against
# 1.30-1.52x reading every token: docs/benchmarks.md, R1).
stream_read_interval_seconds = 0.05

[scheduling]
default_class = "interactive"

[[scheduling.classes]]
name = "interactive"
rank = 0
{interactive_limits}

[[scheduling.classes]]
name = "batch"
rank = 1
engine_priority = 10
require_idle_engine = true

[[models]]
name = "{model}"
max_tokens_limit = 900
# The gate's waiting targets are the defaults: at vLLM's priority queue (latecomers jump it) 1.5 x the
# engine's slots, which the scheduler learns from the engine's metrics (configuration.md, "Derived from
# the engine").

[[models.backends]]
name = "{kind}-0"
kind = "{kind}"
url = "http://127.0.0.1:{port}"
priority_scheduling = {priority}
"""


# The gate holds interactive work to a time per output token: it learns the engine's step time against
# its running batch and sends one more request only while the predicted TPOT stays under the limit. The
# tiny CPU models run at a few ms per token, so the limit only binds on a slow or crowded engine.
TPOT_LIMIT = """max_tpot_seconds = 0.15             # engine time per output token, interactive (and lower
                                    # classes while interactive is active) held under it"""
# llama.cpp exports a TPOT (tokens_predicted_seconds_total / tokens_predicted_total), but it adds to both
# counters only when a request ends, with that request's whole generation: a reading is the mean TPOT of
# requests that ended during the scrape interval, as slow as their batch was over their lifetime, and
# cannot be paired with the batch running now. The gate's step-time line would learn from mismatched
# pairs and the limit would act a request's lifetime late, so no TPOT limit here: llama.cpp is gated on
# its queue (requests_deferred) and slots only.
NO_TPOT_LIMIT = "# no max_tpot_seconds: llama.cpp reports TPOT only as requests end (see scripts/run_engine.py)"


def config_text(engine: str, model: str, port: int) -> str:
    """The scheduler config `make run ENGINE=...` serves in front of the engine."""
    return CONFIG.format(
        model=model,
        kind=engine,
        port=port,
        priority="true" if engine == "vllm" else "false",
        interactive_limits=TPOT_LIMIT if engine == "vllm" else NO_TPOT_LIMIT,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("engine", choices=["vllm", "llamacpp"])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="sim-model", help="the name clients use (and the engine serves)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the engine on TERM as on Ctrl-C
    install(args.engine)
    if args.engine == "vllm":
        engine = vllm_process(port=args.port, served_model_name=args.model, scheduling_policy="priority")
    else:
        engine = llamacpp_process(port=args.port, served_model_name=args.model)
    print(f"starting {args.engine} on {engine.url} (log: {engine.log_path}) ...", flush=True)
    engine.start()
    config = ROOT / ".cache" / f"run-{args.engine}.toml"
    config.write_text(config_text(args.engine, args.model, args.port))
    print(
        f"\n  llm-scheduler on 127.0.0.1:50051 (gRPC) and http://127.0.0.1:8080/v1 (OpenAI-compatible HTTP)"
        f" in front of real {args.engine} ({engine.url})\n"
        f"  .venv/bin/llmsched stream --model {args.model} --user alice --max-tokens 32 'Tell me a story'\n",
        flush=True,
    )
    try:
        subprocess.run([sys.executable, "-m", "scheduler_svc.app.cli", "serve", "--config", str(config)], check=False)
    except KeyboardInterrupt:
        pass
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
