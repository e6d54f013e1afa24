"""`python -m bench.scenarios.s9 [--quick] [--json FILE]`: S9's parts, their figures printed as they come, then
the result's table, notes and targets (the targets at full size only)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from bench.scenarios.s9.parts import QUICK, S9Params, run_parts
from bench.scenarios.s9.summary import build_result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="S9 scale: the core at ten thousand users, on the virtual clock")
    parser.add_argument("--quick", action="store_true", help="small sizes: a run of seconds")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    p = QUICK if args.quick else S9Params()
    figures = run_parts(p)
    result = build_result(figures, p, targets=not args.quick)
    assert result.table is not None
    print(" | ".join(result.table.columns))
    for row in result.table.rows:
        print(" | ".join(row))
    for note in result.notes:
        print(f"- {note}")
    for target in result.targets:
        print(f"{target.figure}: {target.format(target.value)} (target {target.target}): {target.status}")
    if args.json:
        args.json.write_text(json.dumps(dataclasses.asdict(result), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
