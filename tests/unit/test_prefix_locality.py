"""The prefix index (hash chains, LRU, bytes bound), the session map, and prefix_locality's choices."""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass
from typing import Any

import pytest

from backends.base import BackendLoad, ChatMessage, SamplingParams
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import ConfigError, LocalityConfig
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.policies import BACKEND_POLICIES, Candidate, GateInputs, InFlightCounts, LeastLoaded, PrefixLocality
from scheduler_svc.policies.backend_choice import load_of
from scheduler_svc.policies.prefix_index import (
    CHARS_PER_TOKEN,
    ENTRY_BYTES,
    FALLBACK_INDEX_BYTES,
    PrefixIndex,
    SessionMap,
    block_hashes,
    prompt_text,
)

BLOCK = 64


def text(seed: str, blocks: int) -> str:
    return "".join(f"{seed}{i:05d}".ljust(BLOCK, "-") for i in range(blocks))


def chain(seed: str, blocks: int) -> list[int]:
    return block_hashes(text(seed, blocks), BLOCK, 1000)


def test_a_block_hash_covers_its_whole_prefix_and_only_full_blocks_count() -> None:
    a = chain("a", 3)
    assert len(a) == 3 and len(block_hashes(text("a", 3) + "partial", BLOCK, 1000)) == 3
    swapped_head = block_hashes(text("z", 1) + text("a", 3)[BLOCK:], BLOCK, 1000)
    assert swapped_head[1:] != a[1:]  # same blocks 1-2, other block 0: other hashes
    assert block_hashes(text("a", 10), BLOCK, 4) == chain("a", 4)  # bounded work per request


def test_messages_hash_as_their_text_in_order() -> None:
    messages = (ChatMessage("system", "x" * 200), ChatMessage("user", "hi"))
    turn2 = (*messages, ChatMessage("assistant", "yo"), ChatMessage("user", "more"))
    first, second = (block_hashes(prompt_text(None, m), BLOCK, 100) for m in (messages, turn2))
    assert first and second[: len(first)] == first  # a conversation's next turn extends its prefix


def test_index_matches_leading_blocks_and_forgets_least_recent_tails_first() -> None:
    index = PrefixIndex(max_bytes=6 * ENTRY_BYTES)
    assert index.capacity == 6
    a, b = chain("a", 3), chain("b", 3)
    index.record(a, 1)
    index.record(b, 2)
    assert index.match(a) == (3, 1) and index.match(chain("a", 5)) == (3, 1) and index.match(chain("c", 2)) == (0, 0)
    index.record(a, 3)  # a is the most recent again
    index.record(chain("c", 2), 4)  # two of b's blocks go, its tail first
    assert len(index) == 6
    assert (index.match(a), index.match(b)) == ((3, 3), (1, 2))


def test_index_memory_stays_within_its_bound_in_bytes() -> None:
    bound = 200_000
    tracemalloc.start()
    try:
        index = PrefixIndex(max_bytes=bound)
        for i in range(400):
            index.record(chain(f"u{i}", 20), i + 1)  # 8,000 blocks offered, ~1,250 fit
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(index) == bound // ENTRY_BYTES
    assert current <= bound, f"{current} bytes held for a bound of {bound}"
    assert PrefixIndex(max_bytes=0).capacity == 0


def test_one_users_session_keys_never_evict_anothers() -> None:
    """2,500 distinct 256-character keys of one user: it keeps its most recent ones within its share,
    another user's session is untouched, and the map stays within both bounds."""
    sessions = SessionMap(max_bytes=1 << 20, max_bytes_per_user=64 << 10)
    sessions.put("bob", "bob-chat", "b1")
    for i in range(2_500):
        sessions.put("alice", f"{i:06d}" + "k" * 250, "b0")
    assert sessions.get("bob", "bob-chat") == "b1"
    assert sessions.user_bytes("alice") <= 64 << 10 and sessions.bytes <= 1 << 20
    assert sessions.get("alice", f"{2_499:06d}" + "k" * 250) == "b0"  # its latest stays
    assert sessions.get("alice", f"{0:06d}" + "k" * 250) is None  # its oldest went
    kept = len(sessions) - 1
    assert 100 < kept < 150, kept  # about 64 KiB / (220 + 256 bytes)
    # All users together: past the total, the least recently active user's oldest session goes first.
    shared = SessionMap(max_bytes=3_000, max_bytes_per_user=1_500)
    for user in ("u1", "u2", "u3"):
        shared.put(user, "s", "b0")
    shared.get("u1", "s")  # u1 active again: u2 is now the least recently active
    for i in range(4):
        shared.put("u4", f"s{i}", "b0")
    assert shared.get("u2", "s") is None and shared.get("u1", "s") == "b0" and shared.bytes <= 3_000
    assert shared.users == 3  # u2 forgotten whole: nothing of it is left behind


