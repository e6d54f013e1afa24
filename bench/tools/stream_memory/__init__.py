"""Memory of the scheduler process per queued request, with N clients holding open `Stream` RPCs.

Why: the service promises that memory stays bounded under a flood of 100,000 queued requests (the
`max_queued` caps bound the count; this measures the cost of each). The scheduler core alone was measured
at about 2 KB per queued request with tracemalloc (`tests/unit/test_memory_bound.py`), but a queued
request held by a real client also costs the process gRPC per-call state (the C-core call and its arena,
the HTTP/2 stream, the servicer's asyncio task and async generator). This benchmark reads the whole
process's resident memory (VmRSS from /proc/<pid>/status) before and after N streams are queued, so the
figure includes all of it.

How the engine stays full: a `llmsched sim` engine with one slot (`--max-num-seqs 1`) and an engine step
of one hour is given `waiting_target + 1` requests directly over HTTP, as another client of the engine
would send them: one runs (its first step never ends within the run), the others wait. The engine's
Prometheus metrics then honestly show `vllm:num_requests_waiting` at the scheduler's waiting target, so
the gate stays closed and nothing the scheduler queues is dispatched. `gate.stale_after_seconds` is set
to an hour because on a busy event loop (tens of thousands of streams opening on two CPUs) a scrape may
be late, and a reading older than the default 1 s would let the gate's fallback send up to
`fallback_max_in_flight` requests: the engine's state does not change during the run, so the last reading
stays true. The streams are opened only once GetQueueState shows the gate closed on a fresh reading, and
the run checks at the end that the scheduler dispatched nothing.

Sequence: start the engine and fill it; start `llmsched serve` with caps that allow N queued requests
(spread over `--users` users); open and cancel a small warm-up batch (so one-time costs such as code paths
first taken and the first per-user queues are not charged to the measured streams); read the scheduler's
RSS; open N `Stream` calls (or `Submit` calls with `--unary`) from this one process with grpc.aio over
`--channels` channels; wait for each stream's first `queued` event and for GetQueueState to report N
queued; read RSS again, and again after `--hold-seconds` (with the scheduler's CPU use over that window:
with nothing moving in the queues it should be near zero, since a queued stream is only woken when its
position changes); cancel every
call and wait for the queue to drain to 0 (cancelled requests are withdrawn), and check that the
scheduler counted every admitted request as cancelled and dispatched none.

Opening pace: at most `--pace` calls (default 500) are in flight without their first `queued` event.
gRPC core keeps calls that arrive before the Python server asks for the next one in a pending list and
refuses them with CANCELLED beyond `grpc.server.max_pending_requests` (default 1,000, hard limit 3,000);
the scheduler raises both to its queue capacity, and `--pace 0` (everything at once) checks that. One
channel holds 100,000 concurrent streams; `--channels` spreads them over more connections for comparison.

`--update-interval` sets the scheduler's `queue_update_interval_seconds` (default 1 s, the service's own
default): how often at most a stream whose position changed is told. A run fails cleanly (calls
cancelled, processes stopped) when opening takes longer than `--timeout`.

The package's modules: `engine` (the engine held full), `scheduler` (its config and what it reports),
`calls` (opening, holding and cancelling the calls), `rounds` (one round measured and reported), and
`__main__` (the command line).

    .venv/bin/python -m bench.tools.stream_memory --streams 20000
    .venv/bin/python -m bench.tools.stream_memory --streams 5000 --unary
    .venv/bin/python -m bench.tools.stream_memory --streams 100000 --timeout 300
"""
