"""The Grafana dashboard queries only what a live scheduler exports: every metric name in its PromQL is a
family on /metrics, every label it groups or filters by is one of that family's labels, and the gate's
closing reasons it documents are the fixed set the scheduler uses."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from scheduler_svc.dispatch.metrics import GATE_CLOSE_CAUSES, SchedulerMetrics
from tests.helpers import ControlledEngine, client_for, make_config, serving

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "llm-scheduler.json"
_METRIC = re.compile(r"\bllmsched_[a-z_]+\b")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_MATCHERS = re.compile(r"\{([^}]*)\}")
_LABEL_VALUES = re.compile(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)")


def _queries(dashboard: dict[str, Any]) -> list[str]:
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["definition"])
    return queries


def _exposed_samples() -> dict[str, set[str]]:
    """Sample name (as PromQL sees it: counters with _total, histograms' _bucket/_sum/_count) -> its labels."""
    samples: dict[str, set[str]] = {}
    for metric in vars(SchedulerMetrics()).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        name, labels = metric._name, set(metric._labelnames)
        if isinstance(metric, Counter):
            samples[f"{name}_total"] = labels
        elif isinstance(metric, Histogram):
            samples.update({f"{name}_bucket": labels | {"le"}, f"{name}_sum": labels, f"{name}_count": labels})
        elif isinstance(metric, Gauge):
            samples[name] = labels
    return samples


async def test_every_metric_and_label_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = _queries(dashboard)
    assert len(queries) >= 15
    engine = ControlledEngine(tokens=2, auto_release=True)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        await client.submit("m", "hello")
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            text = await response.text()
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))
    samples = _exposed_samples()
    for query in queries:
        names = set(_METRIC.findall(query))
        assert names, f"a query of no scheduler metric: {query}"
        for name in names:
            assert name in samples, f"{name} is not a sample the scheduler exports ({query})"
            family = re.sub(r"_(bucket|sum|count)$", "", name)  # a counter's TYPE line keeps its _total
            assert family in families, f"{family} is not on a live scheduler's /metrics"
        allowed = set.union(*(samples[n] for n in names))
        used = {label.strip() for group in _GROUPING.findall(query) for label in group.split(",") if label.strip()}
        used |= {m.split("=")[0].strip().rstrip("!~") for group in _MATCHERS.findall(query) for m in group.split(",")}
        used |= {label for _, label in _LABEL_VALUES.findall(query)}
        assert used <= allowed, f"labels {used - allowed} not on {names} ({query})"


def test_the_dashboard_documents_the_fixed_set_of_gate_reasons() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    (panel,) = [p for p in dashboard["panels"] if p["title"] == "Gate closed, by reason"]
    listed = panel["description"].split("one of: ", 1)[1].rstrip(".").split(", ")
    assert listed == [cause.value for cause in GATE_CLOSE_CAUSES]
