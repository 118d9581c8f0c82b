"""The AFC file protocol, server side, over a directory of the emulated device.

Packets are a 40-byte little-endian header (``CFA6LPAA`` magic, entire length, this length,
packet number, operation) followed by the payload; every request gets one answer with the same
packet number: a STATUS (an AFC error code), DATA, or a file handle.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import struct
from collections.abc import Callable
from enum import IntEnum
from pathlib import Path
from typing import BinaryIO, cast

MAGIC = b"CFA6LPAA"
HEADER = struct.Struct("<8sQQQQ")
U64 = struct.Struct("<Q")
MAX_PACKET_BYTES = 1 << 31


class Op(IntEnum):
    STATUS = 0x01
    DATA = 0x02
    READ_DIR = 0x03
    REMOVE_PATH = 0x08
    MAKE_DIR = 0x09
    GET_FILE_INFO = 0x0A
    GET_DEVINFO = 0x0B
    FILE_OPEN = 0x0D
    FILE_OPEN_RES = 0x0E
    READ = 0x0F
    WRITE = 0x10
    FILE_SEEK = 0x11
    FILE_TELL = 0x12
    FILE_TELL_RES = 0x13
    FILE_CLOSE = 0x14
    FILE_SET_SIZE = 0x15
    RENAME_PATH = 0x18


class Status(IntEnum):
    SUCCESS = 0
    UNKNOWN_ERROR = 1
    UNKNOWN_PACKET_TYPE = 6
    INVALID_ARG = 7
    OBJECT_NOT_FOUND = 8
    OBJECT_IS_DIR = 9
    PERM_DENIED = 10
    OBJECT_EXISTS = 16
    DIR_NOT_EMPTY = 33


class AfcFailure(Exception):
    def __init__(self, status: Status) -> None:
        super().__init__(status.name)
        self.status = status


# fopen modes: read-only, r+, w, w+, a, a+
_OPEN_MODES = {1: "rb", 2: "r+b", 3: "wb", 4: "w+b", 5: "ab", 6: "a+b"}
_WRITING_MODES = {2, 3, 4, 5, 6}


def _cstrings(payload: bytes) -> list[str]:
    return [part.decode() for part in payload.split(b"\x00")[:-1]]


def _key_values(pairs: dict[str, str]) -> bytes:
    return b"".join(f"{key}\x00{value}\x00".encode() for key, value in pairs.items())


class AfcServer:
    """One AFC session. `jail` (a device path like "/Documents") limits what it may touch;
    `on_write(path, end_offset, byte_count)` sees every write (fault injection hooks in there)."""

    def __init__(
        self,
        root: Path,
        jail: str = "/",
        on_write: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.root = root
        self.jail = posixpath.normpath(jail)
        self.on_write = on_write
        self._handles: dict[int, tuple[str, BinaryIO]] = {}
        self._next_handle = 1

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readexactly(HEADER.size)
                magic, entire, _this, packet, operation = HEADER.unpack(header)
                if magic != MAGIC or not HEADER.size <= entire <= MAX_PACKET_BYTES:
                    return
                payload = await reader.readexactly(entire - HEADER.size)
                try:
                    answer_op, answer = self._handle(operation, payload)
                except AfcFailure as failure:
                    answer_op, answer = Op.STATUS, U64.pack(failure.status)
                except OSError:
                    answer_op, answer = Op.STATUS, U64.pack(Status.UNKNOWN_ERROR)
                length = HEADER.size + len(answer)
                writer.write(HEADER.pack(MAGIC, length, length, packet, answer_op) + answer)
                await writer.drain()
        finally:
            for _path, stream in self._handles.values():
                stream.close()
            self._handles.clear()

    # paths

    def _device_path(self, raw: str) -> str:
        path = posixpath.normpath(posixpath.join("/", raw))
        if self.jail != "/" and path != self.jail and not path.startswith(self.jail + "/"):
            raise AfcFailure(Status.PERM_DENIED)
        return path

    def _local(self, raw: str) -> Path:
        return self.root / self._device_path(raw).lstrip("/")

    # operations

    def _handle(self, operation: int, payload: bytes) -> tuple[Op, bytes]:
        ok = (Op.STATUS, U64.pack(Status.SUCCESS))
        if operation == Op.READ_DIR:
            return Op.DATA, self._read_dir(_cstrings(payload)[0])
        if operation == Op.GET_FILE_INFO:
            return Op.DATA, self._file_info(_cstrings(payload)[0])
        if operation == Op.MAKE_DIR:
            target = self._local(_cstrings(payload)[0])
            if target.exists() and not target.is_dir():
                raise AfcFailure(Status.OBJECT_EXISTS)
            target.mkdir(parents=True, exist_ok=True)
            return ok
        if operation == Op.REMOVE_PATH:
            self._remove(_cstrings(payload)[0])
            return ok
        if operation == Op.RENAME_PATH:
            source, target = (self._local(name) for name in _cstrings(payload)[:2])
            if not source.exists():
                raise AfcFailure(Status.OBJECT_NOT_FOUND)
            os.replace(source, target)
            return ok
        if operation == Op.FILE_OPEN:
            (mode,) = U64.unpack_from(payload)
            return Op.FILE_OPEN_RES, U64.pack(self._open(mode, _cstrings(payload[8:])[0]))
        if operation == Op.READ:
            handle, size = struct.unpack_from("<QQ", payload)
            return Op.DATA, self._stream(handle).read(size)
        if operation == Op.WRITE:
            (handle,) = U64.unpack_from(payload)
            data = payload[8:]
            stream = self._stream(handle)
            stream.write(data)
            if self.on_write is not None:
                self.on_write(self._handles[handle][0], stream.tell(), len(data))
            return ok
        if operation == Op.FILE_SEEK:
            handle, whence, offset = struct.unpack_from("<QQq", payload)
            self._stream(handle).seek(offset, whence)
            return ok
        if operation == Op.FILE_TELL:
            (handle,) = U64.unpack_from(payload)
            return Op.FILE_TELL_RES, U64.pack(self._stream(handle).tell())
        if operation == Op.FILE_SET_SIZE:
            handle, size = struct.unpack_from("<QQ", payload)
            self._stream(handle).truncate(size)
            return ok
        if operation == Op.FILE_CLOSE:
            (handle,) = U64.unpack_from(payload)
            entry = self._handles.pop(handle, None)
            if entry is None:
                raise AfcFailure(Status.INVALID_ARG)
            entry[1].close()
            return ok
        if operation == Op.GET_DEVINFO:
            usage = shutil.disk_usage(self.root)
            return Op.DATA, _key_values(
                {
                    "Model": "iPhone",
                    "FSTotalBytes": str(usage.total),
                    "FSFreeBytes": str(usage.free),
                    "FSBlockSize": "4096",
                }
            )
        raise AfcFailure(Status.UNKNOWN_PACKET_TYPE)

    def _read_dir(self, raw: str) -> bytes:
        target = self._local(raw)
        if not target.exists():
            raise AfcFailure(Status.OBJECT_NOT_FOUND)
        if not target.is_dir():
            raise AfcFailure(Status.INVALID_ARG)
        names = [".", "..", *sorted(entry.name for entry in target.iterdir())]
        return b"".join(name.encode() + b"\x00" for name in names)

    def _file_info(self, raw: str) -> bytes:
        target = self._local(raw)
        if not target.exists():
            raise AfcFailure(Status.OBJECT_NOT_FOUND)
        info = target.stat()
        is_dir = target.is_dir()
        size = info.st_size if not is_dir else 64 * (1 + len(list(target.iterdir())))
        return _key_values(
            {
                "st_size": str(size),
                "st_blocks": str((size + 511) // 512),
                "st_nlink": str(info.st_nlink),
                "st_ifmt": "S_IFDIR" if is_dir else "S_IFREG",
                "st_mtime": str(info.st_mtime_ns),
                "st_birthtime": str(info.st_mtime_ns),
            }
        )

    def _remove(self, raw: str) -> None:
        target = self._local(raw)
        if self._device_path(raw) == self.jail:
            raise AfcFailure(Status.PERM_DENIED)
        if not target.exists():
            raise AfcFailure(Status.OBJECT_NOT_FOUND)
        if target.is_dir():
            if any(target.iterdir()):
                raise AfcFailure(Status.DIR_NOT_EMPTY)
            target.rmdir()
        else:
            target.unlink()

    def _open(self, mode: int, raw: str) -> int:
        if mode not in _OPEN_MODES:
            raise AfcFailure(Status.INVALID_ARG)
        target = self._local(raw)
        if target.is_dir():
            raise AfcFailure(Status.OBJECT_IS_DIR)
        if mode not in _WRITING_MODES and not target.exists():
            raise AfcFailure(Status.OBJECT_NOT_FOUND)
        if not target.parent.is_dir():
            raise AfcFailure(Status.OBJECT_NOT_FOUND)
        if mode == 2 and not target.exists():
            target.touch()
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = (
            self._device_path(raw),
            cast(BinaryIO, target.open(_OPEN_MODES[mode])),
        )
        return handle

    def _stream(self, handle: int) -> BinaryIO:
        entry = self._handles.get(handle)
        if entry is None:
            raise AfcFailure(Status.INVALID_ARG)
        return entry[1]
