"""Cancel storms through both doors against the simulator, counted three ways: by the clients, by the
scheduler's outcome and engine-abort counters, and by the simulator's journal (what the engine really did).

Each seeded round fills the engine with short answers of two other users, then one user sends calls
through gRPC (Stream and Submit) and HTTP (streamed and whole) asking for long answers, and leaves each at
a drawn point: when it hears it is queued, when the engine took it (the `dispatched` event, an HTTP
stream's headers: where a close once left the engine generating), after its first text, or all at once in
a storm at a random moment (queued, being chosen, on their way, waiting for headers, streaming: wherever
each is). Rounds draw an engine fault too: none, a slow intake (requests stay on their way) or a slow
answer (the engine holds its response headers), so those points are hit on purpose.

After each round the engine must hold nothing: every request a caller left ended `aborted` in the journal
(or never reached it), none `finished`, and the scheduler counted as many cancels as the clients made and
as many aborts as the journal shows. `LLMSCHED_CANCEL_ROUNDS` runs more rounds (default 12).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from backends.adapters.vllm import VllmBackend
from backends.base import BackendSpec
from backends.sim import SimConfig, running_simulator
from backends.sim.journal import read_journal
from llmsched.v1 import scheduler_pb2 as pb
from llmsched.v1 import scheduler_pb2_grpc as pb_grpc
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.core.request_run import Chunk, RequestRun
from scheduler_svc.core.ticket import Outcome, TicketState
from scheduler_svc.policies.fairness.activity import UserActivity
from tests.helpers import eventually, make_config, serving
from tests.unit.dispatch_harness import Harness
from tests.unit.test_cancel_storm import SLOTS, Caller, settle

ROUNDS = int(os.environ.get("LLMSCHED_CANCEL_ROUNDS", "12"))
SEED = 32
CALLS = 24  # of the storming user, per round with drawn triggers
CLASSIC_CALLS = 60  # per classic storm round: streams of one user behind an engine full of them, all left at once
LONG = 2000  # tokens a left call asks for: still generating long after its caller left, if it leaked
SHORT = 12
DOORS = ("grpc-stream", "grpc-submit", "http-stream", "http-json")
TRIGGERS = ("queued", "dispatched", "text", "storm", "storm", "never")
FAULTS = (None, ("intake_delay_ms", 150), ("answer_delay_ms", 150))


@dataclass
class Call:
    """One client call: its door, when it leaves, and how it ended as the client saw it."""

    tag: str
    door: str
    trigger: str
    end: str = ""  # completed, cancelled, error


class Storm:
    """The clients of one round against a live scheduler (gRPC stub and HTTP base URL)."""

    def __init__(self, stub: pb_grpc.SchedulerServiceAsyncStub, session: aiohttp.ClientSession, base: str) -> None:
        self.stub = stub
        self.session = session
        self.base = base
        self.storm = asyncio.Event()

    def _prompt(self, call: Call) -> str:
        return f"{call.tag}\nPlease write at length."

    async def run(self, call: Call, user: str) -> None:
        """Run the call; leave at its trigger (a storm call also when the storm breaks)."""
        task = asyncio.ensure_future(self._door(call, user))
        storm = asyncio.ensure_future(self.storm.wait())
        try:
            if call.trigger == "storm":
                await asyncio.wait({task, storm}, return_when=asyncio.FIRST_COMPLETED)
                if not task.done():
                    task.cancel()
                    call.end = "cancelled"
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            storm.cancel()

    async def _door(self, call: Call, user: str) -> None:
        max_tokens = SHORT if call.trigger == "never" else LONG
        if call.door.startswith("grpc"):
            await self._grpc(call, user, max_tokens)
        else:
            await self._http(call, user, max_tokens)

    async def _grpc(self, call: Call, user: str, max_tokens: int) -> None:
        params = pb.GenerationParams(model="m", prompt=self._prompt(call), max_tokens=max_tokens, ignore_eos=True)
        metadata = (("x-user-id", user),)
        if call.door == "grpc-submit":
            unary = self.stub.Submit(pb.SubmitRequest(params=params), metadata=metadata)
            try:
                await unary
                call.end = "completed"
            except grpc.aio.AioRpcError:
                call.end = call.end or "error"
            except asyncio.CancelledError:
                unary.cancel()
                raise
            return
        rpc = self.stub.Stream(pb.StreamRequest(params=params), metadata=metadata)
        try:
            async for event in rpc:
                kind = event.WhichOneof("event")
                if kind == "finished":
                    call.end = "completed"
                elif (call.trigger, kind) in (("queued", "queued"), ("dispatched", "dispatched"), ("text", "delta")):
                    if rpc.cancel():
                        call.end = "cancelled"
                    return
        except grpc.aio.AioRpcError:
            call.end = call.end or "error"
        except asyncio.CancelledError:
            rpc.cancel()
            raise

    async def _http(self, call: Call, user: str, max_tokens: int) -> None:
        stream = call.door == "http-stream"
        body = {"model": "m", "prompt": self._prompt(call), "max_tokens": max_tokens, "ignore_eos": True}
        headers = {"x-user-id": user}
        if stream:
            body["stream"] = True
            headers["x-queue-updates"] = "true" if call.trigger == "queued" else "false"
        async with self.session.post(self.base + "/v1/completions", json=body, headers=headers) as response:
            if response.status != 200:
                call.end = "error"
                return
            if not stream:
                await response.read()
                call.end = "completed"
                return
            if call.trigger == "dispatched":  # the headers: the engine took it
                response.close()
                call.end = "cancelled"
                return
            async for line in response.content:
                if (line.startswith(b": queued") and call.trigger == "queued") or (
                    line.startswith(b"data: {") and call.trigger == "text"
                ):
                    response.close()
                    call.end = "cancelled"
                    return
                if line.startswith(b"data: [DONE]"):
                    call.end = "completed"
            call.end = call.end or "error"


def _trigger(door: str, rng: random.Random) -> str:
    trigger = rng.choice(TRIGGERS)
    if door in ("grpc-submit", "http-json") and trigger in ("queued", "dispatched", "text"):
        return "storm"  # a whole-answer call has no events to leave at: it leaves in the storm
    return trigger


def _journal_by_tag(lines: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Tag -> the events of its request at the engine, in order (tags are unique per call)."""
    ids: dict[int, str] = {}
    events: dict[str, list[str]] = {}
    for line in lines:
        if line["event"] == "received":
            ids[line["seq"]] = line["tag"]
            events.setdefault(line["tag"], []).append("received")
        elif "seq" in line and line["seq"] in ids:
            events[ids[line["seq"]]].append(line["event"])
    return events


