"""A dispatch observer that hears every event and does nothing, for test drivers to extend."""

from __future__ import annotations

from backends.errors import BackendError
from scheduler_svc.core.ticket import Ticket


class QuietObserver:
    """`steering.DispatchObserver` with every event ignored: a subclass overrides the ones it records."""

    def on_accepted(self, ticket: Ticket) -> None:
        return None

    def on_first_token(self, ticket: Ticket) -> None:
        return None

    def on_generated(self, ticket: Ticket, tokens: int) -> None:
        return None

    def on_failed_over(self, ticket: Ticket, error: BackendError) -> None:
        return None

    def on_outcome(self, ticket: Ticket) -> None:
        return None
