"""Calibrate device profiles from the runs in the database, and serve the current ones.

A calibration fits one device class (:func:`decodebench.calibration.fit_profile`) to its
succeeded runs: one observation per run, its mean seconds per token over the prompts, against
the bytes per token and dispatched ops its build's analysis reports.

Simulated runs are left out by default: their timings come from the very roofline model being
calibrated, so fitting them only gives back the prior. A calibration that includes them (asked
for explicitly) is stored, labelled SIMULATED, and becomes the current profile only while the
device class has no calibration from measured runs.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from decodebench.calibration import (
    CalibrationError,
    CalibrationFit,
    Observation,
    calibrated_profile,
    fit_profile,
)
from decodebench.contracts.profiles import DEVICE_PROFILES, DeviceProfile, get_profile
from server import tenancy
from server.build_reports import readable_report
from server.errors import Conflict
from server.models import Build, ProfileCalibration, PromptResultRow, Run, RunState

CURRENT_PROFILES_KEY = "current_profiles"
# What a stored calibration keeps of its fit field by field (the points aside: kept as JSON).
FIT_FIELDS = tuple(name for name in CalibrationFit.model_fields if name != "points")


def fit_fields(source: CalibrationFit | ProfileCalibration) -> dict[str, Any]:
    """The fields of a fit, or of the calibration stored from it, as the database keeps them."""
    fields = {name: getattr(source, name) for name in FIT_FIELDS}
    fields["calibrated_parameters"] = list(source.calibrated_parameters)
    return fields


def default_profile(device_class: str) -> DeviceProfile:
    return get_profile(device_class)


def observations(
    session: Session, device_class: str, *, include_simulated: bool = False
) -> list[Observation]:
    """One observation per succeeded run of the device class whose build has an analysis."""
    simulated = func.bool_or(PromptResultRow.simulated) | func.coalesce(
        func.bool_or(Run.simulated), False
    )
    statement = (
        select(
            Run.id,
            Run.build_id,
            simulated.label("simulated"),
            func.avg(1.0 / PromptResultRow.decode_tok_s).label("seconds_per_token"),
        )
        .join(PromptResultRow, PromptResultRow.run_id == Run.id)
        .where(
            Run.device_class == device_class,
            Run.state == RunState.succeeded,
            PromptResultRow.decode_tok_s > 0,
            tenancy.runs(session),
        )
        .group_by(Run.id, Run.build_id)
        .order_by(Run.id)
    )
    if not include_simulated:
        statement = statement.having(~simulated)
    rows = session.execute(statement).all()
    build_ids = {row.build_id for row in rows}
    analyses = {
        build.id: report.analysis
        for build in session.scalars(select(Build).where(Build.id.in_(build_ids)))
        if (report := readable_report(build)[0]) is not None  # an unreadable one is left out
    }
    found = []
    for row in rows:
        analysis = analyses.get(row.build_id)
        if analysis is None or analysis.bytes_per_token.total <= 0 or not row.seconds_per_token:
            continue
        found.append(
            Observation(
                build=str(row.build_id),
                run_id=row.id,
                bytes_per_token=analysis.bytes_per_token.total,
                dispatch_ops=analysis.dispatch_ops,
                measured_tok_s=1.0 / float(row.seconds_per_token),
                simulated=bool(row.simulated),
            )
        )
    return found


def calibrate(
    session: Session, device_class: str, requested_by: str, *, include_simulated: bool = False
) -> ProfileCalibration:
    prior = default_profile(device_class)
    found = observations(session, device_class, include_simulated=include_simulated)
    if not found:
        which = "succeeded runs" if include_simulated else "measured (non-simulated) runs"
        raise Conflict(f"{device_class}: no {which} with an analysed build to calibrate from")
    try:
        fit: CalibrationFit = fit_profile(prior, found)
    except CalibrationError as error:
        raise Conflict(str(error)) from None
    calibration = ProfileCalibration(
        **fit_fields(fit),
        points=[point.model_dump(mode="json") for point in fit.points],
        requested_by=requested_by,
        project_id=tenancy.owner(session),
    )
    session.add(calibration)
    session.flush()
    for key in [
        key for key in session.info if isinstance(key, tuple) and key[0] == CURRENT_PROFILES_KEY
    ]:
        del session.info[key]  # every project's cached profiles: this one changed
    return calibration


def current_calibrations(
    session: Session, project_id: int | None = None
) -> dict[str, ProfileCalibration]:
    """The calibration in force per device class: the newest measured one, else the newest.
    Of the session's project, or of ``project_id`` (an agent's claim serves every project)."""
    scope = (
        tenancy.calibrations(session)
        if project_id is None
        else ProfileCalibration.project_id == project_id
    )
    rows = session.scalars(
        select(ProfileCalibration)
        .where(scope)
        .distinct(ProfileCalibration.device_class)
        .order_by(
            ProfileCalibration.device_class,
            ProfileCalibration.includes_simulated,
            ProfileCalibration.created_at.desc(),
            ProfileCalibration.id.desc(),
        )
    ).all()
    return {row.device_class: row for row in rows if row.device_class in DEVICE_PROFILES}


def profile_from(prior: DeviceProfile, calibration: ProfileCalibration) -> DeviceProfile:
    return calibrated_profile(
        prior,
        effective_bandwidth_mb_s=calibration.effective_bandwidth_mb_s,
        dispatch_overhead_us=calibration.dispatch_overhead_us,
        calibrated_parameters=calibration.calibrated_parameters,
        runs=calibration.runs,
        builds=calibration.builds,
        includes_simulated=calibration.includes_simulated,
        reference=f"calibration {calibration.id}",
    )


def current_profiles(session: Session, project_id: int | None = None) -> dict[str, DeviceProfile]:
    """Every device class's profile as predictions should use it (cached per session), for the
    session's project or for ``project_id``."""
    key = (CURRENT_PROFILES_KEY, project_id)
    cached = session.info.get(key)
    if cached is not None:
        return cached
    calibrations = current_calibrations(session, project_id)
    profiles = {
        device_class: (
            profile_from(prior, calibrations[device_class])
            if device_class in calibrations
            else prior
        )
        for device_class, prior in DEVICE_PROFILES.items()
    }
    session.info[key] = profiles
    return profiles


def calibration_history(
    session: Session, device_class: str, limit: int = 20
) -> list[ProfileCalibration]:
    default_profile(device_class)
    return list(
        session.scalars(
            select(ProfileCalibration)
            .where(ProfileCalibration.device_class == device_class, tenancy.calibrations(session))
            .order_by(ProfileCalibration.created_at.desc(), ProfileCalibration.id.desc())
            .limit(limit)
        )
    )
