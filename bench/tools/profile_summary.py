"""Summarise a saved pyinstrument session of the scheduler (`python -m bench --scenarios S6 --profile` writes
one): own time per function and per area, as S6 writes beside its results (`bench.scenarios.s6.profile`).

    python -m bench.tools.profile_summary bench/results/s6_profile.pyisession
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.scenarios.s6.profile import summarize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("session", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(summarize(args.session, args.top), end="")


if __name__ == "__main__":
    main()
