"""Fixtures shared by the cluster tests: `redis_server`, a real redis-server per test (see redis_server.py)."""

from tests.cluster.redis_server import redis_server

__all__ = ["redis_server"]
