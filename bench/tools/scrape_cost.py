"""What one metrics scrape costs the engine's front end: the whole /metrics against the scheduler's selection.

Why: the scheduler scrapes each engine several times a second, and vLLM's /metrics is written by its HTTP
front end, the process that also streams every token (on a GPU host, the busy one). This starts the engine
(`--engine vllm`, the project's CPU vLLM and tiny model; or `sim`), then for `--rounds` rounds, alternating
the order, scrapes it `--scrapes` times each way and reads the front end's CPU time from /proc:

- whole: `GET /metrics`, what a Prometheus server or an adapter without selection reads;
- selected: `GET /metrics/?name[]=...` with the vLLM adapter's own sample names (`bench.product.VLLM_METRICS`).

It prints milliseconds of front-end CPU per scrape each way (median over rounds, and range), the bytes
answered, and the ratio.

    .venv/bin/python -m bench.tools.scrape_cost --engine vllm
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence

from bench.harness import cpu_seconds
from bench.product import VLLM_METRICS, selected_metrics
from engines import EngineProcess, start_sim, start_vllm


def _scrapes(url: str, pid: int, count: int) -> tuple[float, int]:
    """Milliseconds of the engine process's CPU per scrape of `url`, and the bytes of one answer."""
    size, before = 0, cpu_seconds(pid)
    for _ in range(count):
        with urllib.request.urlopen(url, timeout=10) as response:
            size = len(response.read())
    return 1000 * (cpu_seconds(pid) - before) / count, size


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("vllm", "sim"), default="vllm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scrapes", type=int, default=100)
    args = parser.parse_args(argv)
    engine: EngineProcess = start_vllm() if args.engine == "vllm" else start_sim()
    try:
        assert engine.proc is not None
        selected_url, query = selected_metrics(f"{engine.url}/metrics", VLLM_METRICS)
        urls = {"whole": f"{engine.url}/metrics", "selected": f"{selected_url}?{urllib.parse.urlencode(query)}"}
        costs: dict[str, list[float]] = {way: [] for way in urls}
        sizes: dict[str, int] = {}
        for round_no in range(args.rounds):
            ways = list(urls) if round_no % 2 == 0 else list(reversed(urls))
            for way in ways:
                costs[way].append(_scrapes(urls[way], engine.proc.pid, args.scrapes)[0])
                sizes[way] = _scrapes(urls[way], engine.proc.pid, 1)[1]
                time.sleep(0.2)
    finally:
        engine.stop()
    medians = {way: statistics.median(values) for way, values in costs.items()}
    for way, values in costs.items():
        print(
            f"{way:8s}: {medians[way]:6.2f} ms of the front end's CPU per scrape "
            f"(range {min(values):.2f}-{max(values):.2f}), {sizes[way]} bytes"
        )
    print(f"selected / whole: {medians['selected'] / medians['whole']:.2f}x the front end's CPU per scrape")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
