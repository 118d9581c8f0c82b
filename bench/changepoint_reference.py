"""Write the reference change points tests/decodebench/judging/test_changepoints.py checks.

Apache Otava cannot be installed beside this project (it pins numpy 2.2.* and pulls cloud
clients), so its change-point code is run from an unpacked wheel put on ``PYTHONPATH``, outside the
project's dependencies (from the repository's root):

    pip download --no-deps -d /tmp/otava apache-otava==0.8.0
    unzip -q -o /tmp/otava/apache_otava-0.8.0-py3-none-any.whl -d /tmp/otava/wheel
    PYTHONPATH=/tmp/otava/wheel python -m bench.changepoint_reference tests/data/otava_changepoints.json

Its `otava.change_point_divisive` and `otava.analysis` import only numpy and scipy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def series_set(count: int, seed: int) -> list[dict]:
    """Noisy levels with 0-2 steps of 1-8% and an occasional outlier, varied lengths/windows."""
    rng = np.random.default_rng(seed)
    cases = []
    for case in range(count):
        n = int(rng.integers(5, 70))
        values = rng.normal(100, 1, n)
        for _ in range(int(rng.integers(0, 3))):
            at = int(rng.integers(1, n))
            values[at:] *= 1 + rng.choice([-1, 1]) * rng.uniform(0.01, 0.08)
        if case % 5 == 0:
            values[int(rng.integers(0, n))] *= 1.25
        cases.append(
            {
                "values": values.tolist(),
                "window": int(rng.choice([10, 20, 30, 50])),
                "max_pvalue": float(rng.choice([0.001, 0.01])),
                "min_magnitude": float(rng.choice([0.0, 0.02])),
            }
        )
    return cases


def main() -> None:
    output = Path(sys.argv[1])
    from otava.analysis import compute_change_points  # noqa: PLC0415
    from otava.change_point_divisive.calculator import PairDistanceCalculator  # noqa: PLC0415

    cases = series_set(60, seed=2026)
    for case in cases:
        values = np.array(case["values"])
        candidate = PairDistanceCalculator(values.copy()).get_candidate_change_point(
            slice(0, len(values))
        )
        points, _ = compute_change_points(
            list(values),
            window_len=case["window"],
            max_pvalue=case["max_pvalue"],
            min_magnitude=case["min_magnitude"],
        )
        case["otava_best_cut"] = [int(candidate.index), float(candidate.qhat)]
        case["otava_change_points"] = [int(point.index) for point in points]
    output.write_text(json.dumps({"source": "apache-otava 0.8.0", "cases": cases}) + "\n")
    found = sum(bool(case["otava_change_points"]) for case in cases)
    print(f"{len(cases)} series, {found} with change points -> {output}")


if __name__ == "__main__":
    main()
