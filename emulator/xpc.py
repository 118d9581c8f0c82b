"""RemoteXPC as RemoteServiceDiscovery speaks it (device side): HTTP/2 frames carrying XPC.

HTTP/2: the client's preface, then frames of a 9-byte header (24-bit length, type, flags,
31-bit stream id). Only SETTINGS, WINDOW_UPDATE, HEADERS (empty header blocks) and DATA occur.

XPC: each DATA frame holds a wrapper (magic ``0x29B00B92``, flags, payload size, message id),
the payload a header (magic ``0x42133742``, version 5) and one object: a 32-bit type, then its
body, 4-byte aligned (dictionaries: byte length, count, then NUL-terminated keys and objects).
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from typing import Any

from emulator.wire import ProtocolViolation

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = struct.Struct(">HBBBI")  # length as 16 + 8 bits, type, flags, stream id
FRAME_DATA, FRAME_HEADERS, FRAME_SETTINGS, FRAME_WINDOW_UPDATE = 0x0, 0x1, 0x4, 0x8
FLAG_ACK = 0x1
MAX_FRAME_BYTES = 16384

WRAPPER = struct.Struct("<IIQQ")
WRAPPER_MAGIC = 0x29B00B92
PAYLOAD = struct.Struct("<II")
PAYLOAD_MAGIC, PAYLOAD_VERSION = 0x42133742, 5
FLAG_ALWAYS_SET, FLAG_DATA_PRESENT = 0x1, 0x100

T_NULL, T_BOOL, T_INT64, T_UINT64, T_DOUBLE = 0x1000, 0x2000, 0x3000, 0x4000, 0x5000
T_DATA, T_STRING, T_UUID, T_ARRAY, T_DICTIONARY = 0x8000, 0x9000, 0xA000, 0xE000, 0xF000


class UInt64(int):
    """An integer sent as XPC uint64 (plain ints go as int64)."""


# HTTP/2


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, int, int, bytes]:
    """(type, flags, stream id, payload) of the next frame."""
    high, low, kind, flags, stream = FRAME_HEADER.unpack(await reader.readexactly(9))
    length = (high << 8) | low
    if length > 2**24:
        raise ProtocolViolation(f"HTTP/2 frame of {length} bytes")
    return kind, flags, stream & 0x7FFFFFFF, await reader.readexactly(length)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    body = b"".join(struct.pack(">HI", key, value) for key, value in settings.items())
    return frame(FRAME_SETTINGS, 0, 0, body)


def data_frames(stream: int, data: bytes) -> bytes:
    return b"".join(
        frame(FRAME_DATA, 0, stream, data[at : at + MAX_FRAME_BYTES])
        for at in range(0, len(data), MAX_FRAME_BYTES)
    )


# XPC objects


def _aligned(data: bytes) -> bytes:
    return data + bytes(-len(data) % 4)


def encode(value: Any) -> bytes:
    if value is None:
        return struct.pack("<I", T_NULL)
    if isinstance(value, bool):
        return struct.pack("<II", T_BOOL, int(value))
    if isinstance(value, UInt64):
        return struct.pack("<IQ", T_UINT64, value)
    if isinstance(value, int):
        return struct.pack("<Iq", T_INT64, value)
    if isinstance(value, float):
        return struct.pack("<Id", T_DOUBLE, value)
    if isinstance(value, str):
        raw = value.encode() + b"\0"
        return struct.pack("<II", T_STRING, len(raw)) + _aligned(raw)
    if isinstance(value, (bytes, bytearray)):
        return struct.pack("<II", T_DATA, len(value)) + _aligned(bytes(value))
    if isinstance(value, uuid.UUID):
        return struct.pack("<I", T_UUID) + value.bytes
    if isinstance(value, list):
        body = struct.pack("<I", len(value)) + b"".join(encode(item) for item in value)
        return struct.pack("<II", T_ARRAY, len(body)) + body
    if isinstance(value, dict):
        entries = b"".join(
            _aligned(str(key).encode() + b"\0") + encode(item) for key, item in value.items()
        )
        body = struct.pack("<I", len(value)) + entries
        return struct.pack("<II", T_DICTIONARY, len(body)) + body
    raise TypeError(f"no XPC encoding for a {type(value).__name__}")


def decode(data: bytes, offset: int = 0) -> tuple[Any, int]:
    (kind,) = struct.unpack_from("<I", data, offset)
    offset += 4
    if kind == T_NULL:
        return None, offset
    if kind == T_BOOL:
        return bool(struct.unpack_from("<I", data, offset)[0]), offset + 4
    if kind in (T_INT64, T_UINT64):
        return struct.unpack_from("<q" if kind == T_INT64 else "<Q", data, offset)[0], offset + 8
    if kind == T_DOUBLE:
        return struct.unpack_from("<d", data, offset)[0], offset + 8
    if kind in (T_STRING, T_DATA):
        (length,) = struct.unpack_from("<I", data, offset)
        raw = data[offset + 4 : offset + 4 + length]
        offset += 4 + length + (-length % 4)
        return (raw.rstrip(b"\0").decode() if kind == T_STRING else raw), offset
    if kind == T_UUID:
        return uuid.UUID(bytes=data[offset : offset + 16]), offset + 16
    if kind in (T_ARRAY, T_DICTIONARY):
        _, count = struct.unpack_from("<II", data, offset)
        offset += 8
        if kind == T_ARRAY:
            items = []
            for _ in range(count):
                item, offset = decode(data, offset)
                items.append(item)
            return items, offset
        entries: dict[str, Any] = {}
        for _ in range(count):
            end = data.index(b"\0", offset)
            key = data[offset:end].decode()
            offset = end + 1 + (-(end + 1 - offset) % 4)
            entries[key], offset = decode(data, offset)
        return entries, offset
    raise ProtocolViolation(f"unknown XPC type {kind:#x}")


def wrap(
    message: dict[str, Any] | None, message_id: int = 0, flags: int = FLAG_ALWAYS_SET
) -> bytes:
    body = b""
    if message is not None:
        body = PAYLOAD.pack(PAYLOAD_MAGIC, PAYLOAD_VERSION) + encode(message)
        flags |= FLAG_DATA_PRESENT
    return WRAPPER.pack(WRAPPER_MAGIC, flags, len(body), message_id) + body


def unwrap(data: bytes) -> tuple[Any, int]:
    """(message or None, bytes used) of the first wrapper in `data`; ValueError if incomplete."""
    if len(data) < WRAPPER.size:
        raise ValueError("incomplete")
    magic, _, size, _ = WRAPPER.unpack_from(data)
    if magic != WRAPPER_MAGIC:
        raise ProtocolViolation(f"not an XPC wrapper (magic {magic:#x})")
    end = WRAPPER.size + size
    if len(data) < end:
        raise ValueError("incomplete")
    if size == 0:
        return None, end
    magic, _ = PAYLOAD.unpack_from(data, WRAPPER.size)
    if magic != PAYLOAD_MAGIC:
        raise ProtocolViolation("not an XPC payload")
    message, _ = decode(data, WRAPPER.size + PAYLOAD.size)
    return message, end
