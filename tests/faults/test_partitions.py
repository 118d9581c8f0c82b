"""Partitions, not kills: a host's link goes down (`ip link set … down`) while its processes keep
running, then comes back. Five hosts and a second builder in network namespaces
(scripts/topology.py), short leases so each case takes well under a minute."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from scripts.topology import Topology
from tests.support.topology import farm, server_errors, skip_unless_available, wait_for

pytestmark = [pytest.mark.slow, skip_unless_available()]

SHORT = {
    "DECODEBENCH_LEASE_SECONDS": "4",
    "DECODEBENCH_HEARTBEAT_INTERVAL_S": "1",
    "DECODEBENCH_BUILD_LEASE_SECONDS": "6",
    "DECODEBENCH_REQUEUE_AFTER_SECONDS": "20",
    "DECODEBENCH_DB_POOL_TIMEOUT_S": "5",
}
CLOCK_OFFSET_S = 3600.0  # lab2's processes read a wall clock an hour ahead
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
        clock_offsets_s={"lab2": CLOCK_OFFSET_S},
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


FOLDED = {
    "model": "tiny-gqa",
    "variants": [{"attention": "folded", "context": 128}],
    "devices": ["iphone-16-pro", "iphone-17-pro"],
    "prompts": 3,
    "decode_tokens": 4,
    "repetitions": 2,
}


def _submit(topology: Topology, spec: dict) -> int:
    with topology.client() as client:
        answer = client.post("/api/v1/sweeps", json=spec)
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])


def _sweep_state(topology: Topology, sweep_id: int) -> str:
    return str(topology.sql("SELECT state FROM sweeps WHERE id = %(id)s", id=sweep_id)[0][0])


def _runs(topology: Topology, sweep_id: int) -> dict[int, tuple[str, str, str | None, int]]:
    """Each run: device class, state, the agent (lab) holding or having run it, attempts."""
    rows = topology.sql(
        "SELECT r.id, r.device_class, r.state, a.name, r.attempts FROM runs r "
        "LEFT JOIN agents a ON a.id = r.agent_id WHERE r.sweep_id = %(id)s ORDER BY r.id",
        id=sweep_id,
    )
    return {row[0]: tuple(row[1:]) for row in rows}  # type: ignore[misc]


def _assert_complete_and_stored_once(topology: Topology, sweep_id: int, spec: dict) -> None:
    runs = _runs(topology, sweep_id)
    assert _sweep_state(topology, sweep_id) == "completed", runs
    assert {state for _, state, _, _ in runs.values()} == {"succeeded"}, runs
    stored, distinct = topology.sql(
        "SELECT count(*), count(DISTINCT (p.run_id, p.prompt_index)) FROM prompt_results p "
        "JOIN runs r ON r.id = p.run_id WHERE r.sweep_id = %(id)s",
        id=sweep_id,
    )[0]
    assert stored == distinct == len(runs) * spec["prompts"]


def _outbox(topology: Topology, lab: str) -> list[Path]:
    return sorted((topology.hosts[lab].root / "work" / "outbox").glob("*-run-*.json"))


def test_a_lab_cut_off_mid_run_delivers_late_results_accepted_or_refused_once(
    clean: Topology,
) -> None:
    topology = clean
    sweep_id = _submit(topology, FOLDED)

    def held_by_lab1() -> dict[str, int]:
        return {
            device_class: run_id
            for run_id, (device_class, state, lab, _) in _runs(topology, sweep_id).items()
            if lab == "lab1" and state == "running"
        }

    def measuring_on_lab1() -> set[int]:
        """Runs whose job lab1 has pushed to a phone: past the package download, measuring."""
        phones = topology.hosts["lab1"].root / "work" / "emulated" / "devices"
        runs = set()
        for job in phones.glob("*/Containers/*/Documents/job.json"):
            try:
                runs.add(int(json.loads(job.read_text())["run_id"]))
            except (OSError, ValueError, KeyError):
                pass  # being written
        return runs

    wait_for(
        lambda: len(held_by_lab1()) == 2 and set(held_by_lab1().values()) <= measuring_on_lab1(),
        "lab1 measures runs on both phones",
        180,
        topology,
    )
    topology.cut("lab1")
    try:
        held = held_by_lab1()
        own, moved = held["iphone-17-pro"], held["iphone-16-pro"]
        # lab2 (an iPhone 16 Pro only) takes over the 16 Pro run once its lease has run out;
        # lab1 goes on measuring both into its outbox
        wait_for(
            lambda: _runs(topology, sweep_id)[moved][2] == "lab2",
            "lab2 claims lab1's iPhone 16 Pro run",
            60,
            topology,
        )
        wait_for(
            lambda: (
                {int(p.name.split("-run-")[1][:-5]) for p in _outbox(topology, "lab1")}
                >= {own, moved}
            ),
            "lab1 has measured both runs into its outbox",
            90,
            topology,
        )
        assert _runs(topology, sweep_id)[own][1] == "queued"  # its lease ran out too
    finally:
        topology.mend("lab1")
    wait_for(lambda: _sweep_state(topology, sweep_id) == "completed", "the sweep completes", 120,
             topology)  # fmt: skip
    runs = _runs(topology, sweep_id)
    assert runs[own][2] == "lab1" and runs[own][3] == 1  # accepted: still its own, run once
    assert runs[moved][2] == "lab2"  # moved on: measured by lab2, lab1's results refused
    log = topology.log("lab1", "agent")
    assert f"delivered the results of run {own}" in log
    assert f"refused the results of run {moved}" in log
    reasons = [
        row[0]
        for row in topology.sql(
            "SELECT reason FROM transitions WHERE entity = 'run' AND entity_id = %(id)s "
            "ORDER BY id",
            id=own,
        )
    ]
    assert any("lease expired" in reason for reason in reasons), reasons
    assert reasons[-1].endswith("after its lease expired"), reasons
    _assert_complete_and_stored_once(topology, sweep_id, FOLDED)
    assert _outbox(topology, "lab1") == []


def test_the_builder_cut_off_mid_build_loses_its_build_to_another_and_is_refused_late(
    clean: Topology,
) -> None:
    topology = clean
    spec = {**FOLDED, "variants": [{"attention": "folded", "context": 256}], "repetitions": 1}
    sweep_id = _submit(topology, spec)
    (build_id,) = {
        row[0]
        for row in topology.sql("SELECT build_id FROM runs WHERE sweep_id = %(id)s", id=sweep_id)
    }

    def build() -> tuple[str, str | None, int]:
        row = topology.sql(
            "SELECT state, worker, attempts FROM builds WHERE id = %(id)s", id=build_id
        )[0]
        return row[0], row[1], row[2]

    wait_for(lambda: build()[0] == "building", "a builder starts the build", 60, topology)
    first = build()[1]
    assert first in ("builder", "builder2")
    topology.cut(first)
    try:
        wait_for(lambda: build()[0] == "succeeded", "the other builder builds it", 150, topology)
        state, second, attempts = build()
        assert second != first and attempts == 2
        # the first builder kept converting; its report waits for the link
        wait_for(
            lambda: "trying again" in topology.log(first, "worker"),
            f"{first} finishes and tries to report",
            120,
            topology,
        )
    finally:
        topology.mend(first)
    wait_for(
        lambda: "completion refused" in topology.log(first, "worker"),
        f"{first}'s late completion is refused",
        60,
        topology,
    )
    assert build()[:2] == ("succeeded", second)  # the late report changed nothing
    wait_for(lambda: _sweep_state(topology, sweep_id) == "completed", "the sweep completes", 120,
             topology)  # fmt: skip
    _assert_complete_and_stored_once(topology, sweep_id, spec)


def test_agents_cut_off_longer_than_a_lease_come_back_and_the_queue_drains(
    clean: Topology,
) -> None:
    topology = clean
    spec = {**FOLDED, "repetitions": 3}
    sweep_id = _submit(topology, spec)
    wait_for(
        lambda: any(state == "running" for _, state, _, _ in _runs(topology, sweep_id).values()),
        "runs in flight",
        120,
        topology,
    )
    for lab in topology.labs:
        topology.cut(lab)
    try:
        time.sleep(3 * 4)  # three leases
        assert _no_lease_left(topology, sweep_id)
    finally:
        for lab in topology.labs:
            topology.mend(lab)
    wait_for(lambda: _sweep_state(topology, sweep_id) == "completed", "the queue drains", 180,
             topology)  # fmt: skip
    _assert_complete_and_stored_once(topology, sweep_id, spec)

    # every phone is back: connected and ready (its status follows the next heartbeat)
    def devices() -> list[tuple[str, str, bool]]:
        return [tuple(row) for row in topology.sql("SELECT udid, status, connected FROM devices")]  # type: ignore[misc]

    wait_for(
        lambda: len(devices()) == 3 and {row[1:] for row in devices()} == {("ready", True)},
        "the three phones read ready and connected",
        30,
        topology,
    )
    for lab in topology.labs:
        assert _outbox(topology, lab) == []


def _no_lease_left(topology: Topology, sweep_id: int) -> bool:
    """Leases are given back when an agent next talks to the server; with every agent away a
    run may still read running, but no lease is current by the database's clock."""
    rows = topology.sql(
        "SELECT count(*) FROM runs WHERE sweep_id = %(id)s AND state = 'running' "
        "AND lease_expires_at > now()",
        id=sweep_id,
    )
    return rows[0][0] == 0


