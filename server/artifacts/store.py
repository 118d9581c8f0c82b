"""Content-addressed artifact store: a file's name is the SHA-256 of its bytes."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from server.errors import InvalidInput, NotFound

SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, sha256: str) -> Path:
        if not SHA256.match(sha256):
            raise InvalidInput(f"artifact address {sha256!r} is not a lowercase SHA-256 hex digest")
        return self.root / sha256[:2] / sha256

    def exists(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    def open_path(self, sha256: str) -> Path:
        path = self.path_for(sha256)
        if not path.is_file():
            raise NotFound(f"no artifact {sha256}")
        return path

    async def put_stream(self, sha256: str, chunks: AsyncIterator[bytes]) -> Path:
        """Write to a temporary file, verify the digest, then rename: never a torn artifact."""
        final = self.path_for(sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        handle, temporary = tempfile.mkstemp(dir=final.parent, prefix=".upload-")
        try:
            with os.fdopen(handle, "wb") as out:
                async for chunk in chunks:
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != sha256:
                raise InvalidInput(
                    f"uploaded bytes have SHA-256 {digest.hexdigest()}, not the address {sha256}"
                )
            os.replace(temporary, final)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        return final
