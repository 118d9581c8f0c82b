"""One emulated iPhone: identity, condition, file system, installed apps, processes, services.

Its services run on the emulator's event loop; the harness "app" runs on a worker thread.
Everything on disk lives below one root directory:

- ``Media/``: what ``com.apple.afc`` serves (installation_proxy stages packages here);
- ``Containers/<bundle id>/``: each installed app's data container (``Documents/`` …).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from decodebench.contracts.profiles import DeviceProfile, get_profile
from decodebench.timing import TimingParameters
from emulator import ddi
from emulator.faults import Condition, FaultKind, FaultPlan
from emulator.pairing import DeviceKeys, HostIdentity, pair_record

log = logging.getLogger(__name__)

LOCKDOWN_PORT = 62078
# Where the harness app gets greedy tokens (emulator.run_tokens): the pushed package run by its
# format's reference engine, the MIL interpreter or the project's Core AI engine (faithful to
# the artifact, slow), the PyTorch reference decoder, none, or auto (the pushed package when it
# is small).
TOKEN_SOURCES = ("auto", "torch", "mil", "off")
FIRST_SERVICE_PORT = 49152
# Per device class: what a current phone of that class reports.
OS_VERSIONS = {"iphone-16-pro": ("18.6.2", "22G100"), "iphone-17-pro": ("26.0.1", "23A355")}
CHIP_IDS = {"iphone-16-pro": 0x8140, "iphone-17-pro": 0x8150}

ServiceHandler = Callable[
    ["EmulatedDevice", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]
]


class Cable(Protocol):
    """What the device is plugged into (the emulated usbmuxd): it can pull the device's cable."""

    def detach_now(self, device: EmulatedDevice, reattach_after_s: float | None) -> None: ...


class Tunnel(Protocol):
    """The device's end of an iOS 17+ tunnel (`emulator.tunnel.DeviceTunnel`)."""

    rsd_port: int

    @property
    def up(self) -> bool: ...

    async def open(self) -> None: ...

    def drop(self) -> None: ...


class DeviceDetached(Exception):
    """The device went away under a service (cable pulled): the handler unwinds quietly."""


@dataclass(frozen=True)
class Identity:
    udid: str
    device_class: str
    product_type: str
    product_version: str
    build_version: str
    device_name: str
    device_id: int
    unique_chip_id: int
    wifi_mac: str

    @classmethod
    def for_class(cls, device_class: str, seed: str, device_id: int) -> Identity:
        """A stable identity from a seed (agent name and slot), shaped like a real one."""
        profile = get_profile(device_class)
        digest = hashlib.sha256(f"{seed}\0{device_class}".encode()).digest()
        ecid = int.from_bytes(digest[:8], "big") >> 12
        chip = CHIP_IDS.get(device_class, 0x8100)
        version, build = OS_VERSIONS.get(device_class, ("18.0", "22A3354"))
        return cls(
            udid=f"{chip:08X}-{ecid:016X}",
            device_class=device_class,
            product_type=profile.product_types[0],
            product_version=version,
            build_version=build,
            device_name=f"{profile.display_name} (emulated {device_id})",
            device_id=device_id,
            unique_chip_id=ecid,
            wifi_mac=":".join(f"{byte:02x}" for byte in digest[8:14]),
        )


@dataclass
class AppRecord:
    bundle_id: str
    version: str
    short_version: str
    display_name: str
    bundle_path: Path
    info: dict[str, Any]


@dataclass
class AppProcess:
    pid: int
    bundle_id: str
    started_at: float = field(default_factory=time.monotonic)
    state: str = "running"  # running, exited, crashed, killed
    exit_reason: str = ""
    kill: threading.Event = field(default_factory=threading.Event)
    environment: dict[str, str] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.state == "running"

    def exit_status(self) -> tuple[int | None, int | None]:
        """(exit code, crashing signal) as DVT reports an ended process."""
        if self.state == "killed":
            return None, 9
        if self.state == "crashed":
            return None, 11
        code = self.exit_reason.removeprefix("exit code ")
        return (int(code) if code.isdigit() else 0), None


