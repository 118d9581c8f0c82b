from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from decodebench.contracts.api import CalibrationView, ProfileDetail, ProfileView
from server.auth import AdminToken, SessionDep, UserToken
from server.errors import AUTHENTICATED_ERRORS
from server.paths import DeviceClass
from server.profiles import service
from server.profiles.views import calibration_view, current_profile_views, profile_view

router = APIRouter(prefix="/api/v1/profiles", tags=["profiles"], responses=AUTHENTICATED_ERRORS)


class CalibrationRequest(BaseModel):
    include_simulated: bool = Field(
        default=False,
        description="Also fit runs on simulated devices (labelled SIMULATED; a calibration "
        "from measured runs always takes precedence)",
    )


@router.get("", response_model=list[ProfileView])
def list_profiles(token: UserToken, session: SessionDep) -> list[ProfileView]:
    """Every device class's current profile: priors, fitted values and how they were fitted."""
    return current_profile_views(session)


@router.get("/{device_class}", response_model=ProfileDetail)
def get_profile(device_class: DeviceClass, token: UserToken, session: SessionDep) -> ProfileDetail:
    prior = service.default_profile(device_class)
    calibration = service.current_calibrations(session).get(device_class)
    current = profile_view(service.current_profiles(session)[device_class], prior, calibration)
    return ProfileDetail(
        **current.model_dump(),
        history=[
            calibration_view(row, points=True)
            for row in service.calibration_history(session, device_class)
        ],
    )


@router.post("/{device_class}/calibrations", status_code=201, response_model=CalibrationView)
def calibrate(
    device_class: DeviceClass, body: CalibrationRequest, token: AdminToken, session: SessionDep
) -> CalibrationView:
    """Fit the device class's profile to the project's succeeded runs and make it current for
    the project (every prediction it sees changes, so this takes an admin token)."""
    calibration = service.calibrate(
        session, device_class, token.name, include_simulated=body.include_simulated
    )
    return calibration_view(calibration, points=True)
