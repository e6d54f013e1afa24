"""Live reconfiguration of a running service over real gRPC, in front of simulated engines over real HTTP: a
reload under a flood (weights, classes, prices, keys, gate limits, a backend added and one removed), refused
files, admin-only calls, backend drains, SIGHUP to a `llmsched serve` process, and the CLI."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from backends.sim import SimConfig, running_simulator
from backends.sim.journal import read_journal
from bench.configs import to_toml
from clients import (
    AsyncClient,
    AuthenticationError,
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    SchedulerClient,
    pb,
)
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.app.settings import load_config
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.core.ticket import Ticket
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.dispatcher import ModelDispatcher
from tests.helpers import client_label, eventually, make_config, serving

FAST = SimConfig(decode_base_ms=2.0, decode_per_seq_ms=0.5)
USERS = ("alice", "bob", "carol")
KEYS = {user: f"sk-{user}-key" for user in (*USERS, "root", "dave")}


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _config(
    backends: dict[str, str],
    *,
    keyed: tuple[str, ...] = (*USERS, "root"),
    admins: tuple[str, ...] = ("root",),
    weights: dict[str, float] | None = None,
    waiting_target: int = 2,
    interactive: dict[str, Any] | None = None,
    output_token_cost: float = 1.0,
    server: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A service on free ports with API keys, vtc and one model "m" on `backends` (name -> simulator URL)."""
    return {
        "server": {
            "listen": "127.0.0.1:0",
            "metrics_listen": "",
            "queue_update_interval_seconds": 0.05,
            "shutdown_grace_seconds": 1.0,
            **(server or {}),
        },
        "auth": {"api_key_sha256": {_digest(KEYS[user]): user for user in keyed}, "admin_users": list(admins)},
        "scheduling": {
            "fairness": "vtc",
            "weights": {"users": weights or {}},
            "classes": [
                {"name": "interactive", "rank": 0, **(interactive or {})},
                {"name": "batch", "rank": 1, "require_idle_engine": True},
            ],
        },
        "models": [
            {
                "name": "m",
                "default_max_tokens": 16,
                "output_token_cost": output_token_cost,
                "gate": {"waiting_target": waiting_target},
                "backends": [
                    {"name": name, "url": url, "engine_model": "sim-model", "scrape_interval_seconds": 0.05}
                    for name, url in backends.items()
                ],
            }
        ],
    }


def _write(path: Path, raw: dict[str, Any] | str) -> None:
    """Write a configuration file (a dict as TOML, or text as it is)."""
    path.write_text(raw if isinstance(raw, str) else to_toml(raw))


@asynccontextmanager
async def serving_file(path: Path, raw: dict[str, Any]) -> AsyncIterator[SchedulerServer]:
    """Write `raw` to `path` and serve it as `llmsched serve --config path` does (a reload reads it again)."""
    _write(path, raw)
    server = SchedulerServer(load_config(path), config_path=path)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace=0.5)


def _client(server: SchedulerServer, user: str) -> AsyncClient:
    return AsyncClient(server.address, api_key=KEYS[user])


def _in_flight(server: SchedulerServer, backend: str) -> int:
    handle = server.scheduler.dispatchers["m"].backend(backend)
    return handle.estimator.in_flight if handle is not None else 0


def _metric(server: SchedulerServer, name: str, **labels: str) -> float | None:
    return server.scheduler.metrics.registry.get_sample_value(name, labels)


