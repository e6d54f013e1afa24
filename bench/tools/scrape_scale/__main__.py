"""`python -m bench.tools.scrape_scale`: what reading a hundred engines' metrics costs the scheduler (see the
package)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence

from bench.product import EVENT_LOOPS, BackendConfig, ServerConfig, configure_logging, run_on
from bench.tools import scrape_scale
from bench.tools.scrape_scale.measuring import Window, parse_costs, run
from bench.tools.scrape_scale.report import report, shipped
from bench.tools.scrape_scale.serving import serve
from bench.tools.scrape_scale.texts import KINDS, ROOT, engine_texts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=scrape_scale.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=100)
    parser.add_argument("--interval", type=float, default=shipped("scrape_interval_seconds", BackendConfig))
    parser.add_argument("--seconds", type=float, default=4.0, help="measuring window per way of reading")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--loop", choices=EVENT_LOOPS, default=shipped("event_loop", ServerConfig))
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not set(args.kinds) <= set(KINDS) or not 1 <= args.engines <= 1000 or args.interval <= 0:
        parser.error(f"--kinds among {','.join(KINDS)}, --engines 1-1000, --interval > 0")
    if args.serve:
        run_on(args.loop, lambda: serve(args.engines, args.kinds))
        return 0
    configure_logging("warning")  # not a line per engine as each first answers
    serving = ["--serve", "--engines", str(args.engines), "--kinds", ",".join(args.kinds), "--loop", args.loop]
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.tools.scrape_scale", *serving],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        urls = json.loads(child.stdout.readline())
        texts: dict[str, str] = run_on(args.loop, engine_texts)
        costs = parse_costs(texts, args.kinds)
        windows: list[Window] = run_on(args.loop, lambda: run(args, urls))
    finally:
        _stop(child)
    return 0 if report(windows, costs, texts, args) else 1


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.stdin is not None:
        child.stdin.close()
    try:
        child.wait(10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


if __name__ == "__main__":
    raise SystemExit(main())