def test_leases_heartbeats_and_last_seen_follow_the_server_clock_not_a_lab_an_hour_ahead(
    clean: Topology,
) -> None:
    topology = clean
    # lab2 lives an hour ahead: its own log's timestamps say so
    stamped = [line[:19] for line in topology.log("lab2", "agent").splitlines() if line[:2] == "20"]
    lab2_now = datetime.strptime(stamped[-1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    database_now = topology.sql("SELECT now()")[0][0]
    assert abs((lab2_now - database_now).total_seconds() - CLOCK_OFFSET_S) < 120

    spec = {**FOLDED, "devices": ["iphone-16-pro"], "repetitions": 2}
    sweep_id = _submit(topology, spec)

    def lab2_lease_s() -> float | None:
        rows = topology.sql(
            "SELECT extract(epoch FROM r.lease_expires_at - now()) FROM runs r "
            "JOIN agents a ON a.id = r.agent_id WHERE r.sweep_id = %(id)s "
            "AND a.name = 'lab2' AND r.state = 'running'",
            id=sweep_id,
        )
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    wait_for(lambda: lab2_lease_s() is not None, "lab2 runs a run", 120, topology)
    lease_s = lab2_lease_s()
    assert lease_s is not None and 0 < lease_s <= 4 + 1  # DECODEBENCH_LEASE_SECONDS from now
    wait_for(lambda: _sweep_state(topology, sweep_id) == "completed", "the sweep completes", 120,
             topology)  # fmt: skip
    _assert_complete_and_stored_once(topology, sweep_id, spec)

    # every time the server keeps about lab2 is its own (and the database's), to the second
    ages = topology.sql(
        "SELECT extract(epoch FROM now() - a.last_seen_at), "
        "max(extract(epoch FROM now() - d.last_seen_at)) FROM agents a "
        "JOIN devices d ON d.agent_id = a.id WHERE a.name = 'lab2' GROUP BY a.id"
    )[0]
    assert all(0 <= float(age) < 10 for age in ages), ages
    spans = topology.sql(
        "SELECT extract(epoch FROM r.started_at - s.created_at), "
        "extract(epoch FROM now() - r.finished_at) FROM runs r JOIN sweeps s ON s.id = r.sweep_id "
        "JOIN agents a ON a.id = r.agent_id WHERE s.id = %(id)s AND a.name = 'lab2'",
        id=sweep_id,
    )
    assert spans and all(0 <= float(a) < 300 and 0 <= float(b) < 300 for a, b in spans), spans
    with topology.client() as client:
        devices = client.get("/api/v1/devices").json()
    desk_now = datetime.now(UTC)  # the operator's desk reads the same kernel clock as the server
    for device in devices:
        seen = datetime.fromisoformat(device["last_seen_at"])
        assert abs((desk_now - seen).total_seconds()) < 30, device
