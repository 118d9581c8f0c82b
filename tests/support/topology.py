"""The farm as separate hosts (scripts/topology.py) for the slow tests: brought up under a
prefix and subnet of their own, so a farm someone is trying by hand is left alone, and torn down
however the test ends."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from scripts.topology import Topology, available

TEST_PREFIX = "dbtest"
TEST_SUBNET = "10.78.0"


def skip_unless_available() -> pytest.MarkDecorator:
    reason = available()
    return pytest.mark.skipif(reason is not None, reason=f"topology tests: {reason}")


@contextmanager
def farm(**options: Any) -> Iterator[Topology]:
    root = Path(tempfile.mkdtemp(prefix="decodebench-topology-test-"))
    topology = Topology(root=root, prefix=TEST_PREFIX, subnet=TEST_SUBNET, attached=True, **options)
    try:
        topology.up()
        yield topology
    except BaseException:
        topology.down(quiet=True)
        print(f"the topology's logs are kept under {root}")
        raise
    topology.down(quiet=True)
    shutil.rmtree(root, ignore_errors=True)


def wait_for(
    condition: Callable[[], bool], what: str, timeout_s: float, topology: Topology
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        topology.check_alive()
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting until {what}"
        time.sleep(0.25)


def server_errors(topology: Topology) -> list[str]:
    """The server's access-log lines answering 500 or more (503 is the designed answer to a
    database it cannot reach), and its tracebacks."""
    log = topology.log("server", "server").splitlines()
    return [
        line
        for line in log
        if re.search(r'" 5\d\d', line) and '" 503' not in line or line.startswith("Traceback")
    ]
