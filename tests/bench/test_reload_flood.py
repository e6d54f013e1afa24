"""The reload flood's counts from the engines' journals: a lost, a repeated and an overtaken request each show."""

from __future__ import annotations

import json
from pathlib import Path

from bench.tools.reload_flood import USERS, _count


def _journal(path: Path, events: list[tuple[str, str]]) -> Path:
    """A journal of (event, client id) lines, as the simulator writes them (engine ids `<client id>~<unique>`)."""
    lines: list[dict[str, object]] = [{"event": "boot"}]
    for seq, (event, tag) in enumerate(events):
        lines.append({"event": event, "id": f"{tag}~{seq}", "tag": tag, "seq": seq})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _everyone() -> list[str]:
    return [f"{user}-{n}" for user, count in USERS.items() for n in range(count)]


def test_a_clean_flood_counts_nothing_and_the_removed_engines_journal_comes_first(tmp_path: Path) -> None:
    tags = _everyone()
    before, after = tags[:10], tags[10:]
    journals = {
        "b0": _journal(tmp_path / "b0", [(e, t) for t in before for e in ("received", "finished")]),
        "b1": _journal(tmp_path / "b1", [(e, t) for t in after for e in ("received", "finished")]),
    }
    counts = _count(journals, 64, 64, ())
    assert (counts.lost, counts.duplicated, counts.reordered, counts.per_engine) == (0, 0, 0, (10, 54))


def test_a_lost_a_repeated_and_an_overtaken_request_are_each_counted(tmp_path: Path) -> None:
    tags = _everyone()
    tags.remove("bob-3")  # never reached an engine
    tags[0], tags[3] = tags[3], tags[0]  # alice-3 reached an engine before alice-0, 1 and 2
    events = [(e, t) for t in tags for e in ("received", "finished")]
    again = events.index(("received", "carol-2")) + 1
    events.insert(again, ("received", "carol-2"))  # sent twice, in its place
    journals = {"b0": _journal(tmp_path / "b0", events), "b1": _journal(tmp_path / "b1", [])}
    counts = _count(journals, 64, 63, ())
    assert (counts.lost, counts.duplicated) == (1, 1)
    assert counts.reordered == 5, "3 before 1, 2, 0; 1 and 2 before 0"
