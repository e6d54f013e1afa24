"""Internal errors are counted every time and logged once per distinct error; loop health verdicts."""

from __future__ import annotations

from structlog.testing import capture_logs

from scheduler_svc.dispatch.health import InternalErrors, LoopHealth, ServiceHealth


def _raise(kind: type[Exception]) -> Exception:
    try:
        raise kind("boom")
    except Exception as exc:
        return exc


def test_each_distinct_error_is_logged_once_with_its_traceback_and_counted_every_time() -> None:
    counted: list[str] = []
    errors = InternalErrors(counted.append)
    with capture_logs() as logs:
        for _ in range(3):
            errors.report("dispatch", _raise(RuntimeError), model="m")
        errors.report("dispatch", _raise(KeyError), model="m")
    assert counted == ["dispatch"] * 4
    full = [entry for entry in logs if entry["event"] == "internal_error"]
    assert [type(entry["exc_info"]).__name__ for entry in full] == ["RuntimeError", "KeyError"]  # repeats: debug only


def test_failed_passes_in_a_row_turn_unhealthy_and_one_good_pass_recovers() -> None:
    health = ServiceHealth()
    loop = LoopHealth("dispatch:m", health, max_failed_passes=3, max_stall_seconds=0)
    for _ in range(2):
        loop.pass_done(ok=False)
    assert health.serving
    loop.pass_done(ok=False)
    assert not health.serving and health.changed.is_set()
    health.changed.clear()
    loop.pass_done(ok=True)
    assert health.serving and health.changed.is_set()


def test_a_stall_counts_only_while_work_could_go_and_nothing_went() -> None:
    health = ServiceHealth()
    loop = LoopHealth("dispatch:m", health, max_failed_passes=3, max_stall_seconds=10)
    loop.observe(0.0, could_dispatch=True, dispatched_since_last=False)
    loop.observe(9.0, could_dispatch=True, dispatched_since_last=False)
    assert health.serving
    loop.observe(10.0, could_dispatch=False, dispatched_since_last=False)  # gates closed: not a stall
    loop.observe(19.0, could_dispatch=True, dispatched_since_last=False)
    assert health.serving
    loop.observe(29.0, could_dispatch=True, dispatched_since_last=False)
    assert health.problems == {"dispatch:m:stall": "no dispatch for 10s with work ready"}
    loop.observe(30.0, could_dispatch=True, dispatched_since_last=True)
    assert health.serving
