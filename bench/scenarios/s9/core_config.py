"""The core S9 measures: one model on simulated vLLM engines, three classes, `prefix_locality`.

Apart from `decision_cost` so that the memory part, which runs in a fresh process, builds the same core while
importing nothing beyond it (`bench.product_core`).
"""

from __future__ import annotations

from typing import Any

MODEL = "m"
CLASSES = (("interactive", 0, 0), ("review", 1, 4), ("batch", 2, 8))  # (name, rank, engine priority)
PRIORITY_ENGINES = False


def config(
    backends: int, fairness: str, gate: str, deficit_bound: float, groups: dict[str, str] | None = None
) -> dict[str, Any]:
    """One model on `backends` simulated vLLM engines; `groups`: user -> its shared group (weight 1 each)."""
    weights = {"groups": {g: 1.0 for g in set(groups.values())}, "members": groups} if groups else {}
    return {
        "scheduling": {
            "fairness": fairness,
            "weights": weights,
            "classes": [
                {"name": name, "rank": rank, "engine_priority": priority, "starvation_after_seconds": 0.0}
                for name, rank, priority in CLASSES
            ],
        },
        "models": [
            {
                "name": MODEL,
                "backend_policy": "prefix_locality",
                "max_queued": 10**7,
                "max_queued_per_user": 10**6,
                "max_queued_bytes": 10**12,
                "max_queued_bytes_per_user": 10**12,
                "locality": {"deficit_bound": deficit_bound},
                "gate": {"policy": gate},
                "backends": [
                    {
                        "name": f"b{i}",
                        "kind": "vllm",
                        "url": f"http://b{i}.sim.invalid:8000",
                        "priority_scheduling": PRIORITY_ENGINES,
                        "max_num_seqs": 8,
                        "scrape_interval_seconds": 0.2,
                    }
                    for i in range(backends)
                ],
            }
        ],
    }
