"""The farm on hosts that share nothing: five network namespaces (database, server, builder, two
labs), each with its own folders and loopback, every byte between roles over the network."""

from __future__ import annotations

import pytest

from scripts.topology import SWEEP, run_sweep
from tests.support.topology import farm, server_errors, skip_unless_available

pytestmark = [pytest.mark.slow, skip_unless_available()]


def test_a_sweep_of_two_variants_completes_on_both_labs_and_stores_each_result_once() -> None:
    with farm() as topology:
        figures = run_sweep(topology, timeout_s=240)
        assert figures.state == "completed", list(figures.lines())
        expected_runs = len(SWEEP["variants"]) * len(SWEEP["devices"]) * SWEEP["repetitions"]
        assert figures.runs == expected_runs
        assert set(figures.runs_by_lab) == {"lab1", "lab2"}, figures.runs_by_lab
        assert sum(figures.runs_by_lab.values()) == expected_runs
        assert figures.duplicates == 0
        stored = topology.sql(
            "SELECT count(*), count(DISTINCT (run_id, prompt_index)) FROM prompt_results"
        )[0]
        assert stored == (expected_runs * SWEEP["prompts"],) * 2
        # each lab fetched the packages over the API into its own folder; no lab has the
        # server's artifact store
        for lab in ("lab1", "lab2"):
            root = topology.hosts[lab].root
            assert list((root / "work" / "artifacts").glob("*.zip"))
            assert not (root / "artifacts").exists()
        assert not (topology.hosts["builder"].root / "artifacts").exists()
        assert server_errors(topology) == []
    assert not any(line.startswith(f"{topology.prefix}-") for line in _namespaces()), (
        "down() left a namespace"
    )


def _namespaces() -> list[str]:
    import subprocess

    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
