"""The Node client (clients/node) against a live scheduler and simulators over real sockets.

This side serves the scheduler and two simulators ("m" and "capped" on one, "flaky" on the other, whose faults
the Node tests switch) and runs `node --test` on the built client with their addresses in the environment;
the Node tests check the event order, cancellation, deadlines, retries and errors, and this side checks that
the cancellations reached the engine. `make test` builds the client first (clients/node/bootstrap.sh).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from backends.sim import SimConfig, running_simulator
from scheduler_svc.core.keys import key_digest
from tests.helpers import make_config, serving

CLIENT_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"
NODE = shutil.which("node")
KEYS = {"alice": "sk-node-alice", "carol": "sk-node-carol"}
NODE_TIMEOUT_SECONDS = 90.0

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not installed: clients/node/bootstrap.sh installs it (make test runs it)"
)


def _model(name: str, url: str, **fields: object) -> dict[str, object]:
    backend = {"name": "b0", "kind": "vllm", "url": url, "engine_model": "sim-model", "scrape_interval_seconds": 0.05}
    return {"name": name, "default_max_tokens": 16, "backends": [backend], **fields}


async def test_node_client_against_a_live_scheduler() -> None:
    built = CLIENT_DIR / "dist" / "test"
    if not built.is_dir():
        pytest.fail("clients/node is not built: run `bash clients/node/bootstrap.sh` (make test does)")
    sim_config = SimConfig(decode_base_ms=5.0, decode_per_seq_ms=0.5)
    async with running_simulator(sim_config) as sim, running_simulator(sim_config) as flaky:
        config = make_config(
            models=[
                _model("m", sim.url),
                # A running request of 40 prompt bytes leaves no room for a second one: QUEUE_BYTES_FULL.
                _model("capped", sim.url, max_queued_bytes_per_user=64),
                _model("flaky", flaky.url, failover_attempts=0),
            ],
            auth={"api_key_sha256": {key_digest(key): user for user, key in KEYS.items()}},
        )
        async with serving(config) as server:
            env = {
                **os.environ,
                "LLMSCHED_NODE_TEST_ADDRESS": server.address,
                "LLMSCHED_NODE_TEST_SIM_URL": sim.url,
                "LLMSCHED_NODE_TEST_FLAKY_SIM_URL": flaky.url,
                "LLMSCHED_NODE_TEST_KEYS": json.dumps(KEYS),
            }
            process = await asyncio.create_subprocess_exec(
                NODE or "node",
                "--test",
                "--test-reporter=spec",
                str(built),
                cwd=CLIENT_DIR,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            try:
                output, _ = await asyncio.wait_for(process.communicate(), NODE_TIMEOUT_SECONDS)
            except TimeoutError:
                process.kill()
                output, _ = await process.communicate()
                pytest.fail(f"node --test ran over {NODE_TIMEOUT_SECONDS}s:\n{output.decode(errors='replace')}")
            stats = sim.engine.stats()
    report = output.decode(errors="replace")
    assert process.returncode == 0, report
    for outcome in ("fail", "cancelled", "skipped", "todo"):  # the spec reporter's summary
        assert re.search(rf"^\S+ {outcome} 0$", report, re.MULTILINE), report
    # Two Node cancellations (an AbortSignal and a loop left early) and a deadline each aborted a running
    # generation in the engine, and the retry test's blocker was aborted too.
    assert stats["aborted_total"] >= 4, stats
    assert stats["running"] == 0, stats
