"""A reloaded configuration applied to one model's dispatch in place, and its backends drained.

Nothing queued or running is dropped, moved or admitted again, and the fairness accounts keep their counters:
each part that reads a setting is handed the new value.

- Settings: the model's caps and failover settings hold for the next admission and failure; its prices for
  the cost counted from now on (the cost counters, every band's fairness account); the weights and the
  engine priority step for the next dispatch; the cost accounts for the next cost counted. A request that
  runs across the reload has what it still holds in its user's key (a dispatch charge pending its first
  token, vtc's look-ahead) released at the new weight and price: the key is off by at most those requests'
  own charges times the change, until the user has nothing running and the account drops that part whole.
- Classes: a kept class's band takes its new settings (a new rank moves the band, never a request within
  it); a new class gets an empty band, its own fairness account and its series. A class that left the
  configuration is *retiring*: admission no longer knows it, and its band keeps serving what it holds under
  its last settings; its band, account and series go once nothing of it is queued or running.
- Backends: a new one joins (the scheduler builds its adapter and reads its metrics); one that left drains
  (`Drain.REMOVED`) and goes once nothing runs there (`on_backend_gone`: the scheduler stops reading it and
  closes its adapter); `drained` in the file drains or undrains (`Drain.CONFIG`), and an admin's drain
  (`Drain.ADMIN`) outlives reloads until undrained. A new `[models.gate]` gives every backend a new gate,
  which learns its step-time line and queue depth afresh from the next readings; class limits apply at once
  with what the gates learned.

What may change and what is refused is decided before (`config.live`, `problems` here); `apply` then
cannot fail on a checked configuration.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, MutableSequence, Sequence

from scheduler_svc.config import ModelConfig, PriorityClassConfig, SchedulingConfig
from scheduler_svc.config.live import restart_changes
from scheduler_svc.core.clock import Clock
from scheduler_svc.core.tracing import GateLog
from scheduler_svc.dispatch.activity import ClassActivity
from scheduler_svc.dispatch.backend_handle import BackendHandle, Drain
from scheduler_svc.dispatch.capacity import Capacity
from scheduler_svc.dispatch.failover import FailoverRule
from scheduler_svc.dispatch.gate_history import GateHistory
from scheduler_svc.dispatch.metrics import (
    BackendSeries,
    ClassSeries,
    RequestCounters,
    SchedulerMetrics,
    backend_series,
    class_series,
    gate_cause_series,
)
from scheduler_svc.dispatch.openings import BackendGates
from scheduler_svc.dispatch.queue_book import QueueBook
from scheduler_svc.dispatch.request_events import RequestEvents
from scheduler_svc.dispatch.run_ledger import RunLedger
from scheduler_svc.policies import FAIRNESS_POLICIES, GATE_POLICIES, Fairness
from scheduler_svc.policies.cost import CostAccounts, Counters, CounterScope, Prices
from scheduler_svc.policies.weights import WeightResolver

Costing = MutableMapping[str, tuple[Counters, Counters]]
"""Priority class -> the (user, group) counters its fairness account keeps its service in."""


class LiveConfig:
    """One model's dispatch as a reload changes it (see the module docstring)."""

    def __init__(
        self,
        model: ModelConfig,
        scheduling: SchedulingConfig,
        clock: Clock,
        metrics: SchedulerMetrics,
        *,
        book: QueueBook,
        ledger: RunLedger,
        gates: BackendGates,
        activity: ClassActivity,
        capacity: Capacity,
        failover: FailoverRule,
        events: RequestEvents,
        counters: RequestCounters,
        weights: WeightResolver,
        scope: CounterScope,
        fairness: MutableMapping[str, Fairness],
        costing: Costing,
        classes: MutableSequence[PriorityClassConfig],
        class_by_name: MutableMapping[str, PriorityClassConfig],
        by_class: MutableMapping[str, ClassSeries],
        series: MutableMapping[str, BackendSeries],
        wake: Callable[[], None],
        history: GateHistory | None = None,
        gate_logs: MutableMapping[str, GateLog] | None = None,
    ) -> None:
        """`history` and `gate_logs` (with tracing on): the gates' recent changes, and each class's view of them
        that traced requests read, kept in step with the classes."""
        self._model = model
        self._scheduling = scheduling
        self._clock = clock
        self._metrics = metrics
        self._book = book
        self._ledger = ledger
        self._gates = gates
        self._activity = activity
        self._capacity = capacity
        self._failover = failover
        self._events = events
        self._counters = counters
        self._weights = weights
        self._scope = scope
        self._fairness = fairness
        self._costing = costing
        self._classes = classes  # the configured classes, then the retiring ones: what dispatch and views list
        self._class_by_name = class_by_name
        self._by_class = by_class
        self._series = series
        self._wake = wake
        self._history = history
        self._gate_logs = gate_logs
        self.retiring_classes: set[str] = set()  # left the configuration, still holding queued or running work
        self._removing = False  # a backend left the configuration and still drains (asked at every request's end)
        self.on_backend_gone: Callable[[BackendHandle], None] = lambda handle: None
        self._gate = model.gate  # what the backends' gates were built from
        for handle in gates.backends:
            if Drain.CONFIG in handle.drains:
                metrics.backend_drains.labels(model.name, handle.name, Drain.CONFIG.value).inc()
            self._show_drains(handle)

    # -- a reload ----------------------------------------------------------------------------------------------
    def problems(self, model: ModelConfig) -> list[str]:
        """Why `model` cannot be applied live, beyond what `config.live` finds between two files: a backend
        that left an earlier file and still drains cannot come back with another engine under its name."""
        found = []
        for backend in model.backends:
            handle = self._ledger.backend(backend.name)
            if handle is None or Drain.REMOVED not in handle.drains:
                continue
            where = f"models[{model.name}].backends[{backend.name}]"
            for change in restart_changes(handle.config, backend, "models[].backends[]", where):
                found.append(
                    f"{change} (it is still draining after its removal, {handle.estimator.in_flight} running: add "
                    "it back once it has gone, or under another name)"
                )
        return found

    def apply(self, model: ModelConfig, scheduling: SchedulingConfig, added: Sequence[BackendHandle]) -> None:
        """Hand every part the new settings, classes and backends; `added` are the new backends, built by the
        scheduler. Then let go of whatever retired already, and look for work: a gate may be open now."""
        self._model = model
        self._scheduling = scheduling
        self._capacity.use(model)
        self._failover.use(model)
        self._weights.use(scheduling.weights)
        self._gates.priorities.per_inflight = scheduling.engine_priority_per_inflight
        self._counters.use_accounts(CostAccounts(scheduling.cost_accounts).label)
        self._use_classes(scheduling.classes)
        self._use_prices(Prices.of(model))
        self._use_backends(model, added)
        self.retire_idle()
        self._wake()

    def _use_prices(self, prices: Prices) -> None:
        self._events.use_prices(prices)
        self._book.end_users.use_prices(prices)
        for name, policy in self._fairness.items():
            users, groups = self._costing[name]
            policy.account.use_costing(prices, users, groups)

    def _use_classes(self, classes: Sequence[PriorityClassConfig]) -> None:
        configured = {c.name for c in classes}
        retiring = [c for c in self._classes if c.name not in configured]
        for cls in classes:
            if cls.name not in self._fairness:
                self._add_class(cls)
        self.retiring_classes = {c.name for c in retiring}
        self._classes[:] = [*classes, *retiring]
        self._class_by_name.clear()
        self._class_by_name.update({c.name: c for c in self._classes})
        self._book.use_classes(self._classes)
        self._activity.use(self._classes)
        self._use_gate_logs()

    def _use_gate_logs(self) -> None:
        if self._history is None or self._gate_logs is None:
            return
        self._history.use_classes(self._classes)
        self._gate_logs.clear()
        self._gate_logs.update({c.name: self._history.log(c.name) for c in self._classes})

    def _add_class(self, cls: PriorityClassConfig) -> None:
        scheduling, name = self._scheduling, cls.name
        policy = FAIRNESS_POLICIES.create(
            scheduling.fairness, self._weights, self._clock, params=scheduling.policy_params
        )
        users, groups = self._scope.counters(name, "user"), self._scope.counters(name, "group")
        policy.account.use_costing(Prices.of(self._model), users, groups)
        self._fairness[name] = policy
        self._costing[name] = (users, groups)
        self._by_class[name] = class_series(self._metrics, self._model.name, name)
        for handle in self._gates.backends:
            self._series[handle.name].gate_causes[name] = gate_cause_series(
                self._metrics, self._model.name, handle.name, name
            )

    def _use_backends(self, model: ModelConfig, added: Sequence[BackendHandle]) -> None:
        configured = {b.name: b for b in model.backends}
        for handle in added:
            self._series[handle.name] = backend_series(
                self._metrics, model.name, handle.name, [c.name for c in self._classes]
            )
            handle.drains.discard(Drain.CONFIG)  # counted below, as a drain that starts now
            self._gates.backends.append(handle)
            self._ledger.add_backend(handle)
        new_gates = model.gate != self._gate
        for handle in self._gates.backends:
            backend = configured.get(handle.name)
            if backend is None:
                self._start_drain(handle, Drain.REMOVED)
                continue
            handle.drains.discard(Drain.REMOVED)
            handle.config = backend
            handle.estimator.configure_slots(backend.max_num_seqs, learn=backend.learn_max_num_seqs)
            if new_gates and handle not in added:
                handle.gate = GATE_POLICIES.create(model.gate.policy, model.gate)
            if backend.drained:
                self._start_drain(handle, Drain.CONFIG)
            else:
                handle.drains.discard(Drain.CONFIG)
            self._show_drains(handle)
        self._gate = model.gate
        order = {name: index for index, name in enumerate(configured)}  # the file's order, then the removed ones
        self._gates.backends.sort(key=lambda h: order.get(h.name, len(order)))
        self._removing = any(Drain.REMOVED in h.drains for h in self._gates.backends)
        self._gates.backends_changed()

    # -- drains ------------------------------------------------------------------------------------------------
    def backend(self, name: str) -> BackendHandle | None:
        """The model's backend called `name` (also one that left the configuration and still drains)."""
        return self._ledger.backend(name)

    def drain(self, handle: BackendHandle, source: Drain) -> None:
        """No new request goes to `handle` from now on, for `source`; its running requests finish."""
        self._start_drain(handle, source)
        self._show_drains(handle)
        self._gates.backends_changed()
        self._wake()

    def undrain(self, handle: BackendHandle, source: Drain) -> None:
        """`source` no longer holds `handle` back (another source may still: it takes work when none does)."""
        handle.drains.discard(source)
        self._show_drains(handle)
        self._gates.backends_changed()
        self._wake()

    def _start_drain(self, handle: BackendHandle, source: Drain) -> None:
        if source not in handle.drains:
            handle.drains.add(source)
            self._metrics.backend_drains.labels(self._model.name, handle.name, source.value).inc()

    def _show_drains(self, handle: BackendHandle) -> None:
        self._series[handle.name].draining.set(1 if handle.draining else 0)

    # -- retiring ----------------------------------------------------------------------------------------------
    @property
    def retiring(self) -> bool:
        """Whether a class or a backend that left the configuration is still here."""
        return bool(self.retiring_classes) or self._removing

    def close_counters(self) -> None:
        """The model left the configuration: its bands let go of their counters (a class-wide spend keeps a
        user while any other model's band holds it)."""
        for users, groups in self._costing.values():
            users.close()
            groups.close()

    def retire_idle(self) -> None:
        """Let go of the classes and backends that left the configuration and hold nothing any more."""
        for name in sorted(self.retiring_classes):
            band = self._book.band(name)
            if band.size or self._activity.running(name):
                continue
            self._drop_class(name)
        gone = [h for h in self._gates.backends if Drain.REMOVED in h.drains and not h.estimator.in_flight]
        for handle in gone:
            self._gates.backends.remove(handle)
            self._ledger.remove_backend(handle.name)
            del self._series[handle.name]
            self._metrics.forget_backend(self._model.name, handle.name, [c.name for c in self._classes])
            self.on_backend_gone(handle)
        if gone:
            self._gates.backends_changed()
            self._removing = any(Drain.REMOVED in h.drains for h in self._gates.backends)

    def _drop_class(self, name: str) -> None:
        self.retiring_classes.discard(name)
        self._book.drop_band(name)
        self._classes[:] = [c for c in self._classes if c.name != name]
        for counters in self._costing.pop(name):  # a class-wide spend keeps a user while any band holds it
            counters.close()
        del self._class_by_name[name], self._fairness[name], self._by_class[name]
        for series in self._series.values():
            series.gate_causes.pop(name, None)
        self._activity.use(self._classes)
        self._activity.forget(name)
        self._use_gate_logs()
        self._metrics.forget_class(self._model.name, name, list(self._series))
