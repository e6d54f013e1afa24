"""S9 as the bench runs and records it: its definition and its one run of every part at full size."""

from __future__ import annotations

import asyncio

from bench.engines import EngineProvider
from bench.results import ScenarioResult
from bench.scenario import Definition, Options, Scenario
from bench.scenarios.s9.parts import S9Params, run_parts
from bench.scenarios.s9.summary import TITLE, build_result

__all__ = ["SCENARIO", "run"]


async def run(
    provider: EngineProvider, options: Options | None = None, p: S9Params | None = None
) -> list[ScenarioResult]:
    """Every part at full size (the engine provider is not used: the engines are modelled in-process)."""
    p = p or S9Params()
    figures = await asyncio.to_thread(run_parts, p)
    return [build_result(figures, p, targets=p == S9Params())]


_P = S9Params()
DEFINITION = Definition(
    id="S9",
    title=TITLE,
    question="Does a scheduling decision cost the same with ten or ten thousand users waiting, and does the "
    "core keep up with a hundred engines and ten thousand users in an hour of traffic?",
    workload=f"decision cost: {', '.join(f'{u:,}' for u in _P.users)} users backlogged over three classes, each "
    f"with requests enough to stay backlogged through {_P.dispatches:,} dispatches; every fairness policy at "
    f"{_P.policy_users[0]:,} and {_P.policy_users[1]:,} users. Day: {_P.day.users:,} users whose rates follow "
    f"a Zipf law, prompts and answers from a fixed mix, one Poisson stream at {_P.day.load:g}x the engines' "
    f"capacity for {_P.day.seconds:g} simulated seconds. Memory: {_P.memory.requests:,} requests from "
    f"{_P.memory.users:,} users with {_P.memory.prompt_bytes} B prompts, queued behind full engines",
    layout="the core in-process on a virtual clock against a model of the simulator's engine (continuous "
    "batching, the simulator's step-time rule and prefix cache, skipping from one change of the batch to the "
    "next). Decision cost: one model on 100 engines of 8 slots, prefix_locality, vtc, the signals gate; "
    "beside it the same with the walks put back (the fairness policy scanning every backlogged user, every "
    f"gate asked at every pass). Day: {_P.day.engines} engines of {_P.day.max_num_seqs} slots over 3 models; vtc "
    "against FIFO (every call under one user, so one queue per model in arrival order). Memory: a fresh process "
    "that loads the core alone (with its vLLM adapters); a serving process also loads its faces' libraries "
    "(gRPC, protobuf, OpenTelemetry, the Redis client), which the figure leaves out",
    measures="CPU (process time) per admission and per dispatch: the median over passes of a pass's CPU over "
    "what it sent; in the day, light users' TTFT p50 and p99 (unserved calls count with their wait so far), "
    "the heaviest user's share of its model's service against its max-min fair share, vtc's stated "
    "service-difference bound checked after every event for the heaviest users' pairs, the share of engine "
    "steps with every slot busy while work was queued, CPU per simulated request, wall time; resident memory "
    "and bytes per queued request beyond its prompt",
    targets=(
        "median dispatch CPU at 10,000 users <= 2x at 10 users",
        "median dispatch CPU at 10,000 users < 100 us",
        "the simulated hour in <= 10 minutes of wall time (each setup)",
        "vtc's largest service difference within its stated bound",
        "resident memory <= 300 MB with 100,000 requests queued (prompts included)",
    ),
    facts=(
        "Without the D-LPM window a dispatch costs about the same at 10 and 10,000 backlogged users for every "
        "fairness policy; users in shared groups add a second level to choose in (about 2x). With the window on, "
        "a decision weighs at most `max_candidates` users within the bound of the least served, a prefix lookup "
        "each, so its cost stops growing once that many are backlogged: a few times the cost at 10 users, where "
        "fewer are weighed.",
        "In the day, vtc keeps light users' TTFT near the engines' own queueing while FIFO's grows with the "
        "backlog, and holds the heaviest user near its max-min fair share; under vtc fewer engine steps run "
        "with every slot busy while work is queued than under FIFO.",
    ),
    duration="about 20 minutes; `python -m bench.scenarios.s9` prints the same without a record, `--quick` in "
    "seconds at small sizes",
)
SCENARIO = Scenario((DEFINITION,), run, engines=("sim",))
