"""What the docs name exists, so they cannot rot: every path, module, class or function, make target, config
key, CLI command, metric name and link that README.md and docs/*.md name is checked against the tree; and
the module map in docs/architecture.md lists every module of the tree exactly once.

The checks read the Markdown mechanically: inline code spans, links, and fenced `bash` and `toml` blocks.
- a path (a word with a `/` whose first part is a top-level entry of the repository, or a `.py`/`.sh`/`.proto`
  file name) must exist; a link's target must exist, and its `#anchor` must be a heading of that page;
- a dotted name whose first part is one of our packages or modules (`scheduler_svc.dispatch.dispatcher`,
  `dispatcher.ModelDispatcher._send`, `Ticket.assign`) must resolve to a module and its attributes;
- a dotted name whose first part is a config section (`server.listen`, `gate.policy`), a `[section]`, a
  `key = value` span, and every key of a `toml` block must be a key of the config schema;
- `make X` names a Makefile target, `llmsched X` a subcommand, `llmsched_*` a metric the service defines,
  `vllm:*` / `tgi_*` / `llamacpp:*` a metric an adapter or the simulator reads or writes.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
import subprocess
import tomllib
import typing
from collections import Counter
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from scheduler_svc.config.schema import Config
from scheduler_svc.policies import scheduling_params

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("llmsched", "scheduler_svc", "backends", "clients", "engines", "bench")
# where a module named by its last parts lives (`dispatcher.expire` is scheduler_svc.dispatch.dispatcher's)
SERVICE_LAYERS = ("app", "grpc", "http", "cluster", "dispatch", "policies", "core", "config")
# libraries with a package of ours of the same name: `grpc.aio` is the library, our face is named in full
LIBRARIES = ("grpc",)
MODULE_HOMES = ("", *(f"{p}." for p in PACKAGES), *(f"scheduler_svc.{layer}." for layer in SERVICE_LAYERS),
                "bench.scenarios.", "backends.adapters.", "backends.sim.")  # fmt: skip
SCRIPT_DIRS = ("scripts", "engines/scripts")  # plain folders of scripts, not packages
GENERATED_DIRS = (".venv", ".cache")  # made by the Makefile, absent from a fresh clone until then
MAP_ENTRY = re.compile(r"^- `([^`]+)`: \S", re.MULTILINE)
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
FILE_NAME = re.compile(r"[\w.-]+\.(py|sh|proto|md|toml|json|yaml|js|ts|go|png)")
SECTIONS = (
    "server",
    "auth",
    "scheduling",
    "models",
    "cluster",
    "tracing",
    "gate",
    "locality",
    "weights",
    "classes",
    "backends",
)


# ------------------------------------------------------------------ reading the docs


def _outside_fences(text: str) -> str:
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def code_spans(path: Path) -> list[str]:
    return CODE_SPAN.findall(_outside_fences(path.read_text()))


def fenced(path: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == language]


def links(path: Path) -> list[str]:
    return [a or b for a, b in LINK.findall(_outside_fences(path.read_text()))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", _outside_fences(path.read_text()), re.MULTILINE)}


# ------------------------------------------------------------------ what exists


@cache
def top_level() -> set[str]:
    return {p.name for p in ROOT.iterdir() if p.name != ".git"}


@cache
def file_names() -> set[str]:
    skipped = {".git", *GENERATED_DIRS}
    return {p.name for p in ROOT.rglob("*") if p.is_file() and not set(p.relative_to(ROOT).parts) & skipped}


@cache
def ignored(path: str) -> bool:
    """Whether git ignores the path: an output (bench/results/, generated client code), absent from a clone."""
    run = [subprocess.run(["git", "check-ignore", "-q", p], cwd=ROOT, check=False) for p in (path, path + "/")]
    return any(r.returncode == 0 for r in run)


@cache
def proto_names() -> set[str]:
    """The services, messages and enums the protos define (`llmsched.v1.SchedulerService`)."""
    text = "\n".join(p.read_text() for p in (ROOT / "protos").rglob("*.proto"))
    return set(re.findall(r"^\s*(?:service|message|enum)\s+(\w+)", text, re.MULTILINE))


@cache
def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.MULTILINE))


@cache
def cli_commands() -> set[str]:
    tree = ast.parse((ROOT / "scheduler_svc" / "app" / "cli.py").read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@cache
def metric_names() -> set[str]:
    """Every llmsched_* series the service can export: the families defined in the code, with the samples
    Prometheus derives from them (`_total`, `_bucket`, `_sum`, `_count`)."""
    names: set[str] = set()
    for path in (ROOT / "scheduler_svc").rglob("*.py"):
        for name in re.findall(r'"(llmsched_[a-z0-9_]+)"', path.read_text()):
            base = name.removesuffix("_total")
            names |= {base, base + "_total", base + "_bucket", base + "_sum", base + "_count"}
    return names


@cache
def span_attributes() -> set[str]:
    """The attributes the service's spans carry (`llmsched.gate.causes`): OpenTelemetry's names, not code."""
    return set(re.findall(r'"(llmsched\.[a-z0-9_.]+)"', (ROOT / "scheduler_svc" / "app" / "tracing.py").read_text()))


@cache
def engine_code() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "backends").rglob("*.py"))


def _fields(cls: type[Any], prefix: str = "") -> Iterator[str]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        yield path
        hint = hints[f.name]
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            yield from _fields(item, path + ".")


@cache
def config_keys() -> set[str]:
    """The schema's keys, and the parameters the registered policies read from [scheduling]."""
    return set(_fields(Config)) | {f"scheduling.{key}" for key in scheduling_params()}