def test_a_flood_of_session_keys_does_not_move_another_users_turn() -> None:
    p = policy(load_slack=0)
    b0, b1 = opening("b0", in_flight=1), opening("b1", in_flight=1)
    p.on_dispatched(request("turn 1", user="bob", cache_key="bob-chat"), "b1")
    for i in range(2_500):
        p.on_dispatched(request("x", user="mallory", cache_key=f"{i:06d}" + "k" * 250), "b0")
    assert p.choose(request("turn 2", user="bob", cache_key="bob-chat"), [b0, b1]) is b1


def test_session_map_is_per_user_lru_and_bounded_in_bytes() -> None:
    sessions = SessionMap(max_bytes=2_000)
    sessions.put("alice", "chat-1", "b1")
    assert sessions.get("alice", "chat-1") == "b1" and sessions.get("bob", "chat-1") is None
    tracemalloc.start()
    try:
        big = SessionMap(max_bytes=100_000)
        for i in range(5_000):
            big.put(f"user{i}", f"session-{i:06d}", "b0")
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert big.bytes <= 100_000 and current <= 100_000, (big.bytes, current)
    assert big.get("user4999", "session-004999") == "b0" and big.get("user0", "session-000000") is None


@dataclass
class Open:
    name: str
    inputs: GateInputs

    @property
    def load(self) -> tuple[int, int, int]:
        return load_of(self.inputs)


def opening(name: str, in_flight: int = 0, waiting: int = 0, cache_tokens: int | None = None) -> Open:
    reading = BackendLoad(ok=True, read_at=10.0, waiting=waiting, cache_tokens=cache_tokens)
    return Open(
        name,
        GateInputs(
            reading=reading,
            now=10.0,
            in_flight=in_flight,
            sent_unseen=0,
            started_since_reading=0,
            unstarted=0,
            unstarted_priorities=(),
            candidate_priority=None,
        ),
    )


_ids = iter(range(1_000_000))


def request(prompt: str, user: str = "u", cache_key: str = "") -> QueuedRequest:
    return QueuedRequest(
        f"r{next(_ids)}", "m", user, "interactive", prompt, None, SamplingParams(), 0.0, cache_key=cache_key
    )


def policy(**settings: Any) -> PrefixLocality:
    return PrefixLocality(LocalityConfig(**settings))


def test_a_request_goes_where_its_longest_prefix_went() -> None:
    p = policy()
    b0, b1 = opening("b0"), opening("b1", in_flight=1)
    p.on_dispatched(request(text("sys-a", 8) + "question 1"), "b1")
    p.on_dispatched(request(text("sys-b", 8) + "question 1"), "b0")
    assert p.choose(request(text("sys-a", 8) + "question 2"), [b0, b1]) is b1
    assert p.choose(request(text("sys-b", 8) + "question 2"), [b0, b1]) is b0
    # Nothing known anywhere: the least loaded, as least_loaded would choose.
    fresh = request(text("other", 8))
    assert p.choose(fresh, [b1, b0]) is LeastLoaded().choose(fresh, [b1, b0]) is b0
    # Known nowhere, equal loads: the backend remembering fewer blocks, so new prompts spread over the caches
    spread = policy()
    spread.on_dispatched(request(text("first", 8)), "b0")
    even0, even1 = opening("b0"), opening("b1")
    assert spread.choose(request(text("second", 8)), [even0, even1]) is even1
    # Known at both: the one that got it last (a user's turns converge on one engine), though busier.
    p.on_dispatched(request(text("sys-a", 8) + "question 3"), "b0")
    p.on_dispatched(request(text("sys-a", 8) + "question 4"), "b1")
    assert p.choose(request(text("sys-a", 8) + "question 5"), [b0, b1]) is b1


def test_a_backend_over_the_load_bound_is_passed_over_for_the_next_best() -> None:
    p = policy(max_load_factor=1.5, load_slack=2)
    p.on_dispatched(request(text("sys", 8)), "b0")
    p.on_dispatched(request(text("sys", 4)), "b1")
    busy, other = opening("b0", in_flight=10), opening("b1", in_flight=2)
    # average (10 + 2) / 2 = 6; limit 1.5 x 6 + 2 = 11: b0 still takes it
    assert (
        p.choose_among([Candidate(request(text("sys", 8)), [busy, other])], InFlightCounts({"b0": 10, "b1": 2}))[1]
        is busy
    )
    # with b2 idle the average is 4, the limit 8: b0 is passed over, b1 matches 4 blocks
    idle = opening("b2")
    loads = InFlightCounts({"b0": 10, "b1": 2, "b2": 0})
    assert p.choose_among([Candidate(request(text("sys", 8)), [busy, other, idle])], loads)[1] is other
    # every open backend over the bound: the least loaded of them
    assert p.choose_among([Candidate(request(text("sys", 8)), [busy])], loads)[1] is busy


