"""The benchmark scenarios, one module or package each, every one declaring its `SCENARIO` (`bench.scenario`):
S1-S8 on the simulator, C1, C3, C4, C6 and CB across scheduler replicas, R1 on a real engine. A scenario
too large for one module is a package split by job (setups, workload, measurement, summary). `bench.registry`
lists them; `common`, `workloads` and `cluster_layouts` hold what several share."""
