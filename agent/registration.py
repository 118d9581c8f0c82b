"""Registering with the server: retried with back-off while it is unreachable, refused for good
when it answers no."""

from __future__ import annotations

import logging
import threading
import time
from importlib.metadata import PackageNotFoundError, version

import httpx

from decodebench.client import ApiError, DecodebenchClient
from decodebench.contracts.protocol import AgentRegistered, AgentRegistration

log = logging.getLogger("agent")

MAX_BACKOFF_S = 60.0


class RegistrationRefused(Exception):
    """The server is reachable but will not register this agent (bad token, bad inventory)."""


class ServerUnreachable(Exception):
    pass


def agent_version() -> str:
    try:
        return version("decodebench")
    except PackageNotFoundError:
        return "unknown"


def is_transient(error: Exception) -> bool:
    """Worth retrying: the server is down, restarting, overloaded or behind a failing proxy."""
    if isinstance(error, ApiError):
        return error.status_code >= 500 or error.status_code in {408, 429}
    return isinstance(error, httpx.TransportError)


def register_with_backoff(
    client: DecodebenchClient,
    registration: AgentRegistration,
    stop: threading.Event,
    give_up_after_s: float | None = None,
    first_delay_s: float = 1.0,
) -> AgentRegistered | None:
    """Register, retrying with exponential back-off while the server is unreachable.

    Returns None if `stop` is set first; raises `RegistrationRefused` on a definitive refusal
    and `ServerUnreachable` after `give_up_after_s`.
    """
    started = time.monotonic()
    delay_s = first_delay_s
    attempt = 0
    while not stop.is_set():
        attempt += 1
        try:
            registered = client.register_agent(registration)
        except (ApiError, httpx.HTTPError) as error:
            if not is_transient(error):
                raise RegistrationRefused(f"server refused registration: {error}") from error
            waited_s = time.monotonic() - started
            if give_up_after_s is not None and waited_s + delay_s > give_up_after_s:
                raise ServerUnreachable(
                    f"server {client.base_url} unreachable for {waited_s:.0f} s "
                    f"({attempt} attempts), last error: {error!r}"
                ) from error
            log.warning(
                "registration attempt %d at %s failed (%r); retrying in %.0f s",
                attempt,
                client.base_url,
                error,
                delay_s,
            )
            stop.wait(delay_s)
            delay_s = min(delay_s * 2, MAX_BACKOFF_S)
            continue
        log.info(
            "registered as agent %d with %d device(s); heartbeat every %g s, leases of %d s",
            registered.agent_id,
            len(registration.devices),
            registered.heartbeat_interval_s,
            registered.lease_seconds,
        )
        return registered
    return None
