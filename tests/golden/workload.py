"""The golden workload: one fixed, seeded set of client calls, the same for every scenario.

Six users over about eight seconds: a flood of long interactive answers (more than the user's queue cap, so
some are refused), a batch flood, a steady mix of interactive, review and batch calls from the others,
latecomers, and a late review flood. Prompts share documents (so prefix locality has something to find),
some carry a session key, some are chat messages; lengths, max_tokens and answer lengths vary. Some calls
carry a deadline (they expire in the queue, or are cut by their client while running), some clients leave
while queued and some while their answer streams; a few requests make any engine fail them (a request the
engine refuses, and a connection dropped after some text), which failover must not retry.

Only `random.Random(SEED)` decides; nothing here reads the core.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import string
from dataclasses import dataclass
from typing import Any

SEED = 34
USERS = ("u0", "u1", "u2", "u3", "u4", "u5")
BLOCK = 64  # characters per prefix block in the scenarios' locality settings


@dataclass(frozen=True)
class Call:
    """One client call and how its client and any engine treat it."""

    label: str
    at_ms: int
    user: str
    priority_class: str
    max_tokens: int
    answer_tokens: int  # what an engine generates before it stops (at most max_tokens)
    prompt: str = ""
    messages: tuple[tuple[str, str], ...] = ()
    cache_key: str = ""
    timeout_ms: int | None = None  # the call's deadline; its client gives up then if still waiting for the end
    cancel_at_ms: int | None = None  # the client leaves at this time, whatever the state
    cancel_after_tokens: int | None = None  # the client leaves once it has read this many tokens
    engine_rejects: bool = False  # every engine refuses it as invalid (no failover)
    drop_after_tokens: int | None = None  # the engine drops the connection after this many tokens


def _text(rng: random.Random, chars: int) -> str:
    return "".join(rng.choices(string.ascii_lowercase + " ", k=chars))


@functools.cache
def build_workload() -> tuple[Call, ...]:
    """The calls in arrival order (labels r000, r001, ... in that order)."""
    rng = random.Random(SEED)
    documents = [_text(rng, BLOCK * rng.randint(2, 10)) for _ in range(5)]
    favourite = {user: rng.sample(range(len(documents)), 2) for user in USERS}
    planned: list[Call] = []

    def call(at_ms: int, user: str, cls: str, max_tokens: int, answer: int | None = None, **extra: Any) -> None:
        question = _text(rng, rng.randint(8, 200))
        document = documents[rng.choice(favourite[user])]
        body: dict[str, Any]
        if rng.random() < 0.2:
            body = {"messages": (("system", document), ("user", question))}
        else:
            body = {"prompt": document + question}
        if rng.random() < 0.25:
            body["cache_key"] = f"session-{user}"
        answer_tokens = max_tokens if answer is None else answer
        planned.append(Call("", at_ms, user, cls, max_tokens, answer_tokens, **body, **extra))

    for _ in range(16):  # u0's flood of long answers: more than its queue cap holds
        call(rng.randint(0, 150), "u0", "interactive", rng.randint(24, 48))
    for _ in range(8):  # u2 joins with short answers, some with deadlines closer than earlier ones'
        timeout = rng.choice([None, None, rng.randint(400, 2500)])
        call(rng.randint(100, 400), "u2", "interactive", rng.randint(4, 16), timeout_ms=timeout)
    for _ in range(8):  # u3 (the heaviest weight) too
        call(rng.randint(150, 500), "u3", "interactive", rng.randint(8, 24))
    for user, count in (("u1", 8), ("u4", 6)):  # two batch floods
        for _ in range(count):
            timeout = rng.choice([None, None, None, rng.randint(1500, 5000)])
            call(rng.randint(50, 600), user, "batch", rng.randint(12, 32), timeout_ms=timeout)
    at = 800
    while at < 6500:  # the steady mix
        at += int(rng.expovariate(1 / 180))
        user = rng.choice(USERS[2:])
        cls = rng.choices(["interactive", "review", "batch"], weights=[6, 3, 2])[0]
        max_tokens = rng.randint(1, 32)
        extra: dict[str, Any] = {}
        roll = rng.random()
        if roll < 0.15:
            extra["timeout_ms"] = rng.randint(150, 2500)
        elif roll < 0.21:
            extra["cancel_at_ms"] = at + rng.randint(20, 400)
        elif roll < 0.27 and max_tokens >= 6:
            extra["cancel_after_tokens"] = rng.randint(2, 4)
        call(at, user, cls, max_tokens, rng.randint(1, max_tokens), **extra)
    for i in range(3):  # latecomers behind the load
        call(2500 + 40 * i, "u5", "interactive", rng.randint(2, 8))
    for user, count in (("u3", 8), ("u5", 5)):  # a late review flood from two users
        for _ in range(count):
            call(rng.randint(4000, 4300), user, "review", rng.randint(8, 24))
    # the cases every scenario must see, whatever the policies decide
    call(120, "u2", "interactive", 8, timeout_ms=30)  # behind the flood: expires queued
    call(130, "u4", "interactive", 16, cancel_at_ms=160)  # behind the flood: leaves while queued
    call(2000, "u4", "interactive", 24, cancel_after_tokens=3)  # leaves while its answer streams
    call(2200, "u2", "review", 12, engine_rejects=True)  # refused by the engine: fails, no failover
    call(3100, "u5", "interactive", 12, drop_after_tokens=2)  # dropped after text was shown: fails
    planned.sort(key=lambda c: c.at_ms)  # stable: equal times keep the planning order
    return tuple(dataclasses.replace(c, label=f"r{i:03d}") for i, c in enumerate(planned))
