"""The bench's own tests: its runner, registry, shared pieces and each scenario's parts that need no long run."""
