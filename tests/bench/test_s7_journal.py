"""S7's reading of the simulator journal: attempts per tag across a SIGKILL, failovers and reused ids."""

from __future__ import annotations

from typing import Any

from bench.scenarios.s7.analysis import analyse_storms, engine_attempts
from bench.scenarios.s7.calls import Call


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


def test_storm_cancels_are_counted_three_ways_and_orphans_found() -> None:
    calls = [Call(n, "storm", "storm-0-1", f"storm-{n}", prefix="storm") for n in range(1, 6)]
    for call in calls:
        call.admitted, call.end = True, "cancelled"
    lines = [
        {"event": "boot"},
        _line("received", 1, tag="storm:1"),
        _line("aborted", 1, reason="client disconnected"),
        _line("received", 2, tag="storm:2"),
        _line("finished", 2),  # ran to its end although its caller had left: an orphan
        _line("received", 3, tag="storm:3"),  # never ended: an orphan too
        _line("received", 4, tag="storm:4"),
        _line("aborted", 4, reason="client disconnected"),
    ]  # storm:5 never reached the engine (cancelled while queued)
    by_tag, _ = engine_attempts(lines)

    def scrape(cancelled: float, answered: float, sent: float) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            ("llmsched_request_outcomes_total", (("model", "m"), ("outcome", "cancelled"))): cancelled,
            ("llmsched_engine_aborts_total", (("backend", "b"), ("model", "m"), ("stage", "answered"))): answered,
            ("llmsched_engine_aborts_total", (("backend", "b"), ("model", "m"), ("stage", "sent"))): sent,
        }

    figures = analyse_storms(calls, by_tag, scrape(10, 1, 0), scrape(15, 4, 1))
    assert figures["storm_clients_cancelled"] == figures["storm_scheduler_cancelled"] == 5
    assert (figures["storm_scheduler_aborts"], figures["storm_scheduler_aborts_answered"]) == (4, 3)
    assert figures["storm_engine_aborted"] == 2
    assert figures["storm_orphans"] == 2
    assert figures["storm_engine"] == {
        "aborted": 2,
        "finished": 1,
        "never ended": 1,
        "never reached the engine": 1,
    }
