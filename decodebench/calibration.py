"""Fit a device class's profile to its measured decode speeds (least squares).

Each observation is one run: the build's bytes moved per token ``B`` and dispatched ops ``N``
(from its graph analysis) and the measured decode rate. The profile predicts
``t = B / bandwidth + N * overhead`` seconds per token, linear in ``a = 1 / bandwidth`` and
``b = overhead``. The fit minimises the *relative* error ``sum(((a B + b N) - t) / t)^2``, so a
slow build does not outweigh a fast one; that is ordinary least squares on ``x = B / t``,
``y = N / t`` against 1, solved from its 2x2 normal equations.

Both parameters are fitted only when the runs cover at least two builds whose (B, N) are not
proportional; otherwise only the bandwidth is fitted and the overhead keeps its prior value. A
negative overhead is physically impossible: the fit then sits on the bound (overhead 0) and
refits the bandwidth alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from decodebench.contracts.api import FittedPoint
from decodebench.contracts.profiles import BANDWIDTH, OVERHEAD, DeviceProfile

# Below this relative determinant the two columns are (numerically) proportional.
MIN_RELATIVE_DETERMINANT = 1e-9


class CalibrationError(ValueError):
    """The observations cannot determine a profile; the message says why."""


class Observation(BaseModel):
    """One measured run of one build on the device class."""

    model_config = ConfigDict(frozen=True)

    build: str = Field(description="Build id or key; runs of one build share it")
    run_id: int | None = None
    bytes_per_token: int = Field(gt=0)
    dispatch_ops: int = Field(ge=0)
    measured_tok_s: float = Field(gt=0)
    simulated: bool = False

    @property
    def seconds_per_token(self) -> float:
        return 1.0 / self.measured_tok_s


class CalibrationFit(BaseModel):
    model_config = ConfigDict(frozen=True)

    device_class: str
    effective_bandwidth_mb_s: float
    dispatch_overhead_us: float
    calibrated_parameters: tuple[str, ...]
    runs: int
    builds: int
    includes_simulated: bool
    rms_relative_error: float
    note: str
    points: list[FittedPoint]

    def apply_to(self, prior: DeviceProfile) -> DeviceProfile:
        return calibrated_profile(
            prior,
            effective_bandwidth_mb_s=self.effective_bandwidth_mb_s,
            dispatch_overhead_us=self.dispatch_overhead_us,
            calibrated_parameters=self.calibrated_parameters,
            runs=self.runs,
            builds=self.builds,
            includes_simulated=self.includes_simulated,
        )


def calibrated_profile(
    prior: DeviceProfile,
    *,
    effective_bandwidth_mb_s: float,
    dispatch_overhead_us: float,
    calibrated_parameters: Sequence[str],
    runs: int,
    builds: int,
    includes_simulated: bool,
    reference: str = "",
) -> DeviceProfile:
    """``prior`` with fitted parameters, saying which were fitted and from what."""
    label = "SIMULATED runs" if includes_simulated else "measured runs"
    fitted = " and ".join(calibrated_parameters)
    suffix = f" ({reference})" if reference else ""
    return prior.model_copy(
        update={
            "effective_bandwidth_mb_s": effective_bandwidth_mb_s,
            "dispatch_overhead_us": dispatch_overhead_us,
            "source": f"{fitted} fitted from {runs} {label} of {builds} builds{suffix}",
            "calibrated_parameters": tuple(calibrated_parameters),
            "calibration_runs": runs,
            "calibration_builds": builds,
        }
    )


def _solve_both(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    sxx = sum(x * x for x in xs)
    syy = sum(y * y for y in ys)
    sxy = sum(x * y for x, y in zip(xs, ys, strict=True))
    sx, sy = sum(xs), sum(ys)
    determinant = sxx * syy - sxy * sxy
    if syy <= 0 or determinant <= MIN_RELATIVE_DETERMINANT * sxx * syy:
        return None
    return (sx * syy - sy * sxy) / determinant, (sy * sxx - sx * sxy) / determinant


def _solve_bandwidth(xs: list[float], ys: list[float], overhead_s: float) -> float:
    """``a`` with the overhead held fixed: least squares of ``a x = 1 - b y``."""
    return sum(x * (1.0 - overhead_s * y) for x, y in zip(xs, ys, strict=True)) / sum(
        x * x for x in xs
    )


def fit_profile(prior: DeviceProfile, observations: Sequence[Observation]) -> CalibrationFit:
    if not observations:
        raise CalibrationError(f"{prior.device_class}: no runs to calibrate from")
    xs = [item.bytes_per_token / item.seconds_per_token for item in observations]
    ys = [item.dispatch_ops / item.seconds_per_token for item in observations]
    builds = len({item.build for item in observations})

    both = _solve_both(xs, ys) if builds >= 2 else None
    note = ""
    if both is not None and both[0] > 0 and both[1] >= 0:
        inverse_bandwidth, overhead_s = both
        parameters: tuple[str, ...] = (BANDWIDTH, OVERHEAD)
    elif both is not None and both[0] > 0:
        overhead_s = 0.0
        inverse_bandwidth = _solve_bandwidth(xs, ys, overhead_s)
        parameters = (BANDWIDTH, OVERHEAD)
        note = "the unconstrained fit gave a negative overhead; held at its bound 0"
    else:
        overhead_s = prior.dispatch_overhead_s
        inverse_bandwidth = _solve_bandwidth(xs, ys, overhead_s)
        parameters = (BANDWIDTH,)
        note = (
            "one build (or builds whose bytes and op counts are proportional): "
            "bandwidth fitted, dispatch overhead kept at its prior"
            if both is None
            else "the two-parameter fit gave a non-positive bandwidth; overhead kept at its prior"
        )
    if inverse_bandwidth <= 0:
        raise CalibrationError(
            f"{prior.device_class}: the dispatch overhead alone ({prior.dispatch_overhead_us} us "
            "per op) exceeds the measured time per token; no positive bandwidth fits"
        )
    residuals = [inverse_bandwidth * x + overhead_s * y - 1.0 for x, y in zip(xs, ys, strict=True)]
    points = [
        FittedPoint(
            build=item.build,
            run_id=item.run_id,
            bytes_per_token=item.bytes_per_token,
            dispatch_ops=item.dispatch_ops,
            measured_tok_s=item.measured_tok_s,
            predicted_tok_s=item.measured_tok_s / (1.0 + residual),
            simulated=item.simulated,
        )
        for item, residual in zip(observations, residuals, strict=True)
    ]
    return CalibrationFit(
        device_class=prior.device_class,
        effective_bandwidth_mb_s=1.0 / inverse_bandwidth / 1_000_000,
        dispatch_overhead_us=overhead_s * 1_000_000,
        calibrated_parameters=parameters,
        runs=len(observations),
        builds=builds,
        includes_simulated=any(item.simulated for item in observations),
        rms_relative_error=math.sqrt(sum(r * r for r in residuals) / len(residuals)),
        note=note,
        points=points,
    )
