"""Benchmarks: scenarios from shared/SCENARIOS.md, direct to the engine vs through llm-scheduler."""
