"""A real `redis-server` for tests: its own port and data directory, no persistence, and the failures the
cluster must survive (stopped, killed, hung, restarted empty on the same port).

Use the `redis_server` fixture (function scope: a fresh server per test, stopped after it):

    async def test_x(redis_server: RedisServer) -> None:
        store = RedisStore(redis_server.url)
        redis_server.kill()            # kill -9: connections drop, nothing answers
        redis_server.restart_empty()   # same port, nothing in it (as after a restart without persistence)
        redis_server.pause(); redis_server.resume()   # SIGSTOP / SIGCONT: a hung server

or `RedisServer.started()` outside pytest (processes, scripts). Without `redis-server` on PATH the fixture
skips, unless LLMSCHED_REQUIRE_REDIS=1 (set by `make test`, after `make redis` installed it): then it fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines import free_port

READY_SECONDS = 10.0


def dies_with_parent(argv: list[str]) -> list[str]:
    """`argv` run so that the child gets SIGKILL when the test process dies without cleanup (Linux: util-linux
    `setpriv --pdeathsig`, which execs the program: same pid). Not a `preexec_fn`: Python code run between
    fork and exec in a process with gRPC threads (a test's clients) now and then crashes the child (SIGSEGV)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", *argv] if setpriv else argv


def redis_server_binary() -> str:
    """The redis-server to run; skips the test without one (fails under LLMSCHED_REQUIRE_REDIS=1)."""
    found = shutil.which("redis-server")
    if found is None:
        message = "redis-server is not installed (`make redis` installs Debian's package)"
        if os.environ.get("LLMSCHED_REQUIRE_REDIS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


class RedisServer:
    """One redis-server process on 127.0.0.1:`port` with its data directory under `root`."""

    def __init__(self, binary: str, root: Path, port: int | None = None) -> None:
        self.binary = binary
        self.root = root
        self.port = port if port is not None else free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def started(cls, binary: str | None = None, port: int | None = None) -> RedisServer:
        server = cls(binary or redis_server_binary(), Path(tempfile.mkdtemp(prefix="llmsched-redis-")), port)
        server.start()
        return server

    def start(self) -> None:
        """Start on `port` with an empty data directory and wait until it answers PING."""
        assert self.process is None or self.process.poll() is not None, "already running"
        self.starts += 1
        data = self.root / f"data-{self.starts}"
        data.mkdir(parents=True)
        log = (self.root / f"redis-{self.starts}.log").open("wb")
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(data)]
        argv += ["--save", "", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no"]
        self.process = subprocess.Popen(dies_with_parent(argv), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {self.log_tail()}")
            if self.ping():
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING in {READY_SECONDS}s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def log_tail(self) -> str:
        logs = sorted(self.root.glob("redis-*.log"))
        return logs[-1].read_text(errors="replace")[-2000:] if logs else ""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _signal(self, sig: signal.Signals) -> None:
        if self.running:
            assert self.process is not None
            self.process.send_signal(sig)

    def stop(self) -> None:
        """Clean shutdown (SIGTERM; nothing is saved)."""
        self.resume()
        self._signal(signal.SIGTERM)
        self._reap()

    def kill(self) -> None:
        """kill -9: the server vanishes mid-conversation."""
        self._signal(signal.SIGKILL)
        self._reap()

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing answers (a hung server)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def restart_empty(self) -> None:
        """kill -9 (when running), then start again on the same port with nothing in it."""
        self.kill()
        self.start()

    def _reap(self) -> None:
        if self.process is not None:
            try:
                self.process.wait(timeout=READY_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a free port for one test (see the module docstring)."""
    server = RedisServer(redis_server_binary(), tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.kill()
