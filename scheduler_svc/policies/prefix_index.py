"""What the scheduler remembers about prompts it sent: prefix block hashes per backend, and sessions.

A prompt (or a chat's messages, role and content in order) is cut into blocks of `block_chars` characters;
block i's hash covers block i and the hash of block i-1, so a block matches only when its whole prefix
matches (a hash chain, as vLLM's prefix cache keys its blocks). Only full blocks count, and only the first
`max_blocks` of a prompt, so the work per request is bounded whatever its length.

`PrefixIndex` holds one backend's recently sent blocks, least recently sent forgotten first, within a
memory bound in bytes (`ENTRY_BYTES` per block, measured with tracemalloc, dictionary growth included).
A chain is touched tail first, so its head is the most recent and outlives its tail: a remembered block's
prefix is remembered too, and a match can stop at the first miss. Each block also keeps when it was last
sent (the caller's send number, one counter across the model's backends), so of two backends that both
hold a prefix the one that got it last can be preferred: a user's turns then converge on one engine
instead of alternating between two caches.

`SessionMap` maps a (user, session key) to the backend its previous turns went to, within a bound in bytes
per user and one for all users: one user's keys never evict another's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from backends.base import ChatMessage

# Bytes one remembered block costs: an OrderedDict entry with a 64-bit int key and an int value (140-180
# bytes measured with tracemalloc, the peak while the table doubles included), rounded up.
ENTRY_BYTES = 192
# Bytes one session costs besides its key's characters: the entry, the key and value objects.
SESSION_ENTRY_BYTES = 220
# Bytes one user with sessions costs besides its id's characters: its entry in the map of users and its own
# dict of sessions (measured with tracemalloc, as the entries above).
USER_ENTRY_BYTES = 400
# Prompt characters per token, the estimate admission uses too: turns an engine's cache size in tokens
# into blocks of prompt characters.
CHARS_PER_TOKEN = 4
# Memory per backend while its engine has not said how large its cache is (26,000 blocks, 1.7 M characters).
FALLBACK_INDEX_BYTES = 4 << 20


def blocks_cached(cache_tokens: int, block_chars: int) -> int:
    """How many blocks of `block_chars` prompt characters an engine cache of `cache_tokens` tokens holds."""
    return cache_tokens * CHARS_PER_TOKEN // block_chars


def prompt_text(prompt: str | None, messages: Sequence[ChatMessage] | None) -> str:
    """The text whose prefix an engine caches: the prompt, or the messages' roles and contents in order."""
    if prompt is not None:
        return prompt
    return "".join(f"<|{m.role}|>\n{m.content}\n" for m in messages or ())


