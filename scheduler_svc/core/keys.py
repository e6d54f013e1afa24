"""API keys: the service keeps only their SHA-256 digests, so no plain key sits in the configuration.

Keys reach the service three ways, merged: digests in `auth.api_key_sha256`, and a key file
(`auth.api_keys_file`) or environment variable (`auth.api_keys_env`) in this format, one entry per line:

    # comment lines and blank lines are ignored
    alice sk-alice-123                  <user> <key>: the key in plain text, hashed on reading
    bob   sha256:<64 hex digits>        <user> sha256:<digest>: as `printf %s KEY | sha256sum` prints it

Messages about a malformed entry name its line, never the key.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

from scheduler_svc.config import AuthConfig, ConfigError
from scheduler_svc.core.identity import user_id_problem

DIGEST_PREFIX = "sha256:"
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")


def key_digest(key: str) -> str:
    """The hex SHA-256 digest of a key (its UTF-8 bytes), as `printf %s KEY | sha256sum` prints it."""
    return hashlib.sha256(key.encode()).hexdigest()


def load_key_digests(auth: AuthConfig, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Every configured key as digest -> user, from the config, the key file and the environment.

    A configured file or variable that is missing, malformed or empty is a ConfigError: falling back to
    no keys would silently switch the service to trusting `x-user-id`.
    """
    entries: list[tuple[str, str, str]] = []  # (digest, user, where)
    for digest, user in auth.api_key_sha256.items():
        if not _HEX_DIGEST.fullmatch(digest):
            raise ConfigError(
                "auth.api_key_sha256: keys must be hex SHA-256 digests (64 hex digits), e.g. from "
                "`printf %s KEY | sha256sum` or `llmsched hash-key`"
            )
        entries.append((digest.lower(), user, f"auth.api_key_sha256[{digest[:8]}...]"))
    if auth.api_keys_file:
        try:
            text = Path(auth.api_keys_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"auth.api_keys_file: cannot read {auth.api_keys_file}: {exc}") from exc
        entries += _parse(text, f"auth.api_keys_file {auth.api_keys_file}")
    if auth.api_keys_env:
        value = environ.get(auth.api_keys_env)
        if value is None:
            raise ConfigError(f"auth.api_keys_env: environment variable {auth.api_keys_env} is not set")
        entries += _parse(value, f"auth.api_keys_env ${auth.api_keys_env}")
    digests: dict[str, str] = {}
    for digest, user, where in entries:
        if problem := user_id_problem(user):
            raise ConfigError(f"{where}: {problem}")
        if digests.setdefault(digest, user) != user:
            raise ConfigError(f"{where}: the same key is configured for users {digests[digest]!r} and {user!r}")
    return digests


def _parse(text: str, where: str) -> list[tuple[str, str, str]]:
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) != 2:
            raise ConfigError(f"{where} line {number}: expected `<user> <key>` or `<user> sha256:<hex digest>`")
        user, key = fields
        if key.startswith(DIGEST_PREFIX):
            digest = key.removeprefix(DIGEST_PREFIX)
            if not _HEX_DIGEST.fullmatch(digest):
                raise ConfigError(f"{where} line {number}: a sha256: entry needs 64 hex digits")
            entries.append((digest.lower(), user, f"{where} line {number}"))
        else:
            entries.append((key_digest(key), user, f"{where} line {number}"))
    if not entries:
        raise ConfigError(f"{where}: no keys found (expected `<user> <key>` lines)")
    return entries
