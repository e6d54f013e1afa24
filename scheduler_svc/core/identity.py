"""The one accepted form of a user id, for call metadata, client certificates and the configuration.

A user id is 1-128 ASCII characters from `A-Z a-z 0-9 . _ @ + : / -`, starting with a letter or digit:
enough for names, e-mail addresses, service names and SPIFFE-style URIs. Anything else is refused, never
repaired: `" alice"` is not `alice`, and a byte that is not ASCII or a control character never becomes a
user (a silently trimmed or decoded id would let two spellings share, or split, one user's fair share).
"""

from __future__ import annotations

import re

MAX_USER_ID_LENGTH = 128
USER_ID_FORM = f"1-{MAX_USER_ID_LENGTH} characters from A-Z a-z 0-9 . _ @ + : / -, starting with a letter or digit"
_USER_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._@+:/-]{{0,{MAX_USER_ID_LENGTH - 1}}}")
_SHOWN_CHARS = 40


def user_id_problem(value: str) -> str | None:
    """Why `value` is not an acceptable user id (the value shown escaped and truncated), or None."""
    if _USER_ID.fullmatch(value):
        return None
    return f"invalid user id {shown(value)}: a user id is {USER_ID_FORM}"


def shown(value: str) -> str:
    """A caller's string made safe to echo in a message or log: escaped to ASCII and truncated."""
    if len(value) <= _SHOWN_CHARS:
        return ascii(value)
    return f"{value[:_SHOWN_CHARS]!a}... ({len(value)} characters)"
