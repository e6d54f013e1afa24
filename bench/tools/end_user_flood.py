"""One caller's end user floods: are the caller's other end users, and the other callers, left alone?

Three tenants (callers) share one simulated engine (4 slots) through the scheduler's HTTP door: `t2` and `t3`
send FLOOD requests each, and so does acme's end user `flood` (the OpenAI `user` field); once all of them are
queued, acme's end users `bob` and `carol` each send SIBLING requests one after another. Three setups side by
side: the end users named (the flood and the siblings each name theirs), one queue (the same requests naming
none: acme is one queue, as before end users), and no flood (acme sends only the siblings' requests).

Every figure comes from the engine's own journal (`backends.sim.journal`: when each request reached it, started
and finished), on the clock the clients read:

- flood ahead: the flood's requests that reached the engine while a sibling's request waited;
- wait in decodes: a sibling request's wait from its send to the engine, in units of one flood request's
  decode (its mean time from start to finish in the engine); over no flood: the mean wait less the mean
  wait of the same requests in the setup without the flood;
- shares: requests per tenant among the first SHARE_WINDOW to reach the engine, while t2 and t3 are backlogged.

    python -m bench.tools.end_user_flood [--fairness vtc round_robin]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.product import (
    SchedulerServer,
    SimConfig,
    configure_logging,
    load_config,
    read_journal,
    running_simulator,
)

FLOOD = 40  # requests from t2, from t3, and from acme's flooding end user
SIBLINGS = ("bob", "carol")
SIBLING = 3  # requests each sibling sends, one after the other
TOKENS = 16
SHARE_WINDOW = 60
SETUPS = ("end users named", "one queue", "no flood")
ENGINE: dict[str, Any] = {"max_num_seqs": 4, "decode_base_ms": 2.0, "decode_per_seq_ms": 0.5}


@dataclass(frozen=True)
class SetupFigures:
    """One setup's figures (see the module docstring)."""

    flood_ahead: list[int]  # per sibling request
    wait_decodes: list[float]  # per sibling request
    shares: dict[str, int]  # tenant -> requests among the first SHARE_WINDOW


def config(engine_url: str, fairness: str) -> dict[str, Any]:
    return {
        "server": {"listen": "127.0.0.1:0", "metrics_listen": "", "http_listen": "127.0.0.1:0"},
        "scheduling": {"fairness": fairness},
        "models": [
            {
                "name": "m",
                "gate": {"waiting_target": 1},  # the engine's order is the scheduler's
                "backends": [
                    {"name": "b0", "url": engine_url, "engine_model": "sim-model", "scrape_interval_seconds": 0.05}
                ],
            }
        ],
    }


class Calls:
    """The setup's streamed requests, each a task reading its answer to the end."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self._session = session
        self._base = base
        self.tasks: list[asyncio.Task[None]] = []

    async def send(self, tenant: str, end_user: str, tag: str) -> asyncio.Task[None]:
        """Start one streamed request and return once the scheduler answered (queued it, or more)."""
        answered = asyncio.Event()
        body: dict[str, Any] = {
            "model": "m",
            "prompt": f"{tag}\nwrite",
            "max_tokens": TOKENS,
            "ignore_eos": True,
            "stream": True,
        }
        if end_user:
            body["user"] = end_user  # the OpenAI field: the end user acme sends it for

        async def call() -> None:
            headers = {"x-user-id": tenant, "x-queue-updates": "true"}
            try:
                async with self._session.post(self._base + "/v1/completions", json=body, headers=headers) as response:
                    assert response.status == 200, await response.text()
                    async for _ in response.content:
                        answered.set()
            finally:
                answered.set()

        task = asyncio.create_task(call())
        self.tasks.append(task)
        await answered.wait()
        return task

    async def flood(self, tenant: str, end_user: str, role: str) -> None:
        """FLOOD requests, each sent once the one before it is queued."""
        for n in range(FLOOD):
            await self.send(tenant, end_user, f"{role}-{n}")

    async def sibling(self, end_user: str, named: bool, sent: dict[str, float]) -> None:
        """SIBLING requests of acme's `end_user`, each once the one before it finished; `sent` gets when."""
        for n in range(SIBLING):
            tag = f"acme-{end_user}-{n}"
            sent[tag] = time.time()
            await (await self.send("acme", end_user if named else "", tag))


