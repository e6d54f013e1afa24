"""The redis-server fixture itself: the failures it stages are the ones the cluster tests rely on."""

from __future__ import annotations

import shutil

import pytest
from redis import Redis

from tests.cluster.redis_server import RedisServer, redis_server_binary


def test_restart_empty_comes_back_on_the_same_port_with_nothing(redis_server: RedisServer) -> None:
    port = redis_server.port
    with Redis.from_url(redis_server.url) as client:
        client.set("k", "v")
    redis_server.restart_empty()
    assert redis_server.port == port and redis_server.running
    with Redis.from_url(redis_server.url) as client:
        assert client.get("k") is None


def test_kill_and_stop_leave_nothing_answering(redis_server: RedisServer) -> None:
    redis_server.kill()
    assert not redis_server.running and not redis_server.ping()
    redis_server.start()
    assert redis_server.ping()
    redis_server.stop()
    assert not redis_server.running and not redis_server.ping()


def test_a_paused_server_does_not_answer_until_resumed(redis_server: RedisServer) -> None:
    redis_server.pause()
    try:
        assert not redis_server.ping()
    finally:
        redis_server.resume()
    assert redis_server.ping()


def test_without_redis_server_tests_skip_unless_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("LLMSCHED_REQUIRE_REDIS", raising=False)
    with pytest.raises(pytest.skip.Exception):
        redis_server_binary()
    monkeypatch.setenv("LLMSCHED_REQUIRE_REDIS", "1")
    with pytest.raises(pytest.fail.Exception):
        redis_server_binary()
