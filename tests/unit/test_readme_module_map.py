"""README's module map matches the tree, so it cannot rot: every listed module exists, every module is listed.

The map sits between `<!-- module-map:start -->` and `<!-- module-map:end -->`; each entry is a line
"- `name`: its job", where `name` is a dotted module (`scheduler_svc.dispatch.dispatcher`, a package for its
`__init__.py`) or, for files outside Python packages (scripts), a path (`scripts/gen_protos.py`).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("llmsched", "scheduler_svc", "backends", "clients", "engines", "bench")
SCRIPT_DIRS = ("scripts", "engines/scripts")  # plain folders of scripts, not packages
ENTRY = re.compile(r"^- `([^`]+)`: \S", re.MULTILINE)


def map_entries() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    begin, end = "<!-- module-map:start -->", "<!-- module-map:end -->"
    assert readme.count(begin) == 1 and readme.count(end) == 1, "README lost its module-map markers"
    return ENTRY.findall(readme[readme.index(begin) : readme.index(end)])


def entry_path(entry: str) -> Path:
    """The file an entry names: a path as it is, a dotted module as its `.py` or its package's `__init__.py`."""
    if entry.endswith((".py", ".sh")):
        return ROOT / entry
    base = ROOT.joinpath(*entry.split("."))
    module = base.with_suffix(".py")  # a module wins over a same-named folder (bench/results/ holds outputs)
    return module if module.is_file() else base / "__init__.py"


def tree_entries() -> set[str]:
    """What the map must list: every module of the packages (an empty `__init__.py` has no job to state),
    and every script in the script folders."""
    expected: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "__pycache__" in rel.parts:
                continue
            if not all((ROOT.joinpath(*rel.parts[:i]) / "__init__.py").exists() for i in range(1, len(rel.parts))):
                continue  # not inside a package: a script folder, collected below
            if path.name == "__init__.py":
                if not path.read_text().strip():
                    continue
                expected.add(".".join(rel.parts[:-1]))
            else:
                expected.add(".".join((*rel.parts[:-1], path.stem)))
    for folder in SCRIPT_DIRS:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh") and "__pycache__" not in path.parts:
                expected.add(path.relative_to(ROOT).as_posix())
    return expected


def test_every_listed_module_exists_once() -> None:
    entries = map_entries()
    assert len(entries) > 50, "the module map parsed to almost nothing: has its line format changed?"
    assert [e for e, n in Counter(entries).items() if n > 1] == []
    assert [e for e in entries if not entry_path(e).is_file()] == []


def test_every_module_is_listed() -> None:
    missing = sorted(tree_entries() - set(map_entries()))
    assert missing == [], f"modules missing from README's module map (add one line each): {missing}"
