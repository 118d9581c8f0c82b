"""Framing of the wire protocols the emulated iPhone speaks (server side).

- usbmuxd: a little-endian header ``length, version, message, tag`` (length counts itself),
  then the body; version 1 and message 8 carry an XML plist.
- lockdown and the services behind it: a big-endian 32-bit length, then a plist.
"""

from __future__ import annotations

import asyncio
import plistlib
import struct
from typing import Any

USBMUX_HEADER = struct.Struct("<IIII")
USBMUX_PLIST_VERSION = 1
USBMUX_PLIST_MESSAGE = 8
MAX_MESSAGE_BYTES = 64 * 2**20
PREFIX = struct.Struct(">I")


class ProtocolViolation(Exception):
    """The peer sent something this protocol does not allow."""


async def read_usbmux_packet(reader: asyncio.StreamReader) -> tuple[int, int, int, bytes]:
    """(version, message, tag, body) of the next packet; IncompleteReadError on EOF."""
    header = await reader.readexactly(USBMUX_HEADER.size)
    length, version, message, tag = USBMUX_HEADER.unpack(header)
    if not USBMUX_HEADER.size <= length <= MAX_MESSAGE_BYTES:
        raise ProtocolViolation(f"usbmux packet of {length} bytes")
    return version, message, tag, await reader.readexactly(length - USBMUX_HEADER.size)


def usbmux_plist_packet(tag: int, payload: dict[str, Any]) -> bytes:
    body = plistlib.dumps(payload)
    header = USBMUX_HEADER.pack(
        USBMUX_HEADER.size + len(body), USBMUX_PLIST_VERSION, USBMUX_PLIST_MESSAGE, tag
    )
    return header + body


async def read_plist(reader: asyncio.StreamReader) -> dict[str, Any]:
    (length,) = PREFIX.unpack(await reader.readexactly(PREFIX.size))
    if length > MAX_MESSAGE_BYTES:
        raise ProtocolViolation(f"plist message of {length} bytes")
    message = plistlib.loads(await reader.readexactly(length))
    if not isinstance(message, dict):
        raise ProtocolViolation(f"expected a dictionary, got {type(message).__name__}")
    return message


def plist_frame(message: dict[str, Any]) -> bytes:
    body = plistlib.dumps(message)
    return PREFIX.pack(len(body)) + body


async def write_plist(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(plist_frame(message))
    await writer.drain()