async def test_a_reload_under_a_flood_loses_reorders_and_duplicates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, str]] = []  # (client request id, backend), every dispatch in the scheduler's order
    queued: list[str] = []  # client request ids in the order they were queued
    assign, enqueue = Ticket.assign, ModelDispatcher.enqueue

    def recording_assign(ticket: Ticket, backend: BackendHandle, now: float, priority: int | None = None) -> None:
        sent.append((ticket.request.public_id, backend.name))
        assign(ticket, backend, now, priority)

    def recording_enqueue(dispatcher: ModelDispatcher, request: QueuedRequest, **kwargs: Any) -> Ticket:
        ticket = enqueue(dispatcher, request, **kwargs)
        queued.append(request.public_id)
        return ticket

    monkeypatch.setattr(Ticket, "assign", recording_assign)
    monkeypatch.setattr(ModelDispatcher, "enqueue", recording_enqueue)
    journals = {name: tmp_path / f"{name}.jsonl" for name in ("b0", "b1", "b2")}
    sim = {name: replace(FAST, max_num_seqs=4, journal=str(path)) for name, path in journals.items()}
    # b1, which the reload removes, runs slower, so what it runs at the reload is still running when it is looked at
    sim["b1"] = SimConfig(max_num_seqs=4, journal=str(journals["b1"]), decode_base_ms=15.0, decode_per_seq_ms=0.5)
    path = tmp_path / "llmsched.toml"
    async with (
        running_simulator(sim["b0"]) as s0,
        running_simulator(sim["b1"]) as s1,
        running_simulator(sim["b2"]) as s2,
        serving_file(path, _config({"b0": s0.url, "b1": s1.url})) as server,
        _client(server, "root") as root,
        _client(server, "dave") as dave,
    ):
        clients = {user: _client(server, user) for user in USERS}
        flood = [
            asyncio.create_task(
                clients[user].submit(
                    "m", f"{user}-{i}\nwrite", max_tokens=24, ignore_eos=True, request_id=f"{user}-{i}"
                )
            )
            for i in range(20)
            for user in USERS
        ]
        # no event tells a test that both engines are busy and a queue is waiting: look at the scheduler's state
        await eventually(
            lambda: (
                _in_flight(server, "b0") > 0
                and _in_flight(server, "b1") > 0
                and server.scheduler.snapshot("m", "", 0).queued >= 30
            ),
            what="both engines busy and a deep queue",
        )

        # A file that does not load, and one that changes what only a restart changes: refused whole.
        _write(path, "models = [")
        with pytest.raises(FailedPreconditionError) as invalid:
            await root.reload_config()
        assert invalid.value.reason == "CONFIG_INVALID" and str(path) in str(invalid.value)
        _write(path, _config({"b0": s0.url, "b1": s1.url}, server={"shutdown_grace_seconds": 3.0}))
        with pytest.raises(FailedPreconditionError) as restart:
            await root.reload_config()
        assert restart.value.reason == "CONFIG_NEEDS_RESTART"
        assert "server.shutdown_grace_seconds: 1.0 -> 3.0 (changes only at restart)" in str(restart.value)
        assert _metric(server, "llmsched_config_last_reload_successful") == 0
        with pytest.raises(AuthenticationError):
            await dave.submit("m", "hello", max_tokens=2)

        # The reload: weights, a class limit, a price, a new key, a gate limit, b2 added and b1 removed.
        new = _config(
            {"b0": s0.url, "b2": s2.url},
            keyed=(*USERS, "root", "dave"),
            weights={"alice": 2.0},
            waiting_target=3,
            interactive={"max_engine_running": 4},
            output_token_cost=2.0,
        )
        _write(path, new)
        preview = await root.reload_config(dry_run=True)
        assert not preview.applied and server.scheduler.dispatchers["m"].backend("b2") is None
        reply = await root.reload_config()
        reload_mark = len(sent)
        assert reply.applied and list(reply.changes) == list(preview.changes)
        for change in (
            "auth.api_key_sha256: changed",
            "scheduling.weights.users: changed",
            "scheduling.classes[interactive].max_engine_running: 0 -> 4",
            "models[m].output_token_cost: 1.0 -> 2.0",
            "models[m].gate.waiting_target: 2 -> 3",
            "models[m].backends[b2]: added",
            "models[m].backends[b1]: removed",
        ):
            assert change in reply.changes, (change, list(reply.changes))
        state = (await root.queue_state("m")).models[0]
        backends = {b.backend: b for b in state.backends}
        assert list(backends["b1"].drained_by) == [pb.DRAIN_SOURCE_REMOVED] and backends["b1"].draining
        assert backends["b1"].in_flight > 0 and not backends["b2"].draining
        assert (await dave.submit("m", "hello", max_tokens=2)).text, "a key added by the reload is accepted"

        # A second reload by SIGHUP's path, between two looks with nothing in between: counters and queues kept.
        _write(path, {**new, "scheduling": {**new["scheduling"], "weights": {"users": {"alice": 3.0}}}})
        before = server.scheduler.snapshot("m", "", 1000)
        server.reload_on_signal()
        after = server.scheduler.snapshot("m", "", 1000)
        assert after.classes == before.classes and after.queued == before.queued and after.running == before.running
        assert any(u.fair_share_counter for c in before.classes for u in c.users), "counters to keep"

        results = await asyncio.gather(*flood)
        await eventually(lambda: server.scheduler.dispatchers["m"].backend("b1") is None, what="b1 gone")
        for client in clients.values():
            await client.close()

        metrics = {
            "applied": _metric(server, "llmsched_config_reloads_total", result="applied"),
            "refused": _metric(server, "llmsched_config_reloads_total", result="refused"),
            "successful": _metric(server, "llmsched_config_last_reload_successful"),
            "drained": _metric(server, "llmsched_backend_drains_total", model="m", backend="b1", source="removed"),
            "b1 gauge": _metric(server, "llmsched_backend_draining", model="m", backend="b1"),
        }
    assert metrics == {"applied": 2, "refused": 2, "successful": 1, "drained": 1, "b1 gauge": None}

    # Lost nothing: every request of the flood completed, whole.
    assert len(results) == 60 and all(r.completion_tokens == 24 for r in results)
    # Duplicated nothing and reordered nothing: each sent once, each user's in the order it was queued.
    flood_sent = [(rid, backend) for rid, backend in sent if rid.split("-")[0] in USERS]
    assert Counter(rid for rid, _ in flood_sent) == Counter(f"{u}-{i}" for u in USERS for i in range(20))
    for user in USERS:
        mine = [rid for rid in queued if rid.startswith(f"{user}-")]
        assert [rid for rid, _ in flood_sent if rid.startswith(f"{user}-")] == mine and len(mine) == 20
    assert not any(backend == "b1" for _, backend in sent[reload_mark:]), "a removed backend takes no new request"
    assert any(backend == "b2" for _, backend in sent[reload_mark:]), "the added backend takes work"
    # The engines' own count: each request reached one engine once and finished there; none aborted or refused.
    lines = {name: read_journal(path) for name, path in journals.items()}
    received = Counter(client_label(e["id"]) for ls in lines.values() for e in ls if e["event"] == "received")
    finished = Counter(client_label(e["id"]) for ls in lines.values() for e in ls if e["event"] == "finished")
    flood_ids = {f"{u}-{i}" for u in USERS for i in range(20)}
    assert {rid: n for rid, n in received.items() if rid in flood_ids} == dict.fromkeys(flood_ids, 1)
    assert {rid: n for rid, n in finished.items() if rid in flood_ids} == dict.fromkeys(flood_ids, 1)
    ended_badly = [e for ls in lines.values() for e in ls if e["event"] in ("aborted", "failed", "refused")]
    assert ended_badly == []
    at_b1 = {client_label(e["id"]) for e in lines["b1"] if e["event"] == "received"}
    assert at_b1 == {rid for rid, backend in sent[:reload_mark] if backend == "b1"}, "b1 got only what it had"


