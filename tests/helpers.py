"""Shared test helpers: configs, a running service on port 0, and controllable fake engines."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import subprocess
import time
import tomllib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from backends.base import Backend, BackendLoad, Finished, GenerationEvent, GenerationRequest, TextDelta
from backends.fake import FakeBackend
from clients import SchedulerClient
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import BackendConfig, Config, ModelConfig

REPO_ROOT = Path(__file__).resolve().parents[1]


def client_label(engine_request_id: str) -> str:
    """The client's request_id inside the id an engine sees (`<client id>~<unique>`, or the bare unique id)."""
    return engine_request_id.split("~", 1)[0]


def example_config() -> dict[str, Any]:
    """The bundled example config (configs/example.toml, what `make run` serves on the simulator), as a dict."""
    return tomllib.loads((REPO_ROOT / "configs" / "example.toml").read_text())


def run_engine_config(engine: str) -> dict[str, Any]:
    """The scheduler config `make run ENGINE=vllm|llamacpp` writes (scripts/run_engine.py), as a dict."""
    spec = importlib.util.spec_from_file_location("run_engine", REPO_ROOT / "scripts" / "run_engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tomllib.loads(module.config_text(engine, "sim-model", 8000))


def make_config(
    *,
    models: list[dict[str, Any]] | None = None,
    backend_url: str = "http://127.0.0.1:1",
    kind: str = "vllm",
    gate: dict[str, Any] | None = None,
    scheduling: dict[str, Any] | None = None,
    auth: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    scrape_interval: float = 0.05,
    engine_model: str = "sim-model",
    backend: dict[str, Any] | None = None,
) -> Config:
    """A config on free ports with one model "m" and one backend "b0" (with `backend`'s fields) unless told
    otherwise."""
    raw: dict[str, Any] = {
        "server": {
            "listen": "127.0.0.1:0",
            "metrics_listen": "127.0.0.1:0",
            "queue_update_interval_seconds": 0.05,
            "shutdown_grace_seconds": 1.0,
            **(server or {}),
        },
        "models": models
        or [
            {
                "name": "m",
                "default_max_tokens": 16,
                "gate": gate or {},
                "backends": [
                    {
                        "name": "b0",
                        "kind": kind,
                        "url": backend_url,
                        "engine_model": engine_model,
                        "scrape_interval_seconds": scrape_interval,
                        **(backend or {}),
                    }
                ],
            }
        ],
    }
    if scheduling:
        raw["scheduling"] = scheduling
    if auth:
        raw["auth"] = auth
    return config_from_dict(raw)


@asynccontextmanager
async def serving(
    config: Config, backend_factory: Callable[[ModelConfig, BackendConfig], Backend] | None = None
) -> AsyncIterator[SchedulerServer]:
    """Run a SchedulerServer on real sockets for the duration of the block."""
    server = SchedulerServer(config, backend_factory=backend_factory) if backend_factory else SchedulerServer(config)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace=0.5)


def client_for(server: SchedulerServer, user: str | None = "alice", **kwargs: Any) -> SchedulerClient:
    return SchedulerClient(server.address, user=user, **kwargs)


@dataclass
class ControlledEngine:
    """A fake engine whose generations wait until the test releases them; it records aborts.

    `load` reports what the test sets in `waiting` (ok unless `metrics_ok` is False).
    """

    tokens: int = 3
    waiting: int = 0
    metrics_ok: bool = True
    auto_release: bool = False
    started: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    requests: list[GenerationRequest] = field(default_factory=list)
    concurrent: int = 0
    max_concurrent: int = 0
    _release: dict[str, asyncio.Event] = field(default_factory=dict)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def backend(self, name: str = "b0") -> FakeBackend:
        return FakeBackend(self._generate, self._load, name=name)

    def factory(self) -> Callable[[ModelConfig, BackendConfig], Backend]:
        return lambda model, backend: self.backend(backend.name)

    def _load(self) -> BackendLoad:
        return BackendLoad(ok=self.metrics_ok, read_at=time.monotonic(), waiting=self.waiting, running=self.concurrent)

    def release(self, request_id: str | None = None) -> None:
        """Let one (or every, when None) started generation finish."""
        for rid, event in self._release.items():
            if request_id is None or rid == request_id:
                event.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Block until `predicate()` holds after some engine event (no polling sleeps)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        rid = client_label(request.request_id)
        self.requests.append(request)
        self.started.append(rid)
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        release = self._release.setdefault(rid, asyncio.Event())
        if self.auto_release:
            release.set()
        await self._notify()
        try:
            yield TextDelta("hello")
            await release.wait()
            for i in range(1, self.tokens):
                yield TextDelta(f" t{i}")
            yield Finished("length", prompt_tokens=5, completion_tokens=self.tokens)
            self.finished.append(rid)
        except BaseException:
            self.aborted.append(rid)
            raise
        finally:
            self.concurrent -= 1
            asyncio.get_running_loop().create_task(self._notify())


async def until_settled(
    server: SchedulerServer, predicate: Callable[[], bool], model: str = "m", timeout: float = 10.0
) -> None:
    """Wait until `predicate()` holds, re-checking each time a request of `model` reaches its outcome.

    The check and the re-arm happen without yielding to the loop, so no outcome can slip in between.
    """
    dispatcher = server.scheduler.dispatchers[model]
    async with asyncio.timeout(timeout):
        while not predicate():
            await dispatcher.shutdown.wait_settled()


def queue_depth(server: SchedulerServer, user: str = "", model: str = "m") -> int:
    """Requests queued for `model` (only `user`'s when given, all classes together), as introspection shows."""
    snapshot = server.scheduler.snapshot(model, user, 1 << 30)
    if not user:
        return snapshot.queued
    return sum(u.queued for cls in snapshot.classes for u in cls.users)


def queued_users(server: SchedulerServer, model: str = "m") -> list[str]:
    """The users with requests queued for `model`, sorted."""
    snapshot = server.scheduler.snapshot(model, "", 1 << 30)
    return sorted({u.user for cls in snapshot.classes for u in cls.users if u.queued})


def outcome_count(server: SchedulerServer, outcome: str, model: str = "m") -> float:
    value = server.scheduler.metrics.registry.get_sample_value(
        "llmsched_request_outcomes_total", {"model": model, "outcome": outcome}
    )
    return value or 0.0


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout: float = 10.0,
    what: str = "condition",
    every: float = 0.01,
) -> None:
    """Poll state that offers no event to wait on (another process's or server's counters, a real engine's
    queue, a subprocess), with a hard deadline: the one polling helper of the tests. A predicate may be a
    coroutine function; `every` spaces the looks (a predicate that starts a process looks less often). Where
    the core's own state is waited for, an event (`until_settled`) or the fake clock does instead."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(every)


@dataclass
class ChildProcessService:
    """The service in a child process of a test, whose memory is its own; its stderr kept in `log`."""

    process: subprocess.Popen[str]
    log: IO[str]

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS for the service")

    def server_log(self) -> str:
        """What the service wrote to stderr (tracebacks of anything it did not handle)."""
        self.log.seek(0)
        return self.log.read()[-6000:]
