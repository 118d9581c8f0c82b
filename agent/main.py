"""The agent process: register, heartbeat the inventory, claim and run work for each device.

One thread per device claims and executes that device's runs (one in flight per device); one
thread heartbeats; the main thread supervises and handles SIGTERM/SIGINT. On shutdown no new
run is claimed and a run in flight either finishes or fails with "agent shutting down".
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from types import FrameType

import httpx

from agent.artifacts import ArtifactCache
from agent.config import AgentSettings, parse_settings
from agent.drivers.base import DeviceDriver
from agent.drivers.simulated import SimulatedDriver
from agent.runner import RunExecutor
from decodebench.client import ApiError, DecodebenchClient
from decodebench.protocol import AgentRegistered, AgentRegistration, DeviceInfo

log = logging.getLogger("agent")

MAX_BACKOFF_S = 60.0
SUPERVISE_TICK_S = 0.2


class RegistrationRefused(Exception):
    """The server is reachable but will not register this agent (bad token, bad inventory)."""


class ServerUnreachable(Exception):
    pass


@dataclass
class DeviceSlot:
    info: DeviceInfo
    current_run: int | None = None
    empty_polls: int = 0


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


class Agent:
    def __init__(
        self, settings: AgentSettings, client: DecodebenchClient, driver: DeviceDriver
    ) -> None:
        self.settings = settings
        self.client = client
        self.driver = driver
        self.stop = threading.Event()
        self.executor = RunExecutor(
            client,
            driver,
            ArtifactCache(settings.work_dir / "artifacts", client.download_artifact),
            shutdown=self.stop,
            run_timeout_s=settings.run_timeout_s,
        )
        self._slots: dict[str, DeviceSlot] = {}
        self._lock = threading.Lock()
        self._last_activity = time.monotonic()
        self._stop_reason = ""

    def request_stop(self, reason: str) -> None:
        if self.stop.is_set():
            log.info("already shutting down (%s)", self._stop_reason)
            return
        self._stop_reason = reason
        log.info("shutting down: %s", reason)
        self.stop.set()

    def run(self) -> int:
        """Serve until stopped; the process exit status."""
        self._slots = {device.udid: DeviceSlot(device) for device in self.driver.discover()}
        if not self._slots:
            log.error("no devices found by the %s driver; nothing to do", self.driver.name)
            return 1
        try:
            registered = register_with_backoff(
                self.client,
                self._registration(),
                self.stop,
                give_up_after_s=self.settings.max_idle_seconds,
            )
        except (RegistrationRefused, ServerUnreachable) as error:
            log.error("%s", error)
            return 2 if isinstance(error, RegistrationRefused) else 1
        if registered is None:
            return 0
        heartbeat_s = self.settings.heartbeat_interval_s or registered.heartbeat_interval_s
        threads = [
            threading.Thread(target=self._heartbeat_loop, args=(heartbeat_s,), name="heartbeat")
        ]
        threads += [
            threading.Thread(target=self._device_loop, args=(slot,), name=f"device-{udid}")
            for udid, slot in self._slots.items()
        ]
        self._touch()
        for thread in threads:
            thread.start()
        self._supervise()
        for thread in threads:
            thread.join()
        self._send_heartbeat(status="offline")
        log.info("agent stopped (%s)", self._stop_reason)
        return 0

    def _registration(self) -> AgentRegistration:
        return AgentRegistration(
            name=self.settings.name,
            hostname=socket.gethostname(),
            version=agent_version(),
            devices=self._inventory(),
        )

    def _inventory(self, status: str | None = None) -> list[DeviceInfo]:
        with self._lock:
            return [
                slot.info.model_copy(
                    update={"status": status or ("busy" if slot.current_run else "ready")}
                )
                for slot in self._slots.values()
            ]

    def _touch(self) -> None:
        with self._lock:
            self._last_activity = time.monotonic()

    def _supervise(self) -> None:
        settings = self.settings
        while not self.stop.wait(SUPERVISE_TICK_S):
            with self._lock:
                busy = any(slot.current_run is not None for slot in self._slots.values())
                all_idle = not busy and all(
                    slot.empty_polls >= settings.idle_polls for slot in self._slots.values()
                )
                idle_s = time.monotonic() - self._last_activity
            if settings.once and all_idle:
                self.request_stop(
                    f"--once: no claimable runs for {settings.idle_polls} polls on any device"
                )
            elif settings.max_idle_seconds is not None and not busy:
                if idle_s > settings.max_idle_seconds:
                    self.request_stop(f"no run in flight for {idle_s:.0f} s (--max-idle-seconds)")

    def _heartbeat_loop(self, interval_s: float) -> None:
        while not self.stop.wait(interval_s):
            self._send_heartbeat()

    def _send_heartbeat(self, status: str | None = None) -> None:
        try:
            self.client.heartbeat(self._inventory(status))
        except ApiError as error:
            if error.status_code in {401, 404} and status is None:
                # The server no longer knows this agent (e.g. its database was reset).
                log.warning("heartbeat refused (%s); registering again", error)
                self._reregister()
            else:
                log.warning("heartbeat failed: %s", error)
        except httpx.HTTPError as error:
            log.warning("heartbeat failed, server unreachable: %r", error)

    def _reregister(self) -> None:
        try:
            self.client.register_agent(self._registration())
        except (ApiError, httpx.HTTPError) as error:
            log.warning("registering again failed: %s", error)

    def _device_loop(self, slot: DeviceSlot) -> None:
        udid = slot.info.udid
        failures = 0
        while not self.stop.is_set():
            try:
                claim = self.client.claim_run(udid)
            except (ApiError, httpx.HTTPError) as error:
                failures += 1
                delay_s = min(self.settings.poll_interval_s * 2**failures, MAX_BACKOFF_S)
                log.warning("claim for %s failed (%r); retrying in %.0f s", udid, error, delay_s)
                self.stop.wait(delay_s)
                continue
            failures = 0
            if claim.run is None:
                with self._lock:
                    slot.empty_polls += 1
                self.stop.wait(self.settings.poll_interval_s)
                continue
            with self._lock:
                slot.empty_polls = 0
                slot.current_run = claim.run.run_id
            self._touch()
            try:
                self.executor.execute(claim.run, slot.info)
            except Exception:  # execute reports run failures itself; keep the device serving
                log.exception("run %d: unexpected error outside the run", claim.run.run_id)
            finally:
                with self._lock:
                    slot.current_run = None
                self._touch()


def build_driver(settings: AgentSettings) -> DeviceDriver:
    return SimulatedDriver(
        settings.simulated_devices(), settings.work_dir, time_scale=settings.time_scale
    )


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)-7s %(threadName)s %(name)s: %(message)s",
    )
    if settings.log_level != "DEBUG":
        logging.getLogger("httpx").setLevel(logging.WARNING)  # it logs every request at INFO
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    driver = build_driver(settings)
    log.info(
        "agent %s starting: server %s, %s driver, devices %s, work dir %s",
        settings.name,
        settings.server_url,
        driver.name,
        ", ".join(f"{d.device_class} {d.udid}" for d in driver.discover()),
        settings.work_dir,
    )
    with DecodebenchClient(settings.server_url, settings.token) as client:
        agent = Agent(settings, client, driver)

        def on_signal(signum: int, frame: FrameType | None) -> None:
            agent.request_stop(f"received {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        return agent.run()
