"""Tools for one question each, run by hand: they write no record, and use the bench's shared pieces (the
processes of `bench.harness`, the configs of `bench.configs`, the clients, the engine probe).

- `demo`: S1 at a glance, straight to the engine and through the scheduler (`make demo`);
- `stream_memory`: the scheduler's memory per queued request, with open `Stream` calls;
- `stream_cpu`: the scheduler's CPU per streamed token on each event loop, or grouped against every token;
- `scrape_cost`: an engine front end's CPU per metrics scrape, whole against the adapter's selection;
- `profile_summary`: a saved profile of the scheduler summed by function and area;
- `end_user_flood`: one caller's end user floods: its siblings' waits and the other callers' shares.
"""
