"""The Go client (clients/go) against a live scheduler and simulator over real sockets: `go test` runs its
live tests with the addresses in environment variables, and this side checks what Go cannot see."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
from pathlib import Path

import pytest

from backends.sim import SimConfig, running_simulator
from llmsched.v1.errors import ERRORS
from scheduler_svc.core.keys import key_digest
from tests.helpers import make_config, outcome_count, serving, until_settled

ROOT = Path(__file__).resolve().parents[2]
# `make test` sets LLMSCHED_REQUIRE_GO after bootstrapping Go: there a missing toolchain fails, never skips.
pytestmark = pytest.mark.skipif(
    shutil.which("go") is None and not os.environ.get("LLMSCHED_REQUIRE_GO"),
    reason="no Go toolchain: run `bash clients/go/bootstrap.sh` (Debian packages, as root) to test the Go client",
)

LIVE_TESTS = {
    "TestStreamFollowsTheEventOrder/api_key",
    "TestStreamFollowsTheEventOrder/x-user-id",
    "TestSubmitReturnsTheWholeAnswer",
    "TestCancellingTheContextAbortsTheRequestInTheEngine",
    "TestErrorsCarryTheirReason/unknown_model",
    "TestErrorsCarryTheirReason/bad_key",
    "TestErrorsCarryTheirReason/prompt_too_large",
    "TestQueueFullIsRetriedAfterRetryInfoAndDeadlinesEndQueuedCalls",
    "TestTheErrorTableMatchesTheService",
    "TestAStreamIsNeverRetriedAfterADelta",
}


async def _run(script: str, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run a bash script in the checkout with clients/go/env.sh sourced; its exit status and output."""
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        f"source clients/go/env.sh && {script}",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    return process.returncode or 0, out.decode(errors="replace")


def _models(url_m: str, url_capped: str) -> list[dict[str, object]]:
    def backend(url: str) -> dict[str, object]:
        return {"name": "b0", "kind": "vllm", "url": url, "engine_model": "sim-model", "scrape_interval_seconds": 0.05}

    return [
        {"name": "m", "default_max_tokens": 16, "max_prompt_bytes": 4096, "backends": [backend(url_m)]},
        # One request running and one waiting in the engine close the gate; one more per user may queue.
        {"name": "capped", "max_queued_per_user": 1, "gate": {"waiting_target": 1}, "backends": [backend(url_capped)]},
    ]


@pytest.mark.timeout(900)  # a cold Go build cache on a loaded machine takes minutes
async def test_go_client_against_a_live_scheduler() -> None:
    env = dict(os.environ)
    status, out = await _run("bash clients/go/bootstrap.sh --no-install", env, timeout=800)
    assert status == 0, f"generating and building the Go client failed:\n{out}"

    keys = {user: f"sk-go-{user}-{secrets.token_hex(8)}" for user in ("alice", "bob")}
    auth = {"api_key_sha256": {key_digest(k): user for user, k in keys.items()}}
    table = {reason: [spec.code.value[0], spec.retryable] for reason, spec in ERRORS.items()}
    async with (
        running_simulator(SimConfig(decode_base_ms=10.0)) as sim,
        running_simulator(SimConfig(max_num_seqs=1, decode_base_ms=10.0)) as capped_sim,
    ):
        models = _models(sim.url, capped_sim.url)
        async with (
            serving(make_config(models=models, auth=auth)) as keyed,
            serving(make_config(models=models)) as open_door,
        ):
            env.update(
                LLMSCHED_GO_TEST_ADDR=keyed.address,
                LLMSCHED_GO_TEST_OPEN_ADDR=open_door.address,
                LLMSCHED_GO_TEST_SIM_URL=sim.url,
                LLMSCHED_GO_TEST_KEYS=",".join(f"{user}:{k}" for user, k in keys.items()),
                LLMSCHED_GO_TEST_ERRORS=json.dumps(table),
            )
            status, out = await _run('go test -count=1 -v "$GOCLIENT_IMPORT/llmsched"', env, timeout=300)
            print(out)  # shown with -s, or under a failure
            assert status == 0, f"go test failed:\n{out}"
            # The one cancelled request of model "m" was aborted inside the engine and counted as cancelled.
            await until_settled(keyed, lambda: outcome_count(keyed, "cancelled") == 1)
            assert sim.engine.stats()["aborted_total"] == 1
    passed = set(re.findall(r"--- PASS: (\S+)", out))
    skipped = re.findall(r"--- SKIP: (\S+)", out)
    assert not skipped, f"live Go tests skipped: {skipped}\n{out}"
    assert passed >= LIVE_TESTS, f"not passed: {sorted(LIVE_TESTS - passed)}\n{out}"