async def test_admin_calls_are_for_admins_only_and_none_while_no_admin_is_named(tmp_path: Path) -> None:
    path = tmp_path / "llmsched.toml"
    async with (
        running_simulator(FAST) as sim,
        serving_file(path, _config({"b0": sim.url})) as server,
        _client(server, "alice") as alice,
        _client(server, "root") as root,
    ):
        for call in (alice.reload_config(), alice.drain_backend("b0"), alice.undrain_backend("b0")):
            with pytest.raises(PermissionDeniedError, match=r"auth\.admin_users"):
                await call
        with pytest.raises(NotFoundError) as unknown:
            await root.drain_backend("nope")
        assert unknown.value.reason == "BACKEND_NOT_FOUND"
        with pytest.raises(NotFoundError) as unknown_model:
            await root.drain_backend("b0", model="nope")
        assert unknown_model.value.reason == "MODEL_NOT_FOUND"
        _write(path, _config({"b0": sim.url}, admins=()))
        assert "auth.admin_users: changed" in (await root.reload_config()).changes
        with pytest.raises(PermissionDeniedError, match="names none"):
            await root.reload_config()  # no admin named: nobody may reload by call (SIGHUP still does)
        _write(path, _config({"b0": sim.url}))
        server.reload_on_signal()
        assert list((await root.reload_config()).changes) == []


