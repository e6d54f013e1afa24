"""What operators and other-language clients rely on: reflection (grpcurl), health, /metrics, the CLI,
caps with retry hints, TTLs, introspection, engine priorities end to end."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from backends.sim import SimConfig, running_simulator
from clients import error_reason, is_retryable, retry_delay
from tests.helpers import (
    ControlledEngine,
    client_for,
    client_label,
    make_config,
    outcome_count,
    serving,
    until_settled,
)
from tests.stream_events import next_event

GRPCURL = shutil.which("grpcurl") or str(__import__("pathlib").Path(sys.executable).parent / "grpcurl")


async def _run(*args: str, fails: bool = False) -> str:
    """The command's output; it must succeed (`fails`: it must not)."""
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert (process.returncode != 0) == fails, out.decode()
    return out.decode()


async def test_grpcurl_lists_describes_and_calls_through_reflection() -> None:
    engine = ControlledEngine(tokens=2, auto_release=True)
    async with serving(make_config(), engine.factory()) as server:
        listing = await _run(GRPCURL, "-plaintext", server.address, "list")
        described = await _run(GRPCURL, "-plaintext", server.address, "describe", "llmsched.v1.SchedulerService")
        body = json.dumps({"params": {"model": "m", "prompt": "hi", "max_tokens": 2}})
        streamed = await _run(
            GRPCURL, "-plaintext", "-H", "x-user-id: carol", "-d", body,
            server.address, "llmsched.v1.SchedulerService/Stream",
        )  # fmt: skip
    assert "llmsched.v1.SchedulerService" in listing and "grpc.health.v1.Health" in listing
    assert "rpc Stream ( .llmsched.v1.StreamRequest ) returns ( stream .llmsched.v1.StreamResponse )" in described
    events = [json.loads(chunk) for chunk in streamed.replace("}\n{", "}\x00{").split("\x00")]
    assert list(events[0]) == ["queued"] and list(events[-1]) == ["finished"]


