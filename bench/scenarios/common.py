"""What the scenarios share when they turn their runs into a result: figures formatted for the tables, the
arithmetic of figures that may be missing, and a result's JSON-ready raw figures and plot series."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from bench.records import RequestRecord

Runs = Mapping[str, dict[str, Any]]  # a scenario's runs: label -> what its workload measured


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


def minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that were measured; None when none was."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def not_run(skipped: dict[str, str]) -> list[str]:
    """Notes for modes that could not run."""
    return [f"{label}: not available ({why})" for label, why in skipped.items()]


def errors(records: Iterable[RequestRecord]) -> list[str]:
    """The distinct errors of a run's requests, a cancel (the run ending them) aside."""
    return sorted({r.error for r in records if r.error and r.error != "cancelled"})


def jsonable(value: Any) -> Any:
    """Round floats so the JSON file stays readable."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def public(run: dict[str, Any]) -> dict[str, Any]:
    """A run's figures without its private parts (`_records`, `_engine`, ...: series material)."""
    return {k: v for k, v in run.items() if not k.startswith("_")}


def raw_figures(runs: Runs) -> dict[str, Any]:
    """Every run's public figures, rounded: a result's `raw`."""
    return {label: jsonable(public(r)) for label, r in runs.items()}


def with_requests(run: dict[str, Any]) -> dict[str, Any]:
    """A run's public figures and a summary of each of its requests (`_records`), rounded."""
    out = public(run)
    out["requests"] = [r.summary() for r in run["_records"] if isinstance(r, RequestRecord)]
    rounded: dict[str, Any] = jsonable(out)
    return rounded


def token_series(runs: Runs) -> dict[str, Any]:
    """The tokens-per-user plot's series: each run's cumulative tokens (`_cumulative`) and its window."""
    return {
        "step": 0.25,
        "windows": {label: r["window"] for label, r in runs.items()},
        "runs": {label: r["_cumulative"] for label, r in runs.items()},
    }


def ttft_series(runs: Runs, gate_target: int | None = None) -> dict[str, Any]:
    """The time-to-first-token and engine plots' series: each request's (sent, TTFT, user, tag) and the
    engine's samples (`_engine`); the gate's target where the scheduler runs with one."""
    series: dict[str, Any] = {} if gate_target is None else {"gate_target": gate_target}
    series["runs"] = {
        label: {"records": _ttfts(r["_records"]), "engine": jsonable(r["_engine"])} for label, r in runs.items()
    }
    return series


def _ttfts(records: Iterable[RequestRecord]) -> list[list[Any]]:
    return [[round(r.sent, 4), round(r.ttft, 4), r.user, r.tag] for r in records if r.ttft is not None]
