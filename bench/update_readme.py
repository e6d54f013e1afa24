"""Put the latest benchmark summary into README.md, between `<!-- results:start -->` and `<!-- results:end -->`.

The README links a copy of one plot kept under bench/figures/ (tracked), because bench/results/ is
git-ignored and a link into it would break for anyone reading the repository.

    python bench/update_readme.py [bench/results/results.json]
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import report, results  # noqa: E402

START, END = "<!-- results:start -->", "<!-- results:end -->"
PLOT = "s1_ttft.png"
FIGURES = ROOT / "bench" / "figures"


def update(readme: Path, results_json: Path) -> None:
    loaded, meta = results.load(results_json)
    image = None
    if (results_json.parent / PLOT).is_file():
        FIGURES.mkdir(exist_ok=True)
        shutil.copyfile(results_json.parent / PLOT, FIGURES / PLOT)
        image = (FIGURES / PLOT).relative_to(ROOT).as_posix()
    text = readme.read_text()
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        sys.exit(f"{readme}: add the markers {START} and {END} where the results go")
    body = report.summary_markdown(loaded, meta, image)
    readme.write_text(pattern.sub(lambda _: f"{START}\n{body}\n{END}", text, count=1))
    print(f"updated the results section of {readme}")


def main() -> None:
    results_json = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench" / "results" / "results.json"
    update(ROOT / "README.md", results_json)


if __name__ == "__main__":
    main()
