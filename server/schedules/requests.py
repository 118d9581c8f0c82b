"""The schedule request as the server reads it: the contract plus the checks that need the
server's libraries, so a bad cron or zone is a 422 naming the field before anything is stored."""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import field_validator

from decodebench.contracts.schedules import ScheduleCreate


class ScheduleRequest(ScheduleCreate):
    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise ValueError(f"{value!r} is not a five-field cron expression")
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r} (an IANA name like Europe/Paris)"
            ) from None
        return value
