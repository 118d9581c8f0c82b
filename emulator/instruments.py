"""The instruments remote server of an emulated iPhone: DVT process control and device info.

Reached as ``com.apple.instruments.remoteserver.DVTSecureSocketProxy`` through lockdown (TLS
with the pair record's certificates, from iOS 14) or as ``com.apple.instruments.dtservicehub``
through RemoteServiceDiscovery (iOS 17+, plain inside the tunnel). Either way it is only there
once the developer disk image is mounted, as on a real phone.

Channel 0 carries the capability handshake and channel requests; the services:

- ``…processcontrol``: launch (arguments, environment, KillExisting), signals, kill, pid lookup;
  the launched process's output (``outputReceived:fromProcess:atTime:``) and, when the host
  announced the termination-callback capability, its end
  (``processWithPID:terminatedWithExitCode:orCrashingSignal:``);
- ``…deviceinfo``: ``isRunningPid:``, ``runningProcesses``, ``execnameForPid:``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import TYPE_CHECKING, Any

from emulator.dtx import (
    Int32,
    Message,
    MessageType,
    does_not_respond,
    encode_message,
    read_message,
    reply_to,
)
from emulator.nskeyed import NSError

if TYPE_CHECKING:
    from emulator.device import AppProcess, EmulatedDevice

log = logging.getLogger(__name__)

LOCKDOWN_SERVICE = "com.apple.instruments.remoteserver.DVTSecureSocketProxy"
RSD_SERVICE = "com.apple.instruments.dtservicehub"
PROCESS_CONTROL = "com.apple.instruments.server.services.processcontrol"
DEVICE_INFO = "com.apple.instruments.server.services.deviceinfo"
TERMINATION_CALLBACK = "com.apple.instruments.client.processcontrol.capability.terminationCallback"
CAPABILITIES = {
    "com.apple.private.DTXBlockCompression": 0,
    "com.apple.private.DTXConnection": 1,
    PROCESS_CONTROL: 4,
    DEVICE_INFO: 1,
}
SIGKILL = 9
LAUNCH_SELECTOR = (
    "launchSuspendedProcessWithDevicePath:bundleIdentifier:environment:arguments:options:"
)
UNTRUSTED_PROFILE = (
    'Security ("Unable to launch {bundle} because it has an invalid code signature, inadequate '
    'entitlements or its profile has not been explicitly trusted by the user.")'
)


def launch_denied(bundle_id: str, reason: str) -> NSError:
    """What SpringBoard answers a refused launch with, as DVT relays it."""
    return NSError(
        "FBSOpenApplicationServiceErrorDomain",
        1,
        {
            "NSLocalizedDescription": f'The request to open "{bundle_id}" failed.',
            "NSLocalizedFailureReason": (
                f"The request was denied by service delegate (SBMainWorkspace) for reason: {reason}."
            ),
        },
    )


class InstrumentsConnection:
    def __init__(
        self, device: EmulatedDevice, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.device = device
        self.reader, self.writer = reader, writer
        self.channels: dict[int, str] = {}
        self.host_capabilities: dict[str, Any] = {}
        self.observed: set[int] = set()
        self._next_identifier = 1
        self._loop = asyncio.get_running_loop()

    async def serve(self) -> None:
        await self._send_dispatch(0, "_notifyOfPublishedCapabilities:", [CAPABILITIES])
        self.device.process_listeners.add(self._process_ended)
        output = asyncio.ensure_future(self._relay_output())
        try:
            while True:
                message = await read_message(self.reader)
                if message.type != MessageType.dispatch:
                    continue  # acknowledgements of our notices
                answer = await self._dispatch(message)
                if message.expects_reply:
                    await self._write(reply_to(message, answer))
        finally:
            output.cancel()
            self.device.process_listeners.discard(self._process_ended)

    async def _write(self, message: Message) -> None:
        self.writer.write(encode_message(message))
        await self.writer.drain()

    async def _send_dispatch(self, code: int, selector: str, arguments: list[Any]) -> None:
        """A message this side starts: on a host-opened channel it carries the negated code."""
        identifier, self._next_identifier = self._next_identifier, self._next_identifier + 1
        await self._write(
            Message(MessageType.dispatch, identifier, 0, -code, False, selector, arguments)
        )

    async def _dispatch(self, message: Message) -> Any:
        selector, arguments = message.payload, message.arguments
        if not isinstance(selector, str):
            return NSError("DTXMessage", 1, {"NSLocalizedDescription": "no method name"})
        code = message.channel
        if code == 0:
            return self._control(selector, arguments)
        service = self.channels.get(code)
        if service == PROCESS_CONTROL:
            return self._process_control(code, selector, arguments)
        if service == DEVICE_INFO:
            return self._device_info(selector, arguments)
        return does_not_respond(selector)

    def _control(self, selector: str, arguments: list[Any]) -> Any:
        if selector == "_notifyOfPublishedCapabilities:":
            self.host_capabilities = dict(arguments[0] or {})
            return None
        if selector == "_requestChannelWithCode:identifier:":
            code, identifier = int(arguments[0]), str(arguments[1])
            if identifier not in CAPABILITIES:
                return NSError(
                    "DTXMessage", 1, {"NSLocalizedDescription": f"no service {identifier}"}
                )
            self.channels[code] = identifier
            return None
        if selector == "_channelCanceled:":
            self.channels.pop(int(arguments[0]), None)
            return None
        return does_not_respond(selector)

    # process control

    def _process_control(self, code: int, selector: str, arguments: list[Any]) -> Any:
        processes = self.device.processes
        if selector == LAUNCH_SELECTOR:
            _, bundle_id, environment, launch_arguments, options = arguments
            return self._launch(str(bundle_id), environment or {}, launch_arguments or [], options)
        if selector in {"sendSignal:toPid:", "killPid:"}:
            signal, pid = (SIGKILL, arguments[0]) if selector == "killPid:" else arguments
            process = processes.get(int(pid))
            if process is None:
                return NSError(
                    "NSPOSIXErrorDomain", 3, {"NSLocalizedDescription": "No such process"}
                )
            self.device.end_process(process, "killed", f"killed by the host (signal {signal})")
            return None
        if selector == "processIdentifierForBundleIdentifier:":
            running = [
                p.pid for p in processes.values() if p.bundle_id == arguments[0] and p.running
            ]
            return running[-1] if running else 0
        if selector in {"startObservingPid:", "stopObservingPid:"}:
            pid = int(arguments[0])
            (self.observed.add if selector.startswith("start") else self.observed.discard)(pid)
            return None
        if selector == "requestDisableMemoryLimitsForPid:":
            return True
        return does_not_respond(selector)

    def _launch(
        self, bundle_id: str, environment: dict[str, Any], arguments: list[Any], options: Any
    ) -> Any:
        from emulator.app import LaunchRefused, launch_app
        from emulator.faults import FaultKind

        device = self.device
        if not device.condition.profile_trusted:
            return launch_denied(bundle_id, UNTRUSTED_PROFILE.format(bundle=bundle_id))
        try:
            pid = launch_app(device, bundle_id, [str(argument) for argument in arguments])
        except LaunchRefused as refusal:
            return launch_denied(bundle_id, str(refusal))
        process = device.processes[pid]
        process.environment = {str(key): str(value) for key, value in environment.items()}
        self.observed.add(pid)
        if device.tunnel is not None and device.faults.take(FaultKind.tunnel_drop):
            log.info("%r: fault: the tunnel drops during the run", device)
            self._loop.call_later(0.3, device.tunnel.drop)
        if device.faults.take(FaultKind.killed_by_os):
            log.info("%r: fault: the OS kills pid %d (memory limit)", device, pid)
            device.end_process(process, "killed", "killed by the OS: jetsam (memory limit)")
        return pid

    def _process_ended(self, process: AppProcess) -> None:
        """From any thread: tell the host a process it launched has ended."""
        if TERMINATION_CALLBACK in self.host_capabilities:
            self._loop.call_soon_threadsafe(
                lambda: asyncio.ensure_future(self._notify_ended(process))
            )

    async def _notify_ended(self, process: AppProcess) -> None:
        # Checked here, on the loop: a process may end before its launch call has returned.
        code = next((c for c, name in self.channels.items() if name == PROCESS_CONTROL), None)
        if code is None or process.pid not in self.observed:
            return
        exit_code, signal = process.exit_status()
        try:
            await self._send_dispatch(
                code,
                "processWithPID:terminatedWithExitCode:orCrashingSignal:",
                [process.pid, exit_code, signal],
            )
        except (ConnectionError, RuntimeError):
            pass

    async def _relay_output(self) -> None:
        """The observed processes' log lines, as their output."""
        queue = self.device.syslog.subscribe()
        try:
            while True:
                line = await queue.get()
                match = re.search(r"\[(\d+)\] <\w+>: (.*)$", line)
                code = next((c for c, n in self.channels.items() if n == PROCESS_CONTROL), None)
                if match is None or code is None or int(match[1]) not in self.observed:
                    continue
                await self._send_dispatch(
                    code,
                    "outputReceived:fromProcess:atTime:",
                    [match[2] + "\n", int(match[1]), Int32(int(time.time()))],
                )
        finally:
            self.device.syslog.unsubscribe(queue)

    # device info

    def _device_info(self, selector: str, arguments: list[Any]) -> Any:
        processes = self.device.processes
        if selector == "isRunningPid:":
            process = processes.get(int(arguments[0]))
            return process is not None and process.running
        if selector == "execnameForPid:":
            process = processes.get(int(arguments[0]))
            return None if process is None else self.device.executable_name(process.bundle_id)
        if selector == "runningProcesses":
            return [
                {
                    "pid": process.pid,
                    "name": self.device.executable_name(process.bundle_id),
                    "isApplication": True,
                    "bundleIdentifier": process.bundle_id,
                }
                for process in processes.values()
                if process.running
            ]
        return does_not_respond(selector)


async def serve_instruments(
    device: EmulatedDevice, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    await InstrumentsConnection(device, reader, writer).serve()


async def serve_instruments_tls(
    device: EmulatedDevice, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """The lockdown service: the host starts TLS with its pair record (EnableServiceSSL)."""
    await writer.start_tls(device.keys.server_context())
    await serve_instruments(device, reader, writer)
