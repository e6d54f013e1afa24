"""Weighted and token-cost fairness, priority bands, per-class gates, engine priorities, TTLs, caps.

Everything runs on a fake clock with a test gate that models an engine with a fixed number of slots.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TypedDict

import pytest

from backends.base import BackendLoad
from scheduler_svc.config import GateConfig, PriorityClassConfig
from scheduler_svc.core.errors import QueueFull
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.policies import SignalGate
from tests.unit.dispatch_harness import Harness


def keep_backlogged(h: Harness, users: dict[str, int], depth: int = 8) -> None:
    """Top every user's queue up to `depth` requests of `users[user]` tokens."""
    for user, tokens in users.items():
        while h.user_depth(user) < depth:
            h.submit(user, max_tokens=tokens)


def run(h: Harness, users: dict[str, int], steps: int, depth: int = 8) -> Counter[str]:
    """All users backlogged for `steps` engine steps; returns tokens served per user."""
    for _ in range(steps):
        keep_backlogged(h, users, depth)
        h.dispatch()
        h.step()
    return Counter(h.tokens_by_user)


def test_s3_weighted_shares_follow_the_weights_within_5_percent() -> None:
    h = Harness({"fairness": "weighted_round_robin", "weights": {"users": {"w1": 1, "w2": 2, "w4": 4}}}, cap=4)
    served = run(h, {"w1": 10, "w2": 10, "w4": 10}, steps=3000)
    total = sum(served.values())
    for user, weight in (("w1", 1), ("w2", 2), ("w4", 4)):
        assert served[user] / total == pytest.approx(weight / 7, rel=0.05), served


def test_group_weights_are_shared_by_the_group_members() -> None:
    weights = {"groups": {"team": 2}, "members": {"t1": "team", "t2": "team"}, "default": 1}
    h = Harness({"fairness": "weighted_round_robin", "weights": weights}, cap=4)
    served = run(h, {"t1": 10, "t2": 10, "solo": 10}, steps=3000)
    assert served["t1"] + served["t2"] == pytest.approx(2 * served["solo"], rel=0.05), served
    assert served["t1"] == pytest.approx(served["t2"], rel=0.05), served


def test_s4_vtc_gives_long_and_short_answers_about_equal_tokens() -> None:
    h = Harness({"fairness": "vtc"}, cap=8)
    served = run(h, {"long": 1000, "short": 50}, steps=6000, depth=12)
    assert served["long"] == pytest.approx(served["short"], rel=0.10), served


def test_s4_round_robin_by_request_favours_the_long_answers() -> None:
    h = Harness({"fairness": "round_robin"}, cap=8)
    served = run(h, {"long": 1000, "short": 50}, steps=6000, depth=12)
    assert served["long"] > 5 * served["short"], served  # the contrast VTC removes


def test_vtc_lifts_a_returning_user_so_idle_time_earns_no_credit() -> None:
    h = Harness({"fairness": "vtc"}, cap=2)
    run(h, {"a": 20, "b": 20}, steps=400)  # both busy for a while
    for t in h.running():
        t.close(Outcome.CANCELLED)
    for user in ("a", "b"):
        for t in list(h.tickets.values()):
            if t.state is TicketState.QUEUED and t.request.user == user:
                t.close(Outcome.CANCELLED)
    for _ in range(200):  # b goes idle while a keeps the engine busy
        keep_backlogged(h, {"a": 20})
        h.dispatch()
        h.step()
    counters = h.counters("interactive")
    assert counters["a"] > counters.get("b", 0.0)  # b, below the floor a's return lifts it to, may be forgotten
    h.tokens_by_user.clear()
    served = run(h, {"a": 20, "b": 20}, steps=400)  # b is back: lifted, so it does not get 200 steps' credit
    assert served["b"] == pytest.approx(served["a"], rel=0.15), served


def test_bands_are_strict_while_the_higher_band_is_backlogged() -> None:
    h = Harness(cap=2)
    batch = [h.submit("bulk", priority_class="batch") for _ in range(3)]
    interactive = [h.submit("alice") for _ in range(3)]
    first = h.dispatch()
    assert [t.request.priority_class for t in first] == ["interactive", "interactive"]
    for _ in range(40):
        h.dispatch()
        h.step()
    order = [t.request.priority_class for t in h.dispatch_log]
    assert order[:3] == ["interactive"] * 3 and set(order[3:]) == {"batch"}
    assert all(t.outcome is Outcome.COMPLETED for t in batch + interactive)


