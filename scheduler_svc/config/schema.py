"""The configuration's shape: frozen dataclasses, each field with its default, its doc and the values it
accepts, at the field (`fields.setting`, here `_field`; a test checks every field has them, and `llmsched
config-reference` prints them). The simple bounds are checked for every field by `fields.check_bounds`; the
TOML file is read and the rules between fields are checked by `scheduler_svc.app.settings`. A policy's own
parameters are declared by the policy (`scheduler_svc.policies`), in the table that names it: this package
is data, and imports no policy.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from backends.registry import BACKEND_KINDS
from scheduler_svc.config.fields import extra_keys, is_extra
from scheduler_svc.config.fields import setting as _field


@dataclass(frozen=True)
class ServerConfig:
    """Where the service listens and how it shuts down."""

    listen: str = _field("127.0.0.1:50051", "gRPC listen address (host:port; port 0 picks a free one).")
    metrics_listen: str = _field(
        "127.0.0.1:9464", "Prometheus /metrics HTTP address of the scheduler itself; empty disables it."
    )
    http_listen: str = _field(
        "",
        "OpenAI-compatible HTTP door (/v1/chat/completions, /v1/completions, /v1/models) address, served by "
        "the same process and queues as gRPC, with the same TLS settings; empty disables it.",
    )
    http_max_body_bytes: int = _field(
        0,
        "Largest HTTP request body the door reads: a larger Content-Length is refused at once, a body that "
        "grows past it while read likewise (413); 0: twice the largest max_prompt_bytes plus 256 KiB (JSON "
        "escaping may double a prompt). Prompts are still held to max_prompt_bytes.",
        bounds=">= 0",
    )
    http_max_reading_bytes: int = _field(
        0,
        "Request-body bytes the HTTP door holds while reading and parsing bodies, all connections together, "
        "past each body's first 64 KiB (those are read whatever the total, so ordinary requests still are): a "
        "body that would pass it is refused with 503 (reason READ_CAPACITY_FULL), so many slow or stalled "
        "large bodies hold bounded memory. 0: 16 x the body limit (36 MiB at the defaults).",
        bounds=">= 0",
    )
    http_max_reading_bytes_per_user: int = _field(
        0,
        "The same bound for one caller's bodies, all their bytes (the caller is identified before its body "
        "is read), so one caller's slow bodies leave room for everyone else's. 0: 4 x the body limit (9 MiB "
        "at the defaults). At least the body limit, at most http_max_reading_bytes.",
        bounds=">= 0",
    )
    http_header_timeout_seconds: float = _field(
        10.0,
        "From a request's first byte, how long the HTTP door waits for its headers to be complete; then it "
        "answers 408 (reason READ_TIMEOUT) and closes the connection.",
        bounds="> 0",
    )
    http_body_timeout_seconds: float = _field(
        30.0,
        "From a request's headers, how long the HTTP door waits for its whole body; then 408 (READ_TIMEOUT) "
        "and the connection is closed. Bounds a slow or stalled body whatever its Content-Length says.",
        bounds="> 0",
    )
    http_idle_timeout_seconds: float = _field(
        15.0,
        "An HTTP connection with no request in progress (kept alive between requests, or opened and silent) "
        "is closed after this long. Over the SDKs' own pool expiry (httpx: 5 s), so they rarely send on a "
        "connection being closed.",
        bounds="> 0",
    )
    http_user_header: str = _field(
        "x-user-id",
        "Without API keys or client-certificate identity, the HTTP door takes the user id from this header "
        "(set it from a trusted proxy). The body's `user` / `safety_identifier` never decides identity.",
        bounds="1-64 of a-z 0-9 -",
    )
    shutdown_grace_seconds: float = _field(
        10.0, "On SIGTERM: how long queued and running requests may drain before they are cut."
    )
    queue_update_interval_seconds: float = _field(
        1.0,
        "A streaming client waiting in the queue is told its new position when it changes, at most this "
        "often (per model: one pass over the queues whose head moved, none while nothing moves).",
    )
    unhealthy_after_failed_passes: int = _field(
        3,
        "Health turns NOT_SERVING when a model's dispatch loop fails this many passes in a row with an "
        "unexpected error (counted in llmsched_internal_errors_total); SERVING again after a good pass.",
        bounds=">= 1",
    )
    unhealthy_after_stalled_seconds: float = _field(
        30.0,
        "Health turns NOT_SERVING when a model has had work queued and a gate open for the best queued class "
        "for this long without a single dispatch (a wedged loop); 0 disables the check.",
        bounds=">= 0",
    )
    stream_read_interval_seconds: float = _field(
        0.05,
        "About how much later than generated a streamed token may reach its client, to save CPU per "
        "token. Past its first stream_read_after_tokens tokens, an answer is read from its engine at most "
        "this often (on one grid for all answers) and what arrived in between leaves in one message; a "
        "vLLM engine is also asked to group the tokens of longer answers within it (stream_interval, "
        "sized from its time per output token; both together can make it up to twice this). Time to "
        "first token and the end of an answer are untouched. 0: every token as it arrives; else 0.005-1. The "
        "default 0.05 halves the scheduler's CPU per token and cuts vLLM's front end's (the process that "
        "takes new requests in, on the scheduler's core on a GPU host): docs/benchmarks.md, R1.",
        bounds="0, or 0.005 to 1",
    )
    stream_read_after_tokens: int = _field(
        32,
        "Tokens an answer carries, read as they arrive, before stream_read_interval_seconds applies; an "
        "answer asking for at most this many is not grouped by the engine either.",
        bounds=">= 0",
    )
    stream_group_at_engine: bool = _field(
        True,
        "With stream_read_interval_seconds set, also ask a vLLM engine to group the tokens of longer answers "
        "(its per-request stream_interval); false: the engine sends every token and only the reads here are "
        "paced.",
    )
    event_loop: str = _field(
        "uvloop",
        "The process's event loop: \"uvloop\" (about a fifth less CPU per streamed token than asyncio's own, "
        'measured on the simulator) or "asyncio" (the standard library\'s, for debugging).',
    )
    log_format: str = _field("console", 'Log output: "console" (human) or "json" (one object per line).')
    log_level: str = _field("info", "Minimum log level: debug, info, warning, error.")
    tls_cert_file: str = _field(
        "",
        "PEM certificate chain of the service. With tls_key_file, every listener (gRPC, metrics) speaks "
        "TLS only; both empty: plaintext. Read at startup.",
    )
    tls_key_file: str = _field("", "PEM private key (unencrypted) for tls_cert_file; set both or neither.")
    tls_client_ca_file: str = _field(
        "",
        "PEM CA bundle for mutual TLS: when set, every listener requires a client certificate signed by it "
        "(see auth.identity_from_client_cert). Needs tls_cert_file and tls_key_file.",
    )


@dataclass(frozen=True)
class AuthConfig:
    """How callers are identified."""

    api_key_sha256: dict[str, str] = _field(
        {},
        "Hex SHA-256 digest of an API key -> user id (`printf %s KEY | sha256sum` or `llmsched hash-key`). "
        "With any key configured (here, api_keys_file or api_keys_env), every call needs "
        "`authorization: Bearer <key>` and the key alone decides the user (x-user-id is ignored).",
    )
    api_keys_file: str = _field(
        "",
        "File of API keys, one `<user> <key>` or `<user> sha256:<hex digest>` per line (# comments); read "
        "at startup, merged with api_key_sha256. Empty: none.",
    )
    api_keys_env: str = _field(
        "", "Name of an environment variable holding API keys in the api_keys_file format. Empty: none."
    )
    admin_users: list[str] = _field(
        [], "Users allowed to call GetQueueState (it shows every user's queue); empty: any identified caller."
    )
    trust_user_header: bool = _field(
        False,
        "Allow admin_users with identities taken from x-user-id (no API keys, no client certificates). Only "
        "for deployments where a trusted proxy sets x-user-id: otherwise anyone can claim to be an admin.",
    )
    identity_from_client_cert: bool = _field(
        False,
        "The user is the client certificate's identity: its first DNS or URI SAN, else its subject CN "
        "(needs server.tls_client_ca_file; cannot be combined with API keys).",
    )


@dataclass(frozen=True)
class PriorityClassConfig:
    """A priority class (band). Lower `rank` is served first; fairness applies among users within a band.

    The gate fields make the class's own admission rule: each applies only when set (0 / false = off).
    """

    name: str = _field("interactive", "Class name clients put in `priority_class`.")
    rank: int = _field(0, "Strict band order: a lower rank is dispatched before a higher one.")
    engine_priority: int = _field(
        0, "Base numeric priority sent to engines with priority scheduling (vLLM: lower is served first)."
    )
    waiting_target: int = _field(
        0, "This class's engine waiting-queue target; 0 means the model gate's.", bounds=">= 0"
    )
    max_tpot_seconds: float = _field(
        0.0, "Hold the class back while the engine's time per output token exceeds this (0: no limit).", bounds=">= 0"
    )
    max_kv_cache_usage: float = _field(
        0.0, "Hold the class back while the engine's KV-cache usage (0..1) exceeds this (0: no limit).", bounds="0 to 1"
    )
    max_engine_running: int = _field(
        0,
        "Dispatch only while the engine runs fewer requests than this (0: no limit). Set it below the "
        "engine's max_num_seqs for batch work, so free slots are left for interactive arrivals: engines "
        "do not preempt a running request for a waiting one of higher priority.",
        bounds=">= 0",
    )
    max_engine_running_when_contended: int = _field(
        0,
        "While a better-ranked class runs a request, or had one admitted, sent or finished within "
        "`contention_window_seconds`, dispatch this class only while the engine runs fewer requests "
        "than this (0: off). An engine's step gets slower as its batch grows, and a new request waits "
        "about two steps for its first token, so this keeps interactive TTFT near the idle engine's; "
        "once the better classes go quiet the class fills up to max_engine_running again.",
        bounds=">= 0",
    )
    contention_window_seconds: float = _field(
        30.0,
        "How long after a better-ranked class's last activity `max_engine_running_when_contended` holds.",
        bounds=">= 0",
    )
    require_idle_engine: bool = _field(
        False, "Dispatch only while the engine's waiting queue is empty (batch work fills idle capacity)."
    )
    queue_ttl_seconds: float = _field(
        0.0,
        "A request still queued after this long ends with DEADLINE_EXCEEDED (0: only the call deadline).",
        bounds=">= 0",
    )
    starvation_after_seconds: float = _field(
        60.0,
        "Anti-starvation: when this band's oldest request has waited this long while higher bands keep "
        "the engine busy, one request of it goes ahead under the top band's gate (0: may starve).",
        bounds=">= 0",
    )


DEFAULT_CLASSES = [
    PriorityClassConfig("interactive", rank=0, engine_priority=0, max_tpot_seconds=0.15),
    PriorityClassConfig("review", rank=1, engine_priority=5, starvation_after_seconds=30.0),
    PriorityClassConfig("batch", rank=2, engine_priority=10, require_idle_engine=True, starvation_after_seconds=60.0),
]


@dataclass(frozen=True)
class WeightsConfig:
    """Fair-share weights: a user with weight 2 gets twice the service of a user with weight 1.

    A user in a group shares the group's weight with its other backlogged members (two-level fairness:
    groups first, then users within the group). Used by the weighted policies; round_robin ignores them.
    """

    default: float = _field(1.0, "Weight of a user (or group) not listed.", bounds="> 0")
    users: dict[str, float] = _field({}, "User id -> weight.", bounds="values > 0")
    groups: dict[str, float] = _field({}, "Group name -> weight.", bounds="values > 0")
    members: dict[str, str] = _field({}, "User id -> group name.")


@dataclass(frozen=True)
class GateConfig:
    """When the dispatcher may send one more request to a backend."""

    policy: str = _field("signals", "Gate policy name (see `llmsched policies`).")
    waiting_target: int = _field(
        3,
        "Dispatch only while the engine's waiting queue (last reading, corrected for what was sent and "
        "started since) stays below this.",
        bounds=">= 1",
    )
    priority_waiting_target: int = _field(
        0,
        "At an engine that takes priorities (`priority_scheduling`), the target for what a request would "
        "queue behind there: only what the engine serves before it counts, so a latecomer whose priority "
        "beats the queued work jumps it whatever its depth. A deeper queue than `waiting_target` there keeps "
        "the engine's slots full when its HTTP front end hands requests in late (a busy API server), at no "
        "cost to those who jump it. 0: derived from the engine's slots (its max_num_seqs, configured or "
        "learned): 1.5 x the slots, rounded up, at least `waiting_target` (6 at 4 slots); `waiting_target` "
        "while the slots are unknown. A class's own `waiting_target` wins over both.",
        bounds=">= 0",
    )
    waiting_target_adapt_seconds: float = _field(
        2.0,
        "At an engine without priorities everything in its queue is ahead of the next arrival, so the gate "
        "keeps that queue only as deep as the engine's slots need (max_num_seqs known or learned): from "
        "`waiting_target` one lower after this many seconds of readings with every slot busy, one higher "
        "(up to `waiting_target`) when a reading shows a slot freed with nothing waiting while the gate held "
        "work back. 0: always `waiting_target`.",
        bounds=">= 0",
    )
    stale_after_seconds: float = _field(
        1.0, "A metrics reading older than this (or a failed scrape) no longer opens the gate."
    )
    fallback_max_in_flight: int = _field(
        4,
        "While metrics are stale or unreadable, allow at most this many requests in flight to the "
        "backend: a dead metrics endpoint degrades to a concurrency cap, not a flood or a stall.",
        bounds=">= 1",
    )
    step_model_half_life_seconds: float = _field(
        30.0,
        "The TPOT limit is held by predicting each engine's step time at one more request from a line "
        "(step = a + b * running batch) learned from its readings; a reading's weight halves after this "
        "long, so the line follows an engine that gets slower or faster.",
        bounds="> 0",
    )


@dataclass(frozen=True)
class BackendConfig:
    """One inference engine serving a model."""

    name: str = _field("", "Unique name of this backend within its model (shown to clients).")
    kind: str = _field("vllm", f"Engine type: one of {', '.join(BACKEND_KINDS)}.")
    url: str = _field("http://127.0.0.1:8000", "Base URL of the engine's HTTP server.", bounds="http:// or https://")
    engine_model: str = _field("", "Model name the engine serves; empty means the model's own name.")
    priority_scheduling: bool = _field(
        False, "The engine runs priority scheduling (vLLM --scheduling-policy priority): send priorities."
    )
    max_num_seqs: int = _field(
        0,
        "The engine's batch size, its slots (vLLM --max-num-seqs, llama.cpp -np, TGI's max batch), which "
        "engines do not export. Known, requests the engine can still admit into free slots do not count as "
        "waiting (short requests keep a large batch full), the FIFO queue depth adapts, and a priority "
        "engine's waiting target follows it. 0: learned from the engine's metrics (learn_max_num_seqs).",
        bounds=">= 0",
    )
    learn_max_num_seqs: bool = _field(
        True,
        "With max_num_seqs = 0, learn the slots from the engine's metrics: once a reading shows requests "
        "waiting while its KV cache is not full (the engine had no free slot), the most requests any "
        "reading showed running; it only grows, and never exceeds the true count. Until then (a fresh "
        "engine, never saturated) the slots are unknown and every request without a first token counts as "
        "waiting, which never over-fills the engine. false: unknown for good.",
    )
    metrics_path: str = _field("/metrics", "Path of the engine's Prometheus metrics.")
    scrape_interval_seconds: float = _field(0.2, "How often the engine's metrics are read.", bounds="> 0")
    connect_timeout_seconds: float = _field(5.0, "TCP connect timeout towards the engine.")
    max_connections: int = _field(1024, "Maximum simultaneous HTTP connections to the engine.")
    idle_connection_seconds: float = _field(
        2.0,
        "An idle connection to the engine is closed after this long. Keep it under the engine's own "
        "keep-alive (vLLM and uvicorn: 5 s), or a request can go out on a connection the engine is closing.",
        bounds="> 0",
    )
    drained: bool = _field(
        False,
        "Maintenance: no new request goes to this backend, the ones it runs finish, and the queue goes to the "
        "model's other backends. Changes live with a reload (SIGHUP); `llmsched backend drain NAME` does the "
        "same without editing the file.",
    )


@dataclass(frozen=True)
class LocalityConfig:
    """Prefix-cache locality: how the `prefix_locality` backend policy remembers prompts and weighs load,
    and how far the locality-aware order (D-LPM) may stray from the fairness policy's own choice."""

    block_chars: int = _field(
        64,
        "Prompt characters per hashed block (64: 16 tokens at 4 characters a token, vLLM's block size); a "
        "block matches only with its whole prefix (hash chain over the prompt, or the messages in order).",
        bounds=">= 1",
    )
    max_blocks_per_request: int = _field(
        256,
        "Leading blocks of a prompt that are hashed and remembered; longer prompts match as this long.",
        bounds=">= 1",
    )
    index_max_bytes: int = _field(
        0,
        "Memory per backend for the block hashes recently sent there (192 bytes a block); the least recently "
        "sent are forgotten first. 0: as many blocks as the engine's KV cache holds, read from its metrics "
        "(vLLM's cache_config_info: num_gpu_blocks x block_size tokens, 4 characters a token), and 4 MiB "
        "(26,000 blocks) while the engine does not say; an index larger than the engine's cache points at "
        "prefixes it has evicted.",
        bounds=">= 0",
    )
    session_max_bytes: int = _field(
        16 << 20,
        "Memory for the session map (user and prompt_cache_key -> the backend its previous turns went to; "
        "about 220 bytes plus the key's length a session, 400 bytes plus the id's length a user), all users "
        "together; when it fills, the least recently active user's oldest session is forgotten first.",
        bounds=">= 0",
    )
    session_max_bytes_per_user: int = _field(
        64 << 10,
        "Memory for one user's sessions (its oldest forgotten first), so one user's keys never push out "
        "another's: 64 KiB holds about 130 sessions of 256-character keys, 250 of short ones.",
        bounds=">= 0",
    )
    max_load_factor: float = _field(
        1.5,
        "A backend whose in-flight count exceeds the model's average x this + load_slack is passed over "
        "for the next best backend, whatever it holds (locality never piles everything on one engine).",
        bounds=">= 1",
    )
    load_slack: int = _field(
        4, "In-flight requests a backend may be above max_load_factor x the average.", bounds=">= 0"
    )
    deficit_bound: float = _field(
        0.0,
        "Locality-aware order (D-LPM): among the users whose fair-share counter is within this of the "
        "smallest (counter units: vtc's prompt + 2 x generated tokens, or requests for weighted_round_robin, "
        "divided by weight), send the request with the longest prefix match; 0: the fairness policy's own "
        "choice. Needs a locality-aware backend_policy.",
        bounds=">= 0",
    )
    max_candidates: int = _field(
        64,
        "D-LPM: the most users one decision weighs, the least served within deficit_bound first, so a "
        "decision costs the same however many users are within the bound (each is a prefix lookup at "
        "every open backend).",
        bounds=">= 1",
    )


