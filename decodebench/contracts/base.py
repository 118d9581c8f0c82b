"""The base of every contract: finite numbers only; requests also refuse what cannot be stored.

JSON allows ``NaN``, ``Infinity`` and ``1e999`` (parsed as infinity), lone UTF-16 surrogates
(``"\\ud800"``) and NUL (``"\\u0000"``); none of them can be stored in PostgreSQL or written
back as JSON, so they are refused where they arrive, with the field named, instead of failing
later as a server error.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel, ConfigDict, ModelWrapValidatorHandler, model_validator


class Contract(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)


_SCALARS = (int, float, bool, type(None))


def _has_lone_surrogate(value: Any) -> bool:
    # Walked once per request body (result uploads carry thousands of numbers): strings are
    # checked by the codec in C, and numbers are skipped by their exact type without a call.
    kind = type(value)
    if kind is str:
        if value.isascii():
            return "\x00" in value
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return "\x00" in value
    if kind is dict:
        for key, item in value.items():
            if _has_lone_surrogate(key):
                return True
            if type(item) not in _SCALARS and _has_lone_surrogate(item):
                return True
        return False
    if kind is list or kind is tuple:
        for item in value:
            if type(item) not in _SCALARS and _has_lone_surrogate(item):
                return True
        return False
    if isinstance(value, str | dict | list | tuple):  # subclasses: the slow, general way
        return _has_lone_surrogate(
            str(value) if isinstance(value, str) else dict(value) if isinstance(value, dict)
            else list(value)
        )  # fmt: skip
    return False


# Set while a body's outermost model validates: the nested models' text was checked with it.
_WALKED: ContextVar[bool] = ContextVar("decodebench_unicode_walked", default=False)


class Incoming(Contract):
    """A request body: unknown fields refused, text must be valid Unicode."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="wrap")
    @classmethod
    def _valid_unicode(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        if _WALKED.get():
            return handler(data)
        if _has_lone_surrogate(data):
            raise ValueError(
                "text must be valid Unicode without NUL (a lone surrogate such as \\ud800 is "
                "not, and PostgreSQL cannot store U+0000)"
            )
        walked = _WALKED.set(True)
        try:
            return handler(data)
        finally:
            _WALKED.reset(walked)
