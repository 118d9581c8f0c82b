from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from decodebench.contracts.api import CalibrationView, ProfileDetail, ProfileView
from decodebench.contracts.schedules import SpreadView
from server import tenancy
from server.auth import AdminToken, SessionDep, SubmitToken, UserToken
from server.errors import AUTHENTICATED_ERRORS, NotFound
from server.paths import DeviceClass
from server.profiles import service
from server.profiles.views import calibration_view, current_profile_views, profile_view
from server.schedules.spread import learn_spread, spread_view, stored_spread

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


@router.get("/{device_class}/spread", response_model=SpreadView)
def get_spread(device_class: DeviceClass, token: UserToken, session: SessionDep) -> SpreadView:
    """The device class's run-to-run and night-to-night spread, as last learned for the project
    (every finished nightly learns it again)."""
    row = stored_spread(session, tenancy.owner(session), device_class)
    if row is None:
        raise NotFound(f"no spread learned for {device_class} yet")
    return spread_view(row)


@router.post("/{device_class}/spread", response_model=SpreadView)
def learn(device_class: DeviceClass, token: SubmitToken, session: SessionDep) -> SpreadView:
    """Learn the spread now from the project's stored repeated runs of the class."""
    row = learn_spread(session, tenancy.owner(session), device_class)
    if row is None:
        raise NotFound(
            f"no stored sweep ran one build twice on one {device_class} device: nothing to learn"
        )
    return spread_view(row)