def test_anti_starvation_lets_a_starving_band_through_every_other_dispatch() -> None:
    classes = [
        {"name": "interactive", "rank": 0},
        {"name": "batch", "rank": 1, "starvation_after_seconds": 5.0},
    ]
    h = Harness({"classes": classes, "default_class": "interactive"}, cap=1)
    h.submit("bulk", priority_class="batch")
    for _ in range(100):  # interactive keeps the single slot busy for 1 s
        keep_backlogged(h, {"alice": 10}, depth=2)
        h.dispatch()
        h.step()
    assert all(t.request.priority_class == "interactive" for t in h.dispatch_log)
    for _ in range(500):  # 5 s more: batch has now waited past its limit
        keep_backlogged(h, {"alice": 10}, depth=2)
        h.dispatch()
        h.step()
    assert "batch" in [t.request.priority_class for t in h.dispatch_log]


def test_a_band_that_may_starve_does_starve() -> None:
    classes = [{"name": "interactive", "rank": 0}, {"name": "batch", "rank": 1, "starvation_after_seconds": 0}]
    h = Harness({"classes": classes, "default_class": "interactive"}, cap=1)
    h.submit("bulk", priority_class="batch")
    for _ in range(1000):
        keep_backlogged(h, {"alice": 10}, depth=2)
        h.dispatch()
        h.step()
    assert all(t.request.priority_class == "interactive" for t in h.dispatch_log)


def test_engine_priority_combines_class_and_the_users_requests_already_at_the_engine() -> None:
    h = Harness({"engine_priority_per_inflight": 2}, cap=10, priority_scheduling=True)
    flood = [h.submit("flood") for _ in range(3)]
    h.dispatch()
    late = h.submit("late")
    batch = h.submit("bulk", priority_class="batch")
    h.dispatch()
    assert [t.engine_priority for t in flood] == [0, 2, 4]
    assert late.engine_priority == 0  # jumps the flood inside the engine
    assert batch.engine_priority == 10  # the batch class's base


def test_no_engine_priority_without_priority_scheduling() -> None:
    h = Harness(cap=10, priority_scheduling=False)
    t = h.submit("a")
    h.dispatch()
    assert t.state is TicketState.DISPATCHED and t.engine_priority is None


def test_queue_ttl_expires_a_request_that_is_then_never_dispatched() -> None:
    classes = [{"name": "interactive", "rank": 0, "queue_ttl_seconds": 2.0}]
    h = Harness({"classes": classes, "default_class": "interactive"}, cap=1)
    running = h.submit("a")
    queued = h.submit("a")
    h.dispatch()
    h.clock.advance(3.0)
    running.close(Outcome.COMPLETED)
    h.dispatch()
    assert queued.outcome is Outcome.EXPIRED and queued.backend is None
    assert h.queued() == 0


def test_per_user_and_model_caps_reject_with_a_retry_hint_from_the_drain_rate() -> None:
    # round robin sends the next at once: vtc may hold a choice for a user returning within its grace
    h = Harness(
        {"fairness": "round_robin"},
        model={"max_queued_per_user": 3, "max_queued": 5, "min_retry_after_seconds": 0.05},
        cap=1,
    )
    for _ in range(3):
        h.submit("a")
    with pytest.raises(QueueFull) as err:
        h.submit("a")
    assert "user a has 3 requests queued" in str(err.value)
    assert err.value.retry_after_seconds == 1.0  # nothing drained yet: the rate is unknown
    h.submit("b")
    h.submit("c")
    with pytest.raises(QueueFull) as err:
        h.submit("d")
    assert "capacity 5" in str(err.value)
    for _ in range(5):  # drain one request every 0.1 s
        h.dispatch()
        h.clock.advance(0.1)
        for t in h.running():
            t.close(Outcome.COMPLETED)
    assert h.queued() == 0
    for user in ("a", "a", "a", "b", "b"):
        h.submit(user)
    with pytest.raises(QueueFull) as err:
        h.submit("e")
    assert err.value.retry_after_seconds == pytest.approx(0.1, rel=0.3)  # one request's worth at ~10/s
    with pytest.raises(QueueFull) as err:
        h.submit("a")
    assert err.value.retry_after_seconds > 0.1  # a's own share of the drain is lower


