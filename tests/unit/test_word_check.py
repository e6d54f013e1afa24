"""The word check (`scripts/check_words.py`, run by `make check`): it finds the words of the project's
process, lets the technical senses of "session" through, and the tree has none of the former.

The samples below are built from pieces, so this file does not hold the phrases it tests for."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_words", ROOT / "scripts" / "check_words.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


words = _load()
S = "session"

HITS = [
    f"the nineteenth {S}'s runs",
    f"measured in this {S}",
    f"R1, thirteenth {S} (a faster machine)",
    f"before the next {S}",
    f"a working {S} stops",
    f"the 3rd {S}",
    "see issue" + " 14",
    "Issues " + "9 and 11",
    "(issue" + "-12)",
    "fixed in #" + "123.",
    "PR " + "#45",
    "as the " + "filer asked",
    "the agent is not merg" + "ed yet",
    "measured on 2026-" + "12-02, load average 6",
]
MISSES = [
    "one aiohttp session per engine",
    f"async with aiohttp.Client{S.capitalize()}() as {S}:",
    f"@pytest.fixture(scope='{S}')",
    f"the prompt-cache {S} map (prompt_cache_key)",
    f"{S}_max_bytes = 1048576",
    "a pyinstrument session file",
    "color: #fff; see the header `x-request-id`",
    "HTTP 429 and 503; issues a retry hint",
]


@pytest.mark.parametrize("line", HITS)
def test_process_words_are_hits(line: str) -> None:
    assert words.hits_in_text("sample.md", line), line


@pytest.mark.parametrize("line", MISSES)
def test_technical_words_are_not(line: str) -> None:
    assert words.hits_in_text("sample.md", line) == [], line


def test_the_tree_speaks_only_of_the_product() -> None:
    assert [str(hit) for hit in words.hits()] == []
