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
takes the traffic of synthetic followers (`bench.scenarios.cl.followers`) at rising rates; its CPU per request (minus
its idle rate), core share and Admit -> Grant latency, Redis's commands and CPU per request. Target: at the
highest step it sustains, the leader's CPU per follower-owned request is at most 10% of the follower's own
CPU for it (CL's, same run), so one leader serves at least ten followers.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from bench.configs import NotAvailable
from bench.engines import EngineProvider
from bench.results import ScenarioResult
from bench.runner import run_modes
from bench.scenario import Definition, Options, Scenario
from bench.scenarios.cl.load import leader_under_load
from bench.scenarios.cl.setups import ID, LOAD_ID, LOAD_TITLE, TARGET, TITLE, CLParams, modes
from bench.scenarios.cl.summary import cluster_result, load_result
from bench.scenarios.cl.workload import body


async def run(provider: EngineProvider, options: Options, p: CLParams | None = None) -> list[ScenarioResult]:
    """CL's layouts side by side, then one leader under synthetic followers (CN); CN's target reads CL's
    follower CPU from the same run."""
    cluster_options = options.cluster
    p = p or CLParams()
    scale = cluster_options.scale
    p = dataclasses.replace(p, duration=p.duration * scale, load_step=p.load_step * scale)
    workload = (
        f"{p.rate:g} requests/s for {p.duration:g} s ({p.tokens} output tokens each, {p.users} users, vtc), every call "
        "to the next replica that leads no model, after an idle window as long; one model, then "
        f"{p.models} models on the same engine (the same rate spread over them)"
    )
    load_workload = (
        f"one leader replica, {p.load_followers} synthetic followers (bench/scenarios/cl/followers.py) playing a "
        f"follower's messages for requests of {p.tokens} tokens over 2 s; vtc without its return grace; one model on "
        f"{p.load_engines} backends of "
        f"{p.load_engine_slots} slots (an instant fake engine behind them); offered "
        f"{', '.join(f'{r:g}' for r in p.load_rates)} requests/s, {p.load_step:g} s each, after an idle window as long"
    )
    if "redis" not in cluster_options.stores:
        why = "needs the redis layout (--cluster-stores redis)"
        return [
            ScenarioResult.unavailable(ID, TITLE, workload, why),
            ScenarioResult.unavailable(LOAD_ID, LOAD_TITLE, load_workload, why),
        ]
    runs: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for mode, models in modes(cluster_options, p):
        done, missed = await run_modes(
            provider, [mode], functools.partial(body, p=p, models=models), timeout=2 * p.duration + p.timeout + 30
        )
        runs.update(done)
        skipped.update(missed)
    print("  one leader under synthetic followers ...", flush=True)
    load: dict[str, Any] | None = None
    load_failed = ""
    try:
        load = await leader_under_load(cluster_options, p)
    except (RuntimeError, OSError, NotAvailable, TimeoutError) as exc:
        load_failed = f"failed: {exc!r}"
    one_model = next((r for label, r in runs.items() if label.endswith(", 1 model")), None)
    follower_cpu = None if one_model is None else one_model["follower_cpu_per_request"]
    return [
        cluster_result(runs, skipped, workload, provider.describe()),
        load_result(load, follower_cpu, p, load_failed, load_workload),
    ]


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
    workload=f"synthetic followers ({_P.load_followers}, `bench.scenarios.cl.followers`) sending one leader their "
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
SCENARIO = Scenario((DEFINITION, LOAD_DEFINITION), run)