@dataclass(frozen=True)
class ModelConfig:
    """A model clients can ask for, with the engines that serve it."""

    name: str = _field("", "Model name clients use in requests.")
    default_max_tokens: int = _field(
        256, "max_tokens used when a request does not set it.", bounds="1 to max_tokens_limit"
    )
    max_tokens_limit: int = _field(8192, "Requests asking for more tokens than this are rejected.")
    gate: GateConfig = _field(GateConfig(), "Gate settings for this model's backends.")
    max_queued: int = _field(
        10000, "Requests queued for the model (all users) beyond which new ones get RESOURCE_EXHAUSTED.", bounds=">= 1"
    )
    max_queued_per_user: int = _field(
        1000, "Requests one user may have queued for the model; beyond it RESOURCE_EXHAUSTED.", bounds=">= 1"
    )
    max_end_users_per_user: int = _field(
        1000,
        "End users (named by a request's `end_user` field, OpenAI `user` field or `x-end-user-id`) one user may "
        "have requests queued or running for at once, for the model; a request of one more gets "
        "RESOURCE_EXHAUSTED (reason QUEUE_FULL). Each end user is a sub-flow served fairly inside its user's share.",
        bounds=">= 1",
    )
    max_prompt_bytes: int = _field(
        1 << 20,
        "Largest request accepted, in UTF-8 bytes of its prompt, every message's role and content, and its "
        "stop strings; larger ones get INVALID_ARGUMENT (reason PROMPT_TOO_LARGE), as do ones over a byte cap "
        "set below it (max_queued_bytes_per_user, max_queued_bytes), which they could never fit. gRPC's "
        "receive limit is set from the largest of these plus a margin, so the service answers, not the "
        "transport.",
        bounds="1 to 67108864",
    )
    max_queued_bytes: int = _field(
        256 << 20,
        "Prompt bytes (as max_prompt_bytes counts them) the model's queued and running requests may hold "
        "together; beyond it RESOURCE_EXHAUSTED with a retry hint (reason QUEUE_BYTES_FULL).",
        bounds=">= 1",
    )
    max_queued_bytes_per_user: int = _field(
        32 << 20,
        "Prompt bytes one user's queued and running requests for the model may hold; beyond it the same.",
        bounds=">= 1",
    )
    min_retry_after_seconds: float = _field(
        1.0,
        "The least retry delay a refusal for a full queue suggests (gRPC RetryInfo, HTTP Retry-After). The "
        "hint itself is the time until a tenth of the backlog in the way can have left the queue: at the "
        "recent dispatch rate and, while the engines are full, as running requests end (their remaining "
        "tokens at the engine's time per output token).",
        bounds="0.001 to 300",
    )
    failover_attempts: int = _field(
        1,
        "How many times a request that fails before its first token (engine unreachable, connection "
        "dropped, HTTP 5xx or 429) goes back to the head of its queue to be sent again, to another backend "
        "while the failed one cools down. 0: it fails at once with the engine's error.",
        bounds=">= 0",
    )
    failover_cooldown_seconds: float = _field(
        2.0,
        "After a backend fails a request before its first token (unreachable, overloaded), no request is sent "
        "to it for this long, whether or not that request may go again; then its gate decides again (a dead "
        "engine fails the next one fast and cools down again).",
        bounds=">= 0",
    )
    input_token_cost: float = _field(
        1.0,
        "Price of one prompt token of this model. The token-cost fairness policies (vtc, vtc_basic) multiply "
        "their own prompt weight (1) by it, so shares are counted in cost; with fairness_scope = global a "
        "token of a model priced 10 weighs ten times one priced 1. Also what llmsched_user_cost_total adds.",
        bounds="0 to 1000000",
    )
    output_token_cost: float = _field(
        1.0,
        "Price of one generated token of this model; multiplies the token-cost policies' generated-token "
        "weight (2), as input_token_cost does the prompt's. The defaults (1, 1) leave the shares as before. "
        "Under vtc or vtc_basic the two prices may not both be 0: every request would cost nothing and be "
        "shared by nothing.",
        bounds="0 to 1000000",
    )
    backends: list[BackendConfig] = _field([], "Engines serving the model (at least one).", bounds="at least one")
    backend_policy: str = _field(
        "least_loaded",
        'Which open backend takes a request (see `llmsched policies`): "least_loaded", or "prefix_locality" '
        "(the backend that most likely holds the prompt's prefix in its cache, within a load bound).",
    )
    locality: LocalityConfig = _field(LocalityConfig(), "Prefix-locality settings (backend_policy, D-LPM).")