def test_a_session_sticks_to_its_backend_within_the_load_bound() -> None:
    p = policy(load_slack=0)
    b0, b1 = opening("b0", in_flight=1), opening("b1", in_flight=1)
    p.on_dispatched(request("turn 1", user="alice", cache_key="chat"), "b1")
    assert p.choose(request("turn 2 (too short to hash)", user="alice", cache_key="chat"), [b0, b1]) is b1
    assert p.choose(request("turn 2", user="bob", cache_key="chat"), [b0, b1]) is b0  # another user's key
    # over the bound, the session moves (and follows its new backend from then on)
    loaded = opening("b1", in_flight=9)
    assert (
        p.choose_among(
            [Candidate(request("t3", user="alice", cache_key="chat"), [b0, loaded])], InFlightCounts({"b0": 1, "b1": 9})
        )[1]
        is b0
    )


def test_d_lpm_sends_the_candidate_with_the_longest_match_and_keeps_fairness_order_on_ties() -> None:
    p = policy()
    b0, b1 = opening("b0"), opening("b1")
    p.on_dispatched(request(text("hot", 10)), "b1")
    fair, warm, hot = request(text("cold", 10)), request(text("hot", 3)), request(text("hot", 10))
    chosen, backend = p.choose_among(
        [Candidate(fair, [b0, b1]), Candidate(warm, [b0, b1]), Candidate(hot, [b0])], InFlightCounts()
    )
    assert (chosen, backend) == (warm, b1)  # hot's 10 blocks are at b1, which is not open to it
    tie = request(text("cold", 10))
    assert p.choose_among([Candidate(fair, [b0, b1]), Candidate(tie, [b0, b1])], InFlightCounts())[0] is fair
    # least_loaded always sends the fairness policy's choice
    assert LeastLoaded().choose_among([Candidate(fair, [b0, b1]), Candidate(hot, [b1])], InFlightCounts())[0] is fair


def test_config_selects_and_validates_the_backend_policy() -> None:
    def model(**fields: Any) -> dict[str, Any]:
        return {"models": [{"name": "m", "backends": [{"name": "b0"}], **fields}]}

    assert config_from_dict(model()).models[0].backend_policy == "least_loaded"
    chosen = config_from_dict(model(backend_policy="prefix_locality", locality={"deficit_bound": 500}))
    assert chosen.models[0].locality.deficit_bound == 500
    assert isinstance(BACKEND_POLICIES.create("prefix_locality", chosen.models[0].locality), PrefixLocality)
    with pytest.raises(ConfigError, match=r"unknown backend policy 'nearest'; known: \['least_loaded', 'prefix"):
        config_from_dict(model(backend_policy="nearest"))
    with pytest.raises(ConfigError, match="deficit_bound needs a locality-aware backend_policy"):
        config_from_dict(model(locality={"deficit_bound": 10}))
    with pytest.raises(ConfigError, match="max_load_factor"):
        config_from_dict(model(backend_policy="prefix_locality", locality={"max_load_factor": 0.5}))
    with pytest.raises(ConfigError, match=r"locality\.index_max_bytes must be >= 0"):
        config_from_dict(model(locality={"index_max_bytes": -1}))


def test_the_index_holds_as_many_blocks_as_the_engines_cache_when_the_engine_says() -> None:
    """index_max_bytes = 0 (the default): each backend's index is sized to its engine's cache (tokens x 4
    characters / block_chars), shrinking the remembered tail when the cache is smaller; until the engine says,
    the 4 MiB fallback; an explicit size is kept whatever the engine reports."""
    auto = policy()
    silent, unsized, small = opening("silent"), opening("small"), opening("small", cache_tokens=16 * 16)
    auto.choose(request(text("a", 2)), [silent, unsized])
    assert auto.index("silent").capacity == auto.index("small").capacity == FALLBACK_INDEX_BYTES // ENTRY_BYTES
    for seed in "abcdefgh":  # 8 prompts of 4 blocks sent to "small" before its engine said its size
        auto.on_dispatched(request(text(seed, 4)), "small")
    assert len(auto.index("small")) == 32
    auto.choose(request(text("z", 1)), [silent, small])  # now it says: 16 blocks of 16 tokens
    assert auto.index("small").capacity == 16 * 16 * CHARS_PER_TOKEN // BLOCK == 16 == len(auto.index("small"))
    assert auto.index("small").match(chain("h", 4))[0] == 4 and auto.index("small").match(chain("a", 4))[0] == 0
    assert auto.index("silent").capacity == FALLBACK_INDEX_BYTES // ENTRY_BYTES
    fixed = policy(index_max_bytes=100 * ENTRY_BYTES)
    fixed.choose(request(text("a", 2)), [small])
    assert fixed.index("small").capacity == 100
