"""Just enough of a Dockerfile reader for the deploy tests: stages of (instruction, arguments) with line
continuations joined and comments dropped, JSON (exec) forms decoded, and the .dockerignore rules."""

from __future__ import annotations

import fnmatch
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"


@dataclass
class Stage:
    """One FROM ... section: its base image, its name, and its instructions in order."""

    base: str
    name: str = ""
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]

    def one(self, instruction: str) -> str:
        found = self.all(instruction)
        assert len(found) == 1, f"expected one {instruction} in stage {self.name or self.base}, found {found}"
        return found[0]


def stages(path: Path = DOCKERFILE) -> list[Stage]:
    """The Dockerfile's stages, in order."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    result: list[Stage] = []
    for line in logical:
        instruction, _, args = line.partition(" ")
        instruction, args = instruction.upper(), args.strip()
        if instruction == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            result.append(Stage(words[0], name))
        else:
            assert result, f"{instruction} before any FROM"
            result[-1].instructions.append((instruction, args))
    return result


def exec_form(args: str) -> list[str]:
    """A JSON-array (exec form) argument list; the shell form is refused (signals would go to a shell)."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"not an exec form: {args}"
    return value


def healthcheck(stage: Stage) -> tuple[dict[str, str], list[str]]:
    """HEALTHCHECK's options (--interval=...) and its command (exec form)."""
    args = stage.one("HEALTHCHECK")
    options: dict[str, str] = {}
    while args.startswith("--"):
        option, _, args = args.partition(" ")
        key, _, value = option[2:].partition("=")
        options[key] = value
        args = args.strip()
    kind, _, command = args.partition(" ")
    assert kind.upper() == "CMD", f"HEALTHCHECK without CMD: {args}"
    return options, exec_form(command.strip())


def env(stage: Stage) -> dict[str, str]:
    """ENV key=value pairs of a stage (later ones win), values unquoted as the shell would."""
    values: dict[str, str] = {}
    for args in stage.all("ENV"):
        for word in shlex.split(args):
            key, sep, value = word.partition("=")
            assert sep, f"ENV in the key=value form only: {args}"
            values[key] = value
    return values


def ignored(path: str, rules: list[str]) -> bool:
    """Whether .dockerignore's `rules` keep `path` (relative, /-separated) out of the build context: the
    last rule matching the path or one of its parent folders decides, `!` rules re-include."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for rule in rules:
        negated = rule.startswith("!")
        pattern = rule.removeprefix("!").rstrip("/")
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            verdict = not negated
    return verdict


def ignore_rules(path: Path = DOCKERIGNORE) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
