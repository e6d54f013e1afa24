"""The bench's cluster layouts: per-replica configs the service accepts, calls spread round robin
over real replica processes, the engine-queue figures of CB, and a redis layout whose replicas never join
Redis refused clearly within its timeout instead of measuring independent processes."""

from __future__ import annotations

import shutil
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from bench import cluster, harness
from bench.cli import parse
from bench.clients import RoundRobinClient, RunClock
from bench.cluster import ClusterOptions, Layout
from bench.configs import NotAvailable, scheduler_config, validated_toml
from bench.records import RequestRecord
from bench.registry import CLUSTER, select
from bench.scenarios import cb
from bench.scenarios import cluster_layouts as layouts

CONFIG = scheduler_config(engine_url="http://127.0.0.1:1", model="bench-model", engine_model="fake-model")
needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")


def test_each_replica_gets_its_own_name_and_metrics_port_and_the_service_accepts_it() -> None:
    redis = Layout(3, "redis", heartbeat_interval=0.2, heartbeat_timeout=1.0)
    second = redis.replica_config(CONFIG, 1, "redis://127.0.0.1:7000/0", "bench-x")
    assert second["cluster"] == {
        "store": "redis",
        "redis_url": "redis://127.0.0.1:7000/0",
        "key_prefix": "bench-x",
        "replica_name": "r2",
        "heartbeat_interval_seconds": 0.2,
        "heartbeat_timeout_seconds": 1.0,
    }
    assert second["server"]["metrics_listen"] == "127.0.0.1:{METRICS_PORT}"
    assert "cluster" not in CONFIG and CONFIG["server"]["metrics_listen"] == ""  # the shared config is untouched
    validated_toml(second)
    memory = Layout(3, "memory").replica_config(CONFIG, 0, "", "")
    assert "cluster" not in memory  # memory mode is exactly today's config: N independent processes
    with pytest.raises(ValueError):
        Layout(0, "memory")
    with pytest.raises(ValueError):
        Layout(3, "etcd")


def test_the_runs_side_by_side_and_their_roles() -> None:
    options = ClusterOptions(replicas=3)
    assert [layout.label for layout in options.layouts()] == [
        "1 replica, memory",
        "3 replicas, memory",
        "3 replicas, redis",
    ]
    assert [layout.label for layout in options.layouts(single_redis=True)][:2] == [
        "1 replica, memory",
        "1 replica, redis",
    ]
    assert [layout.label for layout in ClusterOptions(stores=("memory",)).layouts()] == [
        "1 replica, memory",
        "3 replicas, memory",
    ]
    labels = [layouts.label(layout) for layout in options.layouts()]
    assert [layouts.is_cluster(label) for label in labels] == [False, False, True]
    assert [layouts.is_reference(label) for label in labels] == [True, False, False]


def test_the_cluster_scenarios_are_selected_by_id_and_their_knobs_are_bounded() -> None:
    assert [s.id for s in select(["C1", "CB"])] == ["C1", "CB"]
    assert [s.id for s in select(["CN"])] == ["CL"]  # one run gives both: CN's target reads CL's follower CPU
    for i in CLUSTER:
        (scenario,) = select([i])
        assert i in scenario.produces
    args = parse(["--scenarios", "C3", "--replicas", "2", "--cluster-stores", "memory", "--cluster-scale", "2"])
    assert args.cluster == ClusterOptions(replicas=2, stores=("memory",), scale=2.0)
    with pytest.raises(SystemExit):
        parse(["--cluster-stores", "etcd"])
    with pytest.raises(SystemExit):
        parse(["--replicas", "0"])


class _Recorder:
    def __init__(self, name: str, calls: list[str]) -> None:
        self.label, self.clock, self._name, self._calls = name, RunClock(), name, calls

    async def run(
        self, record: RequestRecord, prompt: str, *, priority_class: str = "", engine_priority: int | None = None
    ) -> None:
        self._calls.append(f"{self._name}:{prompt}:{priority_class}")


async def test_each_call_goes_to_the_next_replica() -> None:
    calls: list[str] = []
    client = RoundRobinClient([_Recorder("a", calls), _Recorder("b", calls), _Recorder("c", calls)])
    records = [RequestRecord(user="u", tag="t", sent=0.0, max_tokens=1) for _ in range(5)]
    for i, record in enumerate(records):
        await client.run(record, str(i), priority_class="x")
    assert calls == ["a:0:x", "b:1:x", "c:2:x", "a:3:x", "b:4:x"]
    assert [r.replica for r in records] == [0, 1, 2, 0, 1]
    with pytest.raises(ValueError):
        RoundRobinClient([])


