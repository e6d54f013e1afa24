"""S7's reading of the simulator journal: attempts per tag across a SIGKILL, failovers and reused ids."""

from __future__ import annotations

from typing import Any

from bench.scenarios.s7 import engine_attempts


def _line(event: str, seq: int = 0, **fields: Any) -> dict[str, Any]:
    return {"event": event, "seq": seq, "id": fields.pop("id", "x"), **fields}


def test_attempts_split_by_seq_and_boot() -> None:
    lines = [
        {"event": "boot"},
        _line("received", 1, id="same", tag="s7:1"),
        _line("received", 2, id="same", tag="s7:2"),  # a reused id: told apart by seq
        _line("started", 1, id="same"),
        _line("finished", 1, id="same"),
        _line("received", 3, id="r3", tag="s7:3"),
        _line("first_token", 3, id="r3"),
        {"event": "boot"},  # SIGKILL: s7:2 and s7:3 died with the engine
        _line("received", 1, id="r3", tag="s7:3"),  # the same seq again after a restart
        _line("aborted", 1, id="r3", reason="client disconnected"),
        {"event": "refused", "tag": "s7:4", "status": 400, "message": "too long"},
    ]
    by_tag, boots = engine_attempts(lines)
    assert boots == 2
    assert [a.end for a in by_tag["s7:1"]] == ["finished"]
    assert [a.end for a in by_tag["s7:2"]] == ["killed"]
    assert [(a.end, a.boot) for a in by_tag["s7:3"]] == [("killed", 1), ("aborted", 2)]
    assert by_tag["s7:3"][0].events == ["received", "first_token"]
    assert [a.end for a in by_tag["s7:4"]] == ["refused"]
