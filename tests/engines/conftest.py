"""Pytest fixtures for REAL inference engines, started through the `engines` package.

Session-scoped fixtures, each yielding a started :class:`EngineProcess` (``.url``, ``.port``,
``.served_model_name``, ``.metrics_text()`` sync / ``await .ametrics_text()`` async, ``.kill()``,
``.restart()`` sync / ``await .arestart()`` async, ``.log_path``):

* ``vllm_engine``           vLLM CPU, ``--scheduling-policy fcfs``, 4 sequences, model "tiny-llama"
* ``vllm_priority_engine``  vLLM CPU, ``--scheduling-policy priority``, model "tiny-llama-prio"
* ``llamacpp_engine``       llama-server, 4 slots (``-np 4``), ``--metrics``, model "tiny-llama-gguf"

The vLLM engines run laid out like a GPU host (``engines.layout``: engine core and worker on core 1, the
HTTP front end on core 0, where the tests' scheduler and clients run too), as the product is deployed and
the bench measures. Sharing both cores with its own compute, vLLM's front end read the engine's outputs
and answered /metrics only once the engine had drained, so a flood's every sample read 0 running (a
fresh-clone CI, three times). ``LLMSCHED_ENGINE_LAYOUT=shared`` runs them unpinned instead; a machine
without two cores runs them unpinned anyway. llama-server runs one compute thread (``--threads 1``) and is
not pinned.

An engine that is not installed makes the fixture FAIL with the install command. Set
``LLMSCHED_SKIP_ENGINES=1`` to skip every test marked ``engines`` instead. Tests marked
``engines`` get a default timeout of ``ENGINE_TEST_TIMEOUT`` seconds (600; the fixture start-up,
about 40-60 s for vLLM, counts against the test that first uses it) unless they set their own.
After each test in this directory, an engine that the test killed and left dead is restarted.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from engines import (  # noqa: E402
    EngineError,
    EngineProcess,
    layout,
    llamacpp_missing_reason,
    llamacpp_process,
    vllm_missing_reason,
    vllm_process,
)

SKIP_ENV = "LLMSCHED_SKIP_ENGINES"
LAYOUT_ENV = "LLMSCHED_ENGINE_LAYOUT"
ENGINE_TEST_TIMEOUT = int(os.environ.get("ENGINE_TEST_TIMEOUT", "600"))

_started: list[EngineProcess] = []


def engines_skipped() -> bool:
    """True when LLMSCHED_SKIP_ENGINES asks to skip real-engine tests."""
    return os.environ.get(SKIP_ENV, "").strip().lower() in {"1", "true", "yes"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``engines`` tests when asked to; give them a generous default timeout otherwise."""
    skip = pytest.mark.skip(reason=f"{SKIP_ENV}=1: real inference engines skipped")
    for item in items:
        if item.get_closest_marker("engines") is None:
            continue
        if engines_skipped():
            item.add_marker(skip)
        elif item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(ENGINE_TEST_TIMEOUT))


def _engine_fixture(
    missing_reason: Callable[[], str | None], build: Callable[[], EngineProcess]
) -> Iterator[EngineProcess]:
    """Start an engine for the session, failing (never silently skipping) if it is not installed."""
    if engines_skipped():
        pytest.skip(f"{SKIP_ENV}=1: real inference engines skipped")
    reason = missing_reason()
    if reason:
        pytest.fail(reason, pytrace=False)
    try:
        eng = build().start()
    except EngineError as e:
        pytest.fail(str(e), pytrace=False)
    _started.append(eng)
    try:
        yield eng
    finally:
        _started.remove(eng)
        eng.stop()


def laid_out(process: EngineProcess) -> EngineProcess:
    """A vLLM engine in the layout LLMSCHED_ENGINE_LAYOUT names (default ``gpu_host``), where this machine
    has the cores for it."""
    name = os.environ.get(LAYOUT_ENV, "").strip() or "gpu_host"
    if name not in layout.LAYOUTS:
        raise pytest.UsageError(f"{LAYOUT_ENV}={name!r}: not a layout; one of {', '.join(sorted(layout.LAYOUTS))}")
    chosen = layout.LAYOUTS[name]
    return layout.lay_out(process, chosen) if layout.available(chosen) is None else process


@pytest.fixture(scope="session")
def vllm_engine() -> Iterator[EngineProcess]:
    """vLLM (CPU) with the default FCFS scheduler, 4 concurrent sequences."""
    yield from _engine_fixture(vllm_missing_reason, lambda: laid_out(vllm_process(scheduling_policy="fcfs")))


@pytest.fixture(scope="session")
def vllm_priority_engine() -> Iterator[EngineProcess]:
    """vLLM (CPU) with ``--scheduling-policy priority`` (lower ``priority`` value runs first)."""
    yield from _engine_fixture(
        vllm_missing_reason,
        lambda: laid_out(vllm_process(scheduling_policy="priority", served_model_name="tiny-llama-prio")),
    )


@pytest.fixture(scope="session")
def llamacpp_engine() -> Iterator[EngineProcess]:
    """llama.cpp ``llama-server`` with 4 slots, continuous batching and /metrics."""
    yield from _engine_fixture(llamacpp_missing_reason, lambda: llamacpp_process(slots=4))


@pytest.fixture(autouse=True)
def _revive_killed_engines() -> Iterator[None]:
    """After each test here, restart any session engine that the test killed and left dead."""
    yield
    for eng in list(_started):
        if not eng.is_running():
            eng.restart()
