"""Record the golden traces again, or check them: `python -m tests.golden.record [--check] [SCENARIO ...]`.

Without names, every scenario (and a trace file no scenario owns any more is deleted); `--check` writes
nothing and exits 1 when a trace differs from its file. Re-record only for a deliberate change of the
dispatcher's behaviour, in a commit of its own that says why the decisions changed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scheduler_svc.app.logs import configure_logging
from tests.golden.scenarios import SCENARIOS, Scenario
from tests.golden.simulation import run_scenario

TRACES = Path(__file__).resolve().parent / "traces"


def trace_path(scenario: Scenario) -> Path:
    return TRACES / f"{scenario.name}.jsonl"


def trace_text(scenario: Scenario) -> str:
    """The scenario's trace file as it must read."""
    return "\n".join(run_scenario(scenario)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the files, write nothing")
    parser.add_argument("scenarios", nargs="*", help="scenario names (default: all)")
    args = parser.parse_args(argv)
    configure_logging("error")  # failovers log warnings: the trace says what matters
    by_name = {s.name: s for s in SCENARIOS}
    unknown = sorted(set(args.scenarios) - set(by_name))
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}")
    chosen = [by_name[name] for name in args.scenarios] or SCENARIOS
    differing = []
    for scenario in chosen:
        path = trace_path(scenario)
        text = trace_text(scenario)
        if path.exists() and path.read_text() == text:
            continue
        differing.append(scenario.name)
        if not args.check:
            TRACES.mkdir(exist_ok=True)
            path.write_text(text)
    stale = [] if args.scenarios else sorted(set(TRACES.glob("*.jsonl")) - {trace_path(s) for s in SCENARIOS})
    for path in stale:
        differing.append(path.stem)
        if not args.check:
            path.unlink()
    verb = "differ" if args.check else "recorded"
    print(f"{len(chosen)} scenarios, {len(differing)} {verb}{': ' if differing else ''}{' '.join(differing)}")
    return 1 if args.check and differing else 0


if __name__ == "__main__":
    sys.exit(main())
