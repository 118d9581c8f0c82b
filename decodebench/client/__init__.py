"""REST client for the decodebench server, used by the CLI, CI jobs, agents and build workers."""

from __future__ import annotations

from decodebench.client.base import API, KEEPALIVE_S, ApiError, file_sha256
from decodebench.client.claims import AsyncClaims
from decodebench.client.leased import LeasedWork
from decodebench.client.rest import DecodebenchClient

__all__ = [
    "API",
    "KEEPALIVE_S",
    "ApiError",
    "AsyncClaims",
    "DecodebenchClient",
    "LeasedWork",
    "file_sha256",
]
