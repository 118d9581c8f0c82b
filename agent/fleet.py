"""The devices an agent serves, and what the server is told about them.

Each device has a slot: its last reported info, its health (agent/health.py), the run it is
running. The fleet follows attach and detach (`reconcile`) and heartbeats the whole inventory in one request, at most every
HEARTBEAT_MIN_GAP_S however many devices change state; a server that no longer knows the agent
is registered with again.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from agent.config import AgentSettings
from agent.health import BUSY, DeviceHealth
from agent.registration import agent_version
from decodebench.client import ApiError, DecodebenchClient
from decodebench.contracts.names import DeviceStatus
from decodebench.contracts.protocol import AgentRegistration, DeviceInfo

log = logging.getLogger("agent")

# However many devices change state, the server hears from this agent at most this often.
HEARTBEAT_MIN_GAP_S = 1.0


@dataclass
class DeviceSlot:
    info: DeviceInfo
    health: DeviceHealth = field(default_factory=DeviceHealth)
    current_run: int | None = None
    empty_polls: int = 0
    connected: bool = True
    probed_at: float | None = None
    task: asyncio.Task[None] | None = None


class Fleet:
    def __init__(
        self,
        settings: AgentSettings,
        client: DecodebenchClient,
        discover: Callable[[], list[DeviceInfo]],
        stop: threading.Event,
    ) -> None:
        """``discover``: the devices attached now (the driver's)."""
        self.settings = settings
        self.client = client
        self.discover = discover
        self.stop = stop
        self.slots: dict[str, DeviceSlot] = {}
        self.lock = threading.Lock()
        self.changed = threading.Event()  # the inventory changed: heartbeat soon
        self._last_activity = time.monotonic()

    def serve(self, devices: list[DeviceInfo]) -> None:
        with self.lock:
            self.slots = {device.udid: DeviceSlot(device) for device in devices}

    def touch(self) -> None:
        with self.lock:
            self._last_activity = time.monotonic()

    def idle_s(self) -> float:
        """Seconds since a run last started or ended (the caller holds the lock)."""
        return time.monotonic() - self._last_activity

    def registration(self) -> AgentRegistration:
        return AgentRegistration(
            name=self.settings.name,
            hostname=socket.gethostname(),
            version=agent_version(),
            devices=self.inventory(),
        )

    def inventory(self, status: DeviceStatus | None = None) -> list[DeviceInfo]:
        """What the heartbeat reports (connected devices): ``status`` for every device when
        given (offline), else busy for a device running one of our runs, else what its health
        says."""
        with self.lock:
            return [
                slot.info
                if status is None and not slot.current_run
                else slot.info.model_copy(update={"status": status or BUSY, "status_detail": ""})
                for slot in self.slots.values()
                if slot.connected
            ]

    def reconcile(self) -> list[DeviceSlot]:
        """Follow attach and detach: gone devices are marked, new ones announced (the server
        must know a device before it is claimed for); the slots that appeared."""
        try:
            present = {device.udid: device for device in self.discover()}
        except Exception:
            log.exception("listing devices failed")
            return []
        appeared: list[DeviceSlot] = []
        with self.lock:
            for udid, slot in self.slots.items():
                if slot.connected and udid not in present:
                    slot.connected = False
                    log.warning("device %s (%s) disconnected", udid, slot.info.device_class)
                    self.changed.set()
            for udid, info in present.items():
                known = self.slots.get(udid)
                if known is not None and known.connected:
                    continue
                if known is None:
                    known = self.slots[udid] = DeviceSlot(info)
                known.connected = True
                known.probed_at = None
                log.info("device %s (%s) connected", udid, info.device_class)
                appeared.append(known)
        if appeared:
            self.send_heartbeat()
        return appeared

    def heartbeat_loop(self, interval_s: float) -> None:
        while not self.stop.is_set():
            self.changed.wait(interval_s)
            self.changed.clear()
            if not self.stop.is_set():
                self.send_heartbeat()
                # Changes meanwhile go together in the next one.
                self.stop.wait(min(HEARTBEAT_MIN_GAP_S, interval_s))

    def send_heartbeat(self, status: DeviceStatus | None = None) -> None:
        try:
            self.client.heartbeat(self.inventory(status))
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
            self.client.register_agent(self.registration())
        except (ApiError, httpx.HTTPError) as error:
            log.warning("registering again failed: %s", error)
