"""`llmsched`: run the service or the engine simulator, and call a running service.

llmsched serve --config FILE            run the scheduler
llmsched sim --flavor vllm --port 8000  run a simulated engine (no GPU here)
llmsched submit|stream --model M --user U "prompt"
llmsched health [--target HOST:PORT]      exit 0 when the service's grpc.health.v1 says SERVING (probes)
llmsched reload [--dry-run]             admins: the service reads its configuration file again (as SIGHUP)
llmsched backend drain|undrain NAME     admins: no new requests to a backend (maintenance), or again
llmsched config-reference               every config field with its default and meaning
llmsched hash-key < KEYFILE             the SHA-256 digest of an API key, for auth.api_key_sha256
llmsched policies                       the registered fairness / ordering / gate / band / backend policies
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from scheduler_svc.app.event_loop import run_on
from scheduler_svc.app.logs import configure_logging
from scheduler_svc.app.settings import load_config
from scheduler_svc.config import ConfigError, describe_fields

if TYPE_CHECKING:
    from clients import AsyncClient, Queued, Timings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="llmsched", description="Fair, backpressure-aware LLM request scheduler")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the scheduler service")
    serve.add_argument("--config", required=True, help="TOML configuration file")

    sim = commands.add_parser("sim", help="run a simulated inference engine (vLLM or TGI API)")
    from backends.sim import add_cli_arguments

    add_cli_arguments(sim)

    for name in ("submit", "stream"):
        call = _client_command(commands, name, _call, help=f"{name} one request to a running scheduler")
        call.add_argument("prompt", nargs="?", default="", help="prompt text (or use --message)")
        call.add_argument("--model", required=True)
        call.add_argument("--message", action="append", default=[], metavar="ROLE:TEXT", help="chat message")
        call.add_argument("--max-tokens", type=int)
        call.add_argument("--temperature", type=float)
        call.add_argument("--priority-class", default="")
        call.add_argument("--end-user", default="", help="the end user the call is for, inside --user's share")
        call.add_argument("--traceparent", default="", help="the caller's W3C trace context, continued to the engine")
        call.add_argument("--tracestate", default="", help="W3C tracestate, with --traceparent")
        call.add_argument("--timeout", type=float, help="call deadline in seconds")

    state = _client_command(
        commands, "queue-state", _queue_state, help="show queue depths, gate states and fair-share counters"
    )
    state.add_argument("--model", default="", help="only this model")
    state.add_argument("--for-user", default="", help="only this user's entries (--user is who asks)")
    state.add_argument("--max-users", type=int, default=None, help="users per class, most queued first (default 100)")

    reload = _client_command(
        commands,
        "reload",
        _reload,
        help="admins: have a running scheduler read its configuration file again and apply what changed, as "
        "SIGHUP does (a file it refuses changes nothing; the reason is printed)",
    )
    reload.add_argument("--dry-run", action="store_true", help="only print what would change")

    backend = _client_command(
        commands,
        "backend",
        _drain,
        help="admins: drain a backend for maintenance (no new requests, running ones finish, the queue goes to "
        "the other backends), or undrain it",
    )
    backend.add_argument("action", choices=("drain", "undrain"))
    backend.add_argument("name", help="the backend's configured name")
    backend.add_argument("--model", default="", help="only this model's backend (default: every model that has one)")

    health = commands.add_parser(
        "health",
        help="ask a running scheduler's grpc.health.v1 service; exit 0 only when it answers SERVING "
        "(a container's HEALTHCHECK, an exec probe where the kubelet's own gRPC probe cannot speak TLS)",
    )
    _add_target_arguments(health)
    health.add_argument("--service", default="", help='service name to ask about (default "": the whole server)')
    health.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer (default 3)")

    commands.add_parser("config-reference", help="print every configuration field with default and meaning")
    commands.add_parser("policies", help="list the registered policies")
    commands.add_parser(
        "hash-key", help="read an API key on stdin (or a prompt) and print its SHA-256 digest for auth.api_key_sha256"
    )

    args = parser.parse_args(argv)
    client_call = getattr(args, "client_call", None)
    if client_call is not None:
        sys.exit(asyncio.run(client_call(args)))
    elif args.command == "serve":
        _serve(args.config)
    elif args.command == "sim":
        from backends.sim import config_from_args, serve_forever

        configure_logging()
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_forever(config_from_args(args), args.host, args.port))
    elif args.command == "health":
        sys.exit(_health(args))
    elif args.command == "config-reference":
        from scheduler_svc.policies import scheduling_params

        rows = describe_fields()
        for key, (policies, f) in scheduling_params().items():  # each policy's own parameters, in [scheduling]
            rows.append((f"scheduling.{key}", repr(f.default), f"{f.metadata['doc']} (read by {', '.join(policies)})"))
        for name, default, doc in rows:
            print(f"{name:<48} {default:<24} {doc}")
    elif args.command == "hash-key":
        _hash_key()
    elif args.command == "policies":
        from scheduler_svc.policies import (
            BACKEND_POLICIES,
            BAND_POLICIES,
            FAIRNESS_POLICIES,
            GATE_POLICIES,
            ORDERING_POLICIES,
        )

        for registry in (FAIRNESS_POLICIES, ORDERING_POLICIES, GATE_POLICIES, BAND_POLICIES, BACKEND_POLICIES):
            for name, doc in registry.describe().items():
                print(f"{registry.kind:<10} {name:<16} {doc}")


def _client_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    call: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
    *,
    help: str,
) -> argparse.ArgumentParser:
    """A command that calls a running scheduler as a user: its connection arguments, and `call`, which
    `main` runs with the parsed arguments and exits with what it returns."""
    parser = commands.add_parser(name, help=help)
    _add_connection_arguments(parser)
    parser.set_defaults(client_call=call)
    return parser


def _add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    _add_target_arguments(parser)
    parser.add_argument("--user", help="sent as x-user-id")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("LLMSCHED_API_KEY"),
        help="sent as authorization: Bearer KEY (default: $LLMSCHED_API_KEY, which keeps it out of `ps`)",
    )


def _add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """The address and the TLS flags (no identity)."""
    parser.add_argument("--target", default="127.0.0.1:50051", help="scheduler address")
    parser.add_argument("--tls", action="store_true", help="use TLS, verifying the server with the system CAs")
    parser.add_argument("--ca-cert", metavar="PEM", help="verify the server with this CA bundle (implies --tls)")
    parser.add_argument("--client-cert", metavar="PEM", help="client certificate for mutual TLS (with --client-key)")
    parser.add_argument("--client-key", metavar="PEM", help="private key of --client-cert")


def _connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """The client keyword arguments the connection flags give (identity, TLS with its PEM files read);
    raises OSError for a file that cannot be read."""

    def read(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    return {
        "user": getattr(args, "user", None),
        "api_key": getattr(args, "api_key", None),
        "tls": args.tls,
        "root_certificates": read(args.ca_cert),
        "certificate_chain": read(args.client_cert),
        "private_key": read(args.client_key),
    }


def _health(args: argparse.Namespace) -> int:
    """One grpc.health.v1 Check: prints the status and returns 0 for SERVING, 1 for anything else (another
    status, no answer within --timeout), 2 when the TLS files cannot be used. Health needs no identity."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from clients import channel_credentials

    try:
        options = _connection_options(args)
        credentials = channel_credentials(
            options["tls"], options["root_certificates"], options["certificate_chain"], options["private_key"]
        )
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    channel = grpc.secure_channel(args.target, credentials) if credentials else grpc.insecure_channel(args.target)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            print(f"{args.target}: {code.name if code else 'error'}: {details}", file=sys.stderr)
            return 1
    print(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def _client(args: argparse.Namespace) -> AsyncClient:
    """The client the connection flags describe; exits with status 2 when they are unusable (a PEM file that
    cannot be read, a certificate without its key)."""
    from clients import AsyncClient

    try:
        return AsyncClient(args.target, **_connection_options(args))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def _hash_key() -> None:
    """Print the digest of a key read from stdin (one trailing newline dropped), or typed at a prompt."""
    import getpass

    from scheduler_svc.core.keys import key_digest

    key = getpass.getpass("API key: ") if sys.stdin.isatty() else sys.stdin.read().removesuffix("\n")
    if not key or any(c.isspace() for c in key):
        sys.exit("error: an API key must be non-empty and contain no whitespace")
    print(key_digest(key))


def _serve(path: str) -> None:
    try:
        config = load_config(path)
    except ConfigError as exc:
        sys.exit(f"configuration error: {exc}")
    configure_logging(config.server.log_level, config.server.log_format, cache=True)
    from scheduler_svc.app.memory import return_large_allocations
    from scheduler_svc.app.server import SchedulerServer

    return_large_allocations()

    from scheduler_svc.cluster.store import DuplicateReplica

    async def run() -> None:
        server = SchedulerServer(config, config_path=path)
        loop = asyncio.get_running_loop()
        # Before serving, so a signal sent once the service says it serves never meets the default (exit): a
        # SIGTERM while it starts stops it gracefully once started, with the handover a cluster replica owes.
        loop.add_signal_handler(signal.SIGHUP, server.reload_on_signal)  # read the file again (app.reload)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await server.start()
        except DuplicateReplica as exc:  # [cluster]: another live replica has this name
            sys.exit(f"cluster error: {exc}; set [cluster] replica_name to a name of its own")
        # Everything built so far lives as long as the process: keep it out of the collector's full
        # passes, which otherwise walk it all (a 30 ms pause, seen as a TTFT outlier in S5).
        gc.collect()
        gc.freeze()
        await stop.wait()
        await server.stop()

    run_on(config.server.event_loop, run)


async def _queue_state(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    from clients import SchedulerError

    async with _client(args) as client:
        try:
            state = await client.queue_state(args.model, args.for_user, args.max_users)
        except SchedulerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(json_format.MessageToJson(state, always_print_fields_with_no_presence=True))
    return 0


async def _reload(args: argparse.Namespace) -> int:
    """Print what changed (or would), one line each; a refused file's reason on stderr, exit status 1."""
    from clients import SchedulerError

    async with _client(args) as client:
        try:
            reply = await client.reload_config(args.dry_run)
        except SchedulerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    for line in reply.changes:
        print(line)
    verb = "would change" if args.dry_run else "changed"
    print(f"[{len(reply.changes)} {verb}{'' if reply.applied else ', nothing applied'}]", file=sys.stderr)
    return 0


async def _drain(args: argparse.Namespace) -> int:
    """Print each backend's state after the drain or undrain: model/backend, draining or taking work, why."""
    from clients import SchedulerError, pb

    async with _client(args) as client:
        try:
            call = client.drain_backend if args.action == "drain" else client.undrain_backend
            reply = await call(args.name, args.model)
        except SchedulerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    for state in reply.backends:
        why = ", ".join(pb.DrainSource.Name(s).removeprefix("DRAIN_SOURCE_").lower() for s in state.drained_by)
        status = f"draining ({why})" if state.draining else "taking work"
        print(f"{state.model}/{state.backend}: {status}, {state.in_flight} in flight")
    return 0


class _QueueLine:
    """The live queue position while a streamed request waits, on stderr: one line rewritten in place on a
    terminal, a plain line per change otherwise (logs, pipes)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._shown = False

    def show(self, event: Queued) -> None:
        eta = f", about {event.estimated_wait:.1f}s to go" if event.estimated_wait is not None else ""
        text = f"[queued: position {event.position}, {event.model_queue_depth} queued for the model{eta}]"
        if self._tty:
            self._stream.write(f"\r\x1b[K{text}")
            self._shown = True
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def clear(self) -> None:
        """End the rewritten line (the request left the queue)."""
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._shown = False


def _timings_text(timings: Timings) -> str:
    """A call's timings for a person: its queue wait, time to first token, and how long the engine took to
    take the request in (where its front end's delay shows)."""
    ttft = "-" if timings.time_to_first_token is None else f"{timings.time_to_first_token:.3f}s"
    accept = "-" if timings.engine_accept is None else f"{timings.engine_accept * 1000:.1f}ms"
    return f"queued {timings.queue_wait:.3f}s, first token {ttft}, engine took it in {accept}"


async def _call(args: argparse.Namespace) -> int:
    from clients import Delta, Dispatched, Finished, Queued, SchedulerError

    fields: dict[str, Any] = {
        "priority_class": args.priority_class,
        "end_user": args.end_user,
        "traceparent": args.traceparent,
        "tracestate": args.tracestate,
    }
    if args.max_tokens is not None:
        fields["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        fields["temperature"] = args.temperature
    messages = [tuple(m.split(":", 1)) for m in args.message]
    if any(len(m) != 2 for m in messages):
        print("--message must be ROLE:TEXT", file=sys.stderr)
        return 2
    if args.tracestate and not args.traceparent:
        print("--tracestate goes with --traceparent", file=sys.stderr)
        return 2

    async with _client(args) as client:
        try:
            if args.command == "submit":
                started = time.monotonic()
                response = await client.submit(
                    args.model, args.prompt, messages=messages, timeout=args.timeout, **fields
                )
                print(response.text)
                print(
                    f"[{response.request_id} via {response.backend}: {response.completion_tokens} tokens, "
                    f"{_timings_text(response.timings)}, total {time.monotonic() - started:.3f}s]",
                    file=sys.stderr,
                )
            else:
                line = _QueueLine(sys.stderr)
                async for event in client.stream(
                    args.model, args.prompt, messages=messages, timeout=args.timeout, **fields
                ):
                    if isinstance(event, Delta):
                        print(event.text, end="", flush=True)
                    elif isinstance(event, Queued):
                        line.show(event)
                    elif isinstance(event, Dispatched):
                        line.clear()
                        print(f"[dispatched to {event.backend}]", file=sys.stderr)
                    elif isinstance(event, Finished):
                        timings = _timings_text(event.timings)
                        print(f"\n[finished: {event.completion_tokens} tokens, {timings}]", file=sys.stderr)
        except SchedulerError as exc:
            print(f"\nerror: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    main()