def test_engine_queue_figures_count_only_the_window() -> None:
    samples = [(0.5, 50.0, 1.0), (1.0, 2.0, 60.0), (1.5, 4.0, 64.0), (2.0, 6.0, 62.0), (2.5, 90.0, 10.0)]
    figures = cb.waiting_figures(samples, 1.0, 2.5)
    assert figures["samples"] == 3
    assert figures["waiting_max"] == 6.0
    assert figures["waiting_mean"] == pytest.approx(4.0)
    assert figures["waiting_p99"] == pytest.approx(5.96)
    assert figures["running_mean"] == pytest.approx(62.0)
    assert cb.waiting_figures(samples, 10.0, 11.0)["waiting_max"] is None


def test_the_cluster_is_held_to_one_processs_p99_plus_the_slack_and_the_target_on_average() -> None:
    reference: dict[str, Any] = {"waiting_p99": 7.0}
    good = cb._targets("scheduler, 3 replicas, redis", {"waiting_mean": 2.5, "waiting_p99": 8.0}, reference)
    assert [t.status for t in good] == ["met", "met"]
    bad = cb._targets("scheduler, 3 replicas, redis", {"waiting_mean": 9.0, "waiting_p99": 30.0}, reference)
    assert [t.status for t in bad] == ["missed", "missed"] and all(t.regressed for t in bad)
    assert len(cb._targets("x", {"waiting_mean": 2.5, "waiting_p99": 8.0}, None)) == 1


async def test_memory_replicas_each_serve_their_share_of_the_calls() -> None:
    async with harness.fake_engine(4) as engine_url:
        config = scheduler_config(engine_url=engine_url, model="bench-model", engine_model="fake-model")
        async with cluster.cluster(config, Layout(2, "memory")) as running:
            assert len(running.replicas) == 2 and running.redis_url == ""
            assert await running.admitted() == [1.0, 1.0]  # each replica served its warm-up request


@needs_redis
async def test_a_private_redis_server_answers_and_is_gone_afterwards() -> None:
    async with cluster.redis_server() as url:
        client = aioredis.Redis.from_url(url)
        assert await client.ping()
        assert await client.config_get("save") == {"save": ""}
        await client.aclose()
    client = aioredis.Redis.from_url(url, socket_connect_timeout=1)
    with pytest.raises(RedisConnectionError):
        await client.ping()
    await client.aclose()


@needs_redis
async def test_replicas_that_never_join_redis_are_refused_within_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "_refused", [])
    Layout(1, "redis").check_available(CONFIG)
    async with harness.fake_engine(4) as engine_url, cluster.redis_server() as url:
        config = scheduler_config(engine_url=engine_url, model="bench-model", engine_model="fake-model")
        async with harness.scheduler_process(validated_toml(config)) as replica:  # memory mode: never connects
            started = time.monotonic()
            with pytest.raises(NotAvailable, match="did not join the cluster in Redis"):
                await cluster.wait_joined(url, "bench-never", [replica], timeout=1.5)
            assert time.monotonic() - started < 5  # a real redis-server and scheduler process: real time
            with pytest.raises(NotAvailable, match="did not join"):  # the next redis layout: refused at once
                Layout(3, "redis").check_available(CONFIG)
            Layout(3, "memory").check_available(CONFIG)
            # what a joined replica leaves behind (a connection and a key under the prefix) is enough
            member = aioredis.Redis.from_url(url)
            await member.set("bench-joined:member:r1", "1")
            await cluster.wait_joined(url, "bench-joined", [replica], timeout=5)
            await member.aclose()


@needs_redis
async def test_replicas_on_redis_join_and_each_serves() -> None:
    async with harness.fake_engine(4) as engine_url:
        config = scheduler_config(engine_url=engine_url, model="bench-model", engine_model="fake-model")
        async with cluster.cluster(config, Layout(2, "redis")) as running:
            assert running.redis_url.startswith("redis://127.0.0.1:")
            assert all(n is not None and n >= 1 for n in await running.admitted())
