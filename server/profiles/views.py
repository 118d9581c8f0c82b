"""How a device profile and its calibrations are shown in API responses and pages."""

from __future__ import annotations

from sqlalchemy.orm import Session

from decodebench.contracts.api import (
    CalibrationView,
    FittedPoint,
    ProfileParameter,
    ProfileView,
)
from decodebench.contracts.profiles import BANDWIDTH, DEVICE_PROFILES, OVERHEAD, DeviceProfile
from server.models import ProfileCalibration
from server.profiles import service

PARAMETER_LABELS = {
    BANDWIDTH: ("effective bandwidth", "MB/s"),
    OVERHEAD: ("dispatch overhead per op", "µs"),
}


def calibration_view(calibration: ProfileCalibration, *, points: bool = False) -> CalibrationView:
    return CalibrationView(
        id=calibration.id,
        **service.fit_fields(calibration),
        requested_by=calibration.requested_by,
        created_at=calibration.created_at,
        points=[FittedPoint.model_validate(point) for point in calibration.points]
        if points
        else None,
    )


def profile_view(
    profile: DeviceProfile, prior: DeviceProfile, calibration: ProfileCalibration | None
) -> ProfileView:
    return ProfileView(
        device_class=profile.device_class,
        display_name=profile.display_name,
        product_types=list(profile.product_types),
        source=profile.source,
        calibrated=profile.calibrated,
        calibration_runs=profile.calibration_runs,
        calibration_builds=profile.calibration_builds,
        parameters=[
            ProfileParameter(
                name=name,
                label=PARAMETER_LABELS[name][0],
                unit=PARAMETER_LABELS[name][1],
                value=getattr(profile, name),
                prior=getattr(prior, name),
                calibrated=name in profile.calibrated_parameters,
            )
            for name in (BANDWIDTH, OVERHEAD)
        ],
        calibration=calibration_view(calibration) if calibration else None,
    )


def current_profile_views(session: Session) -> list[ProfileView]:
    current = service.current_profiles(session)
    calibrations = service.current_calibrations(session)
    return [
        profile_view(current[name], prior, calibrations.get(name))
        for name, prior in DEVICE_PROFILES.items()
    ]
