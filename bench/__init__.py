"""Benchmarks: each scenario side by side, straight to the engine vs through llm-scheduler (docs/benchmarks.md).

`python -m bench` (`cli`, `session`) runs the scenarios `registry` lists, each a `scenario.Scenario` declared
in `scenarios/`; a run is engines and schedulers as processes (`harness`, `engines`, `cluster`), clients and
an engine probe (`clients`, `probe`, `runner`), and what it leaves behind (`results`, `report`, `plots`,
`run_records`, `check`). `product` is the one way in to the service's own code; `tools/` holds what is run by
hand, `servers/` the small servers a scenario starts.
"""
