"""Client-supplied text made safe to quote in error messages and logs.

A client controls the strings it sends (model names, roles, priority classes, ids, metadata): quoted as
they are, a 200 KB model name would be repeated in full by every error message and log line, and a NUL or
a terminal escape would reach log files raw. Every quote of a client string goes through `client_text`.
Metric labels never carry client strings at all (see `UNKNOWN_LABEL`).
"""

from __future__ import annotations

QUOTE_LIMIT = 64  # characters of a client string quoted before it is cut
UNKNOWN_LABEL = "_unknown"  # the one label value for a name the configuration does not know


def client_text(value: str | bytes, limit: int = QUOTE_LIMIT) -> str:
    """`value` escaped like `repr` (no control characters, no NUL), cut to `limit` characters.

    A cut value says how long the original was: `'aaaa'...(200000 bytes)`.
    """
    if len(value) <= limit:
        return repr(value)
    size = len(value) if isinstance(value, bytes) else len(value.encode("utf-8", "surrogatepass"))
    return f"{value[:limit]!r}...({size} bytes)"
