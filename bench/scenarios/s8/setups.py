"""S8's setups and workload shape: the three backend choices under vtc, the users' own system prompts and
questions, and the scheduler's config with one backend per replica."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.configs import SCHEDULED_MODEL, STANDARD_CLASS, scheduler_config, validated_toml
from bench.scenarios.s8.replicas import Replica

TITLE = "locality across replicas"
GATE_TARGET = 3
FLOODER = "u0"

# Words every engine's tokenizer knows (the tiny Llama's vocabulary has each as one token), so a prompt of
# N of them is about N tokens on real vLLM; the simulator counts 4 characters a token.
_WORD_TEXT = (
    "the of and to in is it you that he was for on are with as his they be at one have this from or had by "
    "hot word but what some we can out other were all there when up use your how said an each she which do "
    "their time if will way about many then them write would like so these her long make thing see him two "
    "has look more day could go come did number sound no most people my over know water than call first who"
)
WORDS = _WORD_TEXT.split()


@dataclass(frozen=True)
class Setup:
    label: str
    backend_policy: str
    deficit_bound: float = 0.0
    index_max_bytes: int = 0  # the locality index per backend (0: the service's default)


@dataclass(frozen=True)
class S8Params:
    users: int = 8
    system_tokens: int = 1008  # 63 blocks of 16 tokens: every system prompt ends on a block boundary
    chars_per_token: int = 4  # the simulator's tokenizer; 0: count words (real vLLM's tiny model)
    answer_tokens: int = 64
    question_tokens: int = 16  # room for the question in the engine's context and KV-cache sizing
    flood_concurrency: int = 64  # the flooder's requests outstanding
    concurrency: int = 8  # every other user's (enough to stay backlogged at the scheduler)
    max_num_seqs: int = 16  # per replica
    prefill_per_token_ms: float = 0.1  # 100 ms for a 1,000-token prompt: about 4 decode steps at batch 16
    prefix_cache_blocks: int = 256  # per replica: four of the eight system prompts (4 x 63 = 252 blocks)
    warmup: float = 10.0
    window: float = 30.0
    latecomer_offsets: tuple[float, ...] = (3.0, 8.0, 13.0, 18.0, 23.0)  # seconds into the window
    timeout: float = 60.0
    seed: int = 8

    @property
    def deficit_bound(self) -> float:
        """D-LPM's bound: one request's VTC charge in this workload (prompt + 2 x answer tokens)."""
        return float(self.system_tokens + self.question_tokens + 2 * self.answer_tokens)


# Real vLLM: 4 slots per replica (as R1), prompts of 1,000 words (about 1,000 tokens), a longer window for
# a slower engine; the closed loops keep the same shape (the flooder 4x the others).
VLLM_PARAMS = S8Params(
    system_tokens=1000,
    chars_per_token=0,
    flood_concurrency=16,
    concurrency=4,
    max_num_seqs=4,
    warmup=15.0,
    window=60.0,
    latecomer_offsets=(5.0, 15.0, 25.0, 35.0, 45.0),
    timeout=180.0,
)

BASELINE = "least_loaded + vtc (baseline)"
LOCALITY = "prefix_locality + vtc"
DLPM = "prefix_locality + vtc + deficit_bound (D-LPM)"


def setup_list(p: S8Params) -> list[Setup]:
    return [
        Setup(BASELINE, "least_loaded"),
        Setup(LOCALITY, "prefix_locality"),
        Setup(DLPM, "prefix_locality", p.deficit_bound),
    ]


def users(p: S8Params) -> list[str]:
    return [f"u{i}" for i in range(p.users)]


def system_prompt(user: str, p: S8Params) -> str:
    """The user's own system prompt: words drawn with the user's seed, `system_tokens` long (characters / 4
    on the simulator, exactly that many characters so it ends on a block boundary; words on real vLLM)."""
    rng = random.Random(f"{p.seed}:{user}")
    if p.chars_per_token <= 0:
        return f"System prompt of {user}: " + " ".join(rng.choice(WORDS) for _ in range(p.system_tokens))
    chars = p.system_tokens * p.chars_per_token
    text = f"System prompt of {user}:"
    while len(text) < chars:
        text += " " + rng.choice(WORDS)
    return text[:chars]


def question(user: str, n: int) -> str:
    """A short question (under one 64-character block, so only the system prompt's blocks are cached)."""
    return f"\n{user} asks question {n}: what is the next step?"


def scheduler_toml(setup: Setup, replicas: Sequence[Replica], max_num_seqs: int) -> str:
    """One model, one backend per replica, the setup's backend policy (and D-LPM bound), vtc fairness."""
    config = scheduler_config(
        engine_url=replicas[0].url,
        model=SCHEDULED_MODEL,
        engine_model=replicas[0].model,
        fairness="vtc",
        classes=STANDARD_CLASS,
        waiting_target=GATE_TARGET,
        max_num_seqs=max_num_seqs,
    )
    model = config["models"][0]
    base = model["backends"][0]
    model["backends"] = [
        {**base, "name": f"engine-{i}", "url": r.url, "engine_model": r.model} for i, r in enumerate(replicas)
    ]
    model["backend_policy"] = setup.backend_policy
    locality: dict[str, Any] = {}
    if setup.deficit_bound > 0:
        locality["deficit_bound"] = setup.deficit_bound
    if setup.index_max_bytes > 0:
        locality["index_max_bytes"] = setup.index_max_bytes
    if locality:
        model["locality"] = locality
    return validated_toml(config)