class ReadingFields(TypedDict, total=False):
    """The engine signals a gate case sets; the rest of its reading keeps BackendLoad's defaults."""

    waiting: int
    running: int
    tpot_seconds: float | None
    kv_cache_usage: float | None


@pytest.mark.parametrize(
    ("cls", "reading", "open_", "why"),
    [
        (
            PriorityClassConfig("i", max_tpot_seconds=0.15),
            {"tpot_seconds": 0.2, "running": 1},
            False,
            "at batch 2 predicted 400ms > 150ms",
        ),
        (PriorityClassConfig("i", max_tpot_seconds=0.15), {"tpot_seconds": 0.05, "running": 1}, True, ""),
        (PriorityClassConfig("i", max_tpot_seconds=0.15), {"tpot_seconds": 0.2}, True, ""),  # it would run alone
        (PriorityClassConfig("i", max_tpot_seconds=0.15), {"tpot_seconds": None}, True, ""),
        (PriorityClassConfig("r"), {"tpot_seconds": 0.9}, True, ""),
        (PriorityClassConfig("i", max_kv_cache_usage=0.8), {"kv_cache_usage": 0.9}, False, "kv cache 90% > 80%"),
        (PriorityClassConfig("i", max_kv_cache_usage=0.8), {"kv_cache_usage": 0.5}, True, ""),
        (PriorityClassConfig("b", require_idle_engine=True), {"waiting": 1}, False, "needs an idle engine queue"),
        (PriorityClassConfig("b", require_idle_engine=True), {"waiting": 0}, True, ""),
        (PriorityClassConfig("i", waiting_target=8), {"waiting": 5}, True, ""),
        (PriorityClassConfig("i"), {"waiting": 5}, False, "waiting 5 >= target 3"),
    ],
)
def test_each_gate_signal_for_each_class(
    cls: PriorityClassConfig, reading: ReadingFields, open_: bool, why: str
) -> None:
    ledger, gate = LoadEstimator(), SignalGate(GateConfig(waiting_target=3))
    load = BackendLoad(ok=True, read_at=10.0, **reading)
    ledger.record_reading(load)
    gate.observe(load)
    decision = gate.decide(ledger.gate_inputs(10.1), cls)
    assert decision.open is open_ and why in decision.reason


def test_tpot_over_the_interactive_limit_holds_the_band_until_the_learned_step_time_recovers() -> None:
    h = Harness(cap=None)  # the real signal gate
    h.reading(waiting=0, tpot=0.3)
    first = h.submit("bob")
    assert h.dispatch() == [first]  # nothing runs: alone, it cannot make anyone's step slower
    h.step()
    h.reading(waiting=0, tpot=0.3, running=1)
    ticket = h.submit("alice")
    assert h.dispatch() == [] and ticket.state is TicketState.QUEUED
    h.reading(waiting=0, tpot=0.02, running=1)  # one fast reading does not outweigh the slow ones yet...
    assert h.dispatch() == []
    h.clock.advance(120.0)  # ...but their weight halves every 30 s
    h.reading(waiting=0, tpot=0.02, running=1)
    assert h.dispatch() == [ticket]


def test_an_engine_slower_than_the_tpot_limit_still_serves_the_class_one_request_at_a_time() -> None:
    """An engine whose step alone is over the limit (a CPU engine, a slow spell) reports no TPOT once idle:
    the line learned while it ran can never come down, and a gate that trusted it at batch 1 would hold the
    class (and, by strict rank, every class under it) until every deadline passed."""
    h = Harness(cap=None)  # the real signal gate; interactive's limit is 150 ms
    for _ in range(5):
        h.reading(waiting=0, tpot=0.2, running=1)  # learned: 200 ms a token even at batch 1
        h.clock.advance(0.2)
    h.reading(waiting=0, tpot=None, running=0)  # idle: nothing generated, no TPOT
    first, second = h.submit("alice", max_tokens=2), h.submit("bob", max_tokens=2)
    assert h.dispatch() == [first]  # alone at the engine
    assert h.dispatch() == []  # a second one would slow the first: the limit holds
    h.step()
    h.step()
    assert first.state is TicketState.DONE
    h.reading(waiting=0, tpot=None, running=0)
    assert h.dispatch() == [second]