async def test_health_reports_serving_then_not_serving_on_shutdown() -> None:
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(), engine.factory()) as server, grpc.aio.insecure_channel(server.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        request = health_pb2.HealthCheckRequest(service="llmsched.v1.SchedulerService")
        assert (await stub.Check(request)).status == health_pb2.HealthCheckResponse.SERVING
        await server.stop(grace=0.1)


async def test_prometheus_metrics_endpoint_reports_the_scheduler() -> None:
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        await client.submit("m", "hello")
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            text = await response.text()
    assert 'llmsched_request_outcomes_total{model="m",outcome="completed"} 1.0' in text
    assert 'llmsched_gate_open{backend="b0",model="m"}' in text
    assert "llmsched_queue_wait_seconds_bucket" in text


async def test_cli_submit_and_stream_against_a_running_service() -> None:
    engine = ControlledEngine(tokens=3, auto_release=True)
    async with serving(make_config(), engine.factory()) as server:
        cli = [sys.executable, "-m", "scheduler_svc.app.cli"]
        submitted = await _run(*cli, "submit", "--target", server.address, "--model", "m", "--user", "dave", "Hi")
        at = ("--target", server.address, "--model", "m", "--user", "dave")
        streamed = await _run(*cli, "stream", *at, "--end-user", "dave-customer-7", "Hi")
        refused = await _run(*cli, "submit", *at, "--end-user", "not an id", "Hi", fails=True)
        state = await _run(*cli, "queue-state", "--target", server.address, "--user", "dave")
    assert "hello t1 t2" in submitted and "hello t1 t2" in streamed
    assert "[dispatched to b0]" in streamed
    assert "end_user: invalid user id" in refused, refused  # the end user travels in the request's field
    # both print the call's timings (this fake engine sends no acceptance: its intake reads "-")
    assert re.search(r"via b0: 3 tokens, queued \d+\.\d{3}s, first token \d+\.\d{3}s, engine took it in -", submitted)
    assert re.search(r"\[finished: 3 tokens, queued \d+\.\d{3}s, first token \d+\.\d{3}s, engine took", streamed)
    assert json.loads(state)["models"][0]["model"] == "m"


async def test_queue_caps_answer_resource_exhausted_with_retry_info_and_a_reason() -> None:
    engine = ControlledEngine(waiting=50)  # nothing dispatches: the queue fills
    config = make_config(models=[{"name": "m", "max_queued_per_user": 2, "backends": [{"name": "b0"}]}])
    async with serving(config, engine.factory()) as server, client_for(server) as client:
        calls = [client.stream("m", f"p{i}") for i in range(2)]
        for call in calls:
            await call.read()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit("m", "one too many")
        async with client_for(server, user="other") as other:  # another user is not affected
            other_call = other.stream("m", "fine")
            assert (await next_event(other_call)).HasField("queued")
            other_call.cancel()
        for call in calls:
            call.cancel()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_reason(err.value) == "QUEUE_FULL" and is_retryable(err.value)  # the client follows the table
    assert retry_delay(err.value) == pytest.approx(1.0)  # no drain observed yet: the default hint


async def test_class_queue_ttl_ends_a_waiting_request_with_deadline_exceeded() -> None:
    engine = ControlledEngine(waiting=50)
    classes = [{"name": "interactive", "rank": 0, "queue_ttl_seconds": 0.3}]
    config = make_config(scheduling={"classes": classes, "default_class": "interactive"})
    async with serving(config, engine.factory()) as server, client_for(server) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit("m", "too slow")
        await until_settled(server, lambda: outcome_count(server, "expired") == 1)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert error_reason(err.value) == "QUEUE_TIMEOUT" and not is_retryable(err.value)
    assert engine.started == []


async def test_get_queue_state_shows_depths_gates_and_counters_and_is_admin_only() -> None:
    engine = ControlledEngine(waiting=50)
    config = make_config(scheduling={"fairness": "vtc"}, auth={"admin_users": ["root"], "trust_user_header": True})
    async with serving(config, engine.factory()) as server, client_for(server) as alice:
        call = alice.stream("m", "waiting", priority_class="batch")
        await call.read()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await alice.queue_state()
        async with client_for(server, user="root") as root:
            state = (await root.queue_state("m")).models[0]
        call.cancel()
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert state.queued == 1
    batch = next(c for c in state.classes if c.priority_class == "batch")
    assert [(u.user, u.queued) for u in batch.users] == [("alice", 1)]
    gate = next(g for g in state.gates if g.priority_class == "batch")
    assert not gate.open and gate.engine_waiting == 50 and "idle engine" in gate.reason
    assert gate.metrics_fresh and gate.HasField("reading_age") and gate.reading_age.ToNanoseconds() >= 0


async def test_engine_priority_lets_a_latecomer_overtake_a_flood_inside_a_priority_engine() -> None:
    sim_config = SimConfig(max_num_seqs=2, scheduling_policy="priority", decode_base_ms=5.0)
    async with running_simulator(sim_config) as sim:
        models = [
            {
                "name": "m",
                "gate": {"waiting_target": 8},  # a deep engine queue: the engine itself reorders
                "backends": [
                    {"name": "b0", "url": sim.url, "engine_model": "sim-model", "priority_scheduling": True,
                     "scrape_interval_seconds": 0.05},
                ],
            }
        ]  # fmt: skip
        async with (
            serving(make_config(models=models)) as server,
            client_for(server, user="flood") as flood,
            client_for(server, user="late") as late,
        ):
            flood_calls = [
                asyncio.create_task(flood.submit("m", f"f{i}", max_tokens=30, ignore_eos=True)) for i in range(8)
            ]
            await asyncio.wait(flood_calls, return_when=asyncio.FIRST_COMPLETED)
            await late.submit("m", "me first", max_tokens=5, ignore_eos=True, request_id="latecomer")
            await asyncio.gather(*flood_calls)
        served = sim.engine.stats()["served_order"]
    priorities = {client_label(entry["request_id"]): entry["priority"] for entry in served}
    assert priorities["latecomer"] == 0
    assert sorted(p for rid, p in priorities.items() if rid != "latecomer")[-1] >= 2  # the flood's later ones
    late_index = [client_label(e["request_id"]) for e in served].index("latecomer")
    assert late_index < len(served) - 2, "the latecomer waited behind the whole flood"


def test_the_cli_shows_how_long_the_engine_took_the_request_in() -> None:
    from clients import Timings
    from scheduler_svc.app.cli import _timings_text

    text = _timings_text(Timings(queue_wait=0.012, time_to_first_token=0.25, total=1.0, engine_accept=0.0042))
    assert text == "queued 0.012s, first token 0.250s, engine took it in 4.2ms"
    assert _timings_text(Timings(0.0, None, 0.1)).endswith("first token -, engine took it in -")
