"""The official `openai` npm package against the HTTP door and the simulator, as a Node application uses it.

The package is pinned in tests/http/node/package-lock.json and installed by `scripts/http_node_setup.sh`
(`make test` runs it first). Without it, this test skips, unless LLMSCHED_REQUIRE_NODE_SDK=1 (set by
`make test`) makes the missing package a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from backends.sim import SimConfig, running_simulator
from tests.http.support import http_serving

NODE_DIR = Path(__file__).parent / "node"


def _require_package() -> str:
    node = shutil.which("node")
    installed = (NODE_DIR / "node_modules" / "openai" / "package.json").is_file()
    if node is None or not installed:
        why = "node is not installed" if node is None else "run scripts/http_node_setup.sh (npm ci) first"
        if os.environ.get("LLMSCHED_REQUIRE_NODE_SDK") == "1":
            pytest.fail(f"the openai npm package check cannot run: {why}")
        pytest.skip(why)
    return node


async def test_the_openai_npm_package_chats_streams_and_raises_through_the_door() -> None:
    node = _require_package()
    async with (
        running_simulator(SimConfig(decode_base_ms=2.0)) as sim,
        http_serving(backend_url=sim.url) as (_, base),
    ):
        process = await asyncio.create_subprocess_exec(
            node,
            str(NODE_DIR / "check.mjs"),
            env={**os.environ, "LLMSCHED_HTTP_BASE": f"{base}/v1"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    seen = json.loads(out.decode().strip().splitlines()[-1])
    assert seen["whole"]["text"] and seen["whole"]["finish"] == "length"
    assert seen["whole"]["usage"]["completion_tokens"] == 5
    assert seen["stream"]["text"] and seen["stream"]["finish"] == "length"
    assert seen["stream"]["usage"]["completion_tokens"] == 4
    assert seen["completion"]
    assert seen["notFound"] == {"cls": "NotFoundError", "status": 404, "code": "model_not_found", "retry": "false"}
    assert seen["models"] == ["m"]
