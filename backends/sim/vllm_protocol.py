"""vLLM's OpenAI-compatible wire format: request validation and response shapes, no I/O.

Shapes follow vLLM 0.32's protocol models as serialised by its server: compact JSON, errors as
`{"error": {"message", "type", "param", "code"}}` with `code` the HTTP status, invalid fields as 400
`BadRequestError` (vLLM turns FastAPI's 422 into 400), an unknown model as 404 `NotFoundError`. A non-zero
`priority` is accepted under fcfs and ignored, as vLLM 0.32 does. tests/engines/test_sim_conformance.py
compares these shapes with a real vLLM.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

from backends.sim.body_fields import BodyFields
from backends.sim.config import SimConfig
from backends.sim.engine import FinishReason, GenerateParams
from backends.sim.tokens import count_tokens, render_chat

Kind = Literal["completion", "chat"]

_DEFAULT_COMPLETION_MAX_TOKENS = 16  # vLLM's CompletionRequest default
VLLM_VERSION = "0.32.0"
"""The vLLM release whose wire format this module follows (checked by tests/engines/test_sim_conformance.py)."""


class ApiError(Exception):
    """A request vLLM would refuse; carries the HTTP status and vLLM's error `type`."""

    def __init__(self, status: int, message: str, err_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type or error_type_for(status)

    def body(self) -> dict[str, Any]:
        """vLLM's `ErrorResponse`."""
        return error_body(self.status, self.message, self.err_type)


_FIELDS = BodyFields(lambda name, what: ApiError(400, f"{name} must be {what}."))


def error_type_for(status: int) -> str:
    """vLLM's error `type` for a status: BadRequestError, NotFoundError, InternalServerError, ..."""
    known = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}
    if status in known:
        return known[status]
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "Error"
    return phrase.replace(" ", "").replace("-", "") + ("" if phrase.endswith("Error") else "Error")


