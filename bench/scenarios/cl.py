"""CL the leader's cost: what deciding for the followers' requests costs the model's leader, against what
serving them costs the followers themselves, and what each request costs Redis; CN the same leader under
the load of many followers.

CL: N replicas on a private redis-server in front of the simulator. Once they have settled, each model's
leader is read from the replicas' metrics, and every call goes to the next replica that leads no model, so
each request's decisions are its model's leader's work and everything else (the gRPC call, the engine's
stream, the reports) its owner's. Over a load window (a fixed request rate for a while, then until every
request ended) each process's CPU time comes from /proc, Redis's from its own INFO, and Redis's commands from
INFO commandstats; an idle window of the same length just before gives each process's idle rate (the
heartbeats, the scrapes), taken off its load figure. Reported per layout: CPU per request of each leader and
of the followers, their ratio, Redis commands and CPU per request, messages per request by type. Layouts: one
model led by one replica, and (with `models` > 1) the same rate spread over several models, whose leases
fall on different replicas (target: one leader per model).

CN: at CL's light load nearly every message is a round trip of its own, and a follower costs several times
what its leader does, so two cores cannot show a leader serving many busy followers. One real leader replica
takes the traffic of synthetic followers (`bench.leader_load`) at rising rates; its CPU per request (minus
its idle rate), core share and Admit -> Grant latency, Redis's commands and CPU per request. Target: at the
highest step it sustains, the leader's CPU per follower-owned request is at most 10% of the follower's own
CPU for it (CL's, same run), so one leader serves at least ten followers.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
import redis.asyncio as aioredis

from backends.metrics import MetricSamples
from bench import harness
from bench.clients import ScheduledClient
from bench.cluster import Cluster, cluster
from bench.configs import NotAvailable, scheduler_config
from bench.engines import Engine, EngineProvider
from bench.leader_load import SyntheticFollowers
from bench.records import RequestRecord
from bench.results import ScenarioResult, Table, Target
from bench.runner import SCHEDULED_MODEL, Mode, RunContext
from bench.scenarios._cluster import ClusterOptions
from bench.scenarios._common import STANDARD_CLASS, divide, jsonable, ms, not_run, number, run_modes
from bench.scenarios.definition import Definition
from clients import pb_grpc

ID, TITLE = "CL", "the leader's cost per follower request"
LOAD_ID, LOAD_TITLE = "CN", "one leader under many followers' load"
TARGET = 0.10  # a leader's CPU per follower-owned request <= 10% of the follower's own: it serves ten
GATE_TARGET = 3


@dataclass(frozen=True)
class CLParams:
    rate: float = 20.0  # requests per second over all models
    duration: float = 8.0  # seconds of sending (the load window runs on until the last request ends)
    tokens: int = 64
    users: int = 8
    models: int = 2  # the per-model layout's models (one leader each); 1: that layout is not run
    timeout: float = 90.0
    # CN, one leader under synthetic followers (bench.leader_load): offered rates, each for `step` seconds
    load_rates: tuple[float, ...] = (100.0, 200.0, 400.0, 800.0)
    load_step: float = 5.0
    load_followers: int = 10
    load_engines: int = 8  # the model's backends (one instant fake engine behind them all)
    load_engine_slots: int = 256
    sustained_latency: float = 0.1  # a step counts while the median Admit -> Grant stays under this


def model_name(index: int, models: int) -> str:
    return SCHEDULED_MODEL if models == 1 else f"{SCHEDULED_MODEL}-{index + 1}"


def config_for(models: int) -> Any:
    """The bench's usual one-model config, its model repeated `models` times under its own names, all on the
    same engine (each model has its own dispatcher, queues and lease)."""

    def build(engine: Engine) -> Any:
        config = scheduler_config(
            engine_url=engine.url,
            model=SCHEDULED_MODEL,
            engine_model=engine.model,
            max_num_seqs=engine.max_num_seqs,
            fairness="vtc",
            classes=STANDARD_CLASS,
            waiting_target=GATE_TARGET,
        )
        template = config["models"][0]
        config["models"] = [{**copy.deepcopy(template), "name": model_name(i, models)} for i in range(models)]
        return config

    return build


@dataclass
class Snapshot:
    """Counters of every process at one moment."""

    cpu: list[float]  # per replica, seconds
    redis_cpu: float
    commands: dict[str, int]  # Redis command -> calls so far
    messages: dict[str, float]  # message type -> sent so far, every replica summed


async def _metrics(session: aiohttp.ClientSession, url: str) -> MetricSamples:
    async with session.get(url + "/metrics") as response:
        return MetricSamples.parse(await response.text())


async def leaders(cluster: Cluster, models: Sequence[str]) -> dict[str, int]:
    """model -> index of the replica that leads it, read from each replica's metrics (`llmsched_cluster_leading`
    per model; a replica without it leads every model when its role gauge says leader)."""
    out: dict[str, int] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        samples = await asyncio.gather(*(_metrics(session, r.metrics_url) for r in cluster.replicas))
    for index, s in enumerate(samples):
        if s.has("llmsched_cluster_leading"):
            for model in models:
                if (s.total("llmsched_cluster_leading", model=model) or 0) >= 1:
                    out[model] = index
        elif (s.total("llmsched_cluster_role", role="leader") or 0) >= 1:
            out.update(dict.fromkeys(models, index))
    return out


async def snapshot(cluster: Cluster, redis: aioredis.Redis) -> Snapshot:
    info_cpu, stats = await asyncio.gather(redis.info("cpu"), redis.info("commandstats"))
    commands = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if isinstance(v, dict)}
    messages: dict[str, float] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        samples = await asyncio.gather(*(_metrics(session, r.metrics_url) for r in cluster.replicas))
    for s in samples:
        for labels in s.labels("llmsched_cluster_messages_sent_total"):
            kind = labels.get("type", "?")
            messages[kind] = messages.get(kind, 0.0) + (s.total("llmsched_cluster_messages_sent_total", type=kind) or 0)
    main = ("used_cpu_sys_main_thread", "used_cpu_user_main_thread")
    keys = main if all(k in info_cpu for k in main) else ("used_cpu_sys", "used_cpu_user")
    return Snapshot(
        [r.cpu_seconds() for r in cluster.replicas], sum(float(info_cpu[k]) for k in keys), commands, messages
    )


def _delta(a: Snapshot, b: Snapshot) -> Snapshot:
    return Snapshot(
        [y - x for x, y in zip(a.cpu, b.cpu, strict=True)],
        b.redis_cpu - a.redis_cpu,
        {k: v - a.commands.get(k, 0) for k, v in b.commands.items() if v - a.commands.get(k, 0)},
        {k: v - a.messages.get(k, 0.0) for k, v in b.messages.items() if v - a.messages.get(k, 0.0)},
    )


async def _body(run: RunContext, p: CLParams, models: int) -> dict[str, Any]:
    cluster = run.cluster
    assert cluster is not None and cluster.redis_url
    names = [model_name(i, models) for i in range(models)]
    led = await leaders(cluster, names)
    if sorted(led) != sorted(names):
        raise RuntimeError(f"not every model has a leader: {led}")
    followers = [i for i in range(len(cluster.replicas)) if i not in led.values()]
    if not followers:
        raise RuntimeError("every replica leads a model: no follower to send to")
    redis = aioredis.Redis.from_url(cluster.redis_url)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(redis.aclose)
        clients = {}
        for i in followers:
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(cluster.replicas[i].target))
            stub = pb_grpc.SchedulerServiceStub(channel)
            clients[i] = {m: ScheduledClient(stub, m, run.clock, run.mode.label) for m in names}
        idle0 = await snapshot(cluster, redis)
        await asyncio.sleep(p.duration)  # the idle window: heartbeats only
        idle1 = await snapshot(cluster, redis)
        idle = _delta(idle0, idle1)
        idle_seconds = p.duration
        start = run.clock.now()
        load0 = await snapshot(cluster, redis)
        tasks: list[asyncio.Task[None]] = []
        records: list[tuple[str, RequestRecord]] = []
        n = 0
        while (due := start + n / p.rate) < start + p.duration:
            await asyncio.sleep(max(0.0, due - run.clock.now()))
            model = names[n % models]
            owner = followers[(n // models) % len(followers)]
            record = RequestRecord(user=f"user{n % p.users}", tag="load", sent=run.clock.now(), max_tokens=p.tokens)
            record.replica = owner
            records.append((model, record))
            tasks.append(asyncio.create_task(clients[owner][model].run(record, f"Leader cost probe {n}.")))
            n += 1
        _, pending = await asyncio.wait(tasks, timeout=p.timeout)
        for task in pending:
            task.cancel()
        load1 = await snapshot(cluster, redis)
        seconds = run.clock.now() - start
    load = _delta(load0, load1)
    done = [(m, r) for m, r in records if r.completed]
    net = [c - i * seconds / idle_seconds for c, i in zip(load.cpu, idle.cpu, strict=True)]
    per_model = {m: sum(1 for x, _ in done if x == m) for m in names}
    leader_rows: list[dict[str, Any]] = []
    for index in sorted(set(led.values())):
        served = sum(per_model[m] for m, i in led.items() if i == index)
        leader_rows.append(
            {
                "replica": index,
                "models": sorted(m for m, i in led.items() if i == index),
                "requests": served,
                "cpu": load.cpu[index],
                "net_cpu": net[index],
                "cpu_per_request": divide(net[index], served),
            }
        )
    follower_cpu = sum(net[i] for i in followers)
    leaders_cpu = sum(net[i] for i in set(led.values()))
    redis_net = load.redis_cpu - idle.redis_cpu * seconds / idle_seconds
    commands = {
        k: max(0.0, v - idle.commands.get(k, 0) * seconds / idle_seconds) for k, v in sorted(load.commands.items())
    }
    return {
        "leaders": leader_rows,
        "followers": followers,
        "requests": len(done),
        "sent": len(records),
        "seconds": seconds,
        "follower_cpu_per_request": divide(follower_cpu, len(done)),
        "leader_cpu_per_request": divide(leaders_cpu, len(done)),
        "leader_over_follower": divide(leaders_cpu, follower_cpu),
        "worst_leader_over_follower": max(
            (divide(r["cpu_per_request"], divide(follower_cpu, len(done))) or 0.0 for r in leader_rows), default=None
        ),
        "idle_cpu_per_second": [c / idle_seconds for c in idle.cpu],
        "redis_cpu_per_request": divide(redis_net, len(done)),
        "redis_idle_cpu_per_second": idle.redis_cpu / idle_seconds,
        "redis_commands_per_request": {k: v / len(done) for k, v in commands.items() if done},
        "redis_commands_total_per_request": divide(sum(commands.values()), len(done)),
        "redis_cpu_per_command": divide(redis_net, sum(commands.values())),
        "messages_per_request": {k: v / len(done) for k, v in sorted(load.messages.items()) if done},
        "errors": sorted({r.error for _, r in records if r.error and r.error != "cancelled"}),
    }


def load_config(engine_url: str, engines: int, slots: int) -> Any:
    """One model behind `engines` backends (all the same instant fake engine, each of `slots` slots): the
    leader's decisions and scrapes as for that many engines, without their decode time."""
    config = config_for(1)(Engine(engine_url, "fake-model", "fcfs", max_num_seqs=slots))
    # vtc may hold a choice up to its return grace for a user about to return: a deliberate wait, which
    # would hide in the grant latency whether the leader keeps up
    config["scheduling"]["vtc_return_grace_seconds"] = 0.0
    template = config["models"][0]["backends"][0]
    config["models"][0]["backends"] = [{**template, "name": f"engine-{i}"} for i in range(engines)]
    return config


