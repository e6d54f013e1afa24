"""Helpers every scenario uses: running its modes in turn, and formatting figures for the tables."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from bench.configs import NotAvailable
from bench.engines import EngineProvider
from bench.runner import Mode, RunContext, open_run

T = TypeVar("T")

STANDARD_CLASS = [{"name": "standard", "rank": 0}]  # one band, no TPOT/KV limits: fairness alone decides


async def run_modes(
    provider: EngineProvider,
    modes: Sequence[Mode],
    body: Callable[[RunContext], Awaitable[T]],
    *,
    timeout: float,
    scheduler_wrapper: Sequence[str] = (),
) -> tuple[dict[str, T], dict[str, str]]:
    """Run `body` once per mode; returns (label -> result, label -> why it could not run)."""
    done: dict[str, T] = {}
    skipped: dict[str, str] = {}
    for mode in modes:
        try:
            mode.check_available()
        except NotAvailable as exc:
            skipped[mode.label] = str(exc)
            print(f"  {mode.label}: not available: {exc}", file=sys.stderr)
            continue
        started = time.monotonic()
        print(f"  {mode.label} ...", flush=True)
        try:
            async with open_run(provider, mode, scheduler_wrapper=scheduler_wrapper) as run:
                done[mode.label] = await _bounded(body(run), timeout)
        except TimeoutError:
            skipped[mode.label] = f"did not finish within {timeout:.0f}s"
        except (RuntimeError, OSError, NotAvailable) as exc:  # one failed run must not lose the others
            skipped[mode.label] = f"failed: {exc}"
            print(f"  {mode.label}: failed: {exc!r}", file=sys.stderr)
        print(f"  {mode.label}: {time.monotonic() - started:.1f}s", flush=True)
    return done, skipped


async def _bounded(awaitable: Awaitable[T], timeout: float) -> T:
    async with asyncio.timeout(timeout):
        return await awaitable


def seconds(value: float | None) -> str:
    """A duration: ms under one second, else seconds."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def ms(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value * 1000:.{digits}f} ms"


def number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def ratio(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def divide(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def not_run(skipped: dict[str, str]) -> list[str]:
    """Notes for modes that could not run."""
    return [f"{label}: not available ({why})" for label, why in skipped.items()]


def jsonable(value: Any) -> Any:
    """Round floats so the JSON file stays readable."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


async def measuring_window(run: RunContext, warmup: float, window: float, timeout: float) -> tuple[float, float, float]:
    """Wait for the first token, then `warmup`, then measure for `window` seconds.

    Returns (start, end, engine output tokens/s over the window). Starting from the first token keeps a
    slow start-up on a busy machine from eating into the warm-up.
    """
    if not await run.until(lambda: any(r.first_token is not None for r in run.records), timeout):
        raise TimeoutError("no token within the timeout")
    await asyncio.sleep(warmup)  # let the batch composition settle
    start, before = await run.probe.generated_tokens()
    await asyncio.sleep(window)  # the measuring window itself
    end, after = await run.probe.generated_tokens()
    return start, end, (after - before) / (end - start)
