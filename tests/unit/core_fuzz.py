"""Seeded random configurations and workloads through the whole core, checking its promises as it runs.

`random_config(rng)` draws a configuration layout (how many models and backends, of which kinds, which
priority classes, weights, policies, gates, caps and locality settings); `World` runs the service's core
(`Scheduler` with inert adapters, as `app.stepped` does) against simple engines on a virtual clock, with
clients that arrive in bursts, cancel, give deadlines, name end users and reuse ids, engines that fail
before or after their first token, go dark and come back, scrapes that fail, and live reloads that add and
remove backends, classes and models while requests queue. After the traffic stops, the engines drain what
is left.

What `World.run` checks (an `AssertionError` names the broken promise):
- every admitted request ends exactly once, with an outcome, and never runs at two engines at once;
- nothing is dispatched that was not queued, and the core counts no internal error;
- no stall: after each pass, no queued request could go (`could_dispatch`) unless a fairness policy holds
  its choice for a returning user, and once the clients stop every request ends;
- memory returns to its baseline: the queues, run ledger, load estimators, byte and end-user counts,
  pending fairness charges and reservations hold nothing of the drained requests.

`python -m tests.unit.core_fuzz FIRST COUNT` runs seeds FIRST.. FIRST+COUNT-1 and prints the failures.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import random
import sys
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import structlog

from backends.base import BackendLoad
from backends.errors import BackendError, BackendOverloaded, BackendRejectedRequest, BackendUnavailable
from backends.registry import BACKEND_KINDS
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.app.stepped import SteppedClock, good_reading, inert_backend, pass_while_woken, report_tokens
from scheduler_svc.config import Config
from scheduler_svc.config.live import config_changes
from scheduler_svc.core.admission import build_request
from scheduler_svc.core.errors import SchedulerError
from scheduler_svc.core.request import ClientRequest
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState
from scheduler_svc.dispatch.metrics import SchedulerMetrics
from scheduler_svc.dispatch.scheduler import Scheduler
from tests.quiet_observer import QuietObserver

TICK = 0.05  # seconds of virtual time per step
START = 1000.0

ENGINE_ERRORS: tuple[type[BackendError], ...] = (BackendUnavailable, BackendOverloaded, BackendRejectedRequest)


# -- configurations --------------------------------------------------------------------------------------
def _classes(rng: random.Random, gate_policy: str) -> list[dict[str, Any]]:
    count = rng.choice([1, 1, 2, 3, 3, 6])
    ranks = rng.choice(["distinct", "equal", "mixed"])
    classes = []
    for i in range(count):
        rank = i if ranks == "distinct" else 0 if ranks == "equal" else rng.randint(0, 2)
        entry: dict[str, Any] = {
            "name": f"c{i}",
            "rank": rank,
            "engine_priority": rng.choice([0, 0, i, rng.randint(-5, 20)]),
            "queue_ttl_seconds": rng.choice([0.0, 0.0, 0.0, 0.3, 2.0]),
            "starvation_after_seconds": rng.choice([0.0, 0.5, 5.0, 60.0]),
        }
        if rng.random() < 0.3:
            entry["waiting_target"] = rng.randint(1, 4)
        if gate_policy == "signals":
            if rng.random() < 0.3:
                entry["max_tpot_seconds"] = rng.choice([0.001, 0.05, 0.2])
            if rng.random() < 0.3:
                entry["max_kv_cache_usage"] = rng.choice([0.1, 0.5, 0.9, 1.0])
            if rng.random() < 0.3:
                entry["max_engine_running"] = rng.randint(1, 8)
            if rng.random() < 0.3:
                entry["max_engine_running_when_contended"] = rng.randint(1, 4)
                entry["contention_window_seconds"] = rng.choice([0.0, 0.5, 30.0])
            if rng.random() < 0.25:
                entry["require_idle_engine"] = True
        classes.append(entry)
    return classes


def _backend(rng: random.Random, i: int) -> dict[str, Any]:
    kind = rng.choice(BACKEND_KINDS)
    entry: dict[str, Any] = {
        "name": f"b{i}",
        "kind": kind,
        "url": f"http://b{i}.invalid:8000",
        "max_num_seqs": rng.choice([0, 0, 1, 2, 4, 16]),
        "learn_max_num_seqs": rng.random() < 0.7,
        "scrape_interval_seconds": rng.choice([0.05, 0.2, 1.0]),
    }
    if kind == "vllm":
        entry["priority_scheduling"] = rng.random() < 0.5
    return entry


def _model(rng: random.Random, name: str, backends: int, gate_policy: str) -> dict[str, Any]:
    limit = rng.choice([1, 16, 512, 8192])
    model: dict[str, Any] = {
        "name": name,
        "max_tokens_limit": limit,
        "default_max_tokens": rng.randint(1, limit),
        "max_queued": rng.choice([3, 50, 10000]),
        "max_queued_per_user": rng.choice([1, 5, 1000]),
        "max_end_users_per_user": rng.choice([1, 3, 1000]),
        "max_prompt_bytes": rng.choice([1, 200, 4096]),
        "max_queued_bytes": rng.choice([500, 1 << 20]),
        "max_queued_bytes_per_user": rng.choice([300, 1 << 20]),
        "failover_attempts": rng.choice([0, 1, 3]),
        "failover_cooldown_seconds": rng.choice([0.0, 0.3, 2.0]),
        "input_token_cost": rng.choice([0.0, 1.0, 10.0]),
        "output_token_cost": rng.choice([0.0, 1.0, 3.0]),
        "gate": {
            "policy": gate_policy,
            "waiting_target": rng.randint(1, 4),
            "priority_waiting_target": rng.choice([0, 0, 1, 8]),
            "waiting_target_adapt_seconds": rng.choice([0.0, 2.0]),
            "stale_after_seconds": rng.choice([0.3, 1.0, 5.0]),
            "fallback_max_in_flight": rng.randint(1, 4),
        },
        "backends": [_backend(rng, i) for i in range(backends)],
        "backend_policy": rng.choice(["least_loaded", "prefix_locality"]),
    }
    if model["default_max_tokens"] > limit:
        model["default_max_tokens"] = limit
    if model["backend_policy"] == "prefix_locality":
        model["locality"] = {
            "block_chars": rng.choice([1, 8, 64]),
            "max_blocks_per_request": rng.choice([1, 4, 256]),
            "index_max_bytes": rng.choice([0, 200, 10000]),
            "session_max_bytes": rng.choice([0, 500, 1 << 20]),
            "session_max_bytes_per_user": rng.choice([0, 300, 1 << 16]),
            "max_load_factor": rng.choice([1.0, 1.5, 4.0]),
            "load_slack": rng.choice([0, 4]),
            "deficit_bound": rng.choice([0.0, 0.0, 1.0, 100.0, 1e9]),
            "max_candidates": rng.choice([1, 2, 64]),
        }
    return model


def random_config(rng: random.Random) -> dict[str, Any]:
    """A configuration's tables, drawn over the layouts the service must take."""
    shape = rng.choice(["one", "few", "many_models", "many_backends"])
    if shape == "one":
        sizes = [1]
    elif shape == "few":
        sizes = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
    elif shape == "many_models":
        sizes = [rng.choice([1, 1, 2, 5]) for _ in range(20)]
    else:
        sizes = [100] + [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]
    gate_policy = rng.choice(["signals", "signals", "queue_depth"])
    classes = _classes(rng, gate_policy)
    users = [f"u{i}" for i in range(12)]
    weights: dict[str, Any] = {"default": rng.choice([1.0, 0.5, 1000.0])}
    if rng.random() < 0.6:
        weights["users"] = {u: rng.choice([0.001, 1.0, 1000.0]) for u in rng.sample(users, rng.randint(1, 6))}
    if rng.random() < 0.5:
        groups = {f"g{i}": rng.choice([1.0, 1000.0, 0.01]) for i in range(rng.randint(1, 3))}
        weights["groups"] = groups
        weights["members"] = {u: rng.choice(list(groups)) for u in rng.sample(users, rng.randint(1, 5))}
    scheduling: dict[str, Any] = {
        "fairness": rng.choice(["round_robin", "weighted_round_robin", "vtc", "vtc_basic"]),
        "ordering": rng.choice(["fcfs", "edf"]),
        "default_class": rng.choice(classes)["name"],
        "classes": classes,
        "weights": weights,
        "fairness_scope": rng.choice(["model", "global"]),
        "engine_priority_per_inflight": rng.choice([0, 1, 5]),
        "idle_user_ttl_seconds": rng.choice([0.0, 1.0, 600.0]),
    }
    if scheduling["fairness"] == "vtc":
        scheduling["vtc_lookahead_tokens"] = rng.choice([0.0, 256.0, 1e6])
        scheduling["vtc_return_grace_seconds"] = rng.choice([0.0, 0.2, 1.0])
    models = [_model(rng, f"m{i}", size, gate_policy) for i, size in enumerate(sizes)]
    if any(b["kind"] != "vllm" for m in models for b in m["backends"]):
        for entry in classes:  # the loader refuses a KV-cache limit where an engine does not export it
            entry.pop("max_kv_cache_usage", None)
    if scheduling["fairness"].startswith("vtc"):
        for model in models:  # the loader refuses every token free where the policy charges tokens
            if not model["input_token_cost"] and not model["output_token_cost"]:
                model["output_token_cost"] = 1.0
    return {"scheduling": scheduling, "models": models}


