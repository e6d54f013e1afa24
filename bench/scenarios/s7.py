"""S7 faults: a flood at ten times the engine's capacity with caps on, while the engine is killed and
restarted, its metrics go dark for 10 s, clients cancel 1,000 requests (half queued, half running), reuse
live request ids and send oversized prompts. Every admitted request must end in exactly one outcome.
Then cancel storms: 100 streams (2,000-token answers, five users within their caps) behind an engine full
of them, all cancelled at once while freed slots go to the next of them; no engine request may outlive
its caller.

Each outcome is counted three ways that must agree: by the clients (how each call ended), by the
scheduler (`llmsched_request_outcomes_total`, scraped before and after) and by the engine (the
simulator's `--journal`, which survives its SIGKILL). The storms' cancels likewise: the calls the clients
cancelled, the scheduler's cancelled outcomes and engine aborts (`llmsched_engine_aborts_total`), and the
journal's aborted requests; an engine request a caller cancelled that the journal shows finished or never
ended is an orphan. The three are joined by a tag, not by request id:
every call's prompt starts with a line `s7:<n>` that the journal records as the request's `tag`, so the
join does not depend on what id the scheduler gives the engine (a server-made id) nor on the ids being
unique (duplicate ids are part of the test).

Runs alone (`python -m bench --scenarios S7`): it needs its own simulator (journal, kill, restart on the
same port) and a scheduler with its metrics endpoint on, so it does not use the shared `open_run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp
import grpc
from prometheus_client.parser import text_string_to_metric_families

from backends.sim.journal import read_journal
from bench import harness
from bench.configs import Toml, validated_toml
from bench.engines import EngineProvider, SimProfile
from bench.results import ScenarioResult, Table, Target
from bench.runner import SCHEDULED_MODEL
from bench.scenarios._common import STANDARD_CLASS, jsonable
from bench.scenarios.definition import Definition
from clients import pb, pb_grpc
from clients.client import error_reason

TITLE = "faults"
RUN = "scheduler, caps on"
KILL_CANCEL_MARGIN = 1.0
OUTCOMES = ("completed", "cancelled", "failed", "expired", "rejected")


@dataclass(frozen=True)
class S7Params:
    max_num_seqs: int = 8
    max_tokens: int = 16
    flood_factor: float = 10.0
    flood_seconds: float = 45.0
    flood_users: int = 20
    prompt_bytes: int = 3000
    kill_at: float = 12.0
    restart_after: float = 1.0
    metrics_down_at: float = 25.0
    metrics_down_for: float = 10.0
    queued_cancels: int = 500
    running_cancels: int = 500
    cancel_tokens: int = 512
    queued_cancel_workers: int = 20
    running_cancel_workers: int = 40
    duplicates: int = 50
    oversized: int = 50
    max_queued: int = 1000
    max_queued_per_user: int = 20
    max_prompt_bytes: int = 32 * 1024
    max_queued_bytes: int = 4_000_000
    max_queued_bytes_per_user: int = 64_000
    per_request_overhead: int = 24 * 1024  # docs/operations.md, sizing: ~24 KB per open Stream call
    per_prompt_byte: float = 3.4  # docs/operations.md, sizing: RSS per queued prompt byte (gRPC's, protobuf's, ours)
    storm_rounds: int = 5
    storm_streams: int = 100  # per round, spread over storm_users (each within max_queued_per_user)
    storm_users: int = 5
    storm_tokens: int = 2000
    storm_prompt_bytes: int = 200
    warmup_seconds: float = 3.0
    drain_timeout: float = 60.0
    channels: int = 8

    def profile(self) -> SimProfile:
        return SimProfile(max_num_seqs=self.max_num_seqs)

    def capacity(self) -> float:
        """Requests per second the engine completes with a full batch."""
        p = self.profile()
        return p.max_num_seqs / (self.max_tokens * p.step_seconds(p.max_num_seqs))


@dataclass
class Call:
    """One client call and how it ended, as the client saw it."""

    n: int
    kind: str  # flood, qcancel, rcancel, dup-first, dup-second, oversized, storm
    user: str
    request_id: str
    admitted: bool = False
    dispatches: int = 0
    dispatches_after_token: int = 0
    tokens: int = 0
    end: str = ""  # completed, cancelled, error, "" while running, hung
    code: str = ""
    reason: str = ""
    cancel_phase: str = ""  # queued, dispatched, running, storm
    prefix: str = "s7"

    @property
    def tag(self) -> str:
        return f"{self.prefix}:{self.n}"

    @property
    def outcome(self) -> str | None:
        """The scheduler outcome this call's ending corresponds to (None: not admitted)."""
        if not self.admitted:
            return None
        if self.end == "completed":
            return "completed"
        if self.end == "cancelled":
            return "cancelled"
        if self.end == "error":
            return "expired" if self.code == "DEADLINE_EXCEEDED" else "failed"
        return None  # hung: no outcome at all