async def _redis_cpu(redis: aioredis.Redis) -> float:
    info = await redis.info("cpu")
    main = ("used_cpu_sys_main_thread", "used_cpu_user_main_thread")
    return sum(float(info[k]) for k in (main if all(k in info for k in main) else ("used_cpu_sys", "used_cpu_user")))


async def _commands(redis: aioredis.Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values() if isinstance(v, dict))


async def leader_under_load(options: ClusterOptions, p: CLParams) -> dict[str, Any]:
    """One real leader replica and `load_followers` synthetic followers (bench.leader_load) on a private
    redis-server: an idle window, then each offered rate for `load_step` seconds."""
    layout = options.layout(1, "redis")
    async with contextlib.AsyncExitStack() as stack:
        engine_url = await stack.enter_async_context(harness.fake_engine(p.tokens))
        config = load_config(engine_url, p.load_engines, p.load_engine_slots)
        running = await stack.enter_async_context(cluster(config, layout))
        leader = running.replicas[0]
        redis = aioredis.Redis.from_url(running.redis_url)
        stack.push_async_callback(redis.aclose)
        driver = SyntheticFollowers(
            running.redis_url,
            running.key_prefix,
            "r1",
            SCHEDULED_MODEL,
            followers=p.load_followers,
            tokens=p.tokens,
            heartbeat=(options.heartbeat_interval, options.heartbeat_timeout),
            users=p.users,
        )
        await driver.start()
        stack.push_async_callback(driver.aclose)
        cpu0, redis0 = leader.cpu_seconds(), await _redis_cpu(redis)
        await asyncio.sleep(p.load_step)  # the idle window: heartbeats and scrapes only
        idle = (leader.cpu_seconds() - cpu0) / p.load_step
        redis_idle = (await _redis_cpu(redis) - redis0) / p.load_step
        steps = []
        for rate in p.load_rates:
            cpu0, redis0, commands0 = leader.cpu_seconds(), await _redis_cpu(redis), await _commands(redis)
            figures = await driver.run(rate, p.load_step)
            cpu = leader.cpu_seconds() - cpu0 - idle * figures.seconds
            redis_cpu = await _redis_cpu(redis) - redis0 - redis_idle * figures.seconds
            commands = await _commands(redis) - commands0
            done = figures.ended
            steps.append(
                {
                    **figures.summary(),
                    "leader_cpu_per_request": divide(cpu, done),
                    "leader_core_share": divide(cpu + idle * figures.seconds, figures.seconds),
                    "redis_cpu_per_request": divide(redis_cpu, done),
                    "redis_commands_per_request": divide(commands, done),
                    "redis_cpu_per_command": divide(redis_cpu, commands),
                }
            )
            print(f"    {rate:g} req/s: leader {ms(steps[-1]['leader_cpu_per_request'], 3)} per request", flush=True)
    return {"leader_idle_cpu_per_second": idle, "redis_idle_cpu_per_second": redis_idle, "steps": steps}