class SyslogHub:
    """Fan-out of syslog lines to every open syslog_relay connection (thread-safe `emit`)."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[str]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None

    def subscribe(self) -> asyncio.Queue[str]:
        queue: asyncio.Queue[str] = asyncio.Queue()
        self._queues.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[str]) -> None:
        self._queues.discard(queue)

    def emit(self, line: str) -> None:
        if self.loop is None or self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self._put, line)

    def _put(self, line: str) -> None:
        for queue in self._queues:
            queue.put_nowait(line)


class EmulatedDevice:
    def __init__(
        self,
        identity: Identity,
        root: Path,
        host: HostIdentity,
        condition: Condition | None = None,
        faults: FaultPlan | None = None,
        time_scale: float = 0.0,
        tokens: str = "auto",
        timing: TimingParameters | None = None,
        push_bytes_before_disconnect: int = 256 * 1024,
        reattach_after_s: float | None = 1.0,
        slow_s: float = 30.0,
    ) -> None:
        if tokens not in TOKEN_SOURCES:
            raise ValueError(f"tokens must be one of {', '.join(TOKEN_SOURCES)}")
        self.identity = identity
        self.root = root
        self.host = host
        self.condition = condition or Condition()
        self.faults = faults or FaultPlan()
        self.time_scale = time_scale
        self.tokens = tokens
        self.timing = timing or TimingParameters()
        self.push_bytes_before_disconnect = push_bytes_before_disconnect
        self.reattach_after_s = reattach_after_s
        self.slow_s = slow_s
        # Per run id: the profile and dispatched ops the server sent with the run (agent side).
        self.assigned_timing: dict[int, tuple[DeviceProfile | None, int]] = {}
        self.keys = DeviceKeys.generate(host)
        self.pair_record = pair_record(host, self.keys, identity.wifi_mac)
        self.media = root / "Media"
        self.containers = root / "Containers"
        self.media.mkdir(parents=True, exist_ok=True)
        self.containers.mkdir(parents=True, exist_ok=True)
        self.apps: dict[str, AppRecord] = {}
        self.processes: dict[int, AppProcess] = {}
        self.syslog = SyslogHub()
        self.process_listeners: set[Callable[[AppProcess], None]] = set()
        # The developer disk image mounted ("Developer" or "Personalized") and its signature.
        self.mounted_image: str | None = None
        self.mounted_signature = b""
        if self.condition.ddi_mounted:
            self.mounted_image = self.image_type
            self.mounted_signature = ddi.signature(b"mounted before the emulator started")
        self.attached = False
        self.usbmuxd: Cable | None = None  # set by the usbmuxd the device is added to
        self.tunnel: Tunnel | None = None  # iOS 17+: set by the fleet
        self._writers: set[asyncio.StreamWriter] = set()
        self._services: dict[int, str] = {}
        self._next_port = FIRST_SERVICE_PORT
        self._next_pid = 1000
        self._lock = threading.Lock()

    @property
    def udid(self) -> str:
        return self.identity.udid

    @property
    def major_version(self) -> int:
        return int(self.identity.product_version.split(".")[0])

    @property
    def image_type(self) -> str:
        """The kind of developer disk image this iOS version mounts."""
        return "Personalized" if self.major_version >= 17 else "Developer"

    def __repr__(self) -> str:
        return f"<EmulatedDevice {self.identity.device_class} {self.udid}>"

    # lockdown values

    def values(self, domain: str | None) -> dict[str, Any] | None:
        identity, condition = self.identity, self.condition
        if domain is None:
            return {
                "UniqueDeviceID": identity.udid,
                "ProductType": identity.product_type,
                "ProductVersion": identity.product_version,
                "BuildVersion": identity.build_version,
                "DeviceName": identity.device_name,
                "DeviceClass": "iPhone",
                "UniqueChipID": identity.unique_chip_id,
                "ChipID": CHIP_IDS.get(identity.device_class, 0x8100),
                "DevicePublicKey": self.keys.public_key_pem,
                "WiFiAddress": identity.wifi_mac,
                "SerialNumber": identity.udid[-12:],
                "CPUArchitecture": "arm64e",
                "ActivationState": "Activated",
                "PasswordProtected": condition.locked,
                "HardwareModel": "D93AP",
                "TimeIntervalSince1970": time.time(),
            }
        if domain == "com.apple.mobile.battery":
            return {
                "BatteryCurrentCapacity": condition.battery_level,
                "BatteryIsCharging": condition.charging and condition.battery_level < 100,
                "ExternalConnected": condition.charging,
                "ExternalChargeCapable": condition.charging,
                "FullyCharged": condition.battery_level >= 100,
            }
        if domain == "com.apple.disk_usage":
            return {
                "TotalDataCapacity": 256 * 10**9,
                "TotalDataAvailable": condition.free_bytes,
                "AmountDataAvailable": condition.free_bytes,
            }
        if domain == "com.apple.security.mac.amfi":
            return {"DeveloperModeStatus": condition.developer_mode}
        return None

    # services

    def open_service(self, name: str) -> int:
        port = self._next_port
        self._next_port += 1
        self._services[port] = name
        return port

    def accepts(self, port: int) -> bool:
        return port == LOCKDOWN_PORT or port in self._services

    def take_service(self, port: int) -> str | None:
        """The service lockdown started on `port` (one connection each), or None."""
        return self._services.pop(port, None)

    async def serve(
        self,
        port: int,
        handler: ServiceHandler,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Run `handler` on a connection to `port`, which `drop_connections` breaks."""
        self._writers.add(writer)
        try:
            await handler(self, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, DeviceDetached):
            pass
        except Exception:
            log.exception("%r: service on port %d failed", self, port)
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    def drop_connections(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        self._services.clear()

    def note_pushed(self, path: str, end_offset: int, byte_count: int) -> None:
        """A write into an app container; once a file grows past `push_bytes_before_disconnect`
        bytes, an armed disconnect-mid-push fault pulls the cable."""
        if end_offset - byte_count < self.push_bytes_before_disconnect <= end_offset:
            if self.faults.take(FaultKind.disconnect_mid_push):
                log.info("%r: fault: disconnecting mid-push", self)
                assert self.usbmuxd is not None
                self.usbmuxd.detach_now(self, reattach_after_s=self.reattach_after_s)
                raise DeviceDetached(self.udid)

    # apps

    def container(self, bundle_id: str) -> Path:
        return self.containers / bundle_id

    def documents(self, bundle_id: str) -> Path:
        return self.container(bundle_id) / "Documents"

    def install(self, record: AppRecord) -> None:
        existing = self.apps.get(record.bundle_id)
        if existing is not None:
            shutil.rmtree(existing.bundle_path, ignore_errors=True)
        self.apps[record.bundle_id] = record
        for part in ("Documents", "Library", "tmp"):
            (self.container(record.bundle_id) / part).mkdir(parents=True, exist_ok=True)
        self.syslog.emit(f"installd: installed {record.bundle_id} {record.short_version}")

    def uninstall(self, bundle_id: str) -> bool:
        record = self.apps.pop(bundle_id, None)
        if record is None:
            return False
        shutil.rmtree(record.bundle_path, ignore_errors=True)
        shutil.rmtree(self.container(bundle_id), ignore_errors=True)
        return True

    def new_process(self, bundle_id: str) -> AppProcess:
        with self._lock:
            for process in self.processes.values():
                if process.bundle_id == bundle_id and process.running:
                    self.end_process(process, "killed", "killed by a new launch")
            self._next_pid += 1
            process = AppProcess(self._next_pid, bundle_id)
            self.processes[process.pid] = process
            return process

    def end_process(self, process: AppProcess, state: str, reason: str) -> None:
        ended = process.running
        if ended:
            process.state = state
            process.exit_reason = reason
        process.kill.set()
        if ended:
            for listener in list(self.process_listeners):
                listener(process)

    def executable_name(self, bundle_id: str) -> str:
        record = self.apps.get(bundle_id)
        return str(record.info.get("CFBundleExecutable", bundle_id)) if record else bundle_id

    def kill_all(self, reason: str) -> None:
        for process in list(self.processes.values()):
            self.end_process(process, "killed", reason)
