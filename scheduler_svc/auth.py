"""Who is calling: the user id comes from call metadata, or from an API key when keys are configured."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from scheduler_svc.config import AuthConfig
from scheduler_svc.errors import Unauthenticated

USER_HEADER = "x-user-id"
AUTH_HEADER = "authorization"
MAX_USER_ID_LENGTH = 128


class Authenticator:
    """Maps call metadata to a user id.

    Without API keys, the caller states its user in `x-user-id` (trusted internal callers). With keys, the
    bearer key alone decides the user and `x-user-id` is ignored, so nobody can claim another identity.
    """

    def __init__(self, config: AuthConfig) -> None:
        self._keys = dict(config.api_keys)

    def identify(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
        headers: dict[str, str] = {}
        for key, value in metadata or ():
            if isinstance(value, str):
                headers.setdefault(key.lower(), value)
        if self._keys:
            return self._user_for_key(headers.get(AUTH_HEADER, ""))
        user = headers.get(USER_HEADER, "").strip()
        if not user:
            raise Unauthenticated(f"missing caller identity: send metadata `{USER_HEADER}: <user>`")
        if len(user) > MAX_USER_ID_LENGTH or not user.isprintable():
            raise Unauthenticated(f"`{USER_HEADER}` must be printable and at most {MAX_USER_ID_LENGTH} characters")
        return user

    def _user_for_key(self, header: str) -> str:
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthenticated("missing API key: send metadata `authorization: Bearer <key>`")
        key = key.strip()
        for known, user in self._keys.items():  # compare every key in constant time
            if hmac.compare_digest(known.encode(), key.encode()):
                return user
        raise Unauthenticated("unknown API key")
