"""Launching the harness app on a device: DVT process control, as Xcode's instruments do.

pymobiledevice3's own `DvtProvider` / `ProcessControl` / `DeviceInfo` clients, over lockdown
before iOS 17 (``…DVTSecureSocketProxy``, once the developer disk image is mounted) and through
tunneld's tunnel and RemoteServiceDiscovery from iOS 17 (``com.apple.instruments.dtservicehub``;
``sudo pymobiledevice3 remote tunneld``). The same code drives the emulated iPhone.

The DTX connection of a launch stays open until the run ends, so the device's termination notice
(exit code or crashing signal) and the app's output reach the agent.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from packaging.version import Version
from pymobiledevice3.dtx import DTXNsError, dtx_on_invoke
from pymobiledevice3.lockdown import LockdownClient
from pymobiledevice3.lockdown_service_provider import LockdownServiceProvider
from pymobiledevice3.services.dvt.instruments.dvt_provider import DvtProvider
from pymobiledevice3.services.dvt.instruments.process_control import (
    ProcessControl,
    ProcessControlService,
)

from agent.drivers.ios.errors import CONNECTION_LOST, launch_refusal, no_tunnel

log = logging.getLogger(__name__)

OUTPUT_LINES_KEPT = 200
NOTICE_WAIT_STEPS, NOTICE_WAIT_STEP_S = 50, 0.02
SIGNALS = {6: "SIGABRT", 9: "SIGKILL", 10: "SIGBUS", 11: "SIGSEGV", 15: "SIGTERM"}


@dataclass(frozen=True)
class ProcessState:
    running: bool | None  # None: the launcher cannot tell
    reason: str = ""


@dataclass(frozen=True)
class AppLaunch:
    """What a launcher starts: the app, its arguments and its environment."""

    bundle_id: str
    arguments: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)


class Launcher(Protocol):
    name: str

    async def launch(self, lockdown: LockdownClient, app: AppLaunch) -> int:
        """Start the app (killing a running instance); its pid."""
        ...

    async def state(self, lockdown: LockdownClient, pid: int) -> ProcessState: ...

    async def kill(self, lockdown: LockdownClient, pid: int) -> None: ...

    def output(self, udid: str) -> list[str]: ...

    async def close(self) -> None: ...


class ObservedProcessControl(ProcessControlService):
    """The process-control channel, keeping the device's termination notices."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.ended: dict[int, str] = {}

    @dtx_on_invoke("processWithPID:terminatedWithExitCode:orCrashingSignal:")
    async def _on_process_terminated(
        self, pid: int, exit_code: int | None, crashing_signal: int | None
    ) -> None:
        self.ended[int(pid)] = exit_description(exit_code, crashing_signal)


def exit_description(exit_code: int | None, crashing_signal: int | None) -> str:
    if crashing_signal:
        name = SIGNALS.get(int(crashing_signal), f"signal {crashing_signal}")
        if int(crashing_signal) == 9:
            return "killed (SIGKILL: by the OS, e.g. for memory, or by a host)"
        return f"crashed ({name})"
    return f"exited with code {exit_code if exit_code is not None else 'unknown'}"


@dataclass
class LaunchSession:
    """The open DVT connection of one launch."""

    provider: LockdownServiceProvider
    dvt: DvtProvider
    control: ObservedProcessControl
    pid: int
    output: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=OUTPUT_LINES_KEPT)
    )
    reader: Any = None

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
        with contextlib.suppress(Exception):
            await self.dvt.close()
        # A tunnel's RSD belongs to the session; a lockdown client to the step that made it.
        if not isinstance(self.provider, LockdownClient):
            with contextlib.suppress(Exception):
                await self.provider.close()  # type: ignore[attr-defined]