@dataclass(frozen=True)
class SchedulingConfig:
    """How queued requests are chosen."""

    fairness: str = _field(
        "vtc",
        "Fairness policy between users of a band (see `llmsched policies`): vtc (tokens by weight, the "
        "recommended), vtc_basic, weighted_round_robin or round_robin.",
    )
    ordering: str = _field(
        "fcfs",
        "Ordering policy within one user's queue of a class: fcfs (arrival order) or edf (earliest deadline "
        "first: the call's deadline, else admitted_at + the class's queue_ttl_seconds, the earlier when both; "
        "requests with neither last; ties in arrival order). position_in_user_queue is the request's rank in "
        "this order within its user's queue of its class (under edf it may grow when a request with a closer "
        "deadline arrives); a request put back after a failed dispatch goes first again either way. A band's "
        "starvation age is its oldest queued request's wait whatever the order.",
    )
    default_class: str = _field("interactive", "Class used when a request leaves `priority_class` empty.")
    band_policy: str = _field(
        "strict_rank",
        "Band policy: which backlogged priority class sends next and under whose gate (see `llmsched "
        "policies`; strict_rank: best rank first, with each class's starvation_after_seconds guard).",
    )
    classes: list[PriorityClassConfig] = _field(
        DEFAULT_CLASSES, "The priority classes; names unique.", bounds="at least one; names unique"
    )
    weights: WeightsConfig = _field(WeightsConfig(), "Per-user and per-group fair-share weights.")
    fairness_scope: str = _field(
        "model",
        "Where a user's fair-share counter lives: model (one per model and priority class) or global (its "
        "spend is shared by every model's band of the same priority class, so heavy use of an expensive "
        "model is repaid on a cheap one; each band still lifts a returning user only as far as its own "
        "backlogged users' smallest counter, so switching model sheds no debt and joining one adds none).",
        bounds="model, global",
    )
    cost_accounts: dict[str, str] = _field(
        {},
        "Which users' cost llmsched_user_cost_total exports, and under which label: pattern -> label, the "
        "pattern an exact user id or a prefix ending in '*' (longest wins). Everyone else counts as 'other'.",
        bounds="a user id or a prefix ending in '*' -> a label of 1-64 characters",
    )
    engine_priority_per_inflight: int = _field(
        1,
        "Added to a request's engine priority for each request its user already has at that engine, so a "
        "user's second and third requests queue behind other users' first ones inside the engine.",
    )
    policy_params: dict[str, Any] = extra_keys(
        "The other keys of [scheduling]: the parameters of the policies chosen here, each declared with its "
        "default, values and meaning by its policy (scheduler_svc.policies; `llmsched config-reference`)."
    )

    def priority_class(self, name: str) -> PriorityClassConfig | None:
        """The class called `name`, if configured."""
        return next((c for c in self.classes if c.name == name), None)


