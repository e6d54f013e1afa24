"""The blocking `Client` is `AsyncClient` run on a background loop: the same arguments everywhere (derived, not
copied), and a blocking call from that loop itself fails at once instead of waiting for itself forever."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable

import pytest

from clients import AsyncClient, Client, SchedulerClient
from clients._arguments import generation_call
from clients._loop import shared_loop


def _parameters(function: Callable[..., object]) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(function).parameters.values() if p.name != "self"]


def test_the_blocking_client_takes_the_asyncio_clients_arguments() -> None:
    assert _parameters(Client) == _parameters(AsyncClient)
    for name in ("submit", "stream", "stream_text", "queue_state", "reload_config", "drain_backend", "undrain_backend"):
        assert _parameters(getattr(Client, name)) == _parameters(getattr(AsyncClient, name)), name
    assert inspect.signature(Client.stream).return_annotation == "EventStream"
    assert inspect.signature(Client.submit).return_annotation == "Completion"


def test_every_generation_call_takes_the_same_arguments_and_coroutines_stay_coroutines() -> None:
    for client in (AsyncClient, SchedulerClient):
        for name in ("submit", "stream"):
            assert _parameters(getattr(client, name)) == _parameters(generation_call), (client, name)
        assert inspect.iscoroutinefunction(client.submit) and not inspect.iscoroutinefunction(client.stream)
    call = generation_call("m", "hi", messages=[("user", "hello")], deadline=5.0, max_tokens=3)
    assert (call.params.model, call.params.prompt, call.params.max_tokens) == ("m", "hi", 3)
    assert [(m.role, m.content) for m in call.params.messages] == [("user", "hello")]
    assert (call.timeout, call.deadline) == (None, 5.0)
    with pytest.raises(ValueError):
        generation_call("m", no_such_field=1)


def test_a_blocking_call_from_the_clients_own_loop_fails_instead_of_hanging() -> None:
    loop = shared_loop()

    async def blocking_call_inside() -> None:
        loop.run(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="its own event loop"):
        loop.run(blocking_call_inside())


def test_an_end_user_goes_in_the_field_and_again_in_the_metadata() -> None:
    """The field for servers that read it (they check the two agree), the metadata for one without it."""
    call = generation_call("m", "hi", end_user="customer-7", max_tokens=3)
    assert call.params.end_user == "customer-7" and call.params.max_tokens == 3
    assert call.metadata((("x-user-id", "acme"),)) == (("x-user-id", "acme"), ("x-end-user-id", "customer-7"))
    assert generation_call("m", "hi").metadata((("x-user-id", "acme"),)) == (("x-user-id", "acme"),)


def test_a_trace_context_goes_in_the_metadata_and_tracestate_needs_a_traceparent() -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    call = generation_call("m", "hi", end_user="c7", traceparent=parent, tracestate="congo=t61rcWkgMzE")
    assert call.metadata((("x-user-id", "acme"),)) == (
        ("x-user-id", "acme"),
        ("x-end-user-id", "c7"),
        ("traceparent", parent),
        ("tracestate", "congo=t61rcWkgMzE"),
    )
    assert generation_call("m", traceparent=parent).metadata(()) == (("traceparent", parent),)
    with pytest.raises(ValueError, match="traceparent"):
        generation_call("m", tracestate="congo=t61rcWkgMzE")
