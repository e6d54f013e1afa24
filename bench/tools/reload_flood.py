"""A reload under a flood: does the scheduler lose, reorder or duplicate a request? Counted by the engines.

Three users send 64 requests (22, 21, 21), each user's in its own order (a request is sent once the one before
it is queued, so the queue's order is known), each tagged `<user>-<n>` in its prompt's first line. Once all are
queued, an admin's ReloadConfig applies a new file: alice's weight 2, a class setting, a price, one more API
key, and the model's engine replaced (backend b0 removed, so it drains, and b1 added). The same flood runs
again without the reload, side by side.

The counts come from the simulated engines' own journals (`backends.sim.journal`), not from the scheduler:

- lost: a request no engine finished;
- duplicated: a request an engine received more than once (over both engines);
- reordered: pairs of one user's requests that reached the engines in the other order than they were queued.
  The removed engine takes nothing after the reload and the new one nothing before, so its journal followed by
  the new engine's is the order of dispatch; the gate sends a request only once the one before it has started
  (waiting target 1, the engine's batch size left unknown), so no two requests race to an engine.

    python -m bench.tools.reload_flood
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.configs import to_toml
from bench.product import (
    SchedulerServer,
    SimConfig,
    configure_logging,
    load_config_file,
    read_journal,
    running_simulator,
)
from clients import AsyncClient, Delta, Queued

USERS = {"alice": 22, "bob": 21, "carol": 21}  # 64 requests
KEYS = {user: f"bench-{user}-key" for user in (*USERS, "ops", "dave")}
TOKENS = 32
ENGINE: dict[str, Any] = {"max_num_seqs": 8, "decode_base_ms": 2.0, "decode_per_seq_ms": 0.5}


@dataclass(frozen=True)
class FloodCounts:
    """One flood, as the engines' journals and the clients saw it."""

    sent: int
    completed: int  # answered in full to the client
    lost: int
    duplicated: int
    reordered: int
    per_engine: tuple[int, int]  # requests each engine received: the removed one (b0), the added one (b1)
    changes: tuple[str, ...]  # what the reload changed (empty without one)


def config(backends: dict[str, str], *, reloaded: bool) -> dict[str, Any]:
    """The scheduler's file: before the reload, and as the reload rewrites it."""
    keyed = (*USERS, "ops", "dave") if reloaded else (*USERS, "ops")
    return {
        "server": {"listen": "127.0.0.1:0", "metrics_listen": ""},
        "auth": {
            "api_key_sha256": {hashlib.sha256(KEYS[user].encode()).hexdigest(): user for user in keyed},
            "admin_users": ["ops"],
        },
        "scheduling": {
            "fairness": "vtc",
            "weights": {"users": {"alice": 2.0} if reloaded else {}},
            "classes": [{"name": "interactive", "rank": 0, "engine_priority": 1 if reloaded else 0}],
            "default_class": "interactive",
        },
        "models": [
            {
                "name": "m",
                "output_token_cost": 2.0 if reloaded else 1.0,
                "gate": {"waiting_target": 1},
                "backends": [
                    {"name": name, "url": url, "engine_model": "sim-model", "scrape_interval_seconds": 0.05}
                    for name, url in backends.items()
                ],
            }
        ],
    }


async def _send(client: AsyncClient, tag: str, queued: asyncio.Event) -> bool:
    """Stream one request; `queued` is set once the scheduler queued it. True when it finished whole."""
    tokens = 0
    async for event in client.stream("m", f"{tag}\nwrite", max_tokens=TOKENS, ignore_eos=True, request_id=tag):
        if isinstance(event, Queued):
            queued.set()
        elif isinstance(event, Delta):
            tokens += event.tokens
    return tokens == TOKENS


async def _user(client: AsyncClient, user: str, count: int, calls: list[asyncio.Task[bool]]) -> None:
    """The user's requests, each sent once the one before it is queued."""
    for n in range(count):
        queued = asyncio.Event()
        calls.append(asyncio.create_task(_send(client, f"{user}-{n}", queued)))
        await queued.wait()