def contended_harness() -> Harness:
    """Interactive over batch; batch may run 6 at the engine, 2 while interactive was active in 5 s."""
    return Harness(
        scheduling={
            "default_class": "interactive",
            "classes": [
                {"name": "interactive", "rank": 0},
                {
                    "name": "batch",
                    "rank": 1,
                    "max_engine_running": 6,
                    "max_engine_running_when_contended": 2,
                    "contention_window_seconds": 5.0,
                },
            ],
        },
        model={"gate": {"waiting_target": 100}},
        cap=None,  # the real signal gate
    )


def test_batch_fills_up_to_its_limit_when_no_better_class_was_seen() -> None:
    h = contended_harness()
    h.reading()
    for _ in range(10):
        h.submit("etl", priority_class="batch")
    assert len(h.dispatch()) == 6


def test_batch_is_held_to_its_contended_limit_while_interactive_is_around_and_fills_up_after() -> None:
    h = contended_harness()
    h.reading()
    question = h.submit("alice", max_tokens=1)
    assert h.dispatch() == [question]
    h.step()  # the interactive request finishes: its class was active just now
    assert question.state is TicketState.DONE
    for _ in range(10):
        h.submit("etl", priority_class="batch")
    h.reading()
    assert len(h.dispatch()) == 2  # alice's request is over: 2 batch may run
    decision = next(s.decision for s in h.gates() if s.priority_class == "batch")
    assert not decision.open and "running 2 >= 2" in decision.reason and "better class active" in decision.reason
    h.clock.advance(4.9)
    h.reading()
    assert h.dispatch() == []  # still within the window
    h.clock.advance(0.2)
    h.reading()
    assert len(h.dispatch()) == 4  # interactive quiet for 5 s: batch fills up to 6 running


def test_a_running_interactive_request_keeps_batch_contended_past_the_window() -> None:
    h = contended_harness()
    h.reading()
    h.submit("alice", max_tokens=10_000)
    h.dispatch()
    h.clock.advance(60.0)
    h.reading()
    for _ in range(10):
        h.submit("etl", priority_class="batch")
    h.clock.advance(60.0)  # the batch admissions are old too; alice's request still runs
    h.reading()
    assert len(h.dispatch()) == 1  # 2 running at most, alice's included


def long_vs_short_after_a_synchronised_start(lookahead: float) -> list[float]:
    """Both users start at once on an idle 32-slot engine, so the long answers that fill it in arrival
    order end together one lifetime (1000 steps) later. Returns long/short tokens in each 500-step window
    from the first lifetime on."""
    h = Harness({"fairness": "vtc", "vtc_lookahead_tokens": lookahead}, cap=32)
    tokens = {"long": 1000, "short": 50}

    def top_up() -> None:  # closed loops: each user keeps 48 requests queued or running
        for user, n in tokens.items():
            while h.user_depth(user) + h.handle.estimator.user_in_flight.get(user, 0) < 48:
                h.submit(user, max_tokens=n, prompt="pp")

    for _ in range(48):  # interleaved arrivals, each sent on arrival while the engine has room
        for user, n in tokens.items():
            h.submit(user, max_tokens=n, prompt="pp")
            h.dispatch()
    windows = []
    for step in range(3000):
        h.step()
        top_up()
        h.dispatch()
        if step % 500 == 499:
            windows.append(dict(h.tokens_by_user))
    served = [{u: later[u] - earlier.get(u, 0) for u in tokens} for earlier, later in itertools.pairwise(windows)]
    return [window["long"] / window["short"] for window in served[1:]]


def test_vtc_settles_after_long_answers_that_started_together_end_together() -> None:
    ratios = long_vs_short_after_a_synchronised_start(lookahead=128)
    assert all(0.8 <= r <= 1.25 for r in ratios), ratios


def test_counting_whole_answers_ahead_makes_the_shares_swing() -> None:
    """The reason for the look-ahead limit: counting each whole 1000-token answer at dispatch starves the
    long user for a lifetime after its answers end together."""
    ratios = long_vs_short_after_a_synchronised_start(lookahead=1e9)
    assert min(ratios) < 0.5, ratios


