"""A fairness policy's two parts on their own: the account records service, the chooser reads a view of it
and changes nothing; the account tells its watchers of every change of a key (what an index of users ordered
by service would follow)."""

from __future__ import annotations

from backends.base import SamplingParams
from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.core.clock import FakeClock
from scheduler_svc.core.queues import ModelQueues
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.policies import FAIRNESS_POLICIES, WeightResolver
from scheduler_svc.policies.fairness.counters import CounterAccount, LeastServed
from scheduler_svc.policies.fairness.turns import FirstInTurn, TurnAccount
from scheduler_svc.policies.fairness.weighted_round_robin import PerRequest


def request(rid: str, user: str) -> QueuedRequest:
    return QueuedRequest(rid, "m", user, "interactive", "p", None, SamplingParams(max_tokens=4), 0.0)


def band_with(users: dict[str, int]) -> ModelQueues:
    queues = ModelQueues([PriorityClassConfig()])
    for user, count in users.items():
        for i in range(count):
            queues.push(request(f"{user}-{i}", user))
    return queues


def test_the_chooser_reads_the_accounts_keys_and_changes_none() -> None:
    clock = FakeClock()
    account = CounterAccount(WeightResolver(), clock, 0.0, PerRequest())
    queues = band_with({"a": 2, "b": 2})
    flows = queues.band("interactive").flow_views
    for user in ("a", "b"):
        account.on_backlogged(user, flows)
    account.on_dispatched(request("a-0", "a"))  # a has one request running: its key is one ahead
    before = account.counters()
    chooser = LeastServed(clock)
    view = account.view(flows)
    assert chooser.select(view, None) == "b"
    assert chooser.select(view, lambda user: user != "b") == "a"  # b cannot go now: the next least served
    assert chooser.select(view, lambda user: False) is None
    assert account.counters() == before


def test_the_account_tells_its_watchers_of_every_key_change() -> None:
    clock = FakeClock()
    account = CounterAccount(WeightResolver(), clock, 0.0, PerRequest())
    moved: list[tuple[str | None, str | None]] = []
    account.watch(lambda user, group: moved.append((user, group)))
    flows = band_with({"a": 1}).band("interactive").flow_views
    account.on_backlogged("a", flows)
    sent = request("a-0", "a")
    account.on_dispatched(sent)
    account.on_requeued(sent)  # refunded
    account.on_dispatched(sent)
    account.on_generated(sent, 2)  # settled
    account.on_finished(sent, 2)
    assert [user for user, _ in moved] == ["a"] * 6
    assert {group for _, group in moved} == {"user:a"}


def test_round_robin_keeps_an_ineligible_users_turn() -> None:
    clock = FakeClock()
    account = TurnAccount(WeightResolver(), clock, 0.0)
    flows = band_with({"a": 2, "b": 2}).band("interactive").flow_views
    for user in ("a", "b"):
        account.on_backlogged(user, flows)
    chooser = FirstInTurn()
    assert chooser.select(account.view(flows), lambda user: user != "a") == "b"
    account.took_turn("b")
    assert chooser.select(account.view(flows), None) == "a", "a kept the first turn while it could not go"


def test_a_wait_for_a_returning_user_is_over_at_its_time_even_if_no_choice_is_made_again() -> None:
    """vtc waits for a user whose request just ended; if the band then empties (or its gate stays closed) no
    choice is made for it again, and the wait must still end at its time: a wait kept past it would have the
    loop pass again at once after every pass."""
    clock = FakeClock()
    policy = FAIRNESS_POLICIES.create("vtc", WeightResolver(), clock, params={"vtc_return_grace_seconds": 0.05})
    queues = band_with({"ahead": 3, "behind": 1})
    flows = queues.band("interactive").flow_views
    for user in ("ahead", "behind"):
        policy.account.on_backlogged(user, flows)

    def serve(rid: str, tokens: int) -> None:
        served = queues.remove(rid)
        assert served is not None
        policy.account.on_dispatched(served)
        policy.account.on_generated(served, tokens)
        policy.account.on_finished(served, tokens)

    serve("behind-0", 4)
    queues.push(request("behind-1", "behind"))  # back within the grace: behind returns promptly
    policy.account.on_backlogged("behind", flows)
    serve("ahead-0", 400)  # ahead has been served far more: behind is behind it
    serve("behind-1", 4)  # behind's answer ended: it is about to return
    assert policy.select(flows) is None and policy.wake_at() == clock.now() + 0.05
    for rid in ("ahead-1", "ahead-2"):  # the band empties (ahead's client left): no choice is made again
        queues.remove(rid)
    clock.advance(0.05)
    assert policy.wake_at() is None