def is_config_key(name: str) -> bool:
    return any(key == name or key.endswith("." + name) for key in config_keys())


@cache
def classes_by_name() -> dict[str, list[type[Any]]]:
    found: dict[str, list[type[Any]]] = {}
    for module_name in sorted(tree_entries()):
        if "/" in module_name or module_name.startswith("bench.__main__"):
            continue
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__ == module_name:
                found.setdefault(name, []).append(value)
    return found


def _has(owner: Any, name: str) -> bool:
    """An attribute of a module or class, a dataclass or protobuf message field, or an instance attribute its
    code sets."""
    if hasattr(owner, name) or name in getattr(owner, "__dataclass_fields__", {}):
        return True
    if name in getattr(getattr(owner, "DESCRIPTOR", None), "fields_by_name", {}):
        return True
    if inspect.isclass(owner):
        try:
            source = inspect.getsource(owner)
        except (OSError, TypeError):
            return False
        return re.search(rf"\bself\.{re.escape(name)}\b", source) is not None
    return False


def resolves(parts: list[str], start: Any) -> bool:
    owner = start
    for part in parts:
        if not _has(owner, part):
            return False
        value = getattr(owner, part, None)
        if value is None:  # an instance attribute or field: nothing further to look into
            return part == parts[-1]
        owner = value
    return True


def code_name_problem(name: str) -> str | None:
    """None when `name` (dotted) resolves, or is none of ours; else what is wrong."""
    parts = name.split(".")
    if name.startswith("llmsched.v1.") and len(parts) == 3 and parts[2] in proto_names():
        return None
    if parts[0] in LIBRARIES or name in span_attributes():
        return None
    if parts[0] in classes_by_name():
        if any(resolves(parts[1:], cls) for cls in classes_by_name()[parts[0]]):
            return None
        return f"{name}: class {parts[0]} has no {'.'.join(parts[1:])}"
    for home in MODULE_HOMES:
        for split in range(len(parts), 0, -1):
            module_name = home + ".".join(parts[:split])
            if _spec_exists(module_name):
                if resolves(parts[split:], importlib.import_module(module_name)):
                    return None
                break
    first_is_ours = any(_spec_exists(home + parts[0]) for home in MODULE_HOMES)
    return f"{name}: no such module or attribute" if first_is_ours else None


@cache
def _spec_exists(name: str) -> bool:
    """Whether `name` is an importable module of ours (the home prefixes make "" + "grpc" not ours)."""
    if not name.startswith(PACKAGES):
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def path_problem(word: str, doc: Path) -> str | None:
    word = word.strip(".,;:()")
    if "://" in word or word.startswith(("/", "$", "-")) or re.search(r"[<>{}*\[\]|=]", word):
        return None
    if "/" in word:
        first = word.split("/")[0]
        if first in GENERATED_DIRS:
            return None
        if first in top_level():
            return None if (ROOT / word).exists() or ignored(word) else f"{word}: no such path"
        return None
    if re.fullmatch(r"[\w.-]+\.(py|sh|proto)", word):
        return None if word in file_names() else f"{word}: no such file"
    return None


# ------------------------------------------------------------------ the checks


