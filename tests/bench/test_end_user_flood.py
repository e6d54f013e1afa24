"""The end-user flood's figures from an engine's journal: the flood's requests that passed a sibling's, its
wait in decodes, and the shares of the first requests."""

from __future__ import annotations

from typing import Any

from bench.tools.end_user_flood import SHARE_WINDOW, _figures


def _lines(requests: list[tuple[str, float, float, float]]) -> list[dict[str, Any]]:
    """(tag, received, started, finished) -> the simulator's journal lines."""
    lines: list[dict[str, Any]] = [{"event": "boot", "t": 0.0}]
    for n, (tag, received, started, finished) in enumerate(requests):
        lines.append({"event": "received", "t": received, "id": f"id{n}", "tag": tag})
        lines.append({"event": "started", "t": started, "id": f"id{n}"})
        lines.append({"event": "finished", "t": finished, "id": f"id{n}"})
    return lines


def test_the_flood_ahead_of_a_sibling_its_wait_in_decodes_and_the_shares_are_counted() -> None:
    requests = [
        ("acme-flood-0", 1.0, 1.0, 3.0),  # before bob was sent: not ahead of it
        ("t2-0", 2.5, 2.5, 4.5),
        ("acme-flood-1", 3.0, 3.0, 5.0),  # while bob waited
        ("acme-flood-2", 3.5, 3.5, 5.5),  # while bob waited
        ("acme-bob-0", 4.0, 4.0, 6.0),
        ("t3-0", 4.5, 4.5, 6.5),
    ]
    figures = _figures(_lines(requests), {"acme-bob-0": 2.0})
    assert figures.flood_ahead == [2]
    assert figures.wait_decodes == [1.0]  # 2 s of waiting, each flood (and t2) request decoding for 2 s
    assert figures.shares == {"acme": 4, "t2": 1, "t3": 1} and len(requests) <= SHARE_WINDOW
