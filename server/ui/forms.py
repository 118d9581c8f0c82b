"""Turning the sweep form into a SweepSpec, and validation errors into plain words next to the
field they are about (rows counted from 1, as the page shows them)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from starlette.datastructures import FormData

from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.profiles import DEVICE_PROFILES

MAX_FORM_VARIANTS = 4
VARIANT_FIELDS = ("name", "attention", "kv", "context", "prefill_chunk", "quant", "layers")
NUMBER_FIELDS = {"context", "prefill_chunk", "layers", "prompts", "decode_tokens", "repetitions"}
FIELD_WORDS = {
    "name": "label",
    "attention": "attention",
    "kv": "KV cache",
    "context": "context",
    "prefill_chunk": "prefill chunk",
    "quant": "quantization recipe",
    "layers": "layers",
}
_VARIANT_PATH = re.compile(r"variants\.(\d+)\.(\w+)")


def _form_value(field: str, raw: str) -> Any:
    """A form sends text; the spec is strict about types, so whole numbers are turned into
    numbers here (anything else is passed on for the spec to name as invalid)."""
    if field in NUMBER_FIELDS and raw.lstrip("-").isdigit():
        return int(raw)
    return raw


def sweep_spec_from_form(form: FormData) -> SweepSpec:
    variants: list[dict[str, Any]] = []
    for index in range(MAX_FORM_VARIANTS):
        attention = str(form.get(f"variant{index}_attention", "")).strip()
        if not attention:
            continue
        variant: dict[str, Any] = {"attention": attention}
        for field in VARIANT_FIELDS[:1] + VARIANT_FIELDS[2:]:
            value = str(form.get(f"variant{index}_{field}", "")).strip()
            if value:
                variant[field] = _form_value(field, value)
        variants.append(variant)
    payload: dict[str, Any] = {
        "model": form.get("model", ""),
        "variants": variants,
        "devices": form.getlist("devices"),
    }
    for field in ("prompts", "decode_tokens", "repetitions"):
        value = str(form.get(field, "")).strip()
        if value:
            payload[field] = _form_value(field, value)
    return SweepSpec.model_validate(payload)


def _form_rows(form: FormData) -> list[int]:
    """Form row of each submitted variant (rows left empty are skipped by the spec)."""
    return [
        index
        for index in range(MAX_FORM_VARIANTS)
        if str(form.get(f"variant{index}_attention", "")).strip()
    ]


def _plain(message: str) -> str:
    message = message.removeprefix("Value error, ")
    return message[:1].upper() + message[1:]


def field_errors(error: ValidationError, form: FormData) -> dict[str, str]:
    """Form field name -> what is wrong with it, in plain words."""
    rows = _form_rows(form)
    found: dict[str, str] = {}

    def variant_field(spec_index: int, field: str) -> str:
        row = rows[spec_index] if spec_index < len(rows) else spec_index
        return f"variant{row}_{field}"

    def rename_paths(message: str) -> str:
        def words(match: re.Match[str]) -> str:
            index, field = int(match.group(1)), match.group(2)
            row = rows[index] if index < len(rows) else index
            return f"row {row + 1}'s {FIELD_WORDS.get(field, field)}"

        return _VARIANT_PATH.sub(words, message)

    for item in error.errors():
        location = [part for part in item["loc"]]
        message = _plain(rename_paths(item["msg"]))
        if location[:1] == ["variants"] and len(location) >= 3:
            field = variant_field(int(location[1]), str(location[2]))
        elif location[:1] == ["variants"] and len(location) == 2:
            field = variant_field(int(location[1]), "context")
        elif location[:1] == ["variants"]:
            field = "variant0_attention"
            message = "Choose an attention for at least one row."
        elif location:
            field = str(location[0])
        else:  # a check across fields: attach it to the field its message names
            path = _VARIANT_PATH.search(item["msg"])
            if path:
                field = variant_field(int(path.group(1)), path.group(2))
            elif "decode_tokens" in item["msg"]:
                field = "decode_tokens"
            else:
                field = "form"
        found.setdefault(field, message)
    return found


def unattached_classes(devices: list[str], ready: dict[str, int]) -> dict[str, str]:
    """The 'devices' error when a ticked class has no ready device, unless confirmed."""
    missing = [device for device in devices if not ready.get(device)]
    if not missing:
        return {}
    names = ", ".join(
        DEVICE_PROFILES[device].display_name if device in DEVICE_PROFILES else device
        for device in missing
    )
    return {
        "devices": f"No {names} is attached and ready: its runs would wait, then fail. Untick "
        "it, or tick “submit anyway”."
    }
