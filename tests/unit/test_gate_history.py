"""The gate history a traced queue wait reads: only changes are kept, each class sees its own gates and the
better classes' it waits behind, and a wait longer than what is kept says how many changes it lost."""

from __future__ import annotations

from scheduler_svc.config import DEFAULT_CLASSES
from scheduler_svc.core.tracing import GateChange
from scheduler_svc.dispatch.gate_history import GateHistory
from scheduler_svc.policies import GateCause


def test_only_changes_are_kept_and_a_gate_first_seen_open_is_none() -> None:
    history = GateHistory(DEFAULT_CLASSES)
    interactive = history.log("interactive")
    mark = interactive.mark()
    history.saw("interactive", "b0", GateCause.OPEN, 1.0)
    history.saw("interactive", "b0", GateCause.TPOT, 2.0)
    history.saw("interactive", "b0", GateCause.TPOT, 3.0)
    assert interactive.closed() == [GateChange(2.0, "b0", "interactive", "tpot")]
    history.saw("interactive", "b0", GateCause.ENGINE_WAITING, 4.0)
    history.saw("interactive", "b0", GateCause.OPEN, 5.0)
    assert interactive.since(mark) == (
        [
            GateChange(2.0, "b0", "interactive", "tpot"),
            GateChange(4.0, "b0", "interactive", "engine_waiting"),
            GateChange(5.0, "b0", "interactive", "open"),
        ],
        0,
    )
    assert interactive.closed() == []


def test_a_class_sees_its_own_gates_and_the_better_classes() -> None:
    history = GateHistory(DEFAULT_CLASSES)  # interactive (rank 0), review (1), batch (2)
    marks = {name: history.log(name).mark() for name in ("interactive", "review", "batch")}
    history.saw("interactive", "b0", GateCause.KV_CACHE, 1.0)
    history.saw("batch", "b1", GateCause.ENGINE_RUNNING, 2.0)
    seen = {name: [c.priority_class for c in history.log(name).since(mark)[0]] for name, mark in marks.items()}
    assert seen == {"interactive": ["interactive"], "review": ["interactive"], "batch": ["interactive", "batch"]}
    assert [c.backend for c in history.log("batch").closed()] == ["b0", "b1"]
    assert history.log("review").closed() == [GateChange(1.0, "b0", "interactive", "kv_cache")]


def test_a_long_wait_is_told_how_many_changes_it_lost() -> None:
    history = GateHistory(DEFAULT_CLASSES, kept=4)
    log = history.log("interactive")
    mark = log.mark()
    for step in range(10):
        history.saw("interactive", "b0", GateCause.TPOT if step % 2 == 0 else GateCause.OPEN, float(step))
    changes, lost = log.since(mark)
    assert [c.at for c in changes] == [6.0, 7.0, 8.0, 9.0] and lost == 6
    assert log.since(log.mark()) == ([], 0)
