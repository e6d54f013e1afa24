"""The HTTP door's memory under a crowd of slow and stalled request bodies, in a service process of its own.

100 callers (each its own identity, so only the bound for all callers holds them) announce a 2.3 MB body
and send 2 MB of it, then stall; 100 more trickle theirs at 1 KB per 100 ms. With the default bounds
(`server.http_max_reading_bytes`: 16 bodies' worth past each body's first 64 KiB) the service's RSS grows
by a few tens of MB, not by the 230 MB the bodies would take, ordinary calls of other callers are served
while the crowd holds on, and once `http_body_timeout_seconds` passes every crowd connection has its answer
(408, or 503 for those refused on the way). Unbounded, the same crowd took a service from 68 MB to 456 MB.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter

import aiohttp
import pytest

from tests.http.support import chat, child_service

STALLED = SLOW = 100
ANNOUNCED = 2_300_000  # under the default body limit (2 x 1 MiB prompt + 256 KiB)
SENT = 2_000_000
BODY_TIMEOUT = 6.0
CHUNK = 64 * 1024
# Bound on the RSS growth: the bound for all callers (16 bodies of the default 2.25 MiB limit), each open
# body's first 64 KiB, what the transport reads ahead of aiohttp's pause (uvloop hands over up to 256 KiB
# at a time), and 20 MB for everything else (connections, tasks, allocator); far under the bodies' 230 MB.
RSS_BOUND = 16 * 2_359_296 + (STALLED + SLOW) * (64 + 256) * 1024 + 20 * 2**20


async def _crowd_member(address: str, user: str, slow: bool, answers: Counter[str]) -> None:
    """Announce a body and stall after most of it (or trickle it); read the answer when it comes."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-user-id: {user}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {ANNOUNCED}\r\n\r\n"
    )
    try:
        writer.write(head.encode())
        sent = 0
        with contextlib.suppress(ConnectionError, TimeoutError):
            while sent < SENT:
                part = 1024 if slow else CHUNK
                writer.write(b"x" * part)
                sent += part
                async with asyncio.timeout(0.5):  # a server that stopped reading: the body stalls here
                    await writer.drain()
                if slow:
                    await asyncio.sleep(0.1)  # the trickle itself
                if reader.at_eof() or reader._buffer:  # type: ignore[attr-defined]  # answered early
                    break
        async with asyncio.timeout(BODY_TIMEOUT + 10):
            raw = await reader.read()
        status = raw.split(b" ", 2)[1].decode() if raw.startswith(b"HTTP/1.1") else "closed"
        code = json.loads(raw.partition(b"\r\n\r\n")[2])["error"]["code"] if raw.startswith(b"HTTP/1.1") else ""
        answers[f"{status} {code}".strip()] += 1
    except ConnectionError:
        answers["reset"] += 1
    finally:
        writer.close()


@pytest.mark.timeout(120)
async def test_slow_and_stalled_bodies_hold_bounded_memory_and_others_are_served() -> None:
    with child_service(
        {"http_body_timeout_seconds": BODY_TIMEOUT, "http_header_timeout_seconds": BODY_TIMEOUT}
    ) as service:
        base = f"http://{service.http_address}"
        async with aiohttp.ClientSession() as session:

            async def ordinary(user: str) -> int:
                async with session.post(
                    base + "/v1/chat/completions", json=chat(max_tokens=2), headers={"x-user-id": user}
                ) as response:
                    await response.read()
                    return response.status

            assert [await ordinary("alice") for _ in range(5)] == [200] * 5  # warm
            await asyncio.sleep(0.5)
            idle = service.rss_bytes()
            answers: Counter[str] = Counter()
            crowd = [
                asyncio.create_task(_crowd_member(service.http_address, f"stall-{i}", False, answers))
                for i in range(STALLED)
            ]
            crowd += [
                asyncio.create_task(_crowd_member(service.http_address, f"slow-{i}", True, answers))
                for i in range(SLOW)
            ]
            peak = idle
            start = time.monotonic()
            served: list[int] = []
            while time.monotonic() - start < BODY_TIMEOUT - 1.5:  # the crowd holds on
                await asyncio.sleep(0.1)  # an RSS sampling period
                peak = max(peak, service.rss_bytes())
                if time.monotonic() - start > 2.0 and len(served) < 20:
                    served += [await ordinary("bob"), await ordinary("carol")]
            async with asyncio.timeout(BODY_TIMEOUT + 20):
                await asyncio.gather(*crowd)
            peak = max(peak, service.rss_bytes())
            after = [await ordinary("alice") for _ in range(3)]
    growth = peak - idle
    print(
        f"HTTP door memory: idle {idle / 2**20:.1f} MB, peak {peak / 2**20:.1f} MB (+{growth / 2**20:.1f} MB) under "
        f"{STALLED} stalled and {SLOW} slow {ANNOUNCED / 1e6:.1f} MB bodies; bound {RSS_BOUND / 2**20:.1f} MB; "
        f"crowd answers {dict(answers)}; ordinary calls meanwhile {Counter(served)}"
    )
    assert growth <= RSS_BOUND, f"RSS grew {growth / 2**20:.1f} MB\n{service.server_log()}"
    assert served and set(served) == {200}, served
    assert after == [200] * 3
    assert sum(answers.values()) == STALLED + SLOW
    assert set(answers) <= {"408 read_timeout", "503 read_capacity_full"}, answers
    assert answers["408 read_timeout"] >= SLOW  # held to the timeout: the trickles, and stalled ones in the bound
