"""What reading a hundred engines' metrics costs the scheduler: CPU per scrape, and the share of a core.

Why: the scheduler reads every engine's Prometheus metrics each `scrape_interval_seconds` (0.2 s as
shipped), so a hundred engines are 500 scrapes a second, each an HTTP GET, a parse and a `BackendLoad`, on
the event loop that also makes every dispatch decision. Target: a hundred engines at the shipped interval
take at most 10% of a core. (`bench.tools.scrape_cost` measures the other side: the engine's CPU to answer.)

A child process serves recorded engine texts (tests/engines/data: vLLM 0.32 and llama-server; for TGI, of
which no recording exists here, the simulator's exporter after a few requests) from `--engines` aiohttp
endpoints per kind on loopback. This process runs the real `Scheduler` (one model, `--engines` backends of
one kind, nothing queued: dispatch loops, monitors, adapters, gates as shipped) and reads its own CPU time
over `--seconds`: per scrape (all of the process's CPU divided by the scrapes, so the idle loops count
against the scrapes) and as a share of a core at the interval. Kinds:

- vllm: asks for its samples by `name[]` at /metrics/, answered as vLLM's prometheus-client app answers
  (2 KB, chunked, gzipped for a client that accepts it, as aiohttp's does);
- vllm_whole: a vLLM that does not select (404 at /metrics/): the whole 55 KB, every scrape;
- llamacpp: llama-server's 2.6 KB; tgi: TGI's exporter, 11 KB.

Side by side, in alternating order every round, five ways of reading:

- before: prometheus-client's parser over the lines that start with a wanted name, aiohttp's client, every
  engine on one beat (the reading this replaced, which started every monitor together; it then slept an
  interval after each read, so its reads drifted apart over minutes and cost more than this measures);
- shipped: the adapters' scan (`backends._prom_scan`), the reader's own kept-alive connection
  (`backends._metrics_connection`), ten engines a beat, the beats spread over the interval;
- shipped but one part as before (prometheus-client's parser; aiohttp's client; every engine on one beat):
  what each part is worth on its own.

All five build the selecting URL once and decode the body as the reader now does. Besides CPU, the event
loop's lag (how late a 20 ms timer fires, p99 and worst): how long a dispatch decision can wait behind a
burst of scrapes. The timer's own CPU (50 wakes a second) counts in every way's figures alike. It also
prints the parse alone of each text (no HTTP), before against the scan.

    .venv/bin/python -m bench.tools.scrape_scale                      # 100 engines per kind, 3 rounds of 4 s
    .venv/bin/python -m bench.tools.scrape_scale --engines 20 --rounds 1 --seconds 2 --kinds vllm

The package's modules: `texts` (what each kind of engine answers), `serving` (the child that serves them),
`measuring` (the ways of reading, each timed in the running scheduler), `report`, and `__main__`.
"""
