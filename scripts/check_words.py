"""The product speaks only of itself: no file tells how or when it was built.

Scans every file git tracks (text files; vendored third-party protos, lock files, images and the bench's run
records aside) for the words of a project's process rather than its product: a numbered or relative work
session, an issue or pull-request number, who filed something, whether a change is merged, and dates (run
diaries). Git keeps that history; code, comments, tests and docs say what the product does and why, in the
present tense.

Technical senses of "session" are not hits: an aiohttp `ClientSession`, a prompt-cache session
(`prompt_cache_key`, the locality policy's session map) and pytest's session-scoped fixtures never come with
an ordinal or a "this"/"last"/"next" before them.

    python scripts/check_words.py          # exit 1 and list the hits (file:line: text) when there are any
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|"
    "fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|[0-9]+(?:st|nd|rd|th)"
)
_RELATIVE = "this|that|last|next|previous|earlier|later|working|prior|past|current"

# (what the words are, the pattern); each pattern is written so that its own source text does not match it
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a work session", re.compile(rf"\b(?:{_ORDINALS}|{_RELATIVE})[- ]sessions?\b", re.IGNORECASE)),
    ("a work session", re.compile(r"\bsessions?\s+(?:ago|before\s+(?:this|last))\b", re.IGNORECASE)),
    ("an issue number", re.compile(r"\bissues?[ -]#?[0-9]+", re.IGNORECASE)),
    ("an issue number", re.compile(r"(?<![\w/&#])#[0-9]{1,5}\b(?![0-9a-fA-F])(?=[\s,.;:)]|$)")),
    ("a pull-request number", re.compile(r"\b(?:PR|pull\s+request)\s*#?[0-9]+\b")),
    ("who filed it", re.compile(r"\bthe\s+filer\b|\bfiled\s+by\b", re.IGNORECASE)),
    ("merge status", re.compile(r"\bnot\s+(?:yet\s+)?merged\b|\bmerged\s+yet\b", re.IGNORECASE)),
    ("a date", re.compile(r"\b20[0-9]{2}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])\b")),
)

# files that are not ours to word, or are data rather than prose
EXCLUDED_PREFIXES = ("clients/node/protos/google/", "bench/results/records/")
EXCLUDED_NAMES = ("package-lock.json", "go.sum")
EXCLUDED_SUFFIXES = (".png", ".svg", ".jpg", ".gguf", ".bin")


@dataclass(frozen=True)
class Hit:
    path: str
    line: int
    what: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}: {self.text.strip()[:160]}"


def tracked_files(root: Path = ROOT) -> list[str]:
    """Every file git tracks (and new files not ignored), relative to the root."""
    listing = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted({line for line in listing.splitlines() if line})


def scanned(paths: Iterable[str]) -> Iterator[str]:
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if path.startswith(EXCLUDED_PREFIXES) or name in EXCLUDED_NAMES or path.endswith(EXCLUDED_SUFFIXES):
            continue
        yield path


def hits_in_text(path: str, text: str) -> list[Hit]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern in PATTERNS:
            if pattern.search(line):
                found.append(Hit(path, number, what, line))
                break
    return found


def hits(root: Path = ROOT) -> list[Hit]:
    found: list[Hit] = []
    for path in scanned(tracked_files(root)):
        file = root / path
        if not file.is_file():
            continue  # deleted in the work tree
        data = file.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        found += hits_in_text(path, data.decode("utf-8", "replace"))
    return found


def main() -> int:
    found = hits()
    for hit in found:
        print(hit)
    print(
        f"word check: {len(found)} hit(s)" + ("" if not found else "; say what the product does, in the present tense")
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
