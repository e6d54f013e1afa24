"""Values worked out from several fields of the configuration (a 0 there means derived), in this one place:
the HTTP door's body bounds, which the door reads with and the loader checks a body can always fit."""

from __future__ import annotations

from scheduler_svc.config.fields import ConfigError
from scheduler_svc.config.schema import Config

BODY_MARGIN_BYTES = 256 * 1024  # room for the fields besides the prompt
READING_BODIES = 16  # http_max_reading_bytes = 0: this many largest bodies at once, all callers
READING_BODIES_PER_USER = 4  # http_max_reading_bytes_per_user = 0: this many for one caller


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