def sustained(load: dict[str, Any], p: CLParams) -> dict[str, Any] | None:
    """The highest step whose requests all ended with a median grant latency under `sustained_latency`."""
    ok = [
        s
        for s in load["steps"]
        if s["ended"] == s["admitted"] and (s["grant_latency_p50"] or 0.0) <= p.sustained_latency
    ]
    return max(ok, key=lambda s: s["rate"], default=None)


def _modes(options: ClusterOptions, p: CLParams) -> list[tuple[Mode, int]]:
    """The one-model layout, and the per-model one; enough replicas that at least one leads nothing."""
    replicas = max(options.replicas, p.models + 1)
    layout = options.layout(replicas, "redis")
    out = [(Mode(f"{replicas} replicas, redis, 1 model", config=config_for(1), layout=layout), 1)]
    if p.models > 1:
        label = f"{replicas} replicas, redis, {p.models} models"
        out.append((Mode(label, config=config_for(p.models), layout=layout), p.models))
    return out


async def run(provider: EngineProvider, options: ClusterOptions, p: CLParams | None = None) -> list[ScenarioResult]:
    p = p or CLParams()
    p = dataclasses.replace(p, duration=p.duration * options.scale, load_step=p.load_step * options.scale)
    workload = (
        f"{p.rate:g} requests/s for {p.duration:g} s ({p.tokens} output tokens each, {p.users} users, vtc), every call "
        "to the next replica that leads no model, after an idle window as long; one model, then "
        f"{p.models} models on the same engine (the same rate spread over them)"
    )
    load_workload = (
        f"one leader replica, {p.load_followers} synthetic followers (bench/leader_load.py) playing a follower's "
        f"messages for requests of {p.tokens} tokens over 2 s; vtc without its return grace; one model on "
        f"{p.load_engines} backends of "
        f"{p.load_engine_slots} slots (an instant fake engine behind them); offered "
        f"{', '.join(f'{r:g}' for r in p.load_rates)} requests/s, {p.load_step:g} s each, after an idle window as long"
    )
    if "redis" not in options.stores:
        why = "needs the redis layout (--cluster-stores redis)"
        return [
            ScenarioResult.unavailable(ID, TITLE, workload, why),
            ScenarioResult.unavailable(LOAD_ID, LOAD_TITLE, load_workload, why),
        ]
    runs: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for mode, models in _modes(options, p):
        done, missed = await run_modes(
            provider, [mode], functools.partial(_body, p=p, models=models), timeout=2 * p.duration + p.timeout + 30
        )
        runs.update(done)
        skipped.update(missed)
    print("  one leader under synthetic followers ...", flush=True)
    load: dict[str, Any] | None = None
    load_failed = ""
    try:
        load = await leader_under_load(options, p)
    except (RuntimeError, OSError, NotAvailable, TimeoutError) as exc:
        load_failed = f"failed: {exc!r}"
    one_model = next((r for label, r in runs.items() if label.endswith(", 1 model")), None)
    follower_cpu = None if one_model is None else one_model["follower_cpu_per_request"]
    return [
        _cluster_result(runs, skipped, workload, provider.describe()),
        _load_result(load, follower_cpu, p, load_failed, load_workload),
    ]


