"""lockdownd of an emulated iPhone (port 62078): identity values, session TLS, service start.

The least a host needs: ``QueryType``, ``GetValue`` (whole domain or one key), ``StartSession``
with the HostID of a pair record the device knows (then the session switches to TLS, served
with the device certificate), ``StopSession`` and ``StartService``. ``Pair`` answers that the
trust dialog is pending: emulated devices are paired (or not) by their condition, not by a host.
`serve_port` is where a usbmux connection lands: lockdownd, or a service it started.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from emulator.device import LOCKDOWN_PORT, EmulatedDevice, ServiceHandler
from emulator.services import SERVICES, needs_developer_image, tunnel_only, uses_tls
from emulator.wire import read_plist, write_plist

LOCKDOWN_TYPE = "com.apple.mobile.lockdown"


async def serve_port(
    device: EmulatedDevice, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> bool:
    """Serve a usbmux connection to `port` of `device`: lockdownd, or the service lockdown
    started there; False when nothing listens there."""
    handler: ServiceHandler
    if port == LOCKDOWN_PORT:
        handler = serve_lockdown
    else:
        service = device.take_service(port)
        if service is None:
            return False
        handler = SERVICES[service]
    await device.serve(port, handler, reader, writer)
    return True


async def serve_lockdown(
    device: EmulatedDevice, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    session_id: str | None = None
    while True:
        request = await read_plist(reader)
        name = request.get("Request", "")
        response: dict[str, Any] = {"Request": name}
        upgrade = False
        if name == "QueryType":
            response["Type"] = LOCKDOWN_TYPE
        elif name == "GetValue":
            _get_value(device, request, response)
        elif name == "StartSession":
            if not device.condition.paired or request.get("HostID") != device.host.host_id:
                response["Error"] = "InvalidHostID"
            else:
                session_id = str(uuid.uuid4()).upper()
                response.update(SessionID=session_id, EnableSessionSSL=True)
                upgrade = True
        elif name == "StopSession":
            session_id = None
            response["Result"] = "Success"
        elif name == "StartService":
            service = request.get("Service", "")
            if session_id is None:
                response["Error"] = "SessionInactive"
            elif device.condition.locked:
                response["Error"] = "PasswordProtected"
            elif service not in SERVICES:
                response["Error"] = "InvalidService"
            elif needs_developer_image(service) and device.mounted_image is None:
                response["Error"] = "InvalidService"  # as on a phone without its DDI mounted
            elif tunnel_only(service, device.major_version):
                response["Error"] = "InvalidService"  # iOS 17+: only through the tunnel
            else:
                response.update(
                    Service=service,
                    Port=device.open_service(service),
                    EnableServiceSSL=uses_tls(service),
                )
        elif name == "Pair":
            response["Error"] = "PairingDialogResponsePending"
        elif name in {"SetValue", "RemoveValue"}:
            response["Error"] = "SetProhibited"
        else:
            response["Error"] = "InvalidRequest"
        await write_plist(writer, response)
        if upgrade:
            await writer.start_tls(device.keys.server_context())


def _get_value(device: EmulatedDevice, request: dict[str, Any], response: dict[str, Any]) -> None:
    domain, key = request.get("Domain"), request.get("Key")
    values = device.values(domain)
    if values is None:
        response["Error"] = "MissingValue"
        return
    if domain is not None:
        response["Domain"] = domain
    if key is None:
        response["Value"] = values
    elif key in values:
        response.update(Key=key, Value=values[key])
    else:
        response["Error"] = "MissingValue"
