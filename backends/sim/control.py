"""Routes outside the engine API: `/metrics`, and the test hooks `/sim/faults` and `/sim/stats`.

GET    /sim/faults   -> the current faults
POST   /sim/faults   -> set the keys given (others unchanged); 400 on unknown keys or bad values
DELETE /sim/faults   -> switch every fault off
GET    /sim/stats    -> the engine's counters and the order requests were admitted in
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import structlog
from aiohttp import web

from backends.sim.engine import SimEngine
from backends.sim.faults import Faults
from backends.sim.metrics import CONTENT_TYPE, MetricsExporter
from backends.sim.streaming import dumps

log = structlog.get_logger(__name__)


def _json(payload: object, status: int = 200) -> web.Response:
    return web.Response(text=dumps(payload), status=status, content_type="application/json")


class ControlApi:
    """Metrics, fault injection and stats for one simulator."""

    def __init__(
        self, engine: SimEngine, faults: Faults, metrics: MetricsExporter, *, selecting_mount: bool = False
    ) -> None:
        self._engine = engine
        self._faults = faults
        self._metrics = metrics
        self._selecting_mount = selecting_mount

    def add_routes(self, app: web.Application) -> None:
        """Register the routes on `app`."""
        app.router.add_get("/metrics", self.metrics)
        if self._selecting_mount:  # as vLLM: prometheus-client's exposition app mounted under /metrics/
            app.router.add_get("/metrics/", self.selected_metrics)
        app.router.add_get("/sim/faults", self.get_faults)
        app.router.add_post("/sim/faults", self.set_faults)
        app.router.add_delete("/sim/faults", self.clear_faults)
        app.router.add_get("/sim/stats", self.stats)

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text, or 503 while the `metrics_down` fault is on."""
        return self._scrape(())

    async def selected_metrics(self, request: web.Request) -> web.Response:
        """vLLM's `/metrics/` mount: Prometheus' `name[]` selection (`?name[]=a&name[]=b`: only those
        samples; none given: everything), which its bare `/metrics` route ignores."""
        return self._scrape(request.query.getall("name[]", []))

    def _scrape(self, names: Collection[str]) -> web.Response:
        if self._faults.metrics_down:
            return web.Response(status=503, text="metrics unavailable (fault injection)")
        body = self._metrics.render(self._engine.snapshot(), names)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def get_faults(self, request: web.Request) -> web.Response:
        """The current faults."""
        return _json(self._faults.to_json())

    async def set_faults(self, request: web.Request) -> web.Response:
        """Merge the posted faults into the current ones."""
        try:
            body = await request.json()
        except ValueError as exc:
            return _json({"error": f"invalid JSON: {exc}"}, 400)
        if not isinstance(body, Mapping):
            return _json({"error": "body must be a JSON object"}, 400)
        try:
            self._faults.update(body)
        except ValueError as exc:
            return _json({"error": str(exc)}, 400)
        log.info("sim.faults_set", **self._faults.to_json())
        return _json(self._faults.to_json())

    async def clear_faults(self, request: web.Request) -> web.Response:
        """Switch every fault off."""
        self._faults.clear()
        log.info("sim.faults_cleared")
        return _json(self._faults.to_json())

    async def stats(self, request: web.Request) -> web.Response:
        """The engine's counters, for tests."""
        return _json(self._engine.stats())
