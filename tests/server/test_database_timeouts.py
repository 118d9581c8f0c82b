"""Every server connection to PostgreSQL carries libpq's timeouts: a database host lost
mid-request (a partition, not a refused connection) fails the request within seconds, answered
503 with Retry-After, instead of holding it for the kernel's retransmissions (minutes).
tests/faults/test_partitions.py shows the behaviour on separate hosts; this pins the settings."""

from __future__ import annotations

import pytest


def engines():
    from server.db import get_engine
    from server.health import _probe_engine

    return {"requests": get_engine, "health probe": _probe_engine}


@pytest.mark.parametrize("role", ["requests", "health probe"])
def test_the_server_connections_carry_the_libpq_timeouts(db, role: str) -> None:
    from server.config import get_settings

    expected = get_settings().libpq_timeouts
    assert expected["connect_timeout"] > 0 and expected["tcp_user_timeout"] > 0
    with engines()[role]().connect() as connection:
        dbapi = connection.connection.dbapi_connection
        assert dbapi is not None
        parameters = dbapi.info.get_parameters()
    for name, value in expected.items():
        assert parameters.get(name) == str(value), name
