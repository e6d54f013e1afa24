"""One decision pass of a model's dispatch: band -> user -> request -> backend, as often as the gates allow.

The band policy picks a band (strict by rank, with the anti-starvation guard) and the gate its request must
pass; the band's fairness policy a user among those some backend's gate admits (with D-LPM's
`locality.deficit_bound`, the users within that bound); the ordering policy, through the queue book's
order, each one's request; and the backend policy one of the requests and one of the backends open to it.
The chosen ticket goes to `send`, which moves it from the queue book to the run ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from attrs import define, field

from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.core.queues import Band
from scheduler_svc.core.ticket import Ticket
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.health import InternalErrors, LoopHealth
from scheduler_svc.dispatch.openings import BackendChoice, BackendGates, Opening
from scheduler_svc.dispatch.queue_book import QueueBook
from scheduler_svc.dispatch.run_ledger import RunLedger
from scheduler_svc.policies import BackendPolicy, BandPolicy, Fairness
from scheduler_svc.policies.backend_choice import Candidate

Send = Callable[[Ticket, BackendHandle, float, Callable[[], "int | None"]], None]
"""Moves a queued ticket to a backend with all the accounting: (ticket, backend, now, its engine priority)."""


@define(eq=False)
class Decisions:
    """Chooses and sends one model's requests while the gates allow (`dispatch_ready`)."""

    _book: QueueBook
    _ledger: RunLedger
    _gates: BackendGates
    _fairness: Mapping[str, Fairness]
    _bands: BandPolicy
    _backend_policy: BackendPolicy
    _deficit_bound: float
    _candidates: int  # D-LPM: the most users one decision weighs
    _send: Send = field(kw_only=True)
    _expire: Callable[[Ticket], None] = field(kw_only=True)
    _may_dispatch: Callable[[], bool] = field(kw_only=True)
    _errors: InternalErrors = field(kw_only=True)
    _health: LoopHealth = field(kw_only=True)
    _model: str = field(kw_only=True)

    def dispatch_ready(self, now: float) -> int:
        """Send every request the gates allow now; returns how many were sent.

        A band whose dispatch raises an unexpected error is left out for the rest of the pass, so the other
        bands keep going; the error is counted and the pass reported failed to the loop's health.
        """
        if not self._may_dispatch():
            return 0
        sent = 0
        broken: set[str] = set()
        while len(self._book):
            choice = self._choose_band(now, broken)
            if choice is None:
                break
            band, backends = choice
            try:
                went = self._dispatch_one(band, backends, now)
            except Exception as exc:
                broken.add(band.priority_class.name)
                self._errors.report("dispatch", exc, model=self._model, priority_class=band.priority_class.name)
                continue
            if went is None:
                break  # no backlogged user of the band may go now
            sent += went
        self._health.pass_done(ok=not broken)
        return sent

    def could_dispatch(self, now: float) -> bool:
        """Whether some queued request could go now (what the watchdog compares with what went): asked for
        a real user of the best backlogged band, since at a priority engine a newcomer may pass the gate while
        every backlogged user's next request would queue too deep (a lone flood), which is no stall."""
        if not len(self._book) or not self._may_dispatch():
            return False
        top = self._book.backlogged_bands()[0]
        choice = BackendChoice(self._gates, top.priority_class, top.priority_class, now)
        busy = self._gates.users_in_flight  # every other user gets the answer for a user with nothing in flight
        idle_users = len(top.flows) - sum(1 for user in busy if user in top.flows)
        if idle_users and self._gates.any_open(top.priority_class, top.priority_class, None, now):
            return True
        return any(choice.eligible(user) for user in busy if user in top.flows)

    def _choose_band(self, now: float, broken: set[str]) -> tuple[Band, BackendChoice] | None:
        """The band to serve and the gates its request must pass, or None when nothing may go now: the
        band policy decides among the backlogged bands that did not fail this pass."""
        backlogged = self._book.backlogged_bands()
        if broken:
            backlogged = [b for b in backlogged if b.priority_class.name not in broken]
        if not backlogged:
            return None
        asked: dict[str, BackendChoice] = {}  # class -> the choice its gate was asked through (same class)

        def gate_open(cls: PriorityClassConfig) -> bool:
            choice = asked[cls.name] = BackendChoice(self._gates, cls, cls, now)
            return choice.eligible(None)

        turn = self._bands.choose(backlogged, now, gate_open)
        if turn is None:
            return None
        band = backlogged[turn.index]
        choice = asked.get(turn.gate_class.name)
        if choice is None or band.priority_class is not turn.gate_class:
            choice = BackendChoice(self._gates, turn.gate_class, band.priority_class, now)
        return band, choice

    def _dispatch_one(self, band: Band, backends: BackendChoice, now: float) -> int | None:
        """Send the band's next request. Returns how many went (0: the chosen users' queues held only
        expired requests), None when no backlogged user may go."""
        fairness = self._fairness[band.priority_class.name]
        if self._deficit_bound > 0:
            users = fairness.offer(band.flow_views, backends.eligible, self._deficit_bound, self._candidates)
        else:
            user = fairness.select(band.flow_views, backends.eligible)
            users = [] if user is None else [user]
        if not users:
            return None
        candidates: list[Candidate[Opening]] = []
        live_tickets: dict[str, Ticket] = {}  # request id -> ticket, of the candidates
        for user in users:
            openings = backends.for_user(user)
            assert openings, "fairness chose a user no backend can take"
            live = self._next_live(band, user, now)
            if live is not None:
                candidates.append(Candidate(live.request, openings))
                live_tickets[live.request.request_id] = live
        if not candidates:
            return 0  # the users' queues held only expired requests
        request, opening = self._backend_policy.choose_among(candidates, self._ledger.in_flight())
        ticket = live_tickets[request.request_id]
        handle = opening.handle
        priorities = self._gates.priorities
        self._send(ticket, handle, now, lambda: priorities.of(request.priority_class, request.user, handle))
        return 1

    def _next_live(self, band: Band, user: str, now: float) -> Ticket | None:
        """The user's next request by the ordering policy, expiring dead ones on the way, so that expired
        requests never cost the user its turn."""
        while (ticket := self._book.head(band, user)) is not None:
            deadline = ticket.request.deadline
            if deadline is None or now < deadline:
                return ticket
            self._expire(ticket)
        return None
