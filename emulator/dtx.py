"""DTX, the message protocol of the instruments remote server (device side).

A message travels in fragments: a 32-byte little-endian header (magic ``0x1F3D5B79``, header
size, fragment index and count, data size, message identifier, conversation index, channel code,
transport flags), then the body. A multi-fragment message's first fragment carries no body, its
data size being the whole message's. The body is a 16-byte header (message type, auxiliary
size, total size), the auxiliary arguments as a primitive dictionary, then the payload as a keyed
archive (a method name for a dispatch, a value for a reply).

Channel codes: the peer that opened a channel numbers it; messages the *other* side starts on it
carry the negated code. Replies keep the request's identifier with conversation index + 1.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from emulator import nskeyed
from emulator.wire import ProtocolViolation

MAGIC = 0x1F3D5B79
FRAGMENT_HEADER = struct.Struct("<IIHHIIIiI")
BODY_HEADER = struct.Struct("<BBBBIII")
EXPECTS_REPLY = 1
MAX_MESSAGE_BYTES = 128 * 2**20
MAX_FRAGMENT_BYTES = 128 * 1024

# Primitive dictionary (auxiliary arguments): a tagged header, then (key, value) primitives.
DICTIONARY_TAG = 0x1F0
DICTIONARY_HEADER = struct.Struct("<IIQ")
TAG_STRING, TAG_BUFFER, TAG_INT32, TAG_INT64, TAG_DOUBLE, TAG_NULL = 1, 2, 3, 6, 9, 10


class MessageType(IntEnum):
    ok = 0
    data = 1
    dispatch = 2
    object = 3
    error = 4
    barrier = 5


@dataclass
class Message:
    type: MessageType
    identifier: int
    conversation: int
    channel: int  # as on the wire
    expects_reply: bool = False
    payload: Any = None
    arguments: list[Any] = field(default_factory=list)


class Int32(int):
    """An argument sent as a 32-bit primitive rather than an archived number."""


# reading


async def read_message(reader: asyncio.StreamReader) -> Message:
    chunks: list[bytes] = []
    while True:
        header = FRAGMENT_HEADER.unpack(await reader.readexactly(FRAGMENT_HEADER.size))
        magic, header_size, index, count, size, identifier, conversation, channel, flags = header
        if magic != MAGIC or index >= count or size > MAX_MESSAGE_BYTES:
            raise ProtocolViolation(f"bad DTX fragment header {header}")
        if header_size > FRAGMENT_HEADER.size:
            await reader.readexactly(header_size - FRAGMENT_HEADER.size)
        if not (index == 0 and count > 1):
            chunks.append(await reader.readexactly(size))
        if index == count - 1:
            break
    body = b"".join(chunks)
    kind, _, _, _, aux_size, total_size, _ = BODY_HEADER.unpack_from(body)
    if total_size != len(body) - BODY_HEADER.size or aux_size > total_size:
        raise ProtocolViolation(f"DTX message {identifier} has inconsistent sizes")
    aux = body[BODY_HEADER.size : BODY_HEADER.size + aux_size]
    payload = body[BODY_HEADER.size + aux_size :]
    return Message(
        type=MessageType(kind),
        identifier=identifier,
        conversation=conversation,
        channel=channel,
        expects_reply=bool(flags & EXPECTS_REPLY),
        payload=nskeyed.unarchive(payload) if payload else None,
        arguments=parse_arguments(aux),
    )


def parse_arguments(aux: bytes) -> list[Any]:
    if not aux:
        return []
    tag, _, body_length = DICTIONARY_HEADER.unpack_from(aux)
    if tag & 0xFF != 0xF0:
        raise ProtocolViolation(f"auxiliary data is not a primitive dictionary (tag {tag:#x})")
    offset, end = DICTIONARY_HEADER.size, DICTIONARY_HEADER.size + body_length
    arguments = []
    while offset < end:
        _, offset = _read_primitive(aux, offset)  # the key: null for positional arguments
        value, offset = _read_primitive(aux, offset)
        arguments.append(value)
    return arguments


def _read_primitive(data: bytes, offset: int) -> tuple[Any, int]:
    (tag,) = struct.unpack_from("<I", data, offset)
    offset += 4
    tag &= 0xFF
    if tag == TAG_NULL:
        return None, offset
    if tag in (TAG_STRING, TAG_BUFFER):
        (length,) = struct.unpack_from("<I", data, offset)
        raw = data[offset + 4 : offset + 4 + length]
        offset += 4 + length
        if tag == TAG_STRING:
            return raw.decode(), offset
        return (nskeyed.unarchive(raw) if raw else None), offset
    if tag == TAG_INT32:
        return struct.unpack_from("<i", data, offset)[0], offset + 4
    if tag == TAG_INT64:
        return struct.unpack_from("<q", data, offset)[0], offset + 8
    if tag == TAG_DOUBLE:
        return struct.unpack_from("<d", data, offset)[0], offset + 8
    raise ProtocolViolation(f"unknown DTX primitive {tag:#x}")


# writing


def build_arguments(arguments: list[Any]) -> bytes:
    if not arguments:
        return b""
    body = bytearray()
    for argument in arguments:
        body += struct.pack("<I", TAG_NULL)
        if isinstance(argument, Int32):
            body += struct.pack("<Ii", TAG_INT32, argument)
        else:
            archived = b"" if argument is None else nskeyed.archive(argument)
            body += struct.pack("<II", TAG_BUFFER, len(archived)) + archived
    return DICTIONARY_HEADER.pack(DICTIONARY_TAG, 0, len(body)) + bytes(body)


def encode_message(message: Message) -> bytes:
    aux = build_arguments(message.arguments)
    payload = b"" if message.payload is None else nskeyed.archive(message.payload)
    body = (
        BODY_HEADER.pack(int(message.type), 0, 0, 0, len(aux), len(aux) + len(payload), 0)
        + aux
        + payload
    )
    flags = EXPECTS_REPLY if message.expects_reply else 0
    if len(body) <= MAX_FRAGMENT_BYTES:
        return _fragment(message, 0, 1, body, flags)
    pieces = [body[at : at + MAX_FRAGMENT_BYTES] for at in range(0, len(body), MAX_FRAGMENT_BYTES)]
    count = len(pieces) + 1
    first = _fragment_header(message, 0, count, len(body), flags)
    return first + b"".join(
        _fragment(message, index + 1, count, piece, flags) for index, piece in enumerate(pieces)
    )


def _fragment(message: Message, index: int, count: int, body: bytes, flags: int) -> bytes:
    return _fragment_header(message, index, count, len(body), flags) + body


def _fragment_header(message: Message, index: int, count: int, length: int, flags: int) -> bytes:
    """Fragment ``index`` of ``count``, ``length`` bytes; the first of several announces the
    whole body's length and carries none of it."""
    return FRAGMENT_HEADER.pack(
        MAGIC,
        FRAGMENT_HEADER.size,
        index,
        count,
        length,
        message.identifier,
        message.conversation,
        message.channel,
        flags,
    )


def reply_to(request: Message, value: Any) -> Message:
    """The answer to `request`: OK for nothing, ERROR for an NSError, else OBJECT."""
    if value is None:
        kind = MessageType.ok
    elif isinstance(value, nskeyed.NSError):
        kind = MessageType.error
    else:
        kind = MessageType.object
    return Message(
        kind, request.identifier, request.conversation + 1, request.channel, False, value
    )


def does_not_respond(selector: str) -> nskeyed.NSError:
    return nskeyed.NSError(
        "DTXMessage",
        1,
        {
            "NSLocalizedDescription": f"Unable to invoke {selector!r} - it does not respond to the selector"
        },
    )