async def one_setup(workdir: Path, fairness: str, setup: str) -> SetupFigures:
    journal = workdir / f"{fairness}-{setup.replace(' ', '-')}.jsonl"
    named = setup == "end users named"
    async with running_simulator(SimConfig(journal=str(journal), **ENGINE)) as engine:
        server = SchedulerServer(load_config(config(engine.url, fairness)))
        await server.start()
        sent: dict[str, float] = {}
        try:
            base = f"http://{server.http_address}"
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                calls = Calls(session, base)
                floods = [calls.flood(tenant, "", tenant) for tenant in ("t2", "t3")]
                if setup != "no flood":
                    floods.append(calls.flood("acme", "flood" if named else "", "acme-flood"))
                await asyncio.gather(*floods)
                await asyncio.gather(*(calls.sibling(end_user, named, sent) for end_user in SIBLINGS))
                await asyncio.gather(*calls.tasks)
        finally:
            await server.stop(grace=1.0)
    return _figures(read_journal(journal), sent)


def _figures(lines: list[dict[str, Any]], sent: dict[str, float]) -> SetupFigures:
    received = [(float(line["t"]), str(line["tag"])) for line in lines if line["event"] == "received"]
    arrived = {tag: t for t, tag in received}
    by_id = {str(line["id"]): str(line["tag"]) for line in lines if line["event"] == "received"}
    started = {by_id[str(line["id"])]: float(line["t"]) for line in lines if line["event"] == "started"}
    finished = {by_id[str(line["id"])]: float(line["t"]) for line in lines if line["event"] == "finished"}
    decodes = [finished[tag] - started[tag] for tag in finished if tag.startswith("acme-flood") or tag[:2] == "t2"]
    decode = statistics.mean(decodes)
    ahead, waits = [], []
    for tag, at in sent.items():
        reached = arrived[tag]
        ahead.append(sum(1 for t, other in received if other.startswith("acme-flood") and at <= t < reached))
        waits.append((reached - at) / decode)
    window = [tag.split("-", 1)[0] for _, tag in received[:SHARE_WINDOW]]
    return SetupFigures(ahead, waits, {tenant: window.count(tenant) for tenant in ("acme", "t2", "t3")})


async def run(policies: list[str]) -> dict[tuple[str, str], SetupFigures]:
    results = {}
    with tempfile.TemporaryDirectory(prefix="end-user-flood-") as workdir:
        for fairness in policies:
            for setup in SETUPS:
                results[fairness, setup] = await one_setup(Path(workdir), fairness, setup)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fairness", nargs="+", default=["vtc", "round_robin"], help="fairness policies to run")
    args = parser.parse_args()
    configure_logging("warning")
    started = time.monotonic()
    results = asyncio.run(run(args.fairness))
    print(
        f"one engine (4 slots); t2, t3 and acme's end user `flood` send {FLOOD} requests each, then acme's "
        f"{' and '.join(SIBLINGS)} {SIBLING} each, one after the other ({TOKENS} tokens per answer)"
    )
    print(
        f"{'fairness':<12} {'setup':<16} {'flood ahead max/mean':>21} {'wait in decodes max/mean':>25} "
        f"{'over no flood':>14} {f'shares of first {SHARE_WINDOW} acme/t2/t3':>30}"
    )
    for (fairness, setup), figures in results.items():
        ahead = f"{max(figures.flood_ahead)} / {statistics.mean(figures.flood_ahead):.1f}"
        waits = f"{max(figures.wait_decodes):.2f} / {statistics.mean(figures.wait_decodes):.2f}"
        over = statistics.mean(figures.wait_decodes) - statistics.mean(results[fairness, "no flood"].wait_decodes)
        shares = " / ".join(str(figures.shares[t]) for t in ("acme", "t2", "t3"))
        print(f"{fairness:<12} {setup:<16} {ahead:>21} {waits:>25} {over:>+14.2f} {shares:>30}")
    print(f"({time.monotonic() - started:.1f}s)")


if __name__ == "__main__":
    main()
