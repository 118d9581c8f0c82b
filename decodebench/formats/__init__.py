"""Model formats: everything that speaks one format's SDK lives in that format's own folder.

``coreml/`` is Core ML (``.mlpackage`` ML programs): converting a transformers model with
coremltools, quantizing, reading the graph, the reference interpreter that runs a program on
Linux, decode sessions and verify, the GQA fold and the converter workarounds. ``coreai/`` is
Core AI (``.aimodel`` assets): conversion with coreai-torch, the graph reader, the project's
engine and Apple's runtime as its arbiter. Only a format's own folder imports its SDK;
``tests/test_architecture.py`` holds that rule.

What a format implements is :class:`decodebench.formats.seam.ModelFormat`; :func:`get_format`
finds one by name, importing its folder only then (format SDKs are heavy and the CLI imports
them lazily). docs/architecture.md says what a second format adds.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from decodebench.formats.seam import ModelFormat

DEFAULT_FORMAT = "coreml"
# Each format's name and the module whose FORMAT implements it.
FORMATS = {
    "coreml": "decodebench.formats.coreml.format",
    "coreai": "decodebench.formats.coreai.format",
}


class UnknownFormat(ValueError):
    """No format of that name."""


def get_format(name: str = DEFAULT_FORMAT) -> ModelFormat:
    module = FORMATS.get(name)
    if module is None:
        known = ", ".join(sorted(FORMATS))
        raise UnknownFormat(f"no model format {name!r}: the formats are {known}")
    found: ModelFormat = import_module(module).FORMAT
    return found
