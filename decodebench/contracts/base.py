"""The base of every contract: finite numbers only; requests also refuse what cannot be stored.

JSON allows ``NaN``, ``Infinity`` and ``1e999`` (parsed as infinity), lone UTF-16 surrogates
(``"\\ud800"``) and NUL (``"\\u0000"``); none of them can be stored in PostgreSQL or written
back as JSON, so they are refused where they arrive, with the field named, instead of failing
later as a server error.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Contract(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)


def _has_lone_surrogate(value: Any) -> bool:
    # Walked on every request body (result uploads carry thousands of numbers): strings are
    # checked by the codec in C, and numbers are skipped without a call.
    if isinstance(value, str):
        if value.isascii():
            return "\x00" in value
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_lone_surrogate(key) or _has_lone_surrogate(v) for key, v in value.items())
    if isinstance(value, list | tuple):
        return any(
            _has_lone_surrogate(item)
            for item in value
            if isinstance(item, str | dict | list | tuple)
        )
    return False


class Incoming(Contract):
    """A request body: unknown fields refused, text must be valid Unicode."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        if _has_lone_surrogate(data):
            raise ValueError(
                "text must be valid Unicode without NUL (a lone surrogate such as \\ud800 is "
                "not, and PostgreSQL cannot store U+0000)"
            )
        return data
