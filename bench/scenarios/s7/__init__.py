"""S7 faults: a flood at ten times the engine's capacity with caps on, while the engine is killed and
restarted, its metrics go dark for 10 s, clients cancel 1,000 requests (half queued, half running), reuse
live request ids and send oversized prompts. Every admitted request must end in exactly one outcome.
Then cancel storms: 100 streams (2,000-token answers, five users within their caps) behind an engine full
of them, all cancelled at once while freed slots go to the next of them; no engine request may outlive
its caller.

Each outcome is counted three ways that must agree: by the clients (how each call ended), by the
scheduler (`llmsched_request_outcomes_total`, scraped before and after) and by the engine (the
simulator's `--journal`, which survives its SIGKILL). The storms' cancels likewise: the calls the clients
cancelled, the scheduler's cancelled outcomes and engine aborts (`llmsched_engine_aborts_total`), and the
journal's aborted requests; an engine request a caller cancelled that the journal shows finished or never
ended is an orphan. The three are joined by a tag, not by request id:
every call's prompt starts with a line `s7:<n>` that the journal records as the request's `tag`, so the
join does not depend on what id the scheduler gives the engine (a server-made id) nor on the ids being
unique (duplicate ids are part of the test).

Runs alone (`python -m bench --scenarios S7`): it needs its own simulator (journal, kill, restart on the
same port) and a scheduler with its metrics endpoint on, so it does not use the shared `open_run`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.engines import EngineProvider
from bench.report import table_markdown
from bench.results import ScenarioResult
from bench.scenario import Definition, Options, Scenario
from bench.scenarios.s7.experiment import measure
from bench.scenarios.s7.params import TITLE, S7Params
from bench.scenarios.s7.summary import summarise, three_way, workload


async def run(
    provider: EngineProvider, options: Options | None = None, p: S7Params | None = None
) -> list[ScenarioResult]:
    """One S7 run on the simulator (its journal is the engine's count), its three-way table printed."""
    p = p or S7Params()
    text = workload(p)
    if provider.name != "sim":
        return [ScenarioResult.unavailable("S7", TITLE, text, "runs against the simulator only (its journal)")]
    workdir = Path(tempfile.gettempdir()) / "llmsched-bench"
    workdir.mkdir(exist_ok=True)
    f = await measure(p, workdir)
    print(table_markdown(three_way(f)), flush=True)
    return [summarise(f, p, text)]


_P = S7Params()
DEFINITION = Definition(
    id="S7",
    title=TITLE,
    question="Under overload and faults, does every admitted request end in exactly one outcome, and does "
    "memory stay within the caps?",
    workload=f"a flood at {_P.flood_factor:g}x the engine's capacity for {_P.flood_seconds:g} s from "
    f"{_P.flood_users} users; the engine SIGKILLed at {_P.kill_at:g} s and restarted; its metrics down "
    f"{_P.metrics_down_for:g} s from {_P.metrics_down_at:g} s; {_P.queued_cancels} cancels while queued and "
    f"{_P.running_cancels} while running; {_P.duplicates} live duplicate request ids; {_P.oversized} oversized "
    f"prompts; {_P.storm_rounds} cancel storms of {_P.storm_streams} streams ({_P.storm_tokens}-token answers) "
    "cancelled at once",
    layout=f"one simulator ({_P.max_num_seqs} slots, with its request journal, which survives SIGKILL) and one "
    f"scheduler with caps on (max_queued {_P.max_queued}, per user {_P.max_queued_per_user}, max_queued_bytes "
    f"{_P.max_queued_bytes:,})",
    measures="each admitted request's outcome, counted by the clients, by the scheduler "
    "(llmsched_request_outcomes_total) and by the engine's journal; refusals; peak RSS over idle",
    targets=(
        "the three counts agree; none lost; none served twice",
        "every cancelled running request aborted at the engine",
        "cancel storms: no engine request outlives its cancelled caller; clients, scheduler and journal agree",
        "duplicates answered ALREADY_EXISTS, oversized prompts PROMPT_TOO_LARGE",
        "peak minus idle RSS <= the bytes cap x 3.4 + max_queued x 24 KB",
    ),
    duration="about 2 minutes",
    facts=(
        "Clients do not cancel from 1 s before the kill to 3 s after the restart: a cancel that races the "
        "engine failing the same request is counted cancelled by the client and failed by the server, a race "
        "of the measurement and not a fault.",
        "The idle RSS is read after a warm-up flood, so one-time growth does not count as per-request memory.",
    ),
    headline=("admitted requests lost (no outcome)",),
)
SCENARIO = Scenario((DEFINITION,), run)
