"""Partitions, not kills: a host's link goes down (`ip link set … down`) while its processes keep
running, then comes back. Five hosts and a second builder in network namespaces
(scripts/topology.py), short leases so each case takes well under a minute."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from topology import Topology

from tests.support.topology import farm, server_errors, skip_unless_available, wait_for

pytestmark = [pytest.mark.slow, skip_unless_available()]

SHORT = {
    "DECODEBENCH_LEASE_SECONDS": "4",
    "DECODEBENCH_HEARTBEAT_INTERVAL_S": "1",
    "DECODEBENCH_BUILD_LEASE_SECONDS": "6",
    "DECODEBENCH_REQUEUE_AFTER_SECONDS": "20",
    "DECODEBENCH_DB_POOL_TIMEOUT_S": "5",
}
REQUEST_TIMEOUT_S = 30.0  # what the agents, the workers and the CLI give a request


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    # lab2 has only an iPhone 16 Pro: a run lab1 holds on its 17 Pro can go nowhere else
    labs = {"lab1": ("iphone-16-pro", "iphone-17-pro"), "lab2": ("iphone-16-pro",)}
    with farm(
        labs=labs,
        builders=("builder", "builder2"),
        server_settings=SHORT,
        reconcile_interval_s=2.0,
    ) as running:
        yield running


@pytest.fixture
def clean(topology: Topology) -> Iterator[Topology]:
    """Every link up on the way out, whatever the test did; no server error meanwhile."""
    before = len(server_errors(topology))
    try:
        yield topology
    finally:
        for host in topology.hosts:
            topology.mend(host)
    assert server_errors(topology)[before:] == []


def test_server_cut_off_from_the_database_answers_503_with_retry_after_then_resumes(
    clean: Topology,
) -> None:
    topology = clean
    with topology.client() as client:
        assert client.get("/api/v1/sweeps").status_code == 200  # pooled connections exist
        sweeps_before = topology.sql("SELECT count(*) FROM sweeps")[0][0]
        topology.cut("db")
        try:
            for request in (
                lambda: client.get("/api/v1/sweeps", timeout=REQUEST_TIMEOUT_S),
                lambda: client.post(
                    "/api/v1/sweeps",
                    json={
                        "model": "tiny-gqa",
                        "variants": [{"attention": "folded"}],
                        "devices": ["iphone-16-pro"],
                        "prompts": 1,
                        "decode_tokens": 4,
                    },
                    timeout=REQUEST_TIMEOUT_S,
                ),  # fmt: skip
                lambda: httpx.get(
                    f"{topology.server_url}/api/v1/health", timeout=REQUEST_TIMEOUT_S
                ),
            ):
                started = time.monotonic()
                answer = request()
                elapsed = time.monotonic() - started
                assert answer.status_code == 503, answer.text
                assert int(answer.headers["Retry-After"]) >= 1
                assert elapsed < REQUEST_TIMEOUT_S - 5, f"503 after {elapsed:.1f} s"
        finally:
            topology.mend("db")
        # back by itself: no restart, no step by hand
        wait_for(
            lambda: client.get("/api/v1/sweeps", timeout=REQUEST_TIMEOUT_S).status_code == 200,
            "the server answers again",
            timeout_s=30,
            topology=topology,
        )
        assert topology.health() == 200
    assert (
        topology.sql("SELECT count(*) FROM sweeps")[0][0] == sweeps_before
    )  # nothing half-written