@dataclass(frozen=True)
class ClusterConfig:
    """Several scheduler replicas acting as one: each model's leader decides for every replica's
    requests of that model, each replica serves, streams and cancels the calls it received. `store =
    "memory"` is one process on its own."""

    store: str = _field(
        "memory",
        'Where replicas meet: "memory" (this process alone, nothing shared) or "redis" (each model\'s leader, '
        "elected on its own Redis lease, queues and gates every replica's requests of that model; one lease for "
        'every model with scheduling.fairness_scope = "global"; see docs/cluster.md).',
        bounds="memory, redis",
    )
    redis_url: str = _field(
        "redis://127.0.0.1:6379/0",
        "Redis to meet on (redis://host:port/db, rediss:// for TLS, or unix:///path); without a password: that "
        "comes from redis_password_file or redis_password_env, never from this file.",
        bounds="redis://, rediss:// or unix://, no credentials",
    )
    redis_password_file: str = _field("", "File whose first line is the Redis password (AUTH); empty: none.")
    redis_password_env: str = _field("", "Environment variable holding the Redis password; empty: none.")
    redis_username: str = _field("", "Redis ACL user name (with a password); empty: the default user.")
    key_prefix: str = _field(
        "llmsched",
        "Prefix of every Redis key and stream, so several clusters can share one Redis.",
        bounds="1-64 of A-Z a-z 0-9 . _ : -",
    )
    replica_name: str = _field(
        "",
        "This replica's name, unique in the cluster: a second live replica with the same name is refused at "
        "start. Empty: the host name and the gRPC port.",
        bounds="empty, or 1-64 of A-Z a-z 0-9 . _ -",
    )
    heartbeat_interval_seconds: float = _field(
        0.5,
        "How often a replica renews its membership (and the leader its lease) and looks at the others.",
        bounds="> 0",
    )
    heartbeat_timeout_seconds: float = _field(
        2.0,
        "A replica (or the leader) silent this long is dead: its membership and lease expire, its queued "
        "requests are dropped, its engine budget released, and another replica takes the lead.",
        bounds=">= 2 x heartbeat_interval_seconds",
    )
    admission_wait_seconds: float = _field(
        1.0,
        "How long a replica waits for the leader's verdict on a new request (caps, duplicate ids) before "
        "queueing it provisionally (no leader reachable): the verdict, when it comes, still applies.",
        bounds="> 0",
    )
    report_interval_seconds: float = _field(
        0.25,
        "Generated-token counts go to each model's leader (its fairness counters) this often, one message for "
        "all of a replica's running requests; acceptance, the first token, failures and the end go at once. "
        "The counters of a running request lag by at most this; VTC's look-ahead already reserves tokens "
        "the request has yet to generate, and a shorter interval costs the leader CPU per token count.",
        bounds="> 0",
    )
    degraded_in_flight_cap: int = _field(
        0,
        "Without Redis, each replica gates its own requests alone, capped at this many in flight per "
        "backend divided by the last known number of replicas (at least 1); 0: the model's "
        "gate.fallback_max_in_flight.",
        bounds=">= 0",
    )


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry traces of each request (admission, queue wait, dispatch, the engine's time to first token,
    the stream), exported over OTLP. Off unless `endpoint` is set; a caller's W3C `traceparent` reaches the
    engine either way. Read at start."""

    endpoint: str = _field(
        "",
        "OTLP collector to export spans to: for `grpc`, http://host:4317 (https:// for TLS); for "
        "`http/protobuf`, the traces URL, http://host:4318/v1/traces. Empty: tracing is off (no span is made).",
        bounds="empty, or http:// or https://",
    )
    protocol: str = _field(
        "grpc",
        "OTLP transport: `grpc` (what vLLM's own exporter uses by default) or `http/protobuf` (through HTTP/1.1 "
        "proxies and load balancers).",
        bounds="grpc or http/protobuf",
    )
    service_name: str = _field(
        "llm-scheduler", "The `service.name` resource attribute the spans carry.", bounds="1-128 characters"
    )
    sampling_ratio: float = _field(
        1.0,
        "Share of traces recorded for calls that arrive without a trace context; a call that carries one keeps "
        "its caller's decision (the sampled flag), so a trace is whole or absent.",
        bounds="0 to 1",
    )
    headers: dict[str, str] = _field(
        {},
        "Headers sent with every export (a collector's tenant, say). Empty: the exporter reads "
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS / OTEL_EXPORTER_OTLP_HEADERS, the place for a secret token.",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint)


@dataclass(frozen=True)
class Config:
    """The whole service configuration."""

    server: ServerConfig = _field(ServerConfig(), "Listen addresses, shutdown and logging.")
    auth: AuthConfig = _field(AuthConfig(), "Caller identification.")
    scheduling: SchedulingConfig = _field(SchedulingConfig(), "Fairness, ordering and priority classes.")
    models: list[ModelConfig] = _field([], "Served models (at least one).", bounds="at least one; names unique")
    cluster: ClusterConfig = _field(ClusterConfig(), "Replicas acting as one scheduler (default: one process).")
    tracing: TracingConfig = _field(TracingConfig(), "OpenTelemetry traces over OTLP (default: off).")

    def model(self, name: str) -> ModelConfig | None:
        """The model called `name`, if configured."""
        return next((m for m in self.models if m.name == name), None)


def describe_fields(cls: type[Any] = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default as TOML-ish text, doc) for every field, recursively."""
    rows: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(cls):
        if is_extra(f):
            continue  # the policies' own parameters: described by each policy
        name = f"{prefix}{f.name}"
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
        hint = typing.get_type_hints(cls)[f.name]
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
        if dataclasses.is_dataclass(hint):
            rows.append((name, "(table)", f.metadata["doc"]))
            rows += describe_fields(hint, name + ".")  # type: ignore[arg-type]
        elif item is not None and dataclasses.is_dataclass(item):
            rows.append((name, "(array of tables)", f.metadata["doc"]))
            rows += describe_fields(item, name + "[].")  # type: ignore[arg-type]
        else:
            rows.append((name, repr(default), f.metadata["doc"]))
    return rows
