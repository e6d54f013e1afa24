"""Deciding what goes where and when: the scheduler of all models, one dispatcher per model and its parts
(capacity, gates, load estimates, failover, positions, health, metrics), and the port a cluster steers them
through. It may import the core, the policies, the configuration and the backend port (its registry
builds adapters by kind name); never a wire protocol or a concrete adapter."""
