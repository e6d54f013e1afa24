"""Reloading the configuration file while the service runs: on SIGHUP, or an admin's ReloadConfig call.

The file is read and checked as at start (`settings.load_config`), then set against the running
configuration (`config.live`). It is refused as a whole, the running configuration staying, with the reason
logged and returned:

- CONFIG_INVALID: the file does not load (its syntax, a field, a rule between fields, an unreadable key file);
- CONFIG_NEEDS_RESTART: it changes a field only a restart changes (`config.live` lists and explains them);
  in a cluster it adds or removes a model (each model's lease is planned from the models at start); it
  raises the largest `max_prompt_bytes` above what the listeners' read limits were sized for at start; or
  it brings back, with another engine, a backend that still drains after its removal.

Otherwise it is applied at once, in one step of the event loop (no request is admitted or dispatched
half-way): the API keys the doors check (`Authenticator.use`), then the scheduler's models, classes,
settings and backends (`Scheduler.reconfigure`), without dropping, reordering or admitting again a queued or
running request, and keeping the fairness counters. Admission follows the new file from the next request.

In a cluster each replica reloads its own file (on its own SIGHUP or call); each model's leader decides for
every replica's requests with its own classes, weights, gates and backends, so the replicas should be given
the same file (one ConfigMap), and the leader's config rules in between.

Metrics: `llmsched_config_reloads_total{result}` (applied, refused; a dry run counts neither),
`llmsched_config_last_reload_successful`, `llmsched_config_last_reload_success_timestamp_seconds`.
"""

from __future__ import annotations

import time
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from scheduler_svc.app.settings import load_config
from scheduler_svc.config import ConfigError
from scheduler_svc.config.live import config_changes
from scheduler_svc.core.auth import Authenticator
from scheduler_svc.core.errors import ConfigInvalid, ConfigNeedsRestart, ConfigRefused, ShuttingDown
from scheduler_svc.dispatch.scheduler import Scheduler

log = structlog.get_logger(__name__)


class ConfigReloader:
    """Reads the service's configuration file again and applies it, or refuses it whole (module docstring)."""

    def __init__(
        self,
        path: str | Path,
        scheduler: Scheduler,
        authenticator: Authenticator,
        registry: CollectorRegistry,
        *,
        clustered: bool,
    ) -> None:
        self.path = Path(path)
        self._scheduler = scheduler
        self._auth = authenticator
        self._clustered = clustered
        # the gRPC receive limit and the HTTP door's body limit were sized from this at start
        self._prompt_limit = max(model.max_prompt_bytes for model in scheduler.config.models)
        self._reloads = Counter(
            "llmsched_config_reloads",
            "Configuration reloads (SIGHUP, ReloadConfig), by result: applied (also when nothing changed) or "
            "refused (the file does not load, or changes what only a restart changes); dry runs are not counted.",
            ["result"],
            registry=registry,
        )
        for result in ("applied", "refused"):
            self._reloads.labels(result)
        self._successful = Gauge(
            "llmsched_config_last_reload_successful",
            "1 when the last reload was applied (or none was tried), 0 when it was refused: the running "
            "configuration is then not the file's.",
            registry=registry,
        )
        self._successful.set(1)
        self._applied_at = Gauge(
            "llmsched_config_last_reload_success_timestamp_seconds",
            "When the configuration was last applied (at start, or by a reload), in seconds since the epoch.",
            registry=registry,
        )
        self._applied_at.set(time.time())

    def reload(self, dry_run: bool = False, by: str = "SIGHUP") -> list[str]:
        """Read the file and apply it (`dry_run`: only say what would change); returns what changed, one
        line each. Raises ConfigInvalid or ConfigNeedsRestart (or ShuttingDown while draining), logged,
        with the running configuration unchanged. `by` says who asked, for the log."""
        try:
            changes = self._checked(dry_run)
        except ConfigRefused as exc:
            log.warning("config_reload_refused", by=by, path=str(self.path), reason=exc.reason, error=str(exc))
            if not dry_run:
                self._reloads.labels("refused").inc()
                self._successful.set(0)
            raise
        if dry_run:
            log.info("config_reload_checked", by=by, path=str(self.path), changes=changes)
            return changes
        self._reloads.labels("applied").inc()
        self._successful.set(1)
        self._applied_at.set(time.time())
        log.info("config_reloaded", by=by, path=str(self.path), changes=changes)
        return changes

    def _checked(self, dry_run: bool) -> list[str]:
        if not self._scheduler.accepting:
            raise ShuttingDown("the service is shutting down: nothing to reload")
        try:
            new = load_config(self.path)
        except ConfigError as exc:
            raise ConfigInvalid(f"{exc}; the running configuration stays") from exc
        old = self._scheduler.config
        changes = config_changes(old, new)
        problems = [f"{line} (changes only at restart)" for line in changes.restart]
        if self._clustered:
            before, after = {m.name for m in old.models}, {m.name for m in new.models}
            problems += [
                f"models[{name}]: {'added' if name in after else 'removed'} (in a cluster the model set changes "
                "only at restart: each model's leader lease is planned from it)"
                for name in sorted(before ^ after)
            ]
        largest = max(model.max_prompt_bytes for model in new.models)
        if largest > self._prompt_limit:
            problems.append(
                f"max_prompt_bytes {largest} is above {self._prompt_limit}, which the gRPC and HTTP read limits "
                "were sized for at start (a larger limit takes a restart)"
            )
        problems += self._scheduler.reload_problems(new)
        if problems:
            raise ConfigNeedsRestart("; ".join(problems) + "; the running configuration stays")
        if dry_run:
            return changes.live
        try:
            self._auth.use(new.auth)  # first: reading a key file may still fail, and nothing is changed yet
        except ConfigError as exc:
            raise ConfigInvalid(f"{exc}; the running configuration stays") from exc
        self._scheduler.reconfigure(new)
        return changes.live