# -- engines ---------------------------------------------------------------------------------------------
@dataclass
class Job:
    request_id: str
    priority: int
    arrived: int
    length: int  # tokens it will generate (at most its max_tokens)
    generated: int = 0
    shown: bool = False


@dataclass
class Engine:
    """A continuous-batching engine: `slots` running, a waiting queue (by priority when it schedules so),
    `speed` tokens per running request a tick; `dark_until`: it refuses everything and cannot be read."""

    slots: int
    speed: int
    by_priority: bool
    has_kv: bool
    waiting: list[Job] = field(default_factory=list)
    running: list[Job] = field(default_factory=list)
    dark_until: float = 0.0
    arrivals: int = 0


# -- the world -------------------------------------------------------------------------------------------
@dataclass
class Knobs:
    """How the traffic and the faults are drawn for one run."""

    seconds: float
    arrival_rate: float  # calls a tick
    users: int
    heavy_share: float  # the share of calls from u0
    cancel_rate: float
    fail_before: float
    fail_after: float
    dark_rate: float
    scrape_fail: float
    reloads: float  # chance of a reload a tick
    timeout_share: float
    end_user_share: float
    id_share: float

    @staticmethod
    def draw(rng: random.Random) -> Knobs:
        return Knobs(
            seconds=rng.choice([5.0, 15.0, 30.0]),
            arrival_rate=rng.choice([0.3, 1.0, 4.0, 20.0]),
            users=rng.choice([1, 2, 6, 12]),
            heavy_share=rng.choice([0.0, 0.5, 0.95]),
            cancel_rate=rng.choice([0.0, 0.01, 0.1]),
            fail_before=rng.choice([0.0, 0.02, 0.3]),
            fail_after=rng.choice([0.0, 0.01, 0.1]),
            dark_rate=rng.choice([0.0, 0.002, 0.02]),
            scrape_fail=rng.choice([0.0, 0.05, 0.5]),
            reloads=rng.choice([0.0, 0.0, 0.01, 0.05]),
            timeout_share=rng.choice([0.0, 0.2, 0.8]),
            end_user_share=rng.choice([0.0, 0.5]),
            id_share=rng.choice([0.0, 0.3]),
        )


