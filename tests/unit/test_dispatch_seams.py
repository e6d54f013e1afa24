"""The port a cluster steers dispatch through (`dispatch.cluster_port`): a dispatcher that does not decide
sends nothing by itself and only what `grant` tells it; an in-flight cap closes a backend; `adopt` counts a
running request without sending it; the observer hears every event; `force` admission skips the caps."""

from __future__ import annotations

from backends.errors import BackendError, BackendUnavailable
from scheduler_svc.cluster.modes import DegradedAuthority
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.steering import LOCAL
from tests.unit.dispatch_harness import Harness


class Follows:
    """Dispatch only on grants (a cluster follower)."""

    dispatches_locally = False
    scrapes = False

    def in_flight_cap(self, handle: BackendHandle) -> int | None:
        return None

    def position(self, request_id: str) -> int | None:
        return 7 if request_id.endswith("-0") else None


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def on_accepted(self, ticket: Ticket) -> None:
        self.events.append(("accepted", ticket.request.request_id))

    def on_first_token(self, ticket: Ticket) -> None:
        self.events.append(("first_token", ticket.request.request_id))

    def on_generated(self, ticket: Ticket, tokens: int) -> None:
        self.events.append((f"tokens {tokens}", ticket.request.request_id))

    def on_failed_over(self, ticket: Ticket, error: BackendError) -> None:
        self.events.append(("failed_over", ticket.request.request_id))

    def on_outcome(self, ticket: Ticket) -> None:
        self.events.append((f"outcome {ticket.outcome.value if ticket.outcome else None}", ticket.request.request_id))


def test_a_dispatcher_that_does_not_decide_sends_only_what_is_granted() -> None:
    h = Harness(cap=4)
    h.dispatcher.cluster.steer(Follows())
    a, b, c = h.submit("alice"), h.submit("bob"), h.submit("carol")
    assert (h.dispatcher.decide(), a.state) == (0, TicketState.QUEUED)
    assert h.events.position(a) == 7, "the deciding replica's position"
    assert h.events.position(b) == 1, "unknown there: the local queue's"
    assert h.dispatcher.cluster.grant(b.request.request_id, "b0", 3)
    assert b.state is TicketState.DISPATCHED and b.engine_priority == 3 and b.backend is h.handle
    assert h.handle.estimator.in_flight == 1
    assert not h.dispatcher.cluster.grant(b.request.request_id, "b0", None), "no longer queued"
    # A backend only the leader's configuration has: the request ends, retryable, instead of waiting for a
    # grant that will not come again.
    assert h.dispatcher.cluster.grant(c.request.request_id, "nope", None)
    assert c.outcome is Outcome.FAILED and c.state is TicketState.DONE and h.events.position(c) == 0
    h.dispatcher.cluster.steer(LOCAL)
    assert h.dispatcher.decide() == 1 and a.state is TicketState.DISPATCHED


def test_the_authoritys_in_flight_cap_closes_the_backend() -> None:
    h = Harness(cap=10)
    h.dispatcher.cluster.steer(DegradedAuthority(2))  # the cluster's capped authority
    for user in "abcd":
        h.submit(user)
    assert len(h.dispatch()) == 2
    assert not any(s.decision.open for s in h.gates())
    h.step()
    h.running()[0].close(Outcome.COMPLETED)
    assert len(h.dispatch()) == 1


def test_adopt_counts_a_running_request_without_sending_it() -> None:
    h = Harness(cap=4)
    ticket = h.submit("alice")
    assert h.dispatcher.cluster.adopt(ticket, "b0", None, 2, accepted=True, first_token=True, tokens=5)
    assert ticket.state is TicketState.DISPATCHED and ticket.attempts == 2 and ticket.completion_tokens == 5
    assert h.handle.estimator.in_flight == 1 and h.handle.estimator.gate_inputs(h.clock.now()).unstarted == 0
    ticket.close(Outcome.COMPLETED)
    assert h.handle.estimator.in_flight == 0


def test_the_observer_hears_each_event_in_order() -> None:
    h = Harness(cap=4)
    recorder = Recorder()
    h.dispatcher.cluster.observe(recorder)
    ticket = h.submit("alice")
    rid = ticket.request.request_id
    h.dispatch()
    h.events.on_accepted(ticket)
    h.step()
    ticket.close(Outcome.COMPLETED)
    assert recorder.events == [("accepted", rid), ("first_token", rid), ("tokens 1", rid), ("outcome completed", rid)]


def test_a_follower_requeues_a_request_failed_before_its_first_token_whatever_its_local_rule() -> None:
    """The leader decides retry or fail; the owner only waits for its next grant (or its Fail)."""
    h = Harness(cap=4, model={"failover_attempts": 0})
    recorder = Recorder()
    h.dispatcher.cluster.observe(recorder)
    ticket = h.submit("bob")
    h.dispatch()
    assert not h.events.fail_over(ticket, BackendUnavailable("down")), "deciding alone: no attempts left"
    h.dispatcher.cluster.steer(Follows())
    assert h.events.fail_over(ticket, BackendUnavailable("down"))
    assert ticket.state is TicketState.QUEUED and ("failed_over", ticket.request.request_id) in recorder.events
    assert h.handle.estimator.in_flight == 0


def test_end_queued_ends_a_queued_request_with_the_given_error() -> None:
    h = Harness(cap=0)
    ticket = h.submit("alice")
    assert h.dispatcher.cluster.end_queued(ticket.request.request_id, Outcome.REJECTED, BackendUnavailable("no"))
    assert ticket.outcome is Outcome.REJECTED and h.queued() == 0
    assert not h.dispatcher.cluster.end_queued(ticket.request.request_id, Outcome.REJECTED, BackendUnavailable("no"))