def span_problems(span: str, doc: Path) -> list[str]:
    problems: list[str] = []
    words = span.split()
    if not words:
        return problems
    command = words[1:] if words[0] in (".venv/bin/llmsched", "llmsched") else None
    if words[0] == "make" and len(words) > 1 and words[1] not in make_targets():
        problems.append(f"make {words[1]}: no such Makefile target")
    if command and not command[0].startswith("-") and command[0] not in cli_commands():
        problems.append(f"llmsched {command[0]}: no such subcommand")
    for metric, star in re.findall(r"\b(llmsched_[a-z0-9_]+)(\*?)", span):
        known = metric_names()
        if (star and not any(m.startswith(metric) for m in known)) or (not star and metric not in known):
            problems.append(f"{metric}{star}: no such metric")
    for metric in re.findall(r"\b((?:vllm|llamacpp):[a-z_:]+[a-z]|tgi_[a-z_]+[a-z])\b", span):
        if re.sub(r"_(total|count|sum|bucket)$", "", metric) not in engine_code():
            problems.append(f"{metric}: no adapter or simulator code names this engine metric")
    for header in re.findall(r"^\[\[?([a-z_.]+)\]\]?", span):
        if not header.startswith("tool.") and not any(k == header for k in config_keys()):
            problems.append(f"[{header}]: no such config section")
    toml_value = r"(\"|[0-9-]|true|false|\[|\{)"
    if (match := re.match(rf"^([a-z_]+) = {toml_value}", span)) and not is_config_key(match.group(1)):
        problems.append(f"{match.group(1)}: no such config key")
    for word in words:
        if problem := path_problem(word, doc):
            problems.append(problem)
    dotted = DOTTED.match(span)
    rest = span[dotted.end() :] if dotted else "x"
    if dotted and (rest == "" or re.fullmatch(r"\(.*\)", rest)) and not FILE_NAME.fullmatch(span):
        name = dotted.group(0)
        config_like = name.split(".")[0] in SECTIONS
        if config_like and is_config_key(name):
            return problems
        code = code_name_problem(name)
        if code is None:
            return problems
        problems.append(f"{name}: neither a config key nor code" if config_like else code)
    return problems


def all_problems(doc: Path) -> list[str]:
    problems = [p for span in code_spans(doc) for p in span_problems(span, doc)]
    for target in links(doc):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        page = (doc.parent / file).resolve() if file else doc
        if not page.exists():
            problems.append(f"link {target}: no such file")
        elif anchor and page.suffix == ".md" and anchor not in anchors(page):
            problems.append(f"link {target}: no such heading")
    for block in fenced(doc, "bash"):
        for line in block.splitlines():
            words = line.split("#", 1)[0].split()
            if words[:1] == ["make"] and len(words) > 1 and words[1] not in make_targets():
                problems.append(f"make {words[1]}: no such Makefile target")
            problems += [p for w in words if (p := path_problem(w, doc))]
    for block in fenced(doc, "toml"):
        problems += toml_problems(tomllib.loads(block), Config)
    return [f"{doc.relative_to(ROOT)}: {p}" for p in problems]


def toml_problems(table: dict[str, Any], cls: type[Any], where: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    problems = []
    for key, value in table.items():
        if key not in hints:
            problems.append(f"toml block: {where}{key} is no config key")
            continue
        hint = hints[key]
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            for sub in value if isinstance(value, list) else [value]:
                problems += toml_problems(sub, item, f"{where}{key}.")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_everything_a_page_names_exists(doc: Path) -> None:
    assert all_problems(doc) == []


def test_the_checks_catch_what_no_longer_exists() -> None:
    """Each kind of reference fails when it names something that is not there."""
    doc = ROOT / "docs" / "architecture.md"
    wrong = [
        "scripts/no_such_script.py",
        "make no-such-target",
        "llmsched no-such-command",
        "llmsched_no_such_metric_total",
        "vllm:no_such_metric",
        "dispatcher.ModelDispatcher._no_such_method",
        "scheduler_svc.no_such_module",
        "Ticket.no_such_attribute",
        "gate.no_such_key",
        "[models.no_such_section]",
        "no_such_key = 1",
    ]
    assert [span for span in wrong if not span_problems(span, doc)] == []
    right = ["dispatcher.ModelDispatcher.decide", "Ticket.assign", "gate.policy", "server.listen",
             "make docs", "llmsched_request_outcomes_total{outcome}", "[models.gate]", "grpc.health.v1",
             "configs/example.toml", "auth.Authenticator.identify"]  # fmt: skip
    assert {span: span_problems(span, doc) for span in right} == {span: [] for span in right}


# ------------------------------------------------------------------ the module map


def map_entries() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    begin, end = "<!-- module-map:start -->", "<!-- module-map:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, "docs/architecture.md lost its module-map markers"
    return MAP_ENTRY.findall(text[text.index(begin) : text.index(end)])


def entry_path(entry: str) -> Path:
    """The file an entry names: a path as it is, a dotted module as its `.py` or its package's `__init__.py`."""
    if entry.endswith((".py", ".sh")):
        return ROOT / entry
    base = ROOT.joinpath(*entry.split("."))
    module = base.with_suffix(".py")  # a module wins over a same-named folder (bench/results/ holds outputs)
    return module if module.is_file() else base / "__init__.py"


@cache
def tree_entries() -> frozenset[str]:
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
    return frozenset(expected)


def test_every_listed_module_exists_once() -> None:
    entries = map_entries()
    assert len(entries) > 50, "the module map parsed to almost nothing: has its line format changed?"
    assert [e for e, n in Counter(entries).items() if n > 1] == []
    assert [e for e in entries if not entry_path(e).is_file()] == []


def test_every_module_is_listed() -> None:
    missing = sorted(tree_entries() - set(map_entries()))
    assert missing == [], f"modules missing from docs/architecture.md's module map (add one line each): {missing}"
