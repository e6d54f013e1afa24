"""An OpenAI request body to the `ClientRequest` the gRPC face builds too, so both doors share one validation
(`scheduler_svc.core.admission.build_request`) and one set of limits.

This module only checks what JSON adds: the body is an object, each field is one the door supports and has
the JSON type OpenAI gives it, and nothing is silently dropped (any other field is a 400 naming it). Ranges,
roles, the prompt byte cap and the model are `build_request`'s job, as for gRPC.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from backends.base import ChatMessage
from scheduler_svc.core.errors import InvalidField, MalformedRequest
from scheduler_svc.core.identity import user_id_problem
from scheduler_svc.core.request import ClientRequest
from scheduler_svc.core.text import client_text

Kind = Literal["chat", "completion"]

_COMMON = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "stop",
        "seed",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "stream",
        "stream_options",
        "user",
        "safety_identifier",
        "metadata",
        "prompt_cache_key",
        "ignore_eos",  # vLLM's extension, for load tests and benchmarks
    }
)
FIELDS: dict[Kind, frozenset[str]] = {
    "chat": _COMMON | {"messages", "max_completion_tokens"},
    "completion": _COMMON | {"prompt"},
}
"""The request fields each endpoint takes (docs/http.md lists them)."""

_INT32 = 2**31 - 1
_INT64 = 2**63 - 1
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's own limits
MAX_USER_CHARS = 256


@dataclass(frozen=True, slots=True)
class Call:
    """A parsed request: the generation (as the gRPC face would hand it in) and how the answer is to be sent."""

    kind: Kind
    request: ClientRequest
    stream: bool
    include_usage: bool
    metadata_priority_class: str


def decode_json(raw: bytes) -> Mapping[str, Any]:
    """The body as a JSON object; anything else (bad UTF-8, NaN, not an object, a key twice in one object, a
    string that is not valid Unicode, nesting deeper than any field of the API) is MALFORMED_REQUEST."""
    try:
        body = json.loads(raw, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise MalformedRequest(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # nested beyond what the decoder follows
        raise MalformedRequest(f"the request body nests deeper than {MAX_NESTING} levels") from None
    if not isinstance(body, dict):
        raise MalformedRequest("the request body must be a JSON object")
    _check_strings(body)
    return body


MAX_NESTING = 16  # the API's deepest field is at 4 (messages[i].content[j].text)


def _check_strings(body: Any) -> None:
    """Every key and string of the body is valid Unicode (JSON may escape a lone surrogate, which no
    protobuf string, log line or engine takes), and nothing nests deeper than MAX_NESTING."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode()
                except UnicodeEncodeError:
                    raise MalformedRequest("a string in the request is not valid Unicode (a lone surrogate)") from None
        elif isinstance(value, dict | list):
            if depth > MAX_NESTING:
                raise MalformedRequest(f"the request body nests deeper than {MAX_NESTING} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                stack.append((key, depth))
                stack.append((item, depth + 1))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """One JSON object, refused when it names a key twice: decoders disagree on which value wins (Python's
    the last, others the first), so a proxy in front could check one `model` or `user` and this door serve
    another. A body means one thing or is refused, as a header sent twice is."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise MalformedRequest(f"the request body names the key {client_text(key)} twice in one object")
            seen.add(key)
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_call(body: Mapping[str, Any], kind: Kind) -> Call:
    """Check `body` against the fields of `kind` and build the call; raises InvalidField or MalformedRequest."""
    for name in body:
        if name not in FIELDS[kind]:
            raise InvalidField(name, "this field is not supported by this server (docs/http.md lists those it takes)")
    fields: dict[str, Any] = {"model": _string(body, "model") or ""}
    if kind == "chat":
        fields["messages"] = _messages(body.get("messages"))
        if not fields["messages"]:  # absent, null or []: admission would name `prompt`, which chat has not
            raise InvalidField("messages", "required: at least one message")
    else:
        fields["prompt"] = _prompt(body.get("prompt"))
    max_tokens = _integer(body, "max_tokens", 1, _INT32)
    if kind == "chat" and (completion := _integer(body, "max_completion_tokens", 1, _INT32)) is not None:
        if max_tokens is not None and max_tokens != completion:
            raise InvalidField("max_completion_tokens", "differs from max_tokens: set one of them")
        max_tokens = completion
    optional = {
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature"),
        "top_p": _number(body, "top_p"),
        "presence_penalty": _number(body, "presence_penalty"),
        "frequency_penalty": _number(body, "frequency_penalty"),
        "seed": _integer(body, "seed", -_INT64 - 1, _INT64),
    }
    fields.update({name: value for name, value in optional.items() if value is not None})
    fields["stop"] = tuple(_stop(body.get("stop")))
    fields["ignore_eos"] = _boolean(body, "ignore_eos") or False
    fields["prompt_cache_key"] = _string(body, "prompt_cache_key") or ""
    n = _integer(body, "n", 1, _INT32)
    if n is not None and n != 1:
        raise InvalidField("n", "only n = 1 is supported")
    if len(_string(body, "safety_identifier") or "") > MAX_USER_CHARS:  # accepted, unused (docs/http.md)
        raise InvalidField("safety_identifier", f"at most {MAX_USER_CHARS} characters")
    end_user = _string(body, "user") or ""  # the end user, never the caller's identity (docs/http.md)
    if end_user and (problem := user_id_problem(end_user)):
        raise InvalidField("user", problem)
    fields["end_user"] = end_user
    stream = _boolean(body, "stream") or False
    include_usage = _stream_options(body.get("stream_options"), stream)
    priority_class = _metadata(body.get("metadata")).get("priority_class", "")
    request = ClientRequest(**fields)
    _check_unicode(request)
    return Call(kind, request, stream, include_usage, priority_class)


def _check_unicode(request: ClientRequest) -> None:
    """Every string must be text UTF-8 can carry: JSON may escape a lone surrogate, which no engine, log or
    reply could encode."""
    texts = [request.model, request.prompt, request.prompt_cache_key, *request.stop]
    texts += [part for m in request.messages for part in (m.role, m.content)]
    for text in texts:
        if not text.isascii():
            try:
                text.encode()
            except UnicodeEncodeError as exc:
                raise MalformedRequest(f"a string in the request is not valid Unicode: {exc}") from None


def _string(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidField(name, "must be a string")
    return value


def _boolean(body: Mapping[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidField(name, "must be true or false")
    return value


def _integer(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidField(name, "must be an integer")
    if not low <= value <= high:
        raise InvalidField(name, f"must be between {low} and {high}")
    return value


def _number(body: Mapping[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField(name, "must be a number")
    try:
        return float(value)
    except OverflowError:  # an integer past any float: infinite, as a literal like 1e400 decodes, so that the
        return math.inf if value > 0 else -math.inf  # range check refuses it naming the field


def _text(value: Any, param: str) -> str:
    """Message content: a string, or a list of text parts (`{"type": "text", "text": ...}`) joined by newlines."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidField(param, "must be a string or a list of text parts")
    texts: list[str] = []
    for j, part in enumerate(value):
        where = f"{param}[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise InvalidField(where, 'only text parts ({"type": "text", "text": "..."}) are supported')
        if extra := set(part) - {"type", "text"}:
            raise InvalidField(f"{where}.{sorted(extra)[0]}", "this field is not supported by this server")
        texts.append(part["text"])
    return "\n".join(texts)


def _messages(value: Any) -> tuple[ChatMessage, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidField("messages", "must be a list of messages")
    messages: list[ChatMessage] = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidField(where, "must be an object with role and content")
        if extra := set(message) - {"role", "content"}:
            raise InvalidField(f"{where}.{sorted(extra)[0]}", "this field is not supported by this server")
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidField(f"{where}.role", "must be a string")
        messages.append(
            ChatMessage(
                role="system" if role == "developer" else role,
                content=_text(message.get("content"), f"{where}.content"),
            )
        )
    return tuple(messages)


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:  # the SDKs type prompt as a string or a list of them
        value = value[0]
    if not isinstance(value, str):
        raise InvalidField("prompt", "required: one string (a list of one string is taken too)")
    return value


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidField("stop", "must be a string or a list of strings")
    return value


def _stream_options(value: Any, stream: bool) -> bool:
    """Whether the stream ends with a usage chunk (`stream_options.include_usage`)."""
    if value is None:
        return False
    if not stream:
        raise InvalidField("stream_options", "only allowed when stream is true")
    if not isinstance(value, dict):
        raise InvalidField("stream_options", "must be an object")
    if extra := set(value) - {"include_usage"}:
        raise InvalidField(f"stream_options.{sorted(extra)[0]}", "this field is not supported by this server")
    include = value.get("include_usage", False)
    if not isinstance(include, bool):
        raise InvalidField("stream_options.include_usage", "must be true or false")
    return include


def _metadata(value: Any) -> dict[str, str]:
    """OpenAI's metadata: up to 16 string pairs; `priority_class` is read, the rest only checked."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_METADATA_KEYS:
        raise InvalidField("metadata", f"must be an object of at most {MAX_METADATA_KEYS} string pairs")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY_CHARS or not isinstance(item, str) or len(item) > MAX_METADATA_VALUE_CHARS:
            raise InvalidField(
                "metadata",
                f"keys of at most {MAX_METADATA_KEY_CHARS} characters, string values of at most "
                f"{MAX_METADATA_VALUE_CHARS}",
            )
    return value
