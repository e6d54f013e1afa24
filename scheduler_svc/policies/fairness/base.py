"""A fairness policy is two small things, composed: an account and a chooser.

- The **account** records the service each user of one band has received (dispatches, generated tokens,
  ends, refunds after a failover) and keeps what the choice compares: a key per user and group for the
  counter policies, the turn order for round robin. It is the only state that changes with service.
- The **chooser** answers "who goes next" from a read-only view of the band's backlogged flows and of the
  account (`Account.view`), among the users some backend can take now.

`Fairness` holds one of each for one band and is what dispatch calls: choice through `select` / `offer` /
`wake_at`, service events through `account`. A policy is a module that builds one (`Build`), registered by
one line in `policies.fairness`; its parameters are a dataclass of `config.setting` fields read from the
[scheduling] table (`FairnessParams` holds the ones every policy shares).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from scheduler_svc.config import setting
from scheduler_svc.core.clock import Clock
from scheduler_svc.policies.cost import Counters, Prices
from scheduler_svc.policies.interfaces import FlowView, RequestView
from scheduler_svc.policies.weights import WeightResolver

Eligible = Callable[[str], bool]
"""Whether some backend can take the user's next request now (dispatch's filter on the choice)."""


@dataclass(frozen=True)
class FairnessParams:
    """The parameters every fairness policy reads, under [scheduling]."""

    idle_user_ttl_seconds: float = setting(
        600.0,
        "How long a user with nothing queued or running keeps its fair-share state (counter, length "
        "estimate) when forgetting it earlier could change a decision; it is forgotten at once when that "
        "cannot happen (its counter is at or below the floor a returning user is lifted to). Long enough "
        "that a heavy user cannot shed its debt by pausing; 0 keeps such state for good (safe rule only).",
        bounds=">= 0",
    )


class Account(Protocol):
    """The service one band's users have received, as the policy counts it."""

    def view(self, flows: Mapping[str, FlowView]) -> Any:
        """The read-only view a choice reads, over the band's backlogged `flows` (in the order they became
        backlogged). Taking it is the moment a choice looks at the band: a counter policy raises the floor it
        lifts returning users to, round robin lets a turn given back after a failover lapse."""
        ...

    def took_turn(self, user: str) -> None:
        """The chooser picked `user` (round robin moves it to the end of its turns)."""
        ...

    def on_backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        """`user`'s flow went from empty to non-empty; `flows` are all backlogged flows, it included."""
        ...

    def on_dispatched(self, request: RequestView) -> None:
        """`request` left the queue for an engine."""
        ...

    def on_generated(self, request: RequestView, tokens: int) -> None:
        """`tokens` more tokens were generated for `request` (dispatched from this band)."""
        ...

    def on_finished(self, request: RequestView, generated: int, *, reached_engine: bool = True) -> None:
        """`request` ended (any outcome) after generating `generated` tokens. `reached_engine` False: no
        engine ever answered it (cancelled while being chosen or sent), so what `on_dispatched` charged is
        undone, as for `on_requeued`, since the engine did no work for it."""
        ...

    def on_requeued(self, request: RequestView) -> None:
        """`request` came back before its first token (failover) and is queued again: undo what
        `on_dispatched` charged, since the engine did no work for it; it will be dispatched again."""
        ...

    def use_costing(self, prices: Prices, users: Counters, groups: Counters) -> None:
        """Before any event: the model's token prices, and where the band's user and group counters live
        (its own, or views of a class-wide spend under `fairness_scope = "global"`; see `policies.cost`).
        An account that counts no tokens or keeps no counters ignores what it does not use. Called again,
        with the same counters, when a reload changes the prices: they hold for the charges from then on."""
        ...

    def counts_at(self, prices: Prices) -> bool:
        """Whether service at a model's `prices` moves the account at all (False: every request there would
        cost nothing, and the policy would share nothing; the configuration refuses such a model)."""
        ...

    def counters(self) -> dict[str, float]:
        """Per-user fair-share state for introspection (empty when the policy keeps none)."""
        ...

    def tracked_users(self) -> int:
        """How many users the account keeps any state for; idle ones are forgotten (`activity`)."""
        ...


class Chooser(Protocol):
    """Who of one band's backlogged users goes next, from the account's view."""

    def select(self, view: Any, eligible: Eligible | None) -> str | None:
        """The user whose flow is served next; the view's flows are non-empty. With `eligible`, the next
        among the users it accepts, None when it accepts none (an ineligible user keeps its place)."""
        ...

    def offer(self, view: Any, eligible: Eligible | None, bound: float, limit: int) -> list[str]:
        """The users whose next request may go now without breaking the policy's fairness bound by more
        than `bound` (D-LPM's candidates, `locality.py`): `select`'s choice first, then the other eligible
        users within `bound` of it, in backlog order, at most `limit` in all (the least served of them);
        empty when none is eligible. A policy with no counters offers `select`'s choice alone."""
        ...

    def wake_at(self) -> float | None:
        """When `select` returned None to wait (briefly, by the policy's own bound) for a user about to
        return: the clock time at which to choose again. None when it is not waiting."""
        ...


class Fairness:
    """One band's fairness policy: the chooser and the account it reads. `guarantee`, when the policy states
    one, is its bound on the service two always-backlogged users of weight 1 may differ by
    (`guarantee(in_flight, longest_answer, longest_prompt)`)."""

    def __init__(
        self,
        chooser: Chooser,
        account: Account,
        guarantee: Callable[[int, int, int], float] | None = None,
    ) -> None:
        self.chooser = chooser
        self.account = account
        self.guarantee = guarantee

    def select(self, flows: Mapping[str, FlowView], eligible: Eligible | None = None) -> str | None:
        """Who goes next among the band's backlogged `flows` (see `Chooser.select`)."""
        chosen = self.chooser.select(self.account.view(flows), eligible)
        if chosen is not None:
            self.account.took_turn(chosen)
        return chosen

    def offer(self, flows: Mapping[str, FlowView], eligible: Eligible | None, bound: float, limit: int) -> list[str]:
        """The users that may go now within `bound` of the policy's own choice, at most `limit` (see
        `Chooser.offer`)."""
        users = self.chooser.offer(self.account.view(flows), eligible, bound, limit)
        if users:
            self.account.took_turn(users[0])
        return users

    def wake_at(self) -> float | None:
        """When a held choice must be made again (see `Chooser.wake_at`)."""
        return self.chooser.wake_at()


Build = Callable[[Any, WeightResolver, Clock], Fairness]
"""How a registered policy is made for one band: from its parameters (its own `FairnessParams` dataclass),
the weights and the clock."""