class Broken(AssertionError):
    """A promise of the core did not hold."""


class World:
    """The core of one random configuration against its engines and clients (see the module docstring)."""

    def __init__(self, seed: int, raw: dict[str, Any] | None = None, knobs: Knobs | None = None) -> None:
        self.rng = random.Random(seed)
        self.raw = raw if raw is not None else random_config(self.rng)
        self.knobs = knobs if knobs is not None else Knobs.draw(self.rng)
        self.config: Config = config_from_dict(copy.deepcopy(self.raw))
        self.clock = SteppedClock(START)
        self.metrics = SchedulerMetrics()
        self.scheduler = Scheduler(self.config, backend_factory=inert_backend, clock=self.clock, metrics=self.metrics)
        self.tickets: dict[str, Ticket] = {}  # every admitted request
        self.outcomes: Counter[str] = Counter()
        self.at_engine: dict[str, tuple[str, str]] = {}  # request id -> (model, backend) while an engine holds it
        self.in_transit: dict[str, tuple[str, str, float]] = {}  # sent, reaching its engine at the time
        self.engines: dict[tuple[str, str], Engine] = {}
        self.next_scrape: dict[tuple[str, str], float] = {}
        self.wake_at: dict[str, float | None] = {}
        self.stalled: dict[str, float] = {}  # model -> since when work that could go waits
        self.admitted = self.refused = self.dispatched = self.reloads = 0
        self.refusals: Counter[str] = Counter()
        self._ids = 0
        self.draining = False  # the clients stopped: answers are cut short so that the drain ends soon
        self._watched: set[str] = set()
        self._watch_all()

    # -- wiring --------------------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock.now()

    def _watch_all(self) -> None:
        for name, dispatcher in self.scheduler.dispatchers.items():
            if name not in self._watched:
                self._watched.add(name)
                dispatcher.observe_sends(self._sent)
                dispatcher.cluster.observe(_Outcomes(self))
            for handle in dispatcher.backends:
                key = (name, handle.name)
                if key not in self.engines:
                    self.engines[key] = Engine(
                        slots=self.rng.choice([1, 2, 4, 8, 32]),
                        speed=self.rng.choice([1, 3, 20]),
                        by_priority=handle.backend.capabilities.supports_priority,
                        has_kv=handle.backend.capabilities.has_kv_usage,
                    )
                    self.next_scrape[key] = self.now() + self.rng.random() * handle.config.scrape_interval_seconds

    def _sent(self, ticket: Ticket) -> None:
        request_id = ticket.request.request_id
        if ticket.state is not TicketState.DISPATCHED or ticket.backend is None:
            raise Broken(f"{request_id} handed to a backend while {ticket.state}")
        if request_id in self.at_engine or request_id in self.in_transit:
            raise Broken(f"{request_id} dispatched again while an engine still holds it")
        if self.outcomes[request_id]:
            raise Broken(f"{request_id} dispatched after its outcome")
        ticket.sent_at = self.now()
        self.dispatched += 1
        self.in_transit[request_id] = (ticket.request.model, ticket.backend.name, self.now() + TICK)

    def outcome(self, ticket: Ticket) -> None:
        request_id = ticket.request.request_id
        self.outcomes[request_id] += 1
        if self.outcomes[request_id] > 1:
            raise Broken(f"{request_id} ended twice")
        if ticket.outcome is None:
            raise Broken(f"{request_id} ended without an outcome")

    # -- clients -------------------------------------------------------------------------------------
    def _prompt(self, model: str) -> str:
        configured = self.config.model(model)
        limit = configured.max_prompt_bytes if configured is not None else 200
        size = self.rng.choice([0, 1, 10, limit, limit + 1, self.rng.randint(0, limit)])
        head = self.rng.choice(["", "system: be brief. ", "shared prefix " * 8])
        body = head + self.rng.choice("abcdé") * size
        return body[: max(size, 0)] if self.rng.random() < 0.8 else body

    def arrive(self) -> None:
        models = [m.name for m in self.config.models] + ["nope"]
        model = self.rng.choice(models[:-1]) if self.rng.random() < 0.98 else "nope"
        users = self.knobs.users
        user = "u0" if self.rng.random() < self.knobs.heavy_share else f"u{self.rng.randrange(users)}"
        classes = [c.name for c in self.config.scheduling.classes]
        priority_class = self.rng.choice([*classes, "", "nope"] if self.rng.random() < 0.05 else [*classes, ""])
        configured = self.config.model(model)
        limit = configured.max_tokens_limit if configured is not None else 16
        max_tokens = self.rng.choice([None, 1, limit, self.rng.randint(1, limit), limit + 1, 0])
        timeout = self.rng.choice([0.05, 0.5, 3.0]) if self.rng.random() < self.knobs.timeout_share else None
        end_user = f"e{self.rng.randrange(4)}" if self.rng.random() < self.knobs.end_user_share else ""
        client_id = f"id{self.rng.randrange(3)}" if self.rng.random() < self.knobs.id_share else ""
        params = ClientRequest(
            model=model,
            prompt=self._prompt(model),
            max_tokens=max_tokens,
            priority_class=priority_class,
            request_id=client_id,
            end_user=end_user,
            prompt_cache_key=self.rng.choice(["", "", "s1", "s2"]),
        )
        self.submit(params, user, timeout)

    def submit(self, params: ClientRequest, user: str, timeout: float | None = None) -> Ticket | None:
        """A call as admission takes it; None when refused."""
        self._ids += 1
        try:
            request = build_request(params, user=user, config=self.config, now=self.now(), timeout=timeout)
            request.request_id = f"r{self._ids}"
            ticket = self.scheduler.admit(request)
        except SchedulerError as exc:
            self.refused += 1
            self.refusals[exc.reason] += 1
            return None
        self.admitted += 1
        self.tickets[request.request_id] = ticket
        return ticket

    def cancel(self) -> None:
        live = [t for t in self.tickets.values() if t.state is not TicketState.DONE]
        if not live:
            return
        ticket = self.rng.choice(live)
        request_id = ticket.request.request_id
        if ticket.state is TicketState.DISPATCHED:  # as the run does: the engine request is aborted, then it ends
            self._drop_at_engine(request_id)
            self.scheduler.dispatchers[ticket.request.model].events.on_aborted(ticket)
        ticket.close()

    def expire_due(self) -> None:
        """A waiting run's own deadline timer (`Ticket.wait_dispatched`)."""
        now = self.now()
        for ticket in list(self.tickets.values()):
            deadline = ticket.request.deadline
            if ticket.state is TicketState.QUEUED and deadline is not None and deadline <= now:
                self.scheduler.dispatchers[ticket.request.model].events.expire(ticket)

    # -- engines -------------------------------------------------------------------------------------
    def _drop_at_engine(self, request_id: str) -> None:
        self.in_transit.pop(request_id, None)
        where = self.at_engine.pop(request_id, None)
        if where is not None:
            engine = self.engines[where]
            engine.waiting = [j for j in engine.waiting if j.request_id != request_id]
            engine.running = [j for j in engine.running if j.request_id != request_id]

    def _ticket(self, request_id: str) -> Ticket:
        ticket = self.tickets[request_id]
        if ticket.state is not TicketState.DISPATCHED:
            raise Broken(f"an engine holds {request_id}, which is {ticket.state}")
        return ticket

    def _fail(self, request_id: str, shown: bool) -> None:
        ticket = self._ticket(request_id)
        self._drop_at_engine(request_id)
        events = self.scheduler.dispatchers[ticket.request.model].events
        error = self.rng.choice(ENGINE_ERRORS)("engine failed")
        if shown or not events.fail_over(ticket, error):
            ticket.close(Outcome.FAILED)

    def answer_length(self, ticket: Ticket) -> int:
        length = self.rng.randint(1, max(1, ticket.request.max_tokens))
        return min(length, 50) if self.draining else length

    def run_engines(self) -> None:
        now = self.now()
        for request_id, (model, backend, at) in list(self.in_transit.items()):
            if at > now:
                continue
            del self.in_transit[request_id]
            engine = self.engines[(model, backend)]
            if now < engine.dark_until or self.rng.random() < self.knobs.fail_before:
                self.at_engine[request_id] = (model, backend)
                self._fail(request_id, shown=False)
                continue
            ticket = self._ticket(request_id)
            self.at_engine[request_id] = (model, backend)
            self.scheduler.dispatchers[model].events.on_accepted(ticket)
            length = self.answer_length(ticket)
            engine.arrivals += 1
            engine.waiting.append(Job(request_id, ticket.engine_priority or 0, engine.arrivals, length))
        for engine in self.engines.values():
            if engine.by_priority:
                engine.waiting.sort(key=lambda j: (j.priority, j.arrived))
            while engine.waiting and len(engine.running) < engine.slots:
                engine.running.append(engine.waiting.pop(0))
            for job in list(engine.running):
                if job.request_id not in self.at_engine:
                    continue
                if job.shown and self.rng.random() < self.knobs.fail_after:
                    self._fail(job.request_id, shown=True)
                    continue
                count = min(engine.speed, job.length - job.generated)
                ticket = self._ticket(job.request_id)
                events = self.scheduler.dispatchers[ticket.request.model].events
                report_tokens(events, ticket, count, now)
                job.generated += count
                job.shown = True
                if job.generated >= job.length:
                    self._drop_at_engine(job.request_id)
                    ticket.close(Outcome.COMPLETED)

    def scrape(self) -> None:
        now = self.now()
        for key, engine in self.engines.items():
            if self.next_scrape.get(key, math.inf) > now:
                continue
            model, backend = key
            dispatcher = self.scheduler.dispatchers.get(model)
            handle = dispatcher.backend(backend) if dispatcher is not None else None
            if dispatcher is None or handle is None:  # gone: nothing reads it any more
                self.next_scrape.pop(key)
                continue
            self.next_scrape[key] = now + handle.config.scrape_interval_seconds
            if now < engine.dark_until or self.rng.random() < self.knobs.scrape_fail:
                handle.record_reading(BackendLoad(ok=False, read_at=now, error="unreachable"))
            else:
                batch = len(engine.running)
                kv = min(1.0, batch / engine.slots) if engine.has_kv else None
                load = good_reading(
                    now,
                    waiting=len(engine.waiting),
                    running=batch,
                    tpot_seconds=TICK / engine.speed * (1 + batch / 8),
                    kv_cache_usage=kv,
                )
                handle.record_reading(load)
            dispatcher.wake()

    # -- reloads -------------------------------------------------------------------------------------
    def reload(self) -> None:
        raw = copy.deepcopy(self.raw)
        rng = self.rng
        models = raw["models"]
        what = rng.choice(
            [
                "add_backend",
                "remove_backend",
                "add_class",
                "remove_class",
                "add_model",
                "remove_model",
                "weights",
                "caps",
                "drain",
            ]
        )
        model = rng.choice(models)
        if what == "add_backend":
            model["backends"].append(_backend(rng, 1000 + rng.randrange(1000)))
        elif what == "remove_backend" and len(model["backends"]) > 1:
            model["backends"].pop(rng.randrange(len(model["backends"])))
        elif what == "add_class":
            classes = raw["scheduling"]["classes"]
            classes.append({"name": f"x{rng.randrange(1000)}", "rank": rng.randint(-1, 3)})
        elif what == "remove_class" and len(raw["scheduling"]["classes"]) > 1:
            classes = raw["scheduling"]["classes"]
            gone = classes.pop(rng.randrange(len(classes)))
            if raw["scheduling"]["default_class"] == gone["name"]:
                raw["scheduling"]["default_class"] = classes[0]["name"]
        elif what == "add_model":
            gate = models[0]["gate"]["policy"]
            fresh = _model(rng, f"n{rng.randrange(1000)}", rng.randint(1, 3), gate)
            fresh["backend_policy"] = models[0]["backend_policy"]
            fresh.pop("locality", None)
            if "locality" in models[0]:
                fresh["locality"] = copy.deepcopy(models[0]["locality"])
            models.append(fresh)
        elif what == "remove_model" and len(models) > 1:
            models.pop(rng.randrange(len(models)))
        elif what == "weights":
            raw["scheduling"]["weights"]["users"] = {f"u{i}": rng.choice([0.01, 1.0, 100.0]) for i in range(3)}
        elif what == "caps":
            model["max_queued_per_user"] = rng.choice([1, 3, 1000])
            model["max_queued"] = rng.choice([2, 1000])
            model["gate"]["waiting_target"] = rng.randint(1, 4)
        elif what == "drain":
            backend = rng.choice(model["backends"])
            backend["drained"] = not backend.get("drained", False)
        try:
            new = config_from_dict(copy.deepcopy(raw))
        except Exception:
            return
        changes = config_changes(self.config, new)
        if changes.restart or self.scheduler.reload_problems(new):
            return
        self.scheduler.reconfigure(new)
        self.raw, self.config = raw, new
        self.reloads += 1
        self._watch_all()

    def _undrain(self) -> None:
        """Every backend takes work again, so that what is queued can drain."""
        raw = copy.deepcopy(self.raw)
        for model in raw["models"]:
            for backend in model["backends"]:
                backend["drained"] = False
        new = config_from_dict(copy.deepcopy(raw))
        self.scheduler.reconfigure(new)
        self.raw, self.config = raw, new

    # -- the loop ------------------------------------------------------------------------------------
    def settle(self) -> None:
        now = self.now()
        for name, dispatcher in list(self.scheduler.dispatchers.items()):
            armed = self.wake_at.get(name)
            if armed is not None and armed <= now:
                armed = None
                dispatcher.wake()
            self.wake_at[name] = pass_while_woken(dispatcher, now, armed)
            self._look_for_stall(name, dispatcher)

    def _look_for_stall(self, name: str, dispatcher: Any) -> None:
        """Work that could go and did not, with no held choice, for longer than the model's slowest scrape: a
        gate that opens by a reading going stale is seen by the next pass, which the next reading wakes (a
        cooldown's end arms the loop's own timer)."""
        now = self.now()
        held = self.wake_at.get(name) is not None
        could = dispatcher._decisions.could_dispatch(now)
        if not could or held:
            self.stalled.pop(name, None)
            return
        since = self.stalled.setdefault(name, now)
        beat = max(h.config.scrape_interval_seconds for h in dispatcher.backends)
        if now - since > beat + 3 * TICK:
            raise Broken(f"model {name}: work could go and nothing went for {now - since:.2f}s")

    def step(self, traffic: bool) -> None:
        rng = self.rng
        self.clock.move_to(self.now() + TICK)
        self.expire_due()
        if traffic:
            self.traffic()
            if rng.random() < self.knobs.cancel_rate:
                self.cancel()
            if rng.random() < self.knobs.dark_rate:
                engine = rng.choice(list(self.engines.values()))
                engine.dark_until = self.now() + rng.choice([0.5, 3.0])
            if rng.random() < self.knobs.reloads:
                self.reload()
        self.run_engines()
        self.scrape()
        self.settle()

    def traffic(self) -> None:
        """This tick's calls."""
        for _ in range(self._poisson(self.knobs.arrival_rate)):
            self.arrive()

    def _poisson(self, rate: float) -> int:
        count, limit, product = 0, math.exp(-rate), self.rng.random()
        while product > limit:
            count += 1
            product *= self.rng.random()
        return count

    async def run(self) -> None:
        """The traffic for `knobs.seconds`, then a drain with every engine back; raises `Broken`."""
        for _ in range(int(self.knobs.seconds / TICK)):
            self.step(traffic=True)
            await asyncio.sleep(0)  # callbacks the core scheduled (a model or backend that left goes)
        for engine in self.engines.values():
            engine.dark_until = 0.0
            for job in engine.waiting + engine.running:  # long answers end within the drain
                job.length = min(job.length, job.generated + 50)
        self.draining = True
        self._undrain()
        for _ in range(int(600 / TICK)):
            if all(t.state is TicketState.DONE for t in self.tickets.values()):
                break
            self.step(traffic=False)
            await asyncio.sleep(0)
        self.check_drained()

    # -- after the drain -----------------------------------------------------------------------------
    def check_drained(self) -> None:
        stuck = [t for t in self.tickets.values() if t.state is not TicketState.DONE]
        if stuck:
            t = stuck[0]
            raise Broken(
                f"{len(stuck)} requests never ended, e.g. {t.request.request_id} ({t.state.value}, model "
                f"{t.request.model}, class {t.request.priority_class}, user {t.request.user})"
            )
        missing = [i for i in self.tickets if self.outcomes[i] != 1]
        if missing:
            raise Broken(f"{len(missing)} requests ended without an outcome told, e.g. {missing[0]}")
        errors = self._internal_errors()
        if errors:
            raise Broken(f"internal errors counted: {errors}")
        for name, dispatcher in self.scheduler.dispatchers.items():
            self._check_empty(name, dispatcher)
        if self.scheduler._live_ids:
            raise Broken(f"client ids still held: {list(self.scheduler._live_ids)[:3]}")

    def _internal_errors(self) -> dict[str, float]:
        found = {}
        for metric in self.metrics.registry.collect():
            for sample in metric.samples:
                name = sample.name
                if name.startswith("llmsched_internal_errors") and name.endswith("_total") and sample.value:
                    found[str(sample.labels)] = sample.value
        return found

    def _check_empty(self, name: str, dispatcher: Any) -> None:
        d = dispatcher
        leftovers: dict[str, int] = {
            "queued": len(d._book),
            "running": len(d._ledger),
            "held_bytes": d._capacity.held_bytes,
            "user_bytes": len(d._capacity._user_bytes),
            "end_users": len(d._capacity._end_users),
            "nested": len(d._book.end_users._nested),
        }
        for handle in d.backends:
            est = handle.estimator
            for attr in ("_user_of", "_in_flight", "_unstarted", "_priority", "_started_at"):
                if getattr(est, attr, None):
                    leftovers[f"{handle.name}.{attr}"] = len(getattr(est, attr))
        for cls, fairness in d._fairness.items():
            account = fairness.account
            for attr in ("_user_pending", "_group_pending", "_pending"):
                if getattr(account, attr, None):
                    leftovers[f"{cls}.{attr}"] = len(getattr(account, attr))
            reserved = getattr(account, "_reserved", None)
            for attr in ("_remaining", "_user_reserved", "_group_reserved"):
                if reserved is not None and getattr(reserved, attr, None):
                    leftovers[f"{cls}.{attr}"] = len(getattr(reserved, attr))
        left = {k: v for k, v in leftovers.items() if v}
        if left:
            raise Broken(f"model {name} holds state of drained requests: {left}")