class DvtLauncher:
    """DVT process control; on iOS 17+ through tunneld's tunnel to the device."""

    name = "dvt"

    def __init__(self, tunneld_address: tuple[str, int] | None = None) -> None:
        self.tunneld_address = tunneld_address
        self._sessions: dict[str, LaunchSession] = {}
        self._outputs: dict[str, list[str]] = {}

    async def _provider(self, lockdown: LockdownClient) -> LockdownServiceProvider:
        if Version(lockdown.product_version) < Version("17.0"):
            return lockdown
        from pymobiledevice3.tunneld.api import TUNNELD_DEFAULT_ADDRESS, get_tunneld_device_by_udid

        address = self.tunneld_address or TUNNELD_DEFAULT_ADDRESS
        try:
            rsd = await get_tunneld_device_by_udid(str(lockdown.udid), address)
        except IndexError:
            # tunneld listed a tunnel that no longer answers (it dropped between the listing and
            # the connection): pymobiledevice3 then indexes its empty list of connected RSDs.
            rsd = None
        if rsd is None:
            raise no_tunnel(str(lockdown.udid), address)
        return rsd

    async def _with_dvt(self, lockdown: LockdownClient, action: Any) -> Any:
        provider = await self._provider(lockdown)
        try:
            async with DvtProvider(provider) as dvt:
                return await action(dvt)
        except CONNECTION_LOST:
            if provider is not lockdown:
                # The tunnel may have dropped between tunneld's answer and the request: said as
                # such (no_tunnel, with its fix), not as a connection lost.
                still = await self._provider(lockdown)
                await still.close()  # type: ignore[attr-defined]
            raise
        finally:
            if provider is not lockdown:
                await provider.close()  # type: ignore[attr-defined]

    async def launch(self, lockdown: LockdownClient, app: AppLaunch) -> int:
        udid = str(lockdown.udid)
        await self._end_session(udid)
        provider = await self._provider(lockdown)
        dvt = DvtProvider(provider)
        try:
            await dvt.connect()
            channel = await dvt.dtx.open_channel(ObservedProcessControl)
            process_control = ProcessControl(dvt, channel)
            try:
                pid = int(
                    await process_control.launch(
                        app.bundle_id,
                        app.arguments,
                        kill_existing=True,
                        environment=app.environment,
                    )
                )
            except DTXNsError as error:
                raise launch_refusal(describe_ns_error(error), udid) from error
        except BaseException:
            with contextlib.suppress(Exception):
                await dvt.close()
            if provider is not lockdown:
                await provider.close()  # type: ignore[attr-defined]
            raise
        session = LaunchSession(provider, dvt, channel, pid)
        session.reader = _spawn_output_reader(process_control, session)
        self._sessions[udid] = session
        self._outputs[udid] = list(session.output)
        return pid

    async def state(self, lockdown: LockdownClient, pid: int) -> ProcessState:
        from pymobiledevice3.services.dvt.instruments.device_info import DeviceInfo as DvtDeviceInfo

        session = self._sessions.get(str(lockdown.udid))
        if session is not None and session.pid == pid and pid in session.control.ended:
            return ProcessState(False, session.control.ended[pid])

        async def running(dvt: Any) -> bool:
            async with DvtDeviceInfo(dvt) as device_info:
                return bool(await device_info.is_running_pid(pid))

        is_running = await self._with_dvt(lockdown, running)
        if is_running:
            return ProcessState(True)
        # The termination notice travels on the launch's own connection: give it a moment.
        for _ in range(NOTICE_WAIT_STEPS):
            if session is None or session.pid != pid or pid in session.control.ended:
                break
            await asyncio.sleep(NOTICE_WAIT_STEP_S)
        if session is not None and session.pid == pid and pid in session.control.ended:
            return ProcessState(False, session.control.ended[pid])
        return ProcessState(False, "the process is gone")

    async def kill(self, lockdown: LockdownClient, pid: int) -> None:
        async def kill(dvt: Any) -> None:
            async with ProcessControl(dvt) as process_control:
                await process_control.kill(pid)

        try:
            await self._with_dvt(lockdown, kill)
        finally:
            await self._end_session(str(lockdown.udid))

    async def _end_session(self, udid: str) -> None:
        session = self._sessions.pop(udid, None)
        if session is not None:
            self._outputs[udid] = list(session.output)
            await session.close()

    async def close(self) -> None:
        """End every open launch session (the driver is closing)."""
        for udid in list(self._sessions):
            await self._end_session(udid)

    def output(self, udid: str) -> list[str]:
        """The app's output lines of its last launch on `udid` (what DVT relayed)."""
        session = self._sessions.get(udid)
        return list(session.output) if session is not None else self._outputs.get(udid, [])


def _spawn_output_reader(process_control: ProcessControl, session: LaunchSession) -> Any:
    async def read() -> None:
        with contextlib.suppress(Exception):
            async for event in process_control:
                if event.pid == session.pid:
                    session.output.append(str(event.message).rstrip("\n"))

    return asyncio.ensure_future(read())


def describe_ns_error(error: DTXNsError) -> str:
    info = error.error.user_info or {}
    parts = [str(info.get(key)) for key in ("NSLocalizedDescription", "NSLocalizedFailureReason")]
    text = " ".join(part for part in parts if part and part != "None")
    return text or str(error)
