"""A fake usbmuxd: the plist usbmux protocol on a TCP port or a unix socket, in a thread.

pymobiledevice3 reaches it through ``USBMUXD_SOCKET_ADDRESS`` (``127.0.0.1:PORT`` or a socket
path) or an explicit ``usbmux_address``. Supported messages: ``ReadBUID``, ``ListDevices``,
``Listen`` (then ``Attached``/``Detached`` events), ``Connect`` (then the connection is a pipe
to the device's port), ``ReadPairRecord``, ``SavePairRecord``, ``DeletePairRecord``.

All methods are thread-safe: the server runs on its own event loop in a daemon thread, and the
public methods hand their work to that loop.
"""

from __future__ import annotations

import asyncio
import logging
import plistlib
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from emulator.device import EmulatedDevice
from emulator.lockdown import serve_port
from emulator.wire import (
    USBMUX_PLIST_MESSAGE,
    read_usbmux_packet,
    usbmux_plist_packet,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

RESULT_OK = 0
RESULT_BADCOMMAND = 1
RESULT_BADDEV = 2
RESULT_CONNREFUSED = 3
RESULT_BADVERSION = 6
PRODUCT_ID = 0x12A8


class EmulatedUsbmuxd:
    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, unix_path: str | None = None
    ) -> None:
        self._host, self._port, self._unix_path = host, port, unix_path
        self.devices: dict[str, EmulatedDevice] = {}
        self._listeners: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="emulated-usbmuxd", daemon=True
        )
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self.address = ""
        self.buid = "DECODEBENCH-EMULATED-BUID"

    # lifecycle

    def start(self) -> str:
        """Start serving; returns the address for USBMUXD_SOCKET_ADDRESS."""
        self._thread.start()
        self._call(self._start)
        return self.address

    async def _start(self) -> None:
        if self._unix_path is not None:
            self._server = await asyncio.start_unix_server(self._client, self._unix_path)
            self.address = self._unix_path
        else:
            self._server = await asyncio.start_server(
                self._client, self._host, self._port, family=socket.AF_INET
            )
            port = self._server.sockets[0].getsockname()[1]
            self.address = f"{self._host}:{port}"

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _stop(self) -> None:
        for device in self.devices.values():
            device.kill_all("emulator stopped")
            device.drop_connections()
        for writer in list(self._clients):
            writer.transport.abort()
        if self._server is not None:
            self._server.close()

    def __enter__(self) -> EmulatedUsbmuxd:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def call(self, coroutine_function: Callable[..., Any], *args: Any) -> Any:
        """Run a coroutine function on the emulator's loop (from another thread); its result."""
        return self._call(coroutine_function, *args)

    def _call(self, coroutine_function: Callable[..., Any], *args: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(
            coroutine_function(*args), self._loop
        )
        return future.result(timeout=30)

    # devices (thread-safe)

    def add(self, device: EmulatedDevice, attached: bool = True) -> EmulatedDevice:
        device.usbmuxd = self
        device.syslog.loop = self._loop
        self.devices[device.udid] = device
        if attached:
            self.attach(device.udid)
        return device

    def attach(self, udid: str) -> None:
        self._call(self._attach, self.devices[udid])

    def detach(self, udid: str, reattach_after_s: float | None = None) -> None:
        device = self.devices[udid]
        self._call(self._detach_async, device, reattach_after_s)

    def detach_now(self, device: EmulatedDevice, reattach_after_s: float | None) -> None:
        """Detach from the emulator's own loop (a fault firing inside a service)."""
        self._detach(device, reattach_after_s)

    async def _attach(self, device: EmulatedDevice) -> None:
        if device.attached:
            return
        device.attached = True
        log.info("%r attached", device)
        self._broadcast(self._attached_record(device))

    async def _detach_async(self, device: EmulatedDevice, reattach_after_s: float | None) -> None:
        self._detach(device, reattach_after_s)

    def _detach(self, device: EmulatedDevice, reattach_after_s: float | None) -> None:
        if not device.attached:
            return
        device.attached = False
        device.kill_all("device disconnected")
        device.drop_connections()
        log.info("%r detached", device)
        self._broadcast({"MessageType": "Detached", "DeviceID": device.identity.device_id})
        if reattach_after_s is not None:
            self._loop.call_later(
                reattach_after_s, lambda: self._loop.create_task(self._attach(device))
            )

    def _broadcast(self, message: dict[str, Any]) -> None:
        packet = usbmux_plist_packet(0, message)
        for writer in list(self._listeners):
            if writer.is_closing():
                self._listeners.discard(writer)
            else:
                writer.write(packet)

    @staticmethod
    def _attached_record(device: EmulatedDevice) -> dict[str, Any]:
        device_id = device.identity.device_id
        return {
            "MessageType": "Attached",
            "DeviceID": device_id,
            "Properties": {
                "ConnectionType": "USB",
                "DeviceID": device_id,
                "LocationID": 0x01100000 + device_id,
                "ProductID": PRODUCT_ID,
                "SerialNumber": device.udid,
                "USBSerialNumber": device.udid.replace("-", ""),
                "ConnectionSpeed": 480_000_000,
            },
        }

    def _by_device_id(self, device_id: int) -> EmulatedDevice | None:
        for device in self.devices.values():
            if device.identity.device_id == device_id and device.attached:
                return device
        return None

    # the protocol

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(writer)
        try:
            while True:
                version, message, tag, body = await read_usbmux_packet(reader)
                if message != USBMUX_PLIST_MESSAGE:
                    writer.write(usbmux_plist_packet(tag, _result(RESULT_BADVERSION)))
                    continue
                request = plistlib.loads(body)
                handed_over = await self._request(request, tag, reader, writer)
                if handed_over:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:
            log.exception("usbmuxd client failed")
        finally:
            self._clients.discard(writer)
            self._listeners.discard(writer)
            writer.transport.abort()

    async def _request(
        self,
        request: dict[str, Any],
        tag: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer one request; True once the connection belongs to a device or a listener."""
        kind = request.get("MessageType")

        def reply(payload: dict[str, Any]) -> None:
            writer.write(usbmux_plist_packet(tag, payload))

        if kind == "ReadBUID":
            reply({"BUID": self.buid})
        elif kind == "ListDevices":
            attached = [device for device in self.devices.values() if device.attached]
            reply({"DeviceList": [self._attached_record(device) for device in attached]})
        elif kind == "Listen":
            reply(_result(RESULT_OK))
            for device in self.devices.values():
                if device.attached:
                    writer.write(usbmux_plist_packet(0, self._attached_record(device)))
            self._listeners.add(writer)
            await reader.read()  # until the client hangs up
            return True
        elif kind == "Connect":
            target = self._by_device_id(int(request.get("DeviceID", -1)))
            port = socket.ntohs(int(request.get("PortNumber", 0)))
            if target is None:
                reply(_result(RESULT_BADDEV))
            elif not target.accepts(port):
                reply(_result(RESULT_CONNREFUSED))
            else:
                reply(_result(RESULT_OK))
                await writer.drain()
                self._clients.discard(writer)
                await serve_port(target, port, reader, writer)
                return True
        elif kind == "ReadPairRecord":
            paired = self.devices.get(str(request.get("PairRecordID", "")))
            if paired is None or not paired.condition.paired:
                reply(_result(RESULT_BADDEV))
            else:
                reply({"PairRecordData": plistlib.dumps(paired.pair_record)})
        elif kind in {"SavePairRecord", "DeletePairRecord"}:
            reply(_result(RESULT_OK))
        else:
            reply(_result(RESULT_BADCOMMAND))
        await writer.drain()
        return False


def _result(number: int) -> dict[str, Any]:
    return {"MessageType": "Result", "Number": number}