@dataclass
class Attempt:
    """One request at the engine (one `received` line), from the journal."""

    tag: str
    boot: int
    events: list[str] = field(default_factory=list)
    end: str = ""  # finished, aborted, failed, killed; "" when it never ended
    reason: str = ""


class Load:
    """The clients of one S7 run: starts calls, keeps their records."""

    def __init__(self, stubs: list[pb_grpc.SchedulerServiceStub], p: S7Params, prefix: str = "s7") -> None:
        self.stubs = stubs
        self.p = p
        self.prefix = prefix  # of every call's tag: the storms' calls are told apart from the flood's
        self.calls: list[Call] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self._n = 0
        # Set around the engine's SIGKILL: a cancel then could race the engine failing the same request
        # (the server ends it FAILED while the client, a moment behind, cancels), and the two counts would
        # differ by the race, not by any fault. Calls that would be cancelled then run to their real end.
        self.cancel_paused = False

    def new(self, kind: str, user: str, request_id: str | None = None) -> Call:
        self._n += 1
        call = Call(self._n, kind, user, request_id or f"{self.prefix}-{self._n}", prefix=self.prefix)
        self.calls.append(call)
        return call

    def prompt(self, call: Call, size: int | None = None) -> str:
        size = self.p.prompt_bytes if size is None else size
        body = f"{call.tag}\n" + f"Request {call.n} of user {call.user}. "
        return body + "x" * max(0, size - len(body))

    def start(self, call: Call, awaitable: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(awaitable)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def run(
        self, call: Call, *, prompt: str | None = None, cancel_on: str = "", admitted: asyncio.Event | None = None
    ) -> None:
        """One Stream call; `cancel_on` "queued" or "running" cancels it at its first such event."""
        params = pb.GenerationParams(
            model=SCHEDULED_MODEL,
            prompt=prompt if prompt is not None else self.prompt(call),
            # A call to cancel asks for a long answer, so it is surely still running when this
            # (slow, loaded) client reads its first token; a short one could already be over at the server.
            max_tokens=self.p.cancel_tokens if cancel_on else self.p.max_tokens,
            ignore_eos=True,
            request_id=call.request_id,
        )
        request = pb.StreamRequest(params=params)
        stub = self.stubs[call.n % len(self.stubs)]
        rpc = cast(
            "grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]",
            stub.Stream(request, metadata=(("x-user-id", call.user),)),
        )
        try:
            async for event in rpc:
                if event.HasField("queued"):
                    call.admitted = True
                    if admitted is not None:
                        admitted.set()
                    if cancel_on == "queued" and call.dispatches == 0 and not self.cancel_paused:
                        call.cancel_phase = "queued"
                elif event.HasField("dispatched"):
                    call.dispatches += 1
                    call.dispatches_after_token += call.tokens > 0
                elif event.HasField("delta"):
                    call.tokens += event.delta.tokens or 1
                    if cancel_on == "running" and not self.cancel_paused:
                        call.cancel_phase = "running"
                elif event.HasField("finished"):
                    call.end = "completed"
                if call.cancel_phase and not call.end:
                    if rpc.cancel():
                        call.end = "cancelled"
                        return
                    # The server had already ended the call (its events were still in flight to this slow
                    # client): it was not cancelled, so read on to its real ending.
                    call.cancel_phase, cancel_on = "", ""
            if not call.end:
                call.end, call.code = "error", "OK_WITHOUT_FINISHED"
        except grpc.aio.AioRpcError as exc:
            call.end, call.code, call.reason = "error", exc.code().name, error_reason(exc) or ""
        except asyncio.CancelledError:
            if not call.end:
                call.end = "hung"
            rpc.cancel()
            raise

    async def run_until(self, call: Call, storm: asyncio.Event, admitted: asyncio.Event, round_: StormRound) -> None:
        """One Stream call asking for a long answer, cancelled when the storm breaks (if still going)."""
        params = pb.GenerationParams(
            model=SCHEDULED_MODEL,
            prompt=self.prompt(call, self.p.storm_prompt_bytes),
            max_tokens=self.p.storm_tokens,
            ignore_eos=True,
            request_id=call.request_id,
        )
        stub = self.stubs[call.n % len(self.stubs)]
        rpc = cast(
            "grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]",
            stub.Stream(pb.StreamRequest(params=params), metadata=(("x-user-id", call.user),)),
        )

        async def read() -> None:
            try:
                async for event in rpc:
                    if event.HasField("queued"):
                        call.admitted = True
                        admitted.set()
                    elif event.HasField("dispatched"):
                        call.dispatches += 1
                        round_.dispatched()
                    elif event.HasField("delta"):
                        call.tokens += event.delta.tokens or 1
                    elif event.HasField("finished"):
                        call.end = "completed"
            except grpc.aio.AioRpcError as exc:
                call.end, call.code, call.reason = call.end or "error", exc.code().name, error_reason(exc) or ""
            finally:
                admitted.set()  # or refused: either way it has its answer to admission

        reader = asyncio.ensure_future(read())
        breaks = asyncio.ensure_future(storm.wait())
        await asyncio.wait({reader, breaks}, return_when=asyncio.FIRST_COMPLETED)
        breaks.cancel()
        if not reader.done() and rpc.cancel():
            call.end, call.cancel_phase = "cancelled", "storm"
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        if not call.end:
            call.end, call.code = "error", "OK_WITHOUT_FINISHED"


async def _scrape(session: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with session.get(url) as response:
        text = await response.text()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _sum(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in samples.items() if n == name and all((k, x) in lab for k, x in labels.items()))


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def scheduler_toml(p: S7Params, engine_url: str, metrics_port: int) -> str:
    """The scenario's config as TOML: caps on, one simulated engine."""
    model: Toml = {
        "name": SCHEDULED_MODEL,
        "max_tokens_limit": 4096,
        "max_queued": p.max_queued,
        "max_queued_per_user": p.max_queued_per_user,
        "max_prompt_bytes": p.max_prompt_bytes,
        "max_queued_bytes": p.max_queued_bytes,
        "max_queued_bytes_per_user": p.max_queued_bytes_per_user,
        "failover_attempts": 1,
        "gate": {"waiting_target": 3},
        "backends": [
            {
                "name": "engine-0",
                "kind": "vllm",
                "url": engine_url,
                "engine_model": "sim-model",
                "scrape_interval_seconds": 0.1,
                "max_num_seqs": p.max_num_seqs,
            }
        ],
    }
    config: Toml = {
        "server": {
            "listen": "127.0.0.1:{GRPC_PORT}",
            "metrics_listen": f"127.0.0.1:{metrics_port}",
            "log_level": "warning",
            "shutdown_grace_seconds": 1.0,
        },
        "scheduling": {"fairness": "round_robin", "classes": STANDARD_CLASS, "default_class": "standard"},
        "models": [model],
    }
    return validated_toml(config)


class Stack:
    """The simulator (with its journal, killable and restartable on its port) and the scheduler."""

    def __init__(self, p: S7Params, workdir: Path) -> None:
        self.p = p
        self.journal = workdir / "s7-journal.jsonl"
        self.journal.unlink(missing_ok=True)
        self.sim_port = harness.free_port()
        self.sim_url = f"http://127.0.0.1:{self.sim_port}"
        self.metrics_port = harness.free_port()
        self.sim: harness.Proc | None = None
        self.sim_starts = 0

    async def start_sim(self) -> None:
        self.sim_starts += 1
        args = [
            sys.executable, "-m", "scheduler_svc.app.cli", "sim", "--port", str(self.sim_port),
            "--journal", str(self.journal), *self.p.profile().flags("fcfs"),
        ]  # fmt: skip
        self.sim = harness.spawn(args, f"s7-sim-{self.sim_port}-{self.sim_starts}")
        await harness.wait_http(self.sim_url + "/health", self.sim)

    def kill_sim(self) -> None:
        assert self.sim is not None
        self.sim.popen.send_signal(signal.SIGKILL)
        self.sim.popen.wait()

    def stop(self) -> None:
        if self.sim is not None:
            self.sim.stop()


async def _faults(
    stack: Stack, session: aiohttp.ClientSession, load: Load, p: S7Params, t0: float, log: list[str]
) -> None:
    """SIGKILL and restart the engine, then take its metrics endpoint down for a while."""
    await asyncio.sleep(max(0.0, t0 + p.kill_at - KILL_CANCEL_MARGIN - time.monotonic()))
    load.cancel_paused = True
    await asyncio.sleep(KILL_CANCEL_MARGIN)
    stack.kill_sim()
    log.append(f"{time.monotonic() - t0:.1f}s engine SIGKILLed (no client cancels from 1 s before to 3 s after)")
    await asyncio.sleep(p.restart_after)  # an engine that takes a moment to come back
    await stack.start_sim()
    log.append(f"{time.monotonic() - t0:.1f}s engine restarted on the same port")
    await asyncio.sleep(3 * KILL_CANCEL_MARGIN)  # the loaded client reads the kill's errors a moment later
    load.cancel_paused = False
    await asyncio.sleep(max(0.0, t0 + p.metrics_down_at - time.monotonic()))
    async with session.post(stack.sim_url + "/sim/faults", json={"metrics_down": True}) as response:
        response.raise_for_status()
    log.append(f"{time.monotonic() - t0:.1f}s engine metrics down")
    await asyncio.sleep(p.metrics_down_for)  # the outage itself
    async with session.post(stack.sim_url + "/sim/faults", json={"metrics_down": False}) as response:
        response.raise_for_status()
    log.append(f"{time.monotonic() - t0:.1f}s engine metrics back")


async def _flood(load: Load, p: S7Params, stop_at: float, kind: str = "flood") -> int:
    """Open loop at `flood_factor` times the engine's capacity, users in turn."""
    rate = p.flood_factor * p.capacity()
    start, n = time.monotonic(), 0
    while (due := start + n / rate) < stop_at:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        call = load.new(kind, f"{kind}-{n % p.flood_users}")
        load.start(call, load.run(call))
        n += 1
    return n


async def _cancellers(load: Load, kind: str, phase: str, workers: int, wanted: int, stop_at: float) -> None:
    """`workers` users, each with one call at a time, cancelling it at `phase` until `wanted` were."""

    def done() -> int:
        return sum(1 for c in load.calls if c.kind == kind and c.cancel_phase == phase)

    async def worker(w: int) -> None:
        while done() < wanted and time.monotonic() < stop_at:
            call = load.new(kind, f"{kind}-{w}")
            await load.run(call, cancel_on=phase)
            if not call.admitted:
                await asyncio.sleep(0.2)  # refused by a cap: back off like a client told to retry

    await asyncio.gather(*(worker(w) for w in range(workers)))


async def _duplicates(load: Load, p: S7Params, stop_at: float) -> None:
    """A user sends a request, and while it is live, another with the same request_id."""
    gap = (stop_at - time.monotonic()) / (p.duplicates + 1)
    for i in range(p.duplicates):
        first = load.new("dup-first", "dup", f"dup-{i}")
        admitted = asyncio.Event()
        load.start(first, load.run(first, admitted=admitted))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(admitted.wait(), 5.0)
        if first.admitted and not first.end:
            second = load.new("dup-second", "dup", f"dup-{i}")
            load.start(second, load.run(second))
        await asyncio.sleep(gap)  # spread over the flood


async def _oversized(load: Load, p: S7Params, stop_at: float) -> None:
    gap = (stop_at - time.monotonic()) / (p.oversized + 1)
    for i in range(p.oversized):
        call = load.new("oversized", f"big-{i % 5}")
        load.start(call, load.run(call, prompt=load.prompt(call, p.max_prompt_bytes + 8 * 1024)))
        await asyncio.sleep(gap)  # spread over the flood


async def _sample_rss(pid: int, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError, ValueError):
            peak[0] = max(peak[0], _rss_kb(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


def engine_attempts(lines: list[dict[str, Any]]) -> tuple[dict[str, list[Attempt]], int]:
    """Per tag, its attempts at the engine in order; and how many boots the journal shows."""
    by_tag: dict[str, list[Attempt]] = {}
    open_: dict[tuple[int, int], Attempt] = {}  # (boot, seq) -> attempt
    boot = 0
    for line in lines:
        event = line["event"]
        if event == "boot":
            for attempt in open_.values():
                attempt.end = "killed"
            open_.clear()
            boot += 1
            continue
        if event == "refused":
            if line.get("tag"):
                attempt = Attempt(line["tag"], boot, ["refused"], "refused", line.get("message", ""))
                by_tag.setdefault(attempt.tag, []).append(attempt)
            continue
        key = (boot, int(line["seq"]))
        if event == "received":
            attempt = Attempt(line["tag"], boot, ["received"])
            open_[key] = attempt
            by_tag.setdefault(attempt.tag, []).append(attempt)
            continue
        attempt = open_.get(key)  # type: ignore[assignment]
        if attempt is None:
            continue
        attempt.events.append(event)
        if event in ("finished", "aborted", "failed"):
            attempt.end, attempt.reason = event, line.get("reason", "")
            del open_[key]
    return by_tag, boot


def analyse(
    calls: list[Call],
    by_tag: dict[str, list[Attempt]],
    before: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    after: dict[tuple[str, tuple[tuple[str, str], ...]], float],
) -> dict[str, Any]:
    """The three-way counts and every check's figure."""
    admitted = [c for c in calls if c.admitted]

    def delta(name: str, **labels: str) -> int:
        return round(_sum(after, name, **labels) - _sum(before, name, **labels))

    client = Counter(c.outcome for c in admitted if c.outcome)
    scheduler = {o: delta("llmsched_request_outcomes_total", outcome=o) for o in OUTCOMES}
    engine_completed = {t for t, attempts in by_tag.items() if any(a.end == "finished" for a in attempts)}
    client_completed = {c.tag for c in admitted if c.outcome == "completed"}
    admitted_tags = {c.tag for c in admitted}
    engine_state: Counter[str] = Counter()
    for c in admitted:
        attempts = by_tag.get(c.tag, [])
        if not attempts:
            engine_state["never reached the engine"] += 1
        elif c.tag in engine_completed:
            engine_state["finished at the engine"] += 1
        else:
            engine_state[f"last attempt {attempts[-1].end or 'never ended'}"] += 1
    unterminated = sum(1 for attempts in by_tag.values() for a in attempts if not a.end)
    phantom = sorted(t for t in by_tag if t.startswith("s7:") and t not in admitted_tags)
    phantom_reached = [t for t in phantom if any(a.end != "refused" for a in by_tag[t])]
    outcome_mismatch = sum(abs(client.get(o, 0) - scheduler[o]) for o in OUTCOMES)
    completed_mismatch = len(client_completed ^ engine_completed & admitted_tags)
    hung = [c for c in admitted if c.outcome is None]
    sched_admitted = delta("llmsched_requests_admitted_total")
    lost = len(hung) + max(0, sched_admitted - sum(scheduler.values()))

    twice_engine = [t for t, attempts in by_tag.items() if sum(a.end == "finished" for a in attempts) > 1]
    twice_client = [c.tag for c in calls if c.dispatches_after_token]
    client_failovers = sum(max(0, c.dispatches - 1) for c in calls)
    sched_failovers = delta("llmsched_requests_failed_over_total")

    running_cancelled = [c for c in calls if c.cancel_phase == "running"]
    not_aborted = []
    killed_meanwhile = 0
    for c in running_cancelled:
        last = (by_tag.get(c.tag) or [Attempt(c.tag, 0)])[-1]
        if last.end == "aborted":
            continue
        if last.end == "killed":
            killed_meanwhile += 1
            continue
        not_aborted.append((c.tag, last.end or "no end line"))
    queued_cancelled = [c for c in calls if c.cancel_phase == "queued"]
    queued_reached = [c.tag for c in queued_cancelled if by_tag.get(c.tag)]
    queued_reached_not_aborted = [
        t for t in queued_reached if by_tag[t][-1].end not in ("aborted", "killed", "refused")
    ]

    dup_second = [c for c in calls if c.kind == "dup-second"]
    oversized = [c for c in calls if c.kind == "oversized"]
    refused_by_caps = Counter(f"{c.code} {c.reason}".strip() for c in calls if not c.admitted and c.end == "error")
    return {
        "calls": len(calls),
        "admitted": {"clients": len(admitted), "scheduler": sched_admitted},
        "outcomes": {"clients": dict(client), "scheduler": scheduler},
        "engine_states": dict(engine_state),
        "engine_completed": len(engine_completed & admitted_tags),
        "client_completed": len(client_completed),
        "outcome_mismatch": outcome_mismatch,
        "completed_mismatch": completed_mismatch,
        "unterminated_at_engine": unterminated,
        "engine_tags_not_admitted": len(phantom),
        "engine_served_not_admitted": phantom_reached[:20],
        "hung": [f"{c.tag} {c.kind} dispatches={c.dispatches} tokens={c.tokens}" for c in hung][:20],
        "lost": lost,
        "served_twice_engine": twice_engine[:20],
        "served_twice_client": twice_client[:20],
        "served_twice": len(twice_engine) + len(twice_client),
        "failovers": {"clients": client_failovers, "scheduler": sched_failovers},
        "running_cancels": len(running_cancelled),
        "running_cancels_not_aborted": not_aborted[:20],
        "running_cancels_not_aborted_count": len(not_aborted),
        "running_cancels_engine_killed": killed_meanwhile,
        "queued_cancels": len(queued_cancelled),
        "queued_cancels_reached_engine": len(queued_reached),
        "queued_cancels_reached_not_aborted": queued_reached_not_aborted[:20],
        "duplicates": dict(Counter(f"{c.code or c.end}" for c in dup_second)),
        "duplicates_sent": len(dup_second),
        "duplicates_already_exists": sum(c.code == "ALREADY_EXISTS" for c in dup_second),
        "oversized": dict(Counter(f"{c.code or c.end} {c.reason}".strip() for c in oversized)),
        "oversized_sent": len(oversized),
        "oversized_refused": sum(c.code == "INVALID_ARGUMENT" and c.reason == "PROMPT_TOO_LARGE" for c in oversized),
        "refused_at_admission": dict(refused_by_caps),
        "flood_calls": sum(c.kind == "flood" for c in calls),
    }


class StormRound:
    """How many of a storm's calls an engine took, and the moment it is full of them."""

    def __init__(self, engine_slots: int) -> None:
        self.count = 0
        self.full = asyncio.Event()
        self._slots = engine_slots

    def dispatched(self) -> None:
        self.count += 1
        if self.count >= self._slots:
            self.full.set()


async def _storms(load: Load, p: S7Params) -> None:
    """Cancel storms, one after another: a few users' streams, the first of them filling the engine and the
    rest queued behind it (each user within its caps), all cancelled at once; freed slots go to the next of
    them while the cancels land."""
    for round_ in range(p.storm_rounds):
        storm = asyncio.Event()
        calls = [load.new("storm", f"storm-{round_}-{i % p.storm_users}") for i in range(p.storm_streams)]
        admitted = [asyncio.Event() for _ in calls]
        watch = StormRound(p.max_num_seqs)
        tasks = [load.start(c, load.run_until(c, storm, a, watch)) for c, a in zip(calls, admitted, strict=True)]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                await asyncio.gather(*(a.wait() for a in admitted), watch.full.wait())  # all queued, engine full
        storm.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(1.0)  # the last aborts reach the engine and its journal


def analyse_storms(
    calls: list[Call],
    by_tag: dict[str, list[Attempt]],
    before: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    after: dict[tuple[str, tuple[tuple[str, str], ...]], float],
) -> dict[str, Any]:
    """The storms' cancels three ways: clients, scheduler (outcomes and engine aborts), engine journal."""

    def delta(name: str, **labels: str) -> int:
        return round(_sum(after, name, **labels) - _sum(before, name, **labels))

    cancelled = [c for c in calls if c.end == "cancelled"]
    journal: Counter[str] = Counter()
    orphans = []
    for c in cancelled:
        attempts = by_tag.get(c.tag, [])
        if not attempts:
            journal["never reached the engine"] += 1
            continue
        last = attempts[-1]
        journal[last.end or "never ended"] += 1
        if last.end not in ("aborted", "refused"):
            orphans.append(f"{c.tag} {last.end or 'never ended'} {last.events}")
    aborted = journal["aborted"]
    scheduler_aborts = delta("llmsched_engine_aborts_total")
    return {
        "storm_calls": len(calls),
        "storm_rounds": len({c.user.rsplit("-", 1)[0] for c in calls}),
        "storm_admitted": sum(c.admitted for c in calls),
        "storm_clients_cancelled": len(cancelled),
        "storm_clients_other": dict(Counter(f"{c.end} {c.code}".strip() for c in calls if c.end != "cancelled")),
        "storm_scheduler_cancelled": delta("llmsched_request_outcomes_total", outcome="cancelled"),
        "storm_scheduler_aborts": scheduler_aborts,
        "storm_scheduler_aborts_answered": delta("llmsched_engine_aborts_total", stage="answered"),
        "storm_engine": dict(journal),
        "storm_engine_aborted": aborted,
        "storm_orphans": len(orphans),
        "storm_orphan_list": orphans[:20],
    }


async def _body(p: S7Params, workdir: Path) -> dict[str, Any]:
    stack = Stack(p, workdir)
    log: list[str] = []
    timeout = aiohttp.ClientTimeout(total=10)
    async with contextlib.AsyncExitStack() as stack_ctx:
        stack_ctx.callback(stack.stop)
        session = await stack_ctx.enter_async_context(aiohttp.ClientSession(timeout=timeout))
        await stack.start_sim()
        toml = scheduler_toml(p, stack.sim_url, stack.metrics_port)
        sched = await stack_ctx.enter_async_context(harness.scheduler_process(toml))
        channels = [
            await stack_ctx.enter_async_context(grpc.aio.insecure_channel(sched.target)) for _ in range(p.channels)
        ]
        load = Load([pb_grpc.SchedulerServiceStub(c) for c in channels], p)
        metrics_url = f"http://127.0.0.1:{stack.metrics_port}/metrics"
        pid = sched.proc.popen.pid

        # Warm up with the flood itself for a few seconds, so one-time growth (code paths first taken, gRPC's
        # and aiohttp's pools, metric children) is not charged to the requests the bound is about.
        await _flood(load, p, time.monotonic() + p.warmup_seconds, kind="warmup")
        await asyncio.gather(*load.tasks, return_exceptions=True)
        warm_tags = {c.tag for c in load.calls}
        load.calls.clear()
        await asyncio.sleep(1.0)  # let the warm-up's garbage go before the idle reading
        idle_kb = _rss_kb(pid)
        before = await _scrape(session, metrics_url)

        peak = [idle_kb]
        stop_sampling = asyncio.Event()
        sampler = asyncio.create_task(_sample_rss(pid, peak, stop_sampling))
        t0 = time.monotonic()
        stop_at = t0 + p.flood_seconds
        cancel_deadline = stop_at + 60.0
        faults = asyncio.create_task(_faults(stack, session, load, p, t0, log))
        flooded, *_ = await asyncio.gather(
            _flood(load, p, stop_at),
            _cancellers(load, "qcancel", "queued", p.queued_cancel_workers, p.queued_cancels, cancel_deadline),
            _cancellers(load, "rcancel", "running", p.running_cancel_workers, p.running_cancels, cancel_deadline),
            _duplicates(load, p, stop_at),
            _oversized(load, p, stop_at),
        )
        await faults
        load_end = time.monotonic() - t0
        pending = set(load.tasks)
        if pending:
            _, still = await asyncio.wait(pending, timeout=p.drain_timeout)
            for task in still:
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)
        drained = time.monotonic() - t0
        await asyncio.sleep(1.0)  # the last aborts reach the engine's journal
        after = await _scrape(session, metrics_url)
        stop_sampling.set()
        await sampler
        storms = Load(load.stubs, p, prefix="storm")
        await _storms(storms, p)
        after_storms = await _scrape(session, metrics_url)
        scheduler_alive = sched.proc.popen.poll() is None
        lines = read_journal(stack.journal)

    by_tag, boots = engine_attempts(lines)
    storm_tags = {tag: attempts for tag, attempts in by_tag.items() if tag.startswith("storm:")}
    by_tag = {tag: attempts for tag, attempts in by_tag.items() if tag not in warm_tags and tag not in storm_tags}
    figures = analyse(load.calls, by_tag, before, after)
    figures.update(analyse_storms(storms.calls, storm_tags, after, after_storms))
    figures.update(
        {
            "flood_rate": flooded / p.flood_seconds,
            "capacity": p.capacity(),
            "load_seconds": load_end,
            "drained_seconds": drained,
            "idle_rss_mb": idle_kb / 1024,
            "peak_rss_mb": peak[0] / 1024,
            "rss_growth_mb": (peak[0] - idle_kb) / 1024,
            "rss_bound_mb": (p.max_queued_bytes * p.per_prompt_byte + p.max_queued * p.per_request_overhead) / 2**20,
            "journal_lines": len(lines),
            "journal_boots": boots,
            "scheduler_alive": scheduler_alive,
            "log": log,
            "journal": str(stack.journal),
        }
    )
    return figures


def _three_way(f: dict[str, Any]) -> Table:
    table = Table(["count", "clients", "scheduler", "engine (journal)"])
    states = ", ".join(f"{k} {v}" for k, v in sorted(f["engine_states"].items()))
    table.rows.append(["admitted", str(f["admitted"]["clients"]), str(f["admitted"]["scheduler"]), states])
    for outcome in OUTCOMES:
        engine = str(f["engine_completed"]) if outcome == "completed" else ""
        table.rows.append(
            [outcome, str(f["outcomes"]["clients"].get(outcome, 0)), str(f["outcomes"]["scheduler"][outcome]), engine]
        )
    table.rows.append(
        [
            "failed over (re-sent before a token; clients: after an engine took it)",
            str(f["failovers"]["clients"]),
            str(f["failovers"]["scheduler"]),
            "",
        ]
    )
    return table


def print_three_way(f: dict[str, Any]) -> None:
    from bench.report import table_markdown

    print(table_markdown(_three_way(f)), flush=True)


async def run(provider: EngineProvider, p: S7Params | None = None) -> list[ScenarioResult]:
    p = p or S7Params()
    workload = (
        f"a flood of {p.max_tokens}-token streams from {p.flood_users} users at {p.flood_factor:g}x the engine's "
        f"capacity ({p.flood_factor * p.capacity():.0f} requests/s for {p.flood_seconds:g} s) with caps on "
        f"(max_queued {p.max_queued}, per user {p.max_queued_per_user}, max_prompt_bytes {p.max_prompt_bytes}, "
        f"max_queued_bytes {p.max_queued_bytes}, per user {p.max_queued_bytes_per_user}); engine SIGKILLed at "
        f"{p.kill_at:g} s and restarted; its metrics down {p.metrics_down_for:g} s from {p.metrics_down_at:g} s; "
        f"{p.queued_cancels} cancels while queued and {p.running_cancels} after the first token; {p.duplicates} "
        f"duplicate live request ids; {p.oversized} prompts over max_prompt_bytes"
    )
    if provider.name != "sim":
        return [ScenarioResult.unavailable("S7", TITLE, workload, "runs against the simulator only (its journal)")]
    workdir = Path(tempfile.gettempdir()) / "llmsched-bench"
    workdir.mkdir(exist_ok=True)
    f = await _body(p, workdir)
    print_three_way(f)
    result = ScenarioResult("S7", TITLE, workload, p.profile().describe())
    result.table = _three_way(f)
    bound = f["rss_bound_mb"]
    result.targets += [
        Target("outcome count mismatches (clients, scheduler, engine)", "0", RUN, f["outcome_mismatch"] + f["completed_mismatch"] + f["unterminated_at_engine"] + len(f["engine_served_not_admitted"]), 0, 0, False),  # noqa: E501
        Target("admitted requests lost (no outcome)", "0", RUN, f["lost"], 0, 0, False),
        Target("requests served twice", "0", RUN, f["served_twice"], 0, 0, False),
        # a client hears only of attempts an engine took (a second `dispatched`); one refused outright (the engine
        # down) is counted by the scheduler alone, so the clients' count is a floor for the scheduler's
        Target("failovers clients saw that the scheduler did not count", "0", RUN, max(0, f["failovers"]["clients"] - f["failovers"]["scheduler"]), 0, 0, False),  # noqa: E501
        Target("cancelled running requests not aborted at the engine", "0", RUN, f["running_cancels_not_aborted_count"], 0, 0, False),  # noqa: E501
        Target("cancel storms: engine requests that outlived their cancelled caller (orphans)", "0", RUN, f["storm_orphans"], 0, 0, False),  # noqa: E501
        Target("cancel storms: cancels the clients made that the scheduler did not count", "0", RUN, abs(f["storm_clients_cancelled"] - f["storm_scheduler_cancelled"]), 0, 0, False),  # noqa: E501
        Target("cancel storms: engine aborts the scheduler did not make (journal - scheduler)", "0", RUN, max(0, f["storm_engine_aborted"] - f["storm_scheduler_aborts"]), 0, 0, False),  # noqa: E501
        Target("peak minus idle RSS (MB)", f"<= bytes cap x 3.4 + max_queued x 24 KB (docs/operations.md) = {bound:.1f}", RUN, f["rss_growth_mb"], bound, bound, False),  # noqa: E501
        Target("duplicate live ids answered ALREADY_EXISTS", "100%", RUN, _fraction(f["duplicates_already_exists"], f["duplicates_sent"]), 1.0, 1.0, True, "%"),  # noqa: E501
        Target("oversized prompts answered PROMPT_TOO_LARGE", "100%", RUN, _fraction(f["oversized_refused"], f["oversized_sent"]), 1.0, 1.0, True, "%"),  # noqa: E501
    ]  # fmt: skip
    result.notes += [
        f"Flood sent at {f['flood_rate']:.0f} requests/s against a capacity of {f['capacity']:.1f}/s; "
        f"{f['calls']} calls in all, load for {f['load_seconds']:.0f} s, every call ended by "
        f"{f['drained_seconds']:.0f} s; refused at admission: "
        + ", ".join(f"{k} {v}" for k, v in sorted(f["refused_at_admission"].items())),
        f"Cancels: {f['queued_cancels']} while queued ({f['queued_cancels_reached_engine']} of them had already "
        f"reached the engine), {f['running_cancels']} after the first token ({f['running_cancels_engine_killed']} "
        "ended by the engine's SIGKILL first).",
        f"Cancel storms: {f['storm_rounds']} rounds of {p.storm_streams} streams of {p.storm_tokens} tokens; "
        f"cancelled by the clients {f['storm_clients_cancelled']} (other ends: {f['storm_clients_other'] or 'none'}), "
        f"by the scheduler {f['storm_scheduler_cancelled']} with {f['storm_scheduler_aborts']} engine requests "
        f"closed ({f['storm_scheduler_aborts_answered']} after the engine answered); at the engine: "
        + ", ".join(f"{k} {v}" for k, v in sorted(f["storm_engine"].items()))
        + f"; orphans {f['storm_orphans']}.",
        "Duplicate ids, second call: " + ", ".join(f"{k} {v}" for k, v in sorted(f["duplicates"].items())),
        "Oversized prompts: " + ", ".join(f"{k} {v}" for k, v in sorted(f["oversized"].items())),
        f"Scheduler RSS: idle {f['idle_rss_mb']:.1f} MB, peak {f['peak_rss_mb']:.1f} MB (sampled every 100 ms).",
        "Engine journal: " + f"{f['journal_lines']} lines over {f['journal_boots']} boots. "
        "Engine and clients are joined by the prompt's first line (`s7:<n>`), which the journal keeps as `tag`.",
        *f["log"],
    ]
    if not f["scheduler_alive"]:
        result.notes.append("**The scheduler process died during the run.**")
    result.raw = jsonable(f)
    return [result]


def _fraction(a: int, b: int) -> float | None:
    return a / b if b else None


_P = S7Params()
DEFINITION = Definition(
    id="S7",
    title=TITLE,
    question="Under overload and faults, does every admitted request end in exactly one outcome, and does "
    "memory stay within the caps?",
    workload=f"a flood at {_P.flood_factor:g}x the engine's capacity for {_P.flood_seconds:g} s from "
    f"{_P.flood_users} users; the engine SIGKILLed at {_P.kill_at:g} s and restarted; its metrics down "
    f"{_P.metrics_down_for:g} s from {_P.metrics_down_at:g} s; {_P.queued_cancels} cancels while queued and "
    f"{_P.running_cancels} while running; {_P.duplicates} live duplicate request ids; {_P.oversized} oversized "
    f"prompts; {_P.storm_rounds} cancel storms of {_P.storm_streams} streams ({_P.storm_tokens}-token answers) "
    "cancelled at once",
    layout=f"one simulator ({_P.max_num_seqs} slots, with its request journal, which survives SIGKILL) and one "
    f"scheduler with caps on (max_queued {_P.max_queued}, per user {_P.max_queued_per_user}, max_queued_bytes "
    f"{_P.max_queued_bytes:,})",
    measures="each admitted request's outcome, counted by the clients, by the scheduler "
    "(llmsched_request_outcomes_total) and by the engine's journal; refusals; peak RSS over idle",
    targets=(
        "the three counts agree; none lost; none served twice",
        "every cancelled running request aborted at the engine",
        "cancel storms: no engine request outlives its cancelled caller; clients, scheduler and journal agree",
        "duplicates answered ALREADY_EXISTS, oversized prompts PROMPT_TOO_LARGE",
        "peak minus idle RSS <= the bytes cap x 3.4 + max_queued x 24 KB",
    ),
    command="python -m bench --scenarios S7",
    duration="about 2 minutes",
    facts=(
        "Clients do not cancel from 1 s before the kill to 3 s after the restart: a cancel that races the "
        "engine failing the same request is counted cancelled by the client and failed by the server, a race "
        "of the measurement and not a fault.",
        "The idle RSS is read after a warm-up flood, so one-time growth does not count as per-request memory.",
    ),
    headline=("admitted requests lost (no outcome)",),
)
