"""A user's first config names only the model and its engine; what depends on the engine is derived from it.

Here the config is a priority vLLM with nothing else said: the service must then run the recommended
settings (the defaults: VTC, the shipped classes), learn the engine's slots from its readings, and size the
queue a latecomer jumps at the priority engine from them (1.5 x the slots: 6 at 4), as configs/example.toml
used to state by hand. Until the slots are known the queue is `waiting_target` deep."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.base import BackendCapabilities, BackendLoad
from backends.fake import FakeBackend
from scheduler_svc.app.settings import load_config
from scheduler_svc.config import DEFAULT_CLASSES, Config, GateConfig, derived
from scheduler_svc.core.clock import FakeClock
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.scheduler import Scheduler
from tests.unit.dispatch_harness import never_generates

MINIMAL = """
[[models]]
name = "m"

[[models.backends]]
name = "vllm-0"
kind = "vllm"
url = "http://127.0.0.1:8000"
priority_scheduling = true
"""


@pytest.fixture
def minimal(tmp_path: Path) -> Config:
    path = tmp_path / "first.toml"
    path.write_text(MINIMAL)
    return load_config(path)


def reading(at: float, running: int, waiting: int) -> BackendLoad:
    """A fast engine's reading: 5 ms per output token (under the interactive class's TPOT limit), KV to spare."""
    return BackendLoad(ok=True, read_at=at, running=running, waiting=waiting, kv_cache_usage=0.2, tpot_seconds=0.005)


def _handle(config: Config) -> BackendHandle:
    capabilities = BackendCapabilities(supports_priority=True, has_tpot=True, has_kv_usage=True)
    scheduler = Scheduler(
        config,
        backend_factory=lambda _model, b: FakeBackend(never_generates, name=b.name, capabilities=capabilities),
        clock=FakeClock(),
    )
    (handle,) = scheduler.dispatchers["m"].backends
    return handle


def test_a_minimal_config_runs_the_recommended_settings(minimal: Config) -> None:
    assert minimal.scheduling.fairness == "vtc"
    assert minimal.scheduling.classes == DEFAULT_CLASSES
    (backend,) = minimal.models[0].backends
    assert backend.max_num_seqs == 0 and backend.learn_max_num_seqs
    assert minimal.models[0].gate.priority_waiting_target == 0  # derived
    assert derived.http_body_limit(minimal) == 2 * minimal.models[0].max_prompt_bytes + derived.BODY_MARGIN_BYTES


def test_the_priority_waiting_target_follows_the_slots(minimal: Config) -> None:
    gate = minimal.models[0].gate
    assert derived.priority_waiting_target(gate, 0) == gate.waiting_target == 3  # slots unknown
    assert derived.priority_waiting_target(gate, 4) == 6
    assert derived.priority_waiting_target(gate, 5) == 8  # rounded up
    assert derived.priority_waiting_target(gate, 1) == 3  # never below waiting_target
    assert derived.priority_waiting_target(gate, 256) == 384
    assert derived.priority_waiting_target(GateConfig(priority_waiting_target=5), 64) == 5  # configured wins


def test_a_minimal_config_learns_the_slots_and_deepens_the_queue_latecomers_jump(minimal: Config) -> None:
    handle = _handle(minimal)
    estimator, interactive = handle.estimator, minimal.scheduling.classes[0]

    def decide(now: float, priority: int) -> tuple[bool, str]:
        decision = handle.gate.decide(estimator.gate_inputs(now, candidate_priority=priority), interactive)
        return decision.open, decision.reason

    # a flood of one user: four running, then three more sent (its nth request carries priority n)
    for i in range(4):
        estimator.dispatched(f"a{i}", engine_priority=i, user="a")
        estimator.accepted(f"a{i}", 0.01)
        estimator.started(f"a{i}", 0.1)
    handle.record_reading(
        BackendLoad(ok=True, read_at=0.2, running=4, waiting=0, kv_cache_usage=0.2, tpot_seconds=0.005)
    )
    for i in range(4, 7):
        estimator.dispatched(f"a{i}", engine_priority=i, user="a")
        estimator.accepted(f"a{i}", 0.26)
    assert estimator.engine_slots == 0, "never saturated yet: the slots are unknown"
    is_open, reason = decide(0.3, priority=7)
    assert not is_open and "target 3" in reason
    assert decide(0.3, priority=0)[0], "a latecomer jumps the queue"

    # the engine shows the three waiting beside four running: it has 4 slots, and the queue may hold 6
    handle.record_reading(
        BackendLoad(ok=True, read_at=0.4, running=4, waiting=3, kv_cache_usage=0.2, tpot_seconds=0.005)
    )
    assert estimator.engine_slots == 4
    for i in range(7, 10):
        assert decide(0.45, priority=i)[0], f"the flood's request {i} goes: {i - 4} ahead of it, under 6"
        estimator.dispatched(f"a{i}", engine_priority=i, user="a")
    is_open, reason = decide(0.45, priority=10)
    assert not is_open and "target 6" in reason
    assert decide(0.45, priority=0)[0], "a latecomer still jumps it"


def test_configured_slots_are_not_learned_over(tmp_path: Path) -> None:
    path = tmp_path / "slots.toml"
    path.write_text(MINIMAL + "max_num_seqs = 8\n")
    handle = _handle(load_config(path))
    handle.record_reading(reading(at=0.2, running=5, waiting=3))
    assert handle.estimator.engine_slots == 8