async def flood(workdir: Path, *, reload: bool) -> FloodCounts:
    """One flood of 64 requests through a fresh scheduler, with the reload or without."""
    journals = {name: workdir / f"{name}-{'reload' if reload else 'plain'}.jsonl" for name in ("b0", "b1")}
    path = workdir / f"llmsched-{'reload' if reload else 'plain'}.toml"
    async with (
        running_simulator(SimConfig(journal=str(journals["b0"]), **ENGINE)) as engine0,
        running_simulator(SimConfig(journal=str(journals["b1"]), **ENGINE)) as engine1,
    ):
        path.write_text(to_toml(config({"b0": engine0.url}, reloaded=False)))
        server = SchedulerServer(load_config_file(path), config_path=path)
        await server.start()
        try:
            clients = {user: AsyncClient(server.address, api_key=KEYS[user]) for user in (*USERS, "ops")}
            calls: list[asyncio.Task[bool]] = []
            await asyncio.gather(*(_user(clients[user], user, count, calls) for user, count in USERS.items()))
            changes: tuple[str, ...] = ()
            if reload:
                path.write_text(to_toml(config({"b1": engine1.url}, reloaded=True)))
                changes = tuple((await clients["ops"].reload_config()).changes)
            completed = sum(await asyncio.gather(*calls))
            for client in clients.values():
                await client.close()
        finally:
            await server.stop(grace=1.0)
    return _count(journals, len(calls), completed, changes)


def _count(journals: dict[str, Path], sent: int, completed: int, changes: tuple[str, ...]) -> FloodCounts:
    """Lost, duplicated and reordered, from the journals (the removed engine's first: see the docstring)."""
    by_engine = {name: read_journal(journals[name]) for name in ("b0", "b1")}
    lines = [*by_engine["b0"], *by_engine["b1"]]
    tags = [f"{user}-{n}" for user, count in USERS.items() for n in range(count)]
    received = Counter(str(line["tag"]) for line in lines if line["event"] == "received")
    finished = {str(line["id"]).split("~", 1)[0] for line in lines if line["event"] == "finished"}
    arrival = [str(line["tag"]) for line in lines if line["event"] == "received"]
    reordered = 0
    for user in USERS:
        order = [int(tag.rsplit("-", 1)[1]) for tag in arrival if tag.startswith(f"{user}-")]
        reordered += sum(1 for i, a in enumerate(order) for b in order[i + 1 :] if a > b)
    return FloodCounts(
        sent=sent,
        completed=completed,
        lost=sum(tag not in finished for tag in tags),
        duplicated=sum(max(0, received[tag] - 1) for tag in tags),
        reordered=reordered,
        per_engine=(
            sum(line["event"] == "received" for line in by_engine["b0"]),
            sum(line["event"] == "received" for line in by_engine["b1"]),
        ),
        changes=changes,
    )


async def run() -> dict[str, FloodCounts]:
    with tempfile.TemporaryDirectory(prefix="reload-flood-") as workdir:
        return {
            "no reload": await flood(Path(workdir), reload=False),
            "reload": await flood(Path(workdir), reload=True),
        }


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    configure_logging("warning")  # not a line per request
    started = time.monotonic()
    results = asyncio.run(run())
    print(f"a 64-request flood from {len(USERS)} users, counted from the engines' journals")
    header = f"{'':<10} {'sent':>5} {'completed':>10} {'lost':>5} {'duplicated':>11} {'reordered':>10}"
    print(f"{header} {'at b0 / b1':>11}")
    for name, counts in results.items():
        print(
            f"{name:<10} {counts.sent:>5} {counts.completed:>10} {counts.lost:>5} {counts.duplicated:>11} "
            f"{counts.reordered:>10} {counts.per_engine[0]:>6} / {counts.per_engine[1]:<3}"
        )
    print("the reload changed:")
    for line in results["reload"].changes:
        print(f"  {line}")
    print(f"({time.monotonic() - started:.1f}s)")


if __name__ == "__main__":
    main()
