"""Values worked out from several fields of the configuration, or from a field and what the engine showed (a
0 there means derived), in this one place: the HTTP door's body bounds, which the door reads with and the
loader checks a body can always fit; and the waiting target at a priority engine, from its slots.

The engine's slots (`max_num_seqs`) are configured or learned from the engine's readings
(`scheduler_svc.dispatch.engine_slots`); what follows from them is worked out here, so that a config
naming only the model and its engine gets the settings an expert would write for that engine.
"""

from __future__ import annotations

import math

from scheduler_svc.config.fields import ConfigError
from scheduler_svc.config.schema import Config, GateConfig

BODY_MARGIN_BYTES = 256 * 1024  # room for the fields besides the prompt
READING_BODIES = 16  # http_max_reading_bytes = 0: this many largest bodies at once, all callers
READING_BODIES_PER_USER = 4  # http_max_reading_bytes_per_user = 0: this many for one caller
# priority_waiting_target = 0: this many queued requests per engine slot. The queue covers the engine's
# front end handing requests in late; slots free, and need a request each, in proportion to their number.
# Measured on real vLLM with 4 slots and a busy front end (bench R1): 3 queued left slots empty, 6 kept
# them full at no cost to latecomers, who jump the queue.
PRIORITY_QUEUE_PER_SLOT = 1.5


def http_body_limit(config: Config) -> int:
    """The largest HTTP request body: configured, else twice the largest prompt (JSON escaping) plus room
    for the other fields."""
    largest_prompt = max((model.max_prompt_bytes for model in config.models), default=0)
    return config.server.http_max_body_bytes or 2 * largest_prompt + BODY_MARGIN_BYTES


def http_reading_limits(config: Config) -> tuple[int, int]:
    """Body bytes the HTTP door holds while reading, all callers and per caller (configured, else derived)."""
    body = http_body_limit(config)
    server = config.server
    return (
        server.http_max_reading_bytes or READING_BODIES * body,
        server.http_max_reading_bytes_per_user or READING_BODIES_PER_USER * body,
    )


def check_http_bounds(config: Config) -> None:
    """A body must fit both reading bounds, or it could never be read."""
    body = http_body_limit(config)
    total, per_user = http_reading_limits(config)
    if not body <= per_user <= total:
        raise ConfigError(
            f"server.http_max_reading_bytes_per_user ({per_user}) must be at least the body limit ({body}) and at "
            f"most server.http_max_reading_bytes ({total}), or a body could never be read"
        )


def priority_waiting_target(gate: GateConfig, engine_slots: int) -> int:
    """The waiting target at a priority engine: configured, else `PRIORITY_QUEUE_PER_SLOT` per slot (at
    least `waiting_target`) once the engine's slots are known, and `waiting_target` until then (a shallow
    queue: latecomers still jump it, the slots may run empty for a moment while the front end is slow)."""
    if gate.priority_waiting_target:
        return gate.priority_waiting_target
    if engine_slots <= 0:
        return gate.waiting_target
    return max(gate.waiting_target, math.ceil(PRIORITY_QUEUE_PER_SLOT * engine_slots))