class _Outcomes(QuietObserver):
    def __init__(self, world: World) -> None:
        self._world = world

    def on_outcome(self, ticket: Ticket) -> None:
        self._world.outcome(ticket)


class FairWorld(World):
    """Two users kept backlogged in one band with requests of one shape, nothing failing: the share each
    gets of the dispatches follows the fairness policy (round_robin: equal; the weighted ones: by weight,
    a lone member of a group by the group's)."""

    DEPTH = 6  # requests each user keeps queued

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        raw = random_config(rng)
        raw["models"] = raw["models"][:1]
        model = raw["models"][0]
        model["backends"] = model["backends"][: rng.choice([1, 2, 5])]
        model.update(
            max_queued=1000,
            max_queued_per_user=1000,
            max_end_users_per_user=1000,
            max_prompt_bytes=4096,
            max_queued_bytes=1 << 20,
            max_queued_bytes_per_user=1 << 20,
            max_tokens_limit=64,
            default_max_tokens=8,
        )
        if not model["input_token_cost"] and not model["output_token_cost"]:
            model["input_token_cost"] = 1.0  # both free: the token-cost policies' counters would never move
        scheduling = raw["scheduling"]
        scheduling["engine_priority_per_inflight"] = 0  # every user's requests queue alike at the engines
        scheduling["classes"] = [{"name": "c0", "rank": 0}]
        scheduling["default_class"] = "c0"
        heavy, light = rng.choice([(1.0, 1.0), (3.0, 1.0), (1000.0, 1.0), (1.0, 1000.0)])
        if rng.random() < 0.5:
            scheduling["weights"] = {"default": 1.0, "users": {"u0": heavy, "u1": light}}
        else:  # each alone in its group: the group's weight is its own
            scheduling["weights"] = {
                "default": 1.0,
                "users": {"u0": 7.0},
                "groups": {"g0": heavy, "g1": light},
                "members": {"u0": "g0", "u1": "g1"},
            }
        self.weights = (heavy, light)
        knobs = Knobs(
            seconds=20.0,
            arrival_rate=0.0,
            users=2,
            heavy_share=0.0,
            cancel_rate=0.0,
            fail_before=0.0,
            fail_after=0.0,
            dark_rate=0.0,
            scrape_fail=0.0,
            reloads=0.0,
            timeout_share=0.0,
            end_user_share=0.0,
            id_share=0.0,
        )
        super().__init__(seed, raw, knobs)
        self.served: Counter[str] = Counter()

    def traffic(self) -> None:
        dispatcher = self.scheduler.dispatchers["m0"]
        band = dispatcher._book.band("c0")
        for user in ("u0", "u1"):
            flow = band.flows.get(user)
            for _ in range(self.DEPTH - (len(flow) if flow is not None else 0)):
                self.submit(ClientRequest(model="m0", prompt="p" * 40, max_tokens=8), user)

    def answer_length(self, ticket: Ticket) -> int:
        return ticket.request.max_tokens

    def _sent(self, ticket: Ticket) -> None:
        """Counted only while the other user had requests queued too (else either may take every turn)."""
        super()._sent(ticket)
        user = ticket.request.user
        other = "u1" if user == "u0" else "u0"
        if other in self.scheduler.dispatchers["m0"]._book.band("c0").flows:
            self.served[user] += 1

    async def run(self) -> None:
        await super().run()
        self.check_shares()

    def check_shares(self) -> None:
        total = self.served["u0"] + self.served["u1"]
        if self.config.scheduling.fairness == "round_robin":
            expected = 0.5
        else:
            heavy, light = self.weights
            expected = heavy / (heavy + light)
        slack = sum(e.slots for e in self.engines.values()) + 2 * self.DEPTH + 2
        if self.config.scheduling.fairness == "vtc_basic":
            slack *= 4  # it charges nothing before the first token: a user may take several turns meanwhile
        low, high = expected * total / 2 - slack, min(total, expected * total * 2 + slack)
        if not low <= self.served["u0"] <= high:
            raise Broken(
                f"{self.config.scheduling.fairness}: u0 (weight {self.weights[0]}) got {self.served['u0']} of "
                f"{total} dispatches against u1 (weight {self.weights[1]}); expected {expected:.3f} of them"
            )


def run_seed(seed: int) -> World:
    """One seed's world, run to the end (raises what broke)."""
    world = World(seed)
    asyncio.run(world.run())
    return world


def run_fair_seed(seed: int) -> FairWorld:
    """One seed's two-user fairness world, run to the end (raises what broke)."""
    world = FairWorld(seed)
    asyncio.run(world.run())
    return world


def main(argv: list[str]) -> int:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    first, count = int(argv[0]), int(argv[1])
    run = run_fair_seed if "--fair" in argv else run_seed
    failures = 0
    for seed in range(first, first + count):
        try:
            world = run(seed)
        except Exception as exc:
            failures += 1
            kind = "BROKEN" if isinstance(exc, Broken) else "ERROR"
            print(f"seed {seed}: {kind} {type(exc).__name__}: {exc}")
            if kind == "ERROR" or "-v" in argv:
                traceback.print_exc()
            continue
        if "-q" not in argv:
            print(
                f"seed {seed}: ok admitted={world.admitted} refused={world.refused} sent={world.dispatched} "
                f"reloads={world.reloads} models={len(world.config.models)}"
            )
    print(f"{failures} of {count} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
