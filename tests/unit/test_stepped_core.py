"""The core on a stepped clock (`app.stepped.SteppedCore`): the service's own admission, queues, fairness and
gates, driven by a caller that plays the engines, with nothing run in the background."""

from __future__ import annotations

import pytest

from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.app.stepped import Refused, SteppedCore


def core(*, max_queued_per_user: int = 100) -> SteppedCore:
    raw = {
        "scheduling": {"fairness": "vtc"},
        "models": [
            {
                "name": "m",
                "max_queued_per_user": max_queued_per_user,
                "gate": {"policy": "signals", "waiting_target": 1},
                "backends": [{"name": "b0", "kind": "vllm", "url": "http://b0.invalid:8000", "max_num_seqs": 4}],
            }
        ],
    }
    return SteppedCore(config_from_dict(raw))


def test_nothing_goes_before_a_reading_then_the_gate_and_fairness_decide_who() -> None:
    stepped = core()
    heavy = [stepped.admit(model="m", user="heavy", prompt="x" * 40, max_tokens=8) for _ in range(4)]
    light = stepped.admit(model="m", user="light", prompt="y" * 40, max_tokens=8)
    stepped.reading("m", "b0", waiting=5, running=4)  # a full engine: the gate holds everything
    assert stepped.settle() == []
    stepped.advance_to(stepped.now() + 0.1)
    stepped.reading("m", "b0", waiting=0, running=0)
    sent = stepped.settle()
    assert sent and {s.request_id for s in sent} <= {*heavy, light}
    assert light in {s.request_id for s in sent[:2]}  # the light user is not behind the heavy one's backlog
    assert all(s.backend == "b0" and s.model == "m" for s in sent)


def test_a_finished_request_frees_its_place_and_admission_refuses_as_the_service_does() -> None:
    stepped = core(max_queued_per_user=1)
    first = stepped.admit(model="m", user="u", prompt="hello", max_tokens=4)
    with pytest.raises(Refused):
        stepped.admit(model="m", user="u", prompt="again", max_tokens=4)
    stepped.reading("m", "b0", waiting=0, running=0)
    assert [s.request_id for s in stepped.settle()] == [first]
    stepped.accepted(first)
    stepped.tokens(first, 4)
    stepped.finished(first)
    second = stepped.admit(model="m", user="u", prompt="again", max_tokens=4)
    assert [s.request_id for s in stepped.settle()] == [second]


def test_the_clock_moves_only_forward_and_only_when_told() -> None:
    stepped = core()
    start = stepped.now()
    stepped.advance_to(start + 5.0)
    stepped.advance_to(start + 1.0)
    assert stepped.now() == start + 5.0
    assert stepped.next_timer() is None
