"""What a request costs, and where a user's fair-share counter lives (one model, or all of them).

Prices: each model has `input_token_cost` and `output_token_cost` (default 1 and 1). The token-cost
fairness policies (`vtc`, `vtc_basic`) multiply their own token weights (prompt 1, generated 2) by them,
so with the defaults nothing changes, and with prices a user's share is counted in cost: a token of a
model priced 10 weighs ten times a token of a model priced 1.

Scope (`scheduling.fairness_scope`): `model` (default) keeps one counter per user per (model, priority
class), as before. `global` shares a user's *spend* (its settled charges) across every model's band of
the same priority class, so heavy use of an expensive model is repaid on a cheap one. Bands of different
classes never share: a class is a separate contract. Each band keeps its own *lift* (what VTC adds to a
user's counter when it becomes backlogged, so idle time earns no credit) on top of the shared spend:
the user's counter in a band is `shared spend + that band's lift`. So

- switching model does not shed debt: the spend, which holds everything the user consumed on any model,
  comes along, and a lift only ever raises a counter to the band's floor, never lowers it;
- a user is not penalised for joining a second model: a lift in one band raises its counter only there
  (lifting the shared spend would push it behind its peers on the model it was already using), and it
  is lifted to at most the smallest counter among that band's backlogged users, so its penalty on
  arrival is exactly its spend above theirs: what it really consumed, never more.

Memory: a shared spend stays while any band tracks the user, and goes with the last one. A band forgets
an idle user's shared spend only by the idle TTL (`idle_user_ttl_seconds`), never by the safe rule: a
user alone on the dear model is compared with nobody there, yet its spend still counts on the cheap one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler_svc.config import ModelConfig


@dataclass(frozen=True)
class Prices:
    """Per-token prices of one model."""

    input: float = 1.0
    output: float = 1.0

    @classmethod
    def of(cls, model: ModelConfig) -> Prices:
        return cls(model.input_token_cost, model.output_token_cost)

    def cost(self, prompt_tokens: float, generated_tokens: float) -> float:
        return self.input * prompt_tokens + self.output * generated_tokens


class Counters:
    """Per-key (user or group) counters of one band: settled charges plus lifts, both only growing."""

    shared = False  # True: the charges are other bands' too, so only the idle TTL may forget them

    def watch(self, changed: Callable[[str], None]) -> None:
        """Tell `changed(key)` when a key's value changes by another band's doing (a shared spend); this
        band's own charges and lifts are its own events, and its account knows them."""
        return None

    def value(self, key: str) -> float:
        raise NotImplementedError

    def charge(self, key: str, cost: float) -> None:
        raise NotImplementedError

    def lift(self, key: str, floor: float) -> None:
        """Raise the key's counter to `floor` if it is below."""
        raise NotImplementedError

    def forget(self, key: str) -> None:
        raise NotImplementedError

    def __contains__(self, key: object) -> bool:
        raise NotImplementedError

    def keys(self) -> set[str]:
        raise NotImplementedError

    def close(self) -> None:
        """The band is gone (its class or its model left the configuration): forget every key, and for a
        shared spend stop hearing of other bands' charges, so nothing of the band is kept alive."""
        for key in list(self.keys()):
            self.forget(key)


class LocalCounters(Counters):
    """`fairness_scope = "model"`: the band's own counters (today's behaviour, bit for bit)."""

    def __init__(self) -> None:
        self._counter: dict[str, float] = {}

    def value(self, key: str) -> float:
        return self._counter.get(key, 0.0)

    def charge(self, key: str, cost: float) -> None:
        self._counter[key] = self._counter.get(key, 0.0) + cost

    def lift(self, key: str, floor: float) -> None:
        self._counter[key] = max(self._counter.get(key, 0.0), floor)

    def forget(self, key: str) -> None:
        self._counter.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._counter

    def keys(self) -> set[str]:
        return set(self._counter)