def error_body(status: int, message: str, err_type: str | None = None) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}` as vLLM writes it."""
    return {
        "error": {
            "message": message,
            "type": err_type or error_type_for(status),
            "param": None,
            "code": status,
        }
    }


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated completion or chat request."""

    kind: Kind
    params: GenerateParams
    stream: bool
    include_usage: bool
    # vLLM's `stream_interval`: tokens per streamed chunk after the first (the last goes at once)
    stream_interval: int = 1
    # `stream_options.continuous_usage_stats` (with include_usage): every chunk carries the usage so far
    continuous_usage: bool = False


def parse_request(kind: Kind, body: Any, config: SimConfig) -> ParsedRequest:
    """Validate a `/v1/completions` or `/v1/chat/completions` body; raises `ApiError`."""
    if not isinstance(body, Mapping):
        raise ApiError(400, "Request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != config.model_name:
        raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {config.model_name}.", "NotFoundError")
    prompt = _prompt(body) if kind == "completion" else _chat_prompt(body)
    prompt_tokens = count_tokens(prompt)

    n = _FIELDS.integer(body, "n")
    if n is not None and n != 1:
        raise ApiError(400, "The simulator supports only n=1.")
    max_tokens = _FIELDS.integer(body, "max_tokens")
    if kind == "chat" and max_tokens is None:
        max_tokens = _FIELDS.integer(body, "max_completion_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.")
    if prompt_tokens >= config.max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {config.max_model_len} tokens. However, your request "
            f"has {prompt_tokens} input tokens. Please reduce the length of the input messages.",
        )
    if max_tokens is None:
        max_tokens = _DEFAULT_COMPLETION_MAX_TOKENS if kind == "completion" else config.max_model_len - prompt_tokens
    if prompt_tokens + max_tokens > config.max_model_len:
        raise ApiError(
            400,
            f"'max_tokens' is too large: {max_tokens}. This model's maximum context length is "
            f"{config.max_model_len} tokens and your request has {prompt_tokens} input tokens "
            f"({max_tokens} > {config.max_model_len} - {prompt_tokens}).",
        )

    temperature = _FIELDS.number(body, "temperature")
    if temperature is not None and temperature < 0:
        raise ApiError(400, f"temperature must be non-negative, got {temperature}.")
    top_p = _FIELDS.number(body, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise ApiError(400, f"top_p must be in (0, 1], got {top_p}.")

    stream = _FIELDS.boolean(body, "stream") or False
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not stream:
            raise ApiError(400, "Stream options can only be defined when `stream=True`.")
        if not isinstance(stream_options, Mapping):
            raise ApiError(400, "stream_options must be an object.")
    include_usage = bool(stream_options.get("include_usage")) if stream_options else False
    continuous_usage = include_usage and bool(stream_options and stream_options.get("continuous_usage_stats"))
    stream_interval = _FIELDS.integer(body, "stream_interval")
    if stream_interval is not None and stream_interval < 1:
        raise ApiError(400, f"stream_interval must be at least 1, got {stream_interval}.")

    # vLLM 0.32 accepts a priority under fcfs too, and ignores it (so does the engine here).
    priority = _FIELDS.integer(body, "priority") or 0

    params = GenerateParams(
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stop=_stop(body),
        seed=_FIELDS.integer(body, "seed"),
        ignore_eos=_FIELDS.boolean(body, "ignore_eos") or False,
        priority=priority,
    )
    return ParsedRequest(
        kind=kind,
        params=params,
        stream=stream,
        include_usage=include_usage,
        stream_interval=stream_interval or 1,
        continuous_usage=continuous_usage,
    )


def _prompt(body: Mapping[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt must be a string (the simulator takes one text prompt).")
    return prompt


def _chat_prompt(body: Mapping[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list.")
    pairs: list[tuple[str, str]] = []
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ApiError(400, "each message must be an object with a string role.")
        pairs.append((message["role"], _content_text(message.get("content"))))
    return render_chat(pairs)


def _content_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, "the simulator takes only text content parts.")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ApiError(400, "message content must be a string or a list of content parts.")


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise ApiError(400, "stop must be a string or a list of strings.")


# Response shapes


def new_response_id(kind: Kind, base: str | None) -> str:
    """`cmpl-...` or `chatcmpl-...`; vLLM builds it from the X-Request-Id header when one is sent."""
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + (base or uuid.uuid4().hex)


def finish_fields(reason: FinishReason, stop_string: str | None) -> tuple[str, str | None]:
    """vLLM's (finish_reason, stop_reason): EOS and stop strings are both "stop"."""
    if reason is FinishReason.LENGTH:
        return "length", None
    if reason is FinishReason.STOP:
        return "stop", stop_string
    if reason is FinishReason.EOS:
        return "stop", None
    return "abort", None


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI `usage`."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def system_fingerprint(config: SimConfig) -> str:
    """`vllm-<version>-<hash8>` as vLLM's default `--fingerprint-mode full` writes it; the hash is the config's."""
    digest = hashlib.sha256(repr(config).encode()).hexdigest()[:8]
    return f"vllm-{VLLM_VERSION}-{digest}"


class ChunkWriter:
    """Builds the chunks and bodies of one response; `id`, `created` and `model` are fixed per response.

    Key sets follow vLLM's pydantic models as its server dumps them: streamed chunks with `exclude_unset`
    (so a token chunk has no `usage` key, the chat role chunk carries `prompt_token_ids` and `prompt_text`,
    only the chat finish chunk has `stop_reason`), the usage chunk with `exclude_none`. The fingerprint goes
    on the finish chunk, or on the usage chunk when one follows.
    """

    def __init__(self, kind: Kind, response_id: str, model: str, fingerprint: str) -> None:
        self.kind = kind
        self.response_id = response_id
        self.model = model
        self.fingerprint = fingerprint
        self.created = int(time.time())

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "text_completion" if self.kind == "completion" else "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def role_chunk(self) -> dict[str, Any]:
        """Chat only: the first chunk announces the assistant role."""
        chunk = self._envelope(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )
        chunk["prompt_token_ids"] = None
        chunk["prompt_text"] = None
        return chunk

    def delta_chunk(
        self, text: str, finish_reason: str | None, stop_reason: str | None, *, usage_follows: bool = False
    ) -> dict[str, Any]:
        """One token's text; the last one also carries the finish reason (and the text of the last token)."""
        choice: dict[str, Any]
        if self.kind == "completion":
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        else:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
            if finish_reason is not None:
                choice["stop_reason"] = stop_reason
            choice["token_ids"] = None
        chunk = self._envelope([choice])
        if finish_reason is not None and not usage_follows:
            chunk["system_fingerprint"] = self.fingerprint
        return chunk

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """With `stream_options.include_usage`: the final chunk, no choices."""
        chunk = self._envelope([])
        chunk["usage"] = usage(prompt_tokens, completion_tokens)
        chunk["system_fingerprint"] = self.fingerprint
        return chunk

    def full_response(
        self,
        text: str,
        finish_reason: str,
        stop_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> dict[str, Any]:
        """The non-streaming response."""
        if self.kind == "completion":
            choice: dict[str, Any] = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
            obj = "text_completion"
        else:
            message = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            }
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "token_ids": None,
                "routed_experts": None,
            }
            obj = "chat.completion"
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            # vLLM adds "prompt_tokens_details" and "completion_tokens_details" (null); left out on purpose.
            "usage": usage(prompt_tokens, completion_tokens),
        }
        if self.kind == "chat":
            body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return body


def models_list(config: SimConfig) -> dict[str, Any]:
    """`GET /v1/models` as vLLM answers it."""
    created = int(time.time())
    return {
        "object": "list",
        "data": [
            {
                "id": config.model_name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": config.model_name,
                "parent": None,
                "max_model_len": config.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }
