"""The iOS 17+ path of an emulated iPhone: a RemoteServiceDiscovery endpoint and tunneld's API.

On a real phone, ``pymobiledevice3 remote tunneld`` (root) opens a tunnel per device — a TUN
interface or a userspace QUIC/TCP stack carrying the phone's IPv6 link — and serves
``GET /`` with ``{udid: [{"tunnel-address", "tunnel-port", "interface"}]}``. The host then speaks
RemoteXPC over HTTP/2 to RemoteServiceDiscovery at that address, which lists the phone's
services and their ports, and connects to each service directly.

Here the tunnel itself is the one hop not reproduced: creating a TUN device needs root, and the
userspace tunnel's peer is the phone's own network stack. Each emulated phone instead listens on
a loopback port for RSD and on one per service, and the emulated tunneld hands out those
addresses. Everything above the tunnel — tunneld's HTTP API, the RSD handshake over HTTP/2,
DVT on ``com.apple.instruments.dtservicehub`` — is the real protocol, spoken to pymobiledevice3's
own client code. A tunnel can be dropped (fault ``tunnel-drop``): its listeners close, its
connections break and tunneld stops listing it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import TYPE_CHECKING, Any

from emulator import xpc
from emulator.instruments import RSD_SERVICE, serve_instruments

if TYPE_CHECKING:
    from emulator.device import EmulatedDevice

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
SETTINGS = {0x3: 100, 0x4: 1048576}  # max concurrent streams, initial window size


class DeviceTunnel:
    """One phone's end of a tunnel: RSD and the services it lists, on loopback ports."""

    def __init__(self, device: EmulatedDevice) -> None:
        self.device = device
        self.rsd_port = 0
        self.service_ports: dict[str, int] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def up(self) -> bool:
        return bool(self._servers)

    async def open(self) -> None:
        if self.up:
            return
        rsd = await asyncio.start_server(self._guard(self._serve_rsd), LOOPBACK, 0)
        dvt = await asyncio.start_server(self._guard(serve_instruments), LOOPBACK, 0)
        self._servers = [rsd, dvt]
        self.rsd_port = rsd.sockets[0].getsockname()[1]
        self.service_ports = {RSD_SERVICE: dvt.sockets[0].getsockname()[1]}

    def drop(self) -> None:
        """The tunnel goes away: nothing listens any more and open connections break."""
        for server in self._servers:
            server.close()
        self._servers.clear()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        log.info("%r: tunnel dropped", self.device)

    def _guard(self, handler: Any) -> Any:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._writers.add(writer)
            try:
                await handler(self.device, reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            except Exception:
                log.exception("%r: tunnel service failed", self.device)
            finally:
                self._writers.discard(writer)
                writer.transport.abort()

        return serve

    def listed_services(self) -> dict[str, Any]:
        """What RSD lists: DVT only once the developer disk image is mounted."""
        services: dict[str, Any] = {}
        if self.device.mounted_image is not None:
            for name, port in self.service_ports.items():
                services[name] = {"Port": str(port), "Properties": {"UsesRemoteXPC": False}}
        return services

    def peer_info(self) -> dict[str, Any]:
        identity = self.device.identity
        return {
            "MessageType": "Handshake",
            "MessagingProtocolVersion": xpc.UInt64(7),
            "UUID": uuid.UUID(int=identity.unique_chip_id),
            "Properties": {
                "UniqueDeviceID": identity.udid,
                "ProductType": identity.product_type,
                "OSVersion": identity.product_version,
                "BuildVersion": identity.build_version,
                "UniqueChipID": xpc.UInt64(identity.unique_chip_id),
                "DeviceClass": "iPhone",
                "HardwareModel": "D93AP",
                "ChipID": xpc.UInt64(0x8140),
                "SensitivePropertiesVisible": True,
            },
            "Services": self.listed_services(),
        }

    async def _serve_rsd(
        self, device: EmulatedDevice, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if await reader.readexactly(len(xpc.HTTP2_PREFACE)) != xpc.HTTP2_PREFACE:
            return
        writer.write(xpc.settings_frame(SETTINGS))
        await writer.drain()
        pending: dict[int, bytes] = {}
        while True:
            kind, flags, stream, payload = await xpc.read_frame(reader)
            if kind == xpc.FRAME_SETTINGS and not flags & xpc.FLAG_ACK:
                writer.write(xpc.frame(xpc.FRAME_SETTINGS, xpc.FLAG_ACK, 0))
            if kind != xpc.FRAME_DATA:
                continue
            buffered = pending.get(stream, b"") + payload
            while buffered:
                try:
                    message, used = xpc.unwrap(buffered)
                except ValueError:
                    break
                buffered = buffered[used:]
                if isinstance(message, dict) and message.get("MessageType") == "Handshake":
                    writer.write(xpc.data_frames(1, xpc.wrap(self.peer_info())))
            pending[stream] = buffered
            await writer.drain()


class EmulatedTunneld:
    """tunneld's HTTP API (``GET /``) over the fleet's phones that are on iOS 17+."""

    def __init__(self, devices: list[EmulatedDevice]) -> None:
        self.devices = devices
        self.port = 0
        self._server: asyncio.AbstractServer | None = None

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, LOOPBACK, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    def tunnels(self) -> dict[str, list[dict[str, Any]]]:
        listing = {}
        for device in self.devices:
            tunnel = device.tunnel
            if device.attached and tunnel is not None and tunnel.up:
                listing[device.udid] = [
                    {
                        "tunnel-address": LOOPBACK,
                        "tunnel-port": tunnel.rsd_port,
                        "interface": f"emulated-utun{device.identity.device_id}",
                    }
                ]
        return listing

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = (await reader.readline()).decode(errors="replace").split()
            while (await reader.readline()).strip():
                pass  # headers
            if len(request_line) >= 2 and request_line[0] == "GET" and request_line[1] == "/":
                status, body = "200 OK", json.dumps(self.tunnels()).encode()
            else:
                status, body = "404 Not Found", b'{"error": "only GET / is served"}'
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
