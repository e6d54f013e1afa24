"""Messages waiting to be sent, batched per destination: callers post without waiting, one task sends.

Posting never blocks the dispatcher or a request's task on the store. Each wake-up of the sender sends
everything pending for a destination in one `ClusterStore.send` (one XADD pipeline on Redis), in the order
posted; a store failure drops the batch (the messages concern a leader or owner that everyone will
re-register with once the store answers again) and is reported to `on_error`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from scheduler_svc.cluster.messages import Message, encode, type_name
from scheduler_svc.cluster.metrics import ClusterMetrics
from scheduler_svc.cluster.store import ClusterStore, StoreUnavailable

log = structlog.get_logger(__name__)


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
            self._ready.clear()
            batches, self._pending = self._pending, {}
            for to, messages in batches.items():
                try:
                    await self._store.send(to, [encode(m) for m in messages])
                except StoreUnavailable as exc:
                    self._on_error(exc)
                    continue
                except Exception:  # a bug must not stop the sender: drop this batch, keep going
                    log.exception("cluster_outbox_send_failed", to=to, messages=len(messages))
                    continue
                for message in messages:
                    self._metrics.sent.labels(type_name(message)).inc()
            if not self._pending:
                self._idle.set()
