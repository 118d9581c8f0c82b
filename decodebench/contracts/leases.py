"""Leased work's messages, the same for every kind a worker holds under a lease (builds and
doctor jobs): the worker's name, the answer to starting, and the lease, progress and failure
reports. A kind adds only its assignment and its outcome (which carries the lease too)."""

from __future__ import annotations

from pydantic import Field, StrictFloat

from decodebench.contracts.base import Contract, Incoming

LEASE_PATTERN = r"^[0-9a-f]{32}$"
MAX_STAGE = 200  # the longest stage a progress report names


class WorkerIdentity(Incoming):
    worker: str = Field(min_length=1, max_length=255)


class LeaseStart(Contract):
    """The answer to a worker asking to start: go ahead under this lease, or not."""

    proceed: bool
    state: str
    lease: str | None = Field(default=None, description="Send it with every later report")
    lease_seconds: float | None = Field(default=None, description="Renew before it runs out")


class Lease(Incoming):
    """What proves a worker still holds the work it reports on."""

    lease: str = Field(pattern=LEASE_PATTERN)


class LeaseProgress(Lease):
    stage: str = Field(min_length=1, max_length=MAX_STAGE)
    fraction: StrictFloat = Field(ge=0, le=1)


class LeaseFailure(Lease):
    reason: str = Field(min_length=1, max_length=4000)
