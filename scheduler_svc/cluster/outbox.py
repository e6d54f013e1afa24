"""Messages waiting to be sent, batched per destination: callers post without waiting, one task sends.

Posting never blocks the dispatcher or a request's task on the store. Each wake-up of the sender sends
everything pending, for every destination, in one `ClusterStore.send`; a destination's messages in the order
posted, encoded as one batch
(`messages.encode_batch`: one stream entry, one XADD on Redis, one parse at the receiver, however many messages
it holds). Woken, the sender first lets the loop turn twice: a leader's decision posts its Verdict, Position
and Grant within two turns, so they leave in one entry instead of three, for microseconds of delay. A store
failure drops the batch (the messages concern a leader or owner that everyone will re-register with once the
store answers again) and is reported to `on_error`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from scheduler_svc.cluster.messages import Message, encode_batch, type_name
from scheduler_svc.cluster.metrics import ClusterMetrics
from scheduler_svc.cluster.store import ClusterStore, StoreUnavailable

log = structlog.get_logger(__name__)

GATHER_TURNS = 2  # loop turns the sender waits after waking, so messages posted in the same moment go together


class Outbox:
    def __init__(
        self, store: ClusterStore, metrics: ClusterMetrics, on_error: Callable[[StoreUnavailable], None]
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._on_error = on_error
        self._pending: dict[str, list[Message]] = {}
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def post(self, to: str, message: Message) -> None:
        self._pending.setdefault(to, []).append(message)
        self._idle.clear()
        self._ready.set()

    def clear(self) -> None:
        """Forget what was not sent yet (the replica was killed, or its leader is gone)."""
        self._pending.clear()
        self._idle.set()

    async def flush(self, timeout: float) -> None:
        """Wait until everything posted so far was sent (or `timeout` passed)."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            log.warning("cluster_outbox_flush_timeout", pending=sum(map(len, self._pending.values())))

    async def run(self) -> None:
        while True:
            await self._ready.wait()
            for _ in range(GATHER_TURNS):
                await asyncio.sleep(0)  # one turn of the loop: let what the same moment posts join
            self._ready.clear()
            batches, self._pending = self._pending, {}
            try:
                await self._store.send({to: encode_batch(messages) for to, messages in batches.items()})
            except StoreUnavailable as exc:
                self._on_error(exc)
            except Exception:  # a bug must not stop the sender: drop these batches, keep going
                log.exception("cluster_outbox_send_failed", messages=sum(map(len, batches.values())))
            else:
                for messages in batches.values():
                    for message in messages:
                        self._metrics.sent.labels(type_name(message)).inc()
            if not self._pending:
                self._idle.set()
