"""Over a real socket: one-off users leave no lasting state, and GetQueueState filters by
user and caps its answer."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from llmsched.v1 import scheduler_pb2 as pb
from tests.helpers import ControlledEngine, client_for, make_config, serving

ONE_OFF_USERS = 4000


async def test_4000_one_off_users_leave_bounded_state_and_queue_state_is_capped() -> None:
    engine = ControlledEngine(tokens=1, auto_release=True)
    config = make_config(scheduling={"fairness": "weighted_round_robin"})
    async with serving(config, engine.factory()) as server, client_for(server, user="root") as root:
        stub = root._stub  # one channel, a different x-user-id per call

        async def one_off(i: int) -> None:
            await stub.Submit(
                pb.SubmitRequest(params=pb.GenerationParams(model="m", prompt="hi", max_tokens=1)),
                metadata=(("x-user-id", f"u{i}"),),
            )

        for start in range(0, ONE_OFF_USERS, 200):
            await asyncio.gather(*(one_off(i) for i in range(start, start + 200)))
        (snapshot,) = [c for c in server.scheduler.snapshot("m", "", 0).classes if c.priority_class == "interactive"]
        tracked, counters = snapshot.tracked_users, snapshot.users_total
        state = (await root.queue_state("m")).models[0]
    interactive = next(c for c in state.classes if c.priority_class == "interactive")
    assert tracked <= 300 and counters <= 300, (tracked, counters)  # at most about one batch of callers
    assert len(interactive.users) <= 100 and interactive.users_total == counters
    assert interactive.truncated == (interactive.users_total > 100)


async def test_queue_state_filters_by_user_caps_the_answer_and_rejects_a_long_filter() -> None:
    engine = ControlledEngine(waiting=50)  # the gate stays closed: everything waits in the queue
    async with serving(make_config(), engine.factory()) as server, client_for(server, user="root") as root:
        stub = root._stub
        calls = [
            stub.Stream(
                pb.StreamRequest(params=pb.GenerationParams(model="m", prompt="wait")),
                metadata=(("x-user-id", f"user{i % 5}"),),
            )
            for i in range(15)
        ] + [
            stub.Stream(
                pb.StreamRequest(params=pb.GenerationParams(model="m", prompt="wait")), metadata=(("x-user-id", "big"),)
            )
            for _ in range(4)
        ]
        for call in calls:
            await call.read()  # the queued event: it is in the queue
        capped = (await root.queue_state("m", max_users=2)).models[0]
        alone = (await root.queue_state("m", user="user3")).models[0]
        nobody = (await root.queue_state("m", user="nobody")).models[0]
        huge = (await root.queue_state("m", max_users=10**6)).models[0]
        counts_only = (await root.queue_state("m", max_users=0)).models[0]  # set to 0: no users, the counts
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await root.queue_state("m", user="x" * 10_000 + "\x00<script>")
        for call in calls:
            call.cancel()
    interactive = next(c for c in capped.classes if c.priority_class == "interactive")
    assert [(u.user, u.queued) for u in interactive.users] == [("big", 4), ("user0", 3)]
    assert interactive.users_total == 6 and interactive.truncated
    assert [(u.user, u.queued) for u in next(c for c in alone.classes if c.users).users] == [("user3", 3)]
    assert all(not c.users and c.users_total == 0 for c in nobody.classes)
    assert sum(len(c.users) for c in huge.classes) == 6
    counted = next(c for c in counts_only.classes if c.priority_class == "interactive")
    assert not counted.users and counted.users_total == 6 and counted.truncated
    gate = capped.gates[0]  # the fake engine reports neither TPOT nor KV usage: unset, not -1
    assert not gate.HasField("engine_tpot") and not gate.HasField("engine_kv_cache_usage")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "xxxx" not in (err.value.details() or "") and "script" not in (err.value.details() or "")
