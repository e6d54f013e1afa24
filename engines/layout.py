"""Where an engine's processes run: core layouts, and pinning an engine's processes to them.

On a GPU host the engine's compute runs on the accelerator while its HTTP front end, the scheduler and the
clients share the CPUs. On a 2-core machine the nearest equivalent gives the engine's compute core 1
and everything else core 0, so the engine's compute neither starves nor is starved by the front end and
the load. The other two layouts are the ways it goes wrong: all of the engine on one core (its front end
starved by its own compute) and everything shared (`make run` as shipped).

Two steps: :func:`place` before the engine starts (its command line and environment), then
:func:`pin_vllm` or :func:`pin_llamacpp` once it is ready (its processes and threads exist by then).
Linux only (``/proc`` and ``sched_setaffinity``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engines.process import EngineProcess


@dataclass(frozen=True)
class Layout:
    """Cores for each group of processes; None: no pinning (the whole machine)."""

    name: str
    label: str
    load_cpus: frozenset[int] | None  # the scheduler and the load generators
    front_cpus: frozenset[int] | None  # the engine's HTTP front end (vLLM's API server; llama-server's HTTP threads)
    compute_cpus: frozenset[int] | None  # vLLM's engine core and worker; llama-server's compute thread
    omp_bind: str | None  # VLLM_CPU_OMP_THREADS_BIND for the worker's OpenMP threads (None: vLLM's default)


LAYOUTS: dict[str, Layout] = {
    "gpu_host": Layout(
        "gpu_host",
        "like a GPU host: engine compute on core 1; its HTTP front end, the scheduler and the load on core 0",
        frozenset({0}),
        frozenset({0}),
        frozenset({1}),
        "1",
    ),
    "starved": Layout(
        "starved",
        "front end starved: all of the engine on core 1; the scheduler and the load on core 0",
        frozenset({0}),
        frozenset({1}),
        frozenset({1}),
        "1",
    ),
    "shared": Layout("shared", "all shared: every process on both cores (as `make run` ships)", None, None, None, None),
}


def available(layout: Layout) -> str | None:
    """None when this machine has the cores the layout names, else why not."""
    have = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    wanted = set().union(*(c for c in (layout.load_cpus, layout.front_cpus, layout.compute_cpus) if c))
    missing = wanted - have
    return None if not missing else f"needs cores {sorted(missing)}, this machine has {sorted(have)}"


def place(process: EngineProcess, kind: str, layout: Layout) -> None:
    """Before start: run the whole engine on the compute cores (its start-up does not compete with the front
    end's peers) and, for vLLM, bind its worker's OpenMP threads as the layout says."""
    if kind == "vllm" and layout.omp_bind is not None:
        process.env["VLLM_CPU_OMP_THREADS_BIND"] = layout.omp_bind
        process.env["OMP_NUM_THREADS"] = str(len(layout.compute_cpus or all_cpus()))
    if layout.compute_cpus is not None:
        process.argv = ["taskset", "-c", ",".join(map(str, sorted(layout.compute_cpus))), *process.argv]


def lay_out(
    process: EngineProcess,
    layout: Layout,
    kind: str = "vllm",
    on_pinned: Callable[[list[dict[str, object]]], object] | None = None,
) -> EngineProcess:
    """Run a vLLM engine (or the simulator standing in for one; not yet started) in `layout` at every start
    and restart: placed now, its front end and compute pinned each time it is ready, `on_pinned` then given
    the process table as pinned (the bench reports CPU by role from it). Returns the process.

    The session engines of the tests use this with the GPU-host layout: sharing two cores with its own
    compute (the worker's OpenMP threads and the engine core poll while they wait on each other), vLLM's
    HTTP front end ran so little that it read the engine's outputs, took in requests and answered /metrics
    only when the engine had drained: every sample of a flood read 0 running (fresh-clone CI)."""
    if kind not in ("vllm", "sim"):
        raise ValueError(f"lay_out pins vLLM's process tree (or the simulator's), not {kind!r}")
    place(process, kind, layout)

    def pin(started: EngineProcess) -> None:
        if started.pid is not None:
            table = pin_vllm(started.pid, layout)
            if on_pinned is not None:
                on_pinned(table)

    process.on_ready = pin
    return process


def all_cpus() -> frozenset[int]:
    """Every core of the machine (what "no pinning" pins to)."""
    return frozenset(range(os.cpu_count() or 1))


def thread_ids(pid: int) -> list[int]:
    """The thread ids of ``pid`` (empty once it is gone)."""
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def pin_process(pid: int, cpus: frozenset[int] | None) -> None:
    """Every thread of `pid` onto `cpus` (affinity is per thread on Linux; `taskset -a -p`)."""
    for tid in thread_ids(pid):
        pin_thread(tid, cpus)


def pin_thread(tid: int, cpus: frozenset[int] | None) -> None:
    """One thread onto ``cpus`` (None: every core)."""
    with contextlib.suppress(OSError):  # a thread that just ended
        os.sched_setaffinity(tid, cpus or all_cpus())


def descendants(pid: int) -> list[int]:
    """Every process below `pid` in the process tree (vLLM's engine core and its worker)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def comm(pid: int) -> str:
    """The process's command name, as ``ps`` shows it ("?" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of a process (or one of its threads) so far."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def affinity(pid: int) -> str:
    """The cores a process (or thread) may run on, e.g. "0,1" ("?" once it is gone)."""
    try:
        cpus = sorted(os.sched_getaffinity(pid))
    except OSError:
        return "?"
    return ",".join(map(str, cpus))


def pin_vllm(pid: int, layout: Layout) -> list[dict[str, object]]:
    """vLLM: the API server (the process we started) on the front-end cores, every process below it (engine
    core, worker) on the compute cores. Returns the process table as pinned."""
    pin_process(pid, layout.front_cpus)
    table: list[dict[str, object]] = [{"pid": pid, "name": comm(pid), "role": "HTTP front end", "cpus": affinity(pid)}]
    for child in descendants(pid):
        pin_process(child, layout.compute_cpus)
        table.append({"pid": child, "name": comm(child), "role": "engine core / worker", "cpus": affinity(child)})
    return table


def pin_llamacpp(pid: int, layout: Layout) -> list[dict[str, object]]:
    """llama-server is one process: its compute runs on one thread (`--threads 1`, the slot loop on the main
    thread), HTTP on a pool of other threads. The thread that used the most CPU so far (after a warm-up
    request: the compute thread) goes to the compute cores, every other thread to the front-end cores."""
    tids = thread_ids(pid)
    compute = max(tids, key=lambda tid: cpu_seconds(pid, tid)) if tids else pid
    table: list[dict[str, object]] = []
    for tid in tids:
        cpus = layout.compute_cpus if tid == compute else layout.front_cpus
        pin_thread(tid, cpus)
        role = "compute (slot loop, -t 1)" if tid == compute else "HTTP / other"
        table.append({"pid": pid, "tid": tid, "name": comm(pid), "role": role, "cpus": affinity(tid)})
    return table