def _cluster_result(
    runs: dict[str, dict[str, Any]], skipped: dict[str, str], workload: str, engine: str
) -> ScenarioResult:
    if not runs:
        return ScenarioResult.unavailable(ID, TITLE, workload, "; ".join(not_run(skipped)))
    result = ScenarioResult(ID, TITLE, workload, engine, notes=not_run(skipped))
    result.table = Table(
        [
            "run",
            "requests",
            "follower CPU / request",
            "leader CPU / request (each leader)",
            "leaders ÷ followers",
            "Redis commands / request",
            "Redis CPU / request",
            "Redis CPU / command",
        ]
    )
    for label, r in runs.items():
        each = ", ".join(
            f"r{x['replica'] + 1} ({'+'.join(x['models'])}): {ms(x['cpu_per_request'], 3)}" for x in r["leaders"]
        )
        result.table.rows.append(
            [
                label,
                str(r["requests"]),
                ms(r["follower_cpu_per_request"], 3),
                each,
                "-" if r["leader_over_follower"] is None else f"{r['leader_over_follower']:.1%}",
                number(r["redis_commands_total_per_request"], 1),
                ms(r["redis_cpu_per_request"], 3),
                "-" if r["redis_cpu_per_command"] is None else f"{r['redis_cpu_per_command'] * 1e6:.1f} us",
            ]
        )
        models = sum(len(x["models"]) for x in r["leaders"])
        if models > 1:
            result.targets.append(
                Target(
                    "replicas leading the models' decisions (one lease per model)",
                    f"= {models}, one per model",
                    label,
                    float(len(r["leaders"])),
                    threshold=float(models),
                    fail_at=float(models) - 0.5,
                )
            )
    for label, r in runs.items():
        commands = ", ".join(f"{k} {v:.2f}" for k, v in r["redis_commands_per_request"].items())
        messages = ", ".join(f"{k} {v:.2f}" for k, v in r["messages_per_request"].items())
        result.notes.append(f"{label}: Redis commands per request: {commands}; messages per request: {messages}.")
    result.notes.append(
        "CPU figures are each process's CPU time over the load window (from the first request sent until the last "
        "one ended) minus its idle rate over an idle window as long just before (heartbeats, scrapes). Redis: its "
        "main thread's CPU (INFO cpu). All processes share this machine's cores with the load generator."
    )
    result.notes.append(
        "At this light load nearly every message is a Redis round trip of its own at each end; a busy leader reads "
        "and writes many per round trip, so its CPU per request falls with the load (CN measures it there)."
    )
    result.raw = {label: jsonable(r) for label, r in runs.items()}
    return result


