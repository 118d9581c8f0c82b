"""The server (and its workers) as real processes on the test database."""

from __future__ import annotations

from tests.support.api import make_token
from tests.support.services import DATABASE_URL, REDIS_URL


def started_stack(tmp_path):
    """A server process on the (already migrated) test database, with one token per role minted
    in-process: the demo's `Stack.prepare` spends a Python start per token."""
    import redis

    from scripts.stack import Stack

    redis.Redis.from_url(REDIS_URL).flushdb()
    running = Stack(database_url=DATABASE_URL, broker_url=REDIS_URL, var_dir=tmp_path / "var")
    running.var_dir.mkdir(parents=True, exist_ok=True)
    running.tokens = {
        kind: make_token(kind, name)
        for kind, name in (
            ("user", "demo-user"),
            ("worker", "demo-worker"),
            ("agent", "demo-agent"),
        )
    }
    running.start_server()
    return running
