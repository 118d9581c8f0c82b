"""Database tables, a module per domain, all importable from here. The schema itself is created
only by Alembic migrations."""

from decodebench.contracts.names import TERMINAL_RUN_STATES, BuildState, RunState, SweepState
from server.models.access import DEFAULT_PROJECT, ApiToken, Project, SignInFailure, UiSession
from server.models.base import DEFAULT_SCOPES, Base, Scope, TokenKind
from server.models.doctor import DoctorJob
from server.models.fleet import Agent, Device, ProfileCalibration
from server.models.schedules import (
    Alert,
    DeviceSpread,
    Schedule,
    ScheduleFiring,
    WebhookAttempt,
    WebhookDelivery,
)
from server.models.sweeps import Build, PromptResultRow, Run, Sweep, SweepVariant, Transition
from server.models.uploads import Upload, UserModel

__all__ = [
    "Agent",
    "Alert",
    "ApiToken",
    "Base",
    "Build",
    "BuildState",
    "DEFAULT_PROJECT",
    "DEFAULT_SCOPES",
    "Device",
    "DoctorJob",
    "DeviceSpread",
    "ProfileCalibration",
    "Project",
    "PromptResultRow",
    "Run",
    "RunState",
    "Schedule",
    "ScheduleFiring",
    "Scope",
    "SignInFailure",
    "Sweep",
    "SweepState",
    "SweepVariant",
    "TERMINAL_RUN_STATES",
    "TokenKind",
    "Transition",
    "UiSession",
    "Upload",
    "UserModel",
    "WebhookAttempt",
    "WebhookDelivery",
]