async def test_draining_a_backend_moves_the_queue_to_the_other_and_lets_running_requests_finish() -> None:
    async with (
        running_simulator(replace(FAST, max_num_seqs=2)) as s0,
        running_simulator(replace(FAST, max_num_seqs=2)) as s1,
    ):
        config = make_config(
            models=[
                {
                    "name": "m",
                    "gate": {"waiting_target": 1},
                    "backends": [
                        {"name": n, "url": u, "engine_model": "sim-model", "scrape_interval_seconds": 0.05}
                        for n, u in (("b0", s0.url), ("b1", s1.url))
                    ],
                }
            ],
            auth={"admin_users": ["root"], "trust_user_header": True},
        )
        async with serving(config) as server, SchedulerClient(server.address, user="root") as root:
            flood = [
                asyncio.create_task(root.submit("m", f"r{i}", max_tokens=30, ignore_eos=True, request_id=f"r{i}"))
                for i in range(16)
            ]
            await eventually(lambda: _in_flight(server, "b0") > 0 and _in_flight(server, "b1") > 0, what="both busy")
            drained = await root.drain_backend("b0", model="m")
            sent_to_b0 = _metric(server, "llmsched_requests_dispatched_total", model="m", backend="b0")
            (state,) = drained.backends
            assert (state.model, state.backend, state.draining) == ("m", "b0", True)
            assert list(state.drained_by) == [pb.DRAIN_SOURCE_ADMIN] and state.in_flight > 0
            queue = (await root.queue_state("m")).models[0]
            gates = [g for g in queue.gates if g.backend == "b0"]
            assert gates and all(not g.open and g.reason.startswith("draining (admin)") for g in gates)
            results = await asyncio.gather(*flood)
            assert all(r.usage.completion_tokens == 30 for r in results), "running requests finished"
            assert _metric(server, "llmsched_requests_dispatched_total", model="m", backend="b0") == sent_to_b0, (
                "nothing new went to the drained engine"
            )
            assert {r.backend for r in results} == {"b0", "b1"}
            undrained = await root.undrain_backend("b0")
            assert not undrained.backends[0].draining
            late = await root.submit("m", "again", max_tokens=2)
            assert late.backend in ("b0", "b1")
        labels = {"model": "m", "backend": "b0"}
        assert server.scheduler.metrics.registry.get_sample_value("llmsched_backend_draining", labels) == 0
        drains = server.scheduler.metrics.registry.get_sample_value(
            "llmsched_backend_drains_total", {**labels, "source": "admin"}
        )
        assert drains == 1