class SharedSpend:
    """`fairness_scope = "global"`: the spend of every user (or group) of one priority class, over all
    models, with how many bands track each key (the entry goes with the last). Every band's view is told
    when another band charges a key: its backlog order files backlogged users by value, and a user may be
    backlogged in a band that never charged it."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self._holders: dict[str, int] = {}
        self._views: list[SharedCounters] = []  # one per band of the class (one per model)

    def view(self, counters: SharedCounters) -> None:
        self._views.append(counters)

    def unview(self, counters: SharedCounters) -> None:
        """A band that is gone no longer hears of charges."""
        self._views = [view for view in self._views if view is not counters]

    def hold(self, key: str) -> None:
        self._holders[key] = self._holders.get(key, 0) + 1

    def release(self, key: str) -> None:
        left = self._holders.get(key, 0) - 1
        if left > 0:
            self._holders[key] = left
        else:
            self._holders.pop(key, None)
            self.spent.pop(key, None)

    def charge(self, key: str, cost: float, by: SharedCounters) -> None:
        self.spent[key] = self.spent.get(key, 0.0) + cost
        for view in self._views:
            if view is not by:
                view.changed(key)


class SharedCounters(Counters):
    """One band's view of a class's shared spend: counter = shared spend + this band's own lift."""

    shared = True

    def __init__(self, spend: SharedSpend) -> None:
        self._spend = spend
        self._lift: dict[str, float] = {}  # key -> lift in this band; presence = this band holds the key
        self._watchers: list[Callable[[str], None]] = []
        spend.view(self)

    def watch(self, changed: Callable[[str], None]) -> None:
        self._watchers.append(changed)

    def changed(self, key: str) -> None:
        """Another band charged `key`'s shared spend."""
        for watcher in self._watchers:
            watcher(key)

    def _held(self, key: str) -> None:
        if key not in self._lift:
            self._lift[key] = 0.0
            self._spend.hold(key)

    def value(self, key: str) -> float:
        return self._spend.spent.get(key, 0.0) + self._lift.get(key, 0.0)

    def charge(self, key: str, cost: float) -> None:
        self._held(key)
        self._spend.charge(key, cost, self)

    def lift(self, key: str, floor: float) -> None:
        self._held(key)
        self._lift[key] += max(0.0, floor - self.value(key))

    def forget(self, key: str) -> None:
        if self._lift.pop(key, None) is not None:
            self._spend.release(key)

    def __contains__(self, key: object) -> bool:
        return key in self._lift

    def keys(self) -> set[str]:
        return set(self._lift)

    def close(self) -> None:
        super().close()
        self._watchers.clear()
        self._spend.unview(self)


class CounterScope:
    """Hands each band its counters: its own (`model`) or views of the class's shared spend (`global`)."""

    def __init__(self, scope: str = "model") -> None:
        self.scope = scope
        self._spend: dict[tuple[str, str], SharedSpend] = {}  # (class, "user" | "group") -> spend

    def counters(self, priority_class: str, kind: str) -> Counters:
        if self.scope != "global":
            return LocalCounters()
        spend = self._spend.setdefault((priority_class, kind), SharedSpend())
        return SharedCounters(spend)


class CostAccounts:
    """Which label a user's cost is exported under: the configured account whose pattern matches (an exact
    id, or a prefix ending in `*`; the longest prefix wins), else `other`. Labels come from the config
    only, so a client's id never becomes a label value."""

    OTHER = "other"

    def __init__(self, accounts: dict[str, str]) -> None:
        self._exact = {p: label for p, label in accounts.items() if not p.endswith("*")}
        self._prefixes = sorted(
            ((p[:-1], label) for p, label in accounts.items() if p.endswith("*")), key=lambda x: -len(x[0])
        )

    def label(self, user: str) -> str:
        if user in self._exact:
            return self._exact[user]
        for prefix, label in self._prefixes:
            if user.startswith(prefix):
                return label
        return self.OTHER

    def labels(self) -> set[str]:
        return {*self._exact.values(), *(label for _, label in self._prefixes), self.OTHER}
