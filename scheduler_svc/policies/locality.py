"""Locality-aware backend choice (`prefix_locality`), and with several candidates the locality-aware order
within fairness (deficit-based longest prefix match, D-LPM).

An engine with a prefix cache (vLLM's automatic prefix caching, SGLang's radix cache) skips the prefill of
a prompt prefix it still holds. The scheduler cannot see those caches, so it remembers, per backend, the
prompt-prefix blocks it sent there recently (`prefix_index.PrefixIndex`, bounded in bytes) and scores a
backend by how many leading blocks of the request it matches: the best guess of what the engine holds.

Load bounds locality: a backend whose in-flight count exceeds the model's average x `max_load_factor` +
`load_slack` is passed over for the next best (when every open backend is over, the least loaded of them
goes). A request with a session key (`prompt_cache_key`) sticks to the backend its user's previous turn
with that key went to, within the same load bound; else the longest match wins, then the backend that got
that prefix last (so a user's turns converge on one engine), then the least loaded. A prefix known nowhere
goes to the least loaded, and among equally loaded backends to the one remembering the fewest blocks
(SGLang's router does the same), so new prompts spread over the caches instead of piling on the first.

D-LPM (Cao et al., "Locality-aware Fair Scheduling in LLM Serving", 2025): when the model sets
`locality.deficit_bound`, the fairness policy offers the users it allows now (`Fairness.offer`:
counters within the bound of the smallest; at most `locality.max_candidates`, the least served first, so a
decision's prefix lookups do not grow with the users backlogged), and this policy sends, of their next
requests, the one with the longest prefix match at its best backend; equal matches go in the fairness
policy's order, so with no match anywhere the fairness policy's own choice goes. The fairness bound this
keeps is stated on `offer`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from scheduler_svc.config import LocalityConfig
from scheduler_svc.policies.backend_choice import (
    BACKEND_POLICIES,
    B,
    Candidate,
    InFlightCounts,
    OpenBackend,
    load_order,
)
from scheduler_svc.policies.interfaces import PromptView
from scheduler_svc.policies.prefix_index import (
    FALLBACK_INDEX_BYTES,
    PrefixIndex,
    SessionMap,
    block_hashes,
    blocks_cached,
    prompt_text,
)

_HASHED_REQUESTS = 128  # queued requests whose block hashes are kept between dispatch passes


class PrefixLocality:
    """Send a request where its prompt's prefix most likely is cached, within a load bound."""

    def __init__(self, settings: LocalityConfig | None = None) -> None:
        self._settings = settings or LocalityConfig()
        self._indexes: dict[str, PrefixIndex] = {}  # backend name -> what was sent there (one per backend)
        self.sessions = SessionMap(self._settings.session_max_bytes, self._settings.session_max_bytes_per_user)
        self._hashed: OrderedDict[str, list[int]] = OrderedDict()  # request id -> its chain (a small cache)
        self._sends = 0  # dispatches heard so far: which backend got a prefix last

    def index(self, backend: str) -> PrefixIndex:
        """The backend's index of sent prefix blocks."""
        if backend not in self._indexes:
            self._indexes[backend] = PrefixIndex(self._settings.index_max_bytes or FALLBACK_INDEX_BYTES)
        return self._indexes[backend]

    def _sized_index(self, backend: OpenBackend) -> PrefixIndex:
        """The backend's index, holding as many blocks as its engine's cache (`index_max_bytes = 0`, when the
        engine exports its cache size): an index that remembers more than the engine keeps points at
        prefixes the engine has already evicted, and one that remembers less forgets what it still holds."""
        index = self.index(backend.name)
        reading = backend.inputs.reading
        if self._settings.index_max_bytes == 0 and reading is not None and reading.cache_tokens:
            blocks = blocks_cached(reading.cache_tokens, self._settings.block_chars)
            if blocks != index.capacity:
                index.resize(blocks)
        return index

    def chain(self, request: PromptView) -> list[int]:
        """The request's prefix block hashes (worked out once while it waits)."""
        chain = self._hashed.get(request.request_id)
        if chain is None:
            text = prompt_text(request.prompt, request.messages)
            chain = block_hashes(text, self._settings.block_chars, self._settings.max_blocks_per_request)
            self._hashed[request.request_id] = chain
            if len(self._hashed) > _HASHED_REQUESTS:
                self._hashed.popitem(last=False)
        return chain

    def choose(self, request: PromptView, backends: Sequence[B]) -> B:
        # no counts of the model's other backends: the bound is over these, by their own inputs
        return self._best_backend(request, backends, self._within_load_bound(backends, InFlightCounts()))[1]

    def choose_among(self, candidates: Sequence[Candidate[B]], in_flight: InFlightCounts) -> tuple[PromptView, B]:
        best: tuple[int, PromptView, B] | None = None
        offered: Sequence[B] | None = None
        allowed: list[B] = []
        for candidate in candidates:
            if candidate.backends is not offered:  # candidates offered the same backends share their load bound
                offered, allowed = candidate.backends, self._within_load_bound(candidate.backends, in_flight)
            matched, backend = self._best_backend(candidate.request, candidate.backends, allowed)
            if best is None or matched > best[0]:  # strict: equal matches keep the fairness order
                best = (matched, candidate.request, backend)
        assert best is not None, "choose_among needs at least one candidate"
        return best[1], best[2]

    def on_dispatched(self, request: PromptView, backend: str) -> None:
        self._sends += 1
        self.index(backend).record(self.chain(request), self._sends)
        self._hashed.pop(request.request_id, None)
        if request.cache_key:
            self.sessions.put(request.user, request.cache_key, backend)

    def _best_backend(self, request: PromptView, backends: Sequence[B], allowed: Sequence[B]) -> tuple[int, B]:
        """The backend for `request` and the blocks it matches there: its session's backend if open and
        within the load bound (`allowed`: those of `backends` within it), else the longest match within the
        bound, ties to the least loaded."""
        chain = self.chain(request)
        if not allowed:  # every open backend is over the bound: load decides
            least = min(backends, key=load_order)
            return self._sized_index(least).match(chain)[0], least
        if request.cache_key:
            sticky = self.sessions.get(request.user, request.cache_key)
            for backend in allowed:
                if backend.name == sticky:
                    return self._sized_index(backend).match(chain)[0], backend
        if len(allowed) == 1:  # nothing to compare (often so: an engine that just freed a slot opens alone)
            return self._sized_index(allowed[0]).match(chain)[0], allowed[0]
        scored = [(self._sized_index(b).match(chain), b) for b in allowed]
        best = max(score for score, _ in scored)
        if best[0] == 0:  # nothing known anywhere: load decides, then the backend remembering the least
            return 0, min(allowed, key=lambda b: (load_order(b), len(self.index(b.name))))
        return best[0], min((b for score, b in scored if score == best), key=load_order)

    def _within_load_bound(self, backends: Sequence[B], in_flight: InFlightCounts) -> list[B]:
        """The open backends not over the model's average in-flight count x factor + slack."""
        counts = [in_flight.get(b.name, b.inputs.in_flight) for b in backends]
        # the average over every backend of the model, when known
        average = in_flight.average() if in_flight else sum(counts) / len(counts)
        limit = self._settings.max_load_factor * average + self._settings.load_slack
        return [b for b, count in zip(backends, counts, strict=True) if count <= limit]


BACKEND_POLICIES.register(
    "prefix_locality",
    PrefixLocality,
    "the open backend most recently sent the request's longest prompt prefix (or its session), within a "
    "load bound; with locality.deficit_bound, the longest match among users within that fairness bound (D-LPM)",
)
