"""Optional fields of a JSON request body, type-checked the way both engine APIs check them (a JSON `true` is
no number); each engine words the error for a wrong type itself."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Invalid = Callable[[str, str], Exception]  # (field, what it must be: "an integer", ...) -> the engine's error


class BodyFields:
    """Reads optional fields of a request body: None when absent (or JSON null), else the value of its type."""

    def __init__(self, invalid: Invalid) -> None:
        self._invalid = invalid

    def integer(self, body: Mapping[str, Any], name: str) -> int | None:
        value = body.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._invalid(name, "an integer")
        return value

    def number(self, body: Mapping[str, Any], name: str) -> float | None:
        value = body.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._invalid(name, "a number")
        return float(value)

    def boolean(self, body: Mapping[str, Any], name: str) -> bool | None:
        value = body.get(name)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self._invalid(name, "a boolean")
        return value