def block_hashes(text: str, block_chars: int, max_blocks: int) -> list[int]:
    """The chained hashes of the text's first full blocks (at most `max_blocks`). Python's own 64-bit hash
    (SipHash, keyed per process) is enough: the hashes are compared only within this process, with the
    blocks it hashed itself, and a request's chain is worked out on the dispatch path."""
    hashes: list[int] = []
    parent = 0
    for i in range(min(len(text) // block_chars, max_blocks)):
        parent = hash((parent, text[i * block_chars : (i + 1) * block_chars]))  # chained: covers the prefix
        hashes.append(parent)
    return hashes


class PrefixIndex:
    """One backend's recently sent prefix blocks: LRU within `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.capacity = max_bytes // ENTRY_BYTES
        self._blocks: OrderedDict[int, int] = OrderedDict()  # block -> send number; least recently sent first

    def __len__(self) -> int:
        return len(self._blocks)

    def resize(self, capacity: int) -> None:
        """Hold at most `capacity` blocks from now on (the least recently sent go first when it shrinks)."""
        self.capacity = capacity
        while len(self._blocks) > capacity:
            self._blocks.popitem(last=False)

    def match(self, chain: Sequence[int]) -> tuple[int, int]:
        """How many leading blocks of `chain` were sent here (and not forgotten since), and the send number
        of the last of them (0: none matched; higher: sent more recently)."""
        matched, last = 0, 0
        for block in chain:
            sent = self._blocks.get(block)
            if sent is None:
                break
            matched, last = matched + 1, sent
        return matched, last

    def record(self, chain: Sequence[int], send: int) -> None:
        """The chain was sent here as send number `send` (increasing across the model's backends): remember
        it, tail first, so the head is forgotten last."""
        if self.capacity == 0:
            return
        for block in reversed(chain[: self.capacity]):
            self._blocks[block] = send
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)


class _Sessions:
    """One user's sessions: key -> backend, least recently used first (a dict keeps insertion order)."""

    __slots__ = ("backends", "bytes")

    def __init__(self) -> None:
        self.backends: dict[str, str] = {}
        self.bytes = 0


class SessionMap:
    """(user, session key) -> the backend its previous turns went to.

    Each user's sessions are an LRU of their own within `max_bytes_per_user`, so one user's keys never push
    out another's, however many it sends. All users together stay within `max_bytes`: when that fills, the
    least recently active user's oldest session goes first (one user alone never holds more than its share,
    so it cannot fill the map while fewer than max_bytes / max_bytes_per_user users use sessions).
    """

    def __init__(self, max_bytes: int, max_bytes_per_user: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_bytes_per_user = max_bytes if max_bytes_per_user is None else max_bytes_per_user
        self.bytes = 0
        self._users: OrderedDict[str, _Sessions] = OrderedDict()  # least recently active first

    def __len__(self) -> int:
        return sum(len(sessions.backends) for sessions in self._users.values())

    @property
    def users(self) -> int:
        """Users with at least one session remembered."""
        return len(self._users)

    def user_bytes(self, user: str) -> int:
        """Bytes `user`'s sessions are counted at (its share of the map included)."""
        sessions = self._users.get(user)
        return 0 if sessions is None else sessions.bytes

    @staticmethod
    def _cost(session: str) -> int:
        return SESSION_ENTRY_BYTES + len(session.encode("utf-8", "surrogatepass"))

    @staticmethod
    def _user_cost(user: str) -> int:
        return USER_ENTRY_BYTES + len(user.encode("utf-8", "surrogatepass"))

    def get(self, user: str, session: str) -> str | None:
        """Where the session's previous turn went, or None."""
        sessions = self._users.get(user)
        if sessions is None:
            return None
        backend = sessions.backends.pop(session, None)
        if backend is not None:
            sessions.backends[session] = backend  # now the most recently used
            self._users.move_to_end(user)
        return backend

    def put(self, user: str, session: str, backend: str) -> None:
        """The session's latest turn went to `backend`."""
        sessions = self._users.get(user)
        if sessions is not None and session in sessions.backends:
            del sessions.backends[session]
            sessions.backends[session] = backend
            self._users.move_to_end(user)
            return
        cost = self._cost(session)
        added = cost + (self._user_cost(user) if sessions is None else 0)
        if added > min(self.max_bytes, self.max_bytes_per_user):
            return
        if sessions is None:
            sessions = self._users[user] = _Sessions()
        else:
            self._users.move_to_end(user)
        sessions.backends[session] = backend
        sessions.bytes += added
        self.bytes += added
        while sessions.bytes > self.max_bytes_per_user:  # the user's own oldest first
            self._forget_oldest(user, sessions)
        while self.bytes > self.max_bytes:  # then the least recently active user's
            quiet = next(iter(self._users))
            self._forget_oldest(quiet, self._users[quiet])

    def _forget_oldest(self, user: str, sessions: _Sessions) -> None:
        oldest = next(iter(sessions.backends))
        del sessions.backends[oldest]
        freed = self._cost(oldest)
        if not sessions.backends:  # nothing left of the user
            freed = sessions.bytes
            del self._users[user]
        sessions.bytes -= freed
        self.bytes -= freed
