"""Turning the sweep form into a SweepSpec, and validation errors into readable lines."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.datastructures import FormData

from decodebench.contracts.domain import SweepSpec

MAX_FORM_VARIANTS = 4
NUMBER_FIELDS = {"context", "prefill_chunk", "layers", "prompts", "decode_tokens", "repetitions"}


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
        for field in ("name", "kv", "context", "prefill_chunk", "layers", "quant"):
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


def validation_messages(error: ValidationError) -> list[str]:
    messages = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"]) or "form"
        messages.append(f"{location}: {item['msg']}")
    return messages
