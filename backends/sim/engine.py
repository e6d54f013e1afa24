"""The continuous-batching engine core: queues, steps and tokens, with no HTTP in it.

One asyncio task runs engine steps while there is work and sleeps on an `asyncio.Event` while there is
none. Each step:

1. makes KV room for one more token per running request, preempting (vLLM-style: the last admitted under
   fcfs, the largest (priority, arrival) under priority) until it fits; a preempted request goes back to
   the waiting queue and recomputes its prompt and output when readmitted;
2. admits waiting requests in queue order while there is a free slot (`max_num_seqs`) and KV room;
3. sleeps `decode_base_ms + decode_per_seq_ms * batch + prefill_per_token_ms * tokens to prefill`, less
   the prompt tokens an admitted request found in the prefix cache (`prefix_cache.py`, when enabled);
4. gives every running request one token and finishes those that hit EOS, a stop string or max tokens.

The waiting queue is FIFO, or ordered by (priority, arrival) with the lower value first. Callers hold a
`RequestHandle`: they read its events and abort it when their client goes away; an abort removes the
request from the queue or batch at once.
"""

from __future__ import annotations

import asyncio
import bisect
import enum
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from backends.sim.config import SimConfig
from backends.sim.journal import FAILED_REASONS, Journal, prompt_tag
from backends.sim.prefix_cache import PrefixCache
from backends.sim.tokens import Token, TokenSampler, find_stop

log = structlog.get_logger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class FinishReason(enum.StrEnum):
    """Why a request ended; each API maps these to its own words."""

    LENGTH = "length"
    EOS = "eos"
    STOP = "stop"
    ABORT = "abort"


class RequestState(enum.Enum):
    """Where a request is inside the engine."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class GenerateParams:
    """A validated request as the engine needs it; the API layers build it."""

    prompt: str
    prompt_tokens: int
    max_tokens: int
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Finished:
    """Attached to a request's last token.

    `stop_at` is the offset in the generated text (special tokens excluded) where the matched stop string
    starts: vLLM cuts the text there, TGI keeps it.
    """

    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    stop_string: str | None = None
    stop_at: int | None = None


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token; `index` counts from 1. The last token carries `finished`."""

    token: Token
    index: int
    finished: Finished | None = None


@dataclass(frozen=True, slots=True)
class Aborted:
    """The request was ended without a last token (client gone, injected fault, shutdown)."""

    reason: str
    prompt_tokens: int
    completion_tokens: int


EngineEvent = TokenEvent | Aborted


@dataclass(slots=True, eq=False)
class SimRequest:
    """One request inside the engine. Observers may read it; only the engine changes it."""

    request_id: str
    params: GenerateParams
    seq: int
    arrival_time: float
    sampler: TokenSampler
    state: RequestState = RequestState.WAITING
    events: asyncio.Queue[EngineEvent] = field(default_factory=asyncio.Queue)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    num_generated: int = 0
    text: str = ""
    needs_prefill: bool = True
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at its latest admission

    @property
    def held_tokens(self) -> int:
        """Tokens whose KV the request holds (or must recompute) when running."""
        return self.params.prompt_tokens + self.num_generated


class EngineObserver(Protocol):
    """Receives the engine's events as they happen; the metrics modules implement it."""

    def on_scheduled(self, request: SimRequest, now: float) -> None:
        """First admission of a request into the running batch (not a readmission after preemption)."""

    def on_preempted(self, request: SimRequest) -> None:
        """A running request was sent back to the waiting queue for lack of KV cache."""

    def on_token(self, request: SimRequest, now: float, gap: float | None) -> None:
        """A token was generated; `gap` is the time since the request's previous token (None: first)."""

    def on_finished(self, request: SimRequest, reason: FinishReason, now: float) -> None:
        """The request ended, normally or by abort."""

    def on_step(self, prefill_seconds: float | None, decode_seconds: float, batch_size: int) -> None:
        """One engine step ran; `prefill_seconds` is None when no request was prefilled in it."""