def _load_result(
    load: dict[str, Any] | None,
    follower_cpu: float | None,
    p: CLParams,
    failed: str,
    workload: str,
) -> ScenarioResult:
    if load is None:
        return ScenarioResult.unavailable(LOAD_ID, LOAD_TITLE, workload, failed or "-")
    result = ScenarioResult(LOAD_ID, LOAD_TITLE, workload, "instant fake engine (bench/fake_engine.py)")
    result.table = Table(
        [
            "offered",
            "ended",
            "Admit -> Grant p50 / p99",
            "leader CPU / request",
            "leader core share",
            "÷ follower CPU / request (CL)",
            "Redis commands / request",
            "Redis CPU / request",
            "driver CPU",
        ]
    )
    for step in load["steps"]:
        result.table.rows.append(
            [
                f"{step['rate']:g} req/s",
                f"{step['ended']} / {step['admitted']}",
                f"{ms(step['grant_latency_p50'], 1)} / {ms(step['grant_latency_p99'], 1)}",
                ms(step["leader_cpu_per_request"], 3),
                "-" if step["leader_core_share"] is None else f"{step['leader_core_share']:.0%}",
                _share(divide(step["leader_cpu_per_request"], follower_cpu)),
                number(step["redis_commands_per_request"], 1),
                ms(step["redis_cpu_per_request"], 3),
                f"{step['driver_cpu']:.2f} s",
            ]
        )
    best = sustained(load, p)
    followers = None if best is None or follower_cpu is None else best["rate"] * follower_cpu
    result.targets.append(
        Target(
            "leader CPU per follower-owned request ÷ the follower's own CPU for it, at the highest sustained step",
            f"<= {TARGET:.0%} (one leader serves at least ten followers)",
            "one leader" if best is None else f"one leader at {best['rate']:g} req/s",
            None if best is None else divide(best["leader_cpu_per_request"], follower_cpu),
            threshold=TARGET,
            fail_at=1.5 * TARGET,
            higher_is_better=False,
            unit="%",
        )
    )
    result.notes.append(
        f"The follower's own CPU per request comes from CL's one-model run in the same bench run "
        f"({ms(follower_cpu, 3)}); a sustained step ended every request with a median Admit -> Grant under "
        f"{p.sustained_latency * 1000:.0f} ms. The highest sustained step carries "
        + ("-" if followers is None else f"{followers:.1f}")
        + " followers' worth of requests (its rate times the follower's CPU per request: busy cores of "
        "followers). Leader CPU is its process's CPU minus its idle rate (8 backends scraped every 0.1 s: "
        f"{load['leader_idle_cpu_per_second']:.0%} of a core); Redis: its main thread's CPU (INFO cpu) minus its "
        "idle rate, and every command it ran (the driver's too)."
    )
    result.raw = jsonable(load)
    return result


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


