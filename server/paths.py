"""Path parameters, bounded to what their columns can hold so a bad one is a 422, not a 500."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

MAX_ROW_ID = 2**31 - 1  # the id columns are PostgreSQL integers
# pydantic matches patterns with the Rust engine, whose "$" is the very end (no newline before it).

RowId = Annotated[int, Path(ge=1, le=MAX_ROW_ID, description="A row id")]
Sha256 = Annotated[
    str, Path(pattern=r"^[0-9a-f]{64}$", description="A content address (lowercase sha256)")
]
DeviceClass = Annotated[str, Path(min_length=1, max_length=64, description="A device class")]
QueryRowId = Annotated[int, Query(ge=1, le=MAX_ROW_ID, description="A row id")]