def _closed_loop_s4(
    h: Harness, steps: int, resubmit_after: int, fill_one_at_a_time: bool = False
) -> tuple[list[int], list[int]]:
    """S4 on the fake clock: 8 engine slots behind a FIFO waiting queue (the harness's cap of 11
    in flight = 8 + a waiting target of 3), 8 closed-loop streams each of 1000- and 50-token answers; a
    finished request's client sends its next one `resubmit_after` steps later, so the dispatch that the
    ending triggers (the next step's) comes first. With `fill_one_at_a_time` each request that arrives is
    dispatched before the next arrives (as the streams' first requests reach an idle scheduler), so the
    engine's first fill is arrival order, not a choice. Returns tokens per step for long and short."""
    due: list[tuple[int, str, int]] = [(0, "long", 1000), (0, "short", 50)] * 8
    engine: list[Ticket] = []  # in the order the engine took them: the first 8 run
    long_tokens: list[int] = []
    short_tokens: list[int] = []
    for step in range(steps):
        for _, user, tokens in [d for d in due if d[0] <= step]:
            h.submit(user, max_tokens=tokens, prompt="p")
            if fill_one_at_a_time:
                engine += h.dispatch()
        due = [d for d in due if d[0] > step]
        engine = [t for t in engine + h.dispatch() if t.state is TicketState.DISPATCHED]
        h.clock.advance(0.0224)  # the simulator's step at 8 running
        got = Counter[str]()
        for ticket in engine[:8]:
            if ticket.first_token_at is None:
                ticket.first_token_at = h.clock.now()
                h.events.on_first_token(ticket)
            ticket.completion_tokens += 1
            got[ticket.request.user] += 1
            h.events.on_generated(ticket, 1)
            if ticket.completion_tokens >= ticket.request.max_tokens:
                ticket.close(Outcome.COMPLETED)
                due.append((step + resubmit_after, ticket.request.user, ticket.request.max_tokens))
        long_tokens.append(got["long"])
        short_tokens.append(got["short"])
    return long_tokens, short_tokens


def _assert_s4_targets(long_tokens: list[int], short_tokens: list[int]) -> None:
    """S4's targets on tokens per step: after a warm-up of two long lifetimes (2000 steps), long/short within
    0.05 cumulatively and within 0.15 in every 60 s window (one starting every 5 s)."""
    warm, window = 2000, int(60 / 0.0224)
    cum_long, cum_short = list(itertools.accumulate(long_tokens)), list(itertools.accumulate(short_tokens))
    assert abs((cum_long[-1] - cum_long[warm]) / (cum_short[-1] - cum_short[warm]) - 1) <= 0.05
    for start in range(warm, len(cum_long) - window, window // 12):
        ratio = (cum_long[start + window] - cum_long[start]) / (cum_short[start + window] - cum_short[start])
        assert abs(ratio - 1) <= 0.15, (start, ratio)


@pytest.mark.parametrize("resubmit_after", [1, 3])
@pytest.mark.parametrize("prices", [None, {"input_token_cost": 0.5, "output_token_cost": 3.0}])
def test_s4_vtc_holds_in_every_60_s_window_when_each_users_requests_sit_in_the_engine(
    resubmit_after: int, prices: dict[str, float] | None
) -> None:
    """With the user's flow empty while its requests run or wait in the engine, vtc must neither lift the
    short user on every return nor hand the slot its ending freed to the long user (without the return
    grace and the bounded lift: 1.13-5.2 long/short here, 1.28 on the simulator). Targets: 0.15 in every
    60 s window after two long lifetimes, 0.05 cumulatively."""
    h = Harness({"fairness": "vtc"}, model=prices, cap=11)
    long_tokens, short_tokens = _closed_loop_s4(h, steps=12_000, resubmit_after=resubmit_after)
    _assert_s4_targets(long_tokens, short_tokens)


@pytest.mark.parametrize("prices", [None, {"input_token_cost": 0.5, "output_token_cost": 3.0}])
def test_s4_vtc_repays_the_head_start_an_idle_engines_first_fill_gives_within_the_warm_up(
    prices: dict[str, float] | None,
) -> None:
    """The idle engine's first fill is arrival order, not a choice (each stream's first request goes out as it
    arrives): the engine's FIFO then gives the long user most of the slots for its first lifetime, which no
    policy can take back. vtc must repay that head start within S4's warm-up of two long lifetimes, so every
    window after it still holds 0.15 (the simulator's S4 shows the same head start: docs/benchmarks.md, S4)."""
    h = Harness({"fairness": "vtc"}, model=prices, cap=11)
    long_tokens, short_tokens = _closed_loop_s4(h, steps=6000, resubmit_after=1, fill_one_at_a_time=True)
    lifetime = 1000  # steps
    assert sum(long_tokens[:lifetime]) > 2 * sum(short_tokens[:lifetime])  # the head start is there
    _assert_s4_targets(long_tokens, short_tokens)
