"""Benchmarks: the scenarios of bench/scenarios/ (docs/benchmarks.md), direct to the engine vs through llm-scheduler."""
