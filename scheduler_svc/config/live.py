"""What a reload may change while the service runs, and what only a restart changes: as data.

`LIVE` names the fields a reload applies; every other field is read at start only, so a field nobody
classified is safe by default: changing it is refused, never silently ignored. A name covers the fields
under it (`models[].gate` is every field of a model's gate). The tables of `NAMED` are lists whose entries
are matched by name, not by place: adding or removing an entry is a change of the list itself (`models`),
and a kept entry's fields follow their own rule (`scheduling.classes[]`: every field of every class).

What cannot change live, and why (docs/operations.md says the same to operators):

- `[server]`: listeners, TLS files, the event loop, logging, the HTTP door's bounds and the stream pacing
  are set up once, at start; `[cluster]`: the store, the replica's name and the leases are joined at start;
  `[tracing]`: the exporter is built at start;
- `auth.identity_from_client_cert`: the source of identity goes with the TLS set up at start;
- the policies (`scheduling.fairness`, `ordering`, `band_policy`, `fairness_scope` and their parameters,
  a model's `backend_policy` and `locality`): switching one would rebuild what it keeps (the fairness
  counters, the order of queued requests, the prefix index), which a reload keeps;
- `scheduling.weights.members`: every band keeps a user's counters and running requests under its group;
- an engine's connection (`kind`, `url`, `engine_model`, `priority_scheduling`, `metrics_path` and the
  connection settings): its adapter holds open connections and runs requests. Give the new engine a new
  name instead: the old one drains, the new one takes the work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from scheduler_svc.config.schema import Config

LIVE: frozenset[str] = frozenset(
    {
        "auth.api_key_sha256",
        "auth.api_keys_file",
        "auth.api_keys_env",
        "auth.admin_users",
        "auth.trust_user_header",
        "scheduling.default_class",
        "scheduling.classes",
        "scheduling.classes[]",
        "scheduling.weights.default",
        "scheduling.weights.users",
        "scheduling.weights.groups",
        "scheduling.cost_accounts",
        "scheduling.engine_priority_per_inflight",
        "models",
        "models[].default_max_tokens",
        "models[].max_tokens_limit",
        "models[].gate",
        "models[].max_queued",
        "models[].max_queued_per_user",
        "models[].max_end_users_per_user",
        "models[].max_prompt_bytes",
        "models[].max_queued_bytes",
        "models[].max_queued_bytes_per_user",
        "models[].min_retry_after_seconds",
        "models[].failover_attempts",
        "models[].failover_cooldown_seconds",
        "models[].input_token_cost",
        "models[].output_token_cost",
        "models[].backends",
        "models[].backends[].max_num_seqs",
        "models[].backends[].learn_max_num_seqs",
        "models[].backends[].scrape_interval_seconds",
        "models[].backends[].drained",
    }
)
"""The fields a reload applies (a name covers every field under it); all others change at restart only."""

NAMED: frozenset[str] = frozenset({"models", "models[].backends", "scheduling.classes"})
"""Lists of tables matched by their `name`: entries are added, removed or changed, never moved."""

SECRET: frozenset[str] = frozenset({"auth"})
"""Tables whose values a change description never shows (key digests, key files, user names)."""


@dataclass
class ConfigChanges:
    """What differs between two configurations: `live` what a reload applies, `restart` the fields only a
    restart changes, each one line naming the field (`models[m].backends[b1]: removed`)."""

    live: list[str] = field(default_factory=list)
    restart: list[str] = field(default_factory=list)


def is_live(pattern: str) -> bool:
    """Whether the field at `pattern` (`models[].gate.waiting_target`) changes live: it or a table above it is
    in `LIVE` (a list's own name, `models`, covers adding and removing its entries only)."""
    parts = pattern.split(".")
    return any(".".join(parts[:n]) in LIVE for n in range(1, len(parts) + 1))


def config_changes(old: Config, new: Config) -> ConfigChanges:
    """Every difference between `old` and `new`, sorted into live and restart-only."""
    changes = ConfigChanges()
    for pattern, shown, line in _differences(old, new, "", ""):
        (changes.live if is_live(pattern) else changes.restart).append(f"{shown}: {line}")
    return changes


def restart_changes(old: Any, new: Any, pattern: str, shown: str) -> list[str]:
    """The restart-only differences between two tables at `pattern` (`models[].backends[]`), shown under
    `shown` (`models[m].backends[b1]`)."""
    return [f"{where}: {line}" for p, where, line in _differences(old, new, pattern, shown) if not is_live(p)]


def _differences(old: Any, new: Any, pattern: str, shown: str) -> Iterator[tuple[str, str, str]]:
    """(pattern, path shown, what changed) for each differing leaf, list entry added or removed."""
    if old == new:
        return
    if dataclasses.is_dataclass(old) and dataclasses.is_dataclass(new):
        for f in dataclasses.fields(old):
            name = f.name
            yield from _differences(getattr(old, name), getattr(new, name), _join(pattern, name), _join(shown, name))
        return
    if pattern in NAMED:
        olds = {entry.name: entry for entry in old}
        news = {entry.name: entry for entry in new}
        for name, entry in news.items():
            if name not in olds:
                yield pattern, f"{shown}[{name}]", "added"
            else:
                yield from _differences(olds[name], entry, f"{pattern}[]", f"{shown}[{name}]")
        for name in olds:
            if name not in news:
                yield pattern, f"{shown}[{name}]", "removed"
        return
    if pattern.split(".")[0] in SECRET or isinstance(old, (dict, list)):
        yield pattern, shown, "changed"
    else:
        yield pattern, shown, f"{old!r} -> {new!r}"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
