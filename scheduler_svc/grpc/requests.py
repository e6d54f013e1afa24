"""The gRPC face's edge: a `GenerationParams` message becomes the `ClientRequest` admission takes from either
door (the HTTP door builds the same from its JSON body)."""

from __future__ import annotations

from backends.base import ChatMessage
from llmsched.v1 import scheduler_pb2 as pb
from scheduler_svc.core.request import ClientRequest


def client_request(params: pb.GenerationParams) -> ClientRequest:
    """The request a gRPC caller sent, as admission takes it from either door: an optional field left unset is
    None."""
    return ClientRequest(
        model=params.model,
        prompt=params.prompt,
        messages=tuple(ChatMessage(m.role, m.content) for m in params.messages),
        max_tokens=params.max_tokens if params.HasField("max_tokens") else None,
        temperature=params.temperature if params.HasField("temperature") else None,
        top_p=params.top_p if params.HasField("top_p") else None,
        stop=tuple(params.stop),
        seed=params.seed if params.HasField("seed") else None,
        ignore_eos=params.ignore_eos,
        presence_penalty=params.presence_penalty if params.HasField("presence_penalty") else None,
        frequency_penalty=params.frequency_penalty if params.HasField("frequency_penalty") else None,
        priority_class=params.priority_class,
        request_id=params.request_id,
        prompt_cache_key=params.prompt_cache_key,
    )
