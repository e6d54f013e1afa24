"""The simulator's journal: one line per request event, and nothing lost when the process is SIGKILLed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from backends.sim import running_simulator
from backends.sim.journal import read_journal
from engines import free_port
from tests.helpers import eventually
from tests.sim.support import fast_config

ROOT = Path(__file__).resolve().parents[2]


def _events(lines: list[dict[str, Any]], request_id: str) -> list[str]:
    return [line["event"] for line in lines if line.get("id") == request_id]


async def _complete(session: aiohttp.ClientSession, url: str, request_id: str, prompt: str, tokens: int) -> None:
    body = {"prompt": prompt, "max_tokens": tokens, "ignore_eos": True}
    async with session.post(url + "/v1/completions", json=body, headers={"X-Request-Id": request_id}) as response:
        assert response.status == 200
        await response.read()


async def test_journal_records_completed_aborted_failed_and_refused(
    session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    path = tmp_path / "journal.jsonl"
    async with running_simulator(fast_config(journal=str(path), max_model_len=64)) as sim:
        await _complete(session, sim.url, "done-1", "tag-done\nthe rest of the prompt", 4)

        # A streamed request whose client leaves after its first token: the engine aborts it.
        body = {"prompt": "tag-gone", "max_tokens": 50, "stream": True, "ignore_eos": True}
        async with session.post(sim.url + "/v1/completions", json=body, headers={"X-Request-Id": "gone-1"}) as response:
            await response.content.readline()
        await eventually(lambda: "aborted" in _events(read_journal(path), "gone-1"), what="abort journaled")

        # An injected stream error ends the request as failed; an oversized one is refused before the engine.
        async with session.post(sim.url + "/sim/faults", json={"stream_error_after_tokens": 1}) as response:
            assert response.status == 200
        body = {"prompt": "tag-fail", "max_tokens": 5, "stream": True, "ignore_eos": True}
        async with session.post(sim.url + "/v1/completions", json=body, headers={"X-Request-Id": "fail-1"}) as r:
            await r.read()
        async with session.post(
            sim.url + "/v1/completions", json={"prompt": "tag-big " + "x " * 100}, headers={"X-Request-Id": "big-1"}
        ) as response:
            assert response.status == 400

    lines = read_journal(path)
    assert lines[0]["event"] == "boot" and lines[0]["pid"] == os.getpid()
    assert _events(lines, "done-1") == ["received", "started", "first_token", "finished"]
    received = next(line for line in lines if line.get("id") == "done-1")
    assert received["tag"] == "tag-done" and received["x_request_id"] == "done-1"
    assert received["prompt_bytes"] == len(b"tag-done\nthe rest of the prompt")
    finished = next(line for line in lines if line.get("id") == "done-1" and line["event"] == "finished")
    assert finished["tokens"] == 4 and finished["reason"] == "length"

    assert _events(lines, "gone-1") == ["received", "started", "first_token", "aborted"]
    aborted = [line for line in lines if line.get("id") == "gone-1"][-1]
    assert aborted["started"] is True and aborted["reason"] == "client disconnected"

    assert _events(lines, "fail-1")[-1] == "failed"
    refused = [line for line in lines if line["event"] == "refused"]
    assert [(r["x_request_id"], r["status"], r["tag"][:7]) for r in refused] == [("big-1", 400, "tag-big")]


def _spawn_sim(port: int, journal: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "scheduler_svc.app.cli", "sim", "--port", str(port), "--journal", str(journal),
        "--decode-base-ms", "2", "--decode-per-seq-ms", "0", "--prefill-per-token-ms", "0",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _wait_healthy(session: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes]) -> None:
    async def healthy() -> bool:
        assert proc.poll() is None, "the simulator exited"
        try:
            async with session.get(url + "/health") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    await eventually(healthy, timeout=60.0, what="simulator up")


async def test_journal_survives_sigkill_and_a_restart_appends(session: aiohttp.ClientSession, tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _spawn_sim(port, path)
    try:
        await _wait_healthy(session, url, proc)
        await asyncio.gather(*(_complete(session, url, f"req-{i}", f"tag-{i}", 3) for i in range(5)))
        # One request still running when the process dies: its received/started lines must be there.
        body = {"prompt": "tag-live", "max_tokens": 1000, "stream": True, "ignore_eos": True}
        live = await session.post(url + "/v1/completions", json=body, headers={"X-Request-Id": "live"})
        await live.content.readline()
        await eventually(lambda: "first_token" in _events(read_journal(path), "live"), what="live request started")
        async with session.get(url + "/sim/stats") as response:
            stats = await response.json()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        live.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    before = path.read_bytes()
    assert before.endswith(b"\n")
    lines = read_journal(path)
    assert [line["event"] for line in lines].count("boot") == 1
    assert sum(line["event"] == "finished" for line in lines) == stats["completed_total"] == 5
    for i in range(5):
        assert _events(lines, f"req-{i}") == ["received", "started", "first_token", "finished"]
    assert _events(lines, "live") == ["received", "started", "first_token"]  # killed: no end line

    proc = _spawn_sim(port, path)  # same port, same journal
    try:
        await _wait_healthy(session, url, proc)
        await _complete(session, url, "after", "tag-after", 2)
        restarted_pid = proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    after = path.read_bytes()
    assert after.startswith(before)
    new = read_journal(path)[len(lines) :]
    assert new[0]["event"] == "boot" and new[0]["pid"] == restarted_pid != lines[0]["pid"]
    assert _events(new, "after") == ["received", "started", "first_token", "finished"]