class NullObserver:
    """An observer that ignores everything, for an engine used without metrics."""

    def on_scheduled(self, request: SimRequest, now: float) -> None:
        """Ignored."""

    def on_preempted(self, request: SimRequest) -> None:
        """Ignored."""

    def on_token(self, request: SimRequest, now: float, gap: float | None) -> None:
        """Ignored."""

    def on_finished(self, request: SimRequest, reason: FinishReason, now: float) -> None:
        """Ignored."""

    def on_step(self, prefill_seconds: float | None, decode_seconds: float, batch_size: int) -> None:
        """Ignored."""


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The gauges a metrics scrape reports."""

    waiting: int
    running: int
    kv_cache_usage: float
    batch_max_tokens: int
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache so far (vLLM's counter)
    prefix_cache_hits: int = 0  # of those, tokens found cached


def step_seconds(config: SimConfig, batch: int, prefill_tokens: int) -> tuple[float, float]:
    """How long one engine step takes: its decode part (`decode_base_ms + decode_per_seq_ms` per request in
    the batch) and its prefill part (`prefill_per_token_ms` per prompt token prefilled in it), in seconds.
    The one timing rule of the simulator, shared by models of it that skip ahead (bench/scenarios/s9/)."""
    decode = (config.decode_base_ms + config.decode_per_seq_ms * batch) / 1000.0
    return decode, config.prefill_per_token_ms * prefill_tokens / 1000.0


class RequestHandle:
    """What a caller holds for one request: its events, and the way to abort it."""

    def __init__(self, engine: SimEngine, request: SimRequest) -> None:
        self._engine = engine
        self._request = request

    @property
    def request_id(self) -> str:
        """The id the request was added with."""
        return self._request.request_id

    @property
    def request(self) -> SimRequest:
        """The engine's view of the request (read-only by convention)."""
        return self._request

    @property
    def done(self) -> bool:
        """True once the engine has finished or aborted the request."""
        return self._request.state is RequestState.FINISHED

    async def next_event(self, timeout: float | None = None) -> EngineEvent | None:
        """The next event, or None if `timeout` seconds pass first (callers use it to poll the client)."""
        queue = self._request.events
        if not queue.empty():
            return queue.get_nowait()
        if timeout is None:
            return await queue.get()
        try:
            return await asyncio.wait_for(queue.get(), timeout)
        except TimeoutError:
            return None

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        """All events up to and including the last one (a finished token or `Aborted`)."""
        while True:
            event = await self._request.events.get()
            yield event
            if isinstance(event, Aborted) or event.finished is not None:
                return

    def abort(self, reason: str = "client disconnected") -> bool:
        """Remove the request from the engine now; False if it had already ended."""
        return self._engine.abort(self._request, reason)


class _WaitingQueue:
    """Waiting requests kept sorted: by arrival (fcfs) or by (priority, arrival).

    A preempted request keeps its arrival number, so under fcfs it goes back to the front, as in vLLM.
    """

    def __init__(self, by_priority: bool) -> None:
        self._items: list[SimRequest] = []
        self._key: Callable[[SimRequest], tuple[int, ...]] = (
            (lambda r: (r.params.priority, r.seq)) if by_priority else (lambda r: (r.seq,))
        )

    def __len__(self) -> int:
        return len(self._items)

    def push(self, request: SimRequest) -> None:
        bisect.insort(self._items, request, key=self._key)

    def peek(self) -> SimRequest:
        return self._items[0]

    def pop(self) -> SimRequest:
        return self._items.pop(0)

    def remove(self, request: SimRequest) -> None:
        self._items.remove(request)

    def __iter__(self) -> Iterator[SimRequest]:
        return iter(list(self._items))


