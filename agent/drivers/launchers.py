"""Launching the harness app on a device, behind one small interface.

Real iPhones: DVT process control (``com.apple.instruments``), through a tunneld tunnel on
iOS 17+ (``sudo pymobiledevice3 remote tunneld``) or the lockdown service with the developer
disk image mounted before that. Emulated iPhones: the emulator's process-control service, a
small plist protocol reached through the same usbmux and lockdown path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from packaging.version import Version
from pymobiledevice3.lockdown import LockdownClient
from pymobiledevice3.lockdown_service_provider import LockdownServiceProvider

from agent.drivers.ios_errors import launch_refusal
from decodebench.emulated.services import EMULATED_PROCESS_CONTROL


@dataclass(frozen=True)
class ProcessState:
    running: bool | None  # None: the launcher cannot tell
    reason: str = ""


class Launcher(Protocol):
    name: str

    async def launch(
        self,
        lockdown: LockdownClient,
        bundle_id: str,
        arguments: list[str],
        environment: dict[str, str],
    ) -> int:
        """Start the app (killing a running instance); its pid."""
        ...

    async def state(self, lockdown: LockdownClient, pid: int) -> ProcessState: ...

    async def kill(self, lockdown: LockdownClient, pid: int) -> None: ...


class DvtLauncher:
    """DVT process control; on iOS 17+ through tunneld's tunnel to the device."""

    name = "dvt"

    def __init__(self, tunneld_address: tuple[str, int] | None = None) -> None:
        self.tunneld_address = tunneld_address

    async def _provider(self, lockdown: LockdownClient) -> LockdownServiceProvider:
        if Version(lockdown.product_version) < Version("17.0"):
            return lockdown
        from pymobiledevice3.tunneld.api import TUNNELD_DEFAULT_ADDRESS, get_tunneld_device_by_udid

        address = self.tunneld_address or TUNNELD_DEFAULT_ADDRESS
        rsd = await get_tunneld_device_by_udid(str(lockdown.udid), address)
        if rsd is None:
            raise launch_refusal(
                f"no tunnel to this device at tunneld {address[0]}:{address[1]}; iOS 17+ launches "
                "need `sudo pymobiledevice3 remote tunneld`",
                str(lockdown.udid),
            )
        return rsd

    async def _with_dvt(self, lockdown: LockdownClient, action: Any) -> Any:
        from pymobiledevice3.services.dvt.instruments.dvt_provider import DvtProvider

        provider = await self._provider(lockdown)
        try:
            async with DvtProvider(provider) as dvt:
                return await action(dvt)
        finally:
            if provider is not lockdown:
                await provider.close()  # type: ignore[attr-defined]

    async def launch(
        self,
        lockdown: LockdownClient,
        bundle_id: str,
        arguments: list[str],
        environment: dict[str, str],
    ) -> int:
        from pymobiledevice3.services.dvt.instruments.process_control import ProcessControl

        async def launch(dvt: Any) -> int:
            async with ProcessControl(dvt) as process_control:
                return await process_control.launch(
                    bundle_id, arguments, kill_existing=True, environment=environment
                )

        return int(await self._with_dvt(lockdown, launch))

    async def state(self, lockdown: LockdownClient, pid: int) -> ProcessState:
        from pymobiledevice3.services.dvt.instruments.device_info import DeviceInfo as DvtDeviceInfo

        async def running(dvt: Any) -> bool:
            async with DvtDeviceInfo(dvt) as device_info:
                return bool(await device_info.is_running_pid(pid))

        is_running = await self._with_dvt(lockdown, running)
        return ProcessState(is_running, "" if is_running else "the process is gone")

    async def kill(self, lockdown: LockdownClient, pid: int) -> None:
        from pymobiledevice3.services.dvt.instruments.process_control import ProcessControl

        async def kill(dvt: Any) -> None:
            async with ProcessControl(dvt) as process_control:
                await process_control.kill(pid)

        await self._with_dvt(lockdown, kill)


class EmulatedLauncher:
    """The emulated iPhone's process-control service (decodebench.emulated.services)."""

    name = "emulated"

    async def _request(self, lockdown: LockdownClient, request: dict[str, Any]) -> dict[str, Any]:
        connection = await lockdown.start_lockdown_service(EMULATED_PROCESS_CONTROL)
        try:
            return dict(await connection.send_recv_plist(request))
        finally:
            await connection.close()

    async def launch(
        self,
        lockdown: LockdownClient,
        bundle_id: str,
        arguments: list[str],
        environment: dict[str, str],
    ) -> int:
        answer = await self._request(
            lockdown,
            {
                "Command": "Launch",
                "BundleIdentifier": bundle_id,
                "Arguments": arguments,
                "Environment": environment,
            },
        )
        if "Error" in answer:
            raise launch_refusal(str(answer["Error"]), str(lockdown.udid))
        return int(answer["PID"])

    async def state(self, lockdown: LockdownClient, pid: int) -> ProcessState:
        answer = await self._request(lockdown, {"Command": "ProcessStatus", "PID": pid})
        if "Error" in answer:
            return ProcessState(False, str(answer["Error"]))
        return ProcessState(
            answer["State"] == "running", f"{answer['State']}: {answer.get('ExitReason', '')}"
        )

    async def kill(self, lockdown: LockdownClient, pid: int) -> None:
        await self._request(lockdown, {"Command": "Kill", "PID": pid})
