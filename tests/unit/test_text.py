"""client_text: how a client string is quoted in a message or a log."""

from __future__ import annotations

from scheduler_svc.core.text import client_text


def test_short_strings_are_quoted_like_repr() -> None:
    assert client_text("alice") == "'alice'"
    assert client_text("a\x00b\x1b[31m") == "'a\\x00b\\x1b[31m'"
    assert client_text(b"\xff") == "b'\\xff'"


def test_long_strings_are_cut_and_say_their_size_in_bytes() -> None:
    quoted = client_text("é" * 1000, limit=4)
    assert quoted == "'éééé'...(2000 bytes)"
    assert client_text(b"\x00" * 100, limit=2) == "b'\\x00\\x00'...(100 bytes)"


def test_invisible_and_bidi_characters_are_escaped() -> None:
    assert client_text("\u202eevil\u200b") == "'\\u202eevil\\u200b'"