class SimEngine:
    """The simulated engine: add requests, read their tokens, abort them."""

    def __init__(
        self,
        config: SimConfig,
        observer: EngineObserver | None = None,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        journal: Journal | None = None,
    ) -> None:
        self.config = config
        self._observer: EngineObserver = observer or NullObserver()
        self.journal = journal or Journal.disabled()
        self._clock = clock
        self._sleep = sleep
        self._waiting = _WaitingQueue(by_priority=config.scheduling_policy == "priority")
        self._running: list[SimRequest] = []
        self.prefix_cache = PrefixCache(config.prefix_cache_blocks, config.kv_block_size)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._seq = 0
        self._served_order: list[dict[str, Any]] = []
        self._completed_total = 0
        self._aborted_total = 0
        self._rejected_total = 0
        self._preemptions_total = 0
        self._generated_total = 0
        self._steps_total = 0
        self._max_waiting_seen = 0
        self._max_running_seen = 0

    # Lifecycle

    def start(self) -> None:
        """Start the step loop in the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="sim-engine")

    async def aclose(self) -> None:
        """Abort every request (their streams see `Aborted("shutdown")`) and stop the loop."""
        for request in [*self._running, *self._waiting]:
            self.abort(request, "shutdown")
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
            self._task = None

    # Requests

    def add_request(self, request_id: str, params: GenerateParams, *, x_request_id: str | None = None) -> RequestHandle:
        """Queue a request; its tokens arrive on the returned handle. `x_request_id` is only journaled."""
        self._seq += 1
        sampler = TokenSampler(params.prompt, request_seed=params.seed, config_seed=self.config.seed)
        request = SimRequest(request_id, params, self._seq, self._clock(), sampler)
        self.journal.write(
            "received",
            id=request_id,
            seq=request.seq,
            x_request_id=x_request_id,
            prompt_bytes=len(params.prompt.encode()),
            prompt_tokens=params.prompt_tokens,
            max_tokens=params.max_tokens,
            tag=prompt_tag(params.prompt),
        )
        self._waiting.push(request)
        self._max_waiting_seen = max(self._max_waiting_seen, len(self._waiting))
        self._wakeup.set()
        return RequestHandle(self, request)

    def abort(self, request: SimRequest, reason: str) -> bool:
        """End a request now, wherever it is; False if it had already ended."""
        if request.state is RequestState.FINISHED:
            return False
        self._finish(request, FinishReason.ABORT, self._clock())
        request.events.put_nowait(Aborted(reason, request.params.prompt_tokens, request.num_generated))
        self.journal.write(
            "failed" if reason in FAILED_REASONS else "aborted",
            id=request.request_id,
            seq=request.seq,
            reason=reason,
            started=request.scheduled_at is not None,
            tokens=request.num_generated,
        )
        log.info("sim.request_aborted", request_id=request.request_id, reason=reason)
        return True

    def note_rejected(self) -> None:
        """Count a request the API refused before it reached the engine (overload, injected status)."""
        self._rejected_total += 1

    def journal_refused(self, x_request_id: str | None, prompt: object, status: int, message: str) -> None:
        """Journal an error answer given before the request reached the engine (`prompt`: the raw field)."""
        tag = prompt_tag(prompt) if isinstance(prompt, str) else None
        self.journal.write("refused", x_request_id=x_request_id, tag=tag, status=status, message=message[:200])

    # Inspection

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue."""
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        """Requests in the running batch."""
        return len(self._running)

    def snapshot(self) -> EngineSnapshot:
        """Current gauge values."""
        block = self.config.kv_block_size
        used_blocks = sum(math.ceil(r.held_tokens / block) for r in self._running)
        return EngineSnapshot(
            waiting=len(self._waiting),
            running=len(self._running),
            kv_cache_usage=used_blocks / self.config.kv_cache_blocks,
            batch_max_tokens=sum(r.params.prompt_tokens + r.params.max_tokens for r in self._running),
            prefix_cache_queries=self.prefix_cache.queries,
            prefix_cache_hits=self.prefix_cache.hits,
        )

    def stats(self) -> dict[str, Any]:
        """A JSON-ready summary for `GET /sim/stats` and in-process tests."""
        snap = self.snapshot()
        return {
            "flavor": self.config.flavor,
            "scheduling_policy": self.config.scheduling_policy,
            "max_num_seqs": self.config.max_num_seqs,
            "waiting": snap.waiting,
            "running": snap.running,
            "kv_cache_usage": snap.kv_cache_usage,
            "completed_total": self._completed_total,
            "aborted_total": self._aborted_total,
            "rejected_total": self._rejected_total,
            "preemptions_total": self._preemptions_total,
            "generated_tokens_total": self._generated_total,
            "steps_total": self._steps_total,
            "prefix_cache_queries_total": self.prefix_cache.queries,
            "prefix_cache_hits_total": self.prefix_cache.hits,
            "max_waiting_seen": self._max_waiting_seen,
            "max_running_seen": self._max_running_seen,
            "served_order": list(self._served_order),
        }

    # The loop

    async def _loop(self) -> None:
        while True:
            if not self._waiting and not self._running:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                self._schedule(self._clock())
                if not self._running:
                    # Nothing fits (impossible with a valid config); wait for a change, never spin.
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                await self._step()
            except Exception:
                log.exception("sim.engine_step_failed")
                for request in [*self._running, *self._waiting]:
                    self.abort(request, "engine error")

    def _schedule(self, now: float) -> None:
        total_blocks = self.config.kv_cache_blocks
        while self._running and self._blocks_for_next_token() > total_blocks:
            self._preempt(self._pick_victim())
        used = self._blocks_for_next_token()
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            head = self._waiting.peek()
            need = self._blocks(head.held_tokens + 1)
            if used + need > total_blocks:
                break
            self._waiting.pop()
            used += need
            self._admit(head, now)

    async def _step(self) -> None:
        cfg = self.config
        batch = list(self._running)
        prefill_tokens = sum(r.held_tokens - r.cached_tokens for r in batch if r.needs_prefill)
        decode_seconds, prefill_seconds = step_seconds(cfg, len(batch), prefill_tokens)
        self._steps_total += 1
        await self._sleep(decode_seconds + prefill_seconds)
        now = self._clock()
        self._observer.on_step(prefill_seconds if prefill_tokens else None, decode_seconds, len(batch))
        for request in batch:
            if request.state is RequestState.RUNNING:  # not aborted during the step
                if request.needs_prefill:
                    self.prefix_cache.insert(request.params.prompt, request.params.prompt_tokens)
                request.needs_prefill = False
                self._advance(request, now)

    def _advance(self, request: SimRequest, now: float) -> None:
        params = request.params
        token = request.sampler.next_token(0.0 if params.ignore_eos else self.config.eos_probability)
        gap = None if request.last_token_at is None else now - request.last_token_at
        if request.first_token_at is None:
            request.first_token_at = now
            self.journal.write("first_token", id=request.request_id, seq=request.seq)
        request.last_token_at = now
        request.num_generated += 1
        self._generated_total += 1
        old_len = len(request.text)
        reason: FinishReason | None = None
        if request.num_generated >= params.max_tokens:
            reason = FinishReason.LENGTH
        elif token.special:
            reason = FinishReason.EOS
        stop = None
        if not token.special:
            request.text += token.text
            if params.stop:
                stop = find_stop(request.text, old_len, params.stop)
        if stop is not None:
            reason = FinishReason.STOP
        self._observer.on_token(request, now, gap)
        finished: Finished | None = None
        if reason is not None:
            finished = Finished(
                reason=reason,
                prompt_tokens=params.prompt_tokens,
                completion_tokens=request.num_generated,
                stop_string=stop[1] if stop else None,
                stop_at=stop[0] if stop else None,
            )
            self._finish(request, reason, now)
            self.journal.write(
                "finished", id=request.request_id, seq=request.seq, tokens=request.num_generated, reason=reason.value
            )
        request.events.put_nowait(TokenEvent(token, request.num_generated, finished))

    def _admit(self, request: SimRequest, now: float) -> None:
        request.state = RequestState.RUNNING
        request.needs_prefill = True
        request.cached_tokens = self.prefix_cache.lookup(request.params.prompt, request.params.prompt_tokens)
        self._running.append(request)
        self._max_running_seen = max(self._max_running_seen, len(self._running))
        if request.scheduled_at is None:
            request.scheduled_at = now
            self._served_order.append({"request_id": request.request_id, "priority": request.params.priority})
            self.journal.write("started", id=request.request_id, seq=request.seq)
            self._observer.on_scheduled(request, now)

    def _preempt(self, request: SimRequest) -> None:
        self._running.remove(request)
        request.state = RequestState.WAITING
        request.needs_prefill = True
        self._waiting.push(request)
        self._preemptions_total += 1
        self._observer.on_preempted(request)
        log.info("sim.request_preempted", request_id=request.request_id, held_tokens=request.held_tokens)

    def _pick_victim(self) -> SimRequest:
        if self.config.scheduling_policy == "priority":
            return max(self._running, key=lambda r: (r.params.priority, r.seq))
        return self._running[-1]

    def _finish(self, request: SimRequest, reason: FinishReason, now: float) -> None:
        if request.state is RequestState.RUNNING:
            self._running.remove(request)
        elif request.state is RequestState.WAITING:
            self._waiting.remove(request)
        request.state = RequestState.FINISHED
        request.finished_at = now
        if reason is FinishReason.ABORT:
            self._aborted_total += 1
        else:
            self._completed_total += 1
        self._observer.on_finished(request, reason, now)

    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.config.kv_block_size)

    def _blocks_for_next_token(self) -> int:
        return sum(self._blocks(r.held_tokens + 1) for r in self._running)