def _admitted(server: SchedulerServer) -> float:
    """Requests admitted for model `m`, every class together."""
    return sum(
        sample.value
        for metric in server.scheduler.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "llmsched_requests_admitted_total" and sample.labels.get("model") == "m"
    )


def _counter(server: SchedulerServer, name: str, **labels: str) -> float:
    return server.scheduler.metrics.registry.get_sample_value(name, {"model": "m", **labels}) or 0.0


@contextlib.asynccontextmanager
async def _stack(journal: Path) -> AsyncIterator[tuple[Any, SchedulerServer]]:
    sim_config = SimConfig(max_num_seqs=2, decode_base_ms=2.0, decode_per_seq_ms=0.5, journal=str(journal))
    async with running_simulator(sim_config) as sim:
        backend = {
            "name": "b0",
            "kind": "vllm",
            "url": sim.url,
            "engine_model": "sim-model",
            "scrape_interval_seconds": 0.02,
            "max_num_seqs": 2,
        }
        model = {"name": "m", "max_tokens_limit": 4096, "gate": {"waiting_target": 1}, "backends": [backend]}
        config = make_config(models=[model], server={"http_listen": "127.0.0.1:0"})
        async with serving(config) as server:
            yield sim, server


async def test_cancel_storms_through_both_doors_leave_nothing_at_the_engine(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    totals: Counter[str] = Counter()
    async with (
        _stack(journal) as (sim, server),
        grpc.aio.insecure_channel(server.address) as channel,
        aiohttp.ClientSession() as session,
    ):
        stub = pb_grpc.SchedulerServiceStub(channel)
        base = f"http://{server.http_address}"
        dispatcher = server.scheduler.dispatchers["m"]
        for round_ in range(ROUNDS):
            rng = random.Random(SEED * 7919 + round_)
            fault = rng.choice(FAULTS)
            async with session.post(sim.url + "/sim/faults", json=dict([fault]) if fault else {}) as response:
                assert response.status == 200
            storm = Storm(stub, session, base)
            blockers = [Call(f"storm:{round_}:b{i}", rng.choice(DOORS), "never") for i in range(4)]
            calls = []
            classic = round_ % 2 == 1  # every call streams and leaves in the storm (the engine full of them)
            for i in range(CLASSIC_CALLS if classic else CALLS):
                door = rng.choice(DOORS[:1] * 3 + DOORS[2:3]) if classic else rng.choice(DOORS)
                calls.append(Call(f"storm:{round_}:{i}", door, "storm" if classic else _trigger(door, rng)))
            if classic:
                blockers = []
            cancelled_before = _counter(server, "llmsched_request_outcomes_total", outcome="cancelled")
            admitted_before = _admitted(server)
            tasks = [asyncio.ensure_future(storm.run(c, f"other-{i % 2}")) for i, c in enumerate(blockers)]
            tasks += [asyncio.ensure_future(storm.run(c, "storm")) for c in calls]
            # Every call is in before the storm (on a loaded machine the clients may still be connecting), so
            # each one the storm ends is one the scheduler counts; then it breaks wherever the calls are.
            expected = admitted_before + len(tasks)
            await eventually(lambda: _admitted(server) >= expected, what="every call admitted")  # noqa: B023
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            storm.storm.set()
            async with asyncio.timeout(30):
                await asyncio.gather(*tasks)
            async with session.delete(sim.url + "/sim/faults") as response:
                assert response.status == 200
            # The scheduler holds nothing, and soon neither does the engine (what a caller left is aborted).
            await eventually(
                lambda: not (dispatcher.busy or sim.engine.num_running or sim.engine.num_waiting),
                what="the scheduler and the engine idle",
            )
            assert _counter(server, "llmsched_backend_in_flight", backend="b0") == 0

            by_tag = _journal_by_tag(read_journal(journal))
            left = [c for c in calls if c.end == "cancelled"]
            orphans = [c.tag for c in left if by_tag.get(c.tag) and by_tag[c.tag][-1] != "aborted"]
            assert not orphans, {tag: by_tag[tag] for tag in orphans}
            assert all(c.end in ("completed", "cancelled") for c in [*calls, *blockers]), [*calls, *blockers]
            for c in [*calls, *blockers]:
                if c.end == "completed":
                    assert by_tag[c.tag][-1] == "finished", (c, by_tag.get(c.tag))
            cancelled = _counter(server, "llmsched_request_outcomes_total", outcome="cancelled") - cancelled_before
            assert cancelled == len(left)  # a call left before its admission would count nowhere: none here
            totals.update(
                {
                    "rounds": 1,
                    "calls": len(calls) + len(blockers),
                    "left": len(left),
                    "left_reached_engine": sum(1 for c in left if c.tag in by_tag),
                    "aborted_at_engine": sum(1 for c in left if by_tag.get(c.tag, [""])[-1] == "aborted"),
                    "orphans": len(orphans),
                }
            )
            totals.update(f"left via {c.door}" for c in left)
        aborts = sum(
            _counter(server, "llmsched_engine_aborts_total", backend="b0", stage=s) for s in ("answered", "sent")
        )
        answered = _counter(server, "llmsched_engine_aborts_total", backend="b0", stage="answered")
    print(f"cancel storm (live, both doors): {dict(totals)}; aborts {aborts:.0f} ({answered:.0f} answered)")
    assert totals["orphans"] == 0
    # Three ways: what the journal aborted, the scheduler closed at the engine (answered ones surely reached it).
    assert answered <= totals["aborted_at_engine"] <= aborts
    assert totals["left_reached_engine"] > ROUNDS and totals["left"] > totals["left_reached_engine"]


# -- every point forced, through the real adapter, against the journal -------------------------------------

FORCED_ROUNDS = int(os.environ.get("LLMSCHED_CANCEL_FORCED_ROUNDS", "60"))
# Where callers leave, by the round's engine fault: with none, at the engine's answer and in its text; with
# a held intake, on their way; with a held answer, once the engine has them.
FORCED_POINTS = {
    None: ("queued", "chosen", "dispatched", "streaming", "never"),
    "intake_delay_ms": ("queued", "chosen", "sending"),
    "answer_delay_ms": ("queued", "chosen", "unanswered"),
}


async def test_forced_points_on_the_fake_clock_leave_nothing_in_the_simulator_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher on the fake clock (`tests.unit.dispatch_harness`) with the real vLLM adapter against the
    simulator: each caller leaves exactly at its point (queued, chosen, on its way, waiting for the engine's
    answer, at `Dispatched` with the engine's answer just read, while text streams), closing its run at the
    event or having its task cancelled. The journal must end every such request `aborted` (or never see it),
    and fairness charges the prompt only of those the engine answered, and the tokens the run read."""
    monkeypatch.setattr(UserActivity, "pruning", False)  # every user's counter is read after its round
    journal = tmp_path / "journal.jsonl"
    totals: Counter[str] = Counter()
    sim_config = SimConfig(max_num_seqs=8, decode_base_ms=2.0, decode_per_seq_ms=0.2, journal=str(journal))
    async with running_simulator(sim_config) as sim, aiohttp.ClientSession() as session:
        backend = VllmBackend(BackendSpec(name="b0", url=sim.url, engine_model="sim-model"))
        try:
            for round_ in range(FORCED_ROUNDS):
                rng = random.Random(SEED * 104_729 + round_)
                fault = rng.choice(list(FORCED_POINTS))
                faults = {fault: 60_000} if fault else {}
                async with session.post(sim.url + "/sim/faults", json=faults) as response:
                    assert response.status == 200
                figures = await _forced_round(rng, f"u{round_}", FORCED_POINTS[fault], backend, sim, journal)
                totals.update(figures)
                async with session.delete(sim.url + "/sim/faults") as response:
                    assert response.status == 200
        finally:
            await backend.aclose()
    print(f"cancel points forced (fake clock, real adapter, simulator journal): {FORCED_ROUNDS} rounds, {dict(totals)}")
    for point in ("queued", "chosen", "sending", "unanswered", "dispatched", "streaming"):
        assert totals[f"left {point}"] >= 5, totals


async def _forced_round(
    rng: random.Random, user: str, points: tuple[str, ...], backend: VllmBackend, sim: Any, journal: Path
) -> Counter[str]:
    h = Harness(scheduling={"fairness": "vtc_basic"}, cap=SLOTS)
    h.handle.backend = backend
    callers: list[Caller] = []
    for _ in range(rng.randint(1, 8)):
        point = rng.choice(points)
        ticket = h.submit(user, max_tokens=SHORT if point == "never" else LONG, prompt="p" * rng.randint(4, 400))
        # At `Dispatched` the caller closes its run right at the event (the engine's answer just read); in the
        # text, either way.
        caller = Caller(ticket, point, closes=point == "dispatched" or rng.random() < 0.5)
        caller.task = asyncio.create_task(caller.consume(RequestRun(ticket, h.events, watch_positions=True)))
        callers.append(caller)
    await settle()

    def leave(caller: Caller) -> None:
        caller.left = True
        assert caller.task is not None
        caller.task.cancel()

    async with asyncio.timeout(20):
        while not all(c.task is not None and c.task.done() for c in callers):
            for caller in callers:
                if caller.point == "queued" and not caller.left:
                    leave(caller)
            h.dispatch()
            for caller in callers:  # assigned, its run not resumed yet
                if caller.point == "chosen" and caller.ticket.state is TicketState.DISPATCHED and not caller.left:
                    leave(caller)
            await asyncio.sleep(0.005)  # the engine runs on its own time
            received = {line["id"] for line in read_journal(journal) if line["event"] == "received"}
            for caller in callers:
                if caller.left or caller.ticket.state is not TicketState.DISPATCHED:
                    continue
                rid = caller.ticket.request.request_id
                if caller.point == "sending" and caller.ticket.sent_at is not None:
                    leave(caller)  # its intake is held: it is on its way
                elif caller.point == "unanswered" and rid in received:
                    leave(caller)  # the engine has it, its answer is held
                elif (
                    caller.point == "streaming" and not caller.closes and any(isinstance(e, Chunk) for e in caller.seen)
                ):
                    leave(caller)
            h.clock.advance(0.01)
    with contextlib.suppress(TimeoutError):  # a request left behind keeps the engine busy for seconds: an orphan
        await eventually(lambda: not (sim.engine.num_running or sim.engine.num_waiting), timeout=3.0)

    ids = {c.ticket.request.request_id: c for c in callers}
    ends: dict[str, dict[str, Any]] = {}
    for line in read_journal(journal):
        if line.get("id") in ids and line["event"] in ("received", "finished", "aborted", "failed"):
            ends[line["id"]] = line
    figures: Counter[str] = Counter()
    charged = 0
    for rid, caller in ids.items():
        end = ends.get(rid)
        ticket = caller.ticket
        if caller.point == "never":
            assert ticket.outcome is Outcome.COMPLETED and end is not None and end["event"] == "finished"
        else:
            assert ticket.outcome is Outcome.CANCELLED and caller.left, caller.point
            orphan = end is not None and end["event"] != "aborted"  # still open at the engine, or finished
            assert not orphan, f"left {caller.point} (closing: {caller.closes}), the engine's last word: {end}"
            figures[f"left {caller.point}"] += 1
            figures["aborted at the engine"] += end is not None
            if end is not None:
                assert ticket.completion_tokens <= end["tokens"]  # the run read at most what the engine made
        if ticket.reached_engine:
            charged += ticket.request.prompt_tokens_estimate
        charged += 2 * ticket.completion_tokens
        if caller.point in ("queued", "chosen", "sending", "unanswered"):
            assert not ticket.reached_engine and ticket.completion_tokens == 0, caller.point
    assert h.dispatcher.busy == 0 and h.handle.estimator.in_flight == 0
    assert h.counters("interactive").get(user, 0) == charged
    return figures
