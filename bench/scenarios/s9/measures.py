"""What S9's day measures, heard from the simulation's events (`simulation.Observer`).

Each call is counted for its own user (`Call.account`), also under FIFO where the core sees one user.

- TTFT: from the call's arrival to its first token; a call still without one at the end counts with the
  time it has waited so far (a lower bound), so a queue that never drains cannot hide in the percentiles.
- Service: vtc's cost at the shipped prices (each prompt token 1 when the request is sent, each generated
  token 2 as it streams). For the heaviest users of each model, every pair's difference in service since
  both became backlogged (both with a request queued in the core) is followed after every event that
  changes it, against the bound vtc states (`Fairness.guarantee`, with the most requests the model had in
  flight at once and the longest prompt and answer of the mix).
- The heaviest user's share of its model's service against its max-min fair share (weight 1): the service
  given shared out by water-filling over every user's demand (the cost of the prompts and answers it asked
  for), the share vtc aims at.
- Engine steps: of the steps run while the model had a request queued in the core, those with every slot
  busy (the state of the queue when the run of steps ends).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from bench.product import FAIRNESS_POLICIES, Sent, WeightResolver
from bench.scenarios.s9.engine import BatchEngine
from bench.scenarios.s9.simulation import Call, Observer, Simulation

PROMPT_COST = 1.0  # vtc's weights at the shipped prices
GENERATED_COST = 2.0


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fair_shares(demand: dict[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair shares of `capacity` over `demand` (equal weights): water-filling."""
    shares: dict[str, float] = {}
    left, users = capacity, sorted(demand, key=lambda u: demand[u])
    for i, user in enumerate(users):
        level = left / (len(users) - i)
        shares[user] = min(demand[user], level)
        left -= shares[user]
    return shares


class DayMeasures(Observer):
    """The day's figures for one setup (see the module docstring)."""

    def __init__(
        self, slots: int, light_users: set[str], checked: dict[str, list[str]], longest: tuple[int, int]
    ) -> None:
        self._slots = slots
        self._light = light_users
        self._checked = {user: model for model, users in checked.items() for user in users}
        self._peers = {user: [v for v in checked[model] if v != user] for user, model in self._checked.items()}
        self._longest = longest  # (prompt, answer) tokens
        self.arrived = self.refused_count = self.completed = 0
        self._queued_model: dict[str, int] = defaultdict(int)
        self._queued_user: dict[str, int] = defaultdict(int)
        self._in_flight: dict[str, int] = defaultdict(int)
        self.most_in_flight: dict[str, int] = defaultdict(int)
        self._waiting_first: dict[int, Call] = {}  # id(call) -> call, until its first token
        self.ttft_light: list[float] = []
        self.ttft_all: list[float] = []
        self.service: dict[str, float] = defaultdict(float)
        self.demand: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # model -> user -> cost
        self._pair_base: dict[tuple[str, str], tuple[float, float]] = {}
        self.largest_difference = 0.0
        self.steps_queued = self.steps_full = 0

    def attach(self, simulation: Simulation) -> None:
        self._simulation = simulation

    @staticmethod
    def _who(call: Call) -> str:
        return call.account or call.user

    # -- events -------------------------------------------------------------------------------------------
    def admitted(self, call: Call, request_id: str, now: float) -> None:
        user = self._who(call)
        self.arrived += 1
        self._queued_model[call.model] += 1
        self.demand[call.model][user] += PROMPT_COST * call.prompt_tokens + GENERATED_COST * call.max_tokens
        self._waiting_first[id(call)] = call
        self._queued_user[user] += 1
        if self._queued_user[user] == 1 and user in self._checked:
            self._backlogged(user)

    def refused(self, call: Call, reason: str, now: float) -> None:
        self.arrived += 1
        self.refused_count += 1

    def sent(self, sent: Sent, call: Call, now: float) -> None:
        user = self._who(call)
        self._queued_model[call.model] -= 1
        self._queued_user[user] -= 1
        self._in_flight[call.model] += 1
        self.most_in_flight[call.model] = max(self.most_in_flight[call.model], self._in_flight[call.model])
        self._serve(user, PROMPT_COST * call.prompt_tokens)
        if self._queued_user[user] == 0 and user in self._checked:
            for peer in self._peers[user]:
                self._pair_base.pop(_pair(user, peer), None)

    def first_token(self, call: Call, now: float) -> None:
        del self._waiting_first[id(call)]
        wait = now - call.at
        self.ttft_all.append(wait)
        if self._who(call) in self._light:
            self.ttft_light.append(wait)

    def tokens(self, call: Call, count: int, now: float) -> None:
        user = self._who(call)
        self._serve(user, GENERATED_COST * count)

    def finished(self, call: Call, now: float) -> None:
        self._in_flight[call.model] -= 1
        self.completed += 1

    def steps(self, model: str, engine: BatchEngine, count: int, batch: int, now: float) -> None:
        if self._queued_model[model] > 0:
            self.steps_queued += count
            if batch >= self._slots:
                self.steps_full += count

    # -- the service bound --------------------------------------------------------------------------------
    def _backlogged(self, user: str) -> None:
        for peer in self._peers[user]:
            if self._queued_user[peer] > 0:
                self._pair_base[_pair(user, peer)] = (self.service[min(user, peer)], self.service[max(user, peer)])

    def _serve(self, user: str, cost: float) -> None:
        self.service[user] += cost
        if user not in self._checked:
            return
        for peer in self._peers[user]:
            base = self._pair_base.get(_pair(user, peer))
            if base is not None:
                first, second = sorted((user, peer))
                difference = abs((self.service[first] - base[0]) - (self.service[second] - base[1]))
                self.largest_difference = max(self.largest_difference, difference)

    def bound(self) -> float:
        """vtc's stated bound with the most requests any model had in flight at once."""
        policy = FAIRNESS_POLICIES.create("vtc", WeightResolver(), self._simulation.core.clock)
        assert policy.guarantee is not None
        in_flight = max(self.most_in_flight.values(), default=0)
        return policy.guarantee(in_flight, self._longest[1], self._longest[0])

    # -- figures ------------------------------------------------------------------------------------------
    def figures(self, end: float, *, heaviest: str, model: str) -> dict[str, Any]:
        censored = [end - call.at for call in self._waiting_first.values()]
        light_censored = [
            w for w, call in zip(censored, self._waiting_first.values(), strict=True) if self._who(call) in self._light
        ]
        light = self.ttft_light + light_censored
        demand = self.demand[model]
        served = {user: self.service[user] for user in demand}
        total = sum(served.values())
        fair = fair_shares(dict(demand), total)
        share = served.get(heaviest, 0) / total if total else None
        fair_share = fair.get(heaviest, 0.0) / total if total else None
        bound = self.bound()
        return {
            "arrived": self.arrived,
            "refused": self.refused_count,
            "completed": self.completed,
            "without_first_token": len(censored),
            "ttft_light_p50": percentile(light, 0.5),
            "ttft_light_p99": percentile(light, 0.99),
            "ttft_all_p50": percentile(self.ttft_all + censored, 0.5),
            "ttft_light_mean": statistics.fmean(light) if light else None,
            "heaviest_share": share,
            "heaviest_fair_share": fair_share,
            "heaviest_share_over_fair": share / fair_share if share is not None and fair_share else None,
            "largest_service_difference": self.largest_difference,
            "service_bound": bound,
            "bound_held": self.largest_difference <= bound,
            "full_step_share": self.steps_full / self.steps_queued if self.steps_queued else None,
            "most_in_flight": dict(self.most_in_flight),
        }


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)