async def test_sighup_reloads_a_served_file_and_the_cli_drains_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "llmsched.toml"
    async with running_simulator(FAST) as sim:
        raw = _config({"b0": sim.url}, server={"log_format": "json"})
        _write(path, raw)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scheduler_svc.app.cli", "serve", "--config", str(path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            address = await _serving_address(process.stdout)
            with_second = _config({"b0": sim.url, "b1": sim.url}, server={"log_format": "json"})
            _write(path, with_second)
            process.send_signal(signal.SIGHUP)
            reloaded = await _log_line(process.stdout, "config_reloaded")
            assert "models[m].backends[b1]: added" in reloaded

            env = {**os.environ, "LLMSCHED_API_KEY": KEYS["root"]}
            code, out = await _cli(env, "backend", "drain", "b1", "--target", address)
            assert (code, out) == (0, "m/b1: draining (admin), 0 in flight\n")
            code, out = await _cli(env, "backend", "undrain", "b1", "--model", "m", "--target", address)
            assert (code, out) == (0, "m/b1: taking work, 0 in flight\n")
            _write(path, raw)
            code, out = await _cli(env, "reload", "--dry-run", "--target", address)
            assert (code, out) == (0, "models[m].backends[b1]: removed\n")
            _write(path, "not toml at all")
            code, out = await _cli(env, "reload", "--target", address)
            assert code == 1 and "CONFIG_INVALID" in out
            code, out = await _cli({**env, "LLMSCHED_API_KEY": KEYS["alice"]}, "reload", "--target", address)
            assert code == 1 and "PERMISSION_DENIED" in out
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)


async def test_traced_requests_of_a_class_a_reload_adds_or_removes(tmp_path: Path) -> None:
    """With tracing on, each class has its view of the gates' history for traced queue waits: a reload keeps
    them in step (a class it adds is traced at once, one it removes until its last request has gone)."""
    path = tmp_path / "llmsched.toml"
    exporter = InMemorySpanExporter()
    async with running_simulator(replace(FAST, max_num_seqs=2)) as sim:
        raw = {**_config({"b0": sim.url}), "tracing": {"endpoint": "http://127.0.0.1:4317"}}
        _write(path, raw)
        server = SchedulerServer(load_config(path), config_path=path, span_processor=SimpleSpanProcessor(exporter))
        await server.start()
        try:
            async with _client(server, "alice") as alice, _client(server, "bob") as bob:
                busy = [
                    asyncio.create_task(alice.submit("m", f"w{i}", max_tokens=60, ignore_eos=True)) for i in range(6)
                ]
                # no event says what is queued: look at the scheduler
                await eventually(lambda: _queued(server, "interactive") >= 1, what="a busy engine and a queue")
                batch = asyncio.create_task(bob.submit("m", "batch work", max_tokens=4, priority_class="batch"))
                await eventually(lambda: _queued(server, "batch") == 1, what="the batch request queued")
                classes = [{"name": "interactive", "rank": 0}, {"name": "bulk", "rank": 2}]
                _write(path, {**raw, "scheduling": {**raw["scheduling"], "classes": classes}})
                server.reload()
                assert _queued(server, "batch") == 1, "the removed class still holds its request"
                answer = await alice.submit("m", "bulk work", max_tokens=4, priority_class="bulk")
                assert answer.completion_tokens == 4 and (await batch).completion_tokens == 4
                assert all(r.completion_tokens == 60 for r in await asyncio.gather(*busy))
        finally:
            await server.stop(grace=0.5)
    waits = [s for s in exporter.get_finished_spans() if s.name == "queue_wait"]
    assert len(waits) == 8, "every call's queue wait was traced, the removed class's and the new one's too"


def _queued(server: SchedulerServer, priority_class: str) -> int:
    classes = server.scheduler.snapshot("m", "", 0).classes
    return sum(c.queued for c in classes if c.priority_class == priority_class)


async def _cli(env: dict[str, str], *args: str) -> tuple[int, str]:
    """Run `llmsched ARGS` in its own process; its exit status and what it printed (stdout, then stderr)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scheduler_svc.app.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode() + (err.decode() if process.returncode else "")


async def _log_line(stdout: asyncio.StreamReader, event: str) -> str:
    """The next log line of `event` (JSON logs, one object a line)."""
    async with asyncio.timeout(60):
        while line := (await stdout.readline()).decode():
            if f'"event": "{event}"' in line:
                return line
    raise AssertionError(f"the service ended before logging {event}")


async def _serving_address(stdout: asyncio.StreamReader) -> str:
    return str(json.loads(await _log_line(stdout, "serving"))["grpc"])
