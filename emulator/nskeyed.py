"""NSKeyedArchiver archives, the device side's own small codec (binary plists with UIDs).

DTX carries method names, arguments and return values as keyed archives. The emulator only
needs the Foundation types process control uses: strings, numbers, booleans, data, arrays,
dictionaries, null and NSError. Written here from the archive format (``$objects``, ``$top``,
``$class`` references by UID) so the emulated side does not reuse the client's codec.
"""

from __future__ import annotations

import plistlib
from dataclasses import dataclass, field
from typing import Any

ARCHIVER = "NSKeyedArchiver"
ARCHIVE_VERSION = 100000
NULL = "$null"


class ArchiveError(ValueError):
    """The bytes are not a keyed archive this codec understands."""


@dataclass
class NSError:
    domain: str
    code: int
    user_info: dict[str, Any] = field(default_factory=dict)


class _Archiver:
    def __init__(self) -> None:
        self.objects: list[Any] = [NULL]
        self._classes: dict[str, plistlib.UID] = {}

    def _class(self, name: str) -> plistlib.UID:
        if name not in self._classes:
            self.objects.append({"$classname": name, "$classes": [name, "NSObject"]})
            self._classes[name] = plistlib.UID(len(self.objects) - 1)
        return self._classes[name]

    def _slot(self) -> int:
        self.objects.append(None)
        return len(self.objects) - 1

    def encode(self, value: Any) -> plistlib.UID:
        if value is None:
            return plistlib.UID(0)
        index = self._slot()
        if isinstance(value, (str, bool, int, float)):
            self.objects[index] = value
        elif isinstance(value, (bytes, bytearray)):
            self.objects[index] = {"NS.data": bytes(value), "$class": self._class("NSData")}
        elif isinstance(value, (list, tuple)):
            items = [self.encode(item) for item in value]
            self.objects[index] = {"NS.objects": items, "$class": self._class("NSArray")}
        elif isinstance(value, dict):
            keys = [self.encode(key) for key in value]
            values = [self.encode(item) for item in value.values()]
            self.objects[index] = {
                "NS.keys": keys,
                "NS.objects": values,
                "$class": self._class("NSDictionary"),
            }
        elif isinstance(value, NSError):
            self.objects[index] = {
                "NSDomain": self.encode(value.domain),
                "NSCode": value.code,
                "NSUserInfo": self.encode(value.user_info),
                "$class": self._class("NSError"),
            }
        else:
            raise ArchiveError(f"cannot archive a {type(value).__name__}")
        return plistlib.UID(index)


def archive(value: Any) -> bytes:
    archiver = _Archiver()
    root = archiver.encode(value)
    return plistlib.dumps(
        {
            "$version": ARCHIVE_VERSION,
            "$archiver": ARCHIVER,
            "$top": {"root": root},
            "$objects": archiver.objects,
        },
        fmt=plistlib.FMT_BINARY,
    )


def unarchive(data: bytes) -> Any:
    try:
        top = plistlib.loads(bytes(data))
    except plistlib.InvalidFileException as error:
        raise ArchiveError(f"not a property list: {error}") from error
    if not isinstance(top, dict) or top.get("$archiver") != ARCHIVER:
        raise ArchiveError("not an NSKeyedArchiver archive")
    objects = top["$objects"]
    return _decode(objects, top["$top"]["root"], depth=0)


def _decode(objects: list[Any], reference: Any, depth: int) -> Any:
    if depth > 64:
        raise ArchiveError("archive nested too deeply")
    if not isinstance(reference, plistlib.UID):
        return reference
    value = objects[reference.data]
    if value == NULL:
        return None
    if not isinstance(value, dict) or "$class" not in value:
        return value
    classname = objects[value["$class"].data]["$classname"]

    def decode(item: Any) -> Any:
        return _decode(objects, item, depth + 1)

    if classname in {"NSDictionary", "NSMutableDictionary"}:
        return {
            decode(key): decode(item)
            for key, item in zip(value["NS.keys"], value["NS.objects"], strict=True)
        }
    if classname in {"NSArray", "NSMutableArray", "NSSet", "NSMutableSet"}:
        return [decode(item) for item in value["NS.objects"]]
    if classname in {"NSString", "NSMutableString"}:
        return str(value["NS.string"])
    if classname in {"NSData", "NSMutableData"}:
        return bytes(value["NS.data"])
    if classname == "NSNull":
        return None
    if classname == "NSError":
        return NSError(
            decode(value["NSDomain"]), int(value["NSCode"]), decode(value["NSUserInfo"]) or {}
        )
    raise ArchiveError(f"cannot unarchive a {classname}")