_P = CLParams()
DEFINITION = Definition(
    id=ID,
    title=TITLE,
    question="What does deciding for the followers' requests cost a model's leader, against what serving them "
    "costs the followers, and what does each request cost Redis?",
    workload=f"{_P.rate:g} requests/s of {_P.tokens} tokens from {_P.users} users for {_P.duration:g} s, each call to "
    "a replica that leads no model; once for one model, once spread over "
    f"{_P.models} models",
    layout="three scheduler replicas on a private redis-server in front of the simulator; an idle window as long "
    "as the load window just before gives each process's idle rate",
    measures="each process's CPU per request (from /proc, less its idle rate), Redis's CPU and commands per "
    "request (INFO), messages per request by type; which replica leads which model",
    targets=(f"with {_P.models} models: {_P.models} replicas lead, one per model",),
    command="python -m bench --scenarios CL",
    duration="about a minute (CL and CN run together)",
    facts=(
        "At light load nearly every message is a Redis round trip of its own, so a leader's CPU per request is "
        "highest there; it falls as a busy leader reads and writes many messages per round trip (CN).",
    ),
    headline=("replicas leading the models' decisions (one lease per model)",),
)
LOAD_DEFINITION = Definition(
    id=LOAD_ID,
    title=LOAD_TITLE,
    question="Can one leader decide for ten followers' requests?",
    workload=f"synthetic followers ({_P.load_followers}, `bench.leader_load`) sending one leader their "
    f"messages at {', '.join(f'{r:g}' for r in _P.load_rates)} requests/s, {_P.load_step:g} s a step",
    layout=f"one real leader replica on a private redis-server, {_P.load_engines} backends behind one instant "
    "fake engine",
    measures="the leader's CPU per request (less its idle rate) and core share, Admit -> Grant latency, Redis's "
    "commands and CPU per request, at each step",
    targets=(
        f"at the highest sustained step, the leader's CPU per follower-owned request <= {TARGET:.0%} of the "
        "follower's own (CL's, same run)",
    ),
    command="python -m bench --scenarios CL",
    duration="with CL",
    headline=("leader CPU per follower-owned request ÷ the follower's own CPU for it, at the highest sustained step",),
)
